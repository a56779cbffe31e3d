package kubelet_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/flows"
)

// The node's view (docs/node-view.md): `draind conns|watch --pod`,
// `draind pods` and the `kubectl debug node` recipe, run on the node of
// the cluster as an operator runs them, found through the kubelet's CRI
// socket (not at containerd's default path here: the kubelet's
// configuration names it).

// nodeDraind builds draind for the node (the tests run it as root on the
// host, as a debug pod with hostPID would).
func nodeDraind(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "draind")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := images.GoBuild(ctx, repoRoot, "./cmd/draind", out); err != nil {
		t.Fatal(err)
	}
	return out
}

// draindRun runs draind on the node: its stdout, stderr and exit code.
func draindRun(t *testing.T, bin string, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("draind %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// nvPod is a pod of these tests: the test app, with draind beside it
// (the draind image's own entrypoint: draind run -- envoysim) unless
// plain.
func nvPod(name, appArgs string, plain bool, extra string) string {
	s := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {nv: "1"}
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - name: app
    image: %s
    args: [%s]
    readinessProbe:
      httpGet: {path: /readyz, port: 8080}
      periodSeconds: 2
`, name, images.TestApp, appArgs)
	if !plain {
		s += fmt.Sprintf(`  - name: envoy
    image: %s
    env:
    - {name: DRAIND_MIN_DRAIN, value: 1s}
    - {name: DRAIND_DRAIN_DEADLINE, value: 55s}
%s    readinessProbe:
      httpGet: {path: /healthz/ready, port: 15020}
      periodSeconds: 2
`, images.Draind, extra)
	}
	return s
}

// nvView is `draind pods -o json`'s object.
type nvView struct {
	CRI struct {
		Address, Why string
	} `json:"cri"`
	Pods []nvRow `json:"pods"`
}

type nvRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Draind    *struct {
		Container  string `json:"container"`
		StatusAddr string `json:"status_addr"`
	} `json:"draind"`
	State *agent.PodState `json:"state"`
	Flows *flows.Summary  `json:"flows"`
	Error string          `json:"error"`
}

func (v *nvView) pod(ns, name string) *nvRow {
	for i := range v.Pods {
		if v.Pods[i].Namespace == ns && v.Pods[i].Name == name {
			return &v.Pods[i]
		}
	}
	return nil
}

// holds says whether a hold of kind whose text has what holds the drain.
func (r *nvRow) holds(kind, what string) bool {
	return r != nil && r.State != nil && slices.ContainsFunc(r.State.Holds, func(h agent.PodHold) bool {
		return h.Kind == kind && strings.Contains(h.What, what)
	})
}

// brief is a row's phase, holds and error, for the log.
func (r *nvRow) brief() string {
	if r == nil {
		return "gone"
	}
	if r.State == nil {
		return fmt.Sprintf("draind %v, flows %+v, error %q", r.Draind != nil, r.Flows, r.Error)
	}
	return fmt.Sprintf("%s %+v", r.State.Phase, r.State.Holds)
}

func (r *nvRow) phase() string {
	if r == nil || r.State == nil {
		return ""
	}
	return r.State.Phase
}

// TestClusterPodByName: `draind conns --pod NS/NAME` and `draind watch
// --pod NS/NAME` look into the pod --pid names, with the same
// attribution; an unknown pod, a pod of another node and a missing CRI
// socket are each one line and exit 2.
func TestClusterPodByName(t *testing.T) {
	requireCluster(t)
	t.Parallel()
	bin := nodeDraind(t)
	ns := testNamespace(t, "byname")
	kubectl(t, []byte(nvPod("web", "", false, "")), "-n", ns, "apply", "-f", "-")
	// A pod bound to a node that is not this one: the API has it, this
	// node's runtime never will.
	kubectl(t, []byte(`apiVersion: v1
kind: Pod
metadata: {name: away}
spec:
  nodeName: another-node
  containers: [{name: app, image: `+images.TestApp+`}]
`), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "nv=1", 2*time.Minute)
	pod := podsOf(t, ns, "nv=1")[0]
	pid := podPID(t, pod)

	// A connection of the node's to the app, held open: an inbound flow
	// of the app's in the pod.
	c, err := net.Dial("tcp4", pod.Status.PodIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mine := c.LocalAddr().String()

	conns := func(args ...string) (map[string]any, map[string]any) {
		t.Helper()
		out, errs, code := draindRun(t, bin, 30*time.Second, append([]string{"conns", "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("draind conns %q: exit %d: %s", args, code, errs)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("draind conns %q: %v\n%s", args, err, out)
		}
		for _, f := range v["flows"].([]any) {
			if m := f.(map[string]any); m["remote"] == mine {
				return v, m
			}
		}
		t.Fatalf("draind conns %q: no flow from %s:\n%s", args, mine, out)
		return nil, nil
	}
	byPID, flowPID := conns("--pid", fmt.Sprint(pid))
	for _, args := range [][]string{{"--pod", ns + "/web"}, {"--pod", ns + "/web", "--container", "envoy"}} {
		byPod, flowPod := conns(args...)
		for _, k := range []string{"owner", "direction", "local", "state"} {
			if flowPod[k] != flowPID[k] {
				t.Errorf("conns %q: the flow's %s %v, --pid says %v", args, k, flowPod[k], flowPID[k])
			}
		}
		if a, b := listenerOwners(byPod), listenerOwners(byPID); !slices.Equal(a, b) {
			t.Errorf("conns %q: listeners %v, --pid says %v", args, a, b)
		}
		target, _ := byPod["target"].(map[string]any)
		cri, _ := target["cri"].(map[string]any)
		if why, _ := cri["why"].(string); !strings.Contains(why, "kubelet pid") {
			t.Errorf("conns %q: the CRI endpoint not found through the kubelet: %v", args, target)
		}
		t.Logf("conns %q: the flow %v; target %v", args, flowPod, target)
	}
	if flowPID["owner"] != "app" || flowPID["direction"] != "inbound" {
		t.Errorf("the node's connection: %v, want the app's, inbound", flowPID)
	}

	// watch: --pod and --pid side by side see one new connection alike.
	watchers := map[string]*lineReader{}
	for name, args := range map[string][]string{"pid": {"--pid", fmt.Sprint(pid)}, "pod": {"--pod", ns + "/web"}} {
		watchers[name] = startLines(t, bin, append([]string{"watch", "-o", "json", "--procs=false"}, args...)...)
	}
	for name, w := range watchers {
		if l, ok := w.next(10 * time.Second); !ok || !strings.Contains(l, `"mode"`) {
			t.Fatalf("watch %s: no header: %q", name, l)
		}
	}
	c2, err := net.Dial("tcp4", pod.Status.PodIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	mine2 := c2.LocalAddr().String()
	seen := map[string]string{}
	for name, w := range watchers {
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); {
			l, ok := w.next(time.Until(end))
			if !ok {
				break
			}
			var ch struct {
				Owner     string `json:"owner"`
				Direction string `json:"direction"`
				Remote    string `json:"remote"`
				NewState  string `json:"new_state"`
			}
			if json.Unmarshal([]byte(l), &ch) == nil && ch.Remote == mine2 && ch.NewState == "ESTABLISHED" {
				seen[name] = ch.Owner + " " + ch.Direction
				break
			}
		}
	}
	t.Logf("watch: the new connection as --pid and --pod saw it: %v", seen)
	if seen["pid"] == "" || seen["pid"] != seen["pod"] {
		t.Errorf("watch --pod saw %q, --pid %q: want the same, seen", seen["pod"], seen["pid"])
	}

	// The three errors: one line naming what was asked, exit 2.
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown pod", []string{"--pod", ns + "/nope"}, "pod " + ns + "/nope: not on this node"},
		{"another node's pod", []string{"--pod", ns + "/away"}, "pod " + ns + "/away: not on this node"},
		{"no CRI socket", []string{"--pod", ns + "/web", "--cri-endpoint", "unix:///run/draind-nowhere/containerd.sock"}, "cri endpoint unix:///run/draind-nowhere/containerd.sock (--cri-endpoint): no container runtime"},
	} {
		for _, cmd := range []string{"conns", "watch"} {
			_, errs, code := draindRun(t, bin, 30*time.Second, append([]string{cmd}, tc.args...)...)
			t.Logf("%s, %s: exit %d: %s", tc.name, cmd, code, strings.TrimSpace(errs))
			if code != 2 || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
				t.Errorf("%s, draind %s: exit %d, stderr %q; want exit 2 and one line with %q", tc.name, cmd, code, errs, tc.want)
			}
		}
	}
}

// listenerOwners are conns' listeners as "address owner", sorted.
func listenerOwners(v map[string]any) []string {
	var out []string
	ls, _ := v["listeners"].([]any)
	for _, l := range ls {
		m, _ := l.(map[string]any)
		out = append(out, fmt.Sprint(m["local"], " ", m["owner"]))
	}
	slices.Sort(out)
	return out
}

// lineReader is a command's stdout, line by line; the command is killed
// when the test ends.
type lineReader struct {
	lines chan string
}

func startLines(t *testing.T, bin string, args ...string) *lineReader {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &lineReader{lines: make(chan string, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case r.lines <- sc.Text():
			default: // the test stopped reading
			}
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		cmd.Wait()
		if t.Failed() && errb.Len() > 0 {
			t.Logf("draind %s: stderr: %s", strings.Join(args, " "), errb.String())
		}
	})
	return r
}

func (r *lineReader) next(d time.Duration) (string, bool) {
	select {
	case l, ok := <-r.lines:
		return l, ok
	case <-time.After(d):
		return "", false
	}
}

// TestClusterNodeView: ten pods on the node, `draind pods` on the node:
// two draining (one held by a slow request in flight, one by an app
// still shutting down), one without draind (its flows from the kernel),
// one whose draind is stopped (SIGSTOP: the kernel still accepts the
// connection, nothing answers) and six ready. Each line says so, the
// stopped one is marked within the timeout without holding up the
// others, and the live mode shows the drains begin.
func TestClusterNodeView(t *testing.T) {
	requireCluster(t)
	t.Parallel()
	bin := nodeDraind(t)
	ns := testNamespace(t, "nodeview")
	var manifest []string
	ready := []string{"ready-1", "ready-2", "ready-3", "ready-4", "ready-5", "ready-6"}
	for _, n := range ready {
		manifest = append(manifest, nvPod(n, "", false, ""))
	}
	manifest = append(manifest,
		nvPod("held-by-request", "", false, ""),
		nvPod("held-by-app", "--delay-shutdown, 40s", false, ""),
		nvPod("plain", "", true, ""),
		nvPod("hung", "", false, ""))
	kubectl(t, []byte(strings.Join(manifest, "---\n")), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "nv=1", 3*time.Minute)
	pods := map[string]string{} // name → IP
	for _, p := range podsOf(t, ns, "nv=1") {
		pods[p.Name] = p.Status.PodIP
	}

	view := func(args ...string) (nvView, time.Duration) {
		t.Helper()
		t0 := time.Now()
		out, errs, code := draindRun(t, bin, time.Minute, append([]string{"pods", "-o", "json", "--timeout", "1s"}, args...)...)
		took := time.Since(t0)
		if code != 0 {
			t.Fatalf("draind pods: exit %d: %s", code, errs)
		}
		var v nvView
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("draind pods: %v\n%s", err, out)
		}
		return v, took
	}
	v, took := view()
	t.Logf("draind pods: %d pods in %s; cri %s (%s)", len(v.Pods), took.Round(time.Millisecond), v.CRI.Address, v.CRI.Why)
	for name := range pods {
		if r := v.pod(ns, name); r == nil || (name != "plain" && r.phase() != "ready") {
			t.Errorf("%s before anything: %+v, want ready", name, r)
		}
	}

	// The live view, from before the changes.
	live := startLines(t, bin, "pods", "-o", "json", "-w", "500ms", "--timeout", "1s")

	// A slow request in flight to held-by-request's app.
	slow := getInFlight(t, "http://"+pods["held-by-request"]+":8080/slow?ms=45000", 2*time.Minute)

	// hung: its draind stopped; the kernel still completes connections
	// to its status port.
	hungPID := draindPIDOf(t, "hung", ns)
	if err := syscall.Kill(hungPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(hungPID, syscall.SIGCONT)

	for _, n := range []string{"held-by-request", "held-by-app"} {
		kubectl(t, nil, "-n", ns, "delete", "pod", n, "--wait=false")
	}
	var final nvView
	last := ""
	waitUntil(t, 45*time.Second, "both drains held as expected", func() bool {
		final, took = view()
		req, app := final.pod(ns, "held-by-request"), final.pod(ns, "held-by-app")
		if b := req.brief() + "; " + app.brief(); b != last {
			last = b
			t.Logf("held-by-request; held-by-app: %s", b)
		}
		// The request: an app flow (app-flows, or app-sockets' flows
		// when draind cannot see the app's processes: no eBPF here, no
		// shared PID namespace); the app: its processes, or its listener.
		return req.phase() == "gating" && (req.holds("app-flows", "") || req.holds("app-sockets", " 1 flows")) &&
			app.phase() == "gating" && (app.holds("app-procs", "") || app.holds("app-sockets", "1 listeners"))
	})
	var table string
	{
		out, _, code := draindRun(t, bin, time.Minute, "pods", "--timeout", "1s")
		if code != 0 {
			t.Fatalf("draind pods (table): exit %d", code)
		}
		table = out
		t.Logf("draind pods:\n%s", table)
	}
	t.Logf("draind pods -o json took %s with one pod stopped", took.Round(time.Millisecond))
	for _, n := range ready {
		if r := final.pod(ns, n); r.phase() != "ready" || r.Error != "" {
			t.Errorf("%s: %+v, want ready", n, r)
		}
	}
	if r := final.pod(ns, "held-by-request"); r.State.Trigger == "" || r.State.DeadlineInMS <= 0 || r.State.SinceTriggerMS <= 0 {
		t.Errorf("held-by-request: %+v, want a trigger, the time since it and the time left", r.State)
	}
	if r := final.pod(ns, "plain"); r == nil || r.Draind != nil || r.Flows == nil || r.Flows.AppListeners < 1 {
		t.Errorf("plain: %+v, want no draind and the app's listener from the kernel", r)
	}
	if r := final.pod(ns, "hung"); r == nil || r.Draind == nil || !strings.Contains(r.Error, "no answer in 1s") {
		t.Errorf("hung: %+v, want marked: no answer in 1s", r)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^` + ns + `/hung\s+envoy:15020\s+\?.*no answer in 1s`),
		regexp.MustCompile(`(?m)^` + ns + `/plain\s+-\s+.*no draind: app listeners 1`),
		regexp.MustCompile(`(?m)^` + ns + `/held-by-request\s+envoy:15020\s+gating\s+signal\s.*app-(flows|sockets)`),
		regexp.MustCompile(`(?m)^` + ns + `/ready-1\s+envoy:15020\s+ready\s`),
	} {
		if !want.MatchString(table) {
			t.Errorf("the table has no line matching %s", want)
		}
	}

	// The live view showed held-by-request ready, then draining.
	var phases []string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		l, ok := live.next(time.Until(end))
		if !ok {
			break
		}
		var lv nvView
		if json.Unmarshal([]byte(l), &lv) != nil {
			continue
		}
		if p := lv.pod(ns, "held-by-request").phase(); len(phases) == 0 || phases[len(phases)-1] != p {
			phases = append(phases, p)
		}
		if slices.Contains(phases, "gating") {
			break
		}
	}
	t.Logf("the live view, held-by-request's phases: %v", phases)
	if len(phases) < 2 || phases[0] != "ready" || !slices.Contains(phases, "gating") {
		t.Errorf("the live view showed held-by-request's phases %v, want ready then gating", phases)
	}
	select {
	case a := <-slow:
		t.Errorf("the slow request ended before the checks: %q, %v", a.body, a.err)
	default:
	}
}

// draindPIDOf is the node's PID of draind in pod name's envoy container.
func draindPIDOf(t *testing.T, pod, ns string) int {
	t.Helper()
	for _, p := range podsOf(t, ns, "nv=1") {
		if p.Name != pod {
			continue
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "envoy" {
				_, id, _ := strings.Cut(s.ContainerID, "://")
				return criContainerPID(t, theCluster.Node.Runtime, id)
			}
		}
	}
	t.Fatalf("no envoy container in pod %s", pod)
	return 0
}

// TestClusterNodeDebugRecipe runs docs/node-view.md's `kubectl debug
// node` recipe as written, the node's name and the image substituted,
// and reads the view in the debug pod's log.
func TestClusterNodeDebugRecipe(t *testing.T) {
	requireCluster(t)
	t.Parallel()
	ns := testNamespace(t, "recipe")
	kubectl(t, []byte(nvPod("web", "", false, "")), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "nv=1", 2*time.Minute)

	recipe := recipeBlock(t, readRepo(t, "docs/node-view.md"))
	// Each pod's answer gets 10 s, not the default 1 s: the other tests
	// start pods meanwhile, and a slow row would say "no answer in 1s"
	// where this test asserts "ready".
	if !strings.Contains(recipe, "-- draind pods\n") {
		t.Fatalf("docs/node-view.md's recipe no longer ends in `-- draind pods`:\n%s", recipe)
	}
	recipe = strings.Replace(recipe, "-- draind pods\n", "-- draind pods --timeout 10s\n", 1)
	script := strings.NewReplacer("NODE", theCluster.Config.Node.NodeName, "IMAGE", images.Draind).Replace(recipe)
	t.Logf("the recipe:\n%s", script)
	dir := t.TempDir()
	if err := os.Symlink(theCluster.Kubectl(), filepath.Join(dir, "kubectl")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "KUBECONFIG="+theCluster.KubeConfig())
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl debug:\n%s", out)
	if err != nil {
		t.Fatalf("kubectl debug: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Creating debugging pod (\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no debugging pod named in kubectl debug's output:\n%s", out)
	}
	pod := string(m[1])
	defer theCluster.KubectlCmd(context.Background(), nil, "delete", "pod", pod, "--wait=false")
	var phase string
	waitUntil(t, time.Minute, "the debug pod to finish", func() bool {
		phase = kubectl(t, nil, "get", "pod", pod, "-o", "jsonpath={.status.phase}")
		return phase == "Succeeded" || phase == "Failed"
	})
	logs := kubectl(t, nil, "logs", pod)
	t.Logf("kubectl logs %s (%s):\n%s", pod, phase, logs)
	// Each failure carries the pod's log: a CI excerpt may show only
	// the failure's own lines.
	if phase != "Succeeded" {
		t.Errorf("the debug pod %s; its log:\n%s", phase, logs)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`pods on this node: \d+ \(containerd [^ ]+ at unix:///run/draind-cluster/node/containerd.sock: kubelet pid \d+`),
		regexp.MustCompile(`(?m)^` + ns + `/web\s+envoy:15020\s+ready\s`),
	} {
		if !want.MatchString(logs) {
			t.Errorf("the debug pod's log has no line matching %s; its log:\n%s", want, logs)
		}
	}
}

// recipeBlock is the shell block of docs/node-view.md that follows the
// line "<!-- recipe: kubectl debug -->".
func recipeBlock(t *testing.T, doc string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "<!-- recipe: kubectl debug -->")
	if !ok {
		t.Fatal("docs/node-view.md: no recipe marker")
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/node-view.md: no sh block after the recipe marker")
	}
	return block
}
