package flows

import (
	"net/netip"
	"time"

	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// TableMask is what a FlowTable tracks. TIME_WAIT sockets are left out
// because the kernel sends no event when they go (they would linger until
// the next snapshot), and request sockets (SYN_RECV) because their
// established child arrives under a new identity; neither can hold a drain
// for more than a moment. For the same reason Replace skips the other
// timewait minisockets: an orphaned FIN_WAIT2 socket becomes one (the
// kernel reports CLOSE for the full socket), and sock_diag shows it in
// FIN_WAIT2 without tcp_info.
//
// Known gap: under heavy loopback churn the kernel now and then reports
// ESTABLISHED→FIN_WAIT1 for a socket and nothing after. Such an entry
// never holds a drain; it goes when a new socket is born at its kernel
// address, or at the next reconcile.
var TableMask = sockdiag.AllStates &^ sockdiag.Mask(tcpstate.Close, tcpstate.TimeWait, tcpstate.SynRecv, tcpstate.NewSynRecv)

// Change is one state change of one socket, as the table saw it.
type Change struct {
	Time time.Time `json:"time"`
	// Flow is the socket after the change (for a socket that went away,
	// as it was, with State set to CLOSE).
	Flow     Flow           `json:"flow"`
	OldState tcpstate.State `json:"old_state"`
	NewState tcpstate.State `json:"new_state"`
	Summary  Summary        `json:"summary"`
}

// FlowTable is the live socket table: one record per socket, keyed by the
// socket cookie (or by the 5-tuple on kernels whose tracing programs cannot
// read cookies), with the per-class counts kept as records change. Its
// per-socket cost is a fixed-size record and index slots (record.go): no
// map, string or pointer per socket, and nothing allocated per socket once
// it has grown. It is not safe for concurrent use; Tracker guards it.
type FlowTable struct {
	cls       *Classifier
	useCookie bool
	recs      records
	byKey     index // cookie or 5-tuple → record
	// bySk finds records by the sock's kernel address. It serves two
	// ends: a new socket born at the address of one the table still holds
	// proves that one gone (the kernel does not always report the last
	// changes of a closing socket); and without cookies it follows a
	// socket whose 5-tuple changed (CLOSE→SYN_SENT fires before the local
	// port is chosen). Several records may carry one address; the index
	// points at the one an event last named.
	bySk  index
	seed  uint64
	epoch time.Time
	sum   Summary
	// cgroups are the cgroup ids records name (record.cgroup - 1), and
	// their indexes: a pod's sockets are in a handful.
	cgroups   []uint64
	cgroupIdx map[uint64]uint16
	// replacing is set between beginReplace and endReplace.
	replacing bool
	// Built once: the indexes' hash functions, and the TrackedFlow that
	// Each hands out.
	hashKeyFn, hashSkFn func(pos int) uint64
	scratch             TrackedFlow
}

// NewFlowTable returns an empty table attributing under p.
func NewFlowTable(p Policy, useCookie bool) *FlowTable {
	t := &FlowTable{cls: NewClassifier(p), useCookie: useCookie, byKey: newIndex(), bySk: newIndex(), seed: newSeed(), epoch: time.Now()}
	t.hashKeyFn, t.hashSkFn = t.hashRecKey, t.hashRecSk
	return t
}

// cgroupIndex is the record.cgroup for cgroup id; ids past the list's
// capacity read back as none.
func (t *FlowTable) cgroupIndex(id uint64) uint16 {
	if id == 0 {
		return 0
	}
	if i, ok := t.cgroupIdx[id]; ok {
		return i
	}
	if len(t.cgroups) >= 1<<16-1 {
		return 0
	}
	if t.cgroupIdx == nil {
		t.cgroupIdx = map[uint64]uint16{}
	}
	t.cgroups = append(t.cgroups, id)
	i := uint16(len(t.cgroups))
	t.cgroupIdx[id] = i
	return i
}

// cgroupOf is record r's cgroup id (0: none).
func (t *FlowTable) cgroupOf(r *record) uint64 {
	if r.cgroup == 0 {
		return 0
	}
	return t.cgroups[r.cgroup-1]
}

// Summary returns the current counts.
func (t *FlowTable) Summary() Summary { return t.sum }

// Listens reports whether owner has a listener on port in the table.
func (t *FlowTable) Listens(owner Owner, port uint16) bool { return t.cls.Listens(owner, port) }

// socketOf rebuilds record pos as the socket it was made from.
func (t *FlowTable) socketOf(pos int) sockdiag.Socket {
	r := t.recs.at(pos)
	s := sockdiag.Socket{
		Family: r.flags.family(), State: r.state, Local: t.localAddr(pos), Remote: t.remoteAddr(pos),
		UID: r.uid, Inode: r.inode, Cookie: r.cookie, CgroupID: t.cgroupOf(r),
		Transparent: r.flags&flTransp != 0,
	}
	if r.flags&flHasInfo != 0 {
		in := t.recs.info(pos, false)
		s.HasInfo = true
		s.LastDataSent = time.Duration(in.lastSentMS) * time.Millisecond
		s.LastDataRecv = time.Duration(in.lastRecvMS) * time.Millisecond
		s.DataSegsIn, s.DataSegsOut = in.segsIn, in.segsOut
	}
	return s
}

// flowAt fills f with record pos as a Flow.
func (t *FlowTable) flowAt(pos int, f *Flow) {
	r := t.recs.at(pos)
	f.Socket = t.socketOf(pos)
	r.class().to(f)
	f.IdleMS = -1
	if f.HasInfo {
		f.IdleMS = Idle(&f.Socket, f.Direction).Milliseconds()
	}
}

// classify attributes record pos under the current listener set.
func (t *FlowTable) classify(pos int) {
	s := t.socketOf(pos)
	r := t.recs.at(pos)
	r.setClass(t.cls.classify(&s, r.flags&flAccepted != 0))
}

func (t *FlowTable) count(delta int, r *record) {
	t.sum.add(delta, r.class(), r.state)
}

// setSocket stores what a snapshot says of a socket into record pos.
func (t *FlowTable) setSocket(pos int, s *sockdiag.Socket) {
	r := t.recs.at(pos)
	r.cookie, r.uid, r.inode, r.cgroup, r.state = s.Cookie, s.UID, s.Inode, t.cgroupIndex(s.CgroupID), s.State
	t.setTuple(pos, s.Local, s.Remote)
	r.flags = r.flags&^flFamily | familyKind(s.Family)
	r.set(flTransp, s.Transparent)
	r.set(flHasInfo, s.HasInfo)
	if s.HasInfo {
		*t.recs.info(pos, true) = packInfo(s)
	}
}

// Replace makes the table equal to a snapshot (sockets outside TableMask
// are ignored), keeping first-seen times of sockets it already had, and
// returns what changed.
func (t *FlowTable) Replace(socks []sockdiag.Socket, now time.Time) []Change {
	t.beginReplace()
	for i := range socks {
		t.replaceSocket(&socks[i])
	}
	var changes []Change
	t.endReplace(now, true, func(c *Change) { changes = append(changes, *c) })
	return changes
}

// beginReplace starts a Replace fed one socket at a time (replaceSocket,
// a dump's callback), or starts its dump again after an interrupted one.
func (t *FlowTable) beginReplace() {
	for i := range t.recs.n {
		r := t.recs.at(i)
		if !t.replacing {
			r.prevState = r.state
			r.flags |= flOld
		}
		r.flags &^= flSeen
	}
	t.replacing = true
}

// replaceSocket takes one socket of the snapshot: it updates the record in
// place or adds one. Classification waits for endReplace, when the
// listeners are all known.
func (t *FlowTable) replaceSocket(s *sockdiag.Socket) {
	if !TableMask.Has(s.State) || (!s.HasInfo && !HoldsDrain(s.State) && s.State != tcpstate.Listen) {
		return
	}
	k := t.keyOf(s.Cookie, s.Local, s.Remote)
	slot, pos := t.findKey(&k)
	if pos < 0 {
		pos = t.recs.push()
		t.setSocket(pos, s)
		t.byKey.insertAt(slot, pos)
		t.byKey.grow(t.hashKeyFn)
	} else {
		t.setSocket(pos, s)
	}
	t.recs.at(pos).flags |= flSeen
}

// endReplace finishes a Replace at now. complete says the snapshot was
// read whole: sockets it did not show are gone. After a failed dump
// (!complete) nothing is removed: the table keeps every socket, updated
// with what the dump read. emit (nil: none) is handed each change, with
// the final counts.
func (t *FlowTable) endReplace(now time.Time, complete bool, emit func(*Change)) {
	t.replacing = false
	n := t.recs.n
	keep := func(r *record) bool { return !complete || r.flags&flSeen != 0 }
	t.cls.Reset()
	for i := range n {
		if r := t.recs.at(i); keep(r) && r.state == tcpstate.Listen {
			s := t.socketOf(i)
			t.cls.AddListener(&s)
		}
	}
	t.sum = Summary{}
	at := now.Sub(t.epoch)
	for i := range n {
		r := t.recs.at(i)
		if !keep(r) {
			continue
		}
		if r.flags&flOld == 0 {
			r.setFirst(at)
		}
		t.classify(i)
		t.count(1, r)
	}
	if emit != nil {
		t.emitReplaced(now, keep, emit)
	}
	if !complete {
		for i := range n {
			t.recs.at(i).flags &^= flOld | flSeen
		}
		return
	}
	// Compact what stays (in order), forget kernel addresses (the
	// snapshot tells none), and rebuild the key index.
	w := 0
	for i := range n {
		if !keep(t.recs.at(i)) {
			continue
		}
		if w != i {
			t.recs.move(w, i)
		}
		r := t.recs.at(w)
		r.skaddr = 0
		r.flags &^= flOld | flSeen
		w++
	}
	for t.recs.n > w {
		t.recs.pop()
	}
	t.byKey.reset(w)
	for i := range w {
		t.byKey.insertAt(t.byKey.free(t.hashRecKey(i)), i)
	}
	t.bySk.reset(0)
}

// emitReplaced hands emit the changes of a Replace: new and changed
// sockets that stay, then those that went (as they were, in CLOSE).
func (t *FlowTable) emitReplaced(now time.Time, keep func(*record) bool, emit func(*Change)) {
	var ch Change
	for i := range t.recs.n {
		r := t.recs.at(i)
		old := r.flags&flOld != 0
		if !keep(r) || old && r.prevState == r.state {
			continue
		}
		ch = Change{Time: now, OldState: tcpstate.Close, NewState: r.state, Summary: t.sum}
		if old {
			ch.OldState = r.prevState
		}
		t.flowAt(i, &ch.Flow)
		emit(&ch)
	}
	for i := range t.recs.n {
		r := t.recs.at(i)
		if keep(r) || r.flags&flOld == 0 {
			continue
		}
		ch = Change{Time: now, OldState: r.state, NewState: tcpstate.Close, Summary: t.sum}
		t.flowAt(i, &ch.Flow)
		ch.Flow.State = tcpstate.Close
		emit(&ch)
	}
}

// Apply applies one probe event. It reports the change, or false when the
// event changes nothing the table tracks.
func (t *FlowTable) Apply(ev *probes.TCPEvent, now time.Time) (Change, bool) {
	if ev.OldState == tcpstate.Listen && ev.NewState == tcpstate.SynRecv {
		// Fired on the new child while it still carries the listener's
		// identity: the child shows up on its own
		// SYN_RECV→ESTABLISHED.
		return Change{}, false
	}
	local, remote := unmapPort(ev.Local), unmapPort(ev.Remote)
	k := t.keyOf(ev.Cookie, local, remote)
	pos := -1
	if ev.SkAddr != 0 {
		if _, j := t.findSk(ev.SkAddr); j >= 0 && !t.matches(j, &k) {
			if ev.OldState == tcpstate.Close {
				t.removeAt(j) // a new socket at this address: the old one is gone
			} else if !t.useCookie {
				pos = j // the same socket, its tuple changed
			}
		}
	}
	if pos < 0 {
		_, pos = t.findKey(&k)
	}
	had := pos >= 0
	if !had && !t.useCookie && local.Port() == 0 {
		// Without cookies a socket is known by its tuple, and CLOSE→SYN_SENT
		// fires before the local port is chosen: two connects to one peer
		// would share a key. It joins at SYN_SENT→ESTABLISHED.
		return Change{}, false
	}
	ch := Change{Time: now, OldState: ev.OldState, NewState: ev.NewState}
	switch {
	case !TableMask.Has(ev.NewState):
		if !had {
			return Change{}, false
		}
		ch.OldState = t.recs.at(pos).state
		t.flowAt(pos, &ch.Flow)
		ch.Flow.State = ev.NewState
		t.removeAt(pos)
		pos = -1
	case had:
		ch.OldState = t.recs.at(pos).state
		pos = t.update(pos, ev, local, remote)
		t.flowAt(pos, &ch.Flow)
	default:
		pos = t.add(ev, local, remote, now)
		t.flowAt(pos, &ch.Flow)
	}
	if ev.SkAddr != 0 {
		if pos >= 0 {
			t.setSk(pos, ev.SkAddr)
		} else {
			t.deleteSk(ev.SkAddr)
		}
	}
	ch.Summary = t.sum
	return ch, true
}

// update applies an event to the record at pos, and returns where the
// record is afterwards.
func (t *FlowTable) update(pos int, ev *probes.TCPEvent, local, remote netip.AddrPort) int {
	rekey := false
	if local.Port() != 0 && !t.useCookie {
		nk := t.keyOf(0, local, remote)
		if !t.matches(pos, &nk) {
			rekey = true
			// Another record under the new tuple is a socket whose end
			// the kernel did not report: this one replaces it.
			if _, o := t.findKey(&nk); o >= 0 {
				last := t.recs.n - 1
				t.removeAt(o)
				if pos == last {
					pos = o
				}
			}
		}
	}
	r := t.recs.at(pos)
	// A record leaving or entering LISTEN here (a socket whose earlier
	// changes were lost, found by its kernel address) changes the listener
	// set the classification reads, as add and removeAt do.
	wasListen, isListen := r.state == tcpstate.Listen, ev.NewState == tcpstate.Listen
	var oldPort uint16
	if wasListen {
		s := t.socketOf(pos)
		t.cls.RemoveListener(&s)
		oldPort = s.Local.Port()
	}
	t.count(-1, r)
	r.state = ev.NewState
	if local.Port() != 0 {
		if rekey {
			t.unindexKey(pos)
		}
		t.setTuple(pos, local, remote)
		if rekey {
			t.indexKey(pos)
		}
	}
	if ev.OldState == tcpstate.SynRecv {
		r.flags |= flAccepted
	}
	if isListen {
		s := t.socketOf(pos)
		t.cls.AddListener(&s)
	}
	t.classify(pos)
	t.count(1, r)
	if wasListen {
		t.reclassifyPort(oldPort)
	}
	if isListen && (!wasListen || r.lport != oldPort) {
		t.reclassifyPort(r.lport)
	}
	if r.skaddr != ev.SkAddr {
		t.dropSk(pos)
		r.skaddr = ev.SkAddr
	}
	return pos
}

// add makes a record for a socket an event revealed, and returns its
// position.
func (t *FlowTable) add(ev *probes.TCPEvent, local, remote netip.AddrPort, now time.Time) int {
	pos := t.recs.push()
	r := t.recs.at(pos)
	r.cookie, r.uid, r.state, r.skaddr = ev.Cookie, ev.UID, ev.NewState, ev.SkAddr
	r.setFirst(now.Sub(t.epoch))
	t.setTuple(pos, local, remote)
	r.flags |= familyKind(ev.Family)
	r.set(flAccepted, ev.OldState == tcpstate.SynRecv)
	t.indexKey(pos)
	listen := ev.NewState == tcpstate.Listen
	if listen {
		s := t.socketOf(pos)
		t.cls.AddListener(&s)
	}
	t.classify(pos)
	t.count(1, r)
	if listen {
		t.reclassifyPort(local.Port())
	}
	return pos
}

// removeAt drops record pos and forgets its listener. The last record
// moves into pos.
func (t *FlowTable) removeAt(pos int) {
	r := t.recs.at(pos)
	t.count(-1, r)
	t.unindexKey(pos)
	t.dropSk(pos)
	listen := r.state == tcpstate.Listen
	var s sockdiag.Socket
	if listen {
		s = t.socketOf(pos)
	}
	if last := t.recs.n - 1; pos != last {
		// Point the indexes at the last record's new place.
		t.byKey.slots[slotOf(&t.byKey, t.hashRecKey(last), last)] = uint32(pos) + 1
		if sk := t.recs.at(last).skaddr; sk != 0 {
			if slot, j := t.findSk(sk); j == last {
				t.bySk.slots[slot] = uint32(pos) + 1
			}
		}
		t.recs.move(pos, last)
	}
	t.recs.pop()
	t.byKey.shrink(t.hashKeyFn)
	t.bySk.shrink(t.hashSkFn)
	if listen {
		t.cls.RemoveListener(&s)
		t.reclassifyPort(s.Local.Port())
	}
}

// reclassifyPort re-attributes the flows on a local port whose listener set
// changed (a flow's direction depends on it).
func (t *FlowTable) reclassifyPort(port uint16) {
	for i := range t.recs.n {
		r := t.recs.at(i)
		if r.state == tcpstate.Listen || r.lport != port {
			continue
		}
		t.count(-1, r)
		t.classify(i)
		t.count(1, r)
	}
}

// TrackedFlow is a table entry with how long the table has known it.
type TrackedFlow struct {
	Flow
	Age time.Duration `json:"age_ns"`
}

// Each calls fn for every entry (listeners included), with its age at now,
// until fn returns false. The TrackedFlow is reused: copy what you keep;
// fn must not call the table. Each allocates nothing.
func (t *FlowTable) Each(now time.Time, fn func(*TrackedFlow) bool) {
	since := now.Sub(t.epoch)
	for i := range t.recs.n {
		t.flowAt(i, &t.scratch.Flow)
		t.scratch.Age = since - t.recs.at(i).first()
		if !fn(&t.scratch) {
			return
		}
	}
}

// Flows returns copies of the entries (listeners included) for which keep
// returns true (nil: all), with their ages at now.
func (t *FlowTable) Flows(now time.Time, keep func(*Flow) bool) []TrackedFlow {
	var out []TrackedFlow
	t.Each(now, func(f *TrackedFlow) bool {
		if keep == nil || keep(&f.Flow) {
			out = append(out, *f)
		}
		return true
	})
	return out
}

// Snapshot renders the table as a Snapshot.
func (t *FlowTable) Snapshot(now time.Time) Snapshot {
	snap := Snapshot{Taken: now, Summary: t.sum}
	t.Each(now, func(f *TrackedFlow) bool {
		if f.State == tcpstate.Listen {
			snap.Listeners = append(snap.Listeners, f.Flow)
		} else {
			snap.Flows = append(snap.Flows, f.Flow)
		}
		return true
	})
	return snap
}
