package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// The pod-cgroup pods of `footprint node` (issue 21): each pod a cgroup v2
// directory of its own, with its containers as children, as the kubelet
// makes them, and draind told where the node's hierarchy is mounted
// (`draind run --cgroup-root DIR`): it then tracks its pod's sockets with
// a program attached to the pod's cgroup, not to a node-wide hook.
//
//	<mount>/draind-bench-XXXX/pod<N>/proxy   draind and its proxy
//	<mount>/draind-bench-XXXX/pod<N>/app     the pod's namespace's other processes (benchns)
//
// No controller is enabled anywhere below the benchmark's directory: the
// cgroups only group processes (and so sockets, which keep the cgroup of
// the process that created them).

// cgroupRootFlag is how `draind run` is told where the hierarchy is.
const cgroupRootFlag = "--cgroup-root"

// Log fields of the line draind writes at the drain trigger saying where
// it tracks TCP: "scope" is podScopeCgroup or "node", with "reason" when
// node.
const (
	tcpTrackingMsg  = `"msg":"tcp tracking"`
	tcpScopeField   = "scope"
	tcpReasonField  = "reason"
	podScopeCgroup  = "pod-cgroup"
	cgroupBenchBase = "draind-bench-"
)

// cgroupRoot is a cgroup v2 mount of the hierarchy's root, and the
// benchmark's directory in it.
type cgroupRoot struct {
	mount    string // seen at the same path in each draind's mount namespace (a copy of ours)
	ownMount bool   // mounted by openCgroupRoot (in a directory of its own): unmounted by close
	base     string // mount/draind-bench-XXXX
	mu       sync.Mutex
	next     int // the next pod's number
}

// openCgroupRoot finds a cgroup2 mount of the hierarchy's root (the whole
// hierarchy as this process's cgroup namespace sees it, so that
// /proc/PID/cgroup's "0::PATH" is mount/PATH), or mounts one in a new
// directory under tmp (cgroup v1 hosts: the v2 hierarchy exists beside
// v1, every process in its root, and can be mounted any number of times),
// then makes the benchmark's directory in it.
func openCgroupRoot(tmp string) (*cgroupRoot, error) {
	mount, err := findCgroup2()
	if err != nil {
		return nil, err
	}
	r := &cgroupRoot{mount: mount}
	if mount == "" {
		if err := r.mountOwn(tmp); err != nil {
			return nil, err
		}
	}
	if err := r.makeBase(); err != nil {
		return nil, errors.Join(err, r.close())
	}
	return r, nil
}

// mountOwn mounts the cgroup2 hierarchy in a new directory under tmp.
func (r *cgroupRoot) mountOwn(tmp string) error {
	dir, err := os.MkdirTemp(tmp, "cgroup2-")
	if err != nil {
		return err
	}
	if err := unix.Mount("none", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mount cgroup2 on %s: %w", dir, err)
	}
	// Not propagated to the other mount namespaces our /tmp may share
	// with (the pods' mount namespaces are copies of ours, made after).
	unix.Mount("", dir, "", unix.MS_PRIVATE, "")
	r.mount, r.ownMount = dir, true
	return nil
}

// makeBase makes the benchmark's directory: a name of its own, so that
// runs side by side (each its own PID 1 under tools/bench/node.sh) never
// share it.
func (r *cgroupRoot) makeBase() error {
	base, err := os.MkdirTemp(r.mount, cgroupBenchBase)
	if err != nil {
		return fmt.Errorf("cgroup for the pods: %w", err)
	}
	r.base = base
	// Readable as the pods' cgroups are, by a draind without
	// CAP_DAC_OVERRIDE too.
	return os.Chmod(base, 0o755)
}

// findCgroup2 is the first cgroup2 mount whose root is the hierarchy's
// root, from /proc/self/mountinfo ("": none).
func findCgroup2() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, fstype := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(fstype) == 0 || fstype[0] != "cgroup2" || f[3] != "/" || strings.Contains(f[4], `\`) {
			continue // an escaped mount point (a space in it): not worth unescaping
		}
		return f[4], nil
	}
	return "", sc.Err()
}

// close removes the benchmark's directory (its pods' cgroups are gone by
// now) and unmounts what openCgroupRoot mounted. Safe twice.
func (r *cgroupRoot) close() error {
	var errs []error
	if r.base != "" {
		if err := os.Remove(r.base); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the pods' cgroup: %w", err))
		}
		r.base = ""
	}
	if r.ownMount {
		if err := unix.Unmount(r.mount, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", r.mount, err))
		} else {
			os.Remove(r.mount)
			r.ownMount = false
		}
	}
	return errors.Join(errs...)
}

// podCgroup is one pod's cgroup and its two containers' cgroups.
type podCgroup struct {
	dir        string   // base/pod<N>
	rel        string   // dir from the hierarchy's root: /proc/PID/cgroup's path
	proxy, app *os.File // the containers' directories, open for CLONE_INTO_CGROUP
	ids        []uint64 // the cgroup ids of dir, proxy and app (sockets carry them)
}

// newPod makes the next pod's cgroup.
func (r *cgroupRoot) newPod() (*podCgroup, error) {
	r.mu.Lock()
	n := r.next
	r.next++
	r.mu.Unlock()
	dir := filepath.Join(r.base, "pod"+strconv.Itoa(n))
	rel, err := filepath.Rel(r.mount, dir)
	if err != nil {
		return nil, err
	}
	c := &podCgroup{dir: dir, rel: "/" + rel}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pod cgroup: %w", err)
	}
	for _, sub := range []struct {
		name string
		f    **os.File
	}{{"proxy", &c.proxy}, {"app", &c.app}} {
		p := filepath.Join(dir, sub.name)
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, errors.Join(fmt.Errorf("pod cgroup: %w", err), c.close())
		}
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pod cgroup: %w", err), c.close())
		}
		*sub.f = f
	}
	for _, p := range []string{dir, c.proxy.Name(), c.app.Name()} {
		id, err := cgroupID(p)
		if err != nil {
			return nil, errors.Join(err, c.close())
		}
		c.ids = append(c.ids, id)
	}
	return c, nil
}

// cgroupID is a cgroup v2 directory's id: its inode number (kernfs), what
// sockets carry (INET_DIAG_CGROUP_ID) and bpf_get_current_cgroup_id
// returns.
func cgroupID(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("cgroup id: %w", err)
	}
	return st.Ino, nil
}

// proxyAttr is the SysProcAttr that starts a process in the pod's proxy
// container (startAgent keeps it).
func (c *podCgroup) proxyAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(c.proxy.Fd())}
}

// close ends whatever still runs in the pod's cgroup (cgroup.kill: a
// proxy that left draind's process group too), waits until it is empty
// and removes it. Safe twice, and on a half-made pod.
func (c *podCgroup) close() error {
	var errs []error
	for _, f := range []**os.File{&c.proxy, &c.app} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
	if c.dir == "" {
		return nil
	}
	if _, err := os.Stat(c.dir); errors.Is(err, os.ErrNotExist) {
		c.dir = ""
		return nil
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("kill pod cgroup %s: %w", c.rel, err))
	}
	if err := waitUnpopulated(c.dir, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{filepath.Join(c.dir, "proxy"), filepath.Join(c.dir, "app"), c.dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pod cgroup: %w", err))
		}
	}
	if len(errs) == 0 {
		c.dir = ""
	}
	return errors.Join(errs...)
}

// waitUnpopulated waits until no process is left in the cgroup or below
// (cgroup.events "populated 0": the last one reaped).
func waitUnpopulated(dir string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("pod cgroup: %w", err)
		}
		if slices.Contains(strings.Split(string(b), "\n"), "populated 0") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod cgroup %s still has processes after %s", dir, timeout)
		}
	}
}

// procCgroup is a process's cgroup v2 path ("0::PATH" of /proc/PID/cgroup).
func procCgroup(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("/proc/%d/cgroup: no cgroup v2 line", pid)
}

// checkIn fails unless the process runs in the pod's container.
func (c *podCgroup) checkIn(pid int, container string) error {
	got, err := procCgroup(pid)
	if err != nil {
		return err
	}
	if want := c.rel + "/" + container; got != want {
		return fmt.Errorf("process %d in cgroup %s, want %s", pid, got, want)
	}
	return nil
}

// fullSockets are the states of sockets that carry a cgroup: not
// TIME_WAIT nor a request socket.
var fullSockets = sockdiag.AllStates &^ sockdiag.Mask(tcpstate.TimeWait, tcpstate.SynRecv, tcpstate.NewSynRecv)

// waitOwnSockets waits until every TCP socket of the namespace d dumps
// was created in the pod's cgroup: the condition under which draind
// tracks the pod from its cgroup. The benchmark's own requests into the
// pod (readiness, the metrics scrape before each SIGTERM) come from
// outside; their sockets close right after, and a drain must not begin
// before they are gone.
func (c *podCgroup) waitOwnSockets(d *sockdiag.Conn, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		var outside []string
		err := d.Each(fullSockets, func(s *sockdiag.Socket) {
			if !slices.Contains(c.ids, s.CgroupID) {
				outside = append(outside, fmt.Sprintf("%s %s→%s cgroup id %d", s.State, s.Local, s.Remote, s.CgroupID))
			}
		})
		if err == nil && len(outside) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("sockets of pod %s: %w", c.rel, err)
			}
			return fmt.Errorf("pod %s: sockets created outside its cgroup (ids %v) after %s: %s", c.rel, c.ids, timeout, strings.Join(outside, "; "))
		}
	}
}

// linkTypes counts a process's BPF links by type ("tracing", "cgroup",
// "iter", ...: link_type in their fdinfo).
func linkTypes(pid int) (map[string]int, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return nil, err
	}
	types := map[string]int{}
	for _, e := range ents {
		if t, err := os.Readlink(dir + "/fd/" + e.Name()); err != nil || t != "anon_inode:bpf_link" {
			continue
		}
		info, err := os.ReadFile(dir + "/fdinfo/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		typ := "?"
		for l := range strings.SplitSeq(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "link_type:"); ok {
				typ = strings.TrimSpace(v)
			}
		}
		types[typ]++
	}
	return types, nil
}

// tcpScope reads the scope draind logged for its TCP tracking after the
// trigger ("": not logged), and the reason it gave when not its pod's
// cgroup.
func (p *nodePod) tcpScope() (scope, reason string) {
	p.agent.mu.Lock()
	defer p.agent.mu.Unlock()
	for _, l := range p.agent.lines {
		if l.at < p.sigAt || !strings.Contains(l.text, tcpTrackingMsg) {
			continue
		}
		var fields map[string]any
		if json.Unmarshal([]byte(l.text), &fields) != nil {
			continue
		}
		scope, _ = fields[tcpScopeField].(string)
		reason, _ = fields[tcpReasonField].(string)
		if scope == "" {
			scope = "(no scope field)"
		}
		return scope, reason
	}
	return "", ""
}
