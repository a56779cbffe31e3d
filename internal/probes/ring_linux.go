package probes

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
)

// attached is what every probe holds once loaded, besides its programs
// and maps: its links, its ring buffer's reader and its loss counter.
type attached struct {
	// hooks are the programs to attach, in the order they run in. A
	// probe opened Detached attaches them at Attach; until then it is
	// loaded (verified, its maps made) and runs for no event.
	hooks  []hook
	linkMu sync.Mutex
	links  []link.Link // attached hooks, in hooks' order
	closed bool        // under linkMu: detach ran
	ring   *ringReader
	lost   lostCount
}

// hook is a tp_btf program and the tracepoint it runs at.
type hook struct {
	tracepoint string
	prog       *ebpf.Program
}

// attach attaches every hook not attached yet, in order. Idempotent; an
// error leaves the hooks attached so far attached (detach closes them).
func (a *attached) attach() error {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	if a.closed {
		return fmt.Errorf("attach: %w", os.ErrClosed)
	}
	for _, h := range a.hooks[len(a.links):] {
		l, err := link.AttachTracing(link.TracingOptions{Program: h.prog, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return fmt.Errorf("attach tp_btf/%s: %w", h.tracepoint, err)
		}
		a.links = append(a.links, l)
	}
	return nil
}

// isAttached reports whether every hook runs.
func (a *attached) isAttached() bool {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	return !a.closed && len(a.links) == len(a.hooks)
}

// detach freezes the loss counter, closes the links (the programs stop
// running) and the ring reader (a blocked read returns os.ErrClosed). The
// probe closes its programs and maps after.
func (a *attached) detach() []error {
	a.lost.close()
	a.linkMu.Lock()
	a.closed = true
	var errs []error
	for _, l := range a.links {
		errs = append(errs, l.Close())
	}
	a.links = nil
	a.linkMu.Unlock()
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
