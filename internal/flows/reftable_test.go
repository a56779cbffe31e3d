package flows

import (
	"time"

	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// refTable is the FlowTable as it was before records (a map of entries per
// key): the oracle TestFlowTableMatchesReference compares with.

type refKey struct {
	cookie uint64
	tuple  FiveTuple
}

type refEntry struct {
	flow      Flow
	firstSeen time.Time
	skaddr    uint64 // kernel address of the sock, when an event told it
	accepted  bool   // an event saw its passive open (SYN_RECV→ESTABLISHED)
}

// refTable is the live socket table: one entry per socket, keyed by the
// socket cookie (or by the 5-tuple on kernels whose tracing programs cannot
// read cookies), with the per-class counts kept as entries change. It is not
// safe for concurrent use; Tracker guards it.
type refTable struct {
	cls       *Classifier
	useCookie bool
	m         map[refKey]*refEntry
	// bySk finds entries by the sock's kernel address. It serves two
	// ends: a new socket born at the address of one the table still holds
	// proves that one gone (the kernel does not always report the last
	// changes of a closing socket); and without cookies it follows a
	// socket whose 5-tuple changed (CLOSE→SYN_SENT fires before the local
	// port is chosen).
	bySk map[uint64]refKey
	sum  Summary
}

// NewrefTable returns an empty table attributing under p.
func newRefTable(p Policy, useCookie bool) *refTable {
	return &refTable{cls: NewClassifier(p), useCookie: useCookie, m: map[refKey]*refEntry{}, bySk: map[uint64]refKey{}}
}

func (t *refTable) key(cookie uint64, tuple FiveTuple) refKey {
	if t.useCookie {
		return refKey{cookie: cookie}
	}
	return refKey{tuple: tuple}
}

func (t *refTable) keyOf(s *sockdiag.Socket) refKey {
	return t.key(s.Cookie, FiveTuple{Local: s.Local, Remote: s.Remote})
}

// Summary returns the current counts.
func (t *refTable) Summary() Summary { return t.sum }

// Len is the number of sockets in the table.
func (t *refTable) Len() int { return len(t.m) }

// Replace makes the table equal to a snapshot (sockets outside TableMask
// are ignored), keeping first-seen times of sockets it already had, and
// returns what changed.
func (t *refTable) Replace(socks []sockdiag.Socket, now time.Time) []Change {
	old := t.m
	t.m = make(map[refKey]*refEntry, len(socks))
	clear(t.bySk)
	t.cls.Reset()
	for i := range socks {
		if socks[i].State == tcpstate.Listen {
			t.cls.AddListener(&socks[i])
		}
	}
	t.sum = Summary{}
	var changes []Change
	for i := range socks {
		s := &socks[i]
		if !TableMask.Has(s.State) || (!s.HasInfo && !HoldsDrain(s.State) && s.State != tcpstate.Listen) {
			continue
		}
		k := t.keyOf(s)
		prev, had := old[k]
		e := &refEntry{firstSeen: now}
		if had {
			e.firstSeen, e.accepted = prev.firstSeen, prev.accepted
			delete(old, k)
		}
		e.flow = t.cls.flow(s, e.accepted)
		t.m[k] = e
		t.sum.Count(&e.flow)
		if !had || prev.flow.State != s.State {
			oldState := tcpstate.Close
			if had {
				oldState = prev.flow.State
			}
			changes = append(changes, Change{Time: now, Flow: e.flow, OldState: oldState, NewState: s.State})
		}
	}
	for _, e := range old {
		gone := e.flow
		gone.State = tcpstate.Close
		changes = append(changes, Change{Time: now, Flow: gone, OldState: e.flow.State, NewState: tcpstate.Close})
	}
	for i := range changes {
		changes[i].Summary = t.sum
	}
	return changes
}

// Apply applies one probe event. It reports the change, or false when the
// event changes nothing the table tracks.
func (t *refTable) Apply(ev *probes.TCPEvent, now time.Time) (Change, bool) {
	if ev.OldState == tcpstate.Listen && ev.NewState == tcpstate.SynRecv {
		// Fired on the new child while it still carries the listener's
		// identity: the child shows up on its own
		// SYN_RECV→ESTABLISHED.
		return Change{}, false
	}
	local, remote := unmapPort(ev.Local), unmapPort(ev.Remote)
	k := t.key(ev.Cookie, FiveTuple{Local: local, Remote: remote})
	if prev, ok := t.bySk[ev.SkAddr]; ok && ev.SkAddr != 0 && prev != k {
		if ev.OldState == tcpstate.Close {
			t.remove(prev) // a new socket at this address: the old one is gone
		} else if _, exists := t.m[prev]; exists && !t.useCookie {
			k = prev // the same socket, its tuple changed
		}
	}
	e, had := t.m[k]
	if !had && !t.useCookie && local.Port() == 0 {
		// Without cookies a socket is known by its tuple, and CLOSE→SYN_SENT
		// fires before the local port is chosen: two connects to one peer
		// would share a key. It joins at SYN_SENT→ESTABLISHED.
		return Change{}, false
	}
	ch := Change{Time: now, OldState: ev.OldState, NewState: ev.NewState}
	if had {
		ch.OldState = e.flow.State
	}
	switch {
	case !TableMask.Has(ev.NewState):
		if !had {
			return Change{}, false
		}
		t.remove(k)
		ch.Flow = e.flow
		ch.Flow.State = ev.NewState
	case had:
		t.sum.Uncount(&e.flow)
		s := e.flow.Socket
		wasListen := s.State == tcpstate.Listen
		if wasListen { // a listener whose end was lost, found by its address
			t.cls.RemoveListener(&s)
		}
		oldPort := s.Local.Port()
		s.State = ev.NewState
		if local.Port() != 0 {
			s.Local, s.Remote = local, remote
		}
		if s.State == tcpstate.Listen {
			t.cls.AddListener(&s)
		}
		e.accepted = e.accepted || ev.OldState == tcpstate.SynRecv
		e.flow = t.cls.flow(&s, e.accepted)
		t.sum.Count(&e.flow)
		if wasListen {
			t.reclassifyPort(oldPort)
		}
		if s.State == tcpstate.Listen {
			t.reclassifyPort(s.Local.Port())
		}
		e.skaddr = ev.SkAddr
		if nk := t.keyOf(&s); nk != k { // cookie-less: re-key on the new tuple
			delete(t.m, k)
			t.m[nk] = e
			k = nk
		}
		ch.Flow = e.flow
	default:
		s := sockdiag.Socket{Family: ev.Family, State: ev.NewState, Local: local, Remote: remote, UID: ev.UID, Cookie: ev.Cookie}
		e = &refEntry{firstSeen: now, skaddr: ev.SkAddr, accepted: ev.OldState == tcpstate.SynRecv}
		if s.State == tcpstate.Listen {
			t.cls.AddListener(&s)
		}
		e.flow = t.cls.flow(&s, e.accepted)
		t.m[k] = e
		t.sum.Count(&e.flow)
		if s.State == tcpstate.Listen {
			t.reclassifyPort(s.Local.Port())
		}
		ch.Flow = e.flow
	}
	if ev.SkAddr != 0 {
		if _, still := t.m[k]; still {
			t.bySk[ev.SkAddr] = k
		} else {
			delete(t.bySk, ev.SkAddr)
		}
	}
	ch.Summary = t.sum
	return ch, true
}

// remove drops an entry and forgets its listener.
func (t *refTable) remove(k refKey) {
	e, ok := t.m[k]
	if !ok {
		return
	}
	t.sum.Uncount(&e.flow)
	delete(t.m, k)
	if e.skaddr != 0 && t.bySk[e.skaddr] == k {
		delete(t.bySk, e.skaddr)
	}
	if e.flow.State == tcpstate.Listen {
		t.cls.RemoveListener(&e.flow.Socket)
		t.reclassifyPort(e.flow.Local.Port())
	}
}

// reclassifyPort re-attributes the flows on a local port whose listener set
// changed (a flow's direction depends on it).
func (t *refTable) reclassifyPort(port uint16) {
	for _, e := range t.m {
		if e.flow.State == tcpstate.Listen || e.flow.Local.Port() != port {
			continue
		}
		t.sum.Uncount(&e.flow)
		e.flow = t.cls.flow(&e.flow.Socket, e.accepted)
		t.sum.Count(&e.flow)
	}
}

// Flows returns the entries (listeners included) for which keep returns
// true (nil: all), with their ages at now.
func (t *refTable) Flows(now time.Time, keep func(*Flow) bool) []TrackedFlow {
	var out []TrackedFlow
	for _, e := range t.m {
		if keep == nil || keep(&e.flow) {
			out = append(out, TrackedFlow{Flow: e.flow, Age: now.Sub(e.firstSeen)})
		}
	}
	return out
}
