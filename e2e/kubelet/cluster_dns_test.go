package kubelet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/e2e/kubelet/internal/loadline"
)

// dnsClients is a pod of three load clients (Go's resolver, the pod's
// resolv.conf as the kubelet wrote it): the Service web by its full name,
// by its short name (the namespace's search domain), and a name outside
// the cluster, which must fail at once as unknown (NXDOMAIN), not after a
// timeout.
const dnsClients = `apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: fqdn
    image: %[1]s
    args: [--url, http://web.%[2]s.svc.cluster.local/, --qps, "5", --duration, 2s, --timeout, 5s]
  - name: short
    image: %[1]s
    args: [--url, http://web/, --qps, "5", --duration, 2s, --timeout, 5s]
  - name: outside
    image: %[1]s
    args: [--url, http://draind-dns-test.invalid/, --qps, "1", --duration, 1s, --timeout, 5s]
`

// dnsWeb is the test app behind the Service web, port 80.
const dnsWeb = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: %s
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /readyz, port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// TestClusterDNS: the cluster's DNS (CoreDNS behind kube-system/kube-dns,
// e2e/kubelet/internal/cluster/dns.go) as pods use it. A pod reaches a
// Service by its name, full and short, and a name outside the cluster is
// unknown at once. An Istio-injected pod's pilot-agent reaches istiod by
// name (istiod.istio-system.svc) for its workload certificate: without
// the cluster's DNS it retried `lookup istiod.istio-system.svc on
// 127.0.0.1:53` every few seconds for the pod's whole life.
func TestClusterDNS(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	t.Run("service-by-name", func(t *testing.T) {
		t.Parallel()
		ns := testNamespace(t, "dns")
		kubectl(t, fmt.Appendf(nil, dnsWeb, images.TestApp), "-n", ns, "apply", "-f", "-")
		waitPodsReady(t, ns, "app=web", 2*time.Minute)
		kubectl(t, fmt.Appendf(nil, dnsClients, images.LoadClient, ns), "-n", ns, "apply", "-f", "-")
		var pod *corev1.Pod
		waitUntil(t, 2*time.Minute, "the client pod's end", func() bool {
			p, err := kube.CoreV1().Pods(ns).Get(context.Background(), "client", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod = p
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		})
		if pod.Status.Phase != corev1.PodSucceeded {
			t.Errorf("the client pod %s:\n%s", pod.Status.Phase, kubectl(t, nil, "-n", ns, "describe", "pod", "client"))
		}
		for _, c := range []string{"fqdn", "short", "outside"} {
			sum, fails := dnsClientLog(t, kubectl(t, nil, "-n", ns, "logs", "client", "-c", c))
			t.Logf("%s: %+v", c, sum)
			switch c {
			case "outside":
				if sum.Sent == 0 || sum.Failed != sum.Sent || len(fails) == 0 || !strings.Contains(fails[0].Err, "no such host") {
					t.Errorf("%s: want every call failed as no such host (NXDOMAIN at once): %+v %+v", c, sum, fails)
				}
			default:
				if sum.Sent == 0 || sum.OK != sum.Sent {
					first := "none logged"
					if len(fails) > 0 {
						first = fails[0].Err
					}
					t.Errorf("%s: %d of %d calls failed, the first: %s", c, sum.Failed, sum.Sent, first)
				}
			}
		}
	})
	t.Run("istio-proxy", func(t *testing.T) {
		t.Parallel()
		ns := testNamespace(t, "dns-istio", "istio-injection=enabled")
		kubectl(t, localImages(plainWeb), "-n", ns, "apply", "-f", "-")
		waitPodsReady(t, ns, "app=web", 3*time.Minute)
		pod := podsOf(t, ns, "app=web")[0].Name
		// pilot-agent warms its certificate as it starts: signed by istiod
		// when it reaches it, retried with a backoff while it does not.
		var log string
		waitUntil(t, 30*time.Second, "pilot-agent's workload certificate", func() bool {
			log = kubectl(t, nil, "-n", ns, "logs", pod, "-c", "istio-proxy")
			return strings.Contains(log, "generated new workload certificate") || strings.Contains(log, "lookup istiod")
		})
		if strings.Contains(log, "lookup istiod") || !strings.Contains(log, "generated new workload certificate") {
			t.Fatalf("pilot-agent did not reach istiod by name:\n%s", grepLines(log, "lookup istiod", "warm", "certificate"))
		}
		t.Logf("pilot-agent: %s", grepLines(log, "generated new workload certificate"))
	})
}

// dnsClientLog is a load client's summary (its last line) and its failed
// calls.
func dnsClientLog(t *testing.T, log string) (loadline.Summary, []loadline.Call) {
	t.Helper()
	var sum loadline.Summary
	var fails []loadline.Call
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for _, l := range lines[:len(lines)-1] {
		var c loadline.Call
		if json.Unmarshal([]byte(l), &c) == nil && c.T != 0 {
			fails = append(fails, c)
		}
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("no summary in the client's log: %v\n%s", err, log)
	}
	return sum, fails
}

// grepLines is the lines of s that hold any of words, at most 20.
func grepLines(s string, words ...string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("… %d more", len(out)-20))
	}
	return strings.Join(out, "\n")
}
