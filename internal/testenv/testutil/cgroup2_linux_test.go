//go:build linux

package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// A process started into a cgroup made under Cgroup2 is in it from its
// first instruction, /proc/PID/cgroup names it, and the cgroups go with
// the test.
func TestCgroupCloneInto(t *testing.T) {
	root := Cgroup2Root(t)
	parent := NewCgroup(t, root, "draind-testutil-"+filepath.Base(t.TempDir()))
	child := NewCgroup(t, parent.Path, "c")
	f, err := child.Open()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	f.Close()
	if err != nil {
		t.Fatalf("start into cgroup: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	procs, err := child.Procs()
	if err != nil || !slices.Contains(procs, cmd.Process.Pid) {
		t.Errorf("cgroup.procs %v (%v), want %d in it", procs, err, cmd.Process.Pid)
	}
	b, err := os.ReadFile("/proc/" + itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	want := "0::/" + strings.TrimPrefix(child.Path, root+"/")
	if !slices.Contains(strings.Split(string(b), "\n"), want) {
		t.Errorf("/proc/PID/cgroup:\n%s\nwant a line %q", b, want)
	}
	if parent.ID == 0 || child.ID == parent.ID {
		t.Errorf("cgroup ids %d, %d", parent.ID, child.ID)
	}
}
