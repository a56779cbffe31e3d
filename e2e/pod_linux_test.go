package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/cli"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/envoysim"
	"github.com/draind/draind/internal/testenv/testapp"
	"github.com/draind/draind/internal/testenv/testutil"
)

// The test binary doubles as every process of a pod: draind, envoysim (the
// proxy) and the app. os.Args[1] picks the role.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		if role, ok := faultRoles[os.Args[1]]; ok { // reliability_linux_test.go
			os.Exit(role(os.Args[2:]))
		}
		switch os.Args[1] {
		case "__draind":
			os.Exit(cli.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
		case "__envoysim":
			os.Exit(envoysimRole(os.Args[2:]))
		case "__app":
			os.Exit(appRole(os.Args[2:]))
		case "__container":
			os.Exit(containerInit(os.Args[2:]))
		case "__pause":
			os.Exit(pauseRole())
		case "__probe":
			os.Exit(probeRole())
		case "__stuckproxy":
			os.Exit(stuckProxyRole(os.Args[2:]))
		case "__proxyas":
			os.Exit(proxyAsRole(os.Args[2:]))
		}
	}
	code := m.Run()
	testutil.RemoveSelfCopy()
	os.Exit(code)
}

// envoysimRole runs envoysim. draind starts it as uid 1337
// (--run-proxy-as), as Envoy's container would run: its sockets are then
// the proxy's. (Dropping privileges in the child itself would clear the
// parent-death signal, and a killed draind would leave it behind.)
func envoysimRole(args []string) int {
	return envoysim.Main(context.Background(), args, os.Stdout, os.Stderr)
}

// appRole is the pod's application: an HTTP server (testapp's /slow?ms=N,
// /stream?n=N&ms=M and /; /big?mib=N, /burst?n=N) that, on SIGTERM, does
// what --on-term says:
//
//	exit      exit at once
//	ignore    keep running (the kubelet will SIGKILL it)
//	graceful  serve on for --linger, close the listener, finish in-flight requests, make
//	          outbound calls for --outbound-for (or --outbound-count of
//	          them), --outbound-pause apart, then exit
//
// With --hold-outbound HOST:PORT it first makes one HTTP/1.1 call to that
// address on a keep-alive connection it then holds open until it exits.
//
// It appends "ok N", "fail N" and "exit UNIXNANO" lines to --result.
func appRole(args []string) int {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	listen := fs.String("listen", "0.0.0.0:8080", "")
	onTerm := fs.String("on-term", "exit", "")
	outFor := fs.Duration("outbound-for", 0, "")
	outCount := fs.Int("outbound-count", 0, "")
	outPause := fs.Duration("outbound-pause", 500*time.Millisecond, "")
	outURL := fs.String("outbound-url", "http://127.0.0.1:15001/ping", "")
	result := fs.String("result", "", "")
	linger := fs.Duration("linger", 0, "")
	runFor := fs.Duration("run-for", 0, "")
	exitCode := fs.Int("exit-code", 0, "")
	holdOut := fs.String("hold-outbound", "", "")
	probeListen := fs.String("probe-listen", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *probeListen != "" {
		// A health port of its own, as many apps have for the kubelet's
		// probes: it lives as long as the app.
		pln, err := net.Listen("tcp", *probeListen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			return 1
		}
		go http.Serve(pln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	}
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM)
	if *onTerm == "ignore" {
		signal.Ignore(syscall.SIGTERM)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		return 1
	}
	mux := http.NewServeMux()
	testapp.Handle(mux) // /, /slow, /inflight, /stream: the kubelet's test app serves them too
	// /big?mib=N answers N MiB, as fast as the reader takes them.
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		w.Header().Set("Content-Length", strconv.Itoa(n<<20))
		chunk := make([]byte, 1<<20)
		for range n {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	// /burst?n=N runs N short-lived processes at once: a fork storm.
	mux.HandleFunc("/burst", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { exec.Command("/bin/true").Run() })
		}
		wg.Wait()
		fmt.Fprintf(w, "ran %d\n", n)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	if *holdOut != "" {
		held, err := holdOutbound(*holdOut)
		if err != nil {
			fmt.Fprintln(os.Stderr, "app: hold outbound:", err)
			return 1
		}
		defer held.Close()
	}
	fmt.Println("app ready")
	record := func(line string) {
		if *result == "" {
			return
		}
		f, err := os.OpenFile(*result, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o666)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	if *runFor > 0 { // a Job: its work takes runFor, then it exits
		select {
		case <-sigc:
		case <-time.After(*runFor):
		}
		record(fmt.Sprintf("exit %d", time.Now().UnixNano()))
		return *exitCode
	}
	<-sigc
	if *onTerm == "exit" {
		record(fmt.Sprintf("exit %d", time.Now().UnixNano()))
		return 0
	}
	time.Sleep(*linger) // still serving, as endpoints propagate
	var wg sync.WaitGroup
	wg.Go(func() { srv.Shutdown(context.Background()) })
	wg.Go(func() {
		// One connection per call, asking for keep-alive: a response with
		// Connection: close is then Envoy's drain speaking.
		tr := &http.Transport{}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: tr}
		end := time.Now().Add(*outFor)
		more := func(i int) bool {
			if *outCount > 0 {
				return i < *outCount
			}
			return time.Now().Before(end)
		}
		for i := 0; more(i); i++ {
			resp, err := hc.Get(*outURL)
			if err == nil && resp.StatusCode == 200 {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				tr.CloseIdleConnections()
				line := fmt.Sprintf("ok %d", i)
				if resp.Close {
					line += " close" // told to hang up: a drained listener
				}
				if resp.Header.Get("Server") == "envoy" {
					line += " via-envoy" // the upstream itself names no server
				}
				record(line)
			} else {
				if err == nil {
					err = fmt.Errorf("status %d", resp.StatusCode)
					resp.Body.Close()
				}
				record(fmt.Sprintf("fail %d %v", i, err))
			}
			time.Sleep(*outPause)
		}
	})
	wg.Wait()
	record(fmt.Sprintf("exit %d", time.Now().UnixNano()))
	return 0
}

// pod is a pod's network namespace (192.0.2.1) with a "remote" namespace
// (192.0.2.2) holding the clients and the upstream service.
type pod struct {
	t        testing.TB
	ns       *testutil.NetNS
	remote   *testutil.NetNS
	dir      string
	bin      string
	client   *http.Client
	upstream net.Listener

	// The containers: pause, draind (with the proxy), the app. Each is PID
	// 1 of its own PID namespace (container_linux_test.go).
	pause      *container
	draind     *container
	draindArgs []string // what startDraind was given, for a restart
	// envoyStartupDelay is how long envoysim takes to go LIVE.
	envoyStartupDelay time.Duration
	// proxyCommand, when set, replaces envoysim as the proxy.
	proxyCommand []string
	// hostNetwork puts the containers started from now on in the test's
	// own network namespace, the host's (a hostNetwork pod).
	hostNetwork bool
	envoyArgs   []string
	draindLog   *syncBuffer
	drainedAt   time.Time
	app         *container
	appOut      *syncBuffer
	appResult   string

	// draindUnderInit runs draind as the child of a small init (role
	// __init, reliability_linux_test.go) in its container, not as its PID 1.
	draindUnderInit bool
	// draindWrapper, when set, is the proxy container's entrypoint before
	// draind (an init wrapper: tini, dumb-init), as its PID 1.
	draindWrapper []string
	// sharePID: the containers started after pause share its PID
	// namespace (shareProcessNamespace: true).
	sharePID bool

	// cgroup, when set (newPod's inPodCgroup), is the pod's cgroup v2
	// cgroup under cgroupRoot (a cgroup2 mount of the whole hierarchy):
	// each container starts in a child of it (container_linux_test.go).
	// The test, standing for the runtime's shim, stays outside it.
	cgroup     *testutil.Cgroup
	cgroupRoot string
	// cgroupNS: each container gets a cgroup namespace rooted at its own
	// cgroup (runc's default on a cgroup v2 node): its /proc/self/cgroup
	// reads "0::/".
	cgroupNS bool
	// containers counts the containers started, for unique cgroup names.
	containers int
	// env is added to every container's environment (the downward API's
	// variables).
	env []string
}

// podOption shapes a pod before its sandbox (pause) starts.
type podOption func(*pod)

// inPodCgroup puts the pod in a cgroup v2 pod cgroup of its own, each
// container in a child cgroup of it, as the kubelet and a real runtime do.
func inPodCgroup(p *pod) {
	p.t.Helper()
	p.cgroupRoot = testutil.Cgroup2Root(p.t)
	cg := testutil.NewCgroup(p.t, p.cgroupRoot, filepath.Base(p.dir))
	p.cgroup = &cg
}

// cgroupNamespaces gives each container of a pod in a pod cgroup its own
// cgroup namespace.
func cgroupNamespaces(p *pod) {
	inPodCgroup(p)
	p.cgroupNS = true
}

const (
	podIP    = "192.0.2.1"
	remoteIP = "192.0.2.2"
)

func newPod(t testing.TB, opts ...podOption) *pod {
	t.Helper()
	testutil.RequireRoot(t)
	// Not t.TempDir: its parent is private to root, and the proxy and the
	// app run under other uids.
	dir, err := os.MkdirTemp("", "draind-pod-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &pod{t: t, ns: testutil.NewNetNS(t), remote: testutil.NewNetNS(t), dir: dir, bin: testutil.SelfCopy(t)}
	testutil.Link(t, p.ns, p.remote, podIP+"/24", remoteIP+"/24")
	p.client = &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 30 * time.Second}
	t.Cleanup(p.client.CloseIdleConnections)
	// The upstream service the app calls through Envoy's outbound listener.
	p.upstream = p.remote.Listen(t, "tcp4", remoteIP+":9000")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong\n") })}
	go srv.Serve(p.upstream)
	t.Cleanup(func() { srv.Close() })
	for _, o := range opts {
		o(p)
	}
	// The sandbox comes first, as the runtime starts it.
	p.pause = p.runContainer("pause", -1, testWriter{t}, "__pause")
	return p
}

// envoyConfig writes envoysim's config: an inbound HTTP listener on 15006
// to the app, an outbound one on 15001 to the upstream.
func (p *pod) envoyConfig(startupDelay time.Duration) string {
	cfg := map[string]any{
		"admin_address":    "127.0.0.1:15000",
		"drain_time_s":     45,
		"drain_strategy":   "immediate",
		"startup_delay_ms": startupDelay.Milliseconds(),
		"listeners": []map[string]any{
			{"name": "inbound", "address": "0.0.0.0:15006", "direction": "inbound", "protocol": "http", "upstream": "127.0.0.1:8080"},
			{"name": "outbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": remoteIP + ":9000"},
		},
	}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(p.dir, "envoy.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// startApp starts the app's container: the app as its PID 1, uid 1000.
func (p *pod) startApp(args ...string) {
	p.t.Helper()
	p.appResult = filepath.Join(p.dir, "app.result")
	p.appOut = &syncBuffer{}
	p.app = p.runContainer("app", 1000, io.MultiWriter(p.appOut, testWriter{p.t}), "__app", append([]string{"--result", p.appResult}, args...)...)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.appOut.String(), "app ready\n") {
		select {
		case <-p.app.done:
			p.t.Fatalf("app exited %d before it was ready: %s", p.app.code, p.appOut.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("app not ready: %q", p.appOut.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startDraind starts the proxy's container: draind as its PID 1 (root),
// supervising envoysim as uid 1337, and waits until the pod is ready.
func (p *pod) startDraind(draindArgs []string, envoyArgs ...string) {
	p.t.Helper()
	p.startDraindNoWait(draindArgs, envoyArgs...)
	p.waitReady(20 * time.Second)
}

func (p *pod) startDraindNoWait(draindArgs []string, envoyArgs ...string) {
	p.t.Helper()
	p.draindArgs, p.envoyArgs = draindArgs, envoyArgs
	args := append([]string{"run", "--status-addr", "0.0.0.0:15020", "--log-format", "json", "--run-proxy-as", "1337"}, draindArgs...)
	proxy := p.proxyCommand
	if proxy == nil {
		proxy = []string{p.bin, "__envoysim", "-c", p.envoyConfig(p.envoyStartupDelay)}
	}
	args = append(append(append(args, "--"), proxy...), envoyArgs...)
	p.draindLog = &syncBuffer{}
	role := "__draind"
	switch {
	case p.draindUnderInit:
		role, args = "__init", append([]string{"__draind"}, args...)
	case p.draindWrapper != nil:
		role, args = p.draindWrapper[0], append(append(slices.Clone(p.draindWrapper[1:]), p.bin, "__draind"), args...)
	}
	p.draind = p.runContainer("draind", -1, io.MultiWriter(p.draindLog, testWriter{p.t}), role, args...)
}

// restartDraind kills the proxy's container (as an OOM kill or a crash
// would) and starts it again with the same arguments, while the app runs:
// the kubelet restarting a sidecar.
func (p *pod) restartDraind() {
	p.t.Helper()
	p.draind.Kill()
	if !p.draind.wait(10 * time.Second) {
		p.t.Fatal("the proxy's container did not die")
	}
	p.startDraind(p.draindArgs, p.envoyArgs...)
}

func (p *pod) readyStatus() int { return p.status("/healthz/ready") }

func (p *pod) status(path string) int {
	resp, err := p.client.Get("http://" + podIP + ":15020" + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitReady waits for readiness, then for draind's start-up to end (its
// /metrics answers once the trackers are open, which may come a few tens
// of milliseconds after the first 200): the tests read what they opened.
func (p *pod) waitReady(d time.Duration) {
	p.t.Helper()
	end := time.Now().Add(d)
	for p.readyStatus() != 200 || p.status("/metrics") != 200 {
		select {
		case <-p.draind.done:
			p.t.Fatalf("draind exited %d before the pod was ready; log:\n%s", p.draind.code, p.draindLog.String())
		default:
		}
		if time.Now().After(end) {
			p.t.Fatalf("pod not ready after %s; draind log:\n%s", d, p.draindLog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// terminate sends SIGTERM to draind and the app together, as the kubelet
// does to a pod's containers.
func (p *pod) terminate() {
	p.drainedAt = time.Now()
	if p.app != nil {
		p.app.Signal(syscall.SIGTERM)
	}
	p.draind.Signal(syscall.SIGTERM)
}

// waitExit waits for draind's exit code and how long after SIGTERM.
// exitsBeforeSidecarTurn: a native sidecar's draind, the app gone, stops
// on its own, without the SIGTERM the kubelet sends once every app
// container exited (its turn came 0.03–0.7 s after the app's exit in make
// bench-rollout). It fails the test if draind waits for that SIGTERM.
func (p *pod) exitsBeforeSidecarTurn() (int, time.Duration) {
	p.t.Helper()
	select {
	case <-p.draind.done:
		if n := len(p.logLines(logevent.AppGoneEndsAwait)); n != 1 {
			p.t.Errorf("%d app_gone_ends_await lines, want 1; log:\n%s", n, p.draindLog.String())
		}
		return p.draind.code, time.Since(p.drainedAt)
	case <-time.After(10 * time.Second):
		p.draind.Signal(syscall.SIGTERM)
		p.t.Fatalf("draind still running 10 s after the app's exit, waiting for the sidecar's SIGTERM; log:\n%s", p.draindLog.String())
	}
	return 0, 0
}

func (p *pod) waitExit(d time.Duration) (int, time.Duration) {
	p.t.Helper()
	select {
	case <-p.draind.done:
		return p.draind.code, time.Since(p.drainedAt)
	case <-time.After(d):
		p.t.Fatalf("draind still running %s after SIGTERM; log:\n%s", d, p.draindLog.String())
	}
	return 0, 0
}

// logLines returns draind's JSON log lines logged as ev (their
// logevent.Key field, not their wording).
func (p *pod) logLines(ev logevent.Event) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(p.draindLog.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m[logevent.Key] == string(ev) {
			out = append(out, m)
		}
	}
	return out
}

// gateHeldBy reports whether draind logged the gate held by kind.
func (p *pod) gateHeldBy(kind drain.HoldKind) bool {
	for _, l := range p.logLines(logevent.GateHolds) {
		kinds, _ := l["hold_kinds"].([]any)
		if slices.Contains(kinds, any(kind.String())) {
			return true
		}
	}
	return false
}

// logTime is when draind logged line (the log has milliseconds).
func logTime(line map[string]any) time.Time {
	s, _ := line["ts"].(string)
	ts, _ := time.Parse("2006-01-02T15:04:05.000Z0700", s)
	return ts
}

// stopFollowsWithin bounds, in these tests, the time from what ends a
// drain (the app's exit, the last busy flow's close, min-drain's end) to
// draind's /quitquitquit. It is no latency target: tools/bench/exit.sh
// measures that (p99 a few ms). It only tells a stop the gate opened on
// its cause from one that waited for something else (the deadline, a
// poll), and stays far above what a shared machine's scheduling adds: CI
// once saw 54 ms where this machine gives 1-7 ms.
const stopFollowsWithin = 2 * time.Second

// inFlightWithin bounds how long a request takes to reach the app, or a
// stream's first chunk to come back: a failure past it, far above what a
// loaded machine adds, not a figure.
const inFlightWithin = 20 * time.Second

// inFlight sends GET url (the app's /slow) with c and returns once the
// app says the request waits in its handler (testapp.InFlight): what a
// test that terminates "with a request in flight" needs to know, not
// guess with a sleep. It fails the test if that does not come.
func inFlight(t testing.TB, c *http.Client, url string) <-chan testapp.Reply {
	t.Helper()
	reply, err := testapp.InFlight(t.Context(), c, url, inFlightWithin)
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

// streamInFlight sends GET url (the app's /stream) with c and returns once
// the response's headers, flushed with the first chunk, have come back:
// the stream is then in flight. The reply comes once its body was read.
func streamInFlight(t testing.TB, c *http.Client, url string) <-chan testapp.Reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	done := make(chan testapp.Reply, 1)
	go func() {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- testapp.Reply{Code: resp.StatusCode, Close: resp.Close, Header: resp.Header, Body: string(b), Trailer: resp.Trailer, Err: err, At: time.Now()}
	}()
	return done
}

// slowPath is the app's /slow for d.
func slowPath(d time.Duration) string {
	return fmt.Sprintf("/slow?ms=%d", d.Milliseconds())
}

// phaseTime is when draind logged entering phase.
func (p *pod) phaseTime(phase string) time.Time {
	for _, m := range p.logLines(logevent.Phase) {
		if m["phase"] != phase {
			continue
		}
		// The log's timestamps have milliseconds; the stop carries its
		// own in nanoseconds.
		if ns, ok := m["quit_sent_unix_ns"].(float64); ok {
			return time.Unix(0, int64(ns))
		}
		return logTime(m)
	}
	return time.Time{}
}

// appResults reads the app's result file.
func (p *pod) appResults() (ok, fail int, exitAt time.Time) {
	ok, _, fail, exitAt = p.appCalls()
	return ok, fail, exitAt
}

// appCalls reads the app's result file: its outbound calls that succeeded
// (closed: those answered with Connection: close), failed, and its exit.
func (p *pod) appCalls() (ok, closed, fail int, exitAt time.Time) {
	b, _ := os.ReadFile(p.appResult)
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "ok":
			ok++
			if slices.Contains(f[2:], "close") {
				closed++
			}
		case "fail":
			fail++
			p.t.Logf("app outbound call failed: %s", line)
		case "exit":
			n, _ := strconv.ParseInt(f[1], 10, 64)
			exitAt = time.Unix(0, n)
		}
	}
	return ok, closed, fail, exitAt
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testWriter logs draind's output under the test when -v is on.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("draind: %s", strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// ---- the acceptance tests ----

// waitLog waits for draind to log a line as ev whose fields all equal
// those given, and returns it.
func (p *pod) waitLog(d time.Duration, ev logevent.Event, fields map[string]any) map[string]any {
	p.t.Helper()
	end := time.Now().Add(d)
	for {
	lines:
		for _, l := range p.logLines(ev) {
			for k, v := range fields {
				if fmt.Sprint(l[k]) != fmt.Sprint(v) {
					continue lines
				}
			}
			return l
		}
		if time.Now().After(end) {
			p.t.Fatalf("no %s line with %v after %s; log:\n%s", ev, fields, d, p.draindLog.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// wantSources fails the test unless draind's log says the tracker and the
// app-liveness source are the ones given ("" for either: not checked):
// a test of eBPF mode must fail when draind silently fell back.
func (p *pod) wantSources(tracker, liveness string) {
	p.t.Helper()
	if tracker != "" {
		p.waitLog(5*time.Second, logevent.Tracker, map[string]any{"mode": tracker})
	}
	if liveness != "" {
		p.waitLog(5*time.Second, logevent.AppLiveness, map[string]any{"source": liveness})
	}
}

// waitLiveWork waits until draind's admin calls at Envoy's LIVE are
// done: the listeners' discovery, then the gauge check, after which
// draind_envoy_listener_gauges leaves "unknown". What is counted after it
// is the probes' own. A check that timed out stays unknown until the drain
// asks again: then the wait gives up after 5 s, failing nothing.
func (p *pod) waitLiveWork() {
	p.t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if p.metric(fmt.Sprintf("draind_envoy_listener_gauges{state=%q}", drain.GaugesUnknown)) == 0 {
			return
		}
	}
	p.t.Logf("the gauge check at LIVE did not answer within 5 s (a loaded machine): the drain asks again")
}

// metric reads one sample of draind's /metrics (name with its labels, as
// exposed), or fails.
func (p *pod) metric(series string) float64 {
	p.t.Helper()
	resp, err := p.client.Get("http://" + podIP + ":15020/metrics")
	if err != nil {
		p.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				p.t.Fatalf("metric %s: %q", series, v)
			}
			return f
		}
	}
	p.t.Fatalf("no %s in /metrics:\n%s", series, b)
	return 0
}

// stuckProxyRole is a proxy that is stuck every way it can be: its admin
// API (127.0.0.1:15000) accepts connections and never answers, and it
// ignores SIGTERM. Only SIGKILL ends it.
func stuckProxyRole(args []string) int {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	ln, err := net.Listen("tcp", "127.0.0.1:15000")
	if err != nil {
		fmt.Fprintln(os.Stderr, "stuck proxy:", err)
		return 1
	}
	var held []net.Conn
	for {
		c, err := ln.Accept()
		if err != nil {
			runtime.KeepAlive(held) // reachable until here: a collected conn's finalizer would close it
			return 1
		}
		held = append(held, c) // never read, never answered
	}
}
