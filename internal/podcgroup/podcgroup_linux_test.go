package podcgroup

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// startIn starts a process directly in cg (CLONE_INTO_CGROUP, as a runtime
// starts a container's) and returns its pid.
func startIn(t *testing.T, cg testutil.Cgroup) int {
	t.Helper()
	dir, err := os.Open(cg.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start in %s: %v", cg.Path, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

func TestFind(t *testing.T) {
	root := testutil.Cgroup2Root(t)
	top := testutil.NewCgroup(t, root, "draind-podcgroup-test")
	pod := testutil.NewCgroup(t, top.Path, "pod")
	proxy := testutil.NewCgroup(t, pod.Path, "proxy")
	app := testutil.NewCgroup(t, pod.Path, "app")
	pid := startIn(t, proxy)
	startIn(t, app)

	f, err := Find(root, pid)
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if f.Own.Path != proxy.Path || f.Own.ID != proxy.ID || f.Pod.Path != pod.Path || f.Pod.ID != pod.ID {
		t.Fatalf("Find = %+v, want own %+v, pod %+v", f, proxy, pod)
	}

	// The search, as from a container's own cgroup namespace (its
	// /proc/self/cgroup says "/"): the same answer.
	own, err := ownCgroupSearch(root, pid)
	if err != nil || own != proxy.Path {
		t.Fatalf("search: %q, %v; want %s", own, err, proxy.Path)
	}

	// A process directly under a child of the root has no pod above it.
	lone := startIn(t, top)
	if _, err := Find(root, lone); err == nil || !strings.Contains(err.Error(), "no pod cgroup") {
		t.Fatalf("Find of a process in %s: %v, want no pod cgroup", top.Path, err)
	}
	// A directory that is not cgroup v2.
	if _, err := Find(t.TempDir(), pid); !errors.Is(err, ErrNotCgroup2) {
		t.Fatalf("Find under a plain directory: %v, want ErrNotCgroup2", err)
	}
	// A process that is not there.
	if _, err := Find(pod.Path, unix.Getpid()); err == nil || !strings.Contains(err.Error(), "no cgroup under it lists") {
		t.Fatalf("Find of a process outside the root: %v", err)
	}
}
