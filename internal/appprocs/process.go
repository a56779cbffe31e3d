package appprocs

// DefaultPauseComm is the comm of the pod's pause process (/pause).
const DefaultPauseComm = "pause"

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
	// MountNS identifies the process's mount namespace, which is its
	// container's (see Classify); 0 when unknown. Comparable only between
	// processes of one source: the eBPF backend gives the namespace's inode,
	// the /proc backend the id of the first mount /proc/PID/mountinfo lists
	// (a mount belongs to one namespace, and mountinfo, unlike ns/mnt, needs
	// no ptrace access).
	MountNS uint64 `json:"mnt_ns,omitempty"`
}

// Rules say which processes of the namespace are not the app (see
// Classify). Set ProxyUID: in the zero value, root's processes are the
// proxy's.
//
// Pids are the caller's: as its own PID namespace numbers them (os.Getpid,
// exec.Cmd.Process.Pid). Classify takes them as they are; the eBPF
// backend, which sees the kernel's global pids, maps them through the
// kernel (each process's pid in the caller's PID namespace) and ignores
// those that name no process of the namespace or parent of one.
type Rules struct {
	// SelfPIDs are draind's processes: they and their descendants are not
	// the app. Sources add the calling process themselves, as their pid
	// numbering knows it.
	SelfPIDs []int
	// ProxyUID is the proxy's uid: processes whose real uid it is are the
	// proxy's. It means what it says, as --proxy-uid does for sockets: 0
	// is root (Istio's proxy runs as 1337).
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
	// SelfMountNS is the mount namespace of draind's container (as
	// Process.MountNS gives it), 0 when unknown. Sources set it to the
	// caller's own, which they read directly: draind's container is known
	// even before any of its processes is seen in the namespace.
	SelfMountNS uint64
}

func (r Rules) normalized() Rules {
	if r.PauseComm == "" {
		r.PauseComm = DefaultPauseComm
	}
	return r
}

// Class says whose a process is.
type Class uint8

// Classes of processes.
const (
	ClassApp Class = iota
	ClassSelf
	ClassProxy
	ClassPause
)

// classNames are the classes' names, by value.
var classNames = [...]string{ClassApp: "app", ClassSelf: "self", ClassProxy: "proxy", ClassPause: "pause"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "app"
}

// MarshalText makes classes read as names in JSON.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Classify returns the app's processes among all, the processes of one
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
//   - the proxy's: real uid ProxyUID, the pids in
//     ProxyPIDs, and their descendants;
//   - the pod's pause process: the pids in PausePIDs, and the pause rule
//     below;
//   - every other process of draind's container or of the proxy's (the
//     container rule below).
//
// # The container rule
//
// Each container of a pod has a mount namespace of its own, in every pod
// shape: a shared PID namespace (shareProcessNamespace) shares no mounts,
// and the runtime gives every container a new mount namespace whatever it
// shares. What the kubelet or a user runs in a container joins that
// namespace: postStart and preStop exec hooks, exec probes, `kubectl exec`.
// So the processes whose mount namespace is draind's (SelfMountNS, or that
// of a process of SelfPIDs or the caller) or the proxy's (that of a process
// of ProxyUID or ProxyPIDs) are that
// container's, whatever their uid and parent: an init wrapper that is the
// container's PID 1 (tini, dumb-init, a shell), draind's hooks, a debug
// shell. They are never the app. A container that runs anything as
// ProxyUID is the proxy's (Istio's rules exempt that uid's traffic from
// interception: no app can use it). Only processes whose mount namespace is
// known count (MountNS not 0).
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
// excluded by guess. A live source decides once, on its first snapshot,
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
// the eBPF backend, which sees no reparenting between two snapshots, keeps
// the parent it knew, and the chain stops at that exited parent. So an
// orphan leaves draind's or the proxy's tree, unless /proc shows it
// reparented into one (to draind as its container's PID 1, say).
func Classify(all []Process, rules Rules) (app []Process) {
	classes := Classes(all, rules)
	for i, p := range all {
		if classes[i] == ClassApp {
			app = append(app, p)
		}
	}
	return app
}

// Classes classifies every process of all: classes[i] is all[i]'s.
func Classes(all []Process, rules Rules) []Class {
	c := newClassifier(all, rules)
	pause, ok := c.pauseByRule()
	return c.classify(func(p Process) bool { return ok && p.PID == pause.PID && p.StartTime == pause.StartTime })
}

// PauseProcess returns the process the pause rule picks among all, if any.
// PausePIDs are not consulted: they are pause processes whatever the rule.
func PauseProcess(all []Process, rules Rules) (Process, bool) {
	return newClassifier(all, rules).pauseByRule()
}

type classifier struct {
	all    []Process
	rules  Rules
	byPID  map[int]int // index in all
	self   map[int]bool
	proxy  map[int]bool
	pauses map[int]bool
	// containers are the mount namespaces of draind's processes (ClassSelf)
	// and the proxy's (ClassProxy): the container rule.
	containers map[uint64]Class
}

func newClassifier(all []Process, rules Rules) *classifier {
	r := rules.normalized()
	c := &classifier{all: all, rules: r, byPID: make(map[int]int, len(all))}
	for i, p := range all {
		c.byPID[p.PID] = i
	}
	c.self = pidSet(r.SelfPIDs)
	c.proxy = pidSet(r.ProxyPIDs)
	c.pauses = pidSet(r.PausePIDs)
	c.containers = make(map[uint64]Class, 2)
	if r.SelfMountNS != 0 {
		c.containers[r.SelfMountNS] = ClassSelf
	}
	for _, p := range all {
		if p.MountNS == 0 || c.pauses[p.PID] {
			continue
		}
		switch {
		case c.isSelf(p):
			c.containers[p.MountNS] = ClassSelf
		case c.isProxy(p):
			if _, ok := c.containers[p.MountNS]; !ok {
				c.containers[p.MountNS] = ClassProxy
			}
		}
	}
	return c
}

// Containers returns the mount namespaces the container rule excludes, with
// the class of each (ClassSelf: draind's container; ClassProxy: the
// proxy's), for the log.
func Containers(all []Process, rules Rules) map[uint64]Class {
	return newClassifier(all, rules).containers
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
func (c *classifier) inTree(p Process, set map[int]bool) bool {
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

func (c *classifier) isSelf(p Process) bool { return c.inTree(p, c.self) }

func (c *classifier) isProxy(p Process) bool {
	return p.UID == c.rules.ProxyUID || c.inTree(p, c.proxy)
}

// pauseByRule applies the pause rule (see Rules).
func (c *classifier) pauseByRule() (Process, bool) {
	if c.rules.NoPauseRule {
		return Process{}, false
	}
	best := -1
	for i, p := range c.all {
		if c.isSelf(p) || c.isProxy(p) || c.inContainer(p) {
			continue
		}
		if best < 0 || older(p, c.all[best]) {
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

func older(a, b Process) bool {
	if a.StartTime != b.StartTime {
		return a.StartTime < b.StartTime
	}
	return a.PID < b.PID
}

// classify gives every process its class; isPause says which process the
// pause rule picked (a source pins it on its first snapshot).
func (c *classifier) classify(isPause func(Process) bool) []Class {
	out := make([]Class, len(c.all))
	for i, p := range c.all {
		out[i] = c.classOf(p, isPause)
	}
	return out
}

// classOf classifies p, which need not be one of all (a process that just
// exited): its ancestors are looked up in all.
func (c *classifier) classOf(p Process, isPause func(Process) bool) Class {
	switch {
	case c.pauses[p.PID] || isPause(p):
		return ClassPause
	case c.isSelf(p):
		return ClassSelf
	case c.isProxy(p):
		return ClassProxy
	case c.inContainer(p):
		return c.containers[p.MountNS]
	}
	return ClassApp
}

// inContainer reports whether p is in draind's or the proxy's container.
func (c *classifier) inContainer(p Process) bool {
	_, ok := c.containers[p.MountNS]
	return ok && p.MountNS != 0
}
