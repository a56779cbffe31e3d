package appprocs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/probes"
)

// ebpfSource is the eBPF backend, over probes.Procs. Its programs are
// attached first, then a snapshot is taken (the processes of draind's PID
// namespace, and a walk of every process of the node: the app's PID
// namespace is not draind's in a pod); Run then applies the events newer
// than it as they come: a change is seen within one event, with no
// polling. An exit older than the snapshot is applied too: the snapshot
// says the process is gone, not how it ended. A failed ring buffer
// reservation (Lost) makes Run take a new snapshot. A snapshot whose walk
// was cut short (see Coverage) is merged with what the table knows: it
// never forgets a process then.
//
// Started with the pod's cgroups (WithPodCgroup), it attaches nothing:
// Run takes a snapshot whenever one of the pod's containers' cgroups
// fills or empties (cgroupWatch), and exits are inferred, without status.
type ebpfSource struct {
	*table
	probe *probes.Procs
	// Run's: births and execs older than since are in the last snapshot
	// (exits are applied whenever they happened); seenLost is
	// Lost at the last snapshot.
	since    time.Duration
	seenLost uint64
	snaps    atomic.Uint64 // snapshots taken (tests)
	// podCgroup, ownCgroup: WithPodCgroup's directories ("": none). watch
	// is set by Start when it follows the pod's cgroups instead of
	// attaching fork, exec and exit (see cgroupWatch).
	podCgroup, ownCgroup string
	watch                *cgroupWatch
	resyncPeriod         time.Duration // cgroupResyncPeriod (tests change it)
}

// openEBPF loads the programs and takes the first snapshot. It needs BTF,
// CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) and Linux 5.8; without them
// the error is an *UnavailableError. The calling process counts as
// draind's (rules.SelfPIDs), under its global pid.
func openEBPF(netnsInode uint64, rules Rules, o options) (Source, error) {
	probe, err := probes.OpenProcs(netnsInode, o.probe)
	if err != nil {
		var pu *probes.UnavailableError
		if errors.As(err, &pu) {
			return nil, &UnavailableError{Reason: pu.Reason, Err: pu.Err}
		}
		return nil, err
	}
	if rules.SelfMountNS == 0 {
		rules.SelfMountNS = ownMountNS("/proc/self/ns/mnt")
	}
	s := &ebpfSource{table: newTable(rules), probe: probe, resyncPeriod: cgroupResyncPeriod}
	s.translate = probe.PIDNS() != namespace.InitialPIDInode

	// The programs run from here: events are queued while the snapshot is
	// taken, and births and execs older than it are skipped when read (all
	// are applied when the snapshot is incomplete; exits always are). A
	// loss counted from here on makes Run take another snapshot.
	s.seenLost = probe.Lost()
	snap, err := s.snapshot()
	if err != nil {
		probe.Close()
		return nil, fmt.Errorf("open process tracker: %w", err)
	}
	s.self = snap.Self
	s.since = snap.Since()
	s.mu.Lock()
	s.installSnapshotLocked(&snap)
	s.recomputeLocked()
	s.mu.Unlock()
	if !o.dormant && o.early != nil {
		if err := s.mergeEarly(o.early, probe.AttachedAt()); err != nil {
			probe.Close()
			return nil, fmt.Errorf("open process tracker: %w", err)
		}
	}
	s.refresh = s.resync
	s.dormant.Store(o.dormant)
	if o.dormant {
		s.podCgroup, s.ownCgroup = o.podCgroup, o.ownCgroup
	} else {
		s.setFollowing(ViaSchedTracepoints, "live from start")
	}
	return s, nil
}

// mergeEarly records, for each container that the early recorder saw end
// before the programs attached (at ktime attached), its last exit as a
// main exit of the app's, unless that process is alive now (a PID the
// snapshot has). Exits from the attach on are the programs' own.
func (s *ebpfSource) mergeEarly(early EarlyExits, attached uint64) error {
	all, err := early.EarlyExits()
	if err != nil {
		return err
	}
	last := map[uint64]EarlyExit{}
	var order []uint64
	for _, e := range all {
		if e.Ktime >= attached {
			continue
		}
		if _, ok := last[e.Container]; !ok {
			order = append(order, e.Container)
		}
		last[e.Container] = e
	}
	if len(order) == 0 {
		return nil
	}
	s.update(func() {
		for _, c := range order {
			e := last[c]
			if _, alive := s.procs[e.PID]; alive {
				continue
			}
			s.exitSeq++
			s.exits = append(s.exits, Exit{Process: Process{PID: e.PID, Comm: e.Comm}, ParentOutside: true, Known: true, Status: e.Status, Seq: s.exitSeq})
			s.exitsNew = true
		}
	})
	return nil
}

// Start makes a dormant source follow changes, then takes the snapshot
// that they are applied after: given the pod's cgroups (WithPodCgroup),
// it watches them and attaches nothing; else, or when they cannot be
// watched, it attaches fork, exec and exit.
func (s *ebpfSource) Start() error { return s.start(s.follow) }

// follow is Start's first step: what makes changes seen from here on.
func (s *ebpfSource) follow() error {
	if s.watch != nil { // an earlier Start that failed after it
		s.watch.Close()
		s.watch = nil
	}
	why := probes.ReasonNoPodCgroup
	if s.podCgroup != "" {
		w, err := watchPodCgroups(s.podCgroup, s.ownCgroup)
		if err == nil {
			s.watch = w
			s.setFollowing(ViaCgroupEvents, "a snapshot whenever a container's cgroup under "+s.podCgroup+
				" fills or empties, and every "+s.resyncPeriod.String()+" (an exit in a container still populated is seen then)")
			return nil
		}
		why = fmt.Sprintf("cannot watch the pod's cgroups: %v", err)
	}
	if err := s.probe.Attach(); err != nil {
		return err
	}
	s.setFollowing(ViaSchedTracepoints, why)
	return nil
}

// resync takes a snapshot and installs it: events older than it are
// skipped by Run, losses counted before it are accounted for.
func (s *ebpfSource) resync() error {
	lost := s.probe.Lost()
	snap, err := s.snapshot()
	if err != nil {
		return err
	}
	s.seenLost = lost
	if snap.Walk.Complete() {
		s.since = snap.Since()
	} // else: apply every event still queued, a walk cut short may not have seen them
	s.update(func() { s.installSnapshotLocked(&snap) })
	return nil
}

func (s *ebpfSource) Kind() Mode { return ModeEBPF }

// Lost is the number of events the kernel dropped for a full ring buffer.
// Every loss is followed by a snapshot.
func (s *ebpfSource) Lost() uint64 { return s.probe.Lost() }

// Close detaches the programs and stops watching the pod's cgroups. Safe
// twice; call it after Run returned.
func (s *ebpfSource) Close() error {
	var werr error
	if s.watch != nil {
		werr = s.watch.Close()
	}
	return errors.Join(werr, s.probe.Close())
}

func (s *ebpfSource) snapshot() (probes.ProcSnapshot, error) {
	s.snaps.Add(1)
	return s.probe.Snapshot()
}

// installSnapshotLocked installs a snapshot and what its walk says.
func (s *ebpfSource) installSnapshotLocked(snap *probes.ProcSnapshot) {
	procs := make(map[int]Process, len(snap.Tasks))
	nspids := make(map[int]nsPIDs, len(snap.Tasks))
	for pid, task := range snap.Tasks {
		procs[pid], nspids[pid] = processOf(task), nsPIDs{task.NSPID, task.NSPPID}
	}
	s.installLocked(procs, nspids, snap.Walk.Complete())
	s.coverage = walkCoverage(snap.Walk)
	if snap.Walk.HostNetNS != 0 {
		s.hostNetNS = snap.Walk.HostNetNS
	}
}

func walkCoverage(w probes.ProcWalk) Coverage {
	if w.Complete() {
		return Coverage{Complete: true, Reason: fmt.Sprintf("ebpf: every process of the node walked (%d)", w.Visited)}
	}
	return Coverage{Reason: "ebpf: incomplete: " + w.Shortfall()}
}

func processOf(t probes.ProcTask) Process {
	return Process{PID: t.PID, PPID: t.PPID, UID: t.UID, Comm: t.Comm, StartTime: t.StartTime, MountNS: t.MountNS}
}

// Run applies ring buffer events until ctx ends, classifying again after
// each batch, and takes a snapshot when the kernel dropped events.
func (s *ebpfSource) Run(ctx context.Context) error {
	if s.dormant.Load() {
		return errors.New("app process source: Run before Start")
	}
	if s.watch != nil {
		return s.runCgroupEvents(ctx)
	}
	pending := 0
	err := probes.ReadUntil(ctx, s.probe, func(ev *probes.ProcEvent) error {
		// An exit is applied whenever it happened: a snapshot shows a
		// process gone, never how it ended, and one it never saw (born
		// and gone before it, or gone before the walk reached it) is
		// known by its exit event alone. Applying it twice changes
		// nothing (exitedLocked).
		if ev.Time >= s.since || ev.Kind == probes.ProcExit {
			s.mu.Lock()
			applyEvent(s.table, ev)
			s.mu.Unlock()
			pending++
		}
		if ev.More && pending < 64 {
			return nil // more queued: apply them before classifying
		}
		// The ring is drained: were events dropped while it was full?
		if s.probe.Lost() != s.seenLost {
			if err := s.resync(); err != nil { // classifies the events applied so far too
				return fmt.Errorf("resync after lost events: %w", err)
			}
			pending = 0
		}
		if pending > 0 {
			s.update(nil)
			pending = 0
		}
		return nil
	})
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// runCgroupEvents takes a snapshot at each change of the pod's cgroups
// (and every cgroupResyncPeriod) until ctx ends: the resync that follows
// lost events, which infers the exits of the processes gone (no status)
// and signals Changed when the app's processes changed.
func (s *ebpfSource) runCgroupEvents(ctx context.Context) error {
	// The read's deadline cut to now ends a blocked read; wait checks ctx
	// after setting each deadline, so a cancel is never overwritten.
	stop := context.AfterFunc(ctx, func() { s.watch.f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		if err := s.watch.wait(ctx, buf, s.resyncPeriod); err != nil {
			return s.fail(err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := s.resync(); err != nil {
			return s.fail(fmt.Errorf("resync on a cgroup change: %w", err))
		}
	}
}

// applyEvent applies one event to t (under its lock). Every event is
// idempotent: a snapshot and the events around it may say the same thing
// twice.
func applyEvent(t *table, ev *probes.ProcEvent) {
	p := processOf(ev.Task)
	switch ev.Kind {
	case probes.ProcFork:
		t.bornLocked(p, nsPIDs{ev.Task.NSPID, ev.Task.NSPPID})
	case probes.ProcExec:
		t.execLocked(p, nsPIDs{ev.Task.NSPID, ev.Task.NSPPID})
	case probes.ProcExit:
		t.exitedLocked(p, ExitStatus(ev.Status))
	}
}

// ownMountNS is the inode of the mount namespace file at path (the
// caller's own needs no privilege), 0 when unreadable.
func ownMountNS(path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}
