package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The neighbours' workloads of `footprint node`: each runs as its own
// process in a namespace of its own (no draind there), for a fixed time
// and at most a fixed number of operations, and prints "OPS NANOSECONDS".
// One thread each, raw system calls: the kernel's part (and the eBPF
// programs it runs) is most of every operation, as in a busy proxy or a
// shell-heavy job.
const (
	loadTCP  = "tcp"  // connect + accept + close of one loopback TCP connection
	loadFork = "fork" // fork + exec of /bin/true, and its wait
)

// nodeLoad is `footprint nodeload tcp|fork --for D --max N`.
func nodeLoad(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: footprint nodeload tcp|fork [--for D] [--max N]")
	}
	fs := flag.NewFlagSet("footprint nodeload", flag.ContinueOnError)
	dur := fs.Duration("for", 5*time.Second, "run this long")
	maxOps := fs.Int("max", 10_000_000, "stop after this many operations")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *dur <= 0 || *dur > 10*time.Minute {
		return fmt.Errorf("--for %s: want a duration in (0, 10m]", *dur)
	}
	if *maxOps <= 0 {
		return fmt.Errorf("--max %d: want a positive count", *maxOps)
	}
	var op func() error
	switch args[0] {
	case loadTCP:
		tcp, err := newTCPLoad()
		if err != nil {
			return err
		}
		defer unix.Close(tcp.ln)
		op = tcp.once
	case loadFork:
		null, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		defer null.Close()
		fd := null.Fd()
		op = func() error { return forkOnce(fd) }
	default:
		return fmt.Errorf("unknown load %q (want %s or %s)", args[0], loadTCP, loadFork)
	}
	start := time.Now()
	end := start.Add(*dur)
	n := 0
	for ; n < *maxOps; n++ {
		// The clock is read every 64 operations: a read is cheap
		// (vDSO) but not free next to a loopback connect.
		if n%64 == 0 && time.Now().After(end) {
			break
		}
		if err := op(); err != nil {
			return fmt.Errorf("%s operation %d: %w", args[0], n, err)
		}
	}
	fmt.Printf("%d %d\n", n, time.Since(start).Nanoseconds())
	return nil
}

// tcpLoad connects to its own loopback listener, accepts, and closes both
// ends: 3 state changes for the handshake and 5 or so for the close, per
// operation. The client closes first (`footprint node` sets its
// namespace's tcp_max_tw_buckets to 0: no TIME_WAIT to fill up).
type tcpLoad struct {
	ln   int
	addr unix.SockaddrInet4
}

func newTCPLoad() (*tcpLoad, error) {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	t := &tcpLoad{ln: ln, addr: unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}}
	err = unix.Bind(ln, &t.addr)
	if err == nil {
		err = unix.Listen(ln, 128)
	}
	if err == nil {
		var sa unix.Sockaddr
		if sa, err = unix.Getsockname(ln); err == nil {
			t.addr.Port = sa.(*unix.SockaddrInet4).Port
		}
	}
	if err != nil {
		unix.Close(ln)
		return nil, fmt.Errorf("listener: %w", err)
	}
	return t, nil
}

func (t *tcpLoad) once() error {
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	// On loopback the handshake completes inside connect(2): the
	// connection is in the accept queue when it returns.
	if err := unix.Connect(c, &t.addr); err != nil {
		unix.Close(c)
		return fmt.Errorf("connect: %w", err)
	}
	a, _, err := unix.Accept4(t.ln, unix.SOCK_CLOEXEC)
	unix.Close(c)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	return unix.Close(a)
}

// forkOnce runs /bin/true with null (/dev/null) as its stdio.
func forkOnce(null uintptr) error {
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Files: []uintptr{null, null, null}})
	if err != nil {
		return err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	if !ws.Exited() || ws.ExitStatus() != 0 {
		return fmt.Errorf("/bin/true: %v", ws)
	}
	return nil
}
