package appprocs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/draind/draind/internal/probes"
)

// Source follows the app's processes in one network namespace (see
// Classify for who the app is). Open returns one, with an eBPF or a /proc
// backend, holding a first snapshot; Run keeps it current. Every method
// but Run and Close may be called from any goroutine, at any time.
type Source interface {
	// Run follows changes until ctx ends (nil) or the source fails (the
	// error, also in Err, with Changed signalled). The caller owns the
	// goroutine that runs it, once; without Run the source stays at its
	// first snapshot. A source opened WithDormant runs only after Start.
	Run(ctx context.Context) error
	// Start makes a source opened WithDormant follow changes: eBPF attaches
	// its programs, then takes a snapshot (a process that changed in
	// between is in one or the other); /proc scans now. Call Run after
	// it. Idempotent; a source opened live is started.
	Start() error
	// Live reports whether the source follows changes (started, or opened
	// live). A dormant source's Count, Processes and Containers read the
	// kernel when asked.
	Live() bool
	// Processes returns the app's processes, by PID.
	Processes() []Process
	// Count is len(Processes()).
	Count() int
	// Coverage says whether the source sees every process of the
	// namespace; when it does not, zero processes do not mean the app is
	// done.
	Coverage() Coverage
	// Changed is signalled (non-blocking, coalescing: one pending signal at
	// most) whenever the app's processes or their exits change, and when
	// Run fails. One consumer: read Count or Processes after receiving.
	Changed() <-chan struct{}
	// Exits returns how the app's processes that left since Open ended,
	// oldest first: the last ExitHistory of them, and the last
	// MainExitHistory of the containers' main processes (ParentOutside)
	// whatever came after. An exit is there by the Changed that follows it
	// (eBPF: within one event); a Known status may replace an inferred one
	// later, with a Changed.
	Exits() []Exit
	// HostNetNS is the inode of the host's (the initial) network
	// namespace, when the source knows it: the watched namespace is a
	// hostNetwork pod's when they are equal. eBPF reads it from init_task
	// at every snapshot; /proc knows it only in the host's PID namespace.
	HostNetNS() (inode uint64, ok bool)
	// Containers are the containers the container rule excludes (see
	// Classify): draind's own and the proxy's, each with the processes it
	// has now. For the log: what draind took as its own container.
	Containers() []Container
	// Lost counts the events the kernel could not deliver (eBPF; 0 for
	// /proc); each loss was followed by a resynchronising snapshot.
	Lost() uint64
	// Following says how a live source follows changes and why that way
	// (one line for the log); "" while dormant.
	Following() (via Via, reason string)
	// Kind is the backend: one of Kinds.
	Kind() Mode
	// Err is the error that stopped Run, if any.
	Err() error
	// Close releases what the source holds. Call it after Run returned;
	// safe to call twice.
	Close() error
}

// Container is a container of the pod as the container rule sees it.
type Container struct {
	// MountNS is its mount namespace (Process.MountNS).
	MountNS uint64 `json:"mnt_ns"`
	// Class is whose it is: ClassSelf (draind's) or ClassProxy.
	Class Class `json:"class"`
	// Processes are its processes now, by PID.
	Processes []Process `json:"processes"`
}

// Coverage says whether a source sees every process of its namespace.
type Coverage struct {
	// Complete is true when the last snapshot saw every process of the
	// namespace, and events keep the view current. When false, processes
	// may be missing (never seen) and some that left may linger: a count of
	// zero proves nothing.
	Complete bool
	// Reason is one line for the log and metrics: how the processes are
	// found, or why some may be missed.
	Reason string
}

// ExitStatus is a process's wait(2) status, as its parent reads it.
type ExitStatus uint32

// Exited reports whether the process called exit (or returned from main).
func (s ExitStatus) Exited() bool { return s&0x7f == 0 }

// ExitCode is the code the process exited with (0-255), -1 when a signal
// ended it.
func (s ExitStatus) ExitCode() int {
	if !s.Exited() {
		return -1
	}
	return int(s>>8) & 0xff
}

// Signal is the signal that ended the process, 0 when it exited.
func (s ExitStatus) Signal() int {
	if s.Exited() {
		return 0
	}
	return int(s & 0x7f)
}

// CoreDumped reports whether the signal that ended the process dumped core.
func (s ExitStatus) CoreDumped() bool { return !s.Exited() && s&0x80 != 0 }

func (s ExitStatus) String() string {
	switch {
	case s.Exited():
		return "exit " + strconv.Itoa(s.ExitCode())
	case s.CoreDumped():
		return "signal " + strconv.Itoa(s.Signal()) + " (core dumped)"
	}
	return "signal " + strconv.Itoa(s.Signal())
}

// Exit is how one of the app's processes left.
type Exit struct {
	// Process is the process as tracked; PPID is its parent when it
	// exited (eBPF), or the one it was known by (inferred exits).
	Process
	// ParentOutside is true when its parent was not a process of the
	// namespace. The app's processes whose parent is outside are its
	// containers' main processes (the runtime's shim is their parent).
	ParentOutside bool
	// Known is true when Status is the kernel's. False when the exit was
	// inferred (a snapshot no longer found the process: its event was lost,
	// or the backend polls /proc).
	Known bool
	// Status is the wait(2) status its parent reads, when Known.
	Status ExitStatus
	// Seq numbers the exits a source saw, from 1, in the order seen.
	Seq uint64
}

// Retention of Exits: the last ExitHistory exits, and the last
// MainExitHistory of those whose parent was outside (the containers' main
// processes) whatever came after them.
const (
	ExitHistory     = 256
	MainExitHistory = 64
)

// Mode chooses a Source's backend (--app-procs).
type Mode string

// Modes of Open; ModeEBPF and ModeProc are also the backends' Kind.
// ModeOff is no source at all (the app is told by its sockets): Open
// refuses it, its caller opens nothing.
const (
	ModeAuto Mode = "auto" // ebpf, else proc
	ModeEBPF Mode = "ebpf"
	ModeProc Mode = "proc"
	ModeOff  Mode = "off"
)

func (m Mode) String() string { return string(m) }

// Modes are the modes --app-procs accepts, validation checks and errors
// name.
var Modes = []Mode{ModeAuto, ModeEBPF, ModeProc, ModeOff}

// Kinds are the backends a Source is (Source.Kind).
var Kinds = []Mode{ModeEBPF, ModeProc}

// Via is how a live source learns of changes (Source.Following).
type Via string

const (
	// ViaSchedTracepoints means eBPF programs on sched_process_fork, exec
	// and exit, which run for every process of the node.
	ViaSchedTracepoints Via = "sched-tracepoints"
	// ViaCgroupEvents means eBPF's snapshot taken again whenever one of the
	// pod's containers' cgroups empties or fills (WithPodCgroup): nothing
	// runs for other pods' processes.
	ViaCgroupEvents Via = "cgroup-events"
	// ViaProcPolling means /proc read on a period.
	ViaProcPolling Via = "proc-polling"
)

// UnavailableError says why a backend cannot run here. Reason is one line
// for the log: one of probes.UnavailableError's reasons (eBPF), or
// "/proc: <why /proc cannot see the app>", or both (auto mode).
type UnavailableError = probes.UnavailableError

// Option tunes Open.
type Option func(*options)

type options struct {
	pollPeriod time.Duration
	procRoot   string
	probe      probes.ProcOptions
	dormant    bool
	podCgroup  string
	ownCgroup  string
	early      EarlyExits
}

// DefaultPollPeriod is the /proc backend's polling period.
const DefaultPollPeriod = 200 * time.Millisecond

func buildOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.pollPeriod <= 0 {
		o.pollPeriod = DefaultPollPeriod
	}
	if o.procRoot == "" {
		o.procRoot = "/proc"
	}
	return o
}

// WithPollPeriod sets the /proc backend's polling period.
func WithPollPeriod(d time.Duration) Option {
	return func(o *options) { o.pollPeriod = d }
}

// WithProcRoot makes the /proc backend read another procfs mount (the
// host's, mounted into the container).
func WithProcRoot(dir string) Option {
	return func(o *options) { o.procRoot = dir }
}

// WithRingSize sets the eBPF ring buffer's size in bytes (a power of two,
// a multiple of the page size; probes.DefaultProcRingSize by default).
func WithRingSize(n int) Option {
	return func(o *options) { o.probe.RingSize = n }
}

// WithWalkCap sets the most processes of the node the eBPF snapshot
// visits (at most, and by default, probes.MaxProcWalk).
func WithWalkCap(n int) Option {
	return func(o *options) { o.probe.WalkCap = n }
}

// WithDormant opens a source that follows nothing until Start: the eBPF
// backend loads its programs (the first snapshot taken, the backend
// decided) without attaching fork, exec and exit; the /proc backend does
// not poll. Count, Processes and Containers take a snapshot when asked.
// Nothing of it runs while the pod serves (docs/design.md, "Track only
// while draining").
func WithDormant() Option {
	return func(o *options) { o.dormant = true; o.probe.Detached = true }
}

// WithPodCgroup gives an eBPF source opened WithDormant the pod's cgroup
// and draind's own below it (directories of a cgroup v2 mount of the
// node's hierarchy; see package podcgroup): Start then attaches no
// program, and follows the app by watching the populated state of the
// pod's other child cgroups (its containers), taking a snapshot at each
// change. An exit is seen when its container empties, or at the next
// change or resync (within a second) when others of its container live
// on: enough for a drain, which waits for the app's processes to be none.
// Where the cgroups cannot be watched, Start attaches fork, exec and exit
// as without it, and Following says why. A live source (no WithDormant)
// and the /proc backend ignore it.
func WithPodCgroup(pod, own string) Option {
	return func(o *options) { o.podCgroup, o.ownCgroup = pod, own }
}

// EarlyExit is how a process of another container of the pod ended
// before the source was live, as a recorder that needs no kernel BTF saw
// it (probes.EarlyExits, bpf/earlyexits.c).
type EarlyExit struct {
	// Ktime is CLOCK_MONOTONIC when it ended (its SIGCHLD).
	Ktime uint64
	// Container tells its container (its cgroup's id).
	Container uint64
	PID       int
	Comm      string
	Status    ExitStatus
}

// EarlyExits gives the exits recorded so far, oldest first.
type EarlyExits interface {
	EarlyExits() ([]EarlyExit, error)
}

// WithEarlyExits gives a live eBPF source the exits recorded before its
// programs attached: each container's last one is its main process's
// (the PID namespace's first process ends after every other), taken as
// an exit of the app's with its status. So an app container that ran and
// left during draind's start-up is done by its own exit code, not by
// --app-start-timeout. The recorder must watch only the pod's other
// containers. Ignored by a dormant source and by /proc.
func WithEarlyExits(e EarlyExits) Option {
	return func(o *options) { o.early = e }
}

// WithBTFCache makes the eBPF backend decode the kernel's BTF through c,
// which other loads share (see probes.ProcOptions.BTFCache).
func WithBTFCache(c *btf.Cache) Option {
	return func(o *options) { o.probe.BTFCache = c }
}

// Descriptions of the backends, the start of Open's reason.
const ebpfDesc = "ebpf: task iterator + sched_process_fork/exec/exit"

// Open opens a Source of the app's processes in the namespace whose inode
// is netnsInode (Net.Inode), with the backend mode asks for: auto tries
// eBPF, then /proc. The source holds a first snapshot; Run keeps it
// current. reason is one line for the log: which backend runs, and why
// the other does not.
//
// When no backend can run, the error is an *UnavailableError (auto: the
// reasons of both); the caller then follows the app by its sockets.
func Open(netnsInode uint64, rules Rules, mode Mode, opts ...Option) (src Source, reason string, err error) {
	if netnsInode == 0 {
		return nil, "", errors.New("open app processes: netns inode 0")
	}
	o := buildOptions(opts)
	pollDesc := "proc: polling " + o.procRoot + " every " + o.pollPeriod.String()
	switch mode {
	case ModeEBPF:
		if src, err = openEBPF(netnsInode, rules, o); err != nil {
			return nil, "", err
		}
		return src, ebpfDesc + " (asked for)", nil
	case ModeProc:
		if src, err = openProc(netnsInode, rules, o); err != nil {
			return nil, "", err
		}
		return src, pollDesc + " (asked for)", nil
	case ModeAuto, "":
	case ModeOff:
		return nil, "", errors.New("open app process source: mode off opens none")
	default:
		return nil, "", fmt.Errorf("open app process source: unknown mode %q", mode)
	}
	if src, err = openEBPF(netnsInode, rules, o); err == nil {
		return src, ebpfDesc, nil
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		return nil, "", err
	}
	src, perr := openProc(netnsInode, rules, o)
	if perr == nil {
		return src, pollDesc + " (ebpf unavailable: " + ue.Reason + ")", nil
	}
	var pe *UnavailableError
	if errors.As(perr, &pe) {
		return nil, "", &UnavailableError{
			Reason: "ebpf: " + ue.Reason + "; " + pe.Reason,
			Err:    errors.Join(err, perr),
		}
	}
	return nil, "", perr
}
