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
	"runtime"
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
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		binPath = filepath.Join(binDir, "envoysim")
		out, err := exec.Command(goBin, "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
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
	cmd    *exec.Cmd
	admin  *envoy.Client
	addr   string // admin address
	stderr *strings.Builder
	exited chan struct{}
	err    error
}

// startProc runs envoysim with a config of one TCP listener to echo, and
// waits until it is LIVE.
func startProc(t *testing.T, cred *syscall.Credential, extra ...string) *proc {
	t.Helper()
	bin := build(t)
	dir := t.TempDir()
	// The child may run as another uid: it reads the config and writes the
	// admin address file in dir.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o777)
	cfg := filepath.Join(dir, "envoysim.json")
	conf := fmt.Sprintf(`{"listeners":[{"name":"in","address":"127.0.0.1:0","direction":"inbound","upstream":%q}]}`, echoServer(t))
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "admin-address")
	args := append([]string{"-c", cfg, "--admin-address", "127.0.0.1:0", "--admin-address-path", addrFile,
		"--drain-time-s", "45", "--drain-strategy", "immediate", "-l", "warning", "--disable-hot-restart"}, extra...)
	p := &proc{cmd: exec.Command(bin, args...), stderr: &strings.Builder{}, exited: make(chan struct{})}
	p.cmd.Stderr = &lockedWriter{w: p.stderr}
	if cred != nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
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
			t.Fatalf("envoysim exited at start: %v\n%s", p.err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admin address file\n%s", p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.admin = envoy.New(p.addr, envoy.WithTimeout(5*time.Second))
	if _, ready, err := p.admin.Ready(context.Background()); err != nil || !ready {
		t.Fatalf("not ready: %v", err)
	}
	return p
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
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + p.addr + "/listeners")
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
// its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("envoysim did not exit\n%s", p.stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

func TestProgramSIGTERM(t *testing.T) {
	p := startProc(t, nil)
	c := proxied(t, p.listenerAddr(t, "in"))
	// SIGHUP is ignored.
	p.cmd.Process.Signal(syscall.SIGHUP)
	if _, ready, err := p.admin.Ready(context.Background()); err != nil || !ready {
		t.Fatalf("after SIGHUP: %v", err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("proxied connection after SIGTERM: %v", err)
	}
	if !strings.Contains(p.stderr.String(), "caught ENVOY_SIGTERM") {
		t.Errorf("stderr: %s", p.stderr)
	}
}

func TestProgramQuitQuitQuit(t *testing.T) {
	p := startProc(t, nil)
	si, err := p.admin.ServerInfo(context.Background())
	if err != nil || si.DrainTime != 45*time.Second || si.DrainStrategy != "Immediate" {
		t.Errorf("flags not applied: %+v %v", si, err)
	}
	proxied(t, p.listenerAddr(t, "in"))
	if err := p.admin.QuitQuitQuit(context.Background()); err != nil {
		t.Fatalf("quitquitquit: %v", err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

func TestProgramCrash(t *testing.T) {
	p := startProc(t, nil, "--crash-after", "300ms", "--crash-exit-code", "134")
	if code := p.wait(t); code != 134 {
		t.Errorf("exit code %d, want 134", code)
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
	for _, args := range [][]string{{"--nope"}, {"extra"}, {"-c", "/nonexistent.json"}, {"--drain-time-s", "0"}, {"--drain-strategy", "slow"}} {
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
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
