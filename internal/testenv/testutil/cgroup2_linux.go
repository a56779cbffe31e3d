package testutil

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup2Root returns a cgroup v2 mount of the node's hierarchy: the
// system's, or one mounted for the test (a cgroup v1 host still has the
// v2 hierarchy, without controllers: every process is in its root until
// moved), unmounted at cleanup. It fails the test where the mount fails:
// every kernel draind runs on has cgroup v2.
func Cgroup2Root(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup rw,... - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if fs := strings.Fields(post); ok && len(fs) > 0 && fs[0] == "cgroup2" {
			if pf := strings.Fields(pre); len(pf) > 4 && pf[3] == "/" {
				return pf[4]
			}
		}
	}
	dir := tb.TempDir()
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		tb.Fatalf("mount cgroup2: %v", err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Cgroup is a cgroup v2 directory made for a test.
type Cgroup struct {
	Path string
	// ID is the cgroup's id (its directory's inode).
	ID uint64
}

// NewCgroup makes a cgroup under parent, removed at cleanup (after the
// cleanups registered later, which end its processes).
func NewCgroup(tb testing.TB, parent, name string) Cgroup {
	tb.Helper()
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatalf("make cgroup: %v", err)
	}
	tb.Cleanup(func() {
		// A killed process leaves its cgroup when its exit is complete, a
		// moment after its parent saw it die (and the rest of a container
		// after its PID 1).
		var err error
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
				return
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(end) {
				break
			}
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		tb.Errorf("remove cgroup %s: %v (processes: %q)", dir, err, strings.Fields(string(procs)))
	})
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		tb.Fatal(err)
	}
	return Cgroup{Path: dir, ID: st.Ino}
}

// Within runs fn with this whole test process moved into cg, and moves it
// back after: the sockets fn makes are cg's (a socket keeps the cgroup it
// was made in). Not for parallel tests.
func (cg Cgroup) Within(tb testing.TB, root string, fn func()) {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		tb.Fatal(err)
	}
	home := ""
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			home = filepath.Join(root, p)
		}
	}
	if home == "" {
		tb.Fatal("no cgroup v2 line in /proc/self/cgroup")
	}
	move := func(to string) {
		if err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			tb.Fatalf("move the test process into %s: %v", to, err)
		}
	}
	move(cg.Path)
	defer move(home)
	fn()
}

// Open opens the cgroup's directory for CLONE_INTO_CGROUP
// (syscall.SysProcAttr.UseCgroupFD): the child starts in it, as a
// container runtime starts a container's first process. The caller closes
// the file once the child started.
func (cg Cgroup) Open() (*os.File, error) {
	return os.OpenFile(cg.Path, os.O_RDONLY|unix.O_DIRECTORY, 0)
}

// Procs lists the pids in the cgroup (not its children), as this process's
// PID namespace numbers them.
func (cg Cgroup) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(cg.Path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %q", cg.Path, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
