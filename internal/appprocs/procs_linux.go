package appprocs

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type proc_event procs ../../bpf/procs.c -- -I../../bpf -O2 -g -Wall -Werror

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ProcTracker follows the app's processes in one network namespace (see
// ClassifyProcs for who the app is), with one of two backends:
//
//   - ebpf (OpenProcTracker): the programs of bpf/procs.c. The
//     sched_process_fork/exec/exit programs are attached first, then a task
//     iterator takes a snapshot (the processes of the reader's PID
//     namespace, and a walk of every process of the node: the app's PID
//     namespace is not draind's in a pod), then events newer than the
//     snapshot are applied as they come: a change is seen within one
//     event, with no polling. A failed ring buffer reservation (Lost) makes
//     the tracker take a new snapshot. A snapshot whose walk was cut short
//     (see Coverage) is merged with what the tracker knows: it never
//     forgets a process then.
//   - proc (OpenProcPoller): /proc read on a period: every /proc/PID whose
//     ns/net is the namespace, then its stat and status.
//
// All methods may be called from any goroutine. Close stops every goroutine
// the tracker started.
type ProcTracker struct {
	source string
	netns  uint64
	rules  AppProcRules // the caller's, normalized
	self   int          // the calling process, as the backend numbers it
	// translate: rules' pids are in the caller's PID namespace, not the
	// backend's (eBPF outside the initial PID namespace): they are mapped
	// through nspids, and dropped when unknown.
	translate bool
	notify    chan struct{}

	mu        sync.Mutex
	procs     map[int]Process    // every process of the namespace, by PID
	nspids    map[int]procNSPids // eBPF: by PID, the caller's numbers
	pinned    bool               // pause decided (first snapshot)
	pause     Process            // the pause rule's pick, when pauseOK
	pauseOK   bool
	app       []Process // the app's, by PID
	err       error
	coverage  ProcCoverage
	hostNetNS uint64        // 0: unknown
	pending   []pendingExit // exits since the last recompute
	exits     []ProcExit    // the app's, retained (see AppExits)
	exitSeq   uint64
	exitsNew  bool // exits changed since the last recompute

	eb *procEBPF // ebpf backend
	pp *procPoll // proc backend

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ AppProcSource = (*ProcTracker)(nil)

// AppProcs returns the app's processes, by PID.
func (t *ProcTracker) AppProcs() []Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.app)
}

// Count is the number of the app's processes.
func (t *ProcTracker) Count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.app)
}

// Notify is signalled whenever the app's processes change (and when the
// tracker stops on an error, see Err). A signal is never blocked on and
// never queued twice: read Count or AppProcs after receiving it.
func (t *ProcTracker) Notify() <-chan struct{} { return t.notify }

// Source is "ebpf" or "proc".
func (t *ProcTracker) Source() string { return t.source }

// Err is the error that stopped the tracker following changes, if any.
func (t *ProcTracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Lost is the number of events the kernel dropped for a full ring buffer
// (eBPF backend; always 0 for /proc). Every loss is followed by a snapshot.
func (t *ProcTracker) Lost() uint64 {
	if t.eb == nil {
		return 0
	}
	return t.eb.lostTotal()
}

// Coverage says whether the tracker sees every process of the namespace.
// The eBPF backend is complete when its last snapshot walked every process
// of the node; the /proc backend is, as it only runs when its /proc shows
// the app.
func (t *ProcTracker) Coverage() ProcCoverage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.coverage
}

// Complete is Coverage().Complete.
func (t *ProcTracker) Complete() bool { return t.Coverage().Complete }

// HostNetNS is the inode of the initial network namespace: eBPF reads it
// from init_task at every snapshot; /proc knows it only in the host's PID
// namespace (PID 1's).
func (t *ProcTracker) HostNetNS() (inode uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hostNetNS, t.hostNetNS != 0
}

// AppExits returns how the app's processes that left since the tracker
// opened ended, oldest first: the last DefaultProcExitHistory of them, and
// the last DefaultProcMainExitHistory of the containers' main processes
// (ParentOutside) whatever came after. An exit is there by the Notify that
// follows it (eBPF: within one event); a Known status may replace an
// inferred one later, with a Notify.
func (t *ProcTracker) AppExits() []ProcExit {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.exits)
}

// Close stops the tracker and releases what it holds. Safe to call twice.
func (t *ProcTracker) Close() error {
	t.closeOnce.Do(func() {
		var errs []error
		if t.pp != nil {
			close(t.pp.stop)
		}
		if t.eb != nil && t.eb.rd != nil {
			errs = append(errs, t.eb.rd.Close()) // unblocks the reader
		}
		t.wg.Wait()
		if t.eb != nil {
			errs = append(errs, t.eb.closeObjects())
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

func newProcTracker(source string, netns uint64, rules AppProcRules) *ProcTracker {
	return &ProcTracker{
		source: source,
		netns:  netns,
		rules:  rules.normalized(),
		notify: make(chan struct{}, 1),
		procs:  make(map[int]Process),
		nspids: make(map[int]procNSPids),
	}
}

func (t *ProcTracker) signal() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// rulesLocked are the rules in the backend's pid numbering, the calling
// process included in SelfPIDs.
func (t *ProcTracker) rulesLocked() AppProcRules {
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

// pendingExit is a process gone since the last recompute.
type pendingExit struct {
	proc   Process // as tracked
	ppid   int     // its parent when it exited
	known  bool
	status ExitStatus
}

// installLocked installs a snapshot. A complete one replaces what the
// tracker knew (a process missing from it is gone: an inferred exit); an
// incomplete one only adds and updates. The first snapshot decides the
// pause process.
func (t *ProcTracker) installLocked(snap map[int]Process, nspids map[int]procNSPids, complete bool) {
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

func (t *ProcTracker) listLocked() []Process {
	all := make([]Process, 0, len(t.procs))
	for _, p := range t.procs {
		all = append(all, p)
	}
	sortProcs(all)
	return all
}

// recomputeLocked classifies every process again and reports whether the
// app's processes changed. The pinned pause process stands in for the
// pause rule.
func (t *ProcTracker) recomputeLocked() bool {
	all := t.listLocked()
	c := newProcClassifier(all, t.rulesLocked())
	classes := c.classify(t.isPinnedPause)
	app := make([]Process, 0, len(all))
	for i, p := range all {
		if classes[i] == ProcApp {
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
func (t *ProcTracker) recordExitsLocked(all []Process) {
	list := slices.Clip(all)
	for _, pe := range t.pending {
		if _, live := t.procs[pe.proc.PID]; !live {
			list = append(list, pe.proc) // descent may go through it
		}
	}
	c := newProcClassifier(list, t.rulesLocked())
	for _, pe := range t.pending {
		if c.classOf(pe.proc, t.isPinnedPause) != ProcApp {
			continue
		}
		e := ProcExit{Process: pe.proc, Known: pe.known, Status: pe.status, ParentOutside: true}
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

// trimExitsLocked keeps the last DefaultProcExitHistory exits and the last
// DefaultProcMainExitHistory whose parent was outside.
func (t *ProcTracker) trimExitsLocked() {
	if len(t.exits) <= DefaultProcExitHistory {
		return
	}
	keep := make([]bool, len(t.exits))
	mains := 0
	for i := len(t.exits) - 1; i >= 0; i-- {
		recent := len(t.exits)-i <= DefaultProcExitHistory
		main := t.exits[i].ParentOutside && mains < DefaultProcMainExitHistory
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
// gone when the walk ran) the status its event, read after, carries.
func (t *ProcTracker) knownExitLocked(p Process, status ExitStatus) {
	for i := range t.pending {
		pe := &t.pending[i]
		if !pe.known && pe.proc.PID == p.PID && pe.proc.StartTime == p.StartTime {
			pe.known, pe.status, pe.ppid = true, status, p.PPID
			return
		}
	}
	for i := len(t.exits) - 1; i >= 0; i-- {
		e := &t.exits[i]
		if !e.Known && e.PID == p.PID && e.StartTime == p.StartTime {
			e.Known, e.Status = true, status
			t.exitsNew = true
			return
		}
	}
}

func (t *ProcTracker) isPinnedPause(p Process) bool {
	return t.pauseOK && p.PID == t.pause.PID && p.StartTime == t.pause.StartTime
}

func (t *ProcTracker) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
	t.signal()
}

// allProcs returns every process of the namespace with its class (tests,
// debugging).
func (t *ProcTracker) allProcs() ([]Process, []ProcClass) {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.listLocked()
	c := newProcClassifier(all, t.rulesLocked())
	return all, c.classify(t.isPinnedPause)
}

// OpenAppProcSource opens a tracker of the app's processes in the namespace
// whose inode is netnsInode (NetNS.Inode), with the backend mode asks for:
// auto tries eBPF, then /proc. reason is one line for the log: which
// backend runs, and why the other does not.
//
// When no backend can run, the error is a *ProcUnavailableError (auto: the
// reasons of both); the caller then follows the app by its sockets.
func OpenAppProcSource(netnsInode uint64, rules AppProcRules, mode ProcMode, opts ...ProcOption) (src *ProcTracker, reason string, err error) {
	o := buildProcOptions(opts)
	pollDesc := "proc: polling " + o.procRoot + " every " + o.pollPeriod.String()
	switch mode {
	case ProcModeEBPF:
		t, err := OpenProcTracker(netnsInode, rules, opts...)
		if err != nil {
			return nil, "", err
		}
		return t, "ebpf: task iterator + sched_process_fork/exec/exit (asked for)", nil
	case ProcModeProc:
		t, err := OpenProcPoller(netnsInode, rules, opts...)
		if err != nil {
			return nil, "", err
		}
		return t, pollDesc + " (asked for)", nil
	case ProcModeAuto, "":
	default:
		return nil, "", fmt.Errorf("open app process source: unknown mode %q", mode)
	}
	t, err := OpenProcTracker(netnsInode, rules, opts...)
	if err == nil {
		return t, "ebpf: task iterator + sched_process_fork/exec/exit", nil
	}
	var ue *ProcUnavailableError
	if !errors.As(err, &ue) {
		return nil, "", err
	}
	t, perr := OpenProcPoller(netnsInode, rules, opts...)
	if perr == nil {
		return t, pollDesc + " (ebpf unavailable: " + ue.Reason + ")", nil
	}
	var pe *ProcUnavailableError
	if errors.As(perr, &pe) {
		return nil, "", &ProcUnavailableError{
			Reason: "ebpf: " + ue.Reason + "; " + pe.Reason,
			Err:    errors.Join(err, perr),
		}
	}
	return nil, "", perr
}

// ---- eBPF backend ----

// procsLoaded is what the loader takes from the spec: programs and maps,
// not the variables (the .bss only holds the pointer that makes clang emit
// struct proc_event).
type procsLoaded struct {
	procsPrograms
	procsMaps
}

type procEBPF struct {
	objs    procsLoaded
	links   []link.Link
	iter    *link.Iter
	rd      *ringbuf.Reader
	walkOut []byte // walk_out, mapped read-only
	walkCap int
	outCap  int // walk_out's records

	lostMu   sync.Mutex
	lostBuf  []uint64
	lastLost uint64 // last total read
	seenLost uint64 // total at the last snapshot (reader goroutine)
	snaps    atomic.Uint64
}

// procEventSize is sizeof(struct proc_event) in bpf/procs.c.
const procEventSize = 72

// Offsets in struct proc_event (little-endian).
const (
	peTs     = 0
	peStart  = 8
	peKind   = 16
	peTgid   = 20
	pePid    = 24
	pePpid   = 28
	peUID    = 32
	peFlags  = 36
	peNSPid  = 40
	peNSPpid = 44
	peStatus = 48
	peNetNS  = 52
	peComm   = 56
)

// Kinds of struct proc_event.
const (
	procEvTask = 1
	procEvEnd  = 2
	procEvFork = 3
	procEvExec = 4
	procEvExit = 5
)

// Flags of struct proc_event: PROC_F_WALK_* are the END record's.
const (
	procFWalkDone  = 0x10
	procFWalkCap   = 0x20
	procFWalkFull  = 0x40
	procFWalkFault = 0x80
	procFWalkOver  = procFWalkDone | procFWalkCap | procFWalkFull | procFWalkFault
)

type procEvent struct {
	ts     uint64
	kind   uint32
	flags  uint32
	status uint32 // EXIT: wait status
	netns  uint32 // END: the initial network namespace
	proc   Process
	ns     procNSPids
}

// procNSPids are a process's pid and ppid as the reader's PID namespace
// numbers them (0: not in it).
type procNSPids struct{ pid, ppid int }

func decodeProcEvent(b []byte, ev *procEvent) error {
	if len(b) < procEventSize {
		return fmt.Errorf("proc event: %d bytes, want %d", len(b), procEventSize)
	}
	le := binary.LittleEndian
	comm := b[peComm : peComm+16]
	if i := slices.Index(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	*ev = procEvent{
		ts:     le.Uint64(b[peTs:]),
		kind:   le.Uint32(b[peKind:]),
		flags:  le.Uint32(b[peFlags:]),
		status: le.Uint32(b[peStatus:]),
		netns:  le.Uint32(b[peNetNS:]),
		ns:     procNSPids{pid: int(le.Uint32(b[peNSPid:])), ppid: int(le.Uint32(b[peNSPpid:]))},
		proc: Process{
			PID:       int(le.Uint32(b[peTgid:])),
			PPID:      int(le.Uint32(b[pePpid:])),
			UID:       le.Uint32(b[peUID:]),
			Comm:      string(comm),
			StartTime: le.Uint64(b[peStart:]),
		},
	}
	return nil
}

// OpenProcTracker follows the app's processes in the namespace whose inode
// is netnsInode with the eBPF programs of bpf/procs.c. It needs BTF,
// CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) and Linux 5.8; without them
// the error is a *ProcUnavailableError. The calling process counts as
// draind's (rules.SelfPIDs), under its global pid.
func OpenProcTracker(netnsInode uint64, rules AppProcRules, opts ...ProcOption) (*ProcTracker, error) {
	if netnsInode == 0 {
		return nil, errors.New("open process tracker: netns inode 0")
	}
	o := buildProcOptions(opts)
	if o.ringSize < os.Getpagesize() || o.ringSize&(o.ringSize-1) != 0 || o.ringSize > 1<<30 {
		return nil, fmt.Errorf("open process tracker: ring size %d is not a power of two between the page size and 1 GiB", o.ringSize)
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return nil, &ProcUnavailableError{Reason: "kernel has no BTF", Err: err}
	}
	raiseMemlock()

	// The PID namespace the caller's pids are in (rules, os.Getpid()). 0
	// (unknown) matches none: the caller's pids are then ignored, and only
	// the kernel's own account of the caller stands for draind.
	var pidns uint64
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) == nil {
		pidns = st.Ino
	}
	c := procsConstants{netns: netnsInode, pidns: pidns, walkCap: uint32(o.walkCap)}
	eb, err := loadProcEBPF(c, uint32(o.ringSize), uint32(o.walkOut), o.btfCache)
	if err != nil {
		return nil, classifyProcLoadError(err)
	}
	t := newProcTracker("ebpf", netnsInode, rules)
	t.eb = eb
	t.translate = pidns != procPIDInitIno

	// The programs run from here: events are queued while the snapshot is
	// taken, and those older than it are skipped when read (all are
	// applied when the snapshot is incomplete). A loss counted from here on
	// makes the reader take another snapshot.
	eb.seenLost = eb.lostTotal()
	snap, err := eb.snapshot()
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("open process tracker: %w", err)
	}
	t.self = snap.self
	t.mu.Lock()
	t.installSnapshotLocked(snap)
	t.recomputeLocked()
	t.mu.Unlock()

	t.wg.Add(1)
	go t.readEvents(snap.since())
	return t, nil
}

// installSnapshotLocked installs an eBPF snapshot and what its walk says.
func (t *ProcTracker) installSnapshotLocked(snap *procSnapshot) {
	t.installLocked(snap.procs, snap.nspids, snap.walk.complete())
	t.coverage = snap.walk.coverage(t.eb.walkCap, t.eb.outCap)
	if snap.walk.netns != 0 {
		t.hostNetNS = uint64(snap.walk.netns)
	}
}

func loadProcEBPF(c procsConstants, ringSize, walkOut uint32, cache *btf.Cache) (_ *procEBPF, err error) {
	spec, err := loadProcs()
	if err != nil {
		return nil, err
	}
	if err := setProcsConstants(spec, c); err != nil {
		return nil, err
	}
	spec.Maps[procsMapProcEvents].MaxEntries = ringSize
	spec.Maps[procsMapWalkOut].MaxEntries = walkOut

	eb := &procEBPF{walkCap: int(c.walkCap), outCap: int(walkOut)}
	if err := spec.LoadAndAssign(&eb.objs, &ebpf.CollectionOptions{Cache: cache}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			eb.closeObjects()
		}
	}()
	// Mapped here rather than through Map.Memory, which unmaps only
	// when garbage collected: Close unmaps it.
	size := (int(walkOut)*procEventSize + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1)
	if eb.walkOut, err = unix.Mmap(eb.objs.WalkOut.FD(), 0, size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap walk_out: %w", err)
	}
	for _, p := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"sched_process_exit", eb.objs.ProcsExit},
		{"sched_process_fork", eb.objs.ProcsFork},
		{"sched_process_exec", eb.objs.ProcsExec},
	} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p.prog, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return nil, fmt.Errorf("attach tp_btf/%s: %w", p.name, err)
		}
		eb.links = append(eb.links, l)
	}
	eb.iter, err = link.AttachIter(link.IterOptions{Program: eb.objs.ProcsIter})
	if err != nil {
		return nil, fmt.Errorf("attach iter/task: %w", err)
	}
	eb.rd, err = ringbuf.NewReader(eb.objs.ProcEvents)
	if err != nil {
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	return eb, nil
}

// procsConstants are the load-time constants of bpf/procs.c.
type procsConstants struct {
	netns   uint64 // target_netns
	pidns   uint64 // reader_pidns
	walkCap uint32 // walk_cap
}

func setProcsConstants(spec *ebpf.CollectionSpec, c procsConstants) error {
	if err := spec.Variables[procsVarTargetNetns].Set(c.netns); err != nil {
		return err
	}
	if err := spec.Variables[procsVarWalkCap].Set(c.walkCap); err != nil {
		return err
	}
	return spec.Variables[procsVarReaderPidns].Set(c.pidns)
}

func (eb *procEBPF) closeObjects() error {
	var errs []error
	for _, l := range eb.links {
		errs = append(errs, l.Close())
	}
	eb.links = nil
	if eb.iter != nil {
		errs = append(errs, eb.iter.Close())
		eb.iter = nil
	}
	if eb.walkOut != nil {
		errs = append(errs, unix.Munmap(eb.walkOut))
		eb.walkOut = nil
	}
	errs = append(errs, eb.objs.procsPrograms.Close(), eb.objs.procsMaps.Close())
	return errors.Join(errs...)
}

// monotonicNow is CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns.
func monotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// procSnapshot is what one run of the task iterator found.
type procSnapshot struct {
	start  uint64 // CLOCK_MONOTONIC before the iterator ran
	procs  map[int]Process
	nspids map[int]procNSPids
	self   int // the reader's tgid, in the kernel's numbering
	walk   procWalk
}

// since is the time from which events are news to the snapshot: when its
// walk was complete, every event older than its start is reflected in it;
// otherwise none is taken for granted (0: apply every event).
func (s *procSnapshot) since() uint64 {
	if s.walk.complete() {
		return s.start
	}
	return 0
}

// procWalk is the END record's account of the walk of every process.
type procWalk struct {
	visited, written int
	flags            uint32 // PROC_F_WALK_*
	netns            uint32 // the initial network namespace
}

func (w procWalk) complete() bool { return w.flags&procFWalkOver == procFWalkDone }

func (w procWalk) coverage(walkCap, outCap int) ProcCoverage {
	var why string
	switch {
	case w.complete():
		return ProcCoverage{Complete: true, Reason: fmt.Sprintf("ebpf: every process of the node walked (%d)", w.visited)}
	case w.flags&procFWalkFault != 0:
		why = fmt.Sprintf("the kernel's process list could not be read (after %d processes)", w.visited)
	case w.flags&procFWalkFull != 0:
		why = fmt.Sprintf("the namespace has more than %d processes", outCap)
	case w.flags&procFWalkCap != 0:
		why = fmt.Sprintf("the node has more than %d processes (the walk's cap)", walkCap)
	default:
		why = fmt.Sprintf("the walk ended without a result (flags %#x)", w.flags)
	}
	return ProcCoverage{Reason: "ebpf: incomplete: " + why}
}

// snapshot runs the task iterator: the records of the reader's PID
// namespace (seq_file), then the walk's (walk_out).
func (eb *procEBPF) snapshot() (*procSnapshot, error) {
	snap := &procSnapshot{start: monotonicNow(), procs: make(map[int]Process), nspids: make(map[int]procNSPids)}
	r, err := eb.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("run task iterator: %w", err)
	}
	defer r.Close()
	eb.snaps.Add(1)
	br := bufio.NewReaderSize(r, 64*procEventSize)
	var buf [procEventSize]byte
	var ev procEvent
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errors.New("task iterator ended without its END record")
			}
			return nil, fmt.Errorf("read task iterator: %w", err)
		}
		if err := decodeProcEvent(buf[:], &ev); err != nil {
			return nil, err
		}
		switch ev.kind {
		case procEvTask:
			// Threads of one process may each report it (a leader gone):
			// the leader's fields are the same in every record.
			snap.procs[ev.proc.PID] = ev.proc
			snap.nspids[ev.proc.PID] = ev.ns
		case procEvEnd:
			snap.self = ev.proc.PID
			// END's pid and ppid fields count the walk's processes.
			snap.walk = procWalk{visited: int(binary.LittleEndian.Uint32(buf[pePid:])), written: ev.proc.PPID, flags: ev.flags, netns: ev.netns}
			return snap, eb.readWalk(snap)
		default:
			return nil, fmt.Errorf("task iterator: record kind %d", ev.kind)
		}
	}
}

// readWalk adds the walk's records (walk_out) to snap. The iterator has
// returned: the program that wrote them is done.
func (eb *procEBPF) readWalk(snap *procSnapshot) error {
	n := snap.walk.written
	if n < 0 || n > eb.outCap {
		return fmt.Errorf("task iterator: walk wrote %d records, the map holds %d", n, eb.outCap)
	}
	b := eb.walkOut[:n*procEventSize]
	var ev procEvent
	for off := 0; off < len(b); off += procEventSize {
		if err := decodeProcEvent(b[off:off+procEventSize], &ev); err != nil {
			return err
		}
		if ev.kind != procEvTask {
			return fmt.Errorf("walk_out: record kind %d", ev.kind)
		}
		snap.procs[ev.proc.PID] = ev.proc
		snap.nspids[ev.proc.PID] = ev.ns
	}
	return nil
}

func (eb *procEBPF) lostTotal() uint64 {
	eb.lostMu.Lock()
	defer eb.lostMu.Unlock()
	if eb.objs.ProcLost == nil {
		return eb.lastLost
	}
	if err := eb.objs.ProcLost.Lookup(uint32(0), &eb.lostBuf); err != nil {
		return eb.lastLost
	}
	var n uint64
	for _, v := range eb.lostBuf {
		n += v
	}
	eb.lastLost = n
	return n
}

// readEvents applies ring buffer events until Close. since: events older
// than the last snapshot are already in it.
func (t *ProcTracker) readEvents(since uint64) {
	defer t.wg.Done()
	eb := t.eb
	var rec ringbuf.Record
	var ev procEvent
	pending := 0
	for {
		err := eb.rd.ReadInto(&rec)
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) {
				return
			}
			t.fail(fmt.Errorf("read process events: %w", err))
			return
		}
		if err := decodeProcEvent(rec.RawSample, &ev); err != nil {
			t.fail(err)
			return
		}
		if ev.ts >= since {
			t.mu.Lock()
			t.applyLocked(&ev)
			t.mu.Unlock()
			pending++
		}
		if rec.Remaining > 0 && pending < 64 {
			continue // more queued: apply them before classifying
		}
		// The ring is drained: were events dropped while it was full?
		if lost := eb.lostTotal(); lost != eb.seenLost {
			snap, err := eb.snapshot()
			if err != nil {
				t.fail(fmt.Errorf("resync after lost events: %w", err))
				return
			}
			eb.seenLost = lost
			if snap.walk.complete() {
				since = snap.since()
			} // else: apply every event still queued, a walk cut short may not have seen them
			t.mu.Lock()
			t.installSnapshotLocked(snap)
			t.mu.Unlock()
			pending++
		}
		if pending > 0 {
			t.mu.Lock()
			changed := t.recomputeLocked()
			t.mu.Unlock()
			if changed {
				t.signal()
			}
			pending = 0
		}
	}
}

// applyLocked applies one event. Every event is idempotent: a snapshot and
// the events around it may say the same thing twice.
func (t *ProcTracker) applyLocked(ev *procEvent) {
	p := ev.proc
	old, ok := t.procs[p.PID]
	switch ev.kind {
	case procEvFork:
		if !ok || old.StartTime != p.StartTime {
			t.procs[p.PID], t.nspids[p.PID] = p, ev.ns
		}
	case procEvExec:
		if ok && old.StartTime == p.StartTime {
			old.Comm, old.UID = p.Comm, p.UID
			t.procs[p.PID] = old
		} else {
			t.procs[p.PID], t.nspids[p.PID] = p, ev.ns // missed its fork: learn it now
		}
	case procEvExit:
		if ok && old.StartTime == p.StartTime {
			delete(t.procs, p.PID)
			delete(t.nspids, p.PID)
			t.pending = append(t.pending, pendingExit{proc: old, ppid: p.PPID, known: true, status: ExitStatus(ev.status)})
		} else {
			t.knownExitLocked(p, ExitStatus(ev.status))
		}
	}
}

// classifyProcLoadError turns a load or attach failure into a
// *ProcUnavailableError with a one-line Reason.
func classifyProcLoadError(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) && strings.Contains(err.Error(), "iterator") {
		return &ProcUnavailableError{Reason: "kernel too old (needs 5.8 for the BPF task iterator)", Err: err}
	}
	return &ProcUnavailableError{Reason: unavailableReason(err), Err: err}
}

// ---- /proc backend ----

type procPoll struct {
	root     string
	period   time.Duration
	stop     chan struct{}
	hostView bool // /proc's pid namespace is the initial one
	scans    atomic.Uint64
	// unreadable counts the ns/net reads refused (EACCES) over all scans.
	unreadable atomic.Uint64
}

// procPIDInitIno is the inode of the initial PID namespace
// (PROC_PID_INIT_INO, include/linux/proc_ns.h): fixed since 3.8.
const procPIDInitIno = 0xEFFFFFFC

// OpenProcPoller follows the app's processes in the namespace whose inode
// is netnsInode by reading /proc every poll period (WithProcPollPeriod). It
// needs a /proc that shows the app: a PID namespace shared with it
// (shareProcessNamespace), or the host's (hostPID, or WithProcRoot on the
// host's procfs) together with CAP_SYS_PTRACE to read other processes'
// ns/net. Otherwise the error is a *ProcUnavailableError: a /proc that
// cannot see the app must not report it gone. The calling process counts
// as draind's, under its pid in that /proc.
//
// A process whose ns/net cannot be read (EACCES: another uid, an LSM)
// counts as the namespace's in a pod's shared PID namespace, where every
// process is the pod's, so that an unknown is never taken for an exit; in
// the host's, where it almost never is, it is left out.
func OpenProcPoller(netnsInode uint64, rules AppProcRules, opts ...ProcOption) (*ProcTracker, error) {
	if netnsInode == 0 {
		return nil, errors.New("open /proc process poller: netns inode 0")
	}
	o := buildProcOptions(opts)
	selfLink, err := os.Readlink(o.procRoot + "/self")
	if err != nil {
		return nil, &ProcUnavailableError{Reason: "/proc: " + o.procRoot + " is not a procfs mount", Err: err}
	}
	selfPID, err := strconv.Atoi(selfLink)
	if err != nil {
		return nil, &ProcUnavailableError{Reason: "/proc: " + o.procRoot + "/self is " + selfLink, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Stat(o.procRoot+"/"+selfLink+"/ns/pid", &st); err != nil {
		return nil, &ProcUnavailableError{Reason: "/proc: cannot read its own PID namespace", Err: err}
	}
	hostView := st.Ino == procPIDInitIno
	if hostView && !haveCapSysPtrace() {
		return nil, &ProcUnavailableError{Reason: "/proc: reading other processes' namespaces in the host PID namespace needs CAP_SYS_PTRACE"}
	}

	t := newProcTracker("proc", netnsInode, rules)
	t.self = selfPID
	t.pp = &procPoll{root: o.procRoot, period: o.pollPeriod, stop: make(chan struct{}), hostView: hostView}

	snap, err := t.pp.scan(netnsInode)
	if err != nil {
		return nil, &ProcUnavailableError{Reason: "/proc: " + err.Error(), Err: err}
	}
	t.mu.Lock()
	t.installLocked(snap, nil, true)
	t.coverage = ProcCoverage{Complete: true, Reason: "proc: every process " + o.procRoot + " shows, every " + o.pollPeriod.String()}
	if hostView && unix.Stat(o.procRoot+"/1/ns/net", &st) == nil {
		t.hostNetNS = st.Ino
	}
	t.recomputeLocked()
	if !hostView {
		// Only draind's own processes in sight: the PID namespace is not
		// the app's (no shareProcessNamespace). The pod's pause process,
		// always there, is what a shared namespace shows.
		classes := newProcClassifier(t.listLocked(), t.rulesLocked()).classify(func(Process) bool { return false })
		if !slices.ContainsFunc(classes, func(c ProcClass) bool { return c != ProcSelf }) {
			t.mu.Unlock()
			return nil, &ProcUnavailableError{Reason: "/proc: shows none of the namespace's processes but draind's own (PID namespace not shared with the app)"}
		}
	}
	t.mu.Unlock()

	t.wg.Add(1)
	go t.poll()
	return t, nil
}

// haveCapSysPtrace reports whether CAP_SYS_PTRACE is in the effective set.
func haveCapSysPtrace() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_PTRACE) != 0
}

func (t *ProcTracker) poll() {
	defer t.wg.Done()
	tk := time.NewTicker(t.pp.period)
	defer tk.Stop()
	for {
		select {
		case <-t.pp.stop:
			return
		case <-tk.C:
		}
		snap, err := t.pp.scan(t.netns)
		if err != nil {
			t.fail(fmt.Errorf("scan /proc: %w", err))
			return
		}
		t.mu.Lock()
		t.installLocked(snap, nil, true)
		changed := t.recomputeLocked()
		t.mu.Unlock()
		if changed {
			t.signal()
		}
	}
}

// scan lists the processes of the namespace.
func (pp *procPoll) scan(netns uint64) (map[int]Process, error) {
	d, err := os.Open(pp.root)
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	pp.scans.Add(1)
	snap := make(map[int]Process)
	var st unix.Stat_t
	for _, name := range names {
		if name[0] < '1' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		dir := pp.root + "/" + name
		in := false
		switch err := unix.Stat(dir+"/ns/net", &st); {
		case err == nil:
			in = st.Ino == netns
		case err == unix.EACCES || err == unix.EPERM:
			in = !pp.hostView // see OpenProcPoller
			pp.unreadable.Add(1)
		case err == unix.ENOENT:
			// Gone, a zombie, or a leader that exited before its other
			// threads (its nsproxy is gone, theirs is not).
			in = pp.threadInNS(dir, pid, netns)
		default:
			continue // ESRCH and the like: gone
		}
		if !in {
			continue
		}
		p, ok := readProcFiles(dir, pid)
		if ok {
			snap[pid] = p
		}
	}
	return snap, nil
}

// threadInNS reports whether a live thread of process pid other than the
// leader is in the namespace.
func (pp *procPoll) threadInNS(dir string, pid int, netns uint64) bool {
	d, err := os.Open(dir + "/task")
	if err != nil {
		return false
	}
	tids, _ := d.Readdirnames(-1)
	d.Close()
	var st unix.Stat_t
	for _, tid := range tids {
		if tid == strconv.Itoa(pid) {
			continue
		}
		if unix.Stat(dir+"/task/"+tid+"/ns/net", &st) == nil && st.Ino == netns {
			return true
		}
	}
	return false
}

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// readProcFiles reads a process from /proc/PID/stat (ppid, start time,
// state, comm) and /proc/PID/status (real uid). ok is false when the
// process is gone or a zombie.
func readProcFiles(dir string, pid int) (p Process, ok bool) {
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return p, false
	}
	// "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses.
	open, closing := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || closing < open {
		return p, false
	}
	fields := strings.Fields(string(stat[closing+1:]))
	// fields[0] is field 3 (state): field N is fields[N-3].
	if len(fields) < 20 {
		return p, false
	}
	if s := fields[0]; s == "Z" || s == "X" || s == "x" {
		return p, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	start, err2 := strconv.ParseUint(fields[19], 10, 64)
	if err1 != nil || err2 != nil {
		return p, false
	}
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return p, false
	}
	uid, ok := statusUID(status)
	if !ok {
		return p, false
	}
	return Process{
		PID:       pid,
		PPID:      ppid,
		UID:       uid,
		Comm:      string(stat[open+1 : closing]),
		StartTime: start * (1e9 / userHZ),
	}, true
}

// statusUID returns the real uid from /proc/PID/status ("Uid:\tR\tE\tS\tF").
func statusUID(status []byte) (uint32, bool) {
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, found := strings.CutPrefix(line, "Uid:")
		if !found {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		u, err := strconv.ParseUint(f[0], 10, 32)
		return uint32(u), err == nil
	}
	return 0, false
}
