//go:build linux

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

// Cgroup2 returns a directory where the cgroup v2 (unified) hierarchy is
// mounted from its root, as a node's /sys/fs/cgroup shows it: an existing
// mount of this process's mount namespace, or, on a cgroup v1 host with
// none (a hybrid host may mount it beside v1 with no controllers: BPF
// cgroup programs need none), one mounted for the test in a temporary
// directory and detached when the test ends. Processes started later with a
// new mount namespace (CLONE_NEWNS) find it at the same path.
func Cgroup2(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	if dir, err := cgroup2Mounted(); err != nil {
		tb.Fatalf("cgroup2: %v", err)
	} else if dir != "" {
		return dir
	}
	dir := tb.TempDir()
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		if errors.Is(err, unix.ENODEV) {
			tb.Skip("kernel has no cgroup v2 (mount -t cgroup2: no such device)")
		}
		tb.Fatalf("mount cgroup2 on %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		// Detached: a container's mount namespace may still hold a copy.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount cgroup2 %s: %v", dir, err)
		}
	})
	return dir
}

// cgroup2Mounted returns the mount point of a cgroup2 mount of the
// unified hierarchy's root in this mount namespace, or "".
func cgroup2Mounted() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(after) < 1 || after[0] != "cgroup2" {
			continue
		}
		// Root "/" is the hierarchy's root (not a bind of a sub-cgroup);
		// an escaped mount point (\040) is not worth decoding.
		if fields[3] == "/" && !strings.Contains(fields[4], `\`) {
			return fields[4], nil
		}
	}
	return "", sc.Err()
}

// Cgroup is a cgroup v2 directory made for a test.
type Cgroup struct {
	// Path is its directory under the cgroup2 mount.
	Path string
	// ID is the kernel's cgroup id (its directory's inode number): what
	// bpf_get_current_cgroup_id returns and a cgroup link's fdinfo shows.
	ID uint64
}

// NewCgroup makes the cgroup parent/name. When the test ends it is removed
// (children first: their cleanups run before) once the processes in it are
// gone; the test must have ended them by then (a cleanup registered after
// this one runs before it).
func NewCgroup(tb testing.TB, parent, name string) *Cgroup {
	tb.Helper()
	path := filepath.Join(parent, name)
	if err := os.Mkdir(path, 0o755); err != nil {
		tb.Fatalf("make cgroup: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		os.Remove(path)
		tb.Fatalf("make cgroup: %v", err)
	}
	tb.Cleanup(func() {
		// A killed process leaves its cgroup when its exit is complete,
		// a moment after its parent saw it die.
		var err error
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err = unix.Rmdir(path); err == nil || errors.Is(err, unix.ENOENT) {
				return
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(end) {
				break
			}
		}
		procs, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		tb.Errorf("remove cgroup %s: %v (processes: %q)", path, err, strings.Fields(string(procs)))
	})
	return &Cgroup{Path: path, ID: st.Ino}
}

// Open opens the cgroup's directory for CLONE_INTO_CGROUP
// (syscall.SysProcAttr.UseCgroupFD): the child starts in it, as a
// container runtime starts a container's first process. The caller closes
// the file once the child started.
func (c *Cgroup) Open() (*os.File, error) {
	return os.OpenFile(c.Path, os.O_RDONLY|unix.O_DIRECTORY, 0)
}

// Procs lists the pids in the cgroup (not its children), as this process's
// PID namespace numbers them.
func (c *Cgroup) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %q", c.Path, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// KernelAtLeast reports whether the running kernel's release is at least
// major.minor.
func KernelAtLeast(tb testing.TB, major, minor int) bool {
	tb.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		tb.Fatalf("uname: %v", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var maj, mi int
	if _, err := fmt.Sscanf(rel, "%d.%d", &maj, &mi); err != nil {
		tb.Fatalf("kernel release %q: %v", rel, err)
	}
	return maj > major || maj == major && mi >= minor
}
