package probes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
	"github.com/draind/draind/internal/testenv/testutil"
)

// --- layout and pure helpers -------------------------------------------

func TestProbeEventLayout(t *testing.T) {
	var e tcpstateEvent
	if got := int(unsafe.Sizeof(e)); got != eventSize {
		t.Fatalf("sizeof(struct event) = %d, decodeEvent assumes %d", got, eventSize)
	}
	offsets := map[string][2]uintptr{
		"ts_ns":    {unsafe.Offsetof(e.TsNs), evTs},
		"cookie":   {unsafe.Offsetof(e.Cookie), evCookie},
		"skaddr":   {unsafe.Offsetof(e.Skaddr), evSkaddr},
		"saddr":    {unsafe.Offsetof(e.Saddr), evSaddr},
		"daddr":    {unsafe.Offsetof(e.Daddr), evDaddr},
		"uid":      {unsafe.Offsetof(e.Uid), evUID},
		"sport":    {unsafe.Offsetof(e.Sport), evSport},
		"dport":    {unsafe.Offsetof(e.Dport), evDport},
		"family":   {unsafe.Offsetof(e.Family), evFamily},
		"oldstate": {unsafe.Offsetof(e.Oldstate), evOldState},
		"newstate": {unsafe.Offsetof(e.Newstate), evNewState},
	}
	for name, o := range offsets {
		if o[0] != o[1] {
			t.Errorf("offsetof(%s) = %d, decodeEvent uses %d", name, o[0], o[1])
		}
	}

	// Round trip through the generated struct's encoding.
	for _, tc := range []struct {
		family        uint16
		local, remote netip.AddrPort
	}{
		{unix.AF_INET, netip.MustParseAddrPort("10.1.2.3:8080"), netip.MustParseAddrPort("192.168.0.9:51234")},
		{unix.AF_INET6, netip.MustParseAddrPort("[fd00::1]:443"), netip.MustParseAddrPort("[fd00::2]:40000")},
		{unix.AF_INET6, netip.MustParseAddrPort("[::ffff:127.0.0.1]:80"), netip.MustParseAddrPort("[::ffff:127.0.0.1]:1")},
	} {
		in := tcpstateEvent{TsNs: 123456789, Cookie: 0xc00c1e, Skaddr: 0xffff888812345678, Uid: 1337,
			Sport: tc.local.Port(), Dport: tc.remote.Port(), Family: tc.family, Oldstate: uint8(tcpstate.Established), Newstate: uint8(tcpstate.FinWait1)}
		if tc.family == unix.AF_INET {
			a, b := tc.local.Addr().As4(), tc.remote.Addr().As4()
			copy(in.Saddr[:], a[:])
			copy(in.Daddr[:], b[:])
		} else {
			in.Saddr, in.Daddr = tc.local.Addr().As16(), tc.remote.Addr().As16()
		}
		var buf bytes.Buffer
		if err := binary.Write(&buf, binary.LittleEndian, &in); err != nil {
			t.Fatal(err)
		}
		var ev TCPEvent
		if err := decodeEvent(buf.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		want := TCPEvent{Time: 123456789, Cookie: 0xc00c1e, SkAddr: 0xffff888812345678, OldState: tcpstate.Established, NewState: tcpstate.FinWait1,
			Family: uint8(tc.family), Local: tc.local, Remote: tc.remote, UID: 1337}
		if ev != want {
			t.Errorf("decode:\n got %+v\nwant %+v", ev, want)
		}
	}
	var ev TCPEvent
	if err := decodeEvent(make([]byte, eventSize-1), &ev); err == nil {
		t.Error("short record decoded without error")
	}
	if n := testing.AllocsPerRun(100, func() { decodeEvent(make([]byte, eventSize), &ev) }); n > 1 {
		t.Errorf("decodeEvent allocates %v times", n)
	}
}

func TestCookieRefusedLog(t *testing.T) {
	for _, tc := range []struct {
		log  []string
		want bool
	}{
		// 5.10: tracing_prog_func_proto has no bpf_get_socket_cookie.
		{[]string{"0: R1=ctx(id=0,off=0,imm=0) R10=fp0", "; e->cookie = bpf_get_socket_cookie((void *)sk);", "27: (85) call bpf_get_socket_cookie#46", "unknown func bpf_get_socket_cookie#46", "processed 27 insns (limit 1000000)"}, true},
		{[]string{"program of this type cannot use helper bpf_get_socket_cookie#46"}, true},
		{[]string{"invalid func unknown#46"}, true},
		{[]string{"R1 invalid mem access 'scalar'", "processed 3 insns"}, false},
		{[]string{"unknown func bpf_ringbuf_reserve#131"}, false},
	} {
		if got := cookieRefusedLog(tc.log); got != tc.want {
			t.Errorf("cookieRefusedLog(%q) = %v, want %v", tc.log, got, tc.want)
		}
	}
	got := verifierSummary([]string{"0: (b7) r0 = 0", "1: (95) exit", "R0 !read_ok", "", "processed 2 insns (limit 1000000) max_states_per_insn 0", "verification time 5 usec", "stack depth 0"})
	if want := "0: (b7) r0 = 0 | 1: (95) exit | R0 !read_ok"; got != want {
		t.Errorf("verifierSummary = %q, want %q", got, want)
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		rel  string
		want bool
	}{
		{"6.18.44-fc-v669", true}, {"5.11.0", true}, {"5.10.0-30-amd64", false}, {"5.4", false}, {"4.19.0", false}, {"garbage", false},
	} {
		if got := kernelAtLeast(tc.rel, 5, 11); got != tc.want {
			t.Errorf("kernelAtLeast(%q, 5, 11) = %v", tc.rel, got)
		}
	}
}

func probeKernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func probeKernelAtLeast(major, minor int) bool {
	return kernelAtLeast(probeKernelRelease(), major, minor)
}

// TestOpenProbeBadOptions: every probe refuses a netns inode of 0 and a
// ring size the kernel would not take, with a plain error (not an
// UnavailableError: the caller's mistake is no reason to fall back).
func TestOpenProbeBadOptions(t *testing.T) {
	for _, probe := range []struct {
		name string
		open func(inode uint64, ringSize int) (io.Closer, error)
	}{
		{"tcpstate", func(inode uint64, n int) (io.Closer, error) { return OpenTCPState(inode, TCPStateOptions{RingSize: n}) }},
		{"procs", func(inode uint64, n int) (io.Closer, error) { return OpenProcs(inode, ProcOptions{RingSize: n}) }},
	} {
		if _, err := probe.open(0, 0); err == nil {
			t.Errorf("%s: netns inode 0 accepted", probe.name)
		}
		for _, n := range []int{100, 3 * 4096, -4096} {
			p, err := probe.open(1, n)
			if err == nil {
				p.Close()
				t.Errorf("%s: ring size %d accepted", probe.name, n)
			}
			var pue *UnavailableError
			if errors.As(err, &pue) {
				t.Errorf("%s: ring size %d: got UnavailableError %v, want a plain option error", probe.name, n, err)
			}
		}
	}
}

// --- kernel tests ----------------------------------------------------------

// openTestProbe opens the real probe on ns. As root on a kernel with BTF a
// failure fails the test: it is never a skip.
func openTestProbe(tb testing.TB, inode uint64, noCookie bool) *TCPState {
	tb.Helper()
	testutil.RequireRoot(tb)
	testutil.RequireBTF(tb)
	p, err := openTCPState(inode, TCPStateOptions{}, noCookie)
	if err != nil {
		tb.Fatalf("OpenTCPState: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// benchRingSize is the ring of the throughput benchmarks: they measure the
// event path at full speed, far past any pod's drain, not how much of a
// burst the default ring (probes.DefaultTCPRingSize, sized for what a Ready
// pod holds) absorbs; flows' BenchmarkTrackerThroughput measures that.
const benchRingSize = 8 << 20

// openTestProbeRing is openTestProbe with a ring of size bytes.
func openTestProbeRing(tb testing.TB, inode uint64, size int) *TCPState {
	tb.Helper()
	testutil.RequireRoot(tb)
	testutil.RequireBTF(tb)
	p, err := OpenTCPState(inode, TCPStateOptions{RingSize: size})
	if err != nil {
		tb.Fatalf("OpenTCPState: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// probeRec drains a probe in the background and keeps every event.
type probeRec struct {
	p    *TCPState
	mu   sync.Mutex
	evs  []TCPEvent
	err  error
	done chan struct{}
}

func recordProbe(tb testing.TB, p *TCPState) *probeRec {
	r := &probeRec{p: p, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		var ev TCPEvent
		for {
			err := p.ReadEvent(&ev)
			r.mu.Lock()
			if err != nil {
				r.err = err
				r.mu.Unlock()
				return
			}
			r.evs = append(r.evs, ev)
			r.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		p.Close()
		<-r.done
		if !errors.Is(r.err, os.ErrClosed) {
			tb.Errorf("reader ended with %v, want os.ErrClosed", r.err)
		}
	})
	return r
}

func (r *probeRec) all() []TCPEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// waitFor returns the first event matching pred, waiting up to 5 s.
func (r *probeRec) waitFor(tb testing.TB, what string, pred func(*TCPEvent) bool) TCPEvent {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		for i := range r.evs {
			if pred(&r.evs[i]) {
				ev := r.evs[i]
				r.mu.Unlock()
				return ev
			}
		}
		err := r.err
		r.mu.Unlock()
		if err != nil || time.Now().After(deadline) {
			tb.Fatalf("no event %s (reader error %v); events:\n%s", what, err, probeFmtEvents(r.all()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func probeFmtEvents(evs []TCPEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s\n", probeFmtEvent(e))
	}
	return b.String()
}

func probeFmtEvent(e TCPEvent) string {
	return fmt.Sprintf("%v->%v fam=%d %v -> %v uid=%d cookie=%#x sk=%#x", e.OldState, e.NewState, e.Family, e.Local, e.Remote, e.UID, e.Cookie, e.SkAddr)
}

func probeTrans(from, to tcpstate.State) func(*TCPEvent) bool {
	return func(e *TCPEvent) bool { return e.OldState == from && e.NewState == to }
}

func probeAnd(preds ...func(*TCPEvent) bool) func(*TCPEvent) bool {
	return func(e *TCPEvent) bool {
		for _, p := range preds {
			if !p(e) {
				return false
			}
		}
		return true
	}
}

func probeLocalIs(ap netip.AddrPort) func(*TCPEvent) bool {
	return func(e *TCPEvent) bool { return e.Local == ap }
}

func probeSkIs(sk uint64) func(*TCPEvent) bool {
	return func(e *TCPEvent) bool { return e.SkAddr == sk }
}

func probeAddrPort(a net.Addr) netip.AddrPort { return a.(*net.TCPAddr).AddrPort() }

// probeListen listens in ns as uid (fsuid is per thread; ns.Do runs fn on
// a locked thread).
func probeListen(t *testing.T, ns *testutil.NetNS, uid int, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	ns.Do(t, func() {
		if uid != 0 {
			unix.Setfsuid(uid)
			defer unix.Setfsuid(0)
		}
		ln, err = net.Listen(network, addr)
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func probeDial(t *testing.T, ns *testutil.NetNS, uid int, network, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	ns.Do(t, func() {
		if uid != 0 {
			unix.Setfsuid(uid)
			defer unix.Setfsuid(0)
		}
		c, err = net.Dial(network, addr)
	})
	if err != nil {
		t.Fatalf("dial %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// probeDiagCookie finds the socket local->remote with sock_diag and
// returns its idiag_cookie and uid.
func probeDiagCookie(t *testing.T, ns *testutil.NetNS, local, remote netip.AddrPort) (uint64, uint32) {
	t.Helper()
	h, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	d, err := sockdiag.Dial(h)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	socks, err := d.Sockets(sockdiag.AllStates)
	if err != nil {
		t.Fatal(err)
	}
	unmap := func(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }
	for _, s := range socks {
		// Compared unmapped: the events keep ::ffff:a.b.c.d as the kernel
		// holds it, whatever the sock_diag parser does.
		if unmap(s.Local) == unmap(local) && unmap(s.Remote) == unmap(remote) {
			return s.Cookie, s.UID
		}
	}
	t.Fatalf("sock_diag has no socket %v -> %v in %v", local, remote, socks)
	return 0, 0
}

// TestProbeLifecycle follows one listener and one connection through every
// state change, in IPv4, IPv6 and IPv4-mapped IPv6, and checks cookies
// against sock_diag and uids against the creating thread's fsuid.
func TestProbeLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name           string
		lnet, laddr    string // listener
		dnet, dialHost string // client
		family         uint8  // of the accepted socket
	}{
		{"ipv4", "tcp4", "127.0.0.1:0", "tcp4", "127.0.0.1", unix.AF_INET},
		{"ipv6", "tcp6", "[::1]:0", "tcp6", "::1", unix.AF_INET6},
		// A dual-stack listener: the accepted socket is AF_INET6 with
		// IPv4-mapped addresses, reported as such.
		{"ipv4-mapped", "tcp", "[::]:0", "tcp4", "127.0.0.1", unix.AF_INET6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testutil.NewNetNS(t)
			p := openTestProbe(t, ns.Inode, false)
			// Tracing programs read socket cookies from 5.12; before, the
			// probe loads its fallback by itself and events carry 0.
			if want := probeKernelAtLeast(5, 12); p.UsesCookie() != want {
				t.Fatalf("UsesCookie() = %v on %s", p.UsesCookie(), probeKernelRelease())
			}
			// diag returns the sock_diag cookie, or the 0 events carry
			// when the probe cannot read cookies.
			diag := func(local, remote netip.AddrPort) (uint64, uint32) {
				c, uid := probeDiagCookie(t, ns, local, remote)
				if !p.UsesCookie() {
					c = 0
				}
				return c, uid
			}
			r := recordProbe(t, p)

			// Listener open: CLOSE -> LISTEN, by root.
			ln := probeListen(t, ns, 0, tc.lnet, tc.laddr)
			lap := probeAddrPort(ln.Addr())
			lev := r.waitFor(t, "CLOSE->LISTEN", probeAnd(probeTrans(tcpstate.Close, tcpstate.Listen), probeLocalIs(lap)))
			lcookie, _ := diag(lap, netip.AddrPortFrom(probeZeroAddr(lap.Addr()), 0))
			if p.UsesCookie() && lev.Cookie == 0 || lev.Cookie != lcookie {
				t.Errorf("listener cookie %#x, sock_diag %#x", lev.Cookie, lcookie)
			}
			if lev.UID != 0 {
				t.Errorf("listener uid %d, want 0", lev.UID)
			}

			// Client (fsuid 1337) and accepted child.
			dst := netip.AddrPortFrom(netip.MustParseAddr(tc.dialHost), lap.Port())
			client := probeDial(t, ns, 1337, tc.dnet, dst.String())
			server, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer server.Close()
			cl, sl := probeAddrPort(client.LocalAddr()), probeAddrPort(server.LocalAddr())

			// Client: CLOSE -> SYN_SENT (before the local port is picked:
			// match on the remote end) -> ESTABLISHED.
			syn := r.waitFor(t, "client CLOSE->SYN_SENT", probeAnd(probeTrans(tcpstate.Close, tcpstate.SynSent), func(e *TCPEvent) bool { return e.Remote == dst }))
			est := r.waitFor(t, "client SYN_SENT->ESTABLISHED", probeAnd(probeTrans(tcpstate.SynSent, tcpstate.Established), probeLocalIs(cl)))
			ccookie, cuid := diag(cl, dst)
			for _, e := range []TCPEvent{syn, est} {
				if e.SkAddr != est.SkAddr || e.Cookie != ccookie || e.UID != 1337 || e.Family != probeFamilyOf(cl) {
					t.Errorf("client event %s: want sk %#x cookie %#x (sock_diag) uid 1337", probeFmtEvent(e), est.SkAddr, ccookie)
				}
			}
			if cuid != 1337 {
				t.Errorf("sock_diag uid of client %d, want 1337", cuid)
			}

			// Server child: LISTEN -> SYN_RECV (the half-built clone still
			// carries the listener's identity: no cookie) -> ESTABLISHED.
			sest := r.waitFor(t, "server SYN_RECV->ESTABLISHED", probeAnd(probeTrans(tcpstate.SynRecv, tcpstate.Established), probeLocalIs(sl)))
			srecv := r.waitFor(t, "server LISTEN->SYN_RECV", probeAnd(probeTrans(tcpstate.Listen, tcpstate.SynRecv), probeSkIs(sest.SkAddr)))
			t.Logf("LISTEN->SYN_RECV as reported: %s", probeFmtEvent(srecv))
			if srecv.Cookie != 0 {
				t.Errorf("LISTEN->SYN_RECV carries cookie %#x, want 0", srecv.Cookie)
			}
			scookie, _ := diag(sl, probeAddrPort(server.RemoteAddr()))
			if sest.Cookie != scookie || p.UsesCookie() && sest.Cookie == lcookie || sest.UID != 0 || sest.Family != tc.family ||
				sest.Remote != probeAddrPort(server.RemoteAddr()) {
				t.Errorf("server child %s: want cookie %#x (sock_diag; listener %#x) uid 0 family %d", probeFmtEvent(sest), scookie, lcookie, tc.family)
			}
			if tc.name == "ipv4-mapped" && !sest.Local.Addr().Is4In6() {
				t.Errorf("mapped child local %v: want ::ffff:127.0.0.1", sest.Local)
			}

			// Active close by the client, passive close by the server.
			client.Close()
			fw1 := r.waitFor(t, "client ESTABLISHED->FIN_WAIT1", probeAnd(probeTrans(tcpstate.Established, tcpstate.FinWait1), probeSkIs(est.SkAddr)))
			r.waitFor(t, "client FIN_WAIT1->FIN_WAIT2", probeAnd(probeTrans(tcpstate.FinWait1, tcpstate.FinWait2), probeSkIs(est.SkAddr)))
			cw := r.waitFor(t, "server ESTABLISHED->CLOSE_WAIT", probeAnd(probeTrans(tcpstate.Established, tcpstate.CloseWait), probeSkIs(sest.SkAddr)))
			server.Close()
			la := r.waitFor(t, "server CLOSE_WAIT->LAST_ACK", probeAnd(probeTrans(tcpstate.CloseWait, tcpstate.LastAck), probeSkIs(sest.SkAddr)))
			scl := r.waitFor(t, "server LAST_ACK->CLOSE", probeAnd(probeTrans(tcpstate.LastAck, tcpstate.Close), probeSkIs(sest.SkAddr)))
			ccl := r.waitFor(t, "client FIN_WAIT2->CLOSE", probeAnd(probeTrans(tcpstate.FinWait2, tcpstate.Close), probeSkIs(est.SkAddr)))
			for _, e := range []TCPEvent{fw1, ccl} {
				if e.Local != cl || e.Remote != dst || e.Cookie != ccookie || e.UID != 1337 {
					t.Errorf("client close event %s: want %v -> %v cookie %#x", probeFmtEvent(e), cl, dst, ccookie)
				}
			}
			for _, e := range []TCPEvent{cw, la, scl} {
				// Transitions to CLOSE still carry the local port
				// (inet_sport, not skc_num).
				if e.Local != sl || e.Remote != probeAddrPort(server.RemoteAddr()) || e.Cookie != scookie || e.UID != 0 {
					t.Errorf("server close event %s: want %v -> %v cookie %#x", probeFmtEvent(e), sl, server.RemoteAddr(), scookie)
				}
			}

			// Listener close.
			ln.Close()
			lcl := r.waitFor(t, "LISTEN->CLOSE", probeAnd(probeTrans(tcpstate.Listen, tcpstate.Close), probeSkIs(lev.SkAddr)))
			if lcl.Local != lap || lcl.Cookie != lcookie {
				t.Errorf("listener close %s: want local %v cookie %#x", probeFmtEvent(lcl), lap, lcookie)
			}

			// Every event is in order in time, of this test, and nothing was lost.
			evs := r.all()
			for i, e := range evs {
				if i > 0 && e.Time < evs[i-1].Time {
					// Events of different CPUs may interleave; same socket must not.
					for _, prev := range evs[:i] {
						if prev.SkAddr == e.SkAddr && prev.Time > e.Time {
							t.Errorf("event %s out of order", probeFmtEvent(e))
						}
					}
				}
				if e.Family != unix.AF_INET && e.Family != unix.AF_INET6 {
					t.Errorf("bad family in %s", probeFmtEvent(e))
				}
			}
			if n := p.Lost(); n != 0 {
				t.Errorf("Lost() = %d", n)
			}
			t.Logf("events:\n%s", probeFmtEvents(evs))
		})
	}
}

func probeZeroAddr(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

func probeFamilyOf(ap netip.AddrPort) uint8 {
	if ap.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// churn opens, uses and closes one connection to a listener of its own.
func probeChurn(t *testing.T, ns *testutil.NetNS) uint16 {
	t.Helper()
	var port uint16
	var err error
	do := func() {
		var ln net.Listener
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return
		}
		defer ln.Close()
		port = probeAddrPort(ln.Addr()).Port()
		var c net.Conn
		if c, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			return
		}
		s, aerr := ln.Accept()
		if aerr != nil {
			err = aerr
			return
		}
		c.Close()
		s.Close()
	}
	if ns == nil {
		do() // the test's own (host) namespace
	} else {
		ns.Do(t, do)
	}
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestProbeNamespaceFilter: flows in another namespace and in the host
// namespace are not reported; a second probe on the other namespace sees
// its flows only.
func TestProbeNamespaceFilter(t *testing.T) {
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := recordProbe(t, openTestProbe(t, a.Inode, false))
	rb := recordProbe(t, openTestProbe(t, b.Inode, false))

	bport := probeChurn(t, b)
	hostPort := probeChurn(t, nil)
	// Marker in a: when its close arrives, anything of b or the host would
	// have arrived too (one ring buffer per probe, but the same softirqs).
	ln := probeListen(t, a, 0, "tcp4", "127.0.0.1:0")
	mark := probeAddrPort(ln.Addr())
	ln.Close()
	ra.waitFor(t, "marker LISTEN->CLOSE", probeAnd(probeTrans(tcpstate.Listen, tcpstate.Close), probeLocalIs(mark)))
	rb.waitFor(t, "b's listener close", probeAnd(probeTrans(tcpstate.Listen, tcpstate.Close), func(e *TCPEvent) bool { return e.Local.Port() == bport }))
	time.Sleep(50 * time.Millisecond)

	for _, e := range ra.all() {
		if e.Local != mark {
			t.Errorf("probe on a reported a foreign event %s (b port %d, host port %d)", probeFmtEvent(e), bport, hostPort)
		}
	}
	if got := len(ra.all()); got != 2 {
		t.Errorf("probe on a: %d events, want 2 (the marker's):\n%s", got, probeFmtEvents(ra.all()))
	}
	for _, e := range rb.all() {
		if e.Local.Port() == mark.Port() && e.Remote.Port() == 0 && e.Local.Port() != bport {
			t.Errorf("probe on b reported a's marker: %s", probeFmtEvent(e))
		}
		if e.Local.Port() == hostPort || e.Remote.Port() == hostPort {
			t.Errorf("probe on b reported a host flow: %s", probeFmtEvent(e))
		}
	}
	// b: listener open+close, 5 client and 5 server-child changes, give or
	// take the FIN/ACK coalescing of a loopback close.
	if got := len(rb.all()); got < 10 {
		t.Errorf("probe on b: %d events, want >= 10:\n%s", got, probeFmtEvents(rb.all()))
	}
}

// TestProbeNoCookieFallback runs the pre-5.12 variant of the program on
// this kernel: no cookies, SkAddr stable per socket.
func TestProbeNoCookieFallback(t *testing.T) {
	ns := testutil.NewNetNS(t)
	p := openTestProbe(t, ns.Inode, true)
	if p.UsesCookie() {
		t.Fatal("UsesCookie() = true with the fallback forced")
	}
	r := recordProbe(t, p)
	ln := probeListen(t, ns, 0, "tcp4", "127.0.0.1:0")
	c := probeDial(t, ns, 0, "tcp4", ln.Addr().String())
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	cl := probeAddrPort(c.LocalAddr())
	est := r.waitFor(t, "client ESTABLISHED", probeAnd(probeTrans(tcpstate.SynSent, tcpstate.Established), probeLocalIs(cl)))
	r.waitFor(t, "client SYN_SENT", probeAnd(probeTrans(tcpstate.Close, tcpstate.SynSent), probeSkIs(est.SkAddr)))
	c.Close()
	s.Close()
	r.waitFor(t, "client FIN_WAIT1", probeAnd(probeTrans(tcpstate.Established, tcpstate.FinWait1), probeSkIs(est.SkAddr), probeLocalIs(cl)))
	r.waitFor(t, "client CLOSE", probeAnd(probeTrans(tcpstate.FinWait2, tcpstate.Close), probeSkIs(est.SkAddr), probeLocalIs(cl)))
	for _, e := range r.all() {
		if e.Cookie != 0 {
			t.Errorf("cookie in fallback mode: %s", probeFmtEvent(e))
		}
		if e.SkAddr == 0 {
			t.Errorf("no skaddr: %s", probeFmtEvent(e))
		}
	}
}

func TestProbeDeadlineAndClose(t *testing.T) {
	ns := testutil.NewNetNS(t)
	p := openTestProbe(t, ns.Inode, false)
	var ev TCPEvent

	// A deadline set before reading.
	start := time.Now()
	p.SetDeadline(start.Add(50 * time.Millisecond))
	if err := p.ReadEvent(&ev); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadEvent with deadline: %v", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 2*time.Second {
		t.Errorf("deadline of 50ms returned after %v", d)
	}

	// Events are still delivered after a deadline error once it is lifted.
	p.SetDeadline(time.Time{})
	ln := probeListen(t, ns, 0, "tcp4", "127.0.0.1:0")
	if err := p.ReadEvent(&ev); err != nil || ev.NewState != tcpstate.Listen {
		t.Fatalf("ReadEvent after clearing the deadline: %v %s", err, probeFmtEvent(ev))
	}
	ln.Close()
	if err := p.ReadEvent(&ev); err != nil || ev.NewState != tcpstate.Close {
		t.Fatalf("ReadEvent: %v %s", err, probeFmtEvent(ev))
	}

	// A deadline set while ReadEvent blocks unblocks it.
	errc := make(chan error, 1)
	go func() { errc <- p.ReadEvent(&TCPEvent{}) }()
	time.Sleep(50 * time.Millisecond)
	p.SetDeadline(time.Now())
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked ReadEvent after SetDeadline(now): %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("SetDeadline did not unblock ReadEvent")
	}

	// Close unblocks a blocked ReadEvent with os.ErrClosed.
	p.SetDeadline(time.Time{})
	go func() { errc <- p.ReadEvent(&TCPEvent{}) }()
	time.Sleep(50 * time.Millisecond)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("ReadEvent after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not unblock ReadEvent")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := p.ReadEvent(&ev); !errors.Is(err, os.ErrClosed) {
		t.Errorf("ReadEvent on a closed probe: %v", err)
	}
	p.SetDeadline(time.Now()) // no panic
	_ = p.Lost()
}

// TestProbeReadEventNoAlloc: reading and decoding an event allocates
// nothing (the record buffer is reused, addresses are netip values).
func TestProbeReadEventNoAlloc(t *testing.T) {
	ns := testutil.NewNetNS(t)
	p := openTestProbe(t, ns.Inode, false)
	const n = 300
	ns.Do(t, func() {
		for range n { // 2n events: CLOSE->LISTEN, LISTEN->CLOSE
			fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return
			}
			unix.Listen(fd, 1)
			unix.Close(fd)
		}
	})
	var ev TCPEvent
	p.SetDeadline(time.Now().Add(5 * time.Second))
	if err := p.ReadEvent(&ev); err != nil { // warm up
		t.Fatal(err)
	}
	var readErr error
	allocs := testing.AllocsPerRun(n, func() {
		if err := p.ReadEvent(&ev); err != nil && readErr == nil {
			readErr = err
		}
	})
	if readErr != nil {
		t.Fatal(readErr)
	}
	if allocs != 0 {
		t.Errorf("ReadEvent allocates %v times per event", allocs)
	}
}

// --- capabilities (a copy of the test binary run as another uid) ----------

const probeCapsEnv = "DRAIND_PROBE_CAPS_HELPER"

// TestProbeCapsHelper is the child side of TestProbeCapabilities.
func TestProbeCapsHelper(t *testing.T) {
	if os.Getenv(probeCapsEnv) == "" {
		t.Skip("helper for TestProbeCapabilities")
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		fmt.Println("error", err)
		return
	}
	p, err := OpenTCPState(st.Ino, TCPStateOptions{RingSize: 1 << 16})
	var pue *UnavailableError
	switch {
	case err == nil:
		fmt.Printf("ok uses_cookie=%v\n", p.UsesCookie())
		p.Close()
	case errors.As(err, &pue):
		fmt.Printf("unavailable %s\n", pue.Reason)
	default:
		fmt.Println("error", err)
	}
}

func TestProbeCapabilities(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	// The go test binary lives in a 0700 directory: copy it where uid
	// 65534 can run it.
	dir, err := os.MkdirTemp("", "draind-probe-caps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probes.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(caps ...uintptr) string {
		cmd := exec.Command(bin, "-test.run=^TestProbeCapsHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), probeCapsEnv+"=1")
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: caps,
		}
		out, err := cmd.CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "unavailable ") || strings.HasPrefix(l, "error ") {
				return l
			}
		}
		t.Fatalf("helper: %v\n%s", err, out)
		return ""
	}
	if got, want := run(unix.CAP_BPF, unix.CAP_PERFMON), fmt.Sprintf("ok uses_cookie=%v", probeKernelAtLeast(5, 12)); got != want {
		t.Errorf("uid 65534 with CAP_BPF+CAP_PERFMON: %s", got)
	}
	if got, want := run(), "unavailable no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"; got != want {
		t.Errorf("uid 65534 without capabilities: %q, want %q", got, want)
	}
	if got, want := run(unix.CAP_BPF), "unavailable no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"; got != want {
		t.Errorf("uid 65534 with CAP_BPF only: %q, want %q", got, want)
	}
}

// --- benchmarks -----------------------------------------------------------

// inNS runs fn on a thread of its own switched into h (test-local: unlike
// NetNS.Do it may be called from any goroutine and reports errors).
func probeInNS(h netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// BenchmarkProbeThroughput: several goroutines change TCP states in a
// namespace as fast as they can while one reader drains the probe.
//
//   - connect: one op is one loopback connection opened and closed (10
//     state changes: 5 for the client, 5 for the accepted child), packets
//     and softirqs included: the realistic mix.
//   - listen: one op is socket+listen+close (CLOSE->LISTEN->CLOSE, no
//     packets): the cheapest way to make state changes, to push the event
//     path itself.
//
// Reports state changes delivered per second and events lost. Every event
// is checked against the previous one of the same socket (OldState ==
// previous NewState) and at the end every socket must have reached CLOSE:
// a missing event fails the benchmark even if no counter saw it.
func BenchmarkProbeThroughput(b *testing.B) {
	b.Run("connect", func(b *testing.B) {
		ns := testutil.NewNetNS(b)
		p := openTestProbeRing(b, ns.Inode, benchRingSize)
		var ln net.Listener
		var err error
		ns.Do(b, func() { ln, err = net.Listen("tcp4", "0.0.0.0:9000") })
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { // passive close: wait for the client's FIN
					var buf [1]byte
					c.Read(buf[:])
					c.Close()
				}()
			}
		}()
		probeChurnBench(b, p, ns, 1, func(w, n int) error {
			// Each worker dials its own 127.0.0.x: a separate ephemeral
			// port space, so TIME_WAIT does not run out of ports.
			dst := "127.0.0." + strconv.Itoa(w+1) + ":9000"
			for range n {
				c, err := net.Dial("tcp4", dst)
				if err != nil {
					return err
				}
				c.Close()
			}
			return nil
		})
	})
	b.Run("listen", func(b *testing.B) {
		ns := testutil.NewNetNS(b)
		probeChurnBench(b, openTestProbeRing(b, ns.Inode, benchRingSize), ns, 0, func(w, n int) error {
			for range n {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return err
				}
				if err := unix.Listen(fd, 1); err != nil { // autobinds a port
					unix.Close(fd)
					return err
				}
				unix.Close(fd)
			}
			return nil
		})
	})
}

// probeChurnBench runs work(worker, n) on several threads in ns, b.N ops in
// all, each op starting one socket (a CLOSE->x change), while a reader
// checks every event of p. open is how many sockets the caller opened
// since p was (they stay open).
func probeChurnBench(b *testing.B, p *TCPState, ns *testutil.NetNS, open int, work func(w, n int) error) {
	// Run-time statistics of the programs, for their cost per run (a
	// kernel-wide switch, on while the returned fd is open).
	if stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer stats.Close()
	}
	var (
		mu                    sync.Mutex
		last                  = map[uint64]tcpstate.State{} // by SkAddr, until CLOSE
		total, starts, broken uint64
		firstBroken           string
		lastAt                time.Time
		readerDone            = make(chan struct{})
	)
	go func() {
		defer close(readerDone)
		var ev TCPEvent
		for p.ReadEvent(&ev) == nil {
			mu.Lock()
			total++
			lastAt = time.Now()
			prev, ok := last[ev.SkAddr]
			newSock := ev.OldState == tcpstate.Close || ev.OldState == tcpstate.Listen && ev.NewState == tcpstate.SynRecv
			if newSock && ok || !newSock && (!ok || prev != ev.OldState) {
				if broken == 0 {
					firstBroken = fmt.Sprintf("%s after %v (known %v)", probeFmtEvent(ev), prev, ok)
				}
				broken++
			}
			if ev.OldState == tcpstate.Close {
				starts++
			}
			if ev.NewState == tcpstate.Close {
				delete(last, ev.SkAddr)
			} else {
				last[ev.SkAddr] = ev.NewState
			}
			mu.Unlock()
		}
	}()
	// Sockets open before the benchmark (the connect case's listener).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(last)
		mu.Unlock()
		if n >= open {
			break
		}
	}
	mu.Lock()
	starts0 := starts
	mu.Unlock()

	workers := max(4, runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- probeInNS(ns.Handle, func() error { return work(w, n) })
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			b.Fatal(err)
		}
	}
	settled := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return starts-starts0 == uint64(b.N) && len(last) == open
	}
	for deadline := time.Now().Add(10 * time.Second); !settled() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	b.StopTimer()
	lost := p.Lost()
	covered, _ := p.covered.sum()
	st, err := p.objs.OnSetState.Stats()
	if err != nil {
		b.Fatal(err)
	}
	if st.RunCount > 0 {
		b.ReportMetric(float64(st.Runtime.Nanoseconds())/float64(st.RunCount), "primary-ns/run")
	}
	if st2, err := p.objs.OnSetStateBackup.Stats(); err == nil && st2.RunCount > 0 {
		b.ReportMetric(float64(st2.Runtime.Nanoseconds())/float64(st2.RunCount), "backup-ns/run")
	}
	p.Close()
	<-readerDone
	elapsed := lastAt.Sub(start)
	b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(total)/float64(b.N), "events/op")
	b.ReportMetric(float64(lost), "lost")
	// Changes the primary program missed (nested) and the backup sent.
	b.ReportMetric(float64(st.RecursionMisses), "primary-misses")
	b.ReportMetric(float64(covered), "backup-covered")
	// Sockets whose next change did not follow their last one: a gap no
	// counter saw (see tcpstate_linux.go, "Known gaps").
	b.ReportMetric(float64(broken), "chain-breaks")
	if lost != 0 {
		b.Errorf("lost %d events", lost)
	}
	if broken != 0 {
		b.Logf("%d events do not follow their socket's previous state; first: %s", broken, firstBroken)
	}
	if got := starts - starts0; got != uint64(b.N) || len(last) != open {
		byState := map[tcpstate.State]int{}
		for _, st := range last {
			byState[st]++
		}
		b.Logf("%d sockets started for %d ops; sockets not closed by state: %v", got, b.N, byState)
	}
}

// BenchmarkProbeCloseLatency measures close() -> event read: the time from
// just before a client's close(2) to the moment the reader goroutine,
// blocked in ReadEvent, returns ESTABLISHED->FIN_WAIT1 for that socket.
// Run with -benchtime=1000x for 1000 closes. Reports p50/p99 in µs, and
// kernel->user (event timestamp to read) p50/p99.
func BenchmarkProbeCloseLatency(b *testing.B) {
	ns := testutil.NewNetNS(b)
	p := openTestProbe(b, ns.Inode, false)

	var ln net.Listener
	var err error
	ns.Do(b, func() { ln, err = net.Listen("tcp4", "127.0.0.1:0") })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	type hit struct {
		at   time.Time
		kern time.Duration // CLOCK_MONOTONIC at read - event timestamp
	}
	var want struct {
		sync.Mutex
		port uint16
	}
	hits := make(chan hit, 1)
	go func() {
		var ev TCPEvent
		var ts unix.Timespec
		for p.ReadEvent(&ev) == nil {
			if ev.OldState != tcpstate.Established || ev.NewState != tcpstate.FinWait1 {
				continue
			}
			now := time.Now()
			unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
			want.Lock()
			ok := ev.Local.Port() == want.port
			want.Unlock()
			if ok {
				hits <- hit{now, time.Duration(ts.Nano()) - ev.Time}
			}
		}
	}()

	lat := make([]time.Duration, 0, b.N)
	kern := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		var c net.Conn
		ns.Do(b, func() { c, err = net.Dial("tcp4", ln.Addr().String()) })
		if err != nil {
			b.Fatal(err)
		}
		s := <-accepted
		want.Lock()
		want.port = probeAddrPort(c.LocalAddr()).Port()
		want.Unlock()
		time.Sleep(200 * time.Microsecond) // let the reader block again
		b.StartTimer()
		t0 := time.Now()
		c.Close()
		h := <-hits
		b.StopTimer()
		lat = append(lat, h.at.Sub(t0))
		kern = append(kern, h.kern)
		s.Close()
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(kern)
	pct := func(d []time.Duration, q float64) float64 {
		return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(lat, 0.50), "p50-µs")
	b.ReportMetric(pct(lat, 0.99), "p99-µs")
	b.ReportMetric(pct(kern, 0.50), "kern-to-read-p50-µs")
	b.ReportMetric(pct(kern, 0.99), "kern-to-read-p99-µs")
	b.ReportMetric(float64(p.Lost()), "lost")
}
