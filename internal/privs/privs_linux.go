package privs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrCgo is wrapped by every change refused because the binary links cgo:
// the Go runtime cannot then change every thread's credentials at once.
var ErrCgo = errors.New("capabilities can only be changed on every thread of a binary built with CGO_ENABLED=0")

// Supported is nil when this binary can change every thread's capabilities
// (built with CGO_ENABLED=0; the race detector links cgo), an error
// wrapping ErrCgo when it cannot.
func Supported() error { return supported() }

var supported = sync.OnceValue(func() error {
	return allThreads(syscall.AllThreadsSyscall(unix.SYS_GETPID, 0, 0, 0))
})

// Current returns the calling thread's sets. After any change made by this
// package every thread has the same ones.
func Current() (Sets, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var s Sets
	var err error
	if s.Effective, s.Permitted, s.Inheritable, err = capget(); err != nil {
		return Sets{}, err
	}
	for c := range lastCap() + 1 {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 1 {
			s.Bounding |= SetOf(c)
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); err == nil && in == 1 {
			s.Ambient |= SetOf(c)
		}
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return Sets{}, fmt.Errorf("read no_new_privs: %w", err)
	}
	s.NoNewPrivs = nnp == 1
	return s, nil
}

// lastCap is the highest capability this kernel knows (cap_last_cap),
// found without /proc: PR_CAPBSET_READ fails with EINVAL past it.
var lastCap = sync.OnceValue(func() Cap {
	last := Cap(0)
	for c := range Cap(64) {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
			break
		}
		last = c
	}
	return last
})

// RaiseEffective makes every permitted capability effective, on every
// thread: what file capabilities without the effective bit (`+p`) leave
// to the program. It returns the sets before and after.
func RaiseEffective() (before, after Sets, err error) {
	if before, err = Current(); err != nil {
		return before, before, err
	}
	if before.Effective == before.Permitted {
		return before, before, nil
	}
	if err := capsetAll(before.Permitted, before.Permitted, before.Inheritable); err != nil {
		return before, before, fmt.Errorf("raise %s into the effective set: %w", before.Permitted&^before.Effective, err)
	}
	after, err = Current()
	return before, after, err
}

// LimitInherited makes what a child started from now on can get from draind
// exactly give: it clears the inheritable and ambient sets (give reaches
// the child through SysProcAttr.AmbientCaps, which needs them in the
// permitted set) and, when CAP_SETPCAP is effective, removes every other
// capability from the bounding set, so that even a child running as root
// gets only give. Without CAP_SETPCAP (a non-root draind) the bounding
// set stays: a non-root child gains nothing from it unless its binary has
// file capabilities.
func LimitInherited(give Set) (Sets, error) {
	cur, err := Current()
	if err != nil {
		return cur, err
	}
	if missing := give &^ cur.Permitted; missing != 0 {
		return cur, fmt.Errorf("cannot pass %s to a child: not in the permitted set (%s)", missing, cur.Permitted)
	}
	if err := clearAmbient(); err != nil {
		return cur, err
	}
	if cur.Inheritable != 0 {
		if err := capsetAll(cur.Effective, cur.Permitted, 0); err != nil {
			return cur, fmt.Errorf("clear the inheritable set: %w", err)
		}
	}
	if cur.Effective.Has(CapSetPCap) {
		if err := dropBounding(cur.Bounding &^ give); err != nil {
			return cur, err
		}
	}
	return Current()
}

// Drop keeps only keep (of the permitted set) in the effective and
// permitted sets, clears the inheritable and ambient sets, empties the
// bounding set when CAP_SETPCAP is effective, and sets no_new_privs: no
// later execve (setuid, file capabilities) can give anything back. Every
// thread, irreversibly. It also makes the process non-dumpable: no
// process of its uid may ptrace it or read its /proc/PID/mem, environ or
// fd.
func Drop(keep Set) (Sets, error) {
	cur, err := Current()
	if err != nil {
		return cur, err
	}
	if err := allThreads(syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)); err != nil {
		return cur, fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := clearAmbient(); err != nil {
		return cur, err
	}
	if cur.Effective.Has(CapSetPCap) {
		if err := dropBounding(cur.Bounding); err != nil {
			return cur, err
		}
	}
	keep &= cur.Permitted
	if err := capsetAll(keep, keep, 0); err != nil {
		return cur, fmt.Errorf("keep only %s: %w", keep, err)
	}
	// Holding no capability, draind could be ptraced by a process of its
	// own uid (the proxy, when draind is not root): not any more. Its
	// /proc/PID/mem, environ, fd... then belong to root.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return cur, fmt.Errorf("set non-dumpable: %w", err)
	}
	return Current()
}

// Needs says what draind still does after start-up that a capability may
// guard.
type Needs struct {
	// SignalOtherUID is true when the proxy runs under a uid other than
	// draind's, and draind signals it at the stop (SIGTERM, SIGKILL):
	// CAP_KILL.
	SignalOtherUID bool
	// BPFObjects is true when eBPF maps and programs stay open and are read
	// (counters, program statistics, iterator snapshots after a loss).
	BPFObjects bool
	// OtherUsersProcs is true when the /proc poller follows the app's
	// processes, whose /proc/PID/ns/net it may read only with ptrace
	// access: CAP_SYS_PTRACE for another uid's.
	OtherUsersProcs bool
}

// Kept is a capability draind keeps after start-up, and why.
type Kept struct {
	Cap Cap
	Why string
}

// Keep is what of have (the permitted set) the needs still use: kept, each
// with its reason; lacking, what they would use but have does not hold
// (CAP_KILL for a proxy under another uid: the stop's signals will fail).
func (n Needs) Keep(have Set) (kept, lacking []Kept) {
	add := func(c Cap, why string) {
		if have.Has(c) {
			kept = append(kept, Kept{c, why})
		} else {
			lacking = append(lacking, Kept{c, why})
		}
	}
	if n.SignalOtherUID {
		add(CapKill, "signal the proxy, which runs under another uid")
	}
	// eBPF objects were opened with CAP_BPF or CAP_SYS_ADMIN: one of them
	// is held.
	if n.BPFObjects && have&SetOf(CapBPF, CapSysAdmin) != 0 && bpfCallsNeedCap() {
		why := "this kernel checks it on every bpf() call while kernel.unprivileged_bpf_disabled is set: reading the eBPF counters and taking snapshots need it"
		if !have.Has(CapBPF) {
			add(CapSysAdmin, why+" (eBPF was loaded with SYS_ADMIN: grant BPF and PERFMON instead)")
		} else {
			add(CapBPF, why)
		}
	}
	// The poller started with what it had: without the capability it
	// never read other users' processes, and goes on the same way.
	if n.OtherUsersProcs && have.Has(CapSysPtrace) {
		add(CapSysPtrace, "the /proc poller reads other users' /proc/PID/ns/net")
	}
	return kept, lacking
}

// KeptSet is the capabilities of kept.
func KeptSet(kept []Kept) Set {
	var s Set
	for _, k := range kept {
		s |= SetOf(k.Cap)
	}
	return s
}

// bpfCallsNeedCap reports whether this kernel refuses a bpf() call on an
// object already open to a caller without CAP_BPF (or CAP_SYS_ADMIN):
// older kernels check that on every bpf() command while
// kernel.unprivileged_bpf_disabled is set (5.10 here); since 6.5 (and in
// Debian's 6.1.0-50, which has the change) only creating maps and loading
// programs do. A version number does not tell backports, so it asks the
// kernel: on this thread alone, with both out of the effective set for the
// moment, a map lookup on fd -1 fails with EPERM (the old check) or EBADF
// (no check).
var bpfCallsNeedCap = sync.OnceValue(func() bool {
	runtime.LockOSThread()
	e, p, i, err := capget()
	if err != nil || e&SetOf(CapBPF, CapSysAdmin) == 0 {
		runtime.UnlockOSThread()
		return false // nothing to lose: eBPF was not usable anyway
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	lowered := capData(e&^SetOf(CapBPF, CapSysAdmin), p, i)
	if err := unix.Capset(&hdr, &lowered[0]); err != nil {
		runtime.UnlockOSThread()
		return true // cannot tell: keep it
	}
	var attr [32]byte // union bpf_attr for BPF_MAP_LOOKUP_ELEM: map_fd first
	*(*uint32)(unsafe.Pointer(&attr[0])) = ^uint32(0)
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_LOOKUP_ELEM, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	// Back to the sets every other thread has: raising the effective set
	// within the permitted one is always allowed. Were it refused, the
	// thread would stay locked to the calling goroutine, never handed to
	// another one with sets unlike the others'.
	restore := capData(e, p, i)
	if unix.Capset(&hdr, &restore[0]) != nil {
		return true
	}
	runtime.UnlockOSThread()
	return errno == unix.EPERM || errno == unix.EACCES
})

// TryLoadBPF tries to load a two-instruction kprobe program (it is closed at
// once): nil when this thread may load tracing programs (CAP_BPF and
// CAP_PERFMON, or CAP_SYS_ADMIN), an error wrapping EPERM when it may not.
// Unlike socket filters, which kernel.unprivileged_bpf_disabled=0 lets
// anyone load, a kprobe program always needs those capabilities.
func TryLoadBPF() error {
	// On the heap, which does not move: attr holds their addresses.
	insns := &[2]uint64{
		0x00000000000000b7, // r0 = 0 (BPF_ALU64|BPF_MOV|BPF_K)
		0x0000000000000095, // exit (BPF_JMP|BPF_EXIT)
	}
	license := &[4]byte{'G', 'P', 'L', 0}
	var attr [72]byte // union bpf_attr for BPF_PROG_LOAD
	*(*uint32)(unsafe.Pointer(&attr[0])) = unix.BPF_PROG_TYPE_KPROBE
	*(*uint32)(unsafe.Pointer(&attr[4])) = uint32(len(insns))
	*(*uint64)(unsafe.Pointer(&attr[8])) = uint64(uintptr(unsafe.Pointer(&insns[0])))
	*(*uint64)(unsafe.Pointer(&attr[16])) = uint64(uintptr(unsafe.Pointer(&license[0])))
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	runtime.KeepAlive(insns)
	runtime.KeepAlive(license)
	if errno != 0 {
		return fmt.Errorf("load a kprobe program: %w", errno)
	}
	unix.Close(int(fd))
	return nil
}

// TrySetns tries to enter the network namespace this thread is already in
// (a no-op when it succeeds): nil when setns is allowed (CAP_SYS_ADMIN), an
// error wrapping EPERM when it is not.
func TrySetns() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return nil
}

// Threads reads the sets of every thread of process pid (0: this one) from
// /proc/PID/task/TID/status, by thread id. Threads that end meanwhile are
// left out.
func Threads(pid int) (map[int]Sets, error) {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	out := make(map[int]Sets, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		s, err := ReadStatus(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		out[tid] = s
	}
	return out, nil
}

func capData(e, p, i Set) [2]unix.CapUserData {
	return [2]unix.CapUserData{
		{Effective: uint32(e), Permitted: uint32(p), Inheritable: uint32(i)},
		{Effective: uint32(e >> 32), Permitted: uint32(p >> 32), Inheritable: uint32(i >> 32)},
	}
}

// capget reads the calling thread's effective, permitted and inheritable
// sets.
func capget() (e, p, i Set, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, 0, 0, fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) Set { return Set(lo) | Set(hi)<<32 }
	return join(data[0].Effective, data[1].Effective), join(data[0].Permitted, data[1].Permitted),
		join(data[0].Inheritable, data[1].Inheritable), nil
}

// capsetAll sets the three sets on every thread.
func capsetAll(e, p, i Set) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := capData(e, p, i)
	// The conversions are in the call: AllThreadsSyscall keeps what they
	// point to alive and in place (go:uintptrescapes).
	return allThreads(syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0))
}

func clearAmbient() error {
	if err := allThreads(syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0)); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	return nil
}

// dropBounding removes drop from every thread's bounding set (CAP_SETPCAP).
func dropBounding(drop Set) error {
	for _, c := range drop.Caps() {
		if err := allThreads(syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)); err != nil {
			return fmt.Errorf("drop %s from the bounding set: %w", c, err)
		}
	}
	return nil
}

// allThreads is the error of a syscall.AllThreadsSyscall: the syscall ran
// on every thread of the runtime (or, on an error, on none after the
// first). The runtime returns ENOTSUP without doing anything in a cgo
// binary.
func allThreads(_, _ uintptr, errno syscall.Errno) error {
	switch errno {
	case 0:
		return nil
	case syscall.ENOTSUP:
		return fmt.Errorf("%w (%w)", ErrCgo, errno)
	}
	return errno
}
