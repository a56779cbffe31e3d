package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// A container here is what runc makes of one: a process that is PID 1 of
// its own PID namespace and has its own mount namespace with its own /proc,
// in the pod's network namespace. The test binary starts itself as the
// container's init (role __container), which mounts /proc and execs the
// real role, so that role runs as PID 1 exactly as in a pod: draind in its
// container, the app in another, the pause process in a third. Killing
// PID 1 ends the whole container, as the kubelet's runtime does.

// container is one running container of a pod.
type container struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once PID 1 has exited
	code int           // its exit code, once done (-1: killed by a signal)
	sig  syscall.Signal
	// exitedAt is when the test saw PID 1 exit, once done.
	exitedAt time.Time
	// cgroup is the container's cgroup when the pod has one (its
	// processes, and those exec'd into it, start there); cgroupNS says it
	// has a cgroup namespace of its own, rooted there.
	cgroup   *testutil.Cgroup
	cgroupNS bool
}

// Signal signals the container's PID 1.
func (c *container) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Kill ends the container: SIGKILL to PID 1 takes every process of its PID
// namespace with it.
func (c *container) Kill() { c.cmd.Process.Kill() }

// Pid is PID 1's pid as the test (the host) sees it.
func (c *container) Pid() int { return c.cmd.Process.Pid }

// wait waits for the container to end, at most d.
func (c *container) wait(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// runContainer starts role (a role of this test binary, or a program's
// absolute path) with args as PID 1 of a new container in the pod's
// network namespace, under uid (< 0: root), its stdout and stderr to out.
func (p *pod) runContainer(name string, uid int, out io.Writer, role string, args ...string) *container {
	p.t.Helper()
	argv := append([]string{p.bin, "__container", strconv.Itoa(uid), role}, args...)
	cmd := exec.Command(p.bin)
	cmd.Args = argv
	if role == "__pause" {
		// The pause process is found by its comm, which is its file name.
		argv[0] = p.pauseBin()
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Pdeathsig:  syscall.SIGKILL,
	}
	c := &container{name: name, cmd: cmd, done: make(chan struct{})}
	if p.cgroup != nil {
		// The runtime makes the container's cgroup and starts its first
		// process in it (CLONE_INTO_CGROUP): nothing of the container
		// ever runs outside it.
		p.containers++
		cg := testutil.NewCgroup(p.t, p.cgroup.Path, fmt.Sprintf("%s-%d", name, p.containers))
		c.cgroup = &cg
		f, err := c.cgroup.Open()
		if err != nil {
			p.t.Fatalf("container %s: %v", name, err)
		}
		defer f.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
		if p.cgroupNS {
			c.cgroupNS = true
			cmd.Env = append(os.Environ(), cgroupNSEnv+"=1")
		}
	}
	if len(p.env) > 0 {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, p.env...)
	}
	start := cmd.Start
	if p.sharePID && p.pause != nil {
		// shareProcessNamespace: every container joins the sandbox's PID
		// namespace (pause is its PID 1); each keeps a mount namespace of
		// its own.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
		// No parent-death signal: Go's child checks getppid() after
		// setting it, and a parent outside the child's PID namespace
		// reads as 0 there, so the child would kill itself at once. The
		// cleanup below kills it.
		cmd.SysProcAttr.Pdeathsig = 0
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, sharedPIDEnv+"=1")
		start = func() error { return inPIDNS(p.pause.Pid(), cmd.Start) }
	}
	var err error
	if p.hostNetwork {
		err = start() // the test's own network namespace: the host's
	} else {
		p.ns.Do(p.t, func() { err = start() })
	}
	if err != nil {
		p.t.Fatalf("start container %s: %v", name, err)
	}
	go func() {
		cmd.Wait()
		c.exitedAt = time.Now()
		c.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			c.sig = ws.Signal()
		}
		close(c.done)
	}()
	p.t.Cleanup(func() {
		c.Kill()
		c.wait(10 * time.Second)
	})
	if c.cgroupNS {
		// As runc's start returns once the container is set up: what is
		// exec'd into it later joins its cgroup namespace, not ours.
		own, _ := os.Readlink("/proc/self/ns/cgroup")
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", c.Pid()))
			if err == nil && ns != own {
				break
			}
			if c.wait(0) || time.Now().After(end) {
				p.t.Fatalf("container %s: no cgroup namespace of its own (%s, %v)", name, ns, err)
			}
		}
	}
	return c
}

// pauseBin is a copy of the test binary named "pause".
func (p *pod) pauseBin() string {
	path := filepath.Join(filepath.Dir(p.bin), "pause")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if err := os.Link(p.bin, path); err != nil && !errors.Is(err, os.ErrExist) {
		p.t.Fatalf("pause binary: %v", err)
	}
	return path
}

// containerInit is role __container: PID 1 of a fresh PID and mount
// namespace. It makes the mounts private, mounts its own /proc (so /proc
// shows this container's processes only, as in a pod), takes the uid it is
// given, and execs the role: the role keeps PID 1.
func containerInit(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "container: uid and role needed")
		return 2
	}
	uid, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "container: uid:", err)
		return 2
	}
	if os.Getpid() != 1 && os.Getenv(sharedPIDEnv) == "" {
		fmt.Fprintln(os.Stderr, "container: not PID 1 of a new PID namespace")
		return 2
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "container: make mounts private:", err)
		return 1
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "container: mount /proc:", err)
		return 1
	}
	// runc unshares the cgroup namespace once the container is in its
	// cgroup: that cgroup becomes the namespace's root. Unshare moves this
	// thread only: it stays locked, and the exec below runs on it.
	if os.Getenv(cgroupNSEnv) != "" {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			fmt.Fprintln(os.Stderr, "container: cgroup namespace:", err)
			return 1
		}
	}
	// The bounding set a runtime gives the container (privs_linux_test.go):
	// without a capability there, execve gives it to no process in it.
	if bnd, err := strconv.ParseUint(os.Getenv(boundingEnv), 16, 64); err == nil {
		for c := range 64 {
			if bnd&(1<<c) == 0 && unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0) == unix.EINVAL {
				break // past the last capability
			}
		}
	}
	if uid >= 0 {
		err = unix.Setgroups(nil)
		if err == nil {
			err = unix.Setresgid(uid, uid, uid)
		}
		if err == nil {
			err = unix.Setresuid(uid, uid, uid)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "container: take uid", uid, ":", err)
			return 1
		}
		// A credential change clears the parent-death signal.
		unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
	}
	// A role of this binary: os.Args[0] is its absolute path (for the
	// pause container, a copy named "pause": a process's comm is its
	// file's name). Anything else is a program's absolute path.
	argv := append([]string{os.Args[0]}, args[1:]...)
	if filepath.IsAbs(args[1]) {
		argv = args[1:]
	}
	err = unix.Exec(argv[0], argv, os.Environ())
	fmt.Fprintln(os.Stderr, "container: exec:", err)
	return 1
}

// sharedPIDEnv tells a container's init that it joined the pod's shared PID
// namespace (shareProcessNamespace), where pause is PID 1.
const sharedPIDEnv = "DRAIND_E2E_SHARED_PID"

// cgroupNSEnv tells a container's init to take a cgroup namespace of its
// own (pod.cgroupNS).
const cgroupNSEnv = "DRAIND_E2E_CGROUPNS"

// inPIDNS runs start (a fork) on a thread whose children are born in the
// PID namespace of process pid, then puts the thread back: setns of a PID
// namespace changes only where the thread's children go.
func inPIDNS(pid int, start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.Open("/proc/self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(own)
	target, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("join PID namespace of %d: %w", pid, err)
	}
	err = start()
	if rerr := unix.Setns(own, unix.CLONE_NEWPID); rerr != nil {
		// The thread would fork into the pod's namespace: let it die
		// with its goroutine rather than serve another.
		runtime.LockOSThread()
		return errors.Join(err, fmt.Errorf("back to our PID namespace: %w", rerr))
	}
	return err
}

// execIn runs argv in container c as root, as the runtime runs a hook, an
// exec probe or `kubectl exec`: in the container's mount, PID and network
// namespaces (and its cgroup, and cgroup namespace when it has one), its
// parent (the test, standing for the runtime's shim) outside the pod.
// nsenter joins the mount namespace (a multithreaded Go process cannot) and
// execs argv without forking.
func (p *pod) execIn(c *container, out io.Writer, argv ...string) *exec.Cmd {
	p.t.Helper()
	nsenter := []string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.Pid())}
	if c.cgroupNS {
		nsenter = append(nsenter, fmt.Sprintf("--cgroup=/proc/%d/ns/cgroup", c.Pid()))
	}
	cmd := exec.Command("nsenter", append(append(nsenter, "--"), argv...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if c.cgroup != nil {
		f, err := c.cgroup.Open()
		if err != nil {
			p.t.Fatalf("exec %v in %s: %v", argv, c.name, err)
		}
		defer f.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	}
	var err error
	p.ns.Do(p.t, func() { err = inPIDNS(c.Pid(), cmd.Start) })
	if err != nil {
		p.t.Fatalf("exec %v in %s: %v", argv, c.name, err)
	}
	p.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// pauseRole is the pod's infra process: it holds the namespaces and, as
// PID 1, reaps what is reparented to it.
func pauseRole() int {
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
			time.Sleep(time.Hour)
		}
	}
}

// TestContainerIsolation checks the harness itself: each container is PID
// 1 of its own PID namespace, sees only its own processes in /proc, and
// shares the pod's network namespace.
func TestContainerIsolation(t *testing.T) {
	p := newPod(t)
	var a, b syncBuffer
	ca := p.runContainer("a", 1000, &a, "__probe")
	cb := p.runContainer("b", -1, &b, "__probe")
	for _, c := range []*container{ca, cb} {
		if !c.wait(10 * time.Second) {
			t.Fatalf("%s did not finish", c.name)
		}
	}
	for _, tc := range []struct {
		out  string
		want string
	}{{a.String(), "pid=1 uid=1000 procs=1 netns=" + strconv.FormatUint(p.ns.Inode, 10)}, {b.String(), "pid=1 uid=0 procs=1 netns=" + strconv.FormatUint(p.ns.Inode, 10)}} {
		if tc.out != tc.want+"\n" {
			t.Errorf("container says %q, want %q", tc.out, tc.want)
		}
	}
	var ps, pns unix.Stat_t
	unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", p.pause.Pid()), &ps)
	unix.Stat("/proc/self/ns/pid", &pns)
	if ps.Ino == pns.Ino || ps.Ino == 0 {
		t.Errorf("the pause container shares the test's PID namespace")
	}
	_ = testutil.RequireRoot
}

// probeRole prints what a container sees of itself.
func probeRole() int {
	ents, _ := os.ReadDir("/proc")
	procs := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			procs++
		}
	}
	var st unix.Stat_t
	unix.Stat("/proc/self/ns/net", &st)
	fmt.Printf("pid=%d uid=%d procs=%d netns=%d\n", os.Getpid(), os.Getuid(), procs, st.Ino)
	return 0
}

// TestContainerCgroups checks the harness's pod cgroup: each container's
// processes, from PID 1 on and whatever is exec'd into it, are in a cgroup
// of their own under the pod's, which the container sees at the test's
// cgroup2 mount path; the test (the shim) stays outside. With cgroup
// namespaces each container reads its own cgroup as "/".
func TestContainerCgroups(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  podOption
	}{{"host-cgroupns", inPodCgroup}, {"own-cgroupns", cgroupNamespaces}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t, tc.opt)
			c := p.runContainer("a", 1000, testWriter{t}, "__pause")
			rel := func(cg *testutil.Cgroup) string { return "0::" + strings.TrimPrefix(cg.Path, p.cgroupRoot) }
			for _, c := range []*container{p.pause, c} {
				if c.cgroup == nil || filepath.Dir(c.cgroup.Path) != p.cgroup.Path {
					t.Fatalf("container %s: cgroup %v, want a child of %s", c.name, c.cgroup, p.cgroup.Path)
				}
				if procs, err := c.cgroup.Procs(); err != nil || !slices.Equal(procs, []int{c.Pid()}) {
					t.Errorf("container %s: cgroup.procs %v (%v), want its PID 1 %d alone", c.name, procs, err, c.Pid())
				}
				if got := cgroupLine(t, fmt.Sprintf("/proc/%d/cgroup", c.Pid())); got != rel(c.cgroup) {
					t.Errorf("container %s: the host reads its cgroup as %q, want %q", c.name, got, rel(c.cgroup))
				}
			}
			if got := cgroupLine(t, "/proc/self/cgroup"); strings.HasPrefix(got, rel(p.cgroup)) {
				t.Errorf("the test (the shim) is in the pod's cgroup: %s", got)
			}
			// Exec'd into the container: its cgroup (and namespace), and
			// the cgroup2 mount at the same path.
			var out syncBuffer
			cmd := p.execIn(c, &out, "/bin/cat", "/proc/self/cgroup", filepath.Join(c.cgroup.Path, "cgroup.procs"))
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exec: %v: %s", err, out.String())
			}
			want := rel(c.cgroup)
			if p.cgroupNS {
				want = "0::/"
			}
			lines := strings.Split(out.String(), "\n")
			if !slices.Contains(lines, want) {
				t.Errorf("exec'd process reads its cgroup as:\n%s\nwant a line %q", out.String(), want)
			}
			if !slices.Contains(lines, "1") {
				t.Errorf("container's cgroup.procs from inside: %q, want its PID 1", lines)
			}
		})
	}
}

// cgroupLine is the cgroup v2 line ("0::PATH") of a /proc/PID/cgroup file.
func cgroupLine(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			return l
		}
	}
	t.Fatalf("%s has no cgroup v2 line:\n%s", path, b)
	return ""
}
