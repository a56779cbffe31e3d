package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sweep removes what this package's node leaves behind, also after an
// interrupted run: the daemons it recorded (by PID, checked against their
// executable), runc containers under its private runc root, shims bound
// to its socket, mounts under its directories, the veths on its bridge and
// the bridge, its cgroup tree, and its directories.
func Sweep(cfg Config) error {
	var errs []error
	for _, name := range []string{"kubelet", "containerd"} {
		errs = append(errs, killRecorded(cfg, name))
	}
	errs = append(errs, killRuncContainers(cfg.runcRoot()))
	killShims(cfg.socket())
	killCgroupProcs(cfg.CgroupRoot)
	errs = append(errs, unmountUnder(cfg.StateDir, cfg.DataDir))
	errs = append(errs, removeBridge(cfg.Bridge))
	errs = append(errs, removeCgroups(cfg.CgroupRoot))
	for _, d := range []string{cfg.StateDir, cfg.DataDir} {
		errs = append(errs, removeDir(d))
	}
	return errors.Join(errs...)
}

// removeDir removes d, or only what is in it when d is a mount point of its
// own: make e2e-kubelet-vm gives DataDir a tmpfs, since containerd's
// overlayfs snapshots cannot stack on the VM's overlay root.
func removeDir(d string) error {
	var st, parent syscall.Stat_t
	if syscall.Stat(d, &st) != nil || syscall.Stat(filepath.Dir(d), &parent) != nil || st.Dev == parent.Dev {
		return os.RemoveAll(d)
	}
	entries, err := os.ReadDir(d)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(d, e.Name())))
	}
	return errors.Join(errs...)
}

// StopRecorded stops the daemon StartDaemon recorded as name (SIGTERM,
// then SIGKILL after grace), if it still runs: make cluster-down, which
// stops what another process started.
func StopRecorded(cfg Config, name string, grace time.Duration) error {
	return stopRecorded(cfg, name, grace)
}

func killRecorded(cfg Config, name string) error {
	return stopRecorded(cfg, name, 5*time.Second)
}

func stopRecorded(cfg Config, name string, grace time.Duration) error {
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, name+".pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(exe), name) {
		return nil // gone, or the PID was reused by something else
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for end := time.Now().Add(grace); time.Now().Before(end); {
		if ProcessGone(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 100 {
		if ProcessGone(pid) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) still there after SIGKILL", name, pid)
}

// killRuncContainers kills and deletes the containers under our runc root
// (the shim adds the containerd namespace: ROOT/k8s.io).
func killRuncContainers(runcRoot string) error {
	roots, _ := filepath.Glob(filepath.Join(runcRoot, "*"))
	var errs []error
	for _, root := range roots {
		errs = append(errs, killRuncRoot(root))
	}
	return errors.Join(errs...)
}

func killRuncRoot(root string) error {
	out, err := exec.Command("runc", "--root", root, "list", "-q").Output()
	if err != nil {
		return fmt.Errorf("runc list: %w", err)
	}
	var errs []error
	for id := range strings.FieldsSeq(string(out)) {
		exec.Command("runc", "--root", root, "kill", "--all", id, "KILL").Run()
		if out, err := exec.Command("runc", "--root", root, "delete", "--force", id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("runc delete %s: %w: %s", id, err, out))
		}
	}
	return errors.Join(errs...)
}

// killShims kills containerd-shim processes started for our socket.
func killShims(socket string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		if !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == socket {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// killCgroupProcs kills every process left in our cgroup tree (the pids
// hierarchy on cgroup v1, the unified one on v2): containers whose shim and
// runc state are gone.
func killCgroupProcs(root string) {
	if root == "" || root == "/" {
		return
	}
	top := filepath.Join(cgroupMount, "pids", root)
	if UnifiedOnly() {
		top = filepath.Join(cgroupMount, root)
	}
	filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// unmountUnder detaches every mount point under the given directories
// (containerd's rootfs and shm mounts, the kubelet's volumes), deepest
// first; a directory that is a mount point itself stays (removeDir).
func unmountUnder(dirs ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := UnescapeMount(fields[4])
		for _, d := range dirs {
			if strings.HasPrefix(mp, d+"/") {
				points = append(points, mp)
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range slices.Compact(points) {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// UnescapeMount undoes /proc/PID/mountinfo's octal escapes in a path.
func UnescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// removeBridge deletes the veths enslaved to the bridge, then the bridge.
func removeBridge(bridge string) error {
	if _, err := os.Stat("/sys/class/net/" + bridge); err != nil {
		return nil
	}
	ports, _ := os.ReadDir("/sys/class/net/" + bridge + "/brif")
	var errs []error
	for _, p := range ports {
		if out, err := exec.Command("ip", "link", "del", p.Name()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", p.Name(), err, out))
		}
	}
	if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", bridge, err, out))
	}
	return errors.Join(errs...)
}

// removeCgroups removes root's subtree in every cgroup v1 hierarchy (and
// in the v2 one, if mounted), leaves first.
func removeCgroups(root string) error {
	if root == "" || root == "/" {
		return nil
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup")
	var errs []error
	for _, h := range hier {
		top := filepath.Join(h, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			var err error
			for range 20 {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond) // tasks still leaving
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
