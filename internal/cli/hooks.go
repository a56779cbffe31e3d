package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/sockdiag"
	"go.uber.org/zap"
)

func runWait(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("wait", "wait [--url URL] [--timeout D] [--period D]", stdout)
	url := fs.String("url", "http://localhost:15020/healthz/ready", "readiness URL to poll")
	var timeout, period time.Duration
	fs.durationVar(&timeout, "timeout", 60*time.Second, "give up after this long (exit 1)")
	fs.durationVar(&period, "period", 500*time.Millisecond, "poll period")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if period <= 0 || timeout <= 0 {
		return usageErr("wait: --period and --timeout must be positive")
	}
	if err := agent.WaitReady(ctx, *url, period, timeout); err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	return nil
}

func runPrestop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prestop", "prestop [--timeout D] [--app-ports P,...] [--wait-listeners] [--idle-timeout D]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	var timeout time.Duration
	fs.durationVar(&timeout, "timeout", 25*time.Second, "return (exit 0) after this long even with flows open")
	appPorts := portList{}
	fs.Var(&appPorts, "app-ports", "with --wait-listeners: the app ports whose listeners must close")
	waitListeners := fs.Bool("wait-listeners", false, "also wait for the app's listeners to close")
	tracker := &oneOf{val: "auto", words: []string{"auto", "ebpf", "sockdiag"}}
	fs.Var(tracker, "tracker", "auto|ebpf|sockdiag")
	logFormat := &oneOf{val: "json", words: []string{"json", "console"}}
	fs.Var(logFormat, "log-format", "json|console")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	raiseFileCaps()
	if err := nf.validate("prestop"); err != nil {
		return err
	}
	if timeout <= 0 {
		return usageErr("prestop: --timeout must be positive")
	}
	log, err := newLogger(logFormat.val, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	ns, err := nf.open()
	if err != nil {
		return err
	}
	defer ns.Close()
	// The kubelet kills a hook at the grace period; a signal ends us too.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	_, err = agent.Prestop(ctx, ns, agent.PrestopConfig{
		Tracker:       flows.TrackerConfig{Mode: tracker.val, Policy: nf.policy(), Logger: log},
		Timeout:       timeout,
		WaitListeners: *waitListeners,
		AppPorts:      appPorts,
		Logger:        log,
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func runWatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("watch", "watch [--netns PATH | --pid PID] [--tracker auto|ebpf|sockdiag] [-o table|json]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	tracker := &oneOf{val: "auto", words: []string{"auto", "ebpf", "sockdiag"}}
	fs.Var(tracker, "tracker", "auto|ebpf|sockdiag")
	var period time.Duration
	fs.durationVar(&period, "poll-period", flows.DefaultPollPeriod, "sockdiag mode's polling period")
	out := &oneOf{val: "table", words: []string{"table", "json"}}
	fs.Var(out, "o", "output format: table|json (JSON lines)")
	withProcs := fs.Bool("procs", true, "also follow the app's processes (eBPF, else /proc where visible)")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	raiseFileCaps()
	if err := nf.validate("watch"); err != nil {
		return err
	}
	ns, err := nf.open()
	if err != nil {
		return err
	}
	defer ns.Close()
	tr, err := flows.OpenTracker(ns, flows.TrackerConfig{Mode: tracker.val, Policy: nf.policy(), PollPeriod: period, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer tr.Close()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	changes, cancel := tr.Watch(4096)
	defer cancel()
	mode, why := tr.Mode()
	sum := tr.Summary()
	if out.val == "json" {
		json.NewEncoder(stdout).Encode(map[string]any{"time": time.Now(), "namespace": ns.Name(), "mode": mode, "reason": why, "summary": sum})
	} else {
		poll := ""
		if mode == flows.ModeSockDiag {
			poll = fmt.Sprintf(", polling every %s: changes between polls are reported at the next poll", period)
		}
		fmt.Fprintf(stdout, "watching %s: %s mode (%s%s)\n%s\n", ns.Name(), mode, why, poll, summaryLine(sum))
	}
	var procsChanged <-chan struct{}
	var procs appprocs.Source
	if *withProcs {
		src, reason, perr := appprocs.Open(ns.Inode(), appprocs.Rules{ProxyUID: uint32(nf.proxyUID)}, appprocs.ModeAuto)
		if perr != nil {
			why := perr.Error()
			var pu *appprocs.UnavailableError
			if errors.As(perr, &pu) {
				why = pu.Reason
			}
			printProcs(stdout, out.val, nil, "not visible: "+why)
		} else {
			defer src.Close()
			procs, procsChanged = src, src.Changed()
			printProcs(stdout, out.val, src.Processes(), src.Kind()+": "+reason)
		}
	}
	// The tracker and the app process source run in their own goroutines
	// until this function returns, and every return waits for them: the
	// deferred Closes must never pull the sockets or the probe from under
	// a running one (`draind watch | head` ends with a write error while
	// they run). A failed source signals procsChanged.
	runCtx, stopRun := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- tr.Run(runCtx) }()
	var procsRun sync.WaitGroup
	if procs != nil {
		procsRun.Go(func() { procs.Run(runCtx) })
	}
	running := true
	defer func() {
		stopRun()
		procsRun.Wait()
		if running {
			<-errc
		}
	}()
	enc := json.NewEncoder(stdout)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			running = false
			return err
		case <-procsChanged:
			printProcs(stdout, out.val, procs.Processes(), procs.Kind())
		case c := <-changes:
			if out.val == "json" {
				if err := enc.Encode(watchLine(c)); err != nil {
					return err
				}
				continue
			}
			f := c.Flow
			if _, err := fmt.Fprintf(stdout, "%s %-11s → %-11s %-5s %-8s %s → %s uid=%d  %s\n",
				c.Time.Format("15:04:05.000000"), c.OldState, c.NewState, f.Owner, f.Direction, f.Local, f.Remote, f.UID, summaryLine(c.Summary)); err != nil {
				return err
			}
		}
	}
}

type watchJSON struct {
	Time      time.Time       `json:"time"`
	Cookie    uint64          `json:"cookie"`
	Owner     flows.Owner     `json:"owner"`
	Direction flows.Direction `json:"direction"`
	OldState  sockdiag.State  `json:"old_state"`
	NewState  sockdiag.State  `json:"new_state"`
	Local     string          `json:"local"`
	Remote    string          `json:"remote"`
	UID       uint32          `json:"uid"`
	Summary   flows.Summary   `json:"summary"`
}

func watchLine(c flows.Change) watchJSON {
	return watchJSON{Time: c.Time, Cookie: c.Flow.Cookie, Owner: c.Flow.Owner, Direction: c.Flow.Direction,
		OldState: c.OldState, NewState: c.NewState, Local: c.Flow.Local.String(), Remote: c.Flow.Remote.String(),
		UID: c.Flow.UID, Summary: c.Summary}
}

func summaryLine(s flows.Summary) string {
	return fmt.Sprintf("[app listeners %d inbound %d outbound %d idle %d | proxy listeners %d flows %d]",
		s.AppListeners, s.AppInbound, s.AppOutbound, s.AppIdle, s.ProxyListeners, s.ProxyFlows)
}

// printProcs prints the app's processes (a JSON line with -o json).
func printProcs(w io.Writer, format string, procs []appprocs.Process, note string) {
	if format == "json" {
		json.NewEncoder(w).Encode(map[string]any{"time": time.Now(), "app_processes": procs, "source": note})
		return
	}
	line := fmt.Sprintf("%s app processes: %d (%s)", time.Now().Format("15:04:05.000000"), len(procs), note)
	for i, p := range procs {
		if i == 8 {
			line += fmt.Sprintf(" +%d more", len(procs)-i)
			break
		}
		line += fmt.Sprintf(" %d:%s", p.PID, p.Comm)
	}
	fmt.Fprintln(w, line)
}

// runDrain is `draind drain`, a native sidecar's preStop hook: it asks the
// `draind run` of its container to start draining (POST /drain on the
// status server, over loopback) and returns at once. It does not wait: the
// kubelet SIGTERMs the sidecar only after the app has exited, and draind
// run finishes the drain then.
func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("drain", "drain [--status-addr HOST:PORT] [--timeout D]", stdout)
	addr := fs.String("status-addr", agent.DefaultStatusAddr, "draind run's status server (the same setting as run's: DRAIND_STATUS_ADDR)")
	var timeout time.Duration
	fs.durationVar(&timeout, "timeout", 2*time.Second, "give up after this long (exit 1)")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("drain: unexpected argument %q", fs.Arg(0))
	}
	url, err := loopbackURL(*addr, "/drain?cause=prestop")
	if err != nil {
		return usageErr("drain: --status-addr %q: %v", *addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("drain: no draind run answers at %s: %w", url, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("drain: %s answered %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "draining: %s\n", strings.TrimSpace(string(body)))
	return nil
}

// loopbackURL is http://<loopback>:<port><path> for a status address: the
// endpoints that change the drain answer loopback callers only.
func loopbackURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
