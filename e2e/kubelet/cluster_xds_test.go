package kubelet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/e2e/kubelet/internal/loadline"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
)

// xdsWeb is the gRPC app behind draind above pilot-agent (the namespace's
// default templates), its Service's port named grpc so that istiod
// serves it to proxyless clients as gRPC. The proxy's inbound sends a
// connection to that port to the app over HTTP/2 (the image's bootstrap,
// as Istio's inbound filter chain for a gRPC port).
const xdsWeb = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: app
        image: ` + images.TestApp + `
        args: [--grpc-port, "%[1]d", --on-term, graceful]
        ports: [{containerPort: 8080}, {containerPort: %[1]d, name: grpc}]
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: grpc, port: %[1]d, targetPort: %[1]d, appProtocol: grpc}]
`

// xdsClient is the client pod, not injected: xdsload through istiod's
// plaintext xDS, by its Service's name. --log-ok: a line for each call
// that succeeded, with its endpoint, so the test sees the client reach
// each pod before it deletes one.
const xdsClient = `apiVersion: v1
kind: Pod
metadata:
  name: xdsload
  labels: {role: load, sidecar.istio.io/inject: "false"}
spec:
  restartPolicy: Never
  containers:
  - name: xdsload
    image: ` + images.LoadClient + `
    command: [/usr/local/bin/xdsload]
    args: [--target, "xds:///web.%[1]s.svc.cluster.local:%[2]d", --xds-server, "%[3]s", --qps, "50", --timeout, 2s,
           --duration, 10m, --warmup, 60s, --log-ok, --stop-addr, ":%[4]d"]
    env:
    - name: INSTANCE_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
`

// xdsCall is one line of xdsload: a call (ok with --log-ok, or failed),
// or, with Peers, its summary.
type xdsCall struct {
	loadline.Call
	loadline.Summary
	Peers map[string]xdsPeer
}

func parseXDSLine(line string) (xdsCall, bool) {
	_, body := splitTimestamp(line)
	var c xdsCall
	return c, json.Unmarshal([]byte(body), &c) == nil
}

// Issue 45, acceptance 3: a pod deleted under the load of a client that
// learns the endpoints from istiod (gRPC-Go's xDS client, Istio's
// proxyless gRPC) and keeps a pooled HTTP/2 connection to each pod. The
// client stops calling the pod only when istiod pushes its removal (or the
// pod's proxy sends a GOAWAY), not when kube-proxy's rules change. draind's
// out-of-rotation rule counts new connections, which such a client does
// not make: the test fails if the client still sent a call to the pod
// after draind's drain completed (its phase stopping), and on any call
// that failed.
func TestClusterXDSClientsDrain(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	ns := testNamespace(t, "xds", "istio-injection=enabled")
	kubectl(t, fmt.Appendf(nil, xdsWeb, images.GRPCPort), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=web", 2*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")
	web := podsOf(t, ns, "app=web")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kubectl(t, fmt.Appendf(nil, xdsClient, ns, images.GRPCPort, istiodXDS, loadStopPort), "-n", ns, "apply", "-f", "-")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := theCluster.KubectlCmd(context.Background(), nil, "-n", ns, "logs", "xdsload", "--tail", "40")
			t.Logf("xdsload's log, its end:\n%s", out)
		}
	})
	// The load reaches every pod before one goes: istiod has sent the
	// client both endpoints and it has a connection to each. Read from
	// the log's last lines (10 s of calls), taken anew each time: once, a
	// log followed from the container's start (opened as it started) held
	// none of the calls that `kubectl logs` showed going to both pods.
	endpoint := func(p corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, fmt.Sprint(images.GRPCPort)) }
	recent := int64(500)
	waitUntil(t, 90*time.Second, "xdsload's calls answered by every pod", func() bool {
		b, err := kube.CoreV1().Pods(ns).GetLogs("xdsload", &corev1.PodLogOptions{TailLines: &recent}).DoRaw(ctx)
		if err != nil {
			return false // not started yet
		}
		seen := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			if c, ok := parseXDSLine(l); ok && c.Class == "ok" {
				seen[c.Peer] = true
			}
		}
		for _, p := range web {
			if !seen[endpoint(p)] {
				return false
			}
		}
		return true
	})

	gone := web[0]
	draind := followPodLog(ctx, ns, gone.Name, "istio-proxy")
	deletedAt := time.Now()
	if err := kube.CoreV1().Pods(ns).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The load stays on until the pod is gone from the API: its proxy
	// exited (draind's log ends with it) and the kubelet removed it.
	if err := draind.wait(90 * time.Second); err != nil {
		t.Fatalf("draind's log of %s: %v", gone.Name, err)
	}
	waitUntil(t, 90*time.Second, gone.Name+" gone from the API", func() bool {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, gone.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	logs, _ := stopLoads(t, ns, []string{"xdsload"})

	var recs []map[string]any
	for _, l := range strings.Split(draind.text(), "\n") {
		_, body := splitTimestamp(l)
		var r map[string]any
		if json.Unmarshal([]byte(body), &r) == nil {
			recs = append(recs, r)
		}
	}
	stopping := logTime(findLogWith(recs, logevent.Phase, "phase", drain.Stopping.String()))
	if stopping.IsZero() {
		t.Fatalf("no phase stopping in draind's log of %s:\n%s", gone.Name, draind.text())
	}

	lines := strings.Split(strings.TrimSpace(logs[0]), "\n")
	sum, ok := parseXDSLine(lines[len(lines)-1])
	if !ok || sum.Peers == nil {
		t.Fatalf("no summary at the end of xdsload's log:\n%s", tail(logs[0], 2000))
	}
	goneEP := endpoint(gone)
	var after int // calls sent to the deleted pod after its deletion
	var fails []string
	for _, l := range lines[:len(lines)-1] {
		c, ok := parseXDSLine(l)
		if !ok {
			continue
		}
		if c.Peer == goneEP && c.T >= deletedAt.UnixNano() {
			after++
		}
		if c.Class != "ok" {
			fails = append(fails, fmt.Sprintf("+%s %s %s (reached %s, peer %s)",
				fmtDur(time.Unix(0, c.T).Sub(deletedAt)), c.Class, c.Err, c.Reached, c.Peer))
		}
	}
	p, ok := sum.Peers[goneEP]
	if !ok {
		t.Fatalf("xdsload never called %s (%s); its peers: %v", gone.Name, goneEP, sum.Peers)
	}
	last := time.Unix(0, p.Last)
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return "+" + fmtDur(at.Sub(deletedAt))
	}
	var phases []string
	for _, r := range recs {
		if r[logevent.Key] == string(logevent.Phase) {
			phases = append(phases, fmt.Sprintf("%v %s", r["phase"], rel(logTime(r))))
		}
	}
	// draind's phases: istio-proxy is a native sidecar here, whose drain
	// begins with its own preStop (`draind drain`), before any SIGTERM.
	// What draind's out-of-rotation rule counted: the client's pooled
	// connections were opened before the deletion, so only a reconnect
	// (after a GOAWAY) or a probe would count.
	rule := "no out_of_rotation line"
	if r := findLogWith(recs, logevent.OutOfRotation, logevent.Key, string(logevent.OutOfRotation)); r != nil {
		rule = fmt.Sprintf("%v new connections (from pods %v, node %v), out of rotation %s", r["connections"], r["from_pods"], r["from_node"], rel(logTime(r)))
	}
	line := fmt.Sprintf("delete +0; the client's last call to the pod %s (%d calls after the deletion); draind's phases %s; "+
		"draind's rule saw %s; calls %d sent, %d failed", rel(last), after, strings.Join(phases, ", "), rule, sum.Sent, sum.Failed)
	t.Log(line)
	report.add("xds", "a pod deleted under a proxyless gRPC client (istiod's EDS)", line)
	for _, f := range fails {
		t.Log("  failed: " + f)
	}
	if !last.Before(stopping) {
		t.Errorf("the client sent a call to %s at %s, after draind's drain completed at %s: the pod's drain ended while a client still sent to it",
			gone.Name, rel(last), rel(stopping))
	}
	if sum.Failed > 0 {
		t.Errorf("%d of %d calls failed", sum.Failed, sum.Sent)
	}
}
