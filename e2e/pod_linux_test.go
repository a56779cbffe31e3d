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
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/cli"
	"github.com/draind/draind/internal/envoy/envoysim"
	"github.com/draind/draind/internal/testutil"
)

// The test binary doubles as every process of a pod: draind, envoysim (the
// proxy) and the app. os.Args[1] picks the role.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
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

// appRole is the pod's application: an HTTP server (/slow?ms=N, /) that,
// on SIGTERM, does what --on-term says:
//
//	exit      exit at once
//	ignore    keep running (the kubelet will SIGKILL it)
//	graceful  close the listener, finish in-flight requests, make
//	          outbound calls for --outbound-for, then exit
//
// It appends "ok N", "fail N" and "exit UNIXNANO" lines to --result.
func appRole(args []string) int {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	listen := fs.String("listen", "0.0.0.0:8080", "")
	onTerm := fs.String("on-term", "exit", "")
	outFor := fs.Duration("outbound-for", 0, "")
	outPause := fs.Duration("outbound-pause", 500*time.Millisecond, "")
	outURL := fs.String("outbound-url", "http://127.0.0.1:15001/ping", "")
	result := fs.String("result", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
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
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		fmt.Fprintf(w, "slept %d ms\n", ms)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app ok\n") })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
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
	<-sigc
	if *onTerm == "exit" {
		record(fmt.Sprintf("exit %d", time.Now().UnixNano()))
		return 0
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Shutdown(context.Background()) })
	wg.Go(func() {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		end := time.Now().Add(*outFor)
		for i := 0; time.Now().Before(end); i++ {
			resp, err := hc.Get(*outURL)
			if err == nil && resp.StatusCode == 200 {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				record(fmt.Sprintf("ok %d", i))
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
	envoyArgs         []string
	draindLog         *syncBuffer
	drainedAt         time.Time
	app               *container
	appOut            *syncBuffer
	appResult         string
}

const (
	podIP    = "192.0.2.1"
	remoteIP = "192.0.2.2"
)

func newPod(t testing.TB) *pod {
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
	args = append(args, "--", p.bin, "__envoysim", "-c", p.envoyConfig(p.envoyStartupDelay))
	args = append(args, envoyArgs...)
	p.draindLog = &syncBuffer{}
	p.draind = p.runContainer("draind", -1, io.MultiWriter(p.draindLog, testWriter{p.t}), "__draind", args...)
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

func (p *pod) readyStatus() int {
	resp, err := p.client.Get("http://" + podIP + ":15020/healthz/ready")
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (p *pod) waitReady(d time.Duration) {
	p.t.Helper()
	end := time.Now().Add(d)
	for p.readyStatus() != 200 {
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

// logLines returns draind's JSON log lines whose msg is msg.
func (p *pod) logLines(msg string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(p.draindLog.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// phaseTime is when draind logged entering phase.
func (p *pod) phaseTime(phase string) time.Time {
	for _, m := range p.logLines("phase") {
		if m["phase"] != phase {
			continue
		}
		// The log's timestamps have milliseconds; the stop carries its
		// own in nanoseconds.
		if ns, ok := m["quit_sent_unix_ns"].(float64); ok {
			return time.Unix(0, int64(ns))
		}
		ts, _ := time.Parse("2006-01-02T15:04:05.000Z0700", m["ts"].(string))
		return ts
	}
	return time.Time{}
}

// appResults reads the app's result file.
func (p *pod) appResults() (ok, fail int, exitAt time.Time) {
	b, _ := os.ReadFile(p.appResult)
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "ok":
			ok++
		case "fail":
			fail++
			p.t.Logf("app outbound call failed: %s", line)
		case "exit":
			n, _ := strconv.ParseInt(f[1], 10, 64)
			exitAt = time.Unix(0, n)
		}
	}
	return ok, fail, exitAt
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

// 1. Idle pod, app exits on SIGTERM: draind exits 0 soon after min-drain;
// readiness is 503 from the first probe after SIGTERM.
func TestIdlePodAppExits(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "exit")
	p.startDraind([]string{"--min-drain", "500ms"})
	p.terminate()
	// Signal delivery is asynchronous: give draind's signal goroutine a
	// moment to run before the first probe (a kubelet's comes much later).
	time.Sleep(20 * time.Millisecond)
	if got := p.readyStatus(); got != 503 {
		t.Errorf("first readiness probe after SIGTERM: %d, want 503", got)
	}
	code, took := p.waitExit(10 * time.Second)
	t.Logf("idle pod: draind exited %d, %s after SIGTERM (min-drain 500ms)", code, took)
	if code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, p.draindLog.String())
	}
	if took < 500*time.Millisecond {
		t.Errorf("exited %s after SIGTERM: before min-drain", took)
	}
}

// 1b. An app that ignores SIGTERM holds draind (--app-exit wait) until it
// is killed, and draind says so; with no kill, the deadline ends it.
func TestAppIgnoringSIGTERM(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "20s"})
		p.terminate()
		time.Sleep(1500 * time.Millisecond)
		select {
		case <-p.draind.done:
			t.Fatalf("draind exited (%d) while the app still ran; log:\n%s", p.draind.code, p.draindLog.String())
		default:
		}
		if !strings.Contains(p.draindLog.String(), "app: 1 processes") && !strings.Contains(p.draindLog.String(), "app: 1 listeners") {
			t.Errorf("log does not say the app holds the drain:\n%s", p.draindLog.String())
		}
		killed := time.Now()
		p.app.Kill()
		code, _ := p.waitExit(10 * time.Second)
		t.Logf("draind exited %d, %s after the app was killed", code, time.Since(killed))
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "4s", "--stop-timeout", "500ms"})
		p.terminate()
		code, took := p.waitExit(10 * time.Second)
		t.Logf("draind exited %d, %s after SIGTERM (deadline 2s)", code, took)
		if len(p.logLines("drain deadline reached: stopping the proxy with flows still open")) != 1 {
			t.Errorf("no deadline line in the log:\n%s", p.draindLog.String())
		}
		if took < 2*time.Second {
			t.Errorf("exited before the deadline")
		}
	})
}

// 2. A 5 s request in flight at SIGTERM completes through Envoy; draind
// stops Envoy right after the app is done and the last downstream flow
// closed, and exits 0.
func TestLongRequestCompletes(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful")
	p.startDraind([]string{"--min-drain", "200ms"})
	type result struct {
		code int
		body string
		err  error
		at   time.Time
	}
	done := make(chan result, 1)
	go func() {
		resp, err := p.client.Get("http://" + podIP + ":15006/slow?ms=5000")
		if err != nil {
			done <- result{err: err, at: time.Now()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{code: resp.StatusCode, body: string(b), at: time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // the request is in flight
	p.terminate()
	r := <-done
	if r.err != nil || r.code != 200 {
		t.Fatalf("in-flight request: %d %q %v; log:\n%s", r.code, r.body, r.err, p.draindLog.String())
	}
	p.client.CloseIdleConnections() // the client hangs up, as Connection: close asks
	code, took := p.waitExit(15 * time.Second)
	_, _, appExit := p.appResults()
	stopping := p.phaseTime("stopping")
	last := r.at
	if appExit.After(last) {
		last = appExit
	}
	t.Logf("request done %s after SIGTERM; app exited at +%s; quitquitquit at +%s: %s after the later of the two; draind exit %d at +%s",
		r.at.Sub(p.drainedAt), appExit.Sub(p.drainedAt), stopping.Sub(p.drainedAt), stopping.Sub(last), code, took)
	if code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, p.draindLog.String())
	}
	if stopping.Before(r.at) || stopping.Before(appExit) {
		t.Errorf("proxy stopped before the request finished or the app exited")
	}
}

// 3. The app calls out through Envoy during its own 3 s shutdown: every
// call succeeds and Envoy stops only after the app exited.
func TestAppOutboundDuringShutdown(t *testing.T) {
	for _, tc := range []struct{ name, tracker, procs string }{
		{"ebpf", "auto", "auto"},
		{"sockdiag", "sockdiag", "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.startApp("--on-term", "graceful", "--outbound-for", "4s", "--outbound-pause", "500ms")
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", tc.tracker, "--app-procs", tc.procs})
			p.terminate()
			code, took := p.waitExit(20 * time.Second)
			stopping := p.phaseTime("stopping")
			// Let the app finish its own shutdown before reading its results.
			appDone := make(chan struct{})
			go func() { <-p.app.done; close(appDone) }()
			select {
			case <-appDone:
			case <-time.After(15 * time.Second):
				t.Errorf("app still running 15 s after SIGTERM")
			}
			ok, fail, appExit := p.appResults()
			t.Logf("%s: %d calls ok, %d failed; app exited +%s; quitquitquit +%s (%s after app exit); draind exit %d at +%s",
				tc.name, ok, fail, appExit.Sub(p.drainedAt), stopping.Sub(p.drainedAt), stopping.Sub(appExit), code, took)
			if tc.tracker == "sockdiag" {
				// The socket approximation may end in a pause between
				// calls: reported, not asserted.
				return
			}
			if fail > 0 || ok < 4 {
				t.Errorf("%d calls ok, %d failed", ok, fail)
			}
			if code != 0 || appExit.IsZero() || stopping.Before(appExit) {
				t.Errorf("exit %d; proxy stopped at %s, app exited at %s; log:\n%s", code, stopping, appExit, p.draindLog.String())
			}
		})
	}
}

// 4. An idle keep-alive connection held open forever: --idle-timeout ends
// the drain about that long after the flow went idle; without it the
// deadline does, naming the flow.
func TestIdleKeepAlive(t *testing.T) {
	run := func(t *testing.T, args []string) (*pod, time.Duration, int) {
		p := newPod(t)
		p.startApp("--on-term", "exit")
		p.startDraind(append([]string{"--min-drain", "200ms"}, args...))
		// A keep-alive client: one request, then the connection idles.
		resp, err := p.client.Get("http://" + podIP + ":15006/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		idleFrom := time.Now()
		p.terminate()
		code, _ := p.waitExit(20 * time.Second)
		return p, time.Since(idleFrom), code
	}
	t.Run("idle-timeout", func(t *testing.T) {
		_, took, code := run(t, []string{"--idle-timeout", "2s", "--drain-deadline", "15s"})
		t.Logf("--idle-timeout 2s: drain ended %s after the flow went idle (exit %d)", took, code)
		if code != 0 || took < 2*time.Second || took > 10*time.Second {
			t.Errorf("exit %d after %s", code, took)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		p, took, code := run(t, []string{"--drain-deadline", "3s", "--stop-timeout", "500ms"})
		t.Logf("no idle timeout: drain ended %s after the flow went idle (exit %d)", took, code)
		named := false
		for _, l := range p.logLines("open flow at deadline") {
			if strings.HasSuffix(fmt.Sprint(l["local"]), ":15006") && strings.HasPrefix(fmt.Sprint(l["remote"]), remoteIP) {
				named = true
			}
		}
		if !named {
			t.Errorf("the deadline log does not name the idle flow:\n%s", p.draindLog.String())
		}
	})
}

// 5. The proxy crashes mid-drain: draind exits non-zero at once. The admin
// API hangs: draind still exits by its deadline. A second SIGTERM changes
// nothing.
func TestProxyFailures(t *testing.T) {
	t.Run("crash", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "20s"}, "--crash-after", "3s")
		p.terminate()
		code, took := p.waitExit(10 * time.Second)
		t.Logf("crash: draind exit %d at +%s (proxy crashed ~3 s after start)", code, took)
		if code == 0 {
			t.Fatalf("exit 0 after a proxy crash; log:\n%s", p.draindLog.String())
		}
	})
	t.Run("admin-hangs", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "4s", "--stop-timeout", "500ms"})
		// Envoysim's test hook turns its admin API into a black hole.
		setFault(t, p, `{"admin":"hang"}`)
		p.terminate()
		code, took := p.waitExit(15 * time.Second)
		t.Logf("admin hangs: draind exit %d at +%s (deadline 4s, stop-timeout 500ms)", code, took)
		if took > 8*time.Second {
			t.Errorf("draind took %s with a hung admin API", took)
		}
	})
	t.Run("second-sigterm", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "graceful", "--outbound-for", "1s")
		p.startDraind([]string{"--min-drain", "300ms"})
		p.terminate()
		time.Sleep(100 * time.Millisecond)
		p.draind.Signal(syscall.SIGTERM)
		code, _ := p.waitExit(10 * time.Second)
		if code != 0 || len(p.logLines("drain trigger ignored: already draining")) != 1 || len(p.logLines("phase")) == 0 {
			t.Errorf("exit %d; log:\n%s", code, p.draindLog.String())
		}
		draining := 0
		for _, l := range p.logLines("phase") {
			if l["phase"] == "draining" {
				draining++
			}
		}
		if draining != 1 {
			t.Errorf("%d draining phases, want 1", draining)
		}
	})
}

// setFault posts to envoysim's test hook from inside the pod.
func setFault(t *testing.T, p *pod, body string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: p.ns.Dialer()}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("http://127.0.0.1:15000/envoysim/fault", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("set fault: %d %s", resp.StatusCode, b)
	}
}

// 7. draind wait exits 0 once the proxy turns LIVE after a start-up delay,
// non-zero on timeout.
func TestWaitCommand(t *testing.T) {
	p := newPod(t)
	p.envoyStartupDelay = 2 * time.Second
	p.startDraindNoWait(nil)
	// The postStart hook runs in the proxy's container: here, one of its own.
	wait := func(timeout string) (int, time.Duration, string) {
		var out syncBuffer
		start := time.Now()
		c := p.runContainer("wait", -1, &out, "__draind", "wait", "--url", "http://127.0.0.1:15020/healthz/ready", "--timeout", timeout, "--period", "100ms")
		if !c.wait(30 * time.Second) {
			t.Fatal("draind wait did not return")
		}
		return c.code, time.Since(start), out.String()
	}
	code, took, out := wait("500ms")
	if code == 0 {
		t.Errorf("wait with 500ms timeout before LIVE: exit 0")
	}
	t.Logf("wait --timeout 500ms: exit %d after %s: %s", code, took, strings.TrimSpace(out))
	code, took, out = wait("20s")
	t.Logf("wait --timeout 20s: exit %d after %s", code, took)
	if code != 0 {
		t.Errorf("wait: exit %d: %s", code, out)
	}
}
