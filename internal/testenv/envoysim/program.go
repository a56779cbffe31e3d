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

// exitError carries the program's exit code; it has an ExitCode method.
// abort asks Main to kill the process with SIGABRT instead.
type exitError struct {
	code  int
	abort bool
	why   string
}

func (e exitError) Error() string { return fmt.Sprintf("%s, exit code %d", e.why, e.code) }
func (e exitError) ExitCode() int { return e.code }

// Envoy's command-line options (source/server/options_impl.cc) that
// envoysim accepts and ignores: pilot-agent passes several of them
// (--local-address-ip-version, --file-flush-interval-msec,
// --allow-unknown-static-fields, --skip-deprecated-logs, --log-format,
// -l, --component-log-level, --config-yaml, ...).
var (
	ignoredValueFlags = []string{"l", "log-level", "component-log-level", "log-format", "log-path",
		"local-address-ip-version", "file-flush-interval-msec", "file-flush-min-size-kb",
		"service-cluster", "service-node", "service-zone", "base-id", "base-id-path", "restart-epoch",
		"config-yaml", "disable-extensions", "socket-path", "socket-mode"}
	ignoredSwitches = []string{"disable-hot-restart", "allow-unknown-fields", "allow-unknown-static-fields",
		"reject-unknown-dynamic-fields", "ignore-unknown-dynamic-fields", "skip-deprecated-logs",
		"log-stacktrace-single-entry", "log-format-escaped", "enable-fine-grain-logging",
		"use-dynamic-base-id", "skip-hot-restart-on-no-parent", "skip-hot-restart-parent-stats",
		"enable-mutex-tracing", "cpuset-threads", "enable-core-dump"}
)

// multiFlag is a repeatable flag (Envoy's --stats-tag).
type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint(*m) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// Run is the envoysim program: it parses Envoy-like flags, runs a Sim until
// SIGTERM, SIGINT, /quitquitquit, a crash or ctx's end, and returns nil for
// a clean exit or an error; after a crash with an exit code, or the
// exit-at-start fault, the error has an ExitCode() int method. A crash
// without an exit code kills the process with SIGABRT from inside Run.
// SIGHUP and SIGUSR1 are ignored. Logs go to stderr; --version prints to
// stdout.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("envoysim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath      = fs.String("c", "", "config `file` (envoysim's JSON format, not an Envoy bootstrap)")
		adminAddr       = fs.String("admin-address", "", "admin API `host:port` (overrides the config)")
		adminPath       = fs.String("admin-address-path", "", "`file` to write the bound admin address to")
		drainTime       = fs.Float64("drain-time-s", 0, "drain time in `seconds`; 0 drains at once (default 600)")
		strategy        = fs.String("drain-strategy", "", "drain strategy: gradual (default) or immediate")
		parentShutdown  = fs.Float64("parent-shutdown-time-s", 0, "parent shutdown time in `seconds`, only reported (default 900)")
		concurrency     = fs.Int("concurrency", 0, "worker threads (default 2)")
		mode            = fs.String("mode", "serve", "serve, validate (check the config and exit) or init_only (start, then exit)")
		startupDelay    = fs.Duration("startup-delay", 0, "time to go LIVE")
		flushInterval   = fs.Duration("stats-flush-interval", 0, "refresh server.* gauges only at start and on this period (0: on every read)")
		statsMatcher    = fs.String("stats-matcher", "", "stats_matcher preset: istio (no downstream_cx_active gauges), istio_exit_on_zero or reject_all")
		drainGen        = fs.String("drain-generation", "", "how a drain reaches connections: 1.39 (default: on each response), 1.40 (a pushed drain event, still on each response) or connection_event (Envoy main after 1.40.0: also proactively)")
		faultAdmin      = fs.String("fault-admin", "", "admin fault: hang, 500, garbage or slow")
		faultDelay      = fs.Duration("fault-admin-delay", 0, "delay every admin answer by this long (slow: default 2s)")
		faultExit       = fs.Int("fault-exit-at-start", 0, "exit with this code instead of going LIVE")
		faultNeverLive  = fs.Bool("fault-never-live", false, "stay INITIALIZING forever")
		crashAfter      = fs.Duration("crash-after", 0, "crash this long after start")
		crashAfterDrain = fs.Duration("crash-after-drain", 0, "crash this long after the first /drain_listeners")
		crashCode       = fs.Int("crash-exit-code", 0, "exit with this code on a crash instead of dying by SIGABRT")
		showVersion     = fs.Bool("version", false, "print the version and exit")
		statsTags       multiFlag
	)
	fs.StringVar(configPath, "config-path", "", "same as -c")
	fs.Var(&statsTags, "stats-tag", "ignored (Envoy flag)")
	for _, n := range ignoredValueFlags {
		fs.String(n, "", "ignored (Envoy flag)")
	}
	for _, n := range ignoredSwitches {
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
	switch *mode {
	case "serve", "validate", "init_only":
	default:
		return fmt.Errorf("--mode %q: want serve, validate or init_only", *mode)
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
			switch {
			case *drainTime < 0:
				ferr = errors.New("--drain-time-s: negative")
			case cfg.DrainTime == 0:
				cfg.DrainTime = ZeroDrainTime
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
		case "stats-matcher":
			cfg.StatsMatcher, cfg.StatsInclusion = *statsMatcher, nil
		case "drain-generation":
			cfg.DrainGeneration = *drainGen
		case "fault-admin":
			cfg.Fault.Admin = AdminFault(*faultAdmin)
		case "fault-admin-delay":
			cfg.Fault.AdminDelay = *faultDelay
		case "fault-exit-at-start":
			cfg.Fault.ExitAtStart, cfg.Fault.ExitAtStartCode = true, *faultExit
		case "fault-never-live":
			cfg.Fault.NeverLive = *faultNeverLive
		case "crash-after":
			cfg.Fault.CrashAfter = *crashAfter
		case "crash-after-drain":
			cfg.Fault.CrashAfterDrain = *crashAfterDrain
		case "crash-exit-code":
			cfg.Fault.CrashExitCode = *crashCode
		}
	})
	if ferr != nil {
		return ferr
	}
	if *mode == "validate" {
		if _, err := cfg.withDefaults(); err != nil {
			return fmt.Errorf("envoysim: %w", err)
		}
		fmt.Fprintf(stdout, "configuration '%s' OK\n", *configPath)
		return nil
	}
	cfg.Log = stderr
	cfg.OnCrash = abortProcess

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	sim, err := Start(cfg)
	if err != nil {
		return err
	}
	ctxDone := ctx.Done()
	if *mode == "init_only" {
		sim.WaitLive(ctx)
		sim.Quit()
	}
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
			return exitResult(sim)
		}
	}
}

// exitResult is Run's result once the sim has stopped. It waits for the
// sim's goroutines only briefly: the process exits at once.
func exitResult(sim *Sim) error {
	closed := make(chan error, 1)
	go func() { closed <- sim.Close() }()
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(time.Second):
	}
	var ee *ExitError
	switch err := sim.Err(); {
	case errors.Is(err, ErrCrashed):
		code := sim.CrashExitCode()
		return exitError{code: max(code, 134), abort: code == 0, why: "crashed (injected fault)"}
	case errors.As(err, &ee):
		return exitError{code: ee.Code, why: "exited at start (injected fault)"}
	}
	return cerr
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
// (or -h), the code of a crash with --crash-exit-code or of the
// exit-at-start fault, 1 after an error, which it prints to stderr. A crash
// without an exit code kills the process with SIGABRT (134 is returned
// only where that is impossible). It lets a test binary double as the
// envoysim program.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Run(ctx, args, stdout, stderr)
	var ee exitError
	var ec interface{ ExitCode() int }
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.abort {
			abortProcess()
		}
		return ee.code
	case errors.As(err, &ec):
		return ec.ExitCode()
	}
	fmt.Fprintln(stderr, "envoysim:", err)
	return 1
}
