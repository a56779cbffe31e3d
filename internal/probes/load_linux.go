package probes

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
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

// attached is what every probe holds once loaded, besides its programs
// and maps: its links, its ring buffer's reader and its loss counter.
type attached struct {
	links []link.Link
	ring  *ringReader
	lost  lostCount
}

// detach freezes the loss counter, closes the links (the programs stop
// running) and the ring reader (a blocked read returns os.ErrClosed). The
// probe closes its programs and maps after.
func (a *attached) detach() []error {
	a.lost.close()
	var errs []error
	for _, l := range a.links {
		errs = append(errs, l.Close())
	}
	return append(errs, a.ring.close())
}

// lostCount is a loss counter read through a probe's maps, which Close
// frees: after Close, or when a read fails, the last value read stands,
// and it never goes down (the kernel's counters only grow; this guards
// against reading several of them at slightly different moments).
type lostCount struct {
	mu     sync.Mutex
	closed bool
	last   uint64
}

func (l *lostCount) read(sum func() (uint64, error)) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.last
	}
	if n, err := sum(); err == nil {
		l.last = max(l.last, n)
	}
	return l.last
}

// close makes read return the last value: the maps are about to go.
func (l *lostCount) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

// ringReader reads a probe's ring buffer, one record at a time into a
// reused record, with a deadline any goroutine may move while a read
// blocks (SetDeadline).
type ringReader struct {
	rd     *ringbuf.Reader
	mu     sync.Mutex // serialises read: rec is reused
	rec    ringbuf.Record
	rdDl   int64        // deadline last given to rd (UnixNano, 0: none); under mu
	dl     atomic.Int64 // deadline asked by setDeadline (UnixNano, 0: none)
	closed atomic.Bool
}

func newRingReader(m *ebpf.Map) (*ringReader, error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	return &ringReader{rd: rd}, nil
}

// read blocks until the next record and hands it to decode, with whether
// more were queued behind it; the bytes are valid during the call only.
// It returns os.ErrDeadlineExceeded once the deadline has passed and the
// records already in the ring have been read, and an error wrapping
// os.ErrClosed (== ringbuf.ErrClosed) after close; other errors say what
// was read.
func (r *ringReader) read(what string, decode func(b []byte, more bool) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.next(what); err != nil {
		return err
	}
	return decode(r.rec.RawSample, r.rec.Remaining > 0)
}

// next is read's wait for a record, into r.rec.
func (r *ringReader) next(what string) error {
	for {
		dl := r.dl.Load()
		if dl != r.rdDl {
			r.rd.SetDeadline(unixNanoTime(dl))
			r.rdDl = dl
		}
		err := r.rd.ReadInto(&r.rec)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ringbuf.ErrFlushed):
			// setDeadline woke us to look at a new deadline.
			if dl := r.dl.Load(); dl != 0 && time.Now().UnixNano() >= dl {
				return os.ErrDeadlineExceeded
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Retry if the deadline was moved meanwhile.
			if dl := r.dl.Load(); dl == 0 || time.Now().UnixNano() < dl {
				continue
			}
			return os.ErrDeadlineExceeded
		default:
			return fmt.Errorf("read %s: %w", what, err)
		}
	}
}

func unixNanoTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// setDeadline sets when a blocked or future next gives up; the zero time
// removes the deadline.
func (r *ringReader) setDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
		if ns == 0 { // the epoch itself: still a deadline, long past
			ns = 1
		}
	}
	r.dl.Store(ns)
	if !r.closed.Load() {
		_ = r.rd.Flush() // wake a blocked next; an error means closed
	}
}

// close unblocks next (os.ErrClosed) and frees the reader's mapping.
func (r *ringReader) close() error {
	if r == nil {
		return nil
	}
	r.closed.Store(true)
	return r.rd.Close()
}
