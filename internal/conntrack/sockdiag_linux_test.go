package conntrack

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestMain lets the test binary double as a helper process (a listener
// running under another uid, in whatever namespace it was started in).
func TestMain(m *testing.M) {
	if spec := os.Getenv("DRAIND_TEST_HELPER"); spec != "" {
		os.Exit(runHelper(spec))
	}
	code := m.Run()
	if helperOnce.path != "" {
		os.RemoveAll(filepath.Dir(helperOnce.path))
	}
	os.Exit(code)
}

// runHelper: "listen ADDR" listens, prints the address, accepts and holds
// connections until stdin closes.
func runHelper(spec string) int {
	verb, arg, _ := strings.Cut(spec, " ")
	switch verb {
	case "listen":
		ln, err := net.Listen("tcp", arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(ln.Addr())
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
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper", spec)
	return 2
}

// startHelper starts the test binary as a helper in ns, under uid.
func startHelper(t *testing.T, ns *testutil.NetNS, uid uint32, spec string) string {
	t.Helper()
	cmd := exec.Command(helperBinary(t))
	cmd.Env = append(os.Environ(), "DRAIND_TEST_HELPER="+spec)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	var startErr error
	ns.Do(t, func() { startErr = cmd.Start() }) // born in ns
	if startErr != nil {
		t.Fatalf("start helper: %v", startErr)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper %q: %v", spec, err)
	}
	return strings.TrimSpace(line)
}

var helperOnce struct {
	sync.Once
	path string
	err  error
}

// helperBinary is a copy of the test binary that any uid can execute (go
// test's build directory is private to root).
func helperBinary(t *testing.T) string {
	t.Helper()
	helperOnce.Do(func() {
		dir, err := os.MkdirTemp("", "draind-helper-")
		if err != nil {
			helperOnce.err = err
			return
		}
		os.Chmod(dir, 0o755)
		src, err := os.ReadFile(os.Args[0])
		if err != nil {
			helperOnce.err = err
			return
		}
		helperOnce.path = filepath.Join(dir, "helper")
		helperOnce.err = os.WriteFile(helperOnce.path, src, 0o755)
	})
	if helperOnce.err != nil {
		t.Fatalf("helper binary: %v", helperOnce.err)
	}
	return helperOnce.path
}

// listenAs listens in ns with the socket owned by uid (fsuid is per thread
// and ns.Do runs on a locked thread).
func listenAs(t *testing.T, ns *testutil.NetNS, uid int, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	ns.Do(t, func() {
		unix.Setfsuid(uid)
		ln, err = net.Listen(network(addr), addr)
		unix.Setfsuid(os.Geteuid())
	})
	if err != nil {
		t.Fatalf("listen %s as uid %d: %v", addr, uid, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialAs connects from ns with the socket owned by uid.
func dialAs(t *testing.T, ns *testutil.NetNS, uid int, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	ns.Do(t, func() {
		unix.Setfsuid(uid)
		c, err = net.Dial(network(addr), addr)
		unix.Setfsuid(os.Geteuid())
	})
	if err != nil {
		t.Fatalf("dial %s as uid %d: %v", addr, uid, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// network picks tcp4 or tcp6 so that "0.0.0.0:N" is a real IPv4 socket
// (Go would otherwise listen dual-stack on [::]).
func network(addr string) string {
	if strings.HasPrefix(addr, "[") {
		return "tcp6"
	}
	return "tcp4"
}

// accepted returns the next connection accepted by ln, by a root thread.
func accepted(t *testing.T, ln net.Listener) net.Conn { return acceptedAs(t, ln, 0) }

// acceptedAs accepts on a thread whose fsuid is uid: the kernel sets an
// accepted socket's uid from the accepting file's owner (sock_graft), so a
// proxy's accepted flows are its own only if it accepts them itself.
func acceptedAs(t *testing.T, ln net.Listener, uid int) net.Conn {
	t.Helper()
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
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialDiag(t *testing.T, ns *testutil.NetNS) *DiagConn {
	t.Helper()
	h, err := OpenNetNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	d, err := DialDiag(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// eventually polls fn until it returns nil or the (generous) deadline.
func eventually(t *testing.T, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func snapshot(t *testing.T, d *DiagConn, p Policy) Snapshot {
	t.Helper()
	socks, err := d.Sockets(AllStates)
	if err != nil {
		t.Fatal(err)
	}
	return NewClassifier(p).Classify(socks)
}

func TestSnapshotAttribution(t *testing.T) {
	ns := testutil.NewNetNS(t)
	const proxy = DefaultProxyUID
	app8080 := listenAs(t, ns, 0, "0.0.0.0:8080")
	app8081 := listenAs(t, ns, 0, "127.0.0.1:8081")
	listenAs(t, ns, 0, "[::]:8082")
	app8083 := listenAs(t, ns, 0, "[::1]:8083")
	px15001 := listenAs(t, ns, proxy, "0.0.0.0:15001")
	px15006 := listenAs(t, ns, proxy, "[::]:15006")

	// 1. proxy → app (inbound request for the app).
	dialAs(t, ns, proxy, "127.0.0.1:8080")
	accepted(t, app8080)
	// 2. app → proxy outbound listener.
	dialAs(t, ns, 0, "127.0.0.1:15001")
	acceptedAs(t, px15001, proxy)
	// 3. app → app over IPv6 loopback.
	dialAs(t, ns, 0, "[::1]:8083")
	accepted(t, app8083)
	// 4. CLOSE_WAIT: the proxy closes a flow the app keeps open.
	dialAs(t, ns, 0, "[::1]:15006")
	acceptedAs(t, px15006, proxy).Close()
	// 5. TIME_WAIT: the app's client closes first, then the server.
	c := dialAs(t, ns, 0, "127.0.0.1:8081")
	s := accepted(t, app8081)
	c.Close()
	time.Sleep(10 * time.Millisecond)
	s.Close()

	d := dialDiag(t, ns)
	want := Summary{AppListeners: 4, AppInbound: 2, AppOutbound: 3, ProxyListeners: 2, ProxyFlows: 2, Closing: 2}
	var snap Snapshot
	eventually(t, "summary", func() error {
		snap = snapshot(t, d, DefaultPolicy())
		if snap.Summary != want {
			return fmt.Errorf("got %+v, want %+v", snap.Summary, want)
		}
		return nil
	})

	var states = map[State]int{}
	for _, f := range snap.Flows {
		states[f.State]++
		if f.State == CloseWait && (f.Owner != OwnerApp || f.Direction != DirOutbound || !f.Holds) {
			t.Errorf("CLOSE_WAIT flow: %+v, want app outbound holding", f)
		}
		if f.State == TimeWait && (f.Holds || f.HasInfo) {
			t.Errorf("TIME_WAIT flow holds or has tcp_info: %+v", f)
		}
		if f.State == Established && !f.HasInfo {
			t.Errorf("established flow without tcp_info: %+v", f)
		}
	}
	for _, st := range []State{CloseWait, TimeWait, FinWait2} {
		if states[st] != 1 {
			t.Errorf("%d flows in %s, want 1 (states: %v)", states[st], st, states)
		}
	}
	wantListeners := map[string]Owner{
		"0.0.0.0:8080": OwnerApp, "127.0.0.1:8081": OwnerApp, "[::]:8082": OwnerApp, "[::1]:8083": OwnerApp,
		"0.0.0.0:15001": OwnerProxy, "[::]:15006": OwnerProxy,
	}
	for _, l := range snap.Listeners {
		o, ok := wantListeners[l.Local.String()]
		if !ok || o != l.Owner {
			t.Errorf("listener %s owner %s: unexpected", l.Local, l.Owner)
		}
		if l.Cookie == 0 || l.Inode == 0 {
			t.Errorf("listener %s: cookie %d inode %d", l.Local, l.Cookie, l.Inode)
		}
	}
	if len(snap.Listeners) != len(wantListeners) {
		t.Errorf("%d listeners, want %d", len(snap.Listeners), len(wantListeners))
	}
}

func TestSnapshotOtherUIDProcess(t *testing.T) {
	ns := testutil.NewNetNS(t)
	// A real process running as the proxy uid, and one as another uid.
	proxyAddr := startHelper(t, ns, DefaultProxyUID, "listen 127.0.0.1:15001")
	appAddr := startHelper(t, ns, 1000, "listen [::1]:9000")
	dialAs(t, ns, 0, proxyAddr)
	dialAs(t, ns, 0, appAddr)

	d := dialDiag(t, ns)
	// The test process's clients: app outbound (uid 0) and app outbound to
	// the uid-1000 app (app → app: the client side is outbound, the
	// accepted side inbound).
	want := Summary{AppListeners: 1, ProxyListeners: 1, ProxyFlows: 1, AppOutbound: 2, AppInbound: 1}
	eventually(t, "summary", func() error {
		got := snapshot(t, d, DefaultPolicy()).Summary
		if got != want {
			return fmt.Errorf("got %+v, want %+v", got, want)
		}
		return nil
	})
	// --proxy-ports makes the uid-1000 listener and its flow the proxy's.
	p := DefaultPolicy()
	p.ProxyPorts = []uint16{9000}
	got := snapshot(t, d, p).Summary
	want = Summary{ProxyListeners: 2, ProxyFlows: 2, AppOutbound: 2}
	if got != want {
		t.Errorf("with proxy port 9000: got %+v, want %+v", got, want)
	}
}

func TestSnapshotOwnInodesAndIdle(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := listenAs(t, ns, 0, "127.0.0.1:15020") // draind's status listener
	c := dialAs(t, ns, 0, "127.0.0.1:15020")
	accepted(t, ln)
	d := dialDiag(t, ns)

	own, err := SelfSocketInodes()
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultPolicy()
	p.OwnInodes = own
	// Everything here is this process's: listener and both flow ends.
	if got, want := snapshot(t, d, p).Summary, (Summary{ProxyListeners: 1, ProxyFlows: 2}); got != want {
		t.Errorf("own sockets: got %+v, want %+v", got, want)
	}
	// With an idle timeout shorter than the flows' idle time, they stop
	// holding the drain.
	c.Write([]byte("x"))
	time.Sleep(300 * time.Millisecond)
	p = DefaultPolicy()
	p.IdleTimeout = 100 * time.Millisecond
	snap := snapshot(t, d, p)
	if got, want := snap.Summary, (Summary{AppListeners: 1, AppInbound: 1, AppOutbound: 1, AppIdle: 2}); got != want {
		t.Errorf("idle: got %+v, want %+v", got, want)
	}
	if got := snap.Summary.AppHolding(); got != 0 {
		t.Errorf("AppHolding = %d, want 0", got)
	}
	for _, f := range snap.Flows {
		if f.IdleMS < 250 {
			t.Errorf("flow idle %d ms, want ≥ 250", f.IdleMS)
		}
	}
}

func TestListenMaskDoesNotReturnFlows(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := listenAs(t, ns, 0, "127.0.0.1:0")
	for range 20 {
		dialAs(t, ns, 0, ln.Addr().String())
		accepted(t, ln)
	}
	d := dialDiag(t, ns)
	socks, err := d.Sockets(ListenMask)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].State != Listen {
		t.Fatalf("LISTEN dump: %d sockets %v", len(socks), socks)
	}
	n, err := d.Count(HoldingMask)
	if err != nil {
		t.Fatal(err)
	}
	if n != 40 {
		t.Fatalf("holding count %d, want 40", n)
	}
}

func TestNamespaceIsolationAndByPID(t *testing.T) {
	ns := testutil.NewNetNS(t)
	other := testutil.NewNetNS(t)
	listenAs(t, ns, 0, "127.0.0.1:7001")
	listenAs(t, other, 0, "127.0.0.1:7002")

	// A process born in ns: --pid must show ns, not the caller's.
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	h, err := OpenNetNSByPID(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Inode() != ns.Inode {
		t.Fatalf("pid %d netns inode %d, want %d", cmd.Process.Pid, h.Inode(), ns.Inode)
	}
	d, err := DialDiag(h)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	socks, err := d.Sockets(ListenMask)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].Local.Port() != 7001 {
		t.Fatalf("listeners seen through pid %d: %v, want only :7001", cmd.Process.Pid, socks)
	}
}

func TestOpenNetNSErrors(t *testing.T) {
	tests := []struct {
		name string
		open func() (*NetNS, error)
		want string
	}{
		{"missing path", func() (*NetNS, error) { return OpenNetNS("/run/netns/does-not-exist") }, "netns /run/netns/does-not-exist: no such file or directory"},
		{"not a namespace", func() (*NetNS, error) { return OpenNetNS("/etc/hostname") }, "not a namespace file"},
		{"gone pid", func() (*NetNS, error) { return OpenNetNSByPID(1 << 30) }, "pid 1073741824: no such process"},
		{"bad pid", func() (*NetNS, error) { return OpenNetNSByPID(-1) }, "not a valid pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := tt.open()
			if err == nil {
				h.Close()
				t.Fatal("no error")
			}
			var nse *NetNSError
			if !errors.As(err, &nse) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q (%T), want a *NetNSError containing %q", err, err, tt.want)
			}
		})
	}
	h, err := CurrentNetNS()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_ = strconv.Itoa
}
