package probes

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// prepare is the first step of every load: the kernel's BTF must be there
// (tp_btf attaches by BTF id, and CO-RE relocates against it), the ring
// size must be one the kernel takes, and RLIMIT_MEMLOCK is lifted where the
// kernel still charges BPF memory to it.
func prepare(what string, ringSize int) error {
	if ringSize < os.Getpagesize() || ringSize&(ringSize-1) != 0 || ringSize > 1<<30 {
		return fmt.Errorf("open %s: ring size %d is not a power of two between the page size and 1 GiB", what, ringSize)
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return &UnavailableError{Reason: "kernel has no BTF", Err: err}
	}
	raiseMemlock()
	return nil
}

// unavailable turns a load or attach failure into an *UnavailableError
// with a one-line Reason.
func unavailable(err error) error {
	return &UnavailableError{Reason: unavailableReason(err), Err: err}
}

// unavailableReason says in one line why an eBPF object could not be
// loaded or attached, logged once when draind falls back.
func unavailableReason(err error) string {
	var ve *ebpf.VerifierError
	switch {
	case errors.Is(err, ebpf.ErrNotSupported) && strings.Contains(err.Error(), "iterator"):
		return "kernel too old (needs 5.8 for the BPF task iterator)"
	case errors.Is(err, unix.EPERM) || errors.Is(err, os.ErrPermission):
		return "no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"
	case errors.As(err, &ve):
		return "verifier: " + verifierSummary(ve.Log)
	}
	// Tell an old kernel from anything else. The feature probes run only on
	// this failure path; the features package caches their results.
	if errors.Is(features.HaveProgramType(ebpf.Tracing), ebpf.ErrNotSupported) {
		return "kernel too old (needs 5.5 for tp_btf)"
	}
	if errors.Is(features.HaveMapType(ebpf.RingBuf), ebpf.ErrNotSupported) {
		return "kernel too old (needs 5.8 for the BPF ring buffer)"
	}
	return "load: " + oneLine(err.Error())
}

// verifierSummary keeps the lines that say what went wrong: the last three
// of the log, without the statistics the verifier prints at the end.
func verifierSummary(log []string) string {
	var keep []string
	for i := len(log) - 1; i >= 0 && len(keep) < 3; i-- {
		l := strings.TrimSpace(log[i])
		if l == "" || strings.HasPrefix(l, "processed ") || strings.HasPrefix(l, "verification time") ||
			strings.HasPrefix(l, "stack depth") {
			continue
		}
		keep = append(keep, l)
	}
	if len(keep) == 0 {
		return "program rejected (no log)"
	}
	for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
		keep[i], keep[j] = keep[j], keep[i]
	}
	return oneLine(strings.Join(keep, " | "))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// raiseMemlock lifts RLIMIT_MEMLOCK on kernels before 5.11, which charge
// BPF memory to it (later ones charge the memory cgroup). It needs
// CAP_SYS_RESOURCE; without it a load fails with EPERM if the limit is too
// low, reported as a capability problem. Not done through
// cilium/ebpf/rlimit, whose init runs a BPF syscall in every process that
// links it.
func raiseMemlock() {
	if kernelAtLeast(KernelRelease(), 5, 11) {
		return
	}
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	_ = unix.Prlimit(0, unix.RLIMIT_MEMLOCK, &inf, nil)
}

// KernelRelease is uname -r.
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelAtLeast parses "6.18.44-foo" style releases.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi := 0
	for _, c := range parts[1] {
		if c < '0' || c > '9' {
			break
		}
		mi = mi*10 + int(c-'0')
	}
	if err1 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// perCPUCounter sums a one-slot per-CPU u64 array (the programs' counters
// of failed ring reservations and the like), reusing its buffer.
type perCPUCounter struct {
	m   *ebpf.Map
	buf []uint64
}

func (c *perCPUCounter) sum() (uint64, error) {
	if err := c.m.Lookup(uint32(0), &c.buf); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range c.buf {
		n += v
	}
	return n, nil
}
