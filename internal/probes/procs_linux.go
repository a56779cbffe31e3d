package probes

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type proc_event procs ../../bpf/procs.c -- -I../../bpf -O2 -g -Wall -Werror

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
)

// Procs follows the processes of one network namespace with the programs
// of bpf/procs.c: tp_btf sched_process_fork/exec/exit report every change
// through a ring buffer (ReadEvent), and a task iterator takes a snapshot
// on demand (Snapshot): the processes of the loader's PID namespace, and a
// walk of every process of the node, since the namespace's processes are
// in other PID namespaces in a pod.
//
// The programs run from the moment OpenProcs returns: events are queued
// while a snapshot is taken. One goroutine reads events; Snapshot,
// SetDeadline, Lost, PIDNS and Close may be called from any goroutine.
type Procs struct {
	objs     procsLoaded
	attached // links: exit, fork, exec
	pidns    uint64
	walkCap  int
	outCap   int // walk_out's records

	snapMu  sync.Mutex // one snapshot at a time: walk_out is one buffer
	iter    *link.Iter // under snapMu once open
	walkOut []byte     // walk_out, mapped read-only; under snapMu once open

	full perCPUCounter // ring reservations that failed

	attachedAt atomic.Uint64 // AttachedAt

	closeOnce sync.Once
	closeErr  error
}

// procsLoaded is what the loader takes from the spec: programs and maps,
// not the variables (the .bss only holds the pointer that makes clang emit
// struct proc_event).
type procsLoaded struct {
	procsPrograms
	procsMaps
}

// procEventSize is sizeof(struct proc_event) in bpf/procs.c.
const procEventSize = 80

// Offsets in struct proc_event (little-endian).
const (
	peTs     = 0
	peStart  = 8
	peKind   = 16
	peTgid   = 20
	pePid    = 24
	pePpid   = 28
	peUID    = 32
	peFlags  = 36
	peNSPid  = 40
	peNSPpid = 44
	peStatus = 48
	peNetNS  = 52
	peComm   = 56
	peMntNS  = 72
)

// The iterator's kinds of record (the events' are ProcEventKind).
const (
	procRecTask = 1
	procRecEnd  = 2
)

// OpenProcs loads bpf/procs.c for the namespace whose inode is netnsInode
// (see Net.Inode) and attaches it. It needs BTF, CAP_BPF and CAP_PERFMON
// (or CAP_SYS_ADMIN) and Linux 5.8; without them the error is an
// *UnavailableError. Other errors are the caller's (bad options).
func OpenProcs(netnsInode uint64, opts ProcOptions) (*Procs, error) {
	if netnsInode == 0 {
		return nil, errors.New("open procs probe: netns inode 0")
	}
	o := opts.withDefaults()
	if err := prepare("procs probe", o.RingSize); err != nil {
		return nil, err
	}
	// The PID namespace NSPID numbers are in. 0 (unknown) matches none:
	// every NSPID is then 0.
	pidns, _, _ := namespace.SelfPID()
	p := &Procs{pidns: pidns, walkCap: o.WalkCap, outCap: o.WalkOut}
	if err := p.load(netnsInode, o); err != nil {
		p.Close()
		return nil, unavailable(err)
	}
	return p, nil
}

func (p *Procs) load(netnsInode uint64, o ProcOptions) (err error) {
	spec, err := loadProcs()
	if err != nil {
		return err
	}
	if err := setProcsConstants(spec, netnsInode, p.pidns, uint32(o.WalkCap)); err != nil {
		return err
	}
	spec.Maps[procsMapProcEvents].MaxEntries = uint32(o.RingSize)
	spec.Maps[procsMapWalkOut].MaxEntries = uint32(o.WalkOut)
	if err := spec.LoadAndAssign(&p.objs, &ebpf.CollectionOptions{Cache: o.BTFCache}); err != nil {
		return err
	}
	// Mapped here rather than through Map.Memory, which unmaps only when
	// garbage collected: Close unmaps it.
	size := (o.WalkOut*procEventSize + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1)
	if p.walkOut, err = unix.Mmap(p.objs.WalkOut.FD(), 0, size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("mmap walk_out: %w", err)
	}
	p.hooks = []hook{{"sched_process_exit", p.objs.ProcsExit}, {"sched_process_fork", p.objs.ProcsFork}, {"sched_process_exec", p.objs.ProcsExec}}
	if !o.Detached {
		if err := p.attachNow(); err != nil {
			return err
		}
	}
	// The iterator's link runs nothing until a snapshot reads it.
	if p.iter, err = link.AttachIter(link.IterOptions{Program: p.objs.ProcsIter}); err != nil {
		return fmt.Errorf("attach iter/task: %w", err)
	}
	if p.ring, err = newRingReader(p.objs.ProcEvents); err != nil {
		return err
	}
	p.full = perCPUCounter{m: p.objs.ProcLost}
	return nil
}

// setProcsConstants sets the load-time constants of bpf/procs.c: the
// namespace (target_netns), the PID namespace the NSPID fields are in
// (reader_pidns), and the walk's cap (walk_cap).
func setProcsConstants(spec *ebpf.CollectionSpec, netns, pidns uint64, walkCap uint32) error {
	if err := spec.Variables[procsVarTargetNetns].Set(netns); err != nil {
		return err
	}
	if err := spec.Variables[procsVarWalkCap].Set(walkCap); err != nil {
		return err
	}
	return spec.Variables[procsVarReaderPidns].Set(pidns)
}

// Attach attaches the fork, exec and exit programs of a probe opened
// Detached (see TCPState.Attach). Snapshots work either way: the iterator
// runs only when read.
func (p *Procs) Attach() error {
	if err := p.attachNow(); err != nil {
		return unavailable(err)
	}
	return nil
}

// attachNow attaches and notes when (AttachedAt).
func (p *Procs) attachNow() error {
	at := uint64(KtimeNow())
	if err := p.attach(); err != nil {
		return err
	}
	p.attachedAt.CompareAndSwap(0, at)
	return nil
}

// AttachedAt is CLOCK_MONOTONIC (bpf_ktime_get_ns) just before the exit
// program attached, 0 before: an exit before it is not among the events.
func (p *Procs) AttachedAt() uint64 { return p.attachedAt.Load() }

// Attached reports whether the fork, exec and exit programs run.
func (p *Procs) Attached() bool { return p.isAttached() }

// PIDNS is the inode of the PID namespace the NSPID fields are in: the
// loader's (0 when it could not be read: then they are all 0).
func (p *Procs) PIDNS() uint64 { return p.pidns }

// Snapshot runs the task iterator: the records of the loader's PID
// namespace (its seq_file), then those of the walk (walk_out). A process
// whose thread-group leader exited before its other threads is found
// through them.
func (p *Procs) Snapshot() (ProcSnapshot, error) {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	if p.iter == nil {
		return ProcSnapshot{}, fmt.Errorf("run task iterator: %w", os.ErrClosed)
	}
	snap := ProcSnapshot{Start: KtimeNow(), Tasks: make(map[int]ProcTask)}
	r, err := p.iter.Open()
	if err != nil {
		return ProcSnapshot{}, fmt.Errorf("run task iterator: %w", err)
	}
	defer r.Close()
	br := bufio.NewReaderSize(r, 64*procEventSize)
	var buf [procEventSize]byte
	le := binary.LittleEndian
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return ProcSnapshot{}, errors.New("task iterator ended without its END record")
			}
			return ProcSnapshot{}, fmt.Errorf("read task iterator: %w", err)
		}
		switch kind := le.Uint32(buf[peKind:]); kind {
		case procRecTask:
			// Threads of one process may each report it (a leader gone):
			// the leader's fields are the same in every record.
			t := decodeProcTask(buf[:])
			snap.Tasks[t.PID] = t
		case procRecEnd:
			// END's pid and ppid fields count the walk's processes.
			snap.Self = int(le.Uint32(buf[peTgid:]))
			snap.Walk = ProcWalk{
				Visited: int(le.Uint32(buf[pePid:])), Written: int(le.Uint32(buf[pePpid:])),
				HostNetNS: uint64(le.Uint32(buf[peNetNS:])), flags: le.Uint32(buf[peFlags:]),
				cap: p.walkCap, out: p.outCap,
			}
			if err := p.readWalk(&snap); err != nil {
				return ProcSnapshot{}, err
			}
			return snap, nil
		default:
			return ProcSnapshot{}, fmt.Errorf("task iterator: record kind %d", kind)
		}
	}
}

// readWalk adds the walk's records (walk_out) to snap. The iterator has
// returned: the program that wrote them is done.
func (p *Procs) readWalk(snap *ProcSnapshot) error {
	n := snap.Walk.Written
	if n < 0 || n > p.outCap {
		return fmt.Errorf("task iterator: walk wrote %d records, the map holds %d", n, p.outCap)
	}
	b := p.walkOut[:n*procEventSize]
	for off := 0; off < len(b); off += procEventSize {
		rec := b[off : off+procEventSize]
		if kind := binary.LittleEndian.Uint32(rec[peKind:]); kind != procRecTask {
			return fmt.Errorf("walk_out: record kind %d", kind)
		}
		t := decodeProcTask(rec)
		snap.Tasks[t.PID] = t
	}
	return nil
}

// ReadEvent blocks until the next change and decodes it into ev. A
// deadline (SetDeadline) and Close end it as they end TCPState.ReadEvent:
// os.ErrDeadlineExceeded once the ring is drained, os.ErrClosed.
func (p *Procs) ReadEvent(ev *ProcEvent) error {
	return p.ring.read("process event", func(b []byte, more bool) error { return decodeProcEvent(b, more, ev) })
}

// SetDeadline sets when ReadEvent gives up (the zero time: never), from
// any goroutine, as TCPState.SetDeadline does.
func (p *Procs) SetDeadline(t time.Time) { p.ring.setDeadline(t) }

// Lost is the number of events the kernel could not put in the ring buffer
// (it was full), summed over CPUs, since OpenProcs. When it grows, take a
// snapshot: what was missed is in it. It costs a bpf syscall.
func (p *Procs) Lost() uint64 { return p.lost.read(p.full.sum) }

// Close detaches the programs and frees everything; a blocked ReadEvent
// returns an error wrapping os.ErrClosed. It is safe to call twice.
func (p *Procs) Close() error {
	p.closeOnce.Do(func() {
		errs := p.detach()
		p.snapMu.Lock()
		if p.iter != nil {
			errs = append(errs, p.iter.Close())
			p.iter = nil
		}
		if p.walkOut != nil {
			errs = append(errs, unix.Munmap(p.walkOut))
			p.walkOut = nil
		}
		p.snapMu.Unlock()
		errs = append(errs, p.objs.procsPrograms.Close(), p.objs.procsMaps.Close())
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// decodeProcEvent reads a struct proc_event from the ring buffer.
func decodeProcEvent(b []byte, more bool, ev *ProcEvent) error {
	if len(b) < procEventSize {
		return fmt.Errorf("process event: %d bytes, want %d", len(b), procEventSize)
	}
	le := binary.LittleEndian
	*ev = ProcEvent{
		Time:   time.Duration(le.Uint64(b[peTs:])),
		Kind:   ProcEventKind(le.Uint32(b[peKind:])),
		Task:   decodeProcTask(b),
		Status: le.Uint32(b[peStatus:]),
		More:   more,
	}
	return nil
}

// decodeProcTask reads the process of a struct proc_event of
// procEventSize bytes.
func decodeProcTask(b []byte) ProcTask {
	le := binary.LittleEndian
	comm := b[peComm : peComm+16]
	if i := slices.Index(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return ProcTask{
		PID:       int(le.Uint32(b[peTgid:])),
		PPID:      int(le.Uint32(b[pePpid:])),
		UID:       le.Uint32(b[peUID:]),
		Comm:      string(comm),
		StartTime: le.Uint64(b[peStart:]),
		NSPID:     int(le.Uint32(b[peNSPid:])),
		NSPPID:    int(le.Uint32(b[peNSPpid:])),
		MountNS:   uint64(le.Uint32(b[peMntNS:])),
	}
}
