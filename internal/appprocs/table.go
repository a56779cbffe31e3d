package appprocs

import (
	"slices"
	"sync"
	"sync/atomic"
)

// table is what both backends keep and how they keep it: every process of
// the namespace, the pause process pinned on the first snapshot, the app's
// processes and their exits. A backend changes it under mu (the *Locked
// methods: snapshots installed, events applied) and then publishes; the
// exported methods are the Source's readers, promoted into each backend.
type table struct {
	rules Rules // the caller's, normalized
	self  int   // the calling process, as the backend numbers it
	// translate is true when rules' pids are in the caller's PID namespace,
	// not the backend's (eBPF outside the initial PID namespace): they are
	// mapped through nspids, and dropped when unknown.
	translate bool
	changed   chan struct{}

	mu        sync.Mutex
	procs     map[int]Process // every process of the namespace, by PID
	nspids    map[int]nsPIDs  // eBPF: by PID, the caller's numbers
	pinned    bool            // pause decided (first snapshot)
	pause     Process         // the pause rule's pick, when pauseOK
	pauseOK   bool
	app       []Process             // the app's, by PID
	err       atomic.Pointer[error] // what stopped Run; set once
	coverage  Coverage
	hostNetNS uint64        // 0: unknown
	pending   []pendingExit // exits since the last recompute
	exits     []Exit        // the app's, retained (see Exits)
	exitSeq   uint64
	exitsNew  bool   // exits changed since the last recompute
	via       Via    // how changes are followed ("": dormant)
	viaReason string // why that way

	// dormant is true while opened WithDormant and not started; refresh
	// then reads the kernel for each question (refreshMu: one at a time,
	// and not with Start).
	dormant   atomic.Bool
	refreshMu sync.Mutex
	refresh   func() error // the backend's snapshot, installed
}

// nsPIDs are a process's pid and ppid as the caller's PID namespace
// numbers them (0: not in it).
type nsPIDs struct{ pid, ppid int }

// pendingExit is a process gone since the last recompute.
type pendingExit struct {
	proc   Process // as tracked
	ppid   int     // its parent when it exited
	known  bool
	status ExitStatus
}

func newTable(rules Rules) *table {
	return &table{
		rules:   rules.normalized(),
		changed: make(chan struct{}, 1),
		procs:   make(map[int]Process),
		nspids:  make(map[int]nsPIDs),
	}
}

// refreshIfDormant takes a snapshot when the source follows nothing.
func (t *table) refreshIfDormant() {
	if !t.dormant.Load() {
		return
	}
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
	if t.dormant.Load() && t.refresh != nil {
		_ = t.refresh() // on failure the last snapshot stands
	}
}

// Live reports whether the source follows changes.
func (t *table) Live() bool { return !t.dormant.Load() }

// start runs attach (nil: nothing to attach), then refresh, and leaves
// dormancy: the backends' Start.
func (t *table) start(attach func() error) error {
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
	if !t.dormant.Load() {
		return nil
	}
	if attach != nil {
		if err := attach(); err != nil {
			return err
		}
	}
	if err := t.refresh(); err != nil {
		return err
	}
	t.dormant.Store(false)
	return nil
}

// Following says how the source follows changes, and why that way.
func (t *table) Following() (Via, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.via, t.viaReason
}

func (t *table) setFollowing(via Via, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.via, t.viaReason = via, reason
}

// Processes returns the app's processes, by PID.
func (t *table) Processes() []Process {
	t.refreshIfDormant()
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.app)
}

// Count is the number of the app's processes.
func (t *table) Count() int {
	t.refreshIfDormant()
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.app)
}

// Changed is signalled whenever the app's processes or exits change, and
// when Run fails.
func (t *table) Changed() <-chan struct{} { return t.changed }

// Err is the error that stopped Run, if any.
func (t *table) Err() error {
	if p := t.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Coverage says whether the last snapshot saw every process.
func (t *table) Coverage() Coverage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.coverage
}

// HostNetNS is the inode of the initial network namespace, when known.
func (t *table) HostNetNS() (inode uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hostNetNS, t.hostNetNS != 0
}

// Containers returns draind's and the proxy's containers (see Source).
func (t *table) Containers() []Container {
	t.refreshIfDormant()
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.listLocked()
	var out []Container
	for mnt, class := range Containers(all, t.rulesLocked()) {
		c := Container{MountNS: mnt, Class: class}
		for _, p := range all {
			if p.MountNS == mnt {
				c.Processes = append(c.Processes, p)
			}
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Container) int { return int(a.Class) - int(b.Class) })
	return out
}

// Exits returns how the app's processes that left ended, oldest first.
func (t *table) Exits() []Exit {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.exits)
}

func (t *table) signal() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// update runs change (if any) under the lock, classifies again and
// signals when the app's processes or exits changed.
func (t *table) update(change func()) {
	t.mu.Lock()
	if change != nil {
		change()
	}
	changed := t.recomputeLocked()
	t.mu.Unlock()
	if changed {
		t.signal()
	}
}

// fail records the error that stops Run, signals it and returns it.
func (t *table) fail(err error) error {
	t.err.CompareAndSwap(nil, &err)
	t.signal()
	return err
}

// rulesLocked are the rules in the backend's pid numbering, the calling
// process included in SelfPIDs.
func (t *table) rulesLocked() Rules {
	r := t.rules
	if t.translate {
		m := make(map[int]int, 2*len(t.nspids))
		for g, n := range t.nspids {
			if n.pid > 0 {
				m[n.pid] = g
			}
			if p, ok := t.procs[g]; ok && n.ppid > 0 {
				m[n.ppid] = p.PPID
			}
		}
		tr := func(pids []int) []int {
			var out []int
			for _, p := range pids {
				if g, ok := m[p]; ok {
					out = append(out, g)
				}
			}
			return out
		}
		r.SelfPIDs, r.ProxyPIDs, r.PausePIDs = tr(r.SelfPIDs), tr(r.ProxyPIDs), tr(r.PausePIDs)
	} else {
		r.SelfPIDs = slices.Clone(r.SelfPIDs)
	}
	if t.self > 0 {
		r.SelfPIDs = append(r.SelfPIDs, t.self)
	}
	return r
}

// installLocked installs a snapshot. A complete one replaces what the
// table knew (a process missing from it is gone: an inferred exit); an
// incomplete one only adds and updates. The first snapshot decides the
// pause process.
func (t *table) installLocked(snap map[int]Process, nspids map[int]nsPIDs, complete bool) {
	for pid, old := range t.procs {
		p, ok := snap[pid]
		if ok && p.StartTime == old.StartTime {
			continue
		}
		if ok || complete {
			// Gone, or its pid reused by a process the snapshot found.
			t.pending = append(t.pending, pendingExit{proc: old, ppid: old.PPID})
			delete(t.procs, pid)
			delete(t.nspids, pid)
		}
	}
	for pid, p := range snap {
		t.procs[pid] = p
		if n, ok := nspids[pid]; ok {
			t.nspids[pid] = n
		}
	}
	if !t.pinned {
		t.pinned = true
		t.pause, t.pauseOK = PauseProcess(t.listLocked(), t.rulesLocked())
	}
}

// bornLocked learns a process from its birth (or its first sign of life):
// it replaces one that held its pid before.
func (t *table) bornLocked(p Process, ns nsPIDs) {
	if old, ok := t.procs[p.PID]; !ok || old.StartTime != p.StartTime {
		t.procs[p.PID], t.nspids[p.PID] = p, ns
	}
}

// execLocked takes a process's new comm and uid (execve); a process not
// known yet (its birth missed) is learnt.
func (t *table) execLocked(p Process, ns nsPIDs) {
	if old, ok := t.procs[p.PID]; ok && old.StartTime == p.StartTime {
		// runc's exec joins the container's namespaces before it execs.
		old.Comm, old.UID = p.Comm, p.UID
		if p.MountNS != 0 {
			old.MountNS = p.MountNS
		}
		t.procs[p.PID] = old
		return
	}
	t.procs[p.PID], t.nspids[p.PID] = p, ns
}

// exitedLocked ends a process with the status the kernel gave; p.PPID is
// its parent when it exited. An exit already inferred from a snapshot
// gets the status. A process the table never had is recorded from its
// exit alone: it was born and gone before a snapshot could see it (before
// the first one, or between the attach and the walk's visit), and its exit
// event is all there is of it — a container's main process that ran
// before draind watched is seen so, with its status.
func (t *table) exitedLocked(p Process, status ExitStatus) {
	old, ok := t.procs[p.PID]
	if !ok || old.StartTime != p.StartTime {
		if !t.knownExitLocked(p, status) {
			t.pending = append(t.pending, pendingExit{proc: p, ppid: p.PPID, known: true, status: status})
		}
		return
	}
	delete(t.procs, p.PID)
	delete(t.nspids, p.PID)
	t.pending = append(t.pending, pendingExit{proc: old, ppid: p.PPID, known: true, status: status})
}

func (t *table) listLocked() []Process {
	all := make([]Process, 0, len(t.procs))
	for _, p := range t.procs {
		all = append(all, p)
	}
	slices.SortFunc(all, func(a, b Process) int { return a.PID - b.PID })
	return all
}

// recomputeLocked classifies every process again and reports whether the
// app's processes or exits changed. The pinned pause process stands in
// for the pause rule.
func (t *table) recomputeLocked() bool {
	all := t.listLocked()
	classes := newClassifier(all, t.rulesLocked()).classify(t.isPinnedPause)
	app := make([]Process, 0, len(all))
	for i, p := range all {
		if classes[i] == ClassApp {
			app = append(app, p)
		}
	}
	changed := !slices.Equal(app, t.app)
	t.app = app
	if len(t.pending) > 0 {
		t.recordExitsLocked(all)
	}
	changed = changed || t.exitsNew
	t.exitsNew = false
	return changed
}

// recordExitsLocked classifies the pending exits against the processes
// that remain (all) and records the app's.
func (t *table) recordExitsLocked(all []Process) {
	list := slices.Clip(all)
	for _, pe := range t.pending {
		if _, live := t.procs[pe.proc.PID]; !live {
			list = append(list, pe.proc) // descent may go through it
		}
	}
	c := newClassifier(list, t.rulesLocked())
	for _, pe := range t.pending {
		if c.classOf(pe.proc, t.isPinnedPause) != ClassApp {
			continue
		}
		e := Exit{Process: pe.proc, Known: pe.known, Status: pe.status, ParentOutside: true}
		e.PPID = pe.ppid
		if i, ok := c.byPID[pe.ppid]; ok && pe.ppid != pe.proc.PID && list[i].StartTime <= pe.proc.StartTime {
			e.ParentOutside = false
		}
		t.exitSeq++
		e.Seq = t.exitSeq
		t.exits = append(t.exits, e)
		t.exitsNew = true
	}
	t.pending = t.pending[:0]
	t.trimExitsLocked()
}

// trimExitsLocked keeps the last ExitHistory exits and the last
// MainExitHistory whose parent was outside.
func (t *table) trimExitsLocked() {
	if len(t.exits) <= ExitHistory {
		return
	}
	keep := make([]bool, len(t.exits))
	mains := 0
	for i := len(t.exits) - 1; i >= 0; i-- {
		recent := len(t.exits)-i <= ExitHistory
		main := t.exits[i].ParentOutside && mains < MainExitHistory
		if t.exits[i].ParentOutside {
			mains++
		}
		keep[i] = recent || main
	}
	n := 0
	for i, e := range t.exits {
		if keep[i] {
			t.exits[n] = e
			n++
		}
	}
	clear(t.exits[n:])
	t.exits = t.exits[:n]
}

// knownExitLocked gives an exit inferred from a snapshot (the process was
// gone when the walk ran) the status its event, read after, carries. It
// reports whether the process's exit was there already, inferred or known.
func (t *table) knownExitLocked(p Process, status ExitStatus) bool {
	for i := range t.pending {
		pe := &t.pending[i]
		if pe.proc.PID == p.PID && pe.proc.StartTime == p.StartTime {
			if !pe.known {
				pe.known, pe.status, pe.ppid = true, status, p.PPID
			}
			return true
		}
	}
	for i := len(t.exits) - 1; i >= 0; i-- {
		e := &t.exits[i]
		if e.PID == p.PID && e.StartTime == p.StartTime {
			if !e.Known {
				e.Known, e.Status = true, status
				t.exitsNew = true
			}
			return true
		}
	}
	return false
}

func (t *table) isPinnedPause(p Process) bool {
	return t.pauseOK && p.PID == t.pause.PID && p.StartTime == t.pause.StartTime
}

// classified returns every process of the namespace with its class (tests,
// debugging).
func (t *table) classified() ([]Process, []Class) {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.listLocked()
	return all, newClassifier(all, t.rulesLocked()).classify(t.isPinnedPause)
}
