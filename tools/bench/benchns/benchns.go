// Package benchns builds the network namespaces the benchmarks measure: a
// fresh namespace (loopback up, a wide ephemeral port range) with a process
// living in it, to which N established loopback connections are added on
// demand. The connections are held by child processes (re-executions of
// the calling binary, which must call ChildMain first), each holding at
// most PerChild of them: both ends are file descriptors in the child, and
// the hard RLIMIT_NOFILE may be as low as 20000.
package benchns

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
	"github.com/draind/draind/internal/testenv/nsrun"
)

// PerChild bounds the connections one child holds.
const PerChild = 9000

// childEnv marks a child: "K:PORT" (hold K connections to a listener of
// its own on PORT).
const childEnv = "BENCHNS_CHILD"

// ChildMain runs the process as a connection-holding child when it was
// started as one, and then exits; otherwise it returns at once.
func ChildMain() {
	v := os.Getenv(childEnv)
	if v == "" {
		return
	}
	k, port, _ := strings.Cut(v, ":")
	n, err1 := strconv.Atoi(k)
	p, err2 := strconv.Atoi(port)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, "benchns child:", err)
		os.Exit(2)
	}
	if err := runChild(n, p); err != nil {
		fmt.Fprintln(os.Stderr, "benchns child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// NS is a benchmark namespace.
type NS struct {
	Handle   netns.NsHandle
	children []child
	conns    int
	cgroupFD int // the cgroup v2 directory its processes start in (-1: the caller's)
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// New creates a namespace with a process in it (Pid) and no connections.
func New() (*NS, error) { return newNS(-1) }

// NewInCgroup is New with every process of the namespace (the one living
// in it, and those holding its connections: so every socket of theirs)
// started in the cgroup v2 directory cgroupFD refers to
// (CLONE_INTO_CGROUP), as a pod's app container would be. The caller keeps
// cgroupFD open until Close.
func NewInCgroup(cgroupFD int) (*NS, error) {
	if cgroupFD < 0 {
		return nil, fmt.Errorf("cgroup file descriptor %d", cgroupFD)
	}
	return newNS(cgroupFD)
}

func newNS(cgroupFD int) (*NS, error) {
	b := &NS{cgroupFD: cgroupFD}
	errc := make(chan error, 1)
	go func() {
		// This thread switches namespace and never switches back: it is
		// left locked so the runtime retires it when the goroutine ends.
		runtime.LockOSThread()
		h, err := netns.New()
		if err != nil {
			errc <- fmt.Errorf("create netns: %w", err)
			return
		}
		b.Handle = h
		errc <- setup()
	}()
	if err := <-errc; err != nil {
		b.Close()
		return nil, err
	}
	if err := b.addChild(0); err != nil { // the anchor: a listener, no connections
		b.Close()
		return nil, err
	}
	return b, nil
}

// setup runs inside the new namespace.
func setup() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65000"), 0)
}

// Pid is a process living in the namespace.
func (b *NS) Pid() int { return b.children[0].cmd.Process.Pid }

// Conns is the number of connections held.
func (b *NS) Conns() int { return b.conns }

// Do runs fn on a thread inside the namespace (processes it starts are
// born there).
func (b *NS) Do(fn func() error) error { return nsrun.Do(b.Handle, fn) }

// Fill adds n connections (2n sockets) and waits until the kernel shows
// them all established.
func (b *NS) Fill(n int) error {
	for n > 0 {
		k := min(n, PerChild)
		if err := b.addChild(k); err != nil {
			return err
		}
		n -= k
	}
	return b.WaitEstablished(2*b.conns, 10*time.Second)
}

func (b *NS) addChild(k int) error {
	return b.Do(func() error {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", childEnv, k, 65001+len(b.children)))
		// No Pdeathsig: it fires when the forking thread ends. Children
		// exit when their stdin closes, which our exit does too.
		cmd.Stderr = os.Stderr
		if b.cgroupFD >= 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: b.cgroupFD}
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start child: %w", err)
		}
		b.children = append(b.children, child{cmd, in})
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			return fmt.Errorf("child %d: %q: %w", len(b.children), line, err)
		}
		if line != "ready\n" {
			return fmt.Errorf("child %d: %q, not ready", len(b.children), line)
		}
		b.conns += k
		return nil
	})
}

// DialSockDiag opens a sock_diag connection in the namespace (the socket
// keeps the namespace; the handle used to open it is closed).
func (b *NS) DialSockDiag() (*sockdiag.Conn, error) {
	ns, err := namespace.ByPID(b.Pid())
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return sockdiag.Dial(ns)
}

// WaitEstablished waits until the namespace has at least n established
// sockets (the last handshakes may still be settling when children
// report).
func (b *NS) WaitEstablished(n int, timeout time.Duration) error {
	d, err := b.DialSockDiag()
	if err != nil {
		return err
	}
	defer d.Close()
	d.SetInfo(false)
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		got := 0
		err := d.Each(sockdiag.Mask(tcpstate.Established), func(*sockdiag.Socket) { got++ })
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("namespace's established sockets, want %d: %w", n, err)
			}
			return fmt.Errorf("namespace has %d established sockets, want %d", got, n)
		}
	}
}

// Close ends the children and releases the namespace.
func (b *NS) Close() {
	for _, c := range b.children {
		c.stdin.Close()
		c.cmd.Wait()
	}
	b.children = nil
	if b.Handle != 0 {
		b.Handle.Close()
		b.Handle = 0
	}
}

// runChild holds k connections to its own listener until stdin closes.
func runChild(k, port int) error {
	rlim := unix.Rlimit{Cur: 20000, Max: 20000}
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rlim)
	rlim.Cur = rlim.Max
	unix.Setrlimit(unix.RLIMIT_NOFILE, &rlim)
	ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	var held []net.Conn
	done := make(chan error, 1)
	go func() {
		for range k {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			held = append(held, c)
		}
		done <- nil
	}()
	var dialed []net.Conn
	for i := range k {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		dialed = append(dialed, c)
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(held)
	runtime.KeepAlive(dialed)
	return nil
}
