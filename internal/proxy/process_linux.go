// Package proxy starts and supervises the sidecar proxy process: its own
// process group (signals reach Envoy's whole tree), a parent-death signal
// (it dies with draind), and a reaper that publishes its exit — and, when
// draind is PID 1 of its container, reaps every orphan too.
//
// # Capabilities
//
// The proxy gets Options.Caps as ambient capabilities (--proxy-caps: e.g.
// NET_ADMIN for Envoy's IP_TRANSPARENT listeners under TPROXY) and nothing
// else from draind: agent.Run clears draind's inheritable and ambient sets
// and, as root, shrinks its bounding set to Caps before Start
// (privs.LimitInherited), so the proxy inherits no other capability
// whether it runs as root or under Credential.
//
// # Goroutines
//
// Start runs one goroutine, the reaper, locked to the OS thread that forked
// the proxy (Pdeathsig fires when that thread ends). It ends when the proxy
// has exited and been reaped: Exited is closed then.
package proxy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/privs"
)

// Options configures Start.
type Options struct {
	// Stdout and Stderr receive the proxy's output (nil: draind's own).
	Stdout, Stderr *os.File
	// Env is the proxy's environment (nil: draind's).
	Env []string
	// Credential runs the proxy under another uid/gid (nil: draind's).
	Credential *syscall.Credential
	// Caps are capabilities the proxy gets (--proxy-caps): raised into its
	// ambient set, so that they survive its execve and, with Credential,
	// its change of uid. draind must hold them in its permitted set. It
	// gets nothing else from draind once privs.LimitInherited(Caps) ran
	// (agent.Run does that first).
	Caps privs.Set
	// ReapAll makes the reaper collect every child, not only the proxy:
	// what PID 1 must do, or orphans pile up as zombies.
	ReapAll bool
	// SignalPIDOnly sends every signal but SIGKILL to the proxy's PID
	// alone, not its group: for a supervisor such as Istio's pilot-agent,
	// whose Envoy shares its group and must hear from pilot-agent, not
	// from draind (a SIGTERM to the group ends Envoy at once). SIGKILL,
	// the last step, still goes to the group: pilot-agent starts Envoy
	// without a parent-death signal, so Envoy would outlive it.
	SignalPIDOnly bool
}

// Process is the supervised proxy process. It runs in its own process group
// (signals reach Envoy's whole tree) and dies with draind (Pdeathsig).
type Process struct {
	pid     int
	pidOnly bool // Options.SignalPIDOnly
	exited  chan struct{}

	mu     sync.Mutex
	status unix.WaitStatus
	reaped int // orphans reaped (PID 1)
}

// Start starts argv[0] with argv. The reaper that publishes its exit
// is the goroutine that started it, locked to its OS thread: Pdeathsig
// fires when the forking thread ends, so that thread must live as long as
// the proxy.
func Start(argv []string, opts Options) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("no proxy command given (draind run [flags] -- COMMAND [ARGS...])")
	}
	path := argv[0]
	if lp, err := exec.LookPath(path); err == nil {
		path = lp
	} else {
		return nil, fmt.Errorf("proxy command %q: %w", argv[0], err)
	}
	stdout, stderr := opts.Stdout, opts.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	// stdin is /dev/null, never a closed fd 0: the proxy's first open
	// file or socket would take fd 0 and be read as its stdin (issue 43).
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("proxy stdin: %w", err)
	}
	defer stdin.Close() // the child has its copy once started
	attr := &os.ProcAttr{
		Env:   opts.Env,
		Files: []*os.File{stdin, stdout, stderr},
		Sys: &syscall.SysProcAttr{
			Setpgid:     true,
			Pdeathsig:   syscall.SIGKILL,
			Credential:  opts.Credential,
			AmbientCaps: opts.Caps.Numbers(),
		},
	}
	if attr.Env == nil {
		attr.Env = os.Environ()
	}
	p := &Process{exited: make(chan struct{}), pidOnly: opts.SignalPIDOnly}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		var sigc chan os.Signal
		if opts.ReapAll {
			sigc = make(chan os.Signal, 1)
			signal.Notify(sigc, syscall.SIGCHLD)
			defer signal.Stop(sigc)
		}
		proc, err := os.StartProcess(path, argv, attr)
		if err != nil {
			if opts.Caps != 0 && errors.Is(err, syscall.EPERM) {
				err = fmt.Errorf("%w (giving it %s needs them in draind's permitted set)", err, opts.Caps)
			}
			started <- fmt.Errorf("start proxy %q: %w", argv[0], err)
			return
		}
		p.pid = proc.Pid
		proc.Release() // we wait with wait4 ourselves
		started <- nil
		if opts.ReapAll {
			p.reapAll(sigc)
		} else {
			p.reapOne()
		}
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Process) reapOne() {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(p.pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// ECHILD: someone else reaped it; report a crash-like status.
			ws = unix.WaitStatus(0xff << 8)
		}
		break
	}
	p.mu.Lock()
	p.status = ws
	p.mu.Unlock()
}

// reapAll collects every exited child on SIGCHLD until the proxy is among
// them.
func (p *Process) reapAll(sigc chan os.Signal) {
	for {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			p.mu.Lock()
			if pid == p.pid {
				p.status = ws
				p.mu.Unlock()
				return
			}
			p.reaped++
			p.mu.Unlock()
		}
		<-sigc
	}
}

// Pid is the proxy's process id (and process group id).
func (p *Process) Pid() int { return p.pid }

// Exited is closed once the proxy has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitCode is the proxy's exit status once Exited is closed: its exit
// code, or 128+N when signal N ended it (the shell's convention).
func (p *Process) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.status.Exited():
		return p.status.ExitStatus()
	case p.status.Signaled():
		return 128 + int(p.status.Signal())
	}
	return 255
}

// ExitDescription says how the proxy ended, for logs.
func (p *Process) ExitDescription() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status.Signaled() {
		return "killed by " + p.status.Signal().String()
	}
	return fmt.Sprintf("exited with code %d", p.status.ExitStatus())
}

// Signal sends sig to the proxy's whole process group, or to its PID
// alone under Options.SignalPIDOnly (but SIGKILL).
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return os.ErrProcessDone
	default:
	}
	target, what := -p.pid, "group"
	if p.pidOnly && sig != syscall.SIGKILL {
		target, what = p.pid, "process"
	}
	if err := unix.Kill(target, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal proxy %s %d: %w", what, p.pid, err)
	}
	return nil
}
