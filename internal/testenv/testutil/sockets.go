//go:build linux

package testutil

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Network picks tcp4 or tcp6 from an address, so that "0.0.0.0:N" is a real
// IPv4 socket (Go would otherwise listen dual-stack on [::]).
func Network(addr string) string {
	if strings.HasPrefix(addr, "[") {
		return "tcp6"
	}
	return "tcp4"
}

// asUID runs fn on a locked thread inside ns whose fsuid is uid: a socket
// created there is owned by uid (sk_uid is the creating thread's fsuid).
func (n *NetNS) asUID(tb testing.TB, uid int, fn func()) {
	tb.Helper()
	n.Do(tb, func() {
		unix.Setfsuid(uid)
		defer unix.Setfsuid(os.Geteuid())
		fn()
	})
}

// ListenAs listens in the namespace with the socket owned by uid, closed
// when the test ends.
func (n *NetNS) ListenAs(tb testing.TB, uid int, addr string) net.Listener {
	tb.Helper()
	var ln net.Listener
	var err error
	n.asUID(tb, uid, func() { ln, err = net.Listen(Network(addr), addr) })
	if err != nil {
		tb.Fatalf("listen %s as uid %d: %v", addr, uid, err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// DialAs connects from the namespace with the socket owned by uid, closed
// when the test ends.
func (n *NetNS) DialAs(tb testing.TB, uid int, addr string) net.Conn {
	tb.Helper()
	var c net.Conn
	var err error
	n.asUID(tb, uid, func() { c, err = net.Dial(Network(addr), addr) })
	if err != nil {
		tb.Fatalf("dial %s as uid %d: %v", addr, uid, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Accept returns the next connection accepted by ln on a root thread.
func Accept(tb testing.TB, ln net.Listener) net.Conn { return AcceptAs(tb, ln, 0) }

// AcceptAs accepts on a thread whose fsuid is uid: the kernel sets an
// accepted socket's uid from the accepting thread (sock_graft), so a
// proxy's accepted flows are its own only if it accepts them itself.
func AcceptAs(tb testing.TB, ln net.Listener, uid int) net.Conn {
	tb.Helper()
	var c net.Conn
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		unix.Setfsuid(uid)
		defer unix.Setfsuid(os.Geteuid())
		c, err = ln.Accept()
	}()
	<-done
	if err != nil {
		tb.Fatalf("accept: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Eventually calls fn until it returns nil, failing the test with fn's
// last error after a generous deadline (machines here are noisy: this is a
// wait for a condition, never a timing assertion).
func Eventually(tb testing.TB, what string, fn func() error) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// helperEnv carries a helper process's job (see RunHelper).
const helperEnv = "DRAIND_TEST_HELPER"

// RunHelper makes a test binary double as a helper process: call it first
// in TestMain; it returns false in the test process itself and otherwise
// runs the job StartHelper asked for and exits. The one job today is
// "listen ADDR": listen, print the address, accept and hold connections
// until stdin closes.
func RunHelper() bool {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return false
	}
	verb, arg, _ := strings.Cut(spec, " ")
	if verb != "listen" {
		os.Stderr.WriteString("unknown helper " + spec + "\n")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", arg)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString(ln.Addr().String() + "\n")
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
	return true
}

// StartHelper starts a copy of the test binary (see SelfCopy) as a helper
// process in the namespace under uid, running job (see RunHelper), and
// returns the first line it prints. It is stopped when the test ends.
func (n *NetNS) StartHelper(tb testing.TB, uid uint32, job string) string {
	tb.Helper()
	cmd := exec.Command(SelfCopy(tb))
	cmd.Env = append(os.Environ(), helperEnv+"="+job)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	var startErr error
	n.Do(tb, func() { startErr = cmd.Start() }) // born in the namespace
	if startErr != nil {
		tb.Fatalf("start helper: %v", startErr)
	}
	tb.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		tb.Fatalf("helper %q: %v", job, err)
	}
	return strings.TrimSpace(line)
}
