package main

import (
	"bufio"
	"context"
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
	"time"

	"github.com/vishvananda/netns"

	"github.com/draind/draind/tools/bench/benchns"
)

// proxySetup is how draind is run: `draind run` with envoysim as its
// proxy (LIVE at once: no startup delay).
type proxySetup struct {
	draind, envoysim string
	env, args        []string
}

const (
	statusAddr = "127.0.0.1:15020"
	adminAddr  = "127.0.0.1:15000"
)

// writeEnvoyConfig writes envoysim's config into dir and returns its path.
func writeEnvoyConfig(dir string) (string, error) {
	path := filepath.Join(dir, "envoy.json")
	cfg := `{"admin_address":"` + adminAddr + `","listeners":[{"name":"inbound","address":"0.0.0.0:15006","direction":"inbound","protocol":"http","upstream":"127.0.0.1:8080"}]}`
	return path, os.WriteFile(path, []byte(cfg), 0o644)
}

// line is one line of an agent's output, stamped when it arrived.
type line struct {
	at   time.Duration
	text string
}

// agentProc is one agent (draind run, or pilot-agent) in a namespace, in
// its own process group (the proxy with it).
type agentProc struct {
	cmd   *exec.Cmd
	start time.Time
	mu    sync.Mutex
	lines []line
	done  chan struct{}
}

// startAgent starts cmd inside ns, reading its output line by line.
func startAgent(ns *benchns.NS, cmd *exec.Cmd) (*agentProc, error) {
	a := &agentProc{cmd: cmd, done: make(chan struct{})}
	// A mount namespace of its own, as a container has in a pod: the
	// benchmark's own sockets (the app's flows, its requests) are then the
	// app's, not draind's container's (docs/design.md, "When is the app
	// done"). A cgroup the caller set (CLONE_INTO_CGROUP: the pod's proxy
	// container) is kept.
	attr := &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWNS}
	if cmd.SysProcAttr != nil {
		attr.UseCgroupFD, attr.CgroupFD = cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD
	}
	cmd.SysProcAttr = attr
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	err = ns.Do(func() error {
		a.start = time.Now()
		return cmd.Start()
	})
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			a.mu.Lock()
			a.lines = append(a.lines, line{time.Since(a.start), sc.Text()})
			a.mu.Unlock()
		}
		pr.Close()
	}()
	return a, nil
}

// firstLine is when the first line containing s arrived (-1: none).
func (a *agentProc) firstLine(s string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.lines {
		if strings.Contains(l.text, s) {
			return l.at
		}
	}
	return -1
}

func (a *agentProc) output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	for _, l := range a.lines {
		fmt.Fprintf(&b, "%8.1f ms  %s\n", float64(l.at)/1e6, l.text)
	}
	return b.String()
}

// stop kills the agent's process group and waits for it.
func (a *agentProc) stop() {
	syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
	a.cmd.Wait()
	<-a.done
}

// draindCommand is `draind run` with envoysim, in dir.
func draindCommand(p proxySetup, dir string) (*exec.Cmd, error) {
	cfg, err := writeEnvoyConfig(dir)
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "--status-addr", statusAddr, "--admin-addr", adminAddr, "--run-proxy-as", "1337", "--log-format", "console"}, p.args...)
	if p.envoysim != "" { // else p.args ends with the proxy command
		args = append(args, "--", p.envoysim, "-c", cfg)
	}
	cmd := exec.Command(p.draind, args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Dir = dir
	return cmd, nil
}

// nsClient makes HTTP requests from inside a namespace: its connections
// are dialled from a thread locked into it (and retired with it).
type nsClient struct {
	http  *http.Client
	calls chan func()
}

func newNSClient(ns *benchns.NS) (*nsClient, error) {
	c := &nsClient{calls: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(ns.Handle); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for fn := range c.calls {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	dial := func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
		done := make(chan struct{})
		c.calls <- func() {
			defer close(done)
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		<-done
		return conn, err
	}
	c.http = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial}}
	return c, nil
}

func (c *nsClient) close() {
	c.http.CloseIdleConnections()
	close(c.calls)
}

// get returns a URL's status and body.
func (c *nsClient) get(url string) (int, string, error) {
	resp, err := c.http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitReady polls /healthz/ready every millisecond until a 200 and
// returns when it came, since the agent's start.
func (c *nsClient) waitReady(a *agentProc, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		code, _, err := c.get("http://" + statusAddr + "/healthz/ready")
		if err == nil && code == http.StatusOK {
			return time.Since(a.start), nil
		}
		select {
		case <-a.done:
			return 0, fmt.Errorf("agent exited before ready:\n%s", a.output())
		default:
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("status %d", code)
			}
			return 0, fmt.Errorf("not ready after %s (last: %w):\n%s", timeout, err, a.output())
		}
		time.Sleep(time.Millisecond)
	}
}
