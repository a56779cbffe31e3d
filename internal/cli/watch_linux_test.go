package cli

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/testutil"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "__draind" {
		os.Exit(Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 2 && os.Args[1] == "__rooted" {
		os.Exit(rootedRole(os.Args[2]))
	}
	code := m.Run()
	testutil.RemoveSelfCopy()
	os.Exit(code)
}

// TestWatchUnprivilegedFallsBack runs `draind watch` inside a namespace as
// uid 1000 without CAP_BPF, CAP_PERFMON or CAP_SYS_ADMIN, as a plain pod
// container would: it must say, in one line, that it polls and why, and
// still report changes.
func TestWatchUnprivilegedFallsBack(t *testing.T) {
	ns := testutil.NewNetNS(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	cmd := exec.Command(setpriv, "--reuid", "1000", "--regid", "1000", "--clear-groups", "--inh-caps=-all",
		"--bounding-set=-bpf,-perfmon,-sys_admin", testutil.SelfCopy(t), "__draind", "watch", "--poll-period", "50ms")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	first := <-lines
	if !strings.Contains(first, "sockdiag mode") || !strings.Contains(first, "no CAP_BPF") || !strings.Contains(first, "polling") {
		t.Fatalf("first line %q: want the sockdiag fallback and its reason", first)
	}
	<-lines // the summary
	var ln net.Listener
	ns.Do(t, func() { ln, err = net.Listen("tcp4", "127.0.0.1:7777") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, "app processes") {
				continue // the process view, not visible here without privileges
			}
			if !strings.Contains(l, "LISTEN") || !strings.Contains(l, "127.0.0.1:7777") {
				t.Fatalf("change line %q", l)
			}
			return
		case <-timeout:
			t.Fatal("no change reported")
		}
	}
}

// failAfter is a writer that fails once it has taken n writes, as a pipe
// does when `head` has read its lines and exited.
type failAfter struct{ n int }

func (w *failAfter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, syscall.EPIPE
	}
	w.n--
	return len(p), nil
}

// TestWatchWaitsForItsTracker is `draind watch | head`: the output fails
// while the tracker runs. watch must return only once the goroutine
// running the tracker has ended (it used to return at once and close the
// tracker under it).
func TestWatchWaitsForItsTracker(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:7000")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // churn, so that the tracker is busy when watch returns
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var c net.Conn
			ns.Do(t, func() { c, _ = net.Dial("tcp4", ln.Addr().String()) })
			if c != nil {
				c.Close()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer func() { close(stop); <-done }()
	for _, mode := range []string{"ebpf", "sockdiag"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "ebpf" {
				testutil.RequireBTF(t)
			}
			for range 20 {
				err := Run(context.Background(), []string{"watch", "--netns", ns.Path(), "--tracker", mode, "--procs=false", "--poll-period", "5ms"}, &failAfter{n: 3}, io.Discard)
				if !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("watch: %v, want the write error", err)
				}
				if stacks := trackerGoroutines(); stacks != "" {
					t.Fatalf("watch returned with its tracker still running:\n%s", stacks)
				}
			}
		})
	}
}

// trackerGoroutines returns the stacks of goroutines inside Tracker.Run.
func trackerGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "flows.(*Tracker).Run") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
