package probes

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf/btf"
)

// ProcOptions tunes OpenProcs. The zero value is valid.
type ProcOptions struct {
	// RingSize is the ring buffer's size in bytes: a power of two and a
	// multiple of the page size. 0 means DefaultProcRingSize.
	RingSize int
	// WalkCap is the most processes of the node (thread-group leaders,
	// kernel threads included) a snapshot's walk visits. 0, or more than
	// MaxProcWalk, means MaxProcWalk.
	WalkCap int
	// WalkOut is how many processes of the namespace one snapshot's walk
	// can return (the walk_out map, 80 bytes each). 0 means
	// DefaultProcWalkOut.
	WalkOut int
	// BTFCache, when set, decodes the kernel's BTF once for every load that
	// shares it: decoding it is most of a load's time (about 15 of 27 ms on
	// 6.18). Share it during start-up and drop it after: it holds the
	// decoded kernel types.
	BTFCache *btf.Cache
	// Detached loads the programs without attaching fork, exec and exit:
	// they run for no event until Attach (snapshots work).
	Detached bool
}

// DefaultProcRingSize is the procs ring buffer's default size: 1489 events
// of 80 bytes (+8 of header), far more than a pod forks between two reads
// (a loss costs a snapshot, not correctness). Held from start-up on, like
// DefaultTCPRingSize.
const DefaultProcRingSize = 128 << 10

// MaxProcWalk is the most processes of the node a snapshot's walk can
// visit (WALK_MAX in bpf/procs.c), and its default cap. A node with more
// makes the snapshot incomplete (see ProcWalk).
const MaxProcWalk = 1 << 16

// DefaultProcWalkOut is how many processes of the namespace one snapshot's
// walk returns by default (160 KiB of map, held from start-up on). A pod
// has far fewer; a hostNetwork pod's namespace is the node's, whose
// processes are not followed.
const DefaultProcWalkOut = 2048

func (o ProcOptions) withDefaults() ProcOptions {
	if o.RingSize == 0 {
		o.RingSize = DefaultProcRingSize
	}
	if o.WalkCap <= 0 || o.WalkCap > MaxProcWalk {
		o.WalkCap = MaxProcWalk
	}
	if o.WalkOut <= 0 {
		o.WalkOut = DefaultProcWalkOut
	}
	return o
}

// ProcTask is one process (thread group) as the procs programs report it.
type ProcTask struct {
	// PID is the thread group id and PPID its parent's (the parent it was
	// born to), in the kernel's global numbering.
	PID, PPID int
	// UID is the real uid, in the initial user namespace.
	UID uint32
	// Comm is the command name (at most 15 bytes).
	Comm string
	// StartTime is when the process started, in ns since boot
	// (CLOCK_BOOTTIME). With PID it identifies a process across pid reuse.
	StartTime uint64
	// NSPID and NSPPID are PID and PPID as the loader's PID namespace
	// (Procs.PIDNS) numbers them; 0 when it does not see the process.
	NSPID, NSPPID int
	// MountNS is the inode of its mount namespace (as /proc/PID/ns/mnt
	// shows it): every container of a pod has its own.
	MountNS uint64
}

// ProcEventKind says what a ProcEvent reports.
type ProcEventKind uint32

// Kinds of ProcEvent (struct proc_event's kind in bpf/procs.c; 1 and 2 are
// the iterator's records).
const (
	ProcFork ProcEventKind = 3 // a process of the namespace was born
	ProcExec ProcEventKind = 4 // it ran execve: a new Comm, maybe a new UID
	ProcExit ProcEventKind = 5 // its last thread exited
)

// ProcEvent is one change to the processes of the namespace.
type ProcEvent struct {
	// Time is the kernel's monotonic clock (bpf_ktime_get_ns) at the
	// change: the clock of ProcSnapshot.Start.
	Time time.Duration
	Kind ProcEventKind
	// Task is the process. For ProcExit, PPID is its parent when it
	// exited (its parent may have changed since its birth).
	Task ProcTask
	// Status is a ProcExit's wait(2) status, as its parent reads it.
	Status uint32
	// More reports whether other events were queued behind this one when it
	// was read (a reader may apply them before acting on the batch).
	More bool
}

// ProcSnapshot is what one run of the task iterator found: the processes
// of the loader's PID namespace, and those of a walk of every process of
// the node.
type ProcSnapshot struct {
	// Start is the monotonic clock before the iterator ran.
	Start time.Duration
	// Tasks are the processes of the namespace, by PID.
	Tasks map[int]ProcTask
	// Self is the loader's own PID, in the kernel's numbering.
	Self int
	Walk ProcWalk
}

// Since is the time from which events are news to the snapshot: when its
// walk was complete, every event older than Start is reflected in it;
// otherwise none is taken for granted (0: apply every event).
func (s *ProcSnapshot) Since() time.Duration {
	if s.Walk.Complete() {
		return s.Start
	}
	return 0
}

// ProcWalk is the account of a snapshot's walk of every process of the
// node (the iterator's END record).
type ProcWalk struct {
	// Visited is how many processes the walk visited, Written how many of
	// them were the namespace's.
	Visited, Written int
	// HostNetNS is the inode of the initial (the host's) network namespace,
	// read from init_task; 0 when unknown.
	HostNetNS uint64
	flags     uint32 // procWalk*
	cap, out  int    // the limits in force
}

// Flags of the END record (PROC_F_WALK_* in bpf/procs.c).
const (
	procWalkDone  = 0x10
	procWalkCap   = 0x20
	procWalkFull  = 0x40
	procWalkFault = 0x80
	procWalkOver  = procWalkDone | procWalkCap | procWalkFull | procWalkFault
)

// Complete reports whether the walk visited every process of the node and
// returned every one of the namespace's.
func (w ProcWalk) Complete() bool { return w.flags&procWalkOver == procWalkDone }

// Shortfall says in one line why the walk is not complete ("" when it is).
func (w ProcWalk) Shortfall() string {
	switch {
	case w.Complete():
		return ""
	case w.flags&procWalkFault != 0:
		return fmt.Sprintf("the kernel's process list could not be read (after %d processes)", w.Visited)
	case w.flags&procWalkFull != 0:
		return fmt.Sprintf("the namespace has more than %d processes", w.out)
	case w.flags&procWalkCap != 0:
		return fmt.Sprintf("the node has more than %d processes (the walk's cap)", w.cap)
	}
	return fmt.Sprintf("the walk ended without a result (flags %#x)", w.flags)
}
