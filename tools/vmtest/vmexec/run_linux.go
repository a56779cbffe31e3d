package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// run boots one VM for the command in args and returns nil when the test
// binary exited 0, an *exitError with its status when it ran and failed, and
// another error when the VM could not run it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cwd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("get working directory: %w", err)
	}
	opts, err := parseOptions(args, os.Getenv, cwd, stderr)
	if err != nil {
		return err
	}
	k, err := resolveKernel(opts.Kernel)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	bin, err := exec.LookPath(opts.Args[0])
	if err != nil {
		return fmt.Errorf("find test binary: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return fmt.Errorf("find test binary: %w", err)
	}
	arch, err := archOf(bin)
	if err != nil {
		return err
	}
	init, err := guestInit(self, opts.Init, arch)
	if err != nil {
		return err
	}
	root, err := guestRoot(opts.Root, arch)
	if err != nil {
		return err
	}

	removeStaleTempDirs()
	tmp, err := os.MkdirTemp("", fmt.Sprintf("draind-vmexec-%d-", os.Getpid()))
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	if opts.Keep {
		fmt.Fprintln(stderr, "vmexec: keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	files, err := moduleFiles(ctx, k, opts.Modules, stderr)
	if err != nil {
		return err
	}
	j := &job{
		Args:     append([]string{bin}, opts.Args[1:]...),
		Env:      guestEnviron(os.Environ(), k.Release),
		Dir:      cwd,
		Hostname: "draind-vm",
		Tmpfs:    opts.Tmpfs,
	}
	for _, f := range files {
		j.Modules = append(j.Modules, f.Name)
	}
	workspace := gitRoot(cwd)
	if workspace == "" {
		workspace = cwd
	}
	var modDir string
	if k.ModDir != "" {
		modDir = "/lib/modules/" + k.Release
	}
	j.Shares = planShares(filepath.Dir(bin), workspace, k.ModDir, modDir)
	raw, err := json.Marshal(j)
	if err != nil {
		return fmt.Errorf("encode job: %w", err)
	}
	files = append(files,
		initramfsFile{Name: "/init", Perm: 0o755, From: init},
		initramfsFile{Name: jobPath, Perm: 0o644, Data: raw},
	)
	initrd := filepath.Join(tmp, "initramfs.cpio")
	if err := writeInitramfs(initrd, files); err != nil {
		return err
	}

	m := &machine{
		opts:    opts,
		arch:    arch,
		root:    root,
		kernel:  k,
		initrd:  initrd,
		dir:     tmp,
		shares:  j.Shares,
		stdout:  stdout,
		stderr:  stderr,
		console: filepath.Join(tmp, "console.log"),
	}
	return m.run(ctx)
}

// guestEnviron is the host's environment (vimto passes it verbatim) plus
// markers for tests.
func guestEnviron(env []string, release string) []string {
	out := make([]string, 0, len(env)+4)
	hasPath, hasHome := false, false
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, guestEnv+"="), strings.HasPrefix(kv, kernelEnv+"="):
			continue
		case strings.HasPrefix(kv, "PATH="):
			hasPath = true
		case strings.HasPrefix(kv, "HOME="):
			hasHome = true
		}
		out = append(out, kv)
	}
	if !hasPath {
		out = append(out, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if !hasHome {
		out = append(out, "HOME=/root")
	}
	return append(out, guestEnv+"=1", kernelEnv+"="+release)
}

// hiddenDirs are host directories the guest covers with its own tmpfs.
var hiddenDirs = []string{"/tmp", "/run", "/dev/shm"}

func within(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// planShares lists the host directories mounted read-write at the same path
// in the guest: the workspace (the git repository around the working
// directory, as vimto does) and the test binary's directory when the guest
// would not see it otherwise (go test builds in $WORK under /tmp, and writes
// coverage and test logs there). The kernel's module tree comes last,
// read-only.
func planShares(binDir, workspace, hostModDir, guestModDir string) []share {
	var rw []string
	if workspace = filepath.Clean(workspace); workspace != "/" {
		rw = append(rw, workspace)
	}
	binDir = filepath.Clean(binDir)
	for _, h := range hiddenDirs {
		if within(binDir, h) {
			rw = append(rw, binDir)
			break
		}
	}
	sort.Slice(rw, func(i, k int) bool { return len(rw[i]) < len(rw[k]) })
	var shares []share
	for _, d := range rw {
		covered := false
		for _, s := range shares {
			covered = covered || within(d, s.HostPath)
		}
		if !covered {
			shares = append(shares, share{HostPath: d, GuestPath: d})
		}
	}
	if hostModDir != "" {
		shares = append(shares, share{HostPath: hostModDir, GuestPath: guestModDir, ReadOnly: true})
	}
	for i := range shares {
		shares[i].Tag = "share" + strconv.Itoa(i)
	}
	return shares
}

// checkStatic makes sure a binary can serve as the VM's init: the guest has
// its root filesystem only once the init has mounted it.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("inspect own executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0 (it is also the VM's init)", path)
		}
	}
	return nil
}

// removeStaleTempDirs removes directories left by runners that were killed
// (go test SIGKILLs its -exec program on its own timeout).
func removeStaleTempDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "draind-vmexec-*-*"))
	for _, d := range dirs {
		parts := strings.Split(filepath.Base(d), "-")
		if len(parts) < 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[2])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// machine is one qemu process and its plumbing.
type machine struct {
	opts    *options
	arch    *guestArch
	root    string // host directory shared as the guest's root
	kernel  *kernelImage
	initrd  string
	dir     string
	shares  []share
	stdout  io.Writer
	stderr  io.Writer
	console string // path of the console log
}

// quitGrace is how long a timed-out test binary gets to dump its goroutines.
const quitGrace = 15 * time.Second

func qemuPath(p string) string { return strings.ReplaceAll(p, ",", ",,") }

func (m *machine) qemuArgs(sockets map[string]string) []string {
	cmdline := append(m.arch.cmdline[:len(m.arch.cmdline):len(m.arch.cmdline)],
		"panic=-1", "rdinit=/init", "random.trust_cpu=on", "mitigations=off")
	if m.opts.Append != "" {
		cmdline = append(cmdline, m.opts.Append)
	}
	args := []string{"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"}
	args = append(args, m.arch.qemuMachine...)
	args = append(args,
		"-m", m.opts.Memory, "-smp", m.opts.SMP,
		"-kernel", m.kernel.Vmlinuz, "-initrd", m.initrd,
		"-append", strings.Join(cmdline, " "),
		"-chardev", "socket,id=console,path="+qemuPath(sockets["console"]),
		"-serial", "chardev:console",
		"-device", "virtio-serial-pci,id=vser0",
		"-device", "virtio-rng-pci",
		"-fsdev", "local,id="+tagHostRoot+",path="+qemuPath(m.root)+",security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev="+tagHostRoot+",mount_tag="+tagHostRoot,
	)
	for _, p := range []string{portStdout, portStderr, portControl} {
		id := strings.TrimPrefix(p, "draind.")
		args = append(args,
			"-chardev", "socket,id="+id+",path="+qemuPath(sockets[id]),
			"-device", "virtserialport,bus=vser0.0,chardev="+id+",name="+p)
	}
	for _, s := range m.shares {
		fsdev := "local,id=" + s.Tag + ",path=" + qemuPath(s.HostPath) + ",security_model=none,multidevs=remap"
		if s.ReadOnly {
			fsdev += ",readonly=on"
		}
		args = append(args, "-fsdev", fsdev, "-device", "virtio-9p-pci,fsdev="+s.Tag+",mount_tag="+s.Tag)
	}
	return args
}

func (m *machine) run(ctx context.Context) error {
	listeners := map[string]*unixListener{}
	sockets := map[string]string{}
	defer func() {
		// Runs after the pumps are done (or never started).
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, name := range []string{"console", "stdout", "stderr", "control"} {
		path := filepath.Join(m.dir, name+".sock")
		l, err := listenUnix(path)
		if err != nil {
			return err
		}
		listeners[name] = l
		sockets[name] = path
	}

	consoleLog, err := os.Create(m.console)
	if err != nil {
		return fmt.Errorf("create console log: %w", err)
	}
	defer consoleLog.Close()
	var consoleOut io.Writer = consoleLog
	if m.opts.Console {
		consoleOut = io.MultiWriter(consoleLog, m.stderr)
	}

	var qemuOut bytes.Buffer
	qemu := m.opts.QEMU
	if qemu == "" {
		qemu = m.arch.qemu
	}
	cmd := exec.Command(qemu, m.qemuArgs(sockets)...)
	cmd.Stdout = &qemuOut
	cmd.Stderr = &qemuOut
	// Pdeathsig: qemu dies with the runner even when the runner is SIGKILLed.
	// Setpgid: a terminal's ^C reaches the runner, which then stops qemu itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		control *os.File
		status  string
	)
	pump := func(name string, w io.Writer) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := listeners[name].Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			io.Copy(w, conn)
		}()
	}
	stdout := &countingWriter{w: m.stdout}
	stderr := &countingWriter{w: m.stderr}
	pump("console", consoleOut)
	pump("stdout", stdout)
	pump("stderr", stderr)
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := listeners["control"].Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		mu.Lock()
		control = conn
		mu.Unlock()
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			// "done OUT ERR STATUS": the guest's last words. Acknowledge
			// once the output it counted has arrived; it then powers off.
			out, errOut, rest, ok := parseDone(sc.Text())
			if !ok {
				continue
			}
			deadline := time.Now().Add(10 * time.Second)
			for (stdout.n.Load() < out || stderr.n.Load() < errOut) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			status = rest
			fmt.Fprintln(conn, "ack")
			mu.Unlock()
		}
	}()

	quit := make(chan os.Signal, 1)
	signal.Notify(quit, syscall.SIGQUIT)
	defer signal.Stop(quit)
	timer := time.NewTimer(m.opts.Timeout)
	defer timer.Stop()

	// askQuit has the guest send SIGQUIT to the test binary, which then dumps
	// its goroutines and exits, as it would without a VM.
	askQuit := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if control == nil {
			return false
		}
		_, err := fmt.Fprintln(control, "quit")
		return err == nil
	}
	var (
		stopReason error
		grace      <-chan time.Time
	)
wait:
	for {
		select {
		case <-exited:
			break wait
		case <-ctx.Done():
			stopReason = errInterrupted
		case <-timer.C:
			stopReason = fmt.Errorf("timed out after %v", m.opts.Timeout)
			if askQuit() {
				fmt.Fprintf(m.stderr, "vmexec: timed out after %v; asking the test binary for a goroutine dump\n", m.opts.Timeout)
				grace = time.After(quitGrace)
				continue
			}
		case <-grace:
		case <-quit:
			// go test's own timeout signal.
			askQuit()
			continue
		}
		_ = cmd.Process.Kill()
		<-exited
		break wait
	}
	// qemu is gone: its ends of the sockets are closed and the pumps drain.
	// A listener nobody connected to is unblocked by closing it.
	for _, l := range listeners {
		l.Shutdown()
	}
	wg.Wait()
	elapsed := time.Since(start).Round(time.Millisecond)

	mu.Lock()
	final := status
	mu.Unlock()
	return m.verdict(final, stopReason, qemuOut.String(), elapsed)
}

// parseDone parses the guest's "done OUT ERR STATUS" line.
func parseDone(line string) (out, errOut int64, status string, ok bool) {
	f := strings.SplitN(strings.TrimSpace(line), " ", 4)
	if len(f) != 4 || f[0] != "done" {
		return 0, 0, "", false
	}
	out, err1 := strconv.ParseInt(f[1], 10, 64)
	errOut, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return out, errOut, f[3], true
}

// verdict turns the guest's status line into run's result, showing the
// kernel console when something went wrong.
func (m *machine) verdict(status string, stopped error, qemuOut string, elapsed time.Duration) error {
	console, _ := os.ReadFile(m.console)
	word, rest, _ := strings.Cut(status, " ")
	if stopped == nil && word == "exit" {
		code, err := strconv.Atoi(rest)
		if err == nil {
			if code == 0 {
				if excerpt := kernelProblems(console); excerpt != "" {
					fmt.Fprintf(m.stderr, "vmexec: the test passed, but the kernel (%s) reported problems:\n%s", m.kernel.Release, excerpt)
				}
				return nil
			}
			m.showConsole(console, false)
			return &exitError{code: code}
		}
	}
	if errors.Is(stopped, errInterrupted) {
		return stopped
	}
	m.showConsole(console, true)
	if strings.TrimSpace(qemuOut) != "" {
		fmt.Fprintf(m.stderr, "--- qemu output ---\n%s\n", strings.TrimSpace(qemuOut))
	}
	switch {
	case stopped != nil:
		return stopped
	case word == "signal":
		return fmt.Errorf("test binary killed by signal %s on kernel %s", rest, m.kernel.Release)
	case word == "error":
		return fmt.Errorf("guest on kernel %s: %s", m.kernel.Release, rest)
	default:
		return fmt.Errorf("VM on kernel %s stopped after %v without a result", m.kernel.Release, elapsed)
	}
}

// showConsole prints the part of the kernel console that explains a failure:
// from the first oops or panic on, or else (when always is set) the tail.
func (m *machine) showConsole(console []byte, always bool) {
	excerpt := kernelProblems(console)
	if excerpt == "" && always {
		excerpt = tailLines(string(console), 40)
	}
	if excerpt == "" {
		return
	}
	fmt.Fprintf(m.stderr, "--- kernel console (%s) ---\n%s--- end of kernel console ---\n", m.kernel.Release, excerpt)
}

var problemMarkers = []string{
	"Kernel panic", "BUG:", "Oops", "general protection fault", "WARNING:",
	"Call Trace:", "kernel BUG", "Unable to handle kernel", "hung_task", "soft lockup",
}

// kernelProblems returns the console from a few lines before the first sign
// of a kernel problem, at most 200 lines, or "" when there is none.
func kernelProblems(console []byte) string {
	lines := strings.SplitAfter(string(console), "\n")
	for i, line := range lines {
		for _, marker := range problemMarkers {
			if !strings.Contains(line, marker) {
				continue
			}
			from := max(i-5, 0)
			to := min(from+200, len(lines))
			return strings.Join(lines[from:to], "")
		}
	}
	return ""
}

func tailLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, "")
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// countingWriter counts what reaches w.
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// unixListener is a listening AF_UNIX socket. It is made with x/sys/unix
// rather than package net so that the binary stays static with cgo enabled:
// it is also the VM's init.
type unixListener struct {
	mu     sync.Mutex
	fd     int
	closed bool
}

func listenUnix(path string) (*unixListener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return &unixListener{fd: fd}, nil
}

// Accept waits for one connection. Shutdown unblocks it.
func (l *unixListener) Accept() (*os.File, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("accept: %w", err)
		}
		return os.NewFile(uintptr(nfd), "socket"), nil
	}
}

// Shutdown wakes a blocked Accept; later ones fail at once.
func (l *unixListener) Shutdown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		_ = unix.Shutdown(l.fd, unix.SHUT_RDWR)
	}
}

// Close releases the socket; no Accept may be running.
func (l *unixListener) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		_ = unix.Close(l.fd)
	}
}
