// Command vmexec runs a Go test binary inside a throw-away qemu VM booted on a
// chosen kernel. It is a `go test -exec` program:
//
//	go test -exec "vmexec --kernel 6.1" ./internal/flows
//
// The VM sees the host's root read-only (virtio-9p) under a tmpfs overlay,
// the repository and the test binary's directory read-write, and the kernel's
// modules. Test stdout and stderr come back over virtio-serial ports, the
// exit status over a third; the kernel console is kept apart and shown when a
// run fails. The same static binary is the VM's init (PID 1).
//
// See docs/vmtest.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() == 1 {
		guestMain() // never returns
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()

	var exit *exitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.code)
	case errors.Is(err, errInterrupted):
		fmt.Fprintln(os.Stderr, "vmexec:", err)
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "vmexec:", err)
		os.Exit(1)
	}
}

// exitError carries the test binary's exit code out of run.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("test binary exited with status %d", e.code) }

var errInterrupted = errors.New("interrupted")
