package kubelet_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/e2e/kubelet/internal/loadline"
	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testutil"
)

// The rollout measurement (make bench-rollout, docs/benchmarks.md): each
// strategy on its own Deployment behind its own ClusterIP Service, one
// load client per shape in a pod calling the Service through kube-proxy
// at a fixed rate with no retries, through three events in turn:
//
//	restart  `kubectl rollout restart` of 5 replicas (maxSurge 1,
//	         maxUnavailable 0)
//	scale    `kubectl scale` from 5 to 1
//	burst    40 of 45 pods deleted at once, as a node drain does: the
//	         node cordoned (the replacements wait Pending, as if for
//	         other nodes), the 5 left standing for the replicas there
//
// The app's preStop is draind's out-of-rotation wait where draind runs,
// and the usual fixed 5 s (the kubelet's sleep action) beside pilot-agent
// and in draind-classic-fixed5s (draind with DRAIND_MIN_DRAIN=5s). On its
// SIGTERM the app stops accepting, finishes what is in flight and calls
// out through its proxy meanwhile (rolloutCalls calls to the Service up).
// Reported per strategy, event and shape: requests sent and failed by
// class; per event: the app's outbound calls, each terminating pod's time
// from its deletion to gone, and for draind's pods how long after the
// later of its app's exit and its min-drain's end the pod was gone (the
// kubelet's log timestamps and the API watch; acceptance 1 of issue 30:
// ≤ 200 ms) and its exit code; each failure with the step of the
// lifecycle each terminating pod was in. A measurement, not a test: it
// runs only with DRAIND_BENCH_ROLLOUT=1.
const benchRolloutVar = "DRAIND_BENCH_ROLLOUT"

// The run's shape (make bench-rollout's ROLLOUT_ROUNDS, ROLLOUT_ONLY and
// ROLLOUT_EVENTS): how many rounds of every strategy in the one cluster,
// a regular expression the strategies run must match, and one the events
// must match ("": all).
const (
	rolloutRoundsVar = "DRAIND_ROLLOUT_ROUNDS"
	rolloutOnlyVar   = "DRAIND_ROLLOUT_ONLY"
	rolloutEventsVar = "DRAIND_ROLLOUT_EVENTS"
)

// The events' sizes.
const (
	rolloutReplicas = 5
	burstReplicas   = 45
	burstDeleted    = 40
	// rolloutCalls are the app's outbound calls on SIGTERM, 100 ms apart.
	rolloutCalls = 20
	// drainedLagMax is acceptance 1's bound on a draind pod's time from
	// the later of its app's exit and its min-drain's end to gone.
	drainedLagMax = 200 * time.Millisecond
	// standInCPU is the CPU request of the pods that stand for other
	// nodes' (the load clients, the Service the app calls): a Burstable
	// pod's cpu.shares follow its request, a BestEffort one's are 2, so
	// without it the injected strategies' web pods (10m each, 45 of
	// them) outweighed the clients about 200 to 1 while 40 pods stopped
	// at once, and a client read its answers late.
	standInCPU = "100m"
	// rolloutQPS is each load client's rate.
	rolloutQPS = 20.0
	// loadTimeout is a request's timeout (the load client's default).
	loadTimeout = 5 * time.Second
)

var rolloutEvents = []string{"restart", "scale", "burst"}

// rolloutPlan reads the run's shape from the environment.
func rolloutPlan() (rounds int, strategies []rolloutStrategy, events []string, err error) {
	rounds = 1
	if v := os.Getenv(rolloutRoundsVar); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			return 0, nil, nil, fmt.Errorf("%s=%q: want a count of 1 or more", rolloutRoundsVar, v)
		}
	}
	match := func(name string) (*regexp.Regexp, error) {
		re, err := regexp.Compile(os.Getenv(name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return re, nil
	}
	only, err := match(rolloutOnlyVar)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, st := range rolloutStrategies {
		if only.MatchString(st.name) {
			strategies = append(strategies, st)
		}
	}
	if len(strategies) == 0 {
		return 0, nil, nil, fmt.Errorf("%s=%q matches no strategy", rolloutOnlyVar, os.Getenv(rolloutOnlyVar))
	}
	evs, err := match(rolloutEventsVar)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, e := range rolloutEvents {
		if evs.MatchString(e) {
			events = append(events, e)
		}
	}
	if len(events) == 0 {
		return 0, nil, nil, fmt.Errorf("%s=%q matches no event (%s)", rolloutEventsVar, os.Getenv(rolloutEventsVar), strings.Join(rolloutEvents, ", "))
	}
	return rounds, strategies, events, nil
}

type rolloutStrategy struct {
	name      string
	injected  bool   // in an istio-injection=enabled namespace
	templates string // inject.istio.io/templates ("": the default, draind above pilot-agent)
	proxyCfg  string // proxy.istio.io/config
	manifest  string // a deploy/ manifest (not injected)
	// proxy is the proxy's container: draind's in draind's strategies.
	proxy      string
	draind     bool
	targetPort int
	// appHook is the app container's preStop: the wait for the pod to
	// leave rotation (draind's status port), or the fixed recipe's 5 s.
	appHook appHook
	// minDrain replaces the manifest's DRAIND_MIN_DRAIN ("": as written).
	minDrain string
	// netstatLoop: the recipe's proxy, a classic sidecar whose preStop
	// is the netstat loop (README.md, "Why").
	netstatLoop bool
}

// appHook is the app's preStop in a rollout: the out-of-rotation wait on
// draind's status port (15020 in the deploy/ manifests, 15022 beside
// pilot-agent), hookSleep5, the recipe every guide gives, or hookNone,
// the app's manifest untouched (whatever the injector writes).
type appHook struct {
	waitPort int32 // 0: hookSleep5
	none     bool
}

var (
	hookSleep5 = appHook{}
	hookNone   = appHook{none: true}
)

func (h appHook) String() string {
	switch {
	case h.none:
		return "untouched"
	case h.waitPort == 0:
		return "sleep 5s"
	}
	return "wait-oor"
}

// netstatLoop is the recipe's proxy preStop, as the articles give it.
const netstatLoop = `while [ $(netstat -plunt | grep tcp | grep -v envoy | wc -l) -ne 0 ]; do sleep 1; done`

var rolloutStrategies = []rolloutStrategy{
	{name: "draind-classic", manifest: "deploy/classic-sidecar.yaml", proxy: "envoy", draind: true, targetPort: 15006, appHook: appHook{waitPort: 15020}},
	{name: "draind-classic-fixed5s", manifest: "deploy/classic-sidecar.yaml", proxy: "envoy", draind: true, targetPort: 15006, appHook: hookSleep5, minDrain: "5s"},
	{name: "draind-native", manifest: "deploy/native-sidecar.yaml", proxy: "envoy", draind: true, targetPort: 15006, appHook: appHook{waitPort: 15020}},
	{name: "draind-istio", injected: true, proxy: "istio-proxy", draind: true, targetPort: 8080, appHook: appHook{waitPort: int32(istio.FirstFreePort)}},
	// Issue 42: the namespace label alone, the app's manifest untouched:
	// istiod's default templates write the app's hook (draind-app-prestop).
	{name: "draind-label", injected: true, proxy: "istio-proxy", draind: true, targetPort: 8080, appHook: hookNone},
	{name: "pilot-agent", injected: true, templates: "sidecar", proxy: "istio-proxy", targetPort: 8080, appHook: hookSleep5},
	{name: "stock-untouched", injected: true, templates: "sidecar", proxy: "istio-proxy", targetPort: 8080, appHook: hookNone},
	{name: "pilot-agent-exit-on-zero", injected: true, templates: "sidecar", proxyCfg: `{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true"}}`, proxy: "istio-proxy", targetPort: 8080, appHook: hookSleep5},
	{name: "recipe-netstat", injected: true, templates: "sidecar", proxy: "istio-proxy", targetPort: 8080, appHook: hookSleep5, netstatLoop: true},
}

// rolloutShapes are the load's shapes: pods on the node's bridge through
// the ClusterIP (a new connection each request, keep-alive, HTTP/2), and
// two clients the node forwards with masquerade (issue 41): the node
// itself through the ClusterIP ("node", as a hostNetwork pod or an
// ingress on the node's network would), an outside host through a
// NodePort under externalTrafficPolicy Cluster ("nodeport", as a cloud
// load balancer in instance mode), a new connection each request, and
// gRPC calls from a client fed by istiod ([xdsShape], issue 45).
var rolloutShapes = []string{"newconn", "keepalive", "h2", "node", "nodeport", xdsShape}

// hostShape: the shape's client runs on the node, not in a pod.
func hostShape(shape string) bool { return shape == "node" || shape == "nodeport" }

func TestBenchRollout(t *testing.T) {
	if os.Getenv(benchRolloutVar) != "1" {
		t.Skipf("a measurement: set %s=1 (make bench-rollout)", benchRolloutVar)
	}
	requireIstiod(t)
	rounds, strategies, events, err := rolloutPlan()
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	for round := 1; round <= rounds; round++ {
		for _, st := range strategies {
			// Its namespace lives to the run's end (the parent's
			// cleanup); a strategy that fails leaves the others to run.
			ns := testNamespace(t, fmt.Sprintf("ro%d-%s", round, st.name))
			t.Run(fmt.Sprintf("round%d/%s", round, st.name), func(t *testing.T) {
				table = append(table, rolloutOne(t, st, ns, round, events)...)
			})
		}
	}
	report.add("rollout", "table", "\n"+strings.Join(table, "\n"))
}

// rolloutNS is one strategy's namespace in one round.
type rolloutNS struct {
	st    rolloutStrategy
	ns    string
	round int
	webIP string
	// nodePort is the web-np Service's, reached from outside, the
	// network namespace routed through the node.
	nodePort string
	outside  *testutil.NetNS
}

// rolloutOne runs st's events once in ns and returns its table lines.
// The namespace is scaled to nothing at the end, whichever way it ends,
// for the next strategy's burst.
func rolloutOne(t *testing.T, st rolloutStrategy, ns string, round int, events []string) []string {
	r := &rolloutNS{st: st, round: round, ns: ns}
	t.Cleanup(func() {
		if t.Failed() {
			theCluster.KubectlCmd(context.Background(), nil, "-n", ns, "delete", "deployments,pods", "--all", "--wait=false")
		}
	})
	if st.injected {
		kubectl(t, nil, "label", "namespace", ns, "istio-injection=enabled")
	}
	// The Service the app calls out to: a plain test app.
	kubectl(t, []byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: up}
spec:
  replicas: 1
  selector: {matchLabels: {app: up}}
  template:
    metadata:
      labels: {app: up, sidecar.istio.io/inject: "false"}
    spec:
      containers:
      - name: app
        image: `+images.TestApp+`
        # Ready once before the load starts; after that a saturated node's
        # probe timeouts (the kubelet's 1 s default, 40 pods stopping at
        # once) must not take up out of its Service: the calls measure the
        # proxy, not the fixture (a burst lost 155 calls to REJECT so).
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1, timeoutSeconds: 5, failureThreshold: 60}
        resources: {requests: {cpu: `+standInCPU+`}}
---
apiVersion: v1
kind: Service
metadata: {name: up}
spec:
  selector: {app: up}
  ports: [{name: http, port: 80, targetPort: 8080}]
`), "-n", ns, "apply", "-f", "-")
	upIP := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "up", "-o", "jsonpath={.spec.clusterIP}"))
	// Through envoysim's outbound listener (deploy/: the ConfigMap sends
	// it to up), or, injected, to up's address: istio-init's rules send
	// it through the proxy.
	callURL := "http://127.0.0.1:15001/"
	if st.injected {
		callURL = "http://" + upIP + "/"
	}
	kubectl(t, envoySidecarConfigMapData(t, images.EnvoysimConfigOutbound(upIP+":80")), "-n", ns, "apply", "-f", "-")
	kubectl(t, rolloutDeployment(t, st, callURL), "-n", ns, "apply", "-f", "-")
	kubectl(t, fmt.Appendf(nil, `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: %d}
  - {name: grpc, port: %d, targetPort: %d, appProtocol: grpc}
`, st.targetPort, images.GRPCPort, grpcTargetPort(st)), "-n", ns, "apply", "-f", "-")
	kubectl(t, nodePortService("web-np", "Cluster", st.targetPort), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=up", 3*time.Minute)
	waitPodsReady(t, ns, "app=web", 3*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
	r.webIP = strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	r.nodePort = strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	r.outside = outsideHost(t)
	r.waitReachable(t, r.webIP)
	r.waitReachable(t, upIP)

	var table []string
	for _, ev := range events {
		table = append(table, r.event(t, ev)...)
	}
	kubectl(t, nil, "-n", ns, "scale", "deployment/web", "deployment/up", "--replicas=0")
	kubectl(t, nil, "-n", ns, "delete", "pods", "-l", "role=load", "--wait=false")
	waitUntil(t, 3*time.Minute, ns+"'s pods gone", func() bool { return len(podsOf(t, ns, "")) == 0 })
	return table
}

// waitReachable waits for kube-proxy to program a new Service (at its
// next sync, up to --iptables-min-sync-period), then for it to answer:
// the load starts once the node reaches it. Nothing is sent before the
// rule exists: the node's default route would carry it off this machine,
// and a pooled connection to whatever answered there (a 404, for a whole
// minute, at sync 10 s) would never meet the rule. A new connection each
// try.
func (r *rolloutNS) waitReachable(t *testing.T, ip string) {
	t.Helper()
	waitServiceRules(t, ip)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for end, last := time.Now().Add(time.Minute), ""; ; time.Sleep(100 * time.Millisecond) {
		resp, err := hc.Get("http://" + ip + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the Service %s not reachable through kube-proxy after 1m, last: %s; pods:\n%s\nendpoints:\n%s", r.st.name, ip, last,
				kubectl(t, nil, "-n", r.ns, "get", "pods", "-o", "wide"), kubectl(t, nil, "-n", r.ns, "get", "endpointslices", "-o", "yaml"))
		}
	}
}

// waitServiceRules waits for kube-proxy's rule for a Service's ClusterIP
// in the node's nat table.
func waitServiceRules(t *testing.T, clusterIP string) {
	t.Helper()
	waitUntil(t, time.Minute, "kube-proxy's rules for "+clusterIP, func() bool { return strings.Contains(natRules(t), "-d "+clusterIP+"/32 ") })
}

// event runs one event under load and returns its table lines.
func (r *rolloutNS) event(t *testing.T, ev string) []string {
	ns, st := r.ns, r.st
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	switch ev {
	case "burst":
		kubectl(t, nil, "-n", ns, "scale", "deployment/web", fmt.Sprintf("--replicas=%d", burstReplicas))
	default:
		kubectl(t, nil, "-n", ns, "scale", "deployment/web", fmt.Sprintf("--replicas=%d", rolloutReplicas))
	}
	kubectlWithin(t, 11*time.Minute, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=600s")
	waitPodsReady(t, ns, "app=web", 5*time.Minute)
	lives := watchLives(t, ctx, ns, "app=web", []string{"app", st.proxy})
	defer lives.stop()
	flows, err := watchServiceFlows(r.webIP)
	if err != nil {
		t.Fatal(err)
	}
	defer flows.stopWatch()
	var loads []string
	var hostLoads []*hostLoad
	for _, shape := range rolloutShapes {
		if hostShape(shape) {
			hostLoads = append(hostLoads, r.startHostLoad(t, shape))
			continue
		}
		if shape == xdsShape {
			loads = append(loads, r.startXDSLoad(t, ev))
			continue
		}
		name := "load-" + ev + "-" + shape
		kubectl(t, nil, "-n", ns, "run", name, "--image", images.LoadClient, "--restart=Never", "--labels", "role=load,sidecar.istio.io/inject=false",
			"--override-type=strategic", "--overrides", fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"resources":{"requests":{"cpu":%q}}}]}}`, name, standInCPU),
			"--", "--url", "http://"+r.webIP+"/", "--qps", fmt.Sprint(rolloutQPS), "--timeout", loadTimeout.String(), "--duration", "30m", "--mode", shape, "--stop-addr", fmt.Sprintf(":%d", loadStopPort))
		loads = append(loads, name)
	}
	waitPodsReady(t, ns, "role=load", time.Minute)
	time.Sleep(5 * time.Second)
	eps := watchSlices(t, ns, "web")
	defer eps.stop()
	pushesBefore, err := istiodConvergence()
	if err != nil {
		t.Logf("%s %s: %v", st.name, ev, err)
	}

	t0, cpu := time.Now(), watchCPU()
	defer cpu.String() // stops it on a failure; safe twice
	old := podsOf(t, ns, "app=web")
	switch ev {
	case "restart":
		kubectl(t, nil, "-n", ns, "rollout", "restart", "deployment/web")
	case "scale":
		kubectl(t, nil, "-n", ns, "scale", "deployment/web", "--replicas=1")
	case "burst":
		// A node drain: the node cordoned, so that the 40 replacements
		// wait Pending as if for other nodes (started here, their 40
		// start-ups would starve the 40 drains of this node's 2 CPUs);
		// the newest 40 deleted at once, the oldest 5 staying as the
		// replicas on other nodes.
		node := theCluster.Config.Node.NodeName
		kubectl(t, nil, "cordon", node)
		t.Cleanup(func() { theCluster.KubectlCmd(context.Background(), nil, "uncordon", node) })
		slices.SortFunc(old, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		old = old[len(old)-burstDeleted:]
		var wg sync.WaitGroup
		errs := make(chan error, len(old))
		for _, p := range old {
			wg.Go(func() { errs <- kube.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("%s: burst: %v", st.name, err)
			}
		}
	}
	remain := 0
	if ev == "scale" {
		remain = 1
	}
	defer func() {
		if t.Failed() {
			names, resumed := lives.terminating()
			t.Logf("%s %s: still terminating in the pods' watch: %v (resumed %d)", st.name, ev, names, resumed)
		}
	}()
	waitUntil(t, 5*time.Minute, st.name+" "+ev+": the old pods' end", func() bool { return lives.settled(old, remain) })
	if ev == "restart" {
		kubectlWithin(t, 11*time.Minute, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=600s")
	}
	took := time.Since(t0)
	load := cpu.String()
	pushesAfter, err := istiodConvergence()
	if err != nil {
		t.Logf("%s %s: %v", st.name, ev, err)
	}
	eps.stop()
	time.Sleep(3 * time.Second)
	// Each load client ends with its summary on /stop; its pod completes
	// and keeps its log.
	podLogs, podClients := stopLoads(t, ns, loads)
	var logs []string
	var clients []netip.Addr
	for _, shape := range rolloutShapes {
		if hostShape(shape) {
			h := hostLoads[0]
			hostLoads = hostLoads[1:]
			logs, clients = append(logs, h.stop(t)), append(clients, h.client)
			continue
		}
		logs, clients = append(logs, podLogs[0]), append(clients, podClients[0])
		podLogs, podClients = podLogs[1:], podClients[1:]
	}
	flows.stopWatch()
	lives.stop()
	pods := lives.ended() // the old pods' logs whole, before any step is read
	if ev == "burst" {
		kubectl(t, nil, "uncordon", theCluster.Config.Node.NodeName)
	}

	var table []string
	for i, shape := range rolloutShapes {
		sum, fails, err := parseLoad(logs[i])
		if err != nil {
			t.Fatalf("%s %s %s: %v", st.name, ev, shape, err)
		}
		success := 0.0
		if sum.Sent > 0 {
			success = float64(sum.OK) / float64(sum.Sent)
		}
		byStep := map[string]int{}
		for _, f := range fails {
			// The pod the failed connection went to (the node's
			// conntrack, or the peer the gRPC client picked), else
			// every pod terminating then.
			var where, key string
			ip, ok := flows.podFor(clients[i], f.local, f.at)
			if peer, err := netip.ParseAddrPort(f.peer); !ok && err == nil {
				ip, ok = peer.Addr(), true
			}
			if ok {
				where, key = lives.podStepAt(ip, f.at)
				key = "on " + key
				if f.class == "timeout" {
					// Sent at one step, unanswered until another: the
					// pod's step when the client gave up too.
					endWhere, endKey := lives.podStepAt(ip, f.at.Add(loadTimeout))
					where += "; at its timeout " + strings.TrimPrefix(endWhere, "on ")
					if "on "+endKey != key {
						key += ", timed out at " + strings.TrimPrefix(endKey, "its pod at ")
					}
				}
			} else {
				where, key = lives.stepsAt(f.at, t0), "at "+lives.stepsKey(f.at)
			}
			t.Logf("  %s %s %s failure at +%s: %s %s (reached %s, local %s); %s", st.name, ev, shape, fmtDur(f.at.Sub(t0)), f.class, f.err,
				f.reached, f.local, where)
			byStep[f.class+" "+key]++
		}
		line := fmt.Sprintf("sync %-4s round %d %-24s %-7s %-9s app %-8s sent %5d failed %4d success %.4f %v",
			fmtDur(theCluster.Config.ProxySyncPeriod), r.round, st.name, ev, shape, st.appHook, sum.Sent, sum.Failed, success, sum.ByClass)
		if len(byStep) > 0 {
			line += fmt.Sprintf(" by step %v", byStep)
		}
		t.Log(line)
		table = append(table, line)
		if shape == xdsShape {
			lines := strings.Split(strings.TrimSpace(logs[i]), "\n")
			c, _ := parseXDSLine(lines[len(lines)-1])
			line := fmt.Sprintf("sync %-4s round %d %-24s %-7s %s", fmtDur(theCluster.Config.ProxySyncPeriod), r.round, st.name, ev,
				xdsFigures(st, pods, eps, c.Peers, convergenceSummary(pushesBefore, pushesAfter)))
			t.Log(line)
			table = append(table, line)
		}
	}
	line := fmt.Sprintf("sync %-4s round %d %-24s %-7s took %s; %s; %s", fmtDur(theCluster.Config.ProxySyncPeriod), r.round, st.name, ev, fmtDur(took),
		terminationSummary(t, st, pods, t0), load)
	if lives.resumed > 0 {
		// Read after stop. A pod seen gone by a list has its end late.
		line += fmt.Sprintf("; the pods' watch resumed %d (%d from a list)", lives.resumed, lives.relisted)
	}
	t.Log(line)
	t.Logf("  failures pinned by %s", flows)
	table = append(table, line)
	return table
}

// hostLoad is a load client run on the node: the node itself, or the
// outside host (its network namespace), standing for clients the node
// forwards with masquerade.
type hostLoad struct {
	shape  string
	client netip.Addr // its address, for the node's conntrack
	cmd    *exec.Cmd
	out    bytes.Buffer
}

// loadClientBin is the load client built for the node (once).
var loadClientBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "draind-loadclient-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "loadclient")
	return out, images.GoBuild(context.Background(), ".", "./cmd/loadclient", out)
})

// startHostLoad starts shape's client on the node: to the ClusterIP from
// the node's own namespace ("node"), or to the node's address and the
// NodePort from the outside host ("nodeport").
func (r *rolloutNS) startHostLoad(t *testing.T, shape string) *hostLoad {
	t.Helper()
	bin, err := loadClientBin()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--qps", fmt.Sprint(rolloutQPS), "--timeout", loadTimeout.String(), "--duration", "30m", "--mode", "newconn"}
	h := &hostLoad{shape: shape}
	switch shape {
	case "node":
		h.cmd = exec.Command(bin, append(args, "--url", "http://"+r.webIP+"/")...)
		h.client, _ = netip.ParseAddr(theCluster.NodeIP)
	case "nodeport":
		// nsenter: the client's every thread in the outside namespace.
		ns := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(r.outside.Handle))
		h.cmd = exec.Command("nsenter", append([]string{"--net=" + ns, "--", bin, "--url", "http://" + net.JoinHostPort(theCluster.NodeIP, r.nodePort) + "/"}, args...)...)
		h.client = outsideAddr
	}
	h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.out
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("load client %s: %v", shape, err)
	}
	t.Cleanup(func() { h.cmd.Process.Kill(); h.cmd.Wait() })
	return h
}

// stop ends the client (SIGTERM: its summary last) and returns its log.
func (h *hostLoad) stop(t *testing.T) string {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGTERM)
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("load client %s: %v\n%s", h.shape, err, h.out.String())
	}
	return h.out.String()
}

// loadStopPort is where the load clients serve /stop.
const loadStopPort = 8081

// stopLoads ends the load clients (pods in ns), reads their logs and
// deletes them; clients are their pods' addresses.
func stopLoads(t *testing.T, ns string, pods []string) (logs []string, clients []netip.Addr) {
	t.Helper()
	completed := func(name string) bool {
		p, err := kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
	}
	for _, name := range pods {
		p, err := kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := netip.ParseAddr(p.Status.PodIP)
		clients = append(clients, ip)
		url := fmt.Sprintf("http://%s:%d/stop", p.Status.PodIP, loadStopPort)
		// Taken once it answers, or once the client is gone: its answer
		// may be cut by its exit, and a retry then finds nothing.
		waitUntil(t, 30*time.Second, "the load client "+name+" to take /stop", func() bool {
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
			if err == nil {
				resp.Body.Close()
				return true
			}
			return completed(name)
		})
	}
	for _, name := range pods {
		waitUntil(t, time.Minute, "the load client "+name+" to complete", func() bool { return completed(name) })
		logs = append(logs, kubectl(t, nil, "-n", ns, "logs", name))
	}
	kubectl(t, nil, "-n", ns, "delete", "pods", "-l", "role=load", "--wait=false")
	return logs, clients
}

// parseLoad reads a load client's log: its failures and its summary.
func parseLoad(log string) (sum loadSummary, fails []loadFailure, err error) {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i, l := range lines {
		_, body := splitTimestamp(l)
		if i == len(lines)-1 {
			if err := json.Unmarshal([]byte(body), &sum); err != nil {
				return sum, nil, fmt.Errorf("no summary: %w\n%s", err, log)
			}
			break
		}
		var f loadline.Call
		if json.Unmarshal([]byte(body), &f) == nil && f.T != 0 {
			fails = append(fails, loadFailure{at: time.Unix(0, f.T), class: f.Class, err: f.Err, local: f.Local, reached: f.Reached, peer: f.Peer})
		}
	}
	return sum, fails, nil
}

type loadSummary = loadline.Summary

type loadFailure struct {
	at         time.Time
	class, err string
	// local is the client's end ("IP:PORT", "*:PORT" for a failed dial),
	// reached the request's last step (loadclient's), peer the endpoint
	// xdsload's balancer picked ("": none, or another client).
	local, reached, peer string
}

// terminationSummary is an event's old pods' end: the app's outbound
// calls; each pod's time from deletion to gone (count, mean, max); for
// draind's pods the time from the later of its app's exit and its
// min-drain's end to gone, the proxy's exit codes, and the pods past
// drainedLagMax or past their grace period. Failed calls are logged with
// their steps.
func terminationSummary(t *testing.T, st rolloutStrategy, pods []*podLife, t0 time.Time) string {
	var callsOK, callsFailed, untoldFound, untoldClosed int
	// own: draind's part, from the later of the app's exit and the
	// min-drain's end to draind's last line (its exit); kubelet: the rest,
	// from there to the pod gone.
	var terms, lags, own, kubelet []time.Duration
	exits := map[string]int{}
	var late, pastGrace []string
	for _, p := range pods {
		app := p.log("app")
		failedBefore := callsFailed
		for _, l := range strings.Split(app, "\n") {
			at, body := splitTimestamp(l)
			f := strings.Fields(body)
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case "ok":
				callsOK++
			case "fail":
				callsFailed++
				t.Logf("  %s outbound call failed at +%s: %s; %s", p.name, fmtDur(at.Sub(t0)), body, p.stepAt(at))
			}
		}
		if callsFailed > failedBefore && st.draind {
			// What draind decided, for a pod whose app lost a call: the
			// timeline says when, these lines say why.
			for _, l := range strings.Split(p.log(p.proxy), "\n") {
				if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"event":"phase"`) || strings.Contains(l, `"event":"gate_holds"`) ||
					strings.Contains(l, `"event":"app_gone_ends_await"`) || strings.Contains(l, `"event":"gate_deadline_late"`) || strings.Contains(l, `"event":"sigterm_after_prestop"`) ||
					strings.Contains(l, `"event":"signal"`) || strings.Contains(l, `"event":"sigterm_ends_min_drain"`) {
					t.Logf("    %s draind: %s", p.name, l)
				}
			}
		}
		if p.deleting.IsZero() || p.gone.IsZero() {
			continue
		}
		t.Logf("  %s: %s", p.name, p.timeline())
		term := p.gone.Sub(p.deleting)
		terms = append(terms, term)
		if p.grace > 0 && term > p.grace {
			pastGrace = append(pastGrace, fmt.Sprintf("%s %s", p.name, fmtDur(term)))
		}
		exits[p.proxyExit]++
		if !st.draind {
			continue
		}
		f, c := p.untold()
		untoldFound, untoldClosed = untoldFound+f, untoldClosed+c
		from := p.appExit()
		if from.IsZero() {
			late = append(late, p.name+" (no app exit in its log)")
			continue
		}
		if m := p.minDrainEnd(); m.After(from) {
			from = m
		}
		lag := p.gone.Sub(from)
		lags = append(lags, lag)
		if last := p.proxyLastLine(); !last.IsZero() {
			own = append(own, last.Sub(from))
			kubelet = append(kubelet, p.gone.Sub(last))
		}
		if lag > drainedLagMax {
			late = append(late, fmt.Sprintf("%s %s (draind stopping %s after)", p.name, fmtDur(lag), fmtDur(p.stopping().Sub(from))))
		}
	}
	if slowest := slowestPod(pods); slowest != nil {
		t.Logf("  the slowest pod to go, %s: its %s's log:\n%s", slowest.name, slowest.proxy, tail(slowest.log(slowest.proxy), 40))
	}
	s := fmt.Sprintf("calls %d ok %d failed; terminating %s", callsOK, callsFailed, durStats(terms))
	if st.draind {
		s += fmt.Sprintf("; gone after max(app exit, min-drain end) %s (draind exited after it %s, then the kubelet %s), over %s: %d %v; untold keep-alives closed %d of %d found",
			durStats(lags), durStats(own), durStats(kubelet), fmtDur(drainedLagMax), len(late), late, untoldClosed, untoldFound)
	}
	codes := make([]string, 0, len(exits))
	for c, n := range exits {
		codes = append(codes, fmt.Sprintf("%s×%d", c, n))
	}
	sort.Strings(codes)
	s += fmt.Sprintf("; proxy exit %s; past grace %d %v", strings.Join(codes, " "), len(pastGrace), pastGrace)
	return s
}

// slowestPod is the pod longest from deletion to gone (nil: none went).
func slowestPod(pods []*podLife) *podLife {
	var slow *podLife
	for _, p := range pods {
		if p.deleting.IsZero() || p.gone.IsZero() {
			continue
		}
		if slow == nil || p.gone.Sub(p.deleting) > slow.gone.Sub(slow.deleting) {
			slow = p
		}
	}
	return slow
}

// tail is s's last n lines.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// durStats is "N mean M max X".
func durStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return fmt.Sprintf("%d mean %s max %s", len(ds), fmtDur(sum/time.Duration(len(ds))), fmtDur(slices.Max(ds)))
}

// rolloutDeployment is a strategy's Deployment: app=web, 5 replicas,
// maxSurge 1 and maxUnavailable 0, the local images, the common app
// calling out to callURL on SIGTERM.
func rolloutDeployment(t *testing.T, st rolloutStrategy, callURL string) []byte {
	t.Helper()
	src := plainWeb
	if st.manifest != "" {
		src = readRepo(t, st.manifest)
	}
	var d appsv1.Deployment
	for _, doc := range docSep.Split(string(localImages(src)), -1) {
		if yaml.Unmarshal([]byte(doc), &d) == nil && d.Kind == "Deployment" {
			break
		}
	}
	d.Name = "web"
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	d.Spec.Template.Labels = map[string]string{"app": "web"}
	replicas := int32(rolloutReplicas)
	d.Spec.Replicas = &replicas
	one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &one, MaxUnavailable: &zero}}
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	if st.templates != "" {
		d.Spec.Template.Annotations["inject.istio.io/templates"] = st.templates
	}
	if st.proxyCfg != "" {
		d.Spec.Template.Annotations["proxy.istio.io/config"] = st.proxyCfg
	}
	if st.injected {
		// Istio's default request (100m) would leave most of the burst's
		// 45 pods Pending on this node's 2 CPUs.
		d.Spec.Template.Annotations["sidecar.istio.io/proxyCPU"] = "10m"
		d.Spec.Template.Annotations["sidecar.istio.io/proxyMemory"] = "32Mi"
	}
	if st.netstatLoop {
		// The articles' shape: a classic sidecar (Istio's injector merges
		// a container named istio-proxy over its own).
		d.Spec.Template.Annotations["sidecar.istio.io/nativeSidecar"] = "false"
		// The image is the one istiod injects (testdata/cluster/istio-values.yaml).
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: "istio-proxy", Image: images.ProxyV2,
			Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", netstatLoop}}}}})
	}
	for _, cs := range [][]corev1.Container{d.Spec.Template.Spec.Containers, d.Spec.Template.Spec.InitContainers} {
		for i := range cs {
			c := &cs[i]
			switch {
			case c.Name == "app":
				c.Args = []string{"--on-term", "graceful", "--calls", strconv.Itoa(rolloutCalls), "--call-pause", "100ms", "--call-url", callURL,
					"--grpc-port", strconv.Itoa(images.GRPCPort)}
				pre := &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}
				if st.appHook.waitPort != 0 {
					pre = &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: agent.RotationWaitPath, Port: intstr.FromInt32(st.appHook.waitPort)}}
				}
				if !st.appHook.none {
					c.Lifecycle = &corev1.Lifecycle{PreStop: pre}
				}
			case st.minDrain != "" && c.Name == "envoy":
				i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DRAIND_MIN_DRAIN" })
				if i < 0 {
					t.Fatalf("%s: no DRAIND_MIN_DRAIN in its envoy container", st.manifest)
				}
				c.Env[i].Value = st.minDrain
			}
		}
	}
	b, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// podLog is one container's log, streamed with the kubelet's timestamps
// until the container exits.
type podLog struct {
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{}
	err  error
}

// followPodLog streams ns/pod's container ("": its only one) from its
// start, retrying for a minute while the container has not started,
// until it exits or ctx ends.
func followPodLog(ctx context.Context, ns, pod, container string) *podLog {
	l := &podLog{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for end := time.Now().Add(time.Minute); ; {
			rc, err := kube.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true, Timestamps: true}).Stream(ctx)
			if err == nil {
				sc := bufio.NewScanner(rc)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				for sc.Scan() {
					l.mu.Lock()
					l.buf.WriteString(sc.Text())
					l.buf.WriteByte('\n')
					l.mu.Unlock()
				}
				rc.Close()
				l.err = sc.Err()
				return
			}
			l.err = err
			if time.Now().After(end) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return l
}

// wait waits for the stream's end.
func (l *podLog) wait(d time.Duration) error {
	select {
	case <-l.done:
		return l.err
	case <-time.After(d):
		return fmt.Errorf("still streaming after %s", d)
	}
}

func (l *podLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// splitTimestamp splits a line of a log streamed with timestamps.
func splitTimestamp(line string) (time.Time, string) {
	ts, rest, ok := strings.Cut(line, " ")
	if !ok {
		return time.Time{}, line
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, line
	}
	return at, rest
}

// podLife is one pod's lifecycle as the API watch and its containers'
// logs show it.
type podLife struct {
	name, proxy string
	ip          netip.Addr // the pod's address, once the watch saw it
	grace       time.Duration
	// Moments the watch saw (zero: not seen).
	ready, notReady, deleting, gone time.Time
	// proxyExit is the proxy container's exit code once the watch saw it
	// terminated ("?" before).
	proxyExit string
	proxyEnd  time.Time
	logs      map[string]*podLog
	// stepsDone are steps, read once from the whole logs (podLives.ended).
	stepsDone []podEvent
}

func (p *podLife) log(container string) string {
	if l := p.logs[container]; l != nil {
		return l.text()
	}
	return ""
}

// appLine is when the app's log line starting with word came ("term",
// "exit"), by the kubelet's timestamp.
func (p *podLife) appLine(word string) time.Time {
	for _, l := range strings.Split(p.log("app"), "\n") {
		at, body := splitTimestamp(l)
		if strings.HasPrefix(body, word+" ") {
			return at
		}
	}
	return time.Time{}
}

func (p *podLife) appExit() time.Time { return p.appLine("exit") }

// draindLog is the proxy container's JSON lines (draind's; pilot-agent's
// own lines are not JSON and left out), each with its "ts".
func (p *podLife) draindLog() []map[string]any {
	var recs []map[string]any
	for _, l := range strings.Split(p.log(p.proxy), "\n") {
		_, body := splitTimestamp(l)
		var r map[string]any
		if json.Unmarshal([]byte(body), &r) == nil {
			recs = append(recs, r)
		}
	}
	return recs
}

// minDrainEnd is when draind's min-drain ended: its phase draining is the
// min-drain (drain.Machine's minDrainHold), so the end is the next phase
// line (gating, or stopping); zero without a phase draining.
func (p *podLife) minDrainEnd() time.Time {
	draining := false
	for _, r := range p.draindLog() {
		if r[logevent.Key] != string(logevent.Phase) {
			continue
		}
		switch r["phase"] {
		case drain.Draining.String():
			draining = true
		case drain.Gating.String(), drain.Stopping.String():
			if draining {
				return logTime(r)
			}
		}
	}
	return time.Time{}
}

// untold sums draind's untold_closed lines: the keep-alives it found idle
// since before Envoy's drain began, and those it closed.
func (p *podLife) untold() (found, closed int) {
	for _, r := range p.draindLog() {
		if r[logevent.Key] == string(logevent.UntoldClosed) {
			f, _ := r["found"].(float64)
			c, _ := r["closed"].(float64)
			found, closed = found+int(f), closed+int(c)
		}
	}
	return found, closed
}

// stopping is draind's phase stopping (zero: none).
func (p *podLife) stopping() time.Time {
	return logTime(findLogWith(p.draindLog(), logevent.Phase, "phase", drain.Stopping.String()))
}

// proxyLastLine is when the proxy container wrote its last line (draind's
// and pilot-agent's end with their exit): the kubelet's timestamp, a
// closer mark of the exit than the status the watch sees later.
func (p *podLife) proxyLastLine() time.Time {
	lines := strings.Split(strings.TrimSpace(p.log(p.proxy)), "\n")
	at, _ := splitTimestamp(lines[len(lines)-1])
	return at
}

// steps are the pod's lifecycle moments known, in order; read from its
// logs once, after podLives.ended (each failure asks every terminating
// pod).
func (p *podLife) steps() []podEvent {
	if p.stepsDone != nil {
		return p.stepsDone
	}
	var evs []podEvent
	add := func(at time.Time, what string) {
		if !at.IsZero() {
			evs = append(evs, podEvent{at, what})
		}
	}
	add(p.deleting, "deleting")
	add(p.notReady, "not ready")
	add(p.appLine("term"), "app SIGTERM")
	add(p.appExit(), "app exited")
	add(p.minDrainEnd(), "min-drain ended")
	add(p.stopping(), "draind stopping the proxy")
	add(p.proxyLastLine(), "proxy's last log line")
	add(p.proxyEnd, "proxy exited "+p.proxyExit+" (seen)")
	add(p.gone, "gone")
	slices.SortStableFunc(evs, func(a, b podEvent) int { return a.at.Compare(b.at) })
	p.stepsDone = evs
	return evs
}

// timeline is the pod's steps from its deletion: "deleting +0s, ...".
func (p *podLife) timeline() string {
	var b []string
	for _, e := range p.steps() {
		b = append(b, fmt.Sprintf("%s +%s", e.what, fmtDur(e.at.Sub(p.deleting))))
	}
	return strings.Join(b, ", ")
}

// stepAt is the pod's last step at at: "name: step 1.2s before".
func (p *podLife) stepAt(at time.Time) string {
	last, since := p.lastStep(at)
	return fmt.Sprintf("%s: %s %s before", p.name, last, fmtDur(since))
}

// terminatingAt: the pod's deletion was seen by at, and it was not gone.
func (p *podLife) terminatingAt(at time.Time) bool {
	return !p.deleting.IsZero() && !p.deleting.After(at) && (p.gone.IsZero() || p.gone.After(at))
}

// lastStep is the pod's last step at at, and how long before at it came.
func (p *podLife) lastStep(at time.Time) (string, time.Duration) {
	last := "before deletion"
	var since time.Duration
	for _, e := range p.steps() {
		if e.at.After(at) {
			break
		}
		last, since = e.what, at.Sub(e.at)
	}
	return last, since
}

// stepOrder is the lifecycle's order of the steps (steps' names, the proxy's
// exit by its prefix), for a failure's steps.
var stepOrder = []string{"before deletion", "deleting", "not ready", "app SIGTERM", "app exited", "min-drain ended",
	"draind stopping the proxy", "proxy's last log line", "proxy exited", "gone"}

func stepRank(what string) int {
	for i, s := range stepOrder {
		if strings.HasPrefix(what, s) {
			return i
		}
	}
	return -1
}

type podEvent struct {
	at   time.Time
	what string
}

// podLives follows a namespace's pods: the watch's moments, and the
// containers' logs of each pod deleted meanwhile (streamed from its
// containers' start once its deletion is seen: the old pods' alone, not
// the dozens a burst starts).
type podLives struct {
	done       chan struct{}
	ctx        context.Context    // the log streams'
	cancel     context.CancelFunc // the watch's
	ns         string
	selector   string
	containers []string
	mu         sync.Mutex
	pods       map[string]*podLife
	// resumed counts the watches the API server ended before stop, and
	// relisted those resumed from a list (the pods missing from it gone
	// at the list's time, late by up to the gap).
	resumed, relisted int
	stopOnce          sync.Once
}

// watchLives follows the pods of selector in ns; containers are the app's
// and then the proxy's.
func watchLives(t *testing.T, ctx context.Context, ns, selector string, containers []string) *podLives {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	w, err := kube.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	pl := &podLives{done: make(chan struct{}), ctx: ctx, cancel: cancel, ns: ns, selector: selector, containers: containers, pods: map[string]*podLife{}}
	go pl.follow(wctx, w)
	return pl
}

// follow feeds see from w until wctx ends. The API server ends a watch
// whose reader falls behind (a burst's 40 pods on a saturated node: once,
// every pod went at 30 s and the watch saw none of it for 5 min), so an
// ended watch is resumed from the last resource version seen, or, once
// that is too old, from a fresh list.
func (pl *podLives) follow(wctx context.Context, w watch.Interface) {
	defer close(pl.done)
	rv := ""
	for {
		for ev := range w.ResultChan() {
			switch o := ev.Object.(type) {
			case *corev1.Pod:
				pl.see(ev.Type, o)
				rv = o.ResourceVersion
			case *metav1.Status:
				rv = "" // 410 Gone: the version was compacted away
			}
		}
		w.Stop()
		if wctx.Err() != nil {
			return
		}
		pl.mu.Lock()
		pl.resumed++
		pl.mu.Unlock()
		for w = nil; w == nil; {
			var err error
			if rv == "" {
				var list *corev1.PodList
				if list, err = kube.CoreV1().Pods(pl.ns).List(wctx, metav1.ListOptions{LabelSelector: pl.selector}); err == nil {
					pl.relist(list.Items)
					rv = list.ResourceVersion
				}
			}
			if err == nil {
				w, err = kube.CoreV1().Pods(pl.ns).Watch(wctx, metav1.ListOptions{LabelSelector: pl.selector, ResourceVersion: rv})
			}
			if err != nil {
				select {
				case <-wctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}
	}
}

// relist sees each listed pod and marks gone the pods followed but not
// listed.
func (pl *podLives) relist(pods []corev1.Pod) {
	listed := map[string]bool{}
	for i := range pods {
		listed[pods[i].Name] = true
		pl.see(watch.Modified, &pods[i])
	}
	now := time.Now()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.relisted++
	for name, l := range pl.pods {
		if !listed[name] && l.gone.IsZero() {
			l.gone = now
		}
	}
}

func (pl *podLives) see(typ watch.EventType, p *corev1.Pod) {
	now := time.Now()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	life := pl.pods[p.Name]
	if life == nil {
		life = &podLife{name: p.Name, proxy: pl.containers[len(pl.containers)-1], proxyExit: "?", logs: map[string]*podLog{}}
		if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
			life.grace = time.Duration(*g) * time.Second
		}
		pl.pods[p.Name] = life
	}
	isReady := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
	if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
		life.ip = ip
	}
	if isReady && life.ready.IsZero() {
		life.ready = now
	}
	if !isReady && !life.ready.IsZero() && life.notReady.IsZero() {
		life.notReady = now
	}
	if p.DeletionTimestamp != nil && life.deleting.IsZero() {
		life.deleting = now
		for _, c := range pl.containers {
			life.logs[c] = followPodLog(pl.ctx, pl.ns, p.Name, c)
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if cs.Name == life.proxy && cs.State.Terminated != nil && life.proxyEnd.IsZero() {
			life.proxyEnd, life.proxyExit = now, strconv.Itoa(int(cs.State.Terminated.ExitCode))
		}
	}
	if typ == watch.Deleted && life.gone.IsZero() {
		life.gone = now
	}
}

// settled: no pod is terminating any more, and remain of pods are left.
func (pl *podLives) settled(pods []corev1.Pod, remain int) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, l := range pl.pods {
		if !l.deleting.IsZero() && l.gone.IsZero() {
			return false
		}
	}
	left := 0
	for _, p := range pods {
		if l := pl.pods[p.Name]; l == nil || l.gone.IsZero() {
			left++
		}
	}
	return left == remain
}

// terminating names the pods seen deleting and not yet gone, and how
// often the watch was resumed so far.
func (pl *podLives) terminating() (names []string, resumed int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, l := range pl.pods {
		if !l.deleting.IsZero() && l.gone.IsZero() {
			names = append(names, l.name)
		}
	}
	sort.Strings(names)
	return names, pl.resumed
}

// ended is the lives of the pods that went, in the order of their
// deletion; their logs are whole (each stream ended with its container).
// Call after stop.
func (pl *podLives) ended() []*podLife {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var out []*podLife
	for _, l := range pl.pods {
		if l.gone.IsZero() {
			continue
		}
		for _, lg := range l.logs {
			lg.wait(10 * time.Second) // its container is gone: the stream ends
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *podLife) int { return a.deleting.Compare(b.deleting) })
	return out
}

// stepsAt is each terminating pod's step at at, for a failure then.
func (pl *podLives) stepsAt(at, t0 time.Time) string {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var s []string
	for _, l := range pl.pods {
		if l.terminatingAt(at) {
			s = append(s, l.stepAt(at))
		}
	}
	if len(s) == 0 {
		return "no pod terminating"
	}
	sort.Strings(s)
	return "terminating: " + strings.Join(s, "; ")
}

// podStepAt is the step at at of the pod at ip (the one not yet gone by
// at, of those that had it), for a failure pinned to it: the log's
// "name: step 1.2s before" and the table's key.
func (pl *podLives) podStepAt(ip netip.Addr, at time.Time) (where, key string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, l := range pl.pods {
		if l.ip != ip || (!l.gone.IsZero() && l.gone.Before(at)) {
			continue
		}
		if !l.terminatingAt(at) {
			return "on " + l.name + ", not terminating", "a pod not terminating"
		}
		step, _ := l.lastStep(at)
		return "on " + l.stepAt(at), "its pod at " + step
	}
	return "on " + ip.String() + ", no pod of the Service", ip.String() + ", no pod of the Service"
}

// stepsKey is a failure's steps for the table: the step each pod
// terminating at at had reached, in the lifecycle's order, with a count
// where several were at the same ("app SIGTERM, proxy's last log line
// ×3"; "no pod terminating": none). With one pod at a time it is that
// pod's step; a 503 falls to a pod whose proxy was still up, a refusal or
// reset to one whose proxy was going; in the burst, a failure while every
// pod is still "deleting" is the node's, no proxy having acted.
func (pl *podLives) stepsKey(at time.Time) string {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	n, total := map[string]int{}, 0
	for _, l := range pl.pods {
		if l.terminatingAt(at) {
			step, _ := l.lastStep(at)
			n[step]++
			total++
		}
	}
	if len(n) == 0 {
		return "no pod terminating"
	}
	steps := slices.Collect(maps.Keys(n))
	slices.SortFunc(steps, func(a, b string) int { return cmp.Or(cmp.Compare(stepRank(a), stepRank(b)), cmp.Compare(a, b)) })
	if total > stepsKeyPods {
		// A burst: every failure would be a key of its own. The span of
		// steps says enough: all still deleting (the node's), or how far
		// the furthest had gone.
		return fmt.Sprintf("%d pods, %s to %s", total, steps[0], steps[len(steps)-1])
	}
	for i, st := range steps {
		if n[st] > 1 {
			steps[i] = fmt.Sprintf("%s ×%d", st, n[st])
		}
	}
	return strings.Join(steps, ", ")
}

// stepsKeyPods is the most terminating pods a failure's key lists one by
// one (restart: 1-2, scale: 4); more (the burst) get their span.
const stepsKeyPods = 5

// stop ends the watch; the log streams end with their containers or the
// event's context. Safe twice.
func (pl *podLives) stop() {
	pl.stopOnce.Do(func() {
		pl.cancel()
		<-pl.done
	})
}

// cpuWatch follows the node's CPU through an event: busy cores from
// /proc/stat, and each process's own time (utime+stime) added up by
// command name from a read every second, so that processes that exit in
// between lose at most a second (a reaped child's time is not counted
// again in its parent's cutime).
type cpuWatch struct {
	stop chan struct{}
	done chan struct{}
	// Written by the watcher, read after done.
	busy0, total0, busy, total uint64
	byComm                     map[string]uint64
	start                      time.Time
	took                       time.Duration
}

func watchCPU() *cpuWatch {
	w := &cpuWatch{stop: make(chan struct{}), done: make(chan struct{}), byComm: map[string]uint64{}, start: time.Now()}
	w.busy0, w.total0 = procStatTicks()
	last := procTicks()
	go func() {
		defer close(w.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
			case <-tick.C:
			}
			now := procTicks()
			for k, v := range now {
				if prev, ok := last[k]; ok && v.ticks >= prev.ticks {
					w.byComm[v.comm] += v.ticks - prev.ticks
				} else if !ok {
					w.byComm[v.comm] += v.ticks // started since the last read
				}
			}
			last = now
			select {
			case <-w.stop:
				w.busy, w.total = procStatTicks()
				w.took = time.Since(w.start)
				return
			default:
			}
		}
	}()
	return w
}

// String ends the watch and says the node's load: busy cores of all, and
// the commands that took most.
func (w *cpuWatch) String() string {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	const hz = 100 // USER_HZ
	secs := w.took.Seconds()
	type use struct {
		comm  string
		cores float64
	}
	var uses []use
	for c, v := range w.byComm {
		uses = append(uses, use{c, float64(v) / hz / secs})
	}
	slices.SortFunc(uses, func(x, y use) int { return cmp.Compare(y.cores, x.cores) })
	var top []string
	for _, u := range uses[:min(8, len(uses))] {
		top = append(top, fmt.Sprintf("%s %.2f", u.comm, u.cores))
	}
	return fmt.Sprintf("node busy %.2f of %.0f cores (%s)", float64(w.busy-w.busy0)/hz/secs, float64(w.total-w.total0)/hz/secs, strings.Join(top, ", "))
}

// procStatTicks is the node's busy and total ticks.
func procStatTicks() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

type procKey struct {
	pid   string
	start string // starttime: a reused PID is another process
}

type procUse struct {
	comm  string
	ticks uint64
}

// procTicks is each process's own CPU ticks (utime+stime).
func procTicks() map[procKey]procUse {
	out := map[procKey]procUse{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		open, close := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || close < open || close+2 > len(b) {
			continue
		}
		f := strings.Fields(string(b[close+2:]))
		if len(f) < 20 {
			continue
		}
		u, _ := strconv.ParseUint(f[11], 10, 64)
		s, _ := strconv.ParseUint(f[12], 10, 64)
		out[procKey{e.Name(), f[19]}] = procUse{string(b[open+1 : close]), u + s}
	}
	return out
}
