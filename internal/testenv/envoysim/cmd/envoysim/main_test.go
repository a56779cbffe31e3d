package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// build builds the envoysim program once for the package's tests.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "envoysim-bin-")
		if buildErr != nil {
			return
		}
		// go test puts its own toolchain first in the PATH.
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go toolchain to build envoysim: %w", err)
			return
		}
		binPath = filepath.Join(binDir, "envoysim")
		out, err := exec.Command(goBin, "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
		// Readable and runnable by an unprivileged uid (the proxy's, 1337).
		os.Chmod(binDir, 0o755)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// proc is a running envoysim process.
type proc struct {
	hc     *http.Client // to the admin API
	cmd    *exec.Cmd
	admin  *envoy.Client
	addr   string // admin address
	stderr *strings.Builder
	exited chan struct{}
	err    error
}

// launchOpts say how to run envoysim.
type launchOpts struct {
	cred   *syscall.Credential
	caps   []uintptr                                                         // ambient capabilities (with cred)
	config string                                                            // JSON config; default: one TCP listener "in" to an echo server
	start  func(func()) error                                                // runs cmd.Start, e.g. inside a network namespace
	dial   func(ctx context.Context, network, addr string) (net.Conn, error) // reaches the admin API
	args   []string
}

// startProc runs envoysim with a config of one TCP listener to echo, and
// waits until it is LIVE.
func startProc(t *testing.T, cred *syscall.Credential, extra ...string) *proc {
	t.Helper()
	p := launch(t, launchOpts{cred: cred, args: extra})
	if p.addr == "" {
		t.Fatalf("envoysim exited at start: %v\n%s", p.err, p.stderr)
	}
	if code, body := p.get(t, "/ready"); code != 200 {
		t.Fatalf("not ready: %d %q", code, body)
	}
	return p
}

// launch starts envoysim and waits until its admin address is known, or
// until it exits (then p.addr is empty).
func launch(t *testing.T, o launchOpts) *proc {
	t.Helper()
	bin := build(t)
	dir := t.TempDir()
	// The child may run as another uid: it reads the config and writes the
	// admin address file in dir.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o777)
	cfg := filepath.Join(dir, "envoysim.json")
	conf := o.config
	if conf == "" {
		conf = fmt.Sprintf(`{"listeners":[{"name":"in","address":"127.0.0.1:0","direction":"inbound","upstream":%q}]}`, echoServer(t))
	}
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "admin-address")
	args := append([]string{"-c", cfg, "--admin-address", "127.0.0.1:0", "--admin-address-path", addrFile,
		"--drain-time-s", "45", "--drain-strategy", "immediate", "-l", "warning", "--disable-hot-restart"}, o.args...)
	p := &proc{cmd: exec.Command(bin, args...), stderr: &strings.Builder{}, exited: make(chan struct{}),
		hc: &http.Client{Transport: &http.Transport{DialContext: o.dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}}
	p.cmd.Stderr = &lockedWriter{w: p.stderr}
	if o.cred != nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: o.cred, AmbientCaps: o.caps}
	}
	start := func(f func()) error { f(); return nil }
	if o.start != nil {
		start = o.start
	}
	var serr error
	if err := start(func() { serr = p.cmd.Start() }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("envoysim stderr:\n%s", p.stderr)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(addrFile)
		if err == nil && len(b) > 0 {
			p.addr = string(b)
			break
		}
		select {
		case <-p.exited:
			return p
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admin address file\n%s", p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.admin = envoy.New(p.addr, envoy.WithTimeout(5*time.Second), envoy.WithHTTPClient(p.hc))
	return p
}

// get fetches an admin path.
func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := p.hc.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// listenerAddr reads the listener's bound address from /listeners.
func (p *proc) listenerAddr(t *testing.T, name string) string {
	t.Helper()
	resp, err := p.hc.Get("http://" + p.addr + "/listeners")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if n, addr, ok := strings.Cut(sc.Text(), "::"); ok && n == name {
			return addr
		}
	}
	t.Fatalf("no listener %q in /listeners", name)
	return ""
}

// proxied opens a connection through the listener and proves it works.
func proxied(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Write([]byte("hi"))
	buf := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return c
}

// wait waits for the process to exit, with a generous bound, and returns
// its exit code (-1 when killed by a signal).
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	code, _ := p.waitStatus(t)
	return code
}

// waitStatus is wait with the signal that killed the process, if any.
func (p *proc) waitStatus(t *testing.T) (int, syscall.Signal) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("envoysim did not exit\n%s", p.stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1, ws.Signal()
		}
		return ee.ExitCode(), 0
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0, 0
}

func TestProgramSIGTERM(t *testing.T) {
	p := startProc(t, nil)
	c := proxied(t, p.listenerAddr(t, "in"))
	// SIGHUP is ignored.
	p.cmd.Process.Signal(syscall.SIGHUP)
	if code, _ := p.get(t, "/ready"); code != 200 {
		t.Fatalf("after SIGHUP: %d", code)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("proxied connection after SIGTERM: %v, want a FIN (EOF)", err)
	}
	if !strings.Contains(p.stderr.String(), "caught ENVOY_SIGTERM") {
		t.Errorf("stderr: %s", p.stderr)
	}
}

func TestProgramQuitQuitQuit(t *testing.T) {
	p := startProc(t, nil)
	if _, si := p.get(t, "/server_info"); !strings.Contains(si, `"drain_time": "45s"`) || !strings.Contains(si, `"drain_strategy": "Immediate"`) {
		t.Errorf("flags not applied: %s", si)
	}
	proxied(t, p.listenerAddr(t, "in"))
	if err := p.admin.QuitQuitQuit(context.Background()); err != nil {
		t.Fatalf("quitquitquit: %v", err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

// A crash kills the process with SIGABRT, as a crashing Envoy dies, and
// the kernel closes its connections: a FIN.
func TestProgramCrash(t *testing.T) {
	p := startProc(t, nil, "--crash-after", "500ms")
	c := proxied(t, p.listenerAddr(t, "in"))
	code, sig := p.waitStatus(t)
	if sig != syscall.SIGABRT {
		t.Errorf("exit code %d, signal %v; want killed by SIGABRT", code, sig)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("proxied connection after the crash: %v, want a FIN (EOF)", err)
	}
	if !strings.Contains(p.stderr.String(), "caught Aborted") || strings.Contains(p.stderr.String(), "goroutine ") {
		t.Errorf("stderr: %s", p.stderr)
	}
}

// --crash-exit-code N makes a crash an exit with code N instead (the
// stand-in's older behaviour: 134 is what a shell reports for SIGABRT).
func TestProgramCrashExitCode(t *testing.T) {
	p := startProc(t, nil, "--crash-after", "300ms", "--crash-exit-code", "134")
	if code, sig := p.waitStatus(t); code != 134 || sig != 0 {
		t.Errorf("exit code %d signal %v, want exit 134", code, sig)
	}
}

// The fault hook's crash after the first drain request.
func TestProgramCrashAfterDrain(t *testing.T) {
	p := startProc(t, nil)
	resp, err := http.Post("http://"+p.addr+"/envoysim/fault?crash_after_drain=200ms", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	resp.Body.Close()
	time.Sleep(400 * time.Millisecond)
	if code, _ := p.get(t, "/ready"); code != 200 {
		t.Fatal("crashed before any drain")
	}
	if err := p.admin.DrainListeners(context.Background(), envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
		t.Fatal(err)
	}
	if _, sig := p.waitStatus(t); sig != syscall.SIGABRT {
		t.Errorf("signal %v, want SIGABRT", sig)
	}
}

func TestProgramAsProxyUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as uid 1337")
	}
	p := startProc(t, &syscall.Credential{Uid: 1337, Gid: 1337})
	proxied(t, p.listenerAddr(t, "in"))
	if err := p.admin.QuitQuitQuit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

func TestRunFlags(t *testing.T) {
	var out, errb strings.Builder
	if err := run(context.Background(), []string{"--version"}, &out, &errb); err != nil || !strings.Contains(out.String(), "envoysim") {
		t.Errorf("--version: %v %q", err, out.String())
	}
	for _, args := range [][]string{{"--nope"}, {"extra"}, {"-c", "/nonexistent.json"}, {"--drain-time-s", "-1"},
		{"--drain-strategy", "slow"}, {"--stats-matcher", "nope"}, {"--mode", "nope"}, {"--skip-deprecated-logs", "true"}} {
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"--mode", "validate", "--drain-time-s", "0"}, &out, &errb); err != nil || !strings.Contains(out.String(), "OK") {
		t.Errorf("--mode validate: %v %q", err, out.String())
	}
	// ctx's end stops it like SIGTERM.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--admin-address", "127.0.0.1:0"}, &out, io.Discard) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return")
	}
}

// The flags pilot-agent passes Envoy are all accepted; --drain-time-s 0 is
// valid.
func TestProgramPilotAgentFlags(t *testing.T) {
	p := startProc(t, nil, "--drain-time-s", "0", "--drain-strategy", "immediate", "--local-address-ip-version", "v4",
		"--file-flush-interval-msec", "1000", "--file-flush-min-size-kb", "64", "--disable-hot-restart",
		"--allow-unknown-static-fields", "--log-format", "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t",
		"-l", "warning", "--component-log-level", "misc:error", "--skip-deprecated-logs", "--enable-core-dump",
		"--config-yaml", "{}", "--concurrency", "2", "--stats-tag", "a:b", "--stats-tag", "c:d")
	if _, si := p.get(t, "/server_info"); !strings.Contains(si, `"drain_time": "0s"`) {
		t.Errorf("server_info: %s", si)
	}
	// A graceful drain with no drain time stops the inbound listener at once.
	if err := p.admin.DrainListeners(context.Background(), envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
		t.Fatal(err)
	}
	addr := p.listenerAddr(t, "in")
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("inbound listener still accepting with --drain-time-s 0")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The start-up faults: exit before LIVE with a code; stay INITIALIZING.
func TestProgramStartupFaults(t *testing.T) {
	p := launch(t, launchOpts{args: []string{"--startup-delay", "200ms", "--fault-exit-at-start", "3"}})
	if code, sig := p.waitStatus(t); code != 3 || sig != 0 {
		t.Errorf("exit at start: code %d signal %v, want 3", code, sig)
	}
	p = launch(t, launchOpts{args: []string{"--fault-never-live"}})
	time.Sleep(300 * time.Millisecond)
	if code, body := p.get(t, "/ready"); code != 503 || body != "INITIALIZING\n" {
		t.Errorf("never live: %d %q", code, body)
	}
	if l, err := p.admin.Live(context.Background()); err != nil || l.Live() {
		t.Errorf("never live: %+v %v", l, err)
	}
}
