// Package cli is draind's command line: it parses flags (with their
// environment twins), builds the parts and runs them. cmd/draind only calls
// Main; tests call Run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/privs"
)

// exitError carries a process exit code (with or without a message).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err != nil {
		return e.err.Error()
	}
	return fmt.Sprintf("exit status %d", e.code)
}
func (e *exitError) Unwrap() error { return e.err }

// usageErr is a bad flag or argument: exit 2 with one line naming it.
func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

// Main runs draind and maps the outcome to an exit code, printing a
// one-line error to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return exitCode(Run(ctx, args, stdout, stderr), stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "draind:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "draind:", err)
	return 1
}

const usage = `usage: draind COMMAND [flags]

commands:
  run [flags] -- COMMAND [ARGS...]  supervise the proxy; the container entrypoint
  wait [flags]                      block until the proxy is ready (postStart hook)
  prestop [flags]                   block until the app has finished its flows (preStop hook)
  drain [flags]                     start the drain of the running draind run (native sidecar preStop hook)
  conns [flags]                     one snapshot of listeners and flows, attributed
  watch [flags]                     live TCP state changes, attributed
  pods [flags]                      every pod of the node: its drain, or its flows (through the CRI)
  version                           print the version

"draind COMMAND -h" lists a command's flags and their environment twins.
`

// commands are draind's commands but version and help.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"run": runRun, "wait": runWait, "prestop": runPrestop, "drain": runDrain, "conns": runConns, "watch": runWatch,
	"pods": runPods,
}

// Version is set at build time (-ldflags "-X .../internal/cli.Version=...").
var Version = "dev"

// Run is draind: it returns nil for exit 0, or an error that Main maps to
// an exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &exitError{code: 2}
	}
	cmd, rest := args[0], args[1:]
	if run, ok := commands[cmd]; ok {
		return run(ctx, rest, stdout, stderr)
	}
	switch cmd {
	case "version", "--version", "-version":
		_, err := fmt.Fprintln(stdout, "draind", Version)
		return err
	case "help", "-h", "--help":
		_, err := fmt.Fprint(stdout, usage)
		return err
	}
	return usageErr("unknown command %q (see draind help)", cmd)
}

// raiseFileCaps makes the capabilities the image grants draind as file
// capabilities (`+p`: permitted, not effective, so that the binary starts
// under any securityContext) effective, as `draind run` does. Without
// them nothing changes; when they cannot be raised (a cgo build, a capset
// refused) the command goes on as it does without privileges, and says so
// (capsRaise.warn, capsRaise.log): what it cannot see next is explained.
func raiseFileCaps() capsRaise {
	before, after, err := privs.RaiseEffective()
	return capsRaise{before: before, after: after, err: err}
}

// capsRaise is what raiseFileCaps did.
type capsRaise struct {
	before, after privs.Sets
	err           error
}

// warn writes one line to w when the raise failed (conns and watch, which
// have no log).
func (c capsRaise) warn(w io.Writer, cmd string) {
	if c.err != nil {
		fmt.Fprintf(w, "draind %s: capabilities: %v; going on without them\n", cmd, c.err)
	}
}

// log logs the raise, as `draind run` logs its own at start.
func (c capsRaise) log(log *zap.Logger) {
	if c.err != nil {
		log.Warn("capabilities: raise", logevent.CapabilitiesFailed.Field(), zap.String("action", "raise"), zap.Error(c.err), zap.Stringer("effective", c.after.Effective), zap.Stringer("permitted", c.after.Permitted))
		return
	}
	log.Info("capabilities", zap.Stringer("effective", c.after.Effective), zap.Stringer("raised", c.after.Effective&^c.before.Effective))
}

// untilSignal is ctx, cancelled by SIGTERM or SIGINT: how the kubelet ends a
// hook, and a terminal a watch.
func untilSignal(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
}
