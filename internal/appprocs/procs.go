package appprocs

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf/btf"
)

// DefaultPauseComm is the comm of the pod's pause process (/pause).
const DefaultPauseComm = "pause"

// DefaultProcPollPeriod is the /proc backend's polling period.
const DefaultProcPollPeriod = 200 * time.Millisecond

// Process is one process (thread group) of the watched namespace. Threads
// are not processes: a process with many threads is one Process.
type Process struct {
	// PID is the thread group id: the kernel's global pid in eBPF mode,
	// the pid /proc shows in /proc mode.
	PID int `json:"pid"`
	// PPID is the parent's PID (the parent the process was born to, in
	// eBPF mode; its current parent in /proc mode).
	PPID int `json:"ppid"`
	// UID is the real uid, in the initial user namespace.
	UID uint32 `json:"uid"`
	// Comm is the command name (at most 15 bytes).
	Comm string `json:"comm"`
	// StartTime is when the process started, in ns since boot
	// (CLOCK_BOOTTIME). With PID it identifies a process across pid reuse.
	// /proc gives it in clock ticks (10 ms).
	StartTime uint64
}

// AppProcRules say which processes of the namespace are not the app.
// The zero value excludes uid 1337 and a process named "pause" by the
// pause rule (see ClassifyProcs).
//
// Pids are the caller's: as its own PID namespace numbers them (os.Getpid,
// exec.Cmd.Process.Pid). ClassifyProcs takes them as they are; the eBPF
// tracker, which sees the kernel's global pids, maps them through the
// kernel (each process's pid in the caller's PID namespace) and ignores
// those that name no process of the namespace or parent of one.
type AppProcRules struct {
	// SelfPIDs are draind's processes: they and their descendants are not
	// the app. Trackers add the calling process themselves, as their pid
	// numbering knows it.
	SelfPIDs []int
	// ProxyUID is the proxy's uid: processes whose real uid it is are the
	// proxy's. 0 means defaultProxyUID (root is never the proxy's by uid).
	ProxyUID uint32
	// ProxyPIDs are the proxy's processes: they and their descendants are
	// not the app.
	ProxyPIDs []int
	// PausePIDs are pause (infra) processes, excluded whatever their name.
	PausePIDs []int
	// PauseComm is the comm the pause rule looks for; "" means
	// DefaultPauseComm.
	PauseComm string
	// NoPauseRule disables the pause rule: only PausePIDs are pause.
	NoPauseRule bool
}

func (r AppProcRules) normalized() AppProcRules {
	if r.ProxyUID == 0 {
		r.ProxyUID = defaultProxyUID
	}
	if r.PauseComm == "" {
		r.PauseComm = DefaultPauseComm
	}
	return r
}

// ProcClass says whose a process is.
type ProcClass uint8

// Classes of processes.
const (
	ProcApp ProcClass = iota
	ProcSelf
	ProcProxy
	ProcPause
)

func (c ProcClass) String() string {
	switch c {
	case ProcSelf:
		return "self"
	case ProcProxy:
		return "proxy"
	case ProcPause:
		return "pause"
	default:
		return "app"
	}
}

// MarshalText makes classes read as names in JSON.
func (c ProcClass) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// ClassifyProcs returns the app's processes among all, the processes of one
// namespace, in the order of all.
//
// A pod's containers share one network namespace but not, by default, a PID
// namespace. The processes of the namespace are therefore found by their
// network namespace, in the kernel's own pid numbering (eBPF: a task
// iterator, then sched_process_fork/exec/exit), or in /proc where /proc can
// see them (a shared PID namespace, or the host's /proc). The app is every
// one of them except:
//
//   - draind's own: the calling process, the pids in SelfPIDs, and their
//     descendants;
//   - the proxy's: real uid ProxyUID (1337 unless set), the pids in
//     ProxyPIDs, and their descendants;
//   - the pod's pause process: the pids in PausePIDs, and the pause rule
//     below.
//
// # The pause rule
//
// The pod sandbox (the "infra" or pause container) is started before any
// other container and joins the pod's network namespace first; its
// process, /pause, never exits while the pod lives and never forks (with a
// shared PID namespace it only reaps orphans, which stay the app's). So:
//
//	the pause process is the OLDEST process of the namespace (lowest
//	StartTime, then lowest PID) that is neither draind's nor the proxy's,
//	provided its comm is PauseComm ("pause" unless set) and its parent is
//	not in the namespace (the runtime's shim started it from outside).
//
// Only that one process is excluded, never its descendants. When the oldest
// process has another name (CRI-O's default of no infra process, a runtime
// without one, a test), there is no pause process by that rule: nothing is
// excluded by guess. A live tracker decides once, on its first snapshot,
// and keeps that process (by pid and start time): a pause process that
// exits is not replaced by the next-oldest process of the same name. Other
// sidecars are the app's: the pod ends with them too.
//
// # Descent
//
// Descent follows the PPID links between processes of the namespace,
// checked for pid reuse (a parent started after its child is not its
// parent), and stops at a process not in the namespace; the parent of the
// last one is still checked against SelfPIDs and ProxyPIDs (draind may live
// outside the namespace it watches). A process whose parent exited is
// reparented by the kernel: in /proc it then descends from its new parent;
// the eBPF tracker, which sees no reparenting between two snapshots, keeps
// the parent it knew, and the chain stops at that exited parent. So an
// orphan leaves draind's or the proxy's tree, unless /proc shows it
// reparented into one (to draind as its container's PID 1, say).
func ClassifyProcs(all []Process, rules AppProcRules) (app []Process) {
	classes := ProcClasses(all, rules)
	for i, p := range all {
		if classes[i] == ProcApp {
			app = append(app, p)
		}
	}
	return app
}

// ProcClasses classifies every process of all: classes[i] is all[i]'s.
func ProcClasses(all []Process, rules AppProcRules) []ProcClass {
	c := newProcClassifier(all, rules)
	pause, ok := c.pauseByRule()
	return c.classify(func(p Process) bool { return ok && p.PID == pause.PID && p.StartTime == pause.StartTime })
}

// PauseProcess returns the process the pause rule picks among all, if any.
// PausePIDs are not consulted: they are pause processes whatever the rule.
func PauseProcess(all []Process, rules AppProcRules) (Process, bool) {
	return newProcClassifier(all, rules).pauseByRule()
}

type procClassifier struct {
	all    []Process
	rules  AppProcRules
	byPID  map[int]int // index in all
	self   map[int]bool
	proxy  map[int]bool
	pauses map[int]bool
}

func newProcClassifier(all []Process, rules AppProcRules) *procClassifier {
	r := rules.normalized()
	c := &procClassifier{all: all, rules: r, byPID: make(map[int]int, len(all))}
	for i, p := range all {
		c.byPID[p.PID] = i
	}
	c.self = pidSet(r.SelfPIDs)
	c.proxy = pidSet(r.ProxyPIDs)
	c.pauses = pidSet(r.PausePIDs)
	return c
}

func pidSet(pids []int) map[int]bool {
	m := make(map[int]bool, len(pids))
	for _, p := range pids {
		if p > 0 {
			m[p] = true
		}
	}
	return m
}

// inTree reports whether p is one of set or descends from one of them,
// through processes of the namespace.
func (c *procClassifier) inTree(p Process, set map[int]bool) bool {
	if len(set) == 0 {
		return false
	}
	cur := p
	for range len(c.all) + 1 {
		if set[cur.PID] || set[cur.PPID] {
			return true
		}
		i, ok := c.byPID[cur.PPID]
		if !ok || cur.PPID == cur.PID {
			return false
		}
		parent := c.all[i]
		if parent.StartTime > cur.StartTime {
			return false // the pid was reused after cur's parent exited
		}
		cur = parent
	}
	return false // a cycle: corrupt input
}

func (c *procClassifier) isSelf(p Process) bool { return c.inTree(p, c.self) }

func (c *procClassifier) isProxy(p Process) bool {
	return p.UID == c.rules.ProxyUID || c.inTree(p, c.proxy)
}

// pauseByRule applies the pause rule (see AppProcRules).
func (c *procClassifier) pauseByRule() (Process, bool) {
	if c.rules.NoPauseRule {
		return Process{}, false
	}
	best := -1
	for i, p := range c.all {
		if c.isSelf(p) || c.isProxy(p) {
			continue
		}
		if best < 0 || olderProc(p, c.all[best]) {
			best = i
		}
	}
	if best < 0 {
		return Process{}, false
	}
	p := c.all[best]
	if p.Comm != c.rules.PauseComm {
		return Process{}, false
	}
	if _, parentInside := c.byPID[p.PPID]; parentInside {
		return Process{}, false
	}
	return p, true
}

func olderProc(a, b Process) bool {
	if a.StartTime != b.StartTime {
		return a.StartTime < b.StartTime
	}
	return a.PID < b.PID
}

// classify gives every process its class; isPause says which process the
// pause rule picked (a tracker pins it on its first snapshot).
func (c *procClassifier) classify(isPause func(Process) bool) []ProcClass {
	out := make([]ProcClass, len(c.all))
	for i, p := range c.all {
		out[i] = c.classOf(p, isPause)
	}
	return out
}

// classOf classifies p, which need not be one of all (a process that just
// exited): its ancestors are looked up in all.
func (c *procClassifier) classOf(p Process, isPause func(Process) bool) ProcClass {
	switch {
	case c.pauses[p.PID] || isPause(p):
		return ProcPause
	case c.isSelf(p):
		return ProcSelf
	case c.isProxy(p):
		return ProcProxy
	}
	return ProcApp
}

// AppProcSource follows the app's processes in one namespace. *ProcTracker
// implements it, with an eBPF or a /proc backend.
type AppProcSource interface {
	// AppProcs returns the app's processes, by PID.
	AppProcs() []Process
	// Count is len(AppProcs()).
	Count() int
	// Notify is signalled (non-blocking, coalescing: one pending signal at
	// most) whenever the app's processes change. One consumer.
	Notify() <-chan struct{}
	// Lost counts the events the kernel could not deliver (eBPF); each
	// loss was followed by a resynchronising snapshot.
	Lost() uint64
	// Coverage says whether the source sees every process of the
	// namespace; when it does not, zero processes do not mean the app is
	// done.
	Coverage() ProcCoverage
	// AppExits returns how the app's processes that left ended, oldest
	// first (see ProcExit).
	AppExits() []ProcExit
	// HostNetNS is the inode of the host's (the initial) network
	// namespace, when the source knows it: the watched namespace is a
	// hostNetwork pod's when they are equal.
	HostNetNS() (inode uint64, ok bool)
	// Source is "ebpf" or "proc".
	Source() string
	// Err is the error that stopped the source following changes, if any
	// (Notify is signalled when it happens).
	Err() error
	// Close stops everything the source runs. Safe to call twice.
	Close() error
}

// ProcCoverage says whether a tracker sees every process of its namespace.
type ProcCoverage struct {
	// Complete: the last snapshot saw every process of the namespace, and
	// events keep the view current. When false, processes may be missing
	// (never seen) and some that left may linger: a count of zero proves
	// nothing.
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

// ProcExit is how one of the app's processes left.
type ProcExit struct {
	// Process is the process as tracked; PPID is its parent when it
	// exited (eBPF), or the one it was known by (inferred exits).
	Process
	// ParentOutside: its parent was not a process of the namespace. The
	// app's processes whose parent is outside are its containers' main
	// processes (the runtime's shim is their parent).
	ParentOutside bool
	// Known: Status is the kernel's. False when the exit was inferred (a
	// snapshot no longer found the process: its event was lost, or the
	// backend polls /proc).
	Known bool
	// Status is the wait(2) status its parent reads, when Known.
	Status ExitStatus
	// Seq numbers the exits a tracker saw, from 1, in the order seen.
	Seq uint64
}

// Retention of AppExits: the last DefaultProcExitHistory exits, and the
// last DefaultProcMainExitHistory of those whose parent was outside (the
// containers' main processes) whatever came after them.
const (
	DefaultProcExitHistory     = 256
	DefaultProcMainExitHistory = 64
)

// ProcMode chooses an AppProcSource backend.
type ProcMode string

// Modes of OpenAppProcSource.
const (
	ProcModeAuto ProcMode = "auto" // ebpf, else proc
	ProcModeEBPF ProcMode = "ebpf"
	ProcModeProc ProcMode = "proc"
)

// ParseProcMode accepts "auto", "ebpf" and "proc" ("" is auto).
func ParseProcMode(s string) (ProcMode, error) {
	switch m := ProcMode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return ProcModeAuto, nil
	case ProcModeAuto, ProcModeEBPF, ProcModeProc:
		return m, nil
	}
	return "", fmt.Errorf("unknown process tracker mode %q (want auto, ebpf or proc)", s)
}

// ProcUnavailableError says why a process tracking backend cannot run here.
// Reason is one line for the log, one of:
//
//	"no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"
//	"kernel has no BTF"
//	"kernel too old (needs 5.8 for the BPF task iterator)"
//	"kernel too old (needs 5.8 for the BPF ring buffer)"
//	"kernel too old (needs 5.5 for tp_btf)"
//	"verifier: <the verifier's last lines>"
//	"/proc: <why /proc cannot see the app>"
//	"not supported on this OS"
type ProcUnavailableError struct {
	Reason string
	Err    error
}

func (e *ProcUnavailableError) Error() string {
	if e.Err == nil {
		return "process tracking unavailable: " + e.Reason
	}
	return "process tracking unavailable: " + e.Reason + ": " + e.Err.Error()
}

func (e *ProcUnavailableError) Unwrap() error { return e.Err }

// ProcOption tunes a ProcTracker.
type ProcOption func(*procOptions)

type procOptions struct {
	pollPeriod time.Duration
	procRoot   string
	ringSize   int
	walkCap    int
	walkOut    int // records the walk can return (tests)
	btfCache   *btf.Cache
}

func buildProcOptions(opts []ProcOption) procOptions {
	o := procOptions{pollPeriod: DefaultProcPollPeriod, procRoot: "/proc", ringSize: DefaultProcRingSize,
		walkCap: DefaultProcWalkCap, walkOut: defaultProcWalkOut}
	for _, f := range opts {
		f(&o)
	}
	if o.pollPeriod <= 0 {
		o.pollPeriod = DefaultProcPollPeriod
	}
	if o.procRoot == "" {
		o.procRoot = "/proc"
	}
	if o.ringSize <= 0 {
		o.ringSize = DefaultProcRingSize
	}
	if o.walkCap <= 0 || o.walkCap > DefaultProcWalkCap {
		o.walkCap = DefaultProcWalkCap
	}
	if o.walkOut <= 0 {
		o.walkOut = defaultProcWalkOut
	}
	return o
}

// DefaultProcRingSize is the eBPF ring buffer's size: 3276 events of 72
// bytes (+8 of header), far more than a pod forks between two reads.
const DefaultProcRingSize = 256 << 10

// DefaultProcWalkCap is the most processes of the node (thread-group
// leaders, kernel threads included) the eBPF snapshot visits, and the
// largest cap WithProcWalkCap accepts (WALK_MAX in bpf/procs.c). A node
// with more makes the snapshot incomplete (see ProcCoverage).
const DefaultProcWalkCap = 1 << 16

// defaultProcWalkOut is how many processes of the namespace one eBPF
// snapshot's walk can return (the walk_out map: 72 bytes each). A pod has
// far fewer; a hostNetwork pod's namespace is the node's.
const defaultProcWalkOut = 4096

// WithProcPollPeriod sets the /proc backend's polling period.
func WithProcPollPeriod(d time.Duration) ProcOption {
	return func(o *procOptions) { o.pollPeriod = d }
}

// WithProcRoot makes the /proc backend read another procfs mount (the
// host's, mounted into the container).
func WithProcRoot(dir string) ProcOption {
	return func(o *procOptions) { o.procRoot = dir }
}

// WithProcRingSize sets the eBPF ring buffer's size in bytes (a power of
// two, a multiple of the page size).
func WithProcRingSize(n int) ProcOption {
	return func(o *procOptions) { o.ringSize = n }
}

// WithProcWalkCap sets the most processes of the node the eBPF snapshot
// visits (at most, and by default, DefaultProcWalkCap).
func WithProcWalkCap(n int) ProcOption {
	return func(o *procOptions) { o.walkCap = n }
}

// WithProcBTFCache makes the eBPF backend decode the kernel's BTF through
// c, which other loads share: decoding it is most of a load's time (about
// 15 of 27 ms on 6.18). Share it during start-up and drop it after: it
// holds the decoded kernel types.
func WithProcBTFCache(c *btf.Cache) ProcOption {
	return func(o *procOptions) { o.btfCache = c }
}

// sortProcs orders processes by PID.
func sortProcs(ps []Process) {
	slices.SortFunc(ps, func(a, b Process) int { return a.PID - b.PID })
}

// defaultProxyUID is Istio's convention: Envoy runs as 1337.
const defaultProxyUID = 1337
