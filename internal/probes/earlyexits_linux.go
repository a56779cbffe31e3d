package probes

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type early_exit earlyexits ../../bpf/earlyexits.c -- -I../../bpf -O2 -g -Wall -Werror

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
)

// The layout of struct early_exit and whoami's map size in bpf/earlyexits.c.
const (
	earlyExitSize = 56
	earlyLevels   = 16
)

// EarlyExits records, from the moment OpenEarlyExits returns, how the
// processes of draind's pod's other containers ended (bpf/earlyexits.c):
// it needs no kernel BTF, so it is live long before Procs, and an app
// container that ran and left during draind's start-up leaves its exit
// status there. Exits and Close may be called from any goroutine.
type EarlyExits struct {
	objs earlyexitsObjects
	// Pod and Own are the pod's cgroup and draind's container's (v2 ids).
	Pod, Own uint64
	lnk      link.Link
	rd       *ringbuf.Reader

	mu     sync.Mutex // serialises Exits and Close
	seen   []EarlyExit
	closed bool
}

// EarlyExit is one process of another container of the pod that ended.
type EarlyExit struct {
	// Ktime is CLOCK_MONOTONIC (bpf_ktime_get_ns) when it ended.
	Ktime uint64
	// Container is its container's cgroup (the one below the pod's);
	// Cgroup its own.
	Container, Cgroup uint64
	TGID              int
	// Code is the siginfo's si_code (CLDExited, CLDKilled, CLDDumped; other
	// codes are a stop or a continue, never an end); Status its exit code
	// or signal.
	Code, Status int
	Comm         string
}

// The si_code values of a SIGCHLD that says its process ended.
const (
	CLDExited = 1
	CLDKilled = 2
	CLDDumped = 3
)

// Ended reports whether e is an end (not a stop or a continue).
func (e EarlyExit) Ended() bool {
	return e.Code == CLDExited || e.Code == CLDKilled || e.Code == CLDDumped
}

// ErrNoPodCgroup is returned by OpenEarlyExits when draind's cgroup v2 has
// no parent to take for its pod's: a cgroup v1 node (every task in v2's
// root), or draind at the hierarchy's top.
var ErrNoPodCgroup = errors.New("no pod cgroup above draind's own (cgroup v2)")

// OpenEarlyExits loads bpf/earlyexits.c, asks the kernel for draind's
// cgroup's ancestors (the whoami program, run once in this thread's
// context), takes the parent of draind's container's cgroup for the pod's,
// and attaches. It needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) and
// Linux 5.10; without them the error is an *UnavailableError. The caller
// must know the parent is a pod's (a Kubernetes container's cgroup is
// always its pod's child): elsewhere a sibling's processes would count.
func OpenEarlyExits() (*EarlyExits, error) {
	raiseMemlock()
	e := &EarlyExits{}
	if err := loadEarlyexitsObjects(&e.objs, nil); err != nil {
		return nil, unavailable(err)
	}
	if err := e.whoami(); err != nil {
		e.objs.Close()
		return nil, err
	}
	var err error
	if e.rd, err = ringbuf.NewReader(e.objs.Exits); err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	if e.lnk, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: "signal_generate", Program: e.objs.EarlySigchld}); err != nil {
		e.rd.Close()
		e.objs.Close()
		return nil, unavailable(fmt.Errorf("attach raw_tp/signal_generate: %w", err))
	}
	return e, nil
}

// whoami runs the whoami program in this thread's context and writes the
// pod's level and cgroup, and draind's container's, into config.
func (e *EarlyExits) whoami() error {
	// Five zero arguments: the program reads none.
	if _, err := e.objs.EarlyWhoami.Run(&ebpf.RunOptions{Context: make([]byte, 5*8)}); err != nil {
		return unavailable(fmt.Errorf("run whoami: %w", err))
	}
	var own uint64
	if err := e.objs.Self.Lookup(uint32(earlyLevels), &own); err != nil {
		return fmt.Errorf("read whoami: %w", err)
	}
	ancestors := make([]uint64, 0, earlyLevels)
	for l := range uint32(earlyLevels) {
		var id uint64
		if err := e.objs.Self.Lookup(l, &id); err != nil {
			return fmt.Errorf("read whoami: %w", err)
		}
		if id == 0 {
			break
		}
		ancestors = append(ancestors, id)
		if id == own {
			break
		}
	}
	level, pod, container, ok := podOf(ancestors, own)
	if !ok {
		return ErrNoPodCgroup
	}
	for i, v := range []uint64{uint64(level), pod, container} {
		if err := e.objs.Config.Put(uint32(i), v); err != nil {
			return fmt.Errorf("write config: %w", err)
		}
	}
	e.Pod, e.Own = pod, container
	return nil
}

// podOf finds, in the ancestors of a cgroup (by level, root first, ending
// with own), the container's cgroup (own, the level below the pod's) and
// the pod's (its parent). The root (level 0) is never a pod's.
func podOf(ancestors []uint64, own uint64) (level int, pod, container uint64, ok bool) {
	n := len(ancestors)
	if n < 3 || ancestors[n-1] != own {
		return 0, 0, 0, false
	}
	return n - 2, ancestors[n-2], own, true
}

// Exits returns every record so far, oldest first, and how many the ring
// had no room for.
func (e *EarlyExits) Exits() ([]EarlyExit, uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, 0, fmt.Errorf("early exits: %w", os.ErrClosed)
	}
	// What is in the ring now, without waiting for more.
	e.rd.SetDeadline(time.Now())
	var rec ringbuf.Record
	for {
		if err := e.rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			return nil, 0, fmt.Errorf("early exits: %w", err)
		}
		if r, ok := decodeEarlyExit(rec.RawSample); ok {
			e.seen = append(e.seen, r)
		}
	}
	var lost uint64
	if err := e.objs.Lost.Get(&lost); err != nil {
		return nil, 0, fmt.Errorf("early exits: %w", err)
	}
	return slices.Clone(e.seen), lost, nil
}

// decodeEarlyExit decodes one struct early_exit.
func decodeEarlyExit(b []byte) (EarlyExit, bool) {
	le := binary.LittleEndian
	if len(b) < earlyExitSize || le.Uint64(b[0:]) == 0 {
		return EarlyExit{}, false
	}
	comm := b[40:56]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return EarlyExit{
		Ktime: le.Uint64(b[0:]), Container: le.Uint64(b[8:]), Cgroup: le.Uint64(b[16:]),
		TGID: int(le.Uint32(b[24:])), Code: int(int32(le.Uint32(b[28:]))), Status: int(int32(le.Uint32(b[32:]))),
		Comm: string(comm),
	}, true
}

// Close detaches the program and releases the maps; safe twice.
func (e *EarlyExits) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	errs = append(errs, e.lnk.Close(), e.rd.Close(), e.objs.Close())
	return errors.Join(errs...)
}
