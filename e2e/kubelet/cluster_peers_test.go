package kubelet_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testutil"
)

// Issue 41, acceptance 3: every way a connection reaches a pod counts for
// the out-of-rotation rule, on the cluster's bridge CNI. A pod of
// deploy/classic-sidecar.yaml (2 replicas, the app's preStop on draind's
// wait) is deleted while three clients open a new connection every 100 ms:
//
//	node           the node itself through the ClusterIP
//	nodeport       an outside client through a NodePort under
//	               externalTrafficPolicy Cluster (masqueraded by the node)
//	nodeport-local the same under Local (the client's address kept)
//
// The outside client is a network namespace of its own routed through the
// node, standing for a load balancer. The node and the outside also dial
// the pod's own address 3 times each once its drain began, so that the
// rule always has connections to count. None of their connections fails,
// and every connection the deleted pod's rule counted came from the node
// or the outside, none taken for a pod's. Which of them reached the pod
// after its SIGTERM is kube-proxy's pick and its sync's timing (the
// counts by kind differed run to run: 8 and 6, 9 and 0, 0 and 30); the
// pod harness counts each kind on both CNI shapes where it can be known
// (e2e/rotation_peers_linux_test.go).
func TestClusterRotationNodeClients(t *testing.T) {
	c := requireCluster(t)
	t.Parallel()
	ns := testNamespace(t, "peers")
	kubectl(t, envoySidecarConfigMap(t), "-n", ns, "apply", "-f", "-")
	kubectl(t, webService("web"), "-n", ns, "apply", "-f", "-")
	kubectl(t, nodePortService("web-np", "Cluster", 15006), "-n", ns, "apply", "-f", "-")
	kubectl(t, nodePortService("web-np-local", "Local", 15006), "-n", ns, "apply", "-f", "-")
	kubectl(t, localImages(readRepo(t, "deploy/classic-sidecar.yaml")), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=web", 2*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")

	clusterIP := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	nodePort := func(svc string) string {
		return strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", svc, "-o", "jsonpath={.spec.ports[0].nodePort}"))
	}
	outside := outsideHost(t)
	paths := []*pathClients{
		{name: "node", url: "http://" + clusterIP + "/", dial: (&net.Dialer{}).DialContext, period: 100 * time.Millisecond},
		{name: "nodeport", url: "http://" + net.JoinHostPort(c.NodeIP, nodePort("web-np")) + "/", dial: outside.Dialer(), period: 100 * time.Millisecond},
		{name: "nodeport-local", url: "http://" + net.JoinHostPort(c.NodeIP, nodePort("web-np-local")) + "/", dial: outside.Dialer(), period: 100 * time.Millisecond},
	}
	waitServiceRules(t, clusterIP) // nothing sent off this machine before it
	for _, p := range paths {
		waitUntil(t, time.Minute, p.name+" reaches the pods", func() bool { return p.once() == nil })
	}
	bin := nodeDraind(t) // the node view, read while the drain holds
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := podsOf(t, ns, "app=web")[0]
	logs, logsDone := followLog(t, ctx, ns, pod.Name, "envoy")
	for _, p := range paths {
		p.start(p.period)
	}
	time.Sleep(3 * time.Second) // the rate before the deletion
	// A request in flight through the pod's own Envoy holds its gate past
	// the wait for rotation: meanwhile `draind pods -o json` shows what the
	// rule counted.
	slow := getInFlight(t, "http://"+net.JoinHostPort(pod.Status.PodIP, "15006")+"/slow?ms=8000", 20*time.Second)
	if err := kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Whether a client through kube-proxy reaches the pod after its drain
	// began is the race between the kubelet's hook and kube-proxy's sync:
	// once, kube-proxy had the pod out before the trigger, and the rule
	// counted nothing. So the node and the outside also dial the pod's
	// own address as soon as draind says it drains (its readiness 503):
	// new connections the rule must count, and class, every run.
	direct := []*pathClients{
		{name: "node-direct", url: "http://" + net.JoinHostPort(pod.Status.PodIP, "15006") + "/", dial: (&net.Dialer{}).DialContext},
		{name: "outside-direct", url: "http://" + net.JoinHostPort(pod.Status.PodIP, "15006") + "/", dial: outside.Dialer()},
	}
	ready := "http://" + net.JoinHostPort(pod.Status.PodIP, "15020") + "/healthz/ready"
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := (&http.Client{Timeout: time.Second}).Get(ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(end) {
			t.Fatalf("draind's readiness at %s not 503 within 10 s of the deletion (last: %v)", ready, err)
		}
	}
	for _, p := range direct {
		for range 3 {
			if err := p.once(); err != nil {
				t.Errorf("%s during the drain: %v", p.name, err)
			}
		}
	}
	var seen *agent.PodRotation
	waitUntil(t, 15*time.Second, "draind pods -o json showing the deleted pod's rotation", func() bool {
		out, _, code := draindRun(t, bin, 10*time.Second, "pods", "-o", "json", "--timeout", "1s")
		var v nvView
		if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
			return false
		}
		if r := v.pod(ns, pod.Name); r != nil && r.State != nil && r.State.Rotation != nil {
			seen = r.State.Rotation
		}
		return seen != nil
	})
	t.Logf("draind pods -o json: rotation %+v", *seen)
	if a := <-slow; a.err != nil {
		t.Errorf("the request in flight: %v", a.err)
	}
	select {
	case <-logsDone:
	case <-ctx.Done():
		t.Fatal("draind's container did not exit within 2 min of the deletion")
	}
	time.Sleep(time.Second) // the clients on, past the pod's end
	for _, p := range paths {
		p.halt()
		t.Logf("%s: %d ok, %d failed (first: %v)", p.name, p.ok.Load(), p.failed.Load(), p.firstErr)
		if p.failed.Load() != 0 || p.ok.Load() == 0 {
			t.Errorf("%s: %d connections failed (first: %v), %d ok", p.name, p.failed.Load(), p.firstErr, p.ok.Load())
		}
	}
	out := findLog(parsePlainJSONLog(logs.String()), logevent.OutOfRotation)
	if out == nil {
		t.Fatalf("no out_of_rotation line in draind's log:\n%s", logs.String())
	}
	t.Logf("out of rotation %v (%v): %v connections, %v from the node, %v from pods, %v other, %v probes left out", out["took"], out["why"],
		out["connections"], out["from_node"], out["from_pods"], out["from_other"], out["probes_left_out"])
	n := func(k string) float64 { v, _ := out[k].(float64); return v }
	if n("connections") == 0 || n("from_pods") != 0 || n("from_node")+n("from_other") != n("connections") {
		t.Errorf("want the connections counted, each from the node or the outside (no client here is a pod): %v", out)
	}
	if seen.Connections != int64(n("connections")) || seen.FromNode != int64(n("from_node")) || seen.FromOther != int64(n("from_other")) {
		t.Errorf("draind pods -o json's rotation %+v differs from the log line's %v", *seen, out)
	}
	if out["why"] == "ceiling" {
		t.Errorf("out of rotation at the ceiling: %v", out)
	}
}

// nodePortService is a NodePort Service for the pods app=web under
// externalTrafficPolicy policy (Cluster: the node masquerades; Local:
// the client's address kept), port 80 to targetPort.
func nodePortService(name, policy string, targetPort int) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Service
metadata: {name: %s}
spec:
  type: NodePort
  externalTrafficPolicy: %s
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: %d}]
`, name, policy, targetPort)
}

// pathClients opens a new connection every period to url and sends one
// request on it, each in its own goroutine.
type pathClients struct {
	name     string
	url      string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	period   time.Duration
	ok       atomic.Int64
	failed   atomic.Int64
	mu       sync.Mutex
	firstErr error
	// failures are the first maxFailures failures, each with its time.
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

// maxFailures bounds pathClients.failures.
const maxFailures = 40

// once sends one request on a new connection.
func (p *pathClients) once() error {
	hc := &http.Client{Transport: &http.Transport{DialContext: p.dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := hc.Get(p.url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

func (p *pathClients) start(period time.Duration) {
	p.stop = make(chan struct{})
	p.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tk.C:
			}
			p.wg.Go(func() {
				sent := time.Now()
				if err := p.once(); err != nil {
					p.failed.Add(1)
					p.mu.Lock()
					if p.firstErr == nil {
						p.firstErr = err
					}
					if len(p.failures) < maxFailures {
						p.failures = append(p.failures, fmt.Sprintf("%s %v", sent.Format("15:04:05.000"), err))
					}
					p.mu.Unlock()
					return
				}
				p.ok.Add(1)
			})
		}
	})
}

// halt stops opening connections and waits for those in flight.
func (p *pathClients) halt() {
	close(p.stop)
	p.wg.Wait()
}

// outsideAddr is the outside host's address.
var outsideAddr = netip.MustParseAddr("198.51.100.2")

// outsideHost is a network namespace routed through the node, as a load
// balancer or a client on the node's network reaches it: a veth to the
// node, its default route there. Removed at the test's end.
func outsideHost(t *testing.T) *testutil.NetNS {
	t.Helper()
	const (
		nodeSide = "198.51.100.1/30"
		nodeLink = "drd-out0"
	)
	outsideSide := outsideAddr.String() + "/30"
	outside := testutil.NewNetNS(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nodeLink}, PeerName: "eth0", PeerNamespace: netlink.NsFd(outside.Handle)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("outside host: veth: %v", err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("outside host: %s: %v", what, err)
		}
	}
	addr := func(cidr string) *netlink.Addr {
		a, err := netlink.ParseAddr(cidr)
		must(cidr, err)
		return a
	}
	l, err := netlink.LinkByName(nodeLink)
	must("node side", err)
	must("node address", netlink.AddrAdd(l, addr(nodeSide)))
	must("node side up", netlink.LinkSetUp(l))
	h, err := netlink.NewHandleAt(outside.Handle)
	must("netlink", err)
	defer h.Close()
	o, err := h.LinkByName("eth0")
	must("outside side", err)
	must("outside address", h.AddrAdd(o, addr(outsideSide)))
	must("outside up", h.LinkSetUp(o))
	lo, err := h.LinkByName("lo")
	must("loopback", err)
	must("loopback up", h.LinkSetUp(lo))
	gw, _, _ := net.ParseCIDR(nodeSide)
	must("default route", h.RouteAdd(&netlink.Route{LinkIndex: o.Attrs().Index, Gw: gw}))
	return outside
}

// slowClientWeb is draind above pilot-agent by the per-pod override alone
// (Istio's stock template, no `draind` template: Istio's default stats,
// no listener counter), 2 replicas, the app's preStop on draind's wait.
const slowClientWeb = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
      annotations:
        inject.istio.io/templates: sidecar
        traffic.sidecar.istio.io/excludeInboundPorts: "15022"
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: app
        image: registry.example.com/web:1.0
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /readyz, port: 8080}
          periodSeconds: 2
        lifecycle:
          preStop:
            httpGet: {path: /wait/out-of-rotation, port: 15022}
      - name: istio-proxy
        image: registry.example.com/istio/proxyv2-draind:1.31.1
        command: [/usr/local/bin/draind, run, --, /usr/local/bin/pilot-agent]
        readinessProbe:
          httpGet: {path: /healthz/ready, port: 15022}
          periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// TestClusterRotationUnknownRate (issue 41, acceptance 4): with Istio's
// default stats the rate before the drain is unknown; a client that
// connects once every 2 s, from the node through the ClusterIP, until 5 s
// after a pod's deletion loses nothing: the wait is the recipe's 5 s of
// quiet, not 1 s.
func TestClusterRotationUnknownRate(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	ns := testNamespace(t, "slowclient", "istio-injection=enabled")
	kubectl(t, localImages(slowClientWeb), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=web", 3*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")
	clusterIP := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	client := &pathClients{name: "node", url: "http://" + clusterIP + "/", dial: (&net.Dialer{}).DialContext}
	waitServiceRules(t, clusterIP) // nothing sent off this machine before it
	waitUntil(t, time.Minute, "the Service reachable from the node", func() bool { return client.once() == nil })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := podsOf(t, ns, "app=web")[0]
	logs, logsDone := followLog(t, ctx, ns, pod.Name, "istio-proxy")
	client.start(2 * time.Second)
	time.Sleep(6 * time.Second) // the rate before the deletion, unread
	if err := kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	client.halt()
	select {
	case <-logsDone:
	case <-ctx.Done():
		t.Fatal("draind's container did not exit within 2 min of the deletion")
	}
	if client.failed.Load() != 0 || client.ok.Load() == 0 {
		t.Errorf("%d connections failed (first: %v), %d ok", client.failed.Load(), client.firstErr, client.ok.Load())
	}
	out := findLog(parsePlainJSONLog(logs.String()), logevent.OutOfRotation)
	if out == nil {
		t.Fatalf("no out_of_rotation line in draind's log:\n%s", logs.String())
	}
	t.Logf("%d ok; out of rotation %v (%v, window %v, rate known %v, %v connections since)", client.ok.Load(), out["took"], out["why"], out["window"], out["rate_known"], out["connections"])
	if known, _ := out["rate_known"].(bool); known {
		t.Errorf("the rate before was read under Istio's default stats: %v", out)
	}
	if took, _ := time.ParseDuration(fmt.Sprint(out["took"])); took < drain.UnknownQuiet {
		t.Errorf("out of rotation %s after the deletion, in under the recipe's %s of quiet: %v", took, drain.UnknownQuiet, out)
	}
}

// TestClusterIstioAppHooks (issue 42, acceptance 2): on the pods istiod's
// webhook writes, the default templates give an app container with no
// preStop draind's out-of-rotation wait (relayed by pilot-agent, as Istio
// rewrites an httpGet hook), keep a container's own preStop (an exec that
// sleeps 3 s) exactly, and leave the app's containers as written under the
// pod's opt-out; istioctl kube-inject writes the same.
func TestClusterIstioAppHooks(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	ns := testNamespace(t, "apphooks", "istio-injection=enabled")
	src := readRepo(t, "e2e/testdata/istio/app-hooks.yaml")
	for _, doc := range docSep.Split(src, -1) {
		if !strings.Contains(doc, "kind: Deployment") {
			continue
		}
		// The templates as istiod's defaults give them, not the annotation.
		doc = strings.Replace(doc, "        inject.istio.io/templates: sidecar,draind,draind-app-prestop\n", "", 1)
		manifest := localImages(doc)
		kubectl(t, manifest, "-n", ns, "apply", "-f", "-")
		var d struct {
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal(manifest, &d); err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		waitUntil(t, 2*time.Minute, d.Metadata.Name+"'s pod created", func() bool {
			pods := podsOf(t, ns, "app="+d.Metadata.Name)
			if len(pods) > 0 {
				pod = pods[0]
			}
			return len(pods) > 0
		})
		preStop := func(name string) *corev1.LifecycleHandler {
			if c := containerNamed(&pod.Spec, name); c != nil && c.Lifecycle != nil {
				return c.Lifecycle.PreStop
			}
			return nil
		}
		switch d.Metadata.Name {
		case "web-hooked":
			if h := preStop("app"); h == nil || h.HTTPGet == nil || h.HTTPGet.Path != "/app-lifecycle/app/prestopz" {
				t.Errorf("web-hooked: the app's preStop %+v, want draind's wait relayed by pilot-agent", h)
			}
			if h := preStop("cache"); h == nil || h.Exec == nil || strings.Join(h.Exec.Command, " ") != "/bin/sleep 3" {
				t.Errorf("web-hooked: the cache's own preStop %+v, want exec /bin/sleep 3", h)
			}
			if c := containerNamed(&pod.Spec, "istio-proxy"); c == nil || !strings.Contains(envValue(c, "ISTIO_KUBE_APP_PROBERS"), agent.RotationWaitPath) {
				t.Errorf("web-hooked: pilot-agent not told where the app's preStop goes")
			}
		case "web-optout":
			if h := preStop("app"); h != nil {
				t.Errorf("web-optout: the app's preStop %+v, want none (draind.io/appPreStop: false)", h)
			}
		}
		native := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "istio-proxy" }) >= 0
		compareInjection(t, pod.Spec, kubeInject(t, manifest, clusterDefaultTemplates, native))
	}
}

// envValue is a container's variable's value ("": unset).
func envValue(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// istioJob is a Job injected by istiod's default templates as a classic
// sidecar, its app unchanged: a task of the test app with args.
const istioJob = `apiVersion: batch/v1
kind: Job
metadata: {name: %[1]s}
spec:
  # OnFailure's restarts in the pod count against it.
  backoffLimit: 2
  template:
    metadata:
      annotations:
        sidecar.istio.io/nativeSidecar: "false"
        proxy.istio.io/config: '{"proxyMetadata": {"DRAIND_APP_START_TIMEOUT": %[4]q}}'
    spec:
      restartPolicy: %[2]s
      volumes:
      - name: scratch
        emptyDir: {}
      containers:
      - name: report
        image: registry.example.com/report:1.0
        args: [%[3]s]
        volumeMounts:
        - {name: scratch, mountPath: /scratch}
`

// TestClusterIstioJobs (issue 42, acceptance 3): Jobs injected as classic
// sidecars by istiod's default templates complete through the job
// controller, the app's manifest unchanged (no quitquitquit, no postStart
// gate): a 50 ms task under Never, and one that fails its first run under
// OnFailure (the kubelet restarts the app in the pod; the proxy stays).
// The template gave draind --exit-with-app from the restart policy, and
// draind exits 0.
func TestClusterIstioJobs(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	ns := testNamespace(t, "istiojobs", "istio-injection=enabled")
	// make e2e-cluster-short's bound for an app draind never saw; the
	// default (2 min) otherwise.
	startTimeout := cmp.Or(os.Getenv(appStartTimeoutVar), "2m")
	for _, tc := range []struct {
		name, policy, args, exitWithApp string
	}{
		{"never-50ms", "Never", `--job, --job-delay, 50ms`, "any"},
		{"onfailure-fails-once", "OnFailure", `--job, --job-delay, 50ms, --fail-once, /scratch/failed`, "success"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := "job-" + tc.name
			kubectl(t, localImages(fmt.Sprintf(istioJob, name, tc.policy, tc.args, startTimeout)), "-n", ns, "apply", "-f", "-")
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			t0 := time.Now()
			if _, err := theCluster.KubectlCmd(ctx, nil, "-n", ns, "wait", "--for=condition=complete", "job/"+name, "--timeout=210s"); err != nil {
				desc, _ := theCluster.KubectlCmd(context.Background(), nil, "-n", ns, "describe", "job/"+name)
				t.Fatalf("%s did not complete: %v\n%s", name, err, desc)
			}
			pods := podsOf(t, ns, "job-name="+name)
			if len(pods) != 1 {
				t.Fatalf("%d pods for %s, want 1", len(pods), name)
			}
			p := pods[0]
			proxy := containerNamed(&p.Spec, "istio-proxy")
			if proxy == nil || envValue(proxy, "DRAIND_EXIT_WITH_APP") != tc.exitWithApp {
				t.Errorf("%s: DRAIND_EXIT_WITH_APP %q, want %q", name, envValue(proxy, "DRAIND_EXIT_WITH_APP"), tc.exitWithApp)
			}
			if app := containerNamed(&p.Spec, "report"); app == nil || app.Lifecycle != nil {
				t.Errorf("%s: the app's container changed: %+v", name, app)
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == "istio-proxy" && (s.State.Terminated == nil || s.State.Terminated.ExitCode != 0) {
					t.Errorf("%s: draind's container did not exit 0: %+v", name, s.State)
				}
				if s.Name == "report" && tc.policy == "OnFailure" && s.RestartCount != 1 {
					t.Errorf("%s: the app restarted %d times, want 1 (its first run fails)", name, s.RestartCount)
				}
			}
			t.Logf("%s complete in %s", name, fmtDur(time.Since(t0)))
		})
	}
}
