package kubelet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/internal/agent"
)

// The rollout measurement (make bench-rollout, docs/benchmarks.md): each
// strategy on its own Deployment of 5 replicas behind its own ClusterIP
// Service, one load client per shape in a pod calling the Service through
// kube-proxy at a fixed rate with no retries, through `kubectl rollout
// restart` (maxSurge 1, maxUnavailable 0). The app's preStop is draind's
// out-of-rotation wait where draind runs, and the usual fixed 5 s (the
// kubelet's sleep action) beside pilot-agent and in draind-classic-fixed5s
// (draind with DRAIND_MIN_DRAIN=5s): issue 31's case 5, at each kube-proxy
// min sync period `make bench-rollout` runs (ROLLOUT_SYNC). Reported per
// strategy and shape:
// requests sent and failed by class, and each old pod's time in
// Terminating (deletionTimestamp to gone). A measurement, not a test: it
// runs only with DRAIND_BENCH_ROLLOUT=1.
const benchRolloutVar = "DRAIND_BENCH_ROLLOUT"

// The run's shape (make bench-rollout's ROLLOUT_ROUNDS and ROLLOUT_ONLY):
// how many rounds of every strategy in the one cluster, and a regular
// expression the strategies run must match ("": all).
const (
	rolloutRoundsVar = "DRAIND_ROLLOUT_ROUNDS"
	rolloutOnlyVar   = "DRAIND_ROLLOUT_ONLY"
)

// rolloutPlan reads the run's shape from the environment.
func rolloutPlan() (rounds int, strategies []rolloutStrategy, err error) {
	rounds = 1
	if v := os.Getenv(rolloutRoundsVar); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			return 0, nil, fmt.Errorf("%s=%q: want a count of 1 or more", rolloutRoundsVar, v)
		}
	}
	only := regexp.MustCompile("")
	if v := os.Getenv(rolloutOnlyVar); v != "" {
		if only, err = regexp.Compile(v); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", rolloutOnlyVar, err)
		}
	}
	for _, st := range rolloutStrategies {
		if only.MatchString(st.name) {
			strategies = append(strategies, st)
		}
	}
	if len(strategies) == 0 {
		return 0, nil, fmt.Errorf("%s=%q matches no strategy", rolloutOnlyVar, os.Getenv(rolloutOnlyVar))
	}
	return rounds, strategies, nil
}

type rolloutStrategy struct {
	name       string
	injected   bool   // in an istio-injection=enabled namespace
	templates  string // inject.istio.io/templates ("": the default, draind above pilot-agent)
	proxyCfg   string // proxy.istio.io/config
	manifest   string // a deploy/ manifest (not injected)
	targetPort int
	// appHook is the app container's preStop: the wait for the pod to
	// leave rotation (draind's status port), or the fixed recipe's 5 s.
	appHook appHook
	// minDrain replaces the manifest's DRAIND_MIN_DRAIN ("": as written).
	minDrain string
}

// appHook is the app's preStop in a rollout: the out-of-rotation wait on
// draind's status port (15020 in the deploy/ manifests, 15022 beside
// pilot-agent), or hookSleep5, the recipe every guide gives.
type appHook struct {
	waitPort int32 // 0: hookSleep5
}

var hookSleep5 = appHook{}

func (h appHook) String() string {
	if h.waitPort == 0 {
		return "sleep 5s"
	}
	return "wait-oor"
}

var rolloutStrategies = []rolloutStrategy{
	{name: "draind-classic", manifest: "deploy/classic-sidecar.yaml", targetPort: 15006, appHook: appHook{15020}},
	{name: "draind-classic-fixed5s", manifest: "deploy/classic-sidecar.yaml", targetPort: 15006, appHook: hookSleep5, minDrain: "5s"},
	{name: "draind-native", manifest: "deploy/native-sidecar.yaml", targetPort: 15006, appHook: appHook{15020}},
	{name: "draind-istio", injected: true, targetPort: 8080, appHook: appHook{int32(agent.PilotAgentStatusPort)}},
	{name: "pilot-agent", injected: true, templates: "sidecar", targetPort: 8080, appHook: hookSleep5},
	{name: "pilot-agent-exit-on-zero", injected: true, templates: "sidecar", proxyCfg: `{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true"}}`, targetPort: 8080, appHook: hookSleep5},
}

var rolloutShapes = []string{"newconn", "keepalive", "h2"}

// rolloutApp is every strategy's app: on SIGTERM (after its preStop) it
// stops accepting and finishes what is in flight.
var rolloutApp = []string{"--on-term", "graceful"}

func TestBenchRollout(t *testing.T) {
	if os.Getenv(benchRolloutVar) != "1" {
		t.Skipf("a measurement: set %s=1 (make bench-rollout)", benchRolloutVar)
	}
	requireIstiod(t)
	rounds, strategies, err := rolloutPlan()
	if err != nil {
		t.Fatal(err)
	}
	qps := 20.0
	var table []string
	for round := 1; round <= rounds; round++ {
		for _, st := range strategies {
			table = append(table, rolloutOne(t, st, round, qps)...)
		}
	}
	report.add("rollout", "table", "\n"+strings.Join(table, "\n"))
}

// rolloutOne rolls st's Deployment once under load (round names its
// namespace) and returns its table lines, one per load shape.
func rolloutOne(t *testing.T, st rolloutStrategy, round int, qps float64) []string {
	var table []string
	ns := testNamespace(t, fmt.Sprintf("ro%d-%s", round, st.name))
	if st.injected {
		kubectl(t, nil, "label", "namespace", ns, "istio-injection=enabled")
	}
	kubectl(t, envoySidecarConfigMap(t), "-n", ns, "apply", "-f", "-")
	kubectl(t, rolloutDeployment(t, st), "-n", ns, "apply", "-f", "-")
	kubectl(t, fmt.Appendf(nil, `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: %d}]
`, st.targetPort), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=web", 3*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
	ip := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	// kube-proxy programs a new Service at its next sync (up to
	// --iptables-min-sync-period): the load starts once the node
	// reaches it, or its first requests are refused by no rule at all.
	for end, last := time.Now().Add(time.Minute), ""; ; time.Sleep(100 * time.Millisecond) {
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + ip + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the Service %s not reachable through kube-proxy after 1m, last: %s; pods:\n%s\nendpoints:\n%s", st.name, ip, last,
				kubectl(t, nil, "-n", ns, "get", "pods", "-o", "wide"), kubectl(t, nil, "-n", ns, "get", "endpointslices", "-o", "yaml"))
		}
	}

	term := watchTerminating(t, ns)
	defer term.stop() // on a failure; stop is safe twice
	loadFor := 60 * time.Second
	for _, shape := range rolloutShapes {
		kubectl(t, nil, "-n", ns, "run", "load-"+shape, "--image", images.LoadClient, "--restart=Never", "--labels", "role=load,sidecar.istio.io/inject=false",
			"--", "--url", "http://"+ip+"/", "--qps", fmt.Sprint(qps), "--duration", loadFor.String(), "--mode", shape)
	}
	waitPodsReady(t, ns, "role=load", time.Minute)
	time.Sleep(5 * time.Second)
	t0 := time.Now()
	kubectl(t, nil, "-n", ns, "rollout", "restart", "deployment/web")
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=300s")
	rolled := time.Since(t0)
	// The old pods' last seconds, then the clients' end.
	waitUntil(t, 3*time.Minute, "the load clients' end", func() bool {
		for _, p := range podsOf(t, ns, "role=load") {
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				return false
			}
		}
		return true
	})
	terms := term.stop()
	for _, shape := range rolloutShapes {
		out := kubectl(t, nil, "-n", ns, "logs", "load-"+shape)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var sum struct {
			Sent, OK, Failed int
			ByClass          map[string]int `json:"by_class"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
			t.Fatalf("%s %s: no summary: %v\n%s", st.name, shape, err, out)
		}
		success := 0.0
		if sum.Sent > 0 {
			success = float64(sum.OK) / float64(sum.Sent)
		}
		line := fmt.Sprintf("sync %-4s round %d %-24s %-9s app %-9s sent %5d failed %4d success %.4f %v rollout %s terminating %s",
			fmtDur(theCluster.Config.ProxySyncPeriod), round, st.name, shape, st.appHook, sum.Sent, sum.Failed, success, sum.ByClass, fmtDur(rolled), terms)
		t.Log(line)
		table = append(table, line)
		if sum.Failed > 0 {
			// Each failure against the pods' lifecycle, from the
			// rollout's start: which step it fell in.
			for _, l := range lines[:len(lines)-1] {
				var f struct {
					T          int64
					Class, Err string
				}
				if json.Unmarshal([]byte(l), &f) == nil && f.T != 0 {
					t.Logf("  %s %s failure at %s: %s %s", st.name, shape, fmtDur(time.Unix(0, f.T).Sub(t0)), f.Class, f.Err)
				}
			}
			t.Logf("  %s pods: %s", st.name, term.timeline(t0))
		}
	}
	return table
}

// rolloutDeployment is a strategy's Deployment: app=web, 5 replicas,
// maxSurge 1 and maxUnavailable 0, the local images, the common app.
func rolloutDeployment(t *testing.T, st rolloutStrategy) []byte {
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
	replicas := int32(5)
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
	for _, cs := range [][]corev1.Container{d.Spec.Template.Spec.Containers, d.Spec.Template.Spec.InitContainers} {
		for i := range cs {
			c := &cs[i]
			switch {
			case c.Name == "app":
				c.Args = slices.Clone(rolloutApp)
				pre := &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}
				if st.appHook.waitPort != 0 {
					pre = &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: agent.RotationWaitPath, Port: intstr.FromInt32(st.appHook.waitPort)}}
				}
				c.Lifecycle = &corev1.Lifecycle{PreStop: pre}
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

// terminatingWatch records each pod's lifecycle as the watch sees it:
// Ready, not ready, deletion seen, gone.
type terminatingWatch struct {
	w      watch.Interface
	done   chan struct{}
	mu     sync.Mutex
	events []podEvent
}

type podEvent struct {
	at        time.Time
	pod, what string
}

// timeline is the pods' events from t0, in order. Call after stop.
func (tw *terminatingWatch) timeline(t0 time.Time) string {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	var b strings.Builder
	for _, e := range tw.events {
		fmt.Fprintf(&b, "%s %s %s; ", fmtDur(e.at.Sub(t0)), e.pod, e.what)
	}
	return b.String()
}

func watchTerminating(t *testing.T, ns string) *terminatingWatch {
	t.Helper()
	w, err := kube.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	tw := &terminatingWatch{w: w, done: make(chan struct{})}
	deleting := map[string]bool{}
	ready := map[string]bool{}
	note := func(pod, what string) {
		tw.mu.Lock()
		tw.events = append(tw.events, podEvent{time.Now(), pod, what})
		tw.mu.Unlock()
	}
	go func() {
		defer close(tw.done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			isReady := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			if isReady != ready[p.Name] {
				ready[p.Name] = isReady
				note(p.Name, map[bool]string{true: "ready", false: "not ready"}[isReady])
			}
			if p.DeletionTimestamp != nil {
				if !deleting[p.Name] {
					deleting[p.Name] = true
					note(p.Name, "deleting")
				}
			}
			if ev.Type == watch.Deleted {
				note(p.Name, "gone")
			}
		}
	}()
	return tw
}

// stop ends the watch and summarises each pod's time in Terminating, from
// its deletion seen to gone: count, mean and max. Safe twice.
func (tw *terminatingWatch) stop() string {
	tw.w.Stop()
	<-tw.done
	tw.mu.Lock()
	defer tw.mu.Unlock()
	deleted := map[string]time.Time{}
	var n int
	var sum, maxD time.Duration
	for _, e := range tw.events {
		switch e.what {
		case "deleting":
			deleted[e.pod] = e.at
		case "gone":
			if at, ok := deleted[e.pod]; ok {
				d := e.at.Sub(at)
				n, sum, maxD = n+1, sum+d, max(maxD, d)
			}
		}
	}
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d pods mean %s max %s", n, fmtDur(sum/time.Duration(n)), fmtDur(maxD))
}
