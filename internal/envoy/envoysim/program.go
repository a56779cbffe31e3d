package envoysim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const version = "0000000000000000000000000000000000000000/1.36.0-envoysim/Clean/RELEASE/BoringSSL"

// exitError carries a crash's exit code; it has an ExitCode method.
type exitError struct{ code int }

func (e exitError) Error() string {
	return fmt.Sprintf("crashed (injected fault), exit code %d", e.code)
}
func (e exitError) ExitCode() int { return e.code }

// Run is the envoysim program: it parses Envoy-like flags, runs a Sim until
// SIGTERM, SIGINT, /quitquitquit, a crash or ctx's end, and returns nil for
// a clean exit or an error; after a crash the error has an ExitCode() int
// method giving the crash exit code. SIGHUP and SIGUSR1 are ignored. Logs
// go to stderr; --version prints to stdout.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("envoysim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath     = fs.String("c", "", "config `file` (envoysim's JSON format, not an Envoy bootstrap)")
		adminAddr      = fs.String("admin-address", "", "admin API `host:port` (overrides the config)")
		adminPath      = fs.String("admin-address-path", "", "`file` to write the bound admin address to")
		drainTime      = fs.Float64("drain-time-s", 0, "drain time in `seconds` (default 600)")
		strategy       = fs.String("drain-strategy", "", "drain strategy: gradual (default) or immediate")
		parentShutdown = fs.Float64("parent-shutdown-time-s", 0, "parent shutdown time in `seconds`, only reported (default 900)")
		concurrency    = fs.Int("concurrency", 0, "worker threads (default 2)")
		startupDelay   = fs.Duration("startup-delay", 0, "time to go LIVE")
		flushInterval  = fs.Duration("stats-flush-interval", 0, "refresh server.* gauges only on this period (0: on every read)")
		faultAdmin     = fs.String("fault-admin", "", "admin fault: hang, 500 or garbage")
		crashAfter     = fs.Duration("crash-after", 0, "crash after this long")
		crashCode      = fs.Int("crash-exit-code", 0, "exit code of a crash (default 134)")
		showVersion    = fs.Bool("version", false, "print the version and exit")
	)
	fs.StringVar(configPath, "config-path", "", "same as -c")
	// Envoy flags pilot-agent and others pass: accepted, ignored.
	for _, n := range []string{"l", "log-level", "component-log-level", "log-format", "log-path",
		"local-address-ip-version", "file-flush-interval-msec", "service-cluster", "service-node",
		"service-zone", "base-id", "restart-epoch", "config-yaml", "mode"} {
		fs.String(n, "", "ignored (Envoy flag)")
	}
	for _, n := range []string{"disable-hot-restart", "allow-unknown-static-fields",
		"reject-unknown-dynamic-fields", "log-format-escaped", "use-dynamic-base-id", "enable-core-dump"} {
		fs.Bool(n, false, "ignored (Envoy flag)")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintf(stdout, "envoysim  version: %s\n", version)
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	var cfg Config
	if *configPath != "" {
		var err error
		if cfg, err = LoadConfig(*configPath); err != nil {
			return err
		}
	}
	var ferr error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "admin-address":
			cfg.AdminAddress = *adminAddr
		case "admin-address-path":
			cfg.AdminAddressPath = *adminPath
		case "drain-time-s":
			cfg.DrainTime = time.Duration(*drainTime * float64(time.Second))
			if *drainTime <= 0 {
				ferr = errors.New("--drain-time-s: want a positive number")
			}
		case "drain-strategy":
			cfg.DrainStrategy = *strategy
		case "parent-shutdown-time-s":
			cfg.ParentShutdownTime = time.Duration(*parentShutdown * float64(time.Second))
		case "concurrency":
			cfg.Concurrency = *concurrency
		case "startup-delay":
			cfg.StartupDelay = *startupDelay
		case "stats-flush-interval":
			cfg.StatsFlushInterval = *flushInterval
		case "fault-admin":
			cfg.Fault.Admin = AdminFault(*faultAdmin)
		case "crash-after":
			cfg.Fault.CrashAfter = *crashAfter
		case "crash-exit-code":
			cfg.Fault.CrashExitCode = *crashCode
		}
	})
	if ferr != nil {
		return ferr
	}
	cfg.Log = stderr

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	sim, err := Start(cfg)
	if err != nil {
		return err
	}
	ctxDone := ctx.Done()
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				fmt.Fprintln(stderr, "envoysim: caught SIGHUP: ignored")
			case syscall.SIGUSR1:
				fmt.Fprintln(stderr, "envoysim: caught SIGUSR1: reopening access logs (none)")
			default:
				fmt.Fprintf(stderr, "envoysim: caught ENVOY_%s\n", signame(sig))
				sim.Quit()
			}
		case <-ctxDone:
			ctxDone = nil
			sim.Quit()
		case <-sim.Done():
			// Exit at once: wait for the goroutines only briefly.
			closed := make(chan error, 1)
			go func() { closed <- sim.Close() }()
			var cerr error
			select {
			case cerr = <-closed:
			case <-time.After(time.Second):
			}
			if errors.Is(sim.Err(), ErrCrashed) {
				return exitError{code: sim.CrashExitCode()}
			}
			return cerr
		}
	}
}

func signame(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	}
	return sig.String()
}

// Main runs Run and returns the process exit code: 0 after a clean exit
// (or -h), the crash exit code after a crash, 1 after an error, which it
// prints to stderr. It lets a test binary double as the envoysim program.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Run(ctx, args, stdout, stderr)
	var ec interface{ ExitCode() int }
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ec):
		return ec.ExitCode()
	}
	fmt.Fprintln(stderr, "envoysim:", err)
	return 1
}
