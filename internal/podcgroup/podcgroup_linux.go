// Package podcgroup finds a pod's cgroup v2 from inside one of its
// containers, so that draind can attach a program that runs only for the
// pod's sockets (probes.TCPStateOptions.PodCgroup).
//
// # Where the pod's cgroup is
//
// The kubelet makes one cgroup per pod and the runtime one per container
// below it, with either cgroup driver:
//
//	/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
//	/sys/fs/cgroup/kubepods/burstable/pod<uid>/<id>
//
// so the pod's cgroup is the parent of draind's own. A container sees its
// own cgroup as the root of its cgroup namespace and of its
// /sys/fs/cgroup, never its parent: draind reads the node's hierarchy
// through a cgroup v2 mount of it (in Kubernetes a read-only hostPath of
// /sys/fs/cgroup), given as root to [Find].
//
// # How draind finds its own cgroup there
//
// /proc/self/cgroup names it ("0::PATH") relative to draind's cgroup
// namespace: where that namespace is the node's, root/PATH is it. In a
// container's own cgroup namespace PATH is "/", and draind looks for the
// directory whose cgroup.procs lists its pid (the kernel shows pids as
// the reader's PID namespace numbers them).
//
// The package logs nothing.
package podcgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup is a cgroup v2 directory and its id.
type Cgroup struct {
	// Path is the directory under the root given to Find.
	Path string
	// ID is the cgroup's id (the kernel's cgroup->kn->id): the
	// directory's inode number.
	ID uint64
}

// Found is what Find found: the cgroup that holds the process, and the
// pod's (its parent).
type Found struct {
	Own, Pod Cgroup
}

// maxSearch bounds the directories Find reads when it has to search: a
// node of 110 pods has about a thousand.
const maxSearch = 50000

// ErrNotCgroup2 is returned when root is not a cgroup v2 mount.
var ErrNotCgroup2 = errors.New("not a cgroup v2 mount")

// Find finds, under root (a cgroup v2 mount of the node's hierarchy), the
// cgroup of process pid and the pod's cgroup above it. It fails when root
// is not cgroup v2, when the process is not found under it, or when the
// process's cgroup has no parent under root that is not root itself (a
// process outside any pod). Its errors do not repeat root: the caller
// names it.
func Find(root string, pid int) (Found, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return Found{}, err
	}
	if sfs.Type != unix.CGROUP2_SUPER_MAGIC {
		return Found{}, fmt.Errorf("%w (give a mount of the node's /sys/fs/cgroup, on a cgroup v2 node)", ErrNotCgroup2)
	}
	own, err := ownCgroup(root, pid)
	if err != nil {
		return Found{}, err
	}
	rel, err := filepath.Rel(root, own)
	if err != nil {
		return Found{}, err
	}
	if rel == "." || filepath.Dir(rel) == "." {
		return Found{}, fmt.Errorf("process %d is in %s, which has no pod cgroup above it under the root", pid, own)
	}
	var f Found
	if f.Own, err = statCgroup(own); err != nil {
		return Found{}, err
	}
	if f.Pod, err = statCgroup(filepath.Dir(own)); err != nil {
		return Found{}, err
	}
	return f, nil
}

func statCgroup(dir string) (Cgroup, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return Cgroup{}, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	return Cgroup{Path: dir, ID: st.Ino}, nil
}

// ownCgroup is the directory under root whose cgroup.procs lists pid.
func ownCgroup(root string, pid int) (string, error) {
	if p, err := cgroupPath(pid); err == nil && p != "/" {
		dir := filepath.Join(root, p)
		if ok, _ := lists(dir, pid); ok {
			return dir, nil
		}
	}
	return ownCgroupSearch(root, pid)
}

// ownCgroupSearch walks root for the cgroup.procs that lists pid.
func ownCgroupSearch(root string, pid int) (string, error) {
	var found string
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a cgroup removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		if n++; n > maxSearch {
			return fmt.Errorf("more than %d cgroups, and none lists process %d", maxSearch, pid)
		}
		if ok, _ := lists(path, pid); ok {
			found = path
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("no cgroup under it lists process %d (is it a mount of the node's whole hierarchy?)", pid)
	}
	return found, nil
}

// cgroupPath is the process's cgroup v2 path as /proc/PID/cgroup gives it.
func cgroupPath(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 line")
}

// lists reports whether dir's cgroup.procs has pid.
func lists(dir string, pid int) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false, err
	}
	want := []byte(strconv.Itoa(pid))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if bytes.Equal(sc.Bytes(), want) {
			return true, nil
		}
	}
	return false, nil
}
