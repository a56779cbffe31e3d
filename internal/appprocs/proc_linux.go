package appprocs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
)

// procSource is the /proc backend: /proc read on a period, every /proc/PID
// whose ns/net is the namespace, then its stat and status.
type procSource struct {
	*table
	netns    uint64
	root     string
	period   time.Duration
	hostView bool // /proc's pid namespace is the initial one
	scans    atomic.Uint64
	// unreadable counts the ns/net reads refused (EACCES) over all scans.
	unreadable atomic.Uint64
}

// openProc follows the app's processes in the namespace whose inode is
// netnsInode by reading /proc every poll period (WithPollPeriod), after a
// first scan. It needs a /proc that shows the app: a PID namespace shared
// with it (shareProcessNamespace), or the host's (hostPID, or
// WithProcRoot on the host's procfs) together with CAP_SYS_PTRACE to read
// other processes' ns/net. Otherwise the error is an *UnavailableError: a
// /proc that cannot see the app must not report it gone. The calling
// process counts as draind's, under its pid in that /proc.
//
// A process whose ns/net cannot be read (EACCES: another uid, an LSM)
// counts as the namespace's in a pod's shared PID namespace, where every
// process is the pod's, so that an unknown is never taken for an exit; in
// the host's, where it almost never is, it is left out.
func openProc(netnsInode uint64, rules Rules, o options) (Source, error) {
	selfLink, err := os.Readlink(o.procRoot + "/self")
	if err != nil {
		return nil, &UnavailableError{Reason: "/proc: " + o.procRoot + " is not a procfs mount", Err: err}
	}
	selfPID, err := strconv.Atoi(selfLink)
	if err != nil {
		return nil, &UnavailableError{Reason: "/proc: " + o.procRoot + "/self is " + selfLink, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Stat(o.procRoot+"/"+selfLink+"/ns/pid", &st); err != nil {
		return nil, &UnavailableError{Reason: "/proc: cannot read its own PID namespace", Err: err}
	}
	hostView := st.Ino == namespace.InitialPIDInode
	if hostView && !haveCapSysPtrace() {
		return nil, &UnavailableError{Reason: "/proc: reading other processes' namespaces in the host PID namespace needs CAP_SYS_PTRACE"}
	}

	if rules.SelfMountNS == 0 {
		rules.SelfMountNS, _ = firstMountID(o.procRoot + "/" + selfLink)
	}
	s := &procSource{table: newTable(rules), netns: netnsInode, root: o.procRoot, period: o.pollPeriod, hostView: hostView}
	s.self = selfPID
	snap, err := s.scan()
	if err != nil {
		return nil, &UnavailableError{Reason: "/proc: " + err.Error(), Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.installLocked(snap, nil, true)
	s.coverage = Coverage{Complete: true, Reason: "proc: every process " + o.procRoot + " shows, every " + o.pollPeriod.String()}
	if hostView && unix.Stat(o.procRoot+"/1/ns/net", &st) == nil {
		s.hostNetNS = st.Ino
	}
	s.recomputeLocked()
	s.refresh = s.rescan
	s.dormant.Store(o.dormant)
	if !o.dormant {
		s.via, s.viaReason = ViaProcPolling, s.pollReason()
	}
	if !hostView {
		// Only draind's own processes in sight: the PID namespace is not
		// the app's (no shareProcessNamespace). The pod's pause process,
		// always there, is what a shared namespace shows.
		classes := newClassifier(s.listLocked(), s.rulesLocked()).classify(func(Process) bool { return false })
		if !slices.ContainsFunc(classes, func(c Class) bool { return c != ClassSelf }) {
			return nil, &UnavailableError{Reason: "/proc: shows none of the namespace's processes but draind's own (PID namespace not shared with the app)"}
		}
	}
	return s, nil
}

func (s *procSource) Kind() Mode { return ModeProc }

// Lost is 0: polls have no events to lose.
func (s *procSource) Lost() uint64 { return 0 }

// Close has nothing to release: every scan closes what it opens.
func (s *procSource) Close() error { return nil }

// haveCapSysPtrace reports whether CAP_SYS_PTRACE is in the effective set.
func haveCapSysPtrace() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_PTRACE) != 0
}

// Start makes a dormant source poll: it scans now; Run polls after.
func (s *procSource) Start() error {
	return s.start(func() error { s.setFollowing(ViaProcPolling, s.pollReason()); return nil })
}

func (s *procSource) pollReason() string { return "every " + s.period.String() }

// rescan scans /proc and installs what it found.
func (s *procSource) rescan() error {
	snap, err := s.scan()
	if err != nil {
		return err
	}
	s.update(func() { s.installLocked(snap, nil, true) })
	return nil
}

// Run scans /proc every period until ctx ends.
func (s *procSource) Run(ctx context.Context) error {
	if s.dormant.Load() {
		return errors.New("app process source: Run before Start")
	}
	tk := time.NewTicker(s.period)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
		}
		snap, err := s.scan()
		if err != nil {
			return s.fail(fmt.Errorf("scan /proc: %w", err))
		}
		s.update(func() { s.installLocked(snap, nil, true) })
	}
}

// scan lists the processes of the namespace.
func (s *procSource) scan() (map[int]Process, error) {
	d, err := os.Open(s.root)
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	s.scans.Add(1)
	snap := make(map[int]Process)
	var st unix.Stat_t
	for _, name := range names {
		if name[0] < '1' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		dir := s.root + "/" + name
		in := false
		switch err := unix.Stat(dir+"/ns/net", &st); err {
		case nil:
			in = st.Ino == s.netns
		case unix.EACCES, unix.EPERM:
			in = !s.hostView // see openProc
			s.unreadable.Add(1)
		case unix.ENOENT:
			// Gone, a zombie, or a leader that exited before its other
			// threads (its nsproxy is gone, theirs is not).
			in = threadInNS(dir, pid, s.netns)
		default:
			continue // ESRCH and the like: gone
		}
		if !in {
			continue
		}
		p, ok := readProcFiles(dir, pid)
		if ok {
			snap[pid] = p
		}
	}
	return snap, nil
}

// threadInNS reports whether a live thread of process pid other than the
// leader is in the namespace.
func threadInNS(dir string, pid int, netns uint64) bool {
	d, err := os.Open(dir + "/task")
	if err != nil {
		return false
	}
	tids, _ := d.Readdirnames(-1)
	d.Close()
	var st unix.Stat_t
	for _, tid := range tids {
		if tid == strconv.Itoa(pid) {
			continue
		}
		if unix.Stat(dir+"/task/"+tid+"/ns/net", &st) == nil && st.Ino == netns {
			return true
		}
	}
	return false
}

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// readProcFiles reads a process from /proc/PID/stat (ppid, start time,
// state, comm) and /proc/PID/status (real uid). ok is false when the
// process is gone or a zombie.
func readProcFiles(dir string, pid int) (p Process, ok bool) {
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return p, false
	}
	// "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses.
	open, closing := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || closing < open {
		return p, false
	}
	fields := strings.Fields(string(stat[closing+1:]))
	// fields[0] is field 3 (state): field N is fields[N-3].
	if len(fields) < 20 {
		return p, false
	}
	if s := fields[0]; s == "Z" || s == "X" || s == "x" {
		return p, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	start, err2 := strconv.ParseUint(fields[19], 10, 64)
	if err1 != nil || err2 != nil {
		return p, false
	}
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return p, false
	}
	uid, ok := statusUID(status)
	if !ok {
		return p, false
	}
	mnt, exiting := firstMountID(dir)
	if exiting {
		// Past exit_task_namespaces, not yet a zombie: it is gone, and its
		// container unknowable (counting it as the app's would invent an
		// exit of the app's from a hook's or a wrapper's).
		return p, false
	}
	return Process{
		PID:       pid,
		PPID:      ppid,
		UID:       uid,
		Comm:      string(stat[open+1 : closing]),
		StartTime: start * (1e9 / userHZ),
		MountNS:   mnt,
	}, true
}

// firstMountID identifies the mount namespace of the process at dir: the id
// of the first mount its mountinfo lists, which no other mount namespace
// holds (mount ids are unique among the node's mounts, and each namespace
// has mounts of its own). 0 when unreadable (hidepid). mountinfo needs no
// ptrace access, where ns/mnt does: draind without capabilities reads it
// for processes of other uids (a root init wrapper, the kubelet's hooks).
//
// exiting is true when the process has no mount namespace left or is gone:
// the kernel refuses to open mountinfo (EINVAL) for a task past
// exit_task_namespaces, which /proc/PID/stat still shows running.
func firstMountID(dir string) (id uint64, exiting bool) {
	f, err := os.Open(dir + "/mountinfo")
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return 0, true
	}
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var buf [32]byte
	n, err := f.Read(buf[:])
	if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, unix.ESRCH)) {
		return 0, true // its namespace went between open and read
	}
	field, _, ok := strings.Cut(string(buf[:n]), " ")
	if !ok {
		return 0, false
	}
	id, err = strconv.ParseUint(field, 10, 64)
	if err != nil {
		return 0, false
	}
	return id, false // 0 is the initial rootfs, which no process's mountinfo lists
}

// statusUID returns the real uid from /proc/PID/status ("Uid:\tR\tE\tS\tF").
func statusUID(status []byte) (uint32, bool) {
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, found := strings.CutPrefix(line, "Uid:")
		if !found {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		u, err := strconv.ParseUint(f[0], 10, 32)
		return uint32(u), err == nil
	}
	return 0, false
}
