package flows

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// simSock is one socket of a simulated namespace.
type simSock struct {
	cookie, sk    uint64
	family        uint8
	local, remote netip.AddrPort
	uid, inode    uint32
	state         tcpstate.State
	transparent   bool
}

// simNS drives a FlowTable and the reference one through the same life of
// a namespace: listeners come and go, connections open (actively, or
// accepted from a listener) and close along the kernel's state paths, some
// events are lost (the kernel's gaps), and snapshots resync both.
type simNS struct {
	rng        *rand.Rand
	useCookie  bool
	live       []*simSock
	nextPort   uint16
	nextID     uint64
	freeSk     []uint64
	now        time.Time
	nextListen uint16
	// growing favours opens; closeAll closes everything at the next step.
	growing, closeAll bool
}

var simListenPorts = []uint16{8080, 8081, 8082, 8083, 8084, 8085, 8086, 8087, 15001, 15006}

func (s *simNS) addr(family uint8, loopback bool) netip.Addr {
	switch {
	case family == afInet6 && loopback:
		return netip.MustParseAddr("::1")
	case family == afInet6:
		return netip.MustParseAddr("fd00::2")
	case loopback:
		return netip.MustParseAddr("127.0.0.1")
	}
	return netip.MustParseAddr("10.0.0.2")
}

func (s *simNS) newSock(state tcpstate.State) *simSock {
	s.nextID++
	sk := 0x1000 + s.nextID*64
	if len(s.freeSk) > 0 && s.rng.IntN(2) == 0 {
		// A kernel address reused by a new socket.
		sk, s.freeSk = s.freeSk[len(s.freeSk)-1], s.freeSk[:len(s.freeSk)-1]
	}
	fam := uint8(afInet)
	if s.rng.IntN(3) == 0 {
		fam = afInet6
	}
	uid := uint32(0)
	if s.rng.IntN(2) == 0 {
		uid = DefaultProxyUID
	}
	return &simSock{cookie: 1000 + s.nextID, sk: sk, family: fam, uid: uid, inode: uint32(s.nextID), state: state}
}

func (s *simNS) port() uint16 {
	s.nextPort++
	return 20000 + s.nextPort
}

// step changes the namespace once and returns the events it makes.
func (s *simNS) step() []probes.TCPEvent {
	ev := func(k *simSock, from, to tcpstate.State, local netip.AddrPort) probes.TCPEvent {
		e := probes.TCPEvent{SkAddr: k.sk, Cookie: k.cookie, OldState: from, NewState: to, Family: k.family, Local: local, Remote: k.remote, UID: k.uid}
		if !s.useCookie {
			e.Cookie = 0
		}
		return e
	}
	var out []probes.TCPEvent
	if s.rng.IntN(4000) == 0 || s.closeAll {
		s.closeAll = false
		// Everything closes at once (the app exits): the table shrinks.
		for _, k := range s.live {
			out = append(out, ev(k, k.state, tcpstate.Close, k.local))
			s.freeSk = append(s.freeSk, k.sk)
		}
		s.live = s.live[:0]
		return out
	}
	ops := 20
	if s.growing {
		ops = 8 // mostly opens: thousands of sockets, several chunks
	}
	switch op := s.rng.IntN(ops); {
	case op == 0: // a listener
		k := s.newSock(tcpstate.Listen)
		port := simListenPorts[s.rng.IntN(len(simListenPorts))]
		k.local = netip.AddrPortFrom(netip.IPv4Unspecified(), port)
		k.remote = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		if k.family == afInet6 {
			k.local = netip.AddrPortFrom(netip.IPv6Unspecified(), port)
			k.remote = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
		k.transparent = k.uid == DefaultProxyUID && s.rng.IntN(2) == 0
		for _, o := range s.live {
			if o.state == tcpstate.Listen && o.local == k.local {
				return nil // one listener per address here
			}
		}
		if !s.useCookie {
			// Without cookies a new listener on the address of one whose
			// close was lost takes over its record; the two tables differ
			// there by design (TestFlowTableTupleReuse): each listener
			// here has an address of its own.
			s.nextListen++
			a := [16]byte{0xfd, 15: byte(s.nextListen), 14: byte(s.nextListen >> 8)}
			k.local = netip.AddrPortFrom(netip.AddrFrom16(a), port)
			k.family, k.remote = afInet6, netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
		s.live = append(s.live, k)
		out = append(out, ev(k, tcpstate.Close, tcpstate.Listen, k.local))
	case op <= 3: // an active open
		k := s.newSock(tcpstate.Established)
		loop := s.rng.IntN(2) == 0
		peer := netip.AddrPortFrom(s.addr(k.family, loop), simListenPorts[s.rng.IntN(len(simListenPorts))])
		if !loop {
			peer = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.9"), 443)
			if k.family == afInet6 {
				peer = netip.AddrPortFrom(netip.MustParseAddr("2001:db8::9"), 443)
			}
		}
		k.remote = peer
		k.local = netip.AddrPortFrom(s.addr(k.family, loop), s.port())
		s.live = append(s.live, k)
		out = append(out, ev(k, tcpstate.Close, tcpstate.SynSent, netip.AddrPortFrom(k.local.Addr(), 0)),
			ev(k, tcpstate.SynSent, tcpstate.Established, k.local))
	case op <= 5: // a passive open, from a listener
		var ls []*simSock
		for _, o := range s.live {
			if o.state == tcpstate.Listen {
				ls = append(ls, o)
			}
		}
		if len(ls) == 0 {
			return nil
		}
		l := ls[s.rng.IntN(len(ls))]
		k := s.newSock(tcpstate.Established)
		k.family, k.uid, k.transparent = l.family, l.uid, l.transparent
		k.local = netip.AddrPortFrom(s.addr(k.family, true), l.local.Port())
		k.remote = netip.AddrPortFrom(s.addr(k.family, true), s.port())
		s.live = append(s.live, k)
		out = append(out, ev(l, tcpstate.Listen, tcpstate.SynRecv, l.local), ev(k, tcpstate.SynRecv, tcpstate.Established, k.local))
	default: // a state change on the way to closing
		if len(s.live) == 0 {
			return nil
		}
		i := s.rng.IntN(len(s.live))
		k := s.live[i]
		next := map[tcpstate.State][]tcpstate.State{
			tcpstate.Listen:      {tcpstate.Close},
			tcpstate.Established: {tcpstate.FinWait1, tcpstate.CloseWait},
			tcpstate.FinWait1:    {tcpstate.FinWait2, tcpstate.Closing},
			tcpstate.FinWait2:    {tcpstate.Close},
			tcpstate.Closing:     {tcpstate.Close},
			tcpstate.CloseWait:   {tcpstate.LastAck},
			tcpstate.LastAck:     {tcpstate.Close},
		}[k.state]
		to := next[s.rng.IntN(len(next))]
		out = append(out, ev(k, k.state, to, k.local))
		k.state = to
		if to == tcpstate.Close {
			s.live = slices.Delete(s.live, i, i+1)
			s.freeSk = append(s.freeSk, k.sk)
		}
	}
	return out
}

// snapshot is what sock_diag shows of the namespace.
func (s *simNS) snapshot() []sockdiag.Socket {
	var out []sockdiag.Socket
	for _, k := range s.live {
		so := sockdiag.Socket{Family: k.family, State: k.state, Local: k.local, Remote: k.remote, UID: k.uid, Inode: k.inode,
			Cookie: k.cookie, CgroupID: uint64(k.uid) + 7, Transparent: k.transparent}
		if s.rng.IntN(4) != 0 && k.state != tcpstate.FinWait2 {
			so.HasInfo = true
			so.LastDataSent = time.Duration(s.rng.IntN(5000)) * time.Millisecond
			so.LastDataRecv = time.Duration(s.rng.IntN(5000)) * time.Millisecond
			so.DataSegsIn, so.DataSegsOut = uint32(s.rng.IntN(3)), uint32(s.rng.IntN(3))
		}
		out = append(out, so)
	}
	s.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func flowKeyString(f *Flow) string {
	return fmt.Sprintf("%d %s %s %s", f.Cookie, f.Local, f.Remote, f.State)
}

func sortedFlows(fs []TrackedFlow) []TrackedFlow {
	slices.SortFunc(fs, func(a, b TrackedFlow) int {
		if a.Cookie != b.Cookie {
			return int(a.Cookie) - int(b.Cookie)
		}
		return strings.Compare(flowKeyString(&a.Flow), flowKeyString(&b.Flow))
	})
	return fs
}

func sortedChanges(cs []Change) []Change {
	slices.SortFunc(cs, func(a, b Change) int {
		return strings.Compare(flowKeyString(&a.Flow)+a.OldState.String(), flowKeyString(&b.Flow)+b.OldState.String())
	})
	return cs
}

// TestFlowTableMatchesReference runs long random lives of a namespace
// through the FlowTable and through the map-based table it replaced
// (reftable_test.go), with and without cookies: every change, count and
// flow must be the same.
func TestFlowTableMatchesReference(t *testing.T) {
	steps := 20000
	if testing.Short() {
		steps = 3000
	}
	for _, useCookie := range []bool{true, false} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("cookie=%v/seed=%d", useCookie, seed), func(t *testing.T) {
				p := DefaultPolicy()
				p.IdleTimeout = 2 * time.Second
				p.ProxyRemotePorts = []uint16{15000}
				sim := &simNS{rng: rand.New(rand.NewPCG(seed, 99)), useCookie: useCookie, now: time.Now()}
				got, want := NewFlowTable(p, useCookie), newRefTable(p, useCookie)
				peak := 0
				for i := range steps {
					sim.now = sim.now.Add(time.Millisecond)
					sim.growing = i < steps/4
					if i == steps/4 {
						sim.closeAll = true
					}
					peak = max(peak, got.Len())
					if sim.rng.IntN(200) == 0 {
						snap := sim.snapshot()
						g, w := got.Replace(snap, sim.now), want.Replace(snap, sim.now)
						if !slices.Equal(sortedChanges(g), sortedChanges(w)) {
							t.Fatalf("step %d: Replace changes differ:\n got %+v\nwant %+v", i, g, w)
						}
					}
					for _, ev := range sim.step() {
						if sim.rng.IntN(50) == 0 {
							continue // lost by the kernel
						}
						gc, gok := got.Apply(&ev, sim.now)
						wc, wok := want.Apply(&ev, sim.now)
						if gok != wok || gc != wc {
							t.Fatalf("step %d: event %+v:\n got %v %+v\nwant %v %+v", i, ev, gok, gc, wok, wc)
						}
					}
					if got.Summary() != want.Summary() || got.Len() != want.Len() {
						t.Fatalf("step %d: summary %+v (%d), want %+v (%d)", i, got.Summary(), got.Len(), want.Summary(), want.Len())
					}
					if i%499 == 0 {
						g, w := sortedFlows(got.Flows(sim.now, nil)), sortedFlows(want.Flows(sim.now, nil))
						for j := range min(len(g), len(w)) {
							// The table keeps first-seen times to the
							// microsecond: an age reads up to 1 µs long.
							if d := g[j].Age - w[j].Age; d >= 0 && d < time.Microsecond {
								g[j].Age = w[j].Age
							}
						}
						if !slices.Equal(g, w) {
							t.Fatalf("step %d: flows differ:\n got %+v\nwant %+v", i, g, w)
						}
						// Listens (readiness's --app-ports) agrees with the flows.
						listening := map[listenKey]bool{}
						for _, f := range w {
							if f.Direction == DirListen {
								listening[listenKey{f.Owner, f.Local.Port()}] = true
							}
						}
						for _, owner := range []Owner{OwnerApp, OwnerProxy} {
							for _, p := range simListenPorts {
								if want := listening[listenKey{owner, p}]; got.Listens(owner, p) != want {
									t.Fatalf("step %d: Listens(%v, %d) = %v, the flows say %v", i, owner, p, !want, want)
								}
							}
						}
					}
				}
				t.Logf("peak %d sockets in the table; %d live at the end, %d in the table", peak, len(sim.live), got.Len())
			})
		}
	}
}
