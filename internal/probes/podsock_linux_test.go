package probes

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/tcpstate"
	"github.com/draind/draind/internal/testenv/testutil"
)

// testPodCgroup makes a pod cgroup and returns it with a function that
// runs fn with this test process inside it.
func testPodCgroup(t *testing.T) (PodCgroup, func(fn func())) {
	t.Helper()
	root := testutil.Cgroup2Root(t)
	cg := testutil.NewCgroup(t, root, "draind-probes-"+t.Name())
	return PodCgroup{Path: cg.Path, ID: cg.ID}, func(fn func()) { cg.Within(t, root, fn) }
}

// openPodProbe opens a Detached probe of ns for the pod cgroup cg and
// attaches it from inside ns, as draind does at the trigger.
func openPodProbe(t *testing.T, ns *testutil.NetNS, cg PodCgroup) *TCPState {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	p, err := OpenTCPState(ns.Inode, TCPStateOptions{Detached: true, PodCgroup: &cg})
	if err != nil {
		t.Fatalf("OpenTCPState: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	if p.pod == nil {
		t.Fatalf("the pod's cgroup program did not load: %s", p.podUnavailable)
	}
	return p
}

// attachInNS attaches p from a thread in ns, as draind does at the trigger
// from the pod's namespace (the walk's), and returns its scope.
func attachInNS(tb testing.TB, ns *testutil.NetNS, p *TCPState) (TCPScope, string) {
	tb.Helper()
	var err error
	ns.Do(tb, func() { err = p.Attach() })
	if err != nil {
		tb.Fatalf("Attach: %v", err)
	}
	return p.Scope()
}

// TestPodCgroupScope: with a PodCgroup, a drain's tracking runs only for
// the pod's sockets. A flow opened before the attach and one opened after
// are both followed to CLOSE; the node-wide tracepoint is not attached;
// another namespace's changes run nothing of the probe.
func TestPodCgroupScope(t *testing.T) {
	testutil.RequireRoot(t)
	cg, inPod := testPodCgroup(t)
	ns, other := testutil.NewNetNS(t), testutil.NewNetNS(t)

	// Before the trigger: a listener and an established flow of the pod.
	var ln1 testListener
	inPod(func() {
		ln1.ln = probeListen(t, ns, 0, "tcp4", "127.0.0.1:0")
		ln1.c = probeDial(t, ns, 0, "tcp4", ln1.ln.Addr().String())
		ln1.s = testutil.Accept(t, ln1.ln)
	})

	p := openPodProbe(t, ns, cg)
	rec := recordProbe(t, p)
	scope, why := attachInNS(t, ns, p)
	if !probeKernelAtLeast(6, 12) {
		// The flow above was opened before: only the socket option of 6.12
		// turns its callbacks on.
		want := "6.12" // the socket option
		if !probeKernelAtLeast(5, 15) {
			want = "5.15" // the socket's cgroup
		}
		if scope != ScopeNode || !strings.Contains(why, want) {
			t.Fatalf("scope %q (%s), want node, %q: before 6.12 the pod's earlier sockets cannot be followed", scope, why, want)
		}
		t.Logf("kernel %s: scope node as it should be (%s)", probeKernelRelease(), why)
		return
	}
	if scope != ScopePodCgroup {
		t.Fatalf("scope %q, want %q: %s", scope, ScopePodCgroup, why)
	}
	if p.isAttached() {
		t.Fatal("the node-wide tracepoint is attached in pod scope")
	}
	if !p.Attached() {
		t.Fatal("Attached() is false after Attach")
	}

	// The earlier flow closes: both ends report it.
	client := probeAddrPort(ln1.c.LocalAddr())
	ln1.c.Close()
	rec.waitFor(t, "earlier client ESTABLISHED->FIN_WAIT1", probeAnd(probeTrans(tcpstate.Established, tcpstate.FinWait1), probeLocalIs(client)))
	ln1.s.Close()
	rec.waitFor(t, "earlier server end CLOSE_WAIT->LAST_ACK", probeAnd(probeTrans(tcpstate.CloseWait, tcpstate.LastAck), func(e *TCPEvent) bool { return e.Remote == client }))

	// A flow opened after the attach, by the pod: seen from its connect.
	var c2 testListener
	inPod(func() {
		c2.c = probeDial(t, ns, 0, "tcp4", ln1.ln.Addr().String())
		c2.s = testutil.Accept(t, ln1.ln)
	})
	local2 := probeAddrPort(c2.c.LocalAddr())
	syn := rec.waitFor(t, "new CLOSE->SYN_SENT", probeAnd(probeTrans(tcpstate.Close, tcpstate.SynSent), probeLocalIs(local2)))
	est := rec.waitFor(t, "new client ESTABLISHED", probeAnd(probeTrans(tcpstate.SynSent, tcpstate.Established), probeLocalIs(local2)))
	child := rec.waitFor(t, "new server child ESTABLISHED", probeAnd(probeTrans(tcpstate.SynRecv, tcpstate.Established), func(e *TCPEvent) bool { return e.Remote == local2 }))
	if syn.Cookie == 0 || syn.Cookie != est.Cookie || syn.SkAddr == 0 || syn.SkAddr != est.SkAddr {
		t.Errorf("client events do not share a cookie and address: %s / %s", probeFmtEvent(syn), probeFmtEvent(est))
	}
	if c, _ := probeDiagCookie(t, ns, local2, probeAddrPort(ln1.ln.Addr())); c != syn.Cookie {
		t.Errorf("client cookie %#x, sock_diag says %#x", syn.Cookie, c)
	}
	if child.Cookie == 0 || child.Cookie == syn.Cookie {
		t.Errorf("server child cookie %#x (client's %#x)", child.Cookie, syn.Cookie)
	}
	c2.c.Close()
	rec.waitFor(t, "new client FIN_WAIT1", probeAnd(probeTrans(tcpstate.Established, tcpstate.FinWait1), probeLocalIs(local2)))
	c2.s.Close()
	ln1.ln.Close()
	rec.waitFor(t, "listener LISTEN->CLOSE", probeAnd(probeTrans(tcpstate.Listen, tcpstate.Close), probeLocalIs(probeAddrPort(ln1.ln.Addr()))))

	// Another namespace of the same cgroup, and the host: nothing.
	before := len(rec.all())
	inPod(func() { probeChurn(t, other) })
	probeChurn(t, nil)
	for _, e := range rec.all()[before:] {
		t.Errorf("a change of another namespace was reported: %s", probeFmtEvent(e))
	}
}

// TestPodCgroupOutsideSocket: a socket of the pod's namespace made outside
// its cgroup (a process that joined the namespace from the node) cannot be
// seen from the cgroup: Attach falls back to the node-wide tracepoint, says
// why, and the socket's changes arrive.
func TestPodCgroupOutsideSocket(t *testing.T) {
	testutil.RequireRoot(t)
	cg, _ := testPodCgroup(t)
	ns := testutil.NewNetNS(t)
	ln := probeListen(t, ns, 0, "tcp4", "127.0.0.1:0") // this test's cgroup: outside the pod's

	p := openPodProbe(t, ns, cg)
	rec := recordProbe(t, p)
	scope, why := attachInNS(t, ns, p)
	want := "outside its cgroup"
	if !probeKernelAtLeast(5, 15) {
		want = "cannot tell which cgroup"
	}
	if scope != ScopeNode || !strings.Contains(why, want) {
		t.Fatalf("scope %q (%s), want node, %q", scope, why, want)
	}
	if !p.isAttached() || p.pod.linked() {
		t.Fatalf("after the fallback: tracepoint attached %v, cgroup program attached %v; want true, false", p.isAttached(), p.pod.linked())
	}
	ln.Close()
	rec.waitFor(t, "the outside listener's close", probeAnd(probeTrans(tcpstate.Listen, tcpstate.Close), probeLocalIs(probeAddrPort(ln.Addr()))))
}

// TestPodCgroupNotInNamespace: Attach from a thread outside the pod's
// namespace cannot walk the pod's sockets: it falls back, saying why.
func TestPodCgroupNotInNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	cg, _ := testPodCgroup(t)
	ns := testutil.NewNetNS(t)
	p := openPodProbe(t, ns, cg)
	if err := p.Attach(); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	scope, why := p.Scope()
	if scope != ScopeNode || !strings.Contains(why, "not the pod's") {
		t.Fatalf("scope %q (%s), want node: the walk ran outside the pod's namespace", scope, why)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// testListener is a listener of the pod and one flow of it: client and
// accepted ends.
type testListener struct {
	ln   net.Listener
	c, s net.Conn
}

// BenchmarkOwnChange: what the pod's own state changes cost the program
// that reports them, from the kernel's run-time statistics (ns per run): a
// loopback connect+close of the pod, in pod scope (sock_ops, which the
// kernel also runs for the ops it ignores) and in node scope (the
// tracepoint's primary).
func BenchmarkOwnChange(b *testing.B) {
	for _, scope := range []TCPScope{ScopePodCgroup, ScopeNode} {
		b.Run(string(scope), func(b *testing.B) { benchOwnChange(b, scope) })
	}
}

func benchOwnChange(b *testing.B, want TCPScope) {
	testutil.RequireRoot(b)
	root := testutil.Cgroup2Root(b)
	cg := testutil.NewCgroup(b, root, "draind-probes-bench")
	ns := testutil.NewNetNS(b)
	opts := TCPStateOptions{Detached: true, RingSize: benchRingSize}
	if want == ScopePodCgroup {
		opts.PodCgroup = &PodCgroup{Path: cg.Path, ID: cg.ID}
	}
	p, err := OpenTCPState(ns.Inode, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if scope, why := attachInNS(b, ns, p); scope != want {
		b.Skipf("scope %s (%s): pod scope needs 6.12", scope, why)
	}
	prog := p.objs.OnSetState
	if want == ScopePodCgroup {
		prog = p.pod.objs.PodsockOps
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF stats: %v", err)
	}
	defer stats.Close()
	go func() { // drain the ring; ends at p.Close
		var ev TCPEvent
		for p.ReadEvent(&ev) == nil {
		}
	}()
	before, _ := prog.Stats()
	b.ResetTimer()
	cg.Within(b, root, func() {
		ns.Do(b, func() {
			ln, lerr := net.Listen("tcp4", "127.0.0.1:0")
			if lerr != nil {
				err = lerr
				return
			}
			defer ln.Close()
			for range b.N {
				c, derr := net.Dial("tcp4", ln.Addr().String())
				if derr != nil {
					err = derr
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
		})
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	after, _ := prog.Stats()
	if runs := after.RunCount - before.RunCount; runs > 0 {
		b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), "ns/run")
		b.ReportMetric(float64(runs)/float64(b.N), "runs/op")
	}
}
