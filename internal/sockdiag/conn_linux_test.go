package sockdiag

import (
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/tcpstate"
	"github.com/draind/draind/internal/testenv/testutil"
)

// holdingMask selects the states that hold a drain (flows.HoldsDrain; flows
// imports this package, so its tests cannot).
var holdingMask = Mask(tcpstate.Established, tcpstate.SynSent, tcpstate.SynRecv, tcpstate.NewSynRecv, tcpstate.CloseWait)

func dialNS(t *testing.T, ns *testutil.NetNS) *Conn {
	t.Helper()
	h, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	d, err := Dial(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The kernel reports each state, both families, uids, inodes, cookies and
// tcp_info where a full socket has one.
func TestDumpStates(t *testing.T) {
	ns := testutil.NewNetNS(t)
	l4 := ns.ListenAs(t, 0, "127.0.0.1:8080")
	l6 := ns.ListenAs(t, 1337, "[::1]:15006")
	ns.DialAs(t, 0, "127.0.0.1:8080")
	testutil.Accept(t, l4)
	ns.DialAs(t, 0, "[::1]:15006")
	testutil.AcceptAs(t, l6, 1337).Close() // CLOSE_WAIT on the client, FIN_WAIT2 on the server
	c := ns.DialAs(t, 0, "127.0.0.1:8080")
	s := testutil.Accept(t, l4)
	c.Close()
	time.Sleep(10 * time.Millisecond)
	s.Close() // TIME_WAIT on the client side

	d := dialNS(t, ns)
	want := map[tcpstate.State]int{tcpstate.Listen: 2, tcpstate.Established: 2, tcpstate.CloseWait: 1, tcpstate.FinWait2: 1, tcpstate.TimeWait: 1, tcpstate.LastAck: 0}
	testutil.Eventually(t, "states", func() error {
		got := map[tcpstate.State]int{}
		socks, err := d.Sockets(AllStates)
		if err != nil {
			return err
		}
		for _, s := range socks {
			got[s.State]++
			switch {
			case s.State == tcpstate.TimeWait && (s.HasInfo || s.Inode != 0):
				return fmt.Errorf("TIME_WAIT with tcp_info or inode: %+v", s)
			case s.State == tcpstate.Established && (!s.HasInfo || s.Cookie == 0 || s.Inode == 0):
				return fmt.Errorf("established without tcp_info, cookie or inode: %+v", s)
			case s.State == tcpstate.Listen && s.Local.Port() == 15006 && (s.UID != 1337 || s.Family != afInet6):
				return fmt.Errorf("[::1]:15006 listener: %+v", s)
			}
		}
		for st, n := range want {
			if got[st] != n {
				return fmt.Errorf("%d sockets in %s, want %d (all: %v)", got[st], st, n, got)
			}
		}
		return nil
	})
}

func TestListenMaskDoesNotReturnFlows(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:0")
	for range 20 {
		ns.DialAs(t, 0, ln.Addr().String())
		testutil.Accept(t, ln)
	}
	d := dialNS(t, ns)
	socks, err := d.Sockets(ListenMask)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].State != tcpstate.Listen {
		t.Fatalf("LISTEN dump: %d sockets %v", len(socks), socks)
	}
	n := 0
	if err := d.Each(holdingMask, func(*Socket) { n++ }); err != nil {
		t.Fatal(err)
	}
	if n != 40 {
		t.Fatalf("holding sockets %d, want 40", n)
	}
}

func TestNamespaceIsolationAndByPID(t *testing.T) {
	ns := testutil.NewNetNS(t)
	other := testutil.NewNetNS(t)
	ns.ListenAs(t, 0, "127.0.0.1:7001")
	other.ListenAs(t, 0, "127.0.0.1:7002")

	// A process born in ns: ByPID must give ns, not the caller's.
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	h, err := namespace.ByPID(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Inode() != ns.Inode {
		t.Fatalf("pid %d netns inode %d, want %d", cmd.Process.Pid, h.Inode(), ns.Inode)
	}
	d, err := Dial(h)
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

// A dump allocates a few small objects per datagram (mdlayher/netlink's
// iterators), never per socket: each message is decoded in place from the
// socket's buffer into one reused Socket. A datagram holds ~70 sockets
// with tcp_info.
func TestEachAllocatesPerDatagramNotPerSocket(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:0")
	const flows = 1000
	for range flows {
		ns.DialAs(t, 0, ln.Addr().String())
		testutil.Accept(t, ln)
	}
	d := dialNS(t, ns)
	n := 0
	count := func(*Socket) { n++ }
	allocs := testing.AllocsPerRun(5, func() {
		if err := d.Each(AllStates, count); err != nil {
			t.Fatal(err)
		}
	})
	sockets := n / 6 // AllocsPerRun runs once more to warm up
	if sockets != 2*flows+1 {
		t.Fatalf("dumped %d sockets, want %d", sockets, 2*flows+1)
	}
	t.Logf("%.0f allocations per dump of %d sockets", allocs, sockets)
	if perSocket := allocs / float64(sockets); perSocket > 0.1 {
		t.Fatalf("%.0f allocations for %d sockets (%.2f per socket), want them per datagram, not per socket", allocs, sockets, perSocket)
	}
}

// The kernel filters a dump by local port: only the listeners and flows
// on the ports asked for come back, in both families, for one port or
// several; the next unfiltered dump sees everything again.
func TestEachLocalPort(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ns.ListenAs(t, 0, "127.0.0.1:8080")
	ns.ListenAs(t, 0, "[::1]:8081")
	ln := ns.ListenAs(t, 0, "127.0.0.1:9090")
	for range 5 {
		ns.DialAs(t, 0, "127.0.0.1:9090")
		testutil.Accept(t, ln)
	}
	d := dialNS(t, ns)
	ports := func(mask StateMask, want ...uint16) []string {
		var got []string
		if err := d.EachLocalPort(mask, want, func(s *Socket) { got = append(got, fmt.Sprintf("%s %s", s.State, s.Local)) }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, tc := range []struct {
		mask  StateMask
		ports []uint16
		want  int
	}{
		{ListenMask, []uint16{8080}, 1},
		{ListenMask, []uint16{8081}, 1}, // IPv6
		{ListenMask, []uint16{8080, 8081, 7}, 2},
		{ListenMask, []uint16{7, 8081}, 1},
		{ListenMask, []uint16{7}, 0},
		{ListenMask, nil, 0},
		{AllStates, []uint16{9090}, 6}, // the listener and the accepted side
		{holdingMask, []uint16{9090, 8080, 8081}, 5},
	} {
		if got := ports(tc.mask, tc.ports...); len(got) != tc.want {
			t.Errorf("ports %v mask %#x: %d sockets %v, want %d", tc.ports, tc.mask, len(got), got, tc.want)
		}
	}
	n := 0
	if err := d.Each(AllStates, func(*Socket) { n++ }); err != nil || n != 13 {
		t.Errorf("unfiltered dump after filtered ones: %d sockets (%v), want 13", n, err)
	}
}

// SendQueue is what the peer has not acknowledged yet: a writer whose peer
// does not read keeps a queue (however long since it last sent), and it
// empties once the peer reads everything.
func TestSendQueue(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:8080")
	client := ns.DialAs(t, 0, "127.0.0.1:8080")
	server := testutil.Accept(t, ln)
	d := dialNS(t, ns)
	serverQueue := func() (uint32, error) {
		socks, err := d.Sockets(Mask(tcpstate.Established))
		if err != nil {
			return 0, err
		}
		for _, s := range socks {
			if s.Local.Port() == 8080 {
				return s.SendQueue, nil
			}
		}
		return 0, fmt.Errorf("no server socket in %v", socks)
	}
	// Fill the client's receive window and the server's send buffer: the
	// write blocks until the client reads (or the test's cleanup closes).
	const size = 16 << 20
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		server.Write(make([]byte, size))
	}()
	testutil.Eventually(t, "a send queue while the peer reads nothing", func() error {
		if q, err := serverQueue(); err != nil || q == 0 {
			return fmt.Errorf("send queue %d, %w", q, err)
		}
		return nil
	})
	if _, err := io.CopyN(io.Discard, client, size); err != nil {
		t.Fatal(err)
	}
	<-wrote
	testutil.Eventually(t, "empty send queue", func() error {
		if q, err := serverQueue(); err != nil || q != 0 {
			return fmt.Errorf("send queue %d, %w", q, err)
		}
		return nil
	})
}
