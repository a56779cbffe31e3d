package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// This file is the init (PID 1) inside the VM: the same binary as the host
// runner, copied into the initramfs as /init.

// ninePOptions mount the 9p shares. cache=loose lets the guest cache pages
// and metadata: under TCG, starting a Go test binary from a share took about
// 1.3 s on 5.10 with cache=mmap and 0.3 s with loose. The host does not change
// the shared files during a run, and the init syncs before powering off, so
// writes (coverage profiles, files in the workspace) reach the host.
const ninePOptions = "trans=virtio,version=9p2000.L,msize=262144,cache=loose,access=any"

// guestMain never returns: it runs the job, reports its status on the control
// port and powers the VM off.
func guestMain() {
	g := guest{acked: make(chan struct{})}
	status := g.run()
	if g.control != nil {
		// The host answers "ack" once it has the status and every byte of
		// output the ports took: nothing is lost to the power-off.
		fmt.Fprintf(g.control, "done %d %d %s\n", g.written[0].Load(), g.written[1].Load(), status)
		select {
		case <-g.acked:
		case <-time.After(10 * time.Second):
			fmt.Fprintln(os.Stdout, "vmexec init: no ack from the host")
		}
	}
	// The kernel console (ttyS0) keeps a copy for post-mortems.
	fmt.Fprintln(os.Stdout, "vmexec init:", status)
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintln(os.Stdout, "vmexec init: power off:", err)
	}
	// PID 1 must not exit; the host's timeout ends the VM if the power-off failed.
	select {}
}

type guest struct {
	control *os.File
	// stdout and stderr are raw non-blocking descriptors of the ports; see
	// writePort.
	stdout, stderr int
	// written counts the bytes the stdout and stderr ports took.
	written [2]atomic.Int64
	// pid is the test process, once started.
	pid   atomic.Int64
	acked chan struct{}
}

// readControl serves the host's requests: "quit" (go test's timeout sends
// SIGQUIT to the -exec program: pass it on, for a goroutine dump) and "ack".
func (g *guest) readControl() {
	sc := bufio.NewScanner(g.control)
	acked := false
	for sc.Scan() {
		switch strings.TrimSpace(sc.Text()) {
		case "quit":
			if pid := g.pid.Load(); pid > 0 {
				_ = unix.Kill(int(pid), unix.SIGQUIT)
			}
		case "ack":
			if !acked {
				acked = true
				close(g.acked)
			}
		}
	}
}

// run returns the status line sent to the host: "exit N", "signal NAME" or
// "error MESSAGE".
func (g *guest) run() string {
	j, err := g.boot()
	if err != nil {
		return "error " + oneLine(err.Error())
	}
	return g.execute(j)
}

func (g *guest) boot() (*job, error) {
	raw, err := os.ReadFile(jobPath)
	if err != nil {
		return nil, fmt.Errorf("read job: %w", err)
	}
	var j job
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("decode job: %w", err)
	}

	early := []mountPoint{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID, true},
		{"proc", "/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{"sysfs", "/sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
	}
	if err := mountAll(early); err != nil {
		return nil, err
	}
	for _, m := range j.Modules {
		if err := loadModule(m); err != nil {
			return nil, err
		}
	}
	if err := g.openPorts(10 * time.Second); err != nil {
		return nil, err
	}
	go g.readControl()
	if err := switchRoot(); err != nil {
		return nil, err
	}

	late := []mountPoint{
		{"tmpfs", "/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"tmpfs", "/run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"devpts", "/dev/pts", "devpts", "gid=5,mode=0620,ptmxmode=0666", unix.MS_NOSUID | unix.MS_NOEXEC, false},
		{"bpf", "/sys/fs/bpf", "bpf", "mode=0700", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{"securityfs", "/sys/kernel/security", "securityfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false},
		{"debugfs", "/sys/kernel/debug", "debugfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false},
		{"tracefs", "/sys/kernel/tracing", "tracefs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false},
	}
	if err := mountAll(late); err != nil {
		return nil, err
	}
	for _, s := range j.Shares {
		if err := os.MkdirAll(s.GuestPath, 0o755); err != nil {
			return nil, fmt.Errorf("share %s: %w", s.GuestPath, err)
		}
		var flags uintptr
		if s.ReadOnly {
			flags = unix.MS_RDONLY
		}
		if err := unix.Mount(s.Tag, s.GuestPath, "9p", flags, ninePOptions); err != nil {
			return nil, fmt.Errorf("mount share %s on %s: %w", s.Tag, s.GuestPath, err)
		}
	}
	for _, d := range j.Tmpfs {
		if err := mountAll([]mountPoint{{"tmpfs", d, "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV, true}}); err != nil {
			return nil, err
		}
	}
	if j.Hostname != "" {
		if err := unix.Sethostname([]byte(j.Hostname)); err != nil {
			return nil, fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := loopbackUp(); err != nil {
		return nil, err
	}
	// eBPF before 5.11 charges maps to RLIMIT_MEMLOCK.
	inf := &unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, inf); err != nil {
		return nil, fmt.Errorf("raise memlock limit: %w", err)
	}
	return &j, nil
}

// execute runs the test binary, relaying its stdout and stderr (pipes) to the
// ports. As PID 1 it also reaps every orphan (daemons the tests start, like
// nginx), as a host's init would: a zombie left around still shows in /proc
// and in BPF task iterators.
func (g *guest) execute(j *job) string {
	if len(j.Args) == 0 {
		return "error empty command line"
	}
	devnull, err := os.Open("/dev/null")
	if err != nil {
		return "error " + oneLine(err.Error())
	}
	defer devnull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return "error " + oneLine(err.Error())
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return "error " + oneLine(err.Error())
	}
	proc, err := os.StartProcess(j.Args[0], j.Args, &os.ProcAttr{
		Dir:   j.Dir,
		Env:   j.Env,
		Files: []*os.File{devnull, outW, errW},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		return "error " + oneLine(err.Error())
	}
	g.pid.Store(int64(proc.Pid))
	outDone, errDone := make(chan struct{}), make(chan struct{})
	go relay(g.stdout, outR, &g.written[0], outDone)
	go relay(g.stderr, errR, &g.written[1], errDone)

	status := waitFor(proc.Pid)
	// Daemons the test left behind may hold the pipes open: give the output
	// a moment to drain, not an EOF that may never come.
	drain := time.Now().Add(2 * time.Second)
	outR.SetReadDeadline(drain)
	errR.SetReadDeadline(drain)
	<-outDone
	<-errDone
	return status
}

// waitFor reaps children until pid exits and returns its status line.
func waitFor(pid int) string {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return "error wait: " + oneLine(err.Error())
		}
		if got != pid {
			continue // an orphan
		}
		switch {
		case ws.Exited():
			return fmt.Sprintf("exit %d", ws.ExitStatus())
		case ws.Signaled():
			return "signal " + ws.Signal().String()
		}
	}
}

type mountPoint struct {
	source, target, fstype, data string
	flags                        uintptr
	required                     bool
}

func mountAll(mps []mountPoint) error {
	for _, mp := range mps {
		if err := os.MkdirAll(mp.target, 0o755); err != nil && mp.required {
			return fmt.Errorf("mount %s: %w", mp.target, err)
		}
		err := unix.Mount(mp.source, mp.target, mp.fstype, mp.flags, mp.data)
		if err != nil && mp.required {
			return fmt.Errorf("mount %s on %s: %w", mp.fstype, mp.target, err)
		}
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("load module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// openPorts finds the virtio-serial ports by name. They appear shortly after
// virtio_console binds, when the host has answered the device's hello.
func (g *guest) openPorts(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		ports, err := virtioPorts()
		if err == nil && ports[portControl] != "" && ports[portStdout] != "" && ports[portStderr] != "" {
			if g.control, err = os.OpenFile(ports[portControl], os.O_RDWR, 0); err != nil {
				return fmt.Errorf("open port %s: %w", portControl, err)
			}
			if g.stdout, err = unix.Open(ports[portStdout], unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
				return fmt.Errorf("open port %s: %w", portStdout, err)
			}
			if g.stderr, err = unix.Open(ports[portStderr], unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
				return fmt.Errorf("open port %s: %w", portStderr, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("virtio ports did not appear: %w", err)
			}
			return fmt.Errorf("virtio ports did not appear (found %v)", ports)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writePort writes all of p to a non-blocking port, retrying while it is
// full. A blocked writer of a virtio-serial port sleeps until the device
// interrupts; with 2 vCPUs on 6.12 that wakeup was sometimes lost and the
// output stalled for good. Each retry re-reads the ring instead.
func writePort(fd int, p []byte) int {
	total := 0
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if n > 0 {
			p = p[n:]
			total += n
		}
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			time.Sleep(time.Millisecond)
		default:
			return total // the host went away: nobody to tell
		}
	}
	return total
}

// relay copies a pipe to a port until the pipe ends or its deadline passes,
// counting the bytes in written.
func relay(port int, r *os.File, written *atomic.Int64, done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, 32*1024)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			written.Add(int64(writePort(port, buf[:n])))
		}
		if err != nil {
			return
		}
	}
}

func virtioPorts() (map[string]string, error) {
	const base = "/sys/class/virtio-ports"
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	ports := make(map[string]string)
	for _, e := range entries {
		name, err := os.ReadFile(filepath.Join(base, e.Name(), "name"))
		if err != nil {
			continue
		}
		ports[strings.TrimSpace(string(name))] = filepath.Join("/dev", e.Name())
	}
	return ports, nil
}

// switchRoot makes an overlay of the host's root (read-only 9p) and a tmpfs
// the new root, and moves /dev, /proc and /sys into it.
func switchRoot() error {
	const (
		host   = "/mnt/host"
		rw     = "/mnt/rw"
		merged = "/mnt/root"
	)
	for _, d := range []string{host, rw, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("switch root: %w", err)
		}
	}
	if err := unix.Mount(tagHostRoot, host, "9p", unix.MS_RDONLY, ninePOptions); err != nil {
		return fmt.Errorf("mount host root: %w", err)
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount overlay tmpfs: %w", err)
	}
	for _, d := range []string{rw + "/upper", rw + "/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("switch root: %w", err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", host, rw, rw)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount root overlay: %w", err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := os.MkdirAll(merged+d, 0o755); err != nil {
			return fmt.Errorf("switch root: %w", err)
		}
		if err := unix.Mount(d, merged+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	if err := unix.Chdir(merged); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	return nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
