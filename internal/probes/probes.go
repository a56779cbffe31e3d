// Package probes holds draind's eBPF programs and what loads them: the
// compiled objects of bpf/ (bpf2go), one loader helper shared by every
// object, and the typed readers of what the programs report.
//
// # Programs
//
// [TCPState] loads bpf/tcpstate.c: every TCP state change
// (tp_btf/inet_sock_set_state) of one network namespace, delivered through
// a ring buffer as [TCPEvent]s. The namespace is a load-time constant.
//
// With [TCPStateOptions.PodCgroup], it also loads bpf/podsock.c: a sock_ops
// program for the pod's cgroup and a tcp iterator, writing into the same
// ring, so that a drain costs other pods nothing ([TCPScope]).
//
// [Procs] loads bpf/procs.c: the processes of one network namespace, from
// tp_btf sched_process_fork/exec/exit ([ProcEvent]s through a ring buffer)
// and, on demand, a task iterator's [ProcSnapshot], which walks every
// process of the node (a pod's processes are in PID namespaces draind
// does not see). Package appprocs decides which of them are the app's.
//
// # Loading
//
// Every object goes through the same steps (load_linux.go): the kernel's BTF must
// be there (tp_btf attaches by BTF id, CO-RE relocates against it),
// RLIMIT_MEMLOCK is lifted on kernels before 5.11, ring sizes are checked,
// and a failure that says "this host cannot run eBPF" (no capability, no
// BTF, kernel too old, verifier refusal) comes back as an
// [*UnavailableError] with a one-line Reason, so that callers fall back to
// polling and log why. Other errors are the caller's (bad options).
//
// # Concurrency
//
// One goroutine reads a probe's events; SetDeadline, Lost and Close (and
// Procs.Snapshot) may be called from any goroutine. Close is safe twice and
// unblocks a reader.
// The package logs nothing.
package probes

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/draind/draind/internal/tcpstate"
)

// UnavailableError says why an eBPF object (or another way of seeing the
// kernel: package appprocs' /proc backend) cannot run on this host.
// Callers fall back (to sock_diag polling, to /proc) and log Reason once.
//
// Reason is one line, one of:
//
//	"no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"
//	"kernel has no BTF"
//	"kernel too old (needs 5.5 for tp_btf)"
//	"kernel too old (needs 5.8 for the BPF ring buffer)"
//	"kernel too old (needs 5.8 for the BPF task iterator)"
//	"verifier: <the verifier's last relevant lines>"
//	"load: <the error>"
//	"eBPF is not supported on this OS"
//
// Err is the underlying error, for the log at debug level.
type UnavailableError struct {
	Reason string
	Err    error
}

func (e *UnavailableError) Error() string {
	if e.Err == nil {
		return "unavailable: " + e.Reason
	}
	return "unavailable: " + e.Reason + ": " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrUnsupportedOS is the Err of the UnavailableError every loader returns
// outside Linux.
var ErrUnsupportedOS = errors.New("eBPF needs Linux")

// TCPStateOptions tunes OpenTCPState. The zero value is valid.
type TCPStateOptions struct {
	// RingSize is the ring buffer size in bytes: a power of two and a
	// multiple of the page size. 0 means DefaultTCPRingSize.
	RingSize int
	// BTFCache, when set, shares the kernel's decoded BTF with the other
	// loads that use it (cilium/ebpf decodes vmlinux BTF on every load
	// otherwise: ~15 ms on 6.18). The cache holds the decoded types (and
	// the mapped vmlinux BTF) as long as it is referenced: drop it once
	// every object is loaded.
	BTFCache *btf.Cache
	// Detached loads the programs (verified, maps made) without attaching
	// them: they run for no event until Attach.
	Detached bool
	// PodCgroup, when set, is the pod's cgroup v2: Attach then follows the
	// pod's sockets with a program attached to that cgroup (bpf/podsock.c)
	// instead of the node-wide tracepoint, which it attaches only where the
	// cgroup cannot see them all (TCPState.Scope says which, and why).
	PodCgroup *PodCgroup
}

// PodCgroup is a pod's cgroup v2 directory.
type PodCgroup struct {
	// Path is the directory, as draind sees it.
	Path string
	// ID is the cgroup's id: the directory's inode number (kernfs), what
	// the kernel's cgroup->kn->id holds.
	ID uint64
}

// ReasonNoPodCgroup is why a probe or a process source opened without the
// pod's cgroup follows it node-wide: the one wording of it for the logs.
const ReasonNoPodCgroup = "no pod cgroup given (--cgroup-root)"

// TCPScope is which sockets' changes run a draind program once attached.
type TCPScope string

const (
	// ScopePodCgroup is only the pod's own sockets (a sock_ops program on
	// the pod's cgroup): other pods pay nothing.
	ScopePodCgroup TCPScope = "pod-cgroup"
	// ScopeNode means every TCP state change of the node runs the programs
	// (the inet_sock_set_state tracepoint), which return first for another
	// namespace.
	ScopeNode TCPScope = "node"
)

// DefaultTCPRingSize holds about 6.5k events (72 bytes + an 8-byte ring
// header each): a burst of that many state changes is absorbed while the
// reader is descheduled; past it the tracker resyncs from a snapshot. The
// ring is made when the probe loads, at start-up, and held for the pod's
// life: its size is memory every pod pays while it serves (and VmRSS
// counts it twice: the kernel maps a ring's data pages twice).
const DefaultTCPRingSize = 512 << 10

// TCPEvent is one TCP state change seen by the tcpstate programs, already
// filtered to the target namespace and to TCP.
type TCPEvent struct {
	// Time is the kernel's monotonic clock (bpf_ktime_get_ns) at the change.
	Time time.Duration
	// Cookie is the socket cookie, or 0 on kernels whose tracing programs
	// cannot read it (before 5.12); then SkAddr and the 5-tuple are the key.
	Cookie uint64
	// SkAddr is the kernel address of the struct sock: unique while the
	// socket lives, a fallback key on old kernels.
	SkAddr   uint64
	OldState tcpstate.State
	NewState tcpstate.State
	Family   uint8
	Local    netip.AddrPort
	Remote   netip.AddrPort
	UID      uint32
	// More reports whether other events were queued behind this one when it
	// was read: the reader has not caught up with the kernel.
	More bool
}

// EventReader is a probe's stream of events (TCPState, Procs).
type EventReader[E any] interface {
	ReadEvent(ev *E) error
	SetDeadline(t time.Time)
}

// ReadUntil reads r's events, calling fn for each, until ctx ends (it then
// returns nil), reading fails or fn fails (it returns that error). The
// event passed to fn is reused.
func ReadUntil[E any](ctx context.Context, r EventReader[E], fn func(*E) error) error {
	stop := context.AfterFunc(ctx, func() { r.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var ev E
	for {
		if err := r.ReadEvent(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := fn(&ev); err != nil {
			return err
		}
	}
}
