package kubelet_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/node"
	"github.com/draind/draind/internal/logevent"
)

// podParams fill a template of testdata/.
type podParams struct {
	Name                  string
	ShareProcessNamespace bool
	Grace                 int
	RestartPolicy         string
	WorkDir               string
	AppImage, DraindImage string
	AppArgs               []string
	DraindCommand         []string
	DraindArgs            []string // owncontainer.yaml: args to the image's entrypoint, when DraindCommand is empty
	PostStart             []string // owncontainer.yaml: the proxy container's postStart exec hook
	DraindEnv             []corev1.EnvVar
	SecurityContext       *corev1.SecurityContext
	NoWait                bool // do not wait for readiness (a container expected not to start)
	NoServer              bool // the app serves nothing (a Job's task): do not wait for it
	// ProxyContainer is the name of draind's container ("": draind) and
	// StatusPort draind's status port (0: statusPort): Istio's injected
	// pods name it istio-proxy, and draind takes 15022 next to pilot-agent.
	ProxyContainer string
	StatusPort     int
	// HostCgroup (classic.yaml) mounts the node's /sys/fs/cgroup there,
	// read-only, in draind's container (--cgroup-root).
	HostCgroup string
}

// proxyName is the name of draind's container.
func (pd *pod) proxyName() string { return cmp.Or(pd.p.ProxyContainer, "draind") }

// statusPort is draind's status port in the pod.
func (pd *pod) statusPort() int { return cmp.Or(pd.p.StatusPort, statusPort) }

// Proxy ports inside every pod (envoysim's config, below).
const (
	inboundPort  = 15006
	statusPort   = 15020
	upstreamPort = 19000 // the host's upstream service, on the bridge's address
)

// nonRootEBPF is the documented securityContext for eBPF mode as a
// non-root user (README, docs/kubernetes.md): uid 1337, no privilege
// escalation, drop ALL, add BPF and PERFMON (into the bounding set, where
// the image's +p file capabilities take them from).
func nonRootEBPF() *corev1.SecurityContext {
	uid, yes, no := int64(1337), true, false
	return &corev1.SecurityContext{
		RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes, AllowPrivilegeEscalation: &no,
		Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"BPF", "PERFMON"}, Drop: []corev1.Capability{"ALL"}},
	}
}

// draindCommand is draind run with the pods' status address and flags,
// supervising envoysim.
func draindCommand(flags []string) []string {
	cmd := append([]string{"/usr/local/bin/draind", "run", "--status-addr", fmt.Sprintf(":%d", statusPort)}, flags...)
	return append(cmd, "--", "/usr/local/bin/envoysim", "-c", "/work/envoysim.json", "--drain-time-s", "45", "--drain-strategy", "immediate")
}

// defaultDraindCommand: a 2 s min-drain (endpoint propagation, shortened).
func defaultDraindCommand(extra ...string) []string {
	return draindCommand(append([]string{"--min-drain", "2s"}, extra...))
}

// pod is one static pod's run: its manifest, and what the CRI and the
// kubelet reported about it, sampled every 25 ms.
type pod struct {
	t      *testing.T
	n      *node.Node
	p      podParams
	full   string // the static pod's name: NAME-NODENAME
	dir    string // hostPath /work
	ip     string
	client *http.Client

	mu         sync.Mutex
	containers map[string]*ctrRecord // by container id
	removedAt  time.Time
	stop       chan struct{}
	done       chan struct{}
}

type ctrRecord struct {
	id, name    string
	attempt     uint32
	state       runtimeapi.ContainerState
	started     time.Time
	finished    time.Time
	exitCode    int32
	reason, msg string
	logPath     string
	log         []byte // the container's log, read when it exited (the kubelet deletes it with the pod)
}

// startPod writes the manifest and waits until draind reports ready.
func startPod(t *testing.T, tmpl string, p podParams) *pod {
	t.Helper()
	n := requireNode(t)
	cfg := n.Config()
	if p.Grace == 0 {
		p.Grace = 30
	}
	if p.RestartPolicy == "" {
		p.RestartPolicy = "Always"
	}
	if p.AppImage == "" {
		p.AppImage = imgApp
	}
	if p.DraindImage == "" {
		p.DraindImage = imgDraind
	}
	if p.DraindCommand == nil {
		p.DraindCommand = defaultDraindCommand()
	}
	if p.SecurityContext == nil {
		p.SecurityContext = nonRootEBPF()
	}
	p.WorkDir = filepath.Join(cfg.StateDir, "pods", p.Name)
	if err := os.MkdirAll(p.WorkDir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p.WorkDir, 0o777)
	writeEnvoysimConfig(t, p.WorkDir, cfg.Gateway)
	return runPod(t, p, renderPod(t, tmpl, p))
}

// runPod writes a rendered manifest as a static pod and waits until draind
// reports ready and the app answers through the proxy (unless p says not
// to wait).
func runPod(t *testing.T, p podParams, manifest []byte) *pod {
	t.Helper()
	n := requireNode(t)
	cfg := n.Config()
	pd := &pod{t: t, n: n, p: p, full: p.Name + "-" + cfg.NodeName, dir: p.WorkDir,
		containers: map[string]*ctrRecord{}, stop: make(chan struct{}), done: make(chan struct{})}
	manifestPath := filepath.Join(cfg.StateDir, "manifests", p.Name+".yaml")
	started := time.Now()
	if err := os.WriteFile(manifestPath, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pd.remove()
		pd.waitContainersExited(45 * time.Second)
		close(pd.stop)
		<-pd.done
		report.add("pod", p.Name+" whole run", fmt.Sprintf("%s (manifest written → every container exited)", fmtDur(time.Since(started))))
		if t.Failed() || os.Getenv("DRAIND_E2E_LOGS") == "1" {
			pd.dumpLogs()
		}
	})
	go pd.watch()
	// The sandbox's address, then draind's readiness, seen from the host.
	// Scaled: under emulation (make e2e-kubelet-vm) the kubelet took more
	// than 60 s to start pilot-agent's containers.
	startBound := scaled(60 * time.Second)
	deadline := time.Now().Add(startBound)
	for pd.ip == "" {
		pd.ip = pd.sandboxIP()
		if time.Now().After(deadline) {
			pd.dumpLogs()
			t.Fatalf("pod %s: no sandbox address after %v", p.Name, startBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// No keep-alive: an idle connection of ours would hold Envoy's drain.
	pd.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if p.NoWait {
		return pd
	}
	// /metrics answers once draind's trackers are open, which may come a
	// few tens of milliseconds after the first ready 200.
	for pd.get(pd.statusPort(), "/healthz/ready") != 200 || pd.get(pd.statusPort(), "/metrics") != 200 {
		if time.Now().After(deadline) {
			pd.dumpLogs()
			t.Fatalf("pod %s: draind not ready after %v", p.Name, startBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The app answers through the proxy (a native sidecar's app starts
	// only after the sidecar is up).
	for !p.NoServer && pd.get(inboundPort, "/") != 200 {
		if time.Now().After(deadline) {
			pd.dumpLogs()
			t.Fatalf("pod %s: the app does not answer through the proxy after %v", p.Name, startBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	report.add("pod", p.Name+" start→ready", time.Since(started).Round(time.Millisecond).String())
	return pd
}

func renderPod(t *testing.T, tmpl string, p podParams) []byte {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", tmpl))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := template.New(tmpl).Funcs(template.FuncMap{"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	}}).Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tp.Execute(&buf, p); err != nil {
		t.Fatal(err)
	}
	// What the kubelet will read must be a valid Pod, field by field.
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(buf.Bytes(), &pod); err != nil {
		t.Fatalf("%s: %v\n%s", tmpl, err, buf.String())
	}
	return buf.Bytes()
}

// writeEnvoysimConfig: inbound 15006 → the app, outbound 127.0.0.1:15001
// → the host's upstream service on the bridge address.
func writeEnvoysimConfig(t *testing.T, dir, gateway string) {
	cfg := map[string]any{
		"admin_address":  "127.0.0.1:15000",
		"drain_time_s":   45,
		"drain_strategy": "immediate",
		"listeners": []map[string]any{
			{"name": "inbound", "address": fmt.Sprintf("0.0.0.0:%d", inboundPort), "direction": "inbound", "protocol": "http", "upstream": "127.0.0.1:8080"},
			{"name": "outbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": fmt.Sprintf("%s:%d", gateway, upstreamPort)},
		},
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "envoysim.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (pd *pod) get(port int, path string) int {
	code, _ := pd.getBody(port, path)
	return code
}

func (pd *pod) getBody(port int, path string) (int, string) {
	resp, err := pd.client.Get(fmt.Sprintf("http://%s%s", net.JoinHostPort(pd.ip, strconv.Itoa(port)), path))
	if err != nil {
		return 0, ""
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// remove deletes the manifest: the kubelet terminates the pod.
func (pd *pod) remove() {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if !pd.removedAt.IsZero() {
		return
	}
	os.Remove(filepath.Join(pd.n.Config().StateDir, "manifests", pd.p.Name+".yaml"))
	pd.removedAt = time.Now()
}

func (pd *pod) sandboxIP() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sbs, err := pd.n.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.name": pd.full},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil || len(sbs.Items) == 0 {
		return ""
	}
	st, err := pd.n.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sbs.Items[0].Id})
	if err != nil {
		return ""
	}
	return st.GetStatus().GetNetwork().GetIp()
}

// watch samples the containers through the CRI until stopped.
func (pd *pod) watch() {
	defer close(pd.done)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-pd.stop:
			return
		case <-tick.C:
		}
		pd.sampleContainers()
	}
}

func (pd *pod) sampleContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cs, err := pd.n.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.name": pd.full},
	}})
	if err != nil {
		return
	}
	for _, c := range cs.Containers {
		st, err := pd.n.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil || st.Status == nil {
			continue
		}
		s := st.Status
		rec := &ctrRecord{id: c.Id, name: s.GetMetadata().GetName(), attempt: s.GetMetadata().GetAttempt(), state: s.State,
			exitCode: s.ExitCode, reason: s.Reason, msg: s.Message, logPath: s.LogPath}
		if s.StartedAt > 0 {
			rec.started = time.Unix(0, s.StartedAt)
		}
		if s.FinishedAt > 0 {
			rec.finished = time.Unix(0, s.FinishedAt)
		}
		pd.mu.Lock()
		if old := pd.containers[c.Id]; old != nil && old.log != nil {
			rec.log = old.log
		}
		pd.mu.Unlock()
		if rec.state == runtimeapi.ContainerState_CONTAINER_EXITED && rec.log == nil {
			rec.log, _ = os.ReadFile(rec.logPath)
		}
		pd.mu.Lock()
		pd.containers[c.Id] = rec
		pd.mu.Unlock()
	}
}

// container returns the latest attempt of the named container.
func (pd *pod) container(name string) *ctrRecord {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	var best *ctrRecord
	for _, c := range pd.containers {
		if c.name == name && (best == nil || c.attempt > best.attempt) {
			cp := *c
			best = &cp
		}
	}
	return best
}

// attempts returns every attempt of the named container, oldest first.
func (pd *pod) attempts(name string) []ctrRecord {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	var out []ctrRecord
	for _, c := range pd.containers {
		if c.name == name {
			out = append(out, *c)
		}
	}
	slices.SortFunc(out, func(a, b ctrRecord) int { return int(a.attempt) - int(b.attempt) })
	return out
}

// waitContainersExited waits until every container seen has exited.
func (pd *pod) waitContainersExited(d time.Duration) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		pd.mu.Lock()
		running := len(pd.containers) == 0
		for _, c := range pd.containers {
			if c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
				running = true
			}
		}
		pd.mu.Unlock()
		if !running {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// readinessAfter is what the kubelet's readiness probe of draind returned
// from since on, read from the kubelet's log (--v=3 logs every probe
// result): the first result, and the counts.
func (pd *pod) readinessAfter(since time.Time) (first string, ok, failed int) {
	first = "none"
	for _, pr := range readProbeLog(filepath.Join(pd.n.Config().StateDir, "kubelet.log"), pd.full, pd.proxyName()) {
		if pr.at.Before(since) {
			continue
		}
		if first == "none" {
			first = fmt.Sprintf("%s %s later", pr.result, fmtDur(pr.at.Sub(since)))
		}
		if pr.result == "success" {
			ok++
		} else {
			failed++
		}
	}
	return first, ok, failed
}

// killMsg is the kubelet's log line right before StopContainer (containerd
// sends SIGTERM at once); for a native sidecar it comes after the regular
// containers have exited.
const killMsg = "Killing container with a grace period"

var kubeletLine = regexp.MustCompile(`^[IWE](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) +\d+ [^ ]+\] "([^"]*)" .*?pod="[^/]*/([^"]*)"(?:.*? containerName="([^"]*)")?`)

// kubeletEvent is one of the kubelet's log lines about the pod.
type kubeletEvent struct {
	at             time.Time
	msg, container string
}

type kubeletEvents []kubeletEvent

// kubeletEvents reads the kubelet's log (--v=3) for this pod's lines.
func (pd *pod) kubeletEvents() kubeletEvents {
	b, _ := os.ReadFile(filepath.Join(pd.n.Config().StateDir, "kubelet.log"))
	var out kubeletEvents
	for line := range strings.SplitSeq(string(b), "\n") {
		if m := kubeletLine.FindStringSubmatch(line); m != nil && m[3] == pd.full {
			out = append(out, kubeletEvent{at: klogTime(m[1]), msg: m[2], container: m[4]})
		}
	}
	return out
}

// first is when the kubelet first logged msg about the container.
func (ev kubeletEvents) first(msg, container string) time.Time {
	for _, e := range ev {
		if e.msg == msg && e.container == container {
			return e.at
		}
	}
	return time.Time{}
}

func klogTime(s string) time.Time {
	at, _ := time.Parse("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s", time.Now().UTC().Year(), s))
	return at
}

type probeResult struct {
	at     time.Time
	result string // success or failure
}

var probeLogLine = regexp.MustCompile(`^[IW](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) .*"Probe (succeeded|failed)" probeType="Readiness" pod="[^/]*/([^"]*)".*containerName="([^"]*)"`)

// readProbeLog parses the kubelet's klog lines for readiness results.
func readProbeLog(path, podName, container string) []probeResult {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []probeResult
	for line := range strings.SplitSeq(string(b), "\n") {
		m := probeLogLine.FindStringSubmatch(line)
		if m == nil || m[3] != podName || m[4] != container {
			continue
		}
		at := klogTime(m[1])
		res := "success"
		if m[2] == "failed" {
			res = "failure"
		}
		out = append(out, probeResult{at: at, result: res})
	}
	return out
}

// draindLog returns draind's JSON log records (latest attempt unless
// attempt >= 0), read from the container log the kubelet keeps.
func (pd *pod) draindLog(attempt int) []map[string]any {
	var rec *ctrRecord
	for _, a := range pd.attempts(pd.proxyName()) {
		if attempt < 0 || int(a.attempt) == attempt {
			a := a
			rec = &a
		}
	}
	if rec == nil {
		return nil
	}
	b := rec.log
	if b == nil {
		b, _ = os.ReadFile(rec.logPath)
	}
	return parseJSONLog(b)
}

// parseJSONLog parses a CRI log ("TIME STREAM TAG MESSAGE" lines) whose
// messages are JSON objects.
func parseJSONLog(b []byte) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, " ", 4)
		if len(parts) < 4 {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(parts[3]), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// findLog is the first record logged as ev (its logevent.Key field).
func findLog(recs []map[string]any, ev logevent.Event) map[string]any {
	for _, r := range recs {
		if r[logevent.Key] == string(ev) {
			return r
		}
	}
	return nil
}

// findLogWith is the first record logged as ev whose field key is value.
func findLogWith(recs []map[string]any, ev logevent.Event, key, value string) map[string]any {
	for _, r := range recs {
		if r[logevent.Key] == string(ev) && fmt.Sprint(r[key]) == value {
			return r
		}
	}
	return nil
}

func logTime(r map[string]any) time.Time {
	s, _ := r["ts"].(string)
	ts, _ := time.Parse("2006-01-02T15:04:05.000Z0700", s)
	return ts
}

// appCalls reads the app's result file: its calls numbered below split
// (made during its shutdown, or a Job's), and the rest (tail calls).
func (pd *pod) appCalls(split int) (during, tail callCount, fails []string) {
	b, _ := os.ReadFile(filepath.Join(pd.dir, "app.result"))
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != "ok" && f[0] != "fail") {
			continue
		}
		c := &during
		if n, _ := strconv.Atoi(f[1]); n >= split {
			c = &tail
		}
		if f[0] == "ok" {
			c.ok++
		} else {
			c.fail++
			fails = append(fails, line)
		}
	}
	return during, tail, fails
}

func (pd *pod) dumpLogs() {
	pd.mu.Lock()
	recs := make([]ctrRecord, 0, len(pd.containers))
	for _, c := range pd.containers {
		recs = append(recs, *c)
	}
	pd.mu.Unlock()
	proxySeen := false
	for _, c := range recs {
		b := c.log
		if b == nil {
			b, _ = os.ReadFile(c.logPath)
		}
		pd.t.Logf("container %s (attempt %d, %s, exit %d %s %s) log:\n%s", c.name, c.attempt, c.state, c.exitCode, c.reason, c.msg, b)
		proxySeen = proxySeen || c.name == pd.proxyName()
	}
	if !proxySeen {
		pd.t.Logf("no %s container; the kubelet's last errors:\n%s", pd.proxyName(), tailErrors(filepath.Join(pd.n.Config().StateDir, "kubelet.log"), 20))
	}
}

// tailErrors is the last n error lines (klog's E prefix) of the log at path.
func tailErrors(path string, n int) string {
	b, _ := os.ReadFile(path)
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "E") {
			errs = append(errs, l)
		}
	}
	return strings.Join(errs[max(0, len(errs)-n):], "\n")
}

// upstream is the service the app calls through the proxy, on the host.
func startUpstream(t *testing.T, gateway string) {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", gateway, upstreamPort))
	if err != nil {
		t.Fatalf("upstream: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong\n") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func fmtDur(d time.Duration) string { return d.Round(time.Millisecond).String() }

var _ = fmt.Sprint
