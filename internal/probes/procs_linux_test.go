package probes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testenv/testutil"
)

func TestProcEventLayout(t *testing.T) {
	var ev procsProcEvent
	if got := binary.Size(ev); got != procEventSize {
		t.Fatalf("sizeof(struct proc_event) = %d, procEventSize = %d", got, procEventSize)
	}
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"ts_ns", unsafe.Offsetof(ev.TsNs), peTs},
		{"start_ns", unsafe.Offsetof(ev.StartNs), peStart},
		{"kind", unsafe.Offsetof(ev.Kind), peKind},
		{"tgid", unsafe.Offsetof(ev.Tgid), peTgid},
		{"pid", unsafe.Offsetof(ev.Pid), pePid},
		{"ppid", unsafe.Offsetof(ev.Ppid), pePpid},
		{"uid", unsafe.Offsetof(ev.Uid), peUID},
		{"flags", unsafe.Offsetof(ev.Flags), peFlags},
		{"nspid", unsafe.Offsetof(ev.Nspid), peNSPid},
		{"nsppid", unsafe.Offsetof(ev.Nsppid), peNSPpid},
		{"status", unsafe.Offsetof(ev.Status), peStatus},
		{"netns", unsafe.Offsetof(ev.Netns), peNetNS},
		{"comm", unsafe.Offsetof(ev.Comm), peComm},
		{"mntns", unsafe.Offsetof(ev.Mntns), peMntNS},
	} {
		if f.got != f.want {
			t.Errorf("offset of %s = %d, decoder uses %d", f.name, f.got, f.want)
		}
	}
	b := make([]byte, procEventSize)
	le := binary.LittleEndian
	le.PutUint64(b[peTs:], 7)
	le.PutUint64(b[peStart:], 99)
	le.PutUint32(b[peKind:], uint32(ProcFork))
	le.PutUint32(b[peTgid:], 42)
	le.PutUint32(b[pePpid:], 1)
	le.PutUint32(b[peUID:], 1337)
	le.PutUint32(b[peNSPid:], 3)
	le.PutUint32(b[peNSPpid:], 2)
	le.PutUint32(b[peStatus:], 3<<8)
	le.PutUint32(b[peNetNS:], 4026531840)
	copy(b[peComm:], "envoy\x00junk")
	le.PutUint32(b[peMntNS:], 4026532001)
	var got ProcEvent
	if err := decodeProcEvent(b, true, &got); err != nil {
		t.Fatal(err)
	}
	want := ProcEvent{Time: 7, Kind: ProcFork, Status: 3 << 8, More: true,
		Task: ProcTask{PID: 42, PPID: 1, UID: 1337, Comm: "envoy", StartTime: 99, NSPID: 3, NSPPID: 2, MountNS: 4026532001}}
	if got != want {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
	if err := decodeProcEvent(b[:10], false, &got); err == nil {
		t.Error("short record decoded")
	}

	// The walk's cap defaults to its maximum, WALK_MAX.
	spec, err := loadProcs()
	if err != nil {
		t.Fatal(err)
	}
	var walkMax uint32
	if err := spec.Variables[procsVarWalkCap].Get(&walkMax); err != nil || walkMax != MaxProcWalk {
		t.Errorf("walk_cap = %d (%v), MaxProcWalk = %d", walkMax, err, MaxProcWalk)
	}
}

func TestProcWalk(t *testing.T) {
	for _, tt := range []struct {
		flags     uint32
		complete  bool
		shortfall string
	}{
		{procWalkDone, true, ""},
		{procWalkDone | procWalkCap, false, "the node has more than 8 processes (the walk's cap)"},
		{procWalkFull, false, "the namespace has more than 2 processes"},
		{procWalkFault, false, "the kernel's process list could not be read (after 5 processes)"},
		{0, false, "the walk ended without a result (flags 0x0)"},
	} {
		w := ProcWalk{Visited: 5, flags: tt.flags, cap: 8, out: 2}
		if w.Complete() != tt.complete || w.Shortfall() != tt.shortfall {
			t.Errorf("flags %#x: complete %v, shortfall %q; want %v, %q", tt.flags, w.Complete(), w.Shortfall(), tt.complete, tt.shortfall)
		}
		s := ProcSnapshot{Start: 10, Walk: w}
		if want := map[bool]time.Duration{true: 10, false: 0}[tt.complete]; s.Since() != want {
			t.Errorf("flags %#x: Since %v, want %v", tt.flags, s.Since(), want)
		}
	}
}

// --- kernel tests ----------------------------------------------------------

// openTestProcs opens the real probe on ns. As root on a kernel with BTF a
// failure fails the test: it is never a skip.
func openTestProcs(tb testing.TB, inode uint64, opts ProcOptions) *Procs {
	tb.Helper()
	testutil.RequireRoot(tb)
	testutil.RequireBTF(tb)
	p, err := OpenProcs(inode, opts)
	if err != nil {
		tb.Fatalf("OpenProcs: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// startIn starts argv in ns, a child of the test process.
func startIn(t *testing.T, ns *testutil.NetNS, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var err error
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// TestProcs: a snapshot finds a process of the namespace, and the events
// tell a process's fork, exec and exit with its status; a deadline and
// Close end a blocked ReadEvent.
func TestProcs(t *testing.T) {
	ns := testutil.NewNetNS(t)
	p := openTestProcs(t, ns.Inode, ProcOptions{})
	_, initial, _ := namespace.SelfPID()

	sleeper := startIn(t, ns, "sleep", "infinity")
	snap, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	task, ok := snap.Tasks[sleeper.Process.Pid]
	if !initial {
		// The kernel's pids are not ours: find it by its pid here.
		for _, tk := range snap.Tasks {
			if tk.NSPID == sleeper.Process.Pid {
				task, ok = tk, true
			}
		}
	}
	if !ok || task.Comm != "sleep" || task.NSPID != sleeper.Process.Pid || task.StartTime == 0 {
		t.Fatalf("snapshot: sleep (pid %d) is %+v (found %v); tasks %+v", sleeper.Process.Pid, task, ok, snap.Tasks)
	}
	// The mount namespace is the one /proc/PID/ns/mnt names: the key of a
	// process's container.
	var mnt unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", sleeper.Process.Pid), &mnt); err != nil {
		t.Fatal(err)
	}
	if task.MountNS != mnt.Ino {
		t.Errorf("snapshot: sleep's mount namespace %d, /proc says %d", task.MountNS, mnt.Ino)
	}
	if !snap.Walk.Complete() || snap.Walk.HostNetNS == 0 || snap.Walk.HostNetNS == ns.Inode || snap.Self == 0 || snap.Since() != snap.Start {
		t.Errorf("snapshot: walk %+v (%s), self %d, start %v", snap.Walk, snap.Walk.Shortfall(), snap.Self, snap.Start)
	}
	t.Logf("walk: %d processes visited, %d of the namespace", snap.Walk.Visited, snap.Walk.Written)

	// A process born after the snapshot: fork, exec, exit 3.
	before := KtimeNow()
	sh := startIn(t, ns, "/bin/sh", "-c", "exit 3")
	sh.Wait()
	p.SetDeadline(time.Now().Add(15 * time.Second))
	var ev ProcEvent
	var seen []ProcEventKind
	for len(seen) < 3 {
		if err := p.ReadEvent(&ev); err != nil {
			t.Fatalf("ReadEvent after %v: %v", seen, err)
		}
		if ev.Task.NSPID != sh.Process.Pid {
			continue // the sleeper's exit at cleanup, or another process
		}
		if ev.Time < before {
			t.Errorf("event %+v older than the process", ev)
		}
		seen = append(seen, ev.Kind)
		switch ev.Kind {
		case ProcExec:
			if ev.Task.Comm != "sh" {
				t.Errorf("exec: comm %q, want sh", ev.Task.Comm)
			}
			if ev.Task.MountNS != mnt.Ino {
				t.Errorf("exec: mount namespace %d, want %d", ev.Task.MountNS, mnt.Ino)
			}
		case ProcExit:
			if ev.Status != 3<<8 {
				t.Errorf("exit status %#x, want exit 3", ev.Status)
			}
		}
	}
	if seen[0] != ProcFork || seen[1] != ProcExec || seen[2] != ProcExit {
		t.Errorf("events %v, want fork, exec, exit", seen)
	}
	if n := p.Lost(); n != 0 {
		t.Errorf("Lost = %d", n)
	}

	// A deadline set while ReadEvent blocks unblocks it; Close too.
	p.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { errc <- p.ReadEvent(&ProcEvent{}) }()
	time.Sleep(50 * time.Millisecond)
	p.SetDeadline(time.Now())
	if err := <-errc; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blocked ReadEvent after SetDeadline(now): %v", err)
	}
	p.SetDeadline(time.Time{})
	go func() { errc <- p.ReadEvent(&ProcEvent{}) }()
	time.Sleep(50 * time.Millisecond)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReadEvent after Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := p.Snapshot(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Snapshot after Close: %v", err)
	}
	_ = p.Lost() // no panic
}

// TestProcsLost: events the ring cannot hold are counted.
func TestProcsLost(t *testing.T) {
	ns := testutil.NewNetNS(t)
	p := openTestProcs(t, ns.Inode, ProcOptions{RingSize: os.Getpagesize()})
	burst := startIn(t, ns, "sh", "-c", "i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done")
	if err := burst.Wait(); err != nil {
		t.Fatal(err)
	}
	if p.Lost() == 0 {
		t.Fatal("no event lost: 900 events in a one-page ring nobody reads")
	}
	t.Logf("lost %d events", p.Lost())
}
