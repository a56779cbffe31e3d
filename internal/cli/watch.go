package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/tcpstate"
)

func runWatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("watch", "watch [--netns PATH | --pid PID | --pod NAMESPACE/NAME [--container NAME]] [--tracker auto|ebpf|sockdiag] [-o table|json]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	nf.registerPod(fs)
	tracker := trackerFlag(fs)
	var period time.Duration
	fs.durationVar(&period, "poll-period", flows.DefaultPollPeriod, "sockdiag mode's polling period")
	out := newOneOf(outputTable, outputFormats)
	fs.Var(out, "o", "output format: "+out.choices()+" (json: JSON lines)")
	withProcs := fs.Bool("procs", true, "also follow the app's processes (eBPF, else /proc where visible)")
	if err := nf.parse(fs, args); err != nil {
		return helped(err)
	}
	nf.caps.warn(stderr, "watch")
	ns, err := nf.openTarget(ctx, "watch")
	if err != nil {
		return err
	}
	defer ns.Close()
	tr, err := flows.OpenTracker(ns, flows.TrackerConfig{Mode: tracker.val, Policy: nf.policy(), PollPeriod: period, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer tr.Close()
	ctx, stop := untilSignal(ctx)
	defer stop()
	changes, cancel := tr.Watch(4096)
	defer cancel()
	mode, why := tr.Mode()
	sum := tr.Summary()
	if out.val == outputJSON {
		head := map[string]any{"time": time.Now(), "namespace": nf.label(ns), "mode": mode, "reason": why, "summary": sum}
		if nf.target != nil {
			head["target"] = nf.target
		}
		json.NewEncoder(stdout).Encode(head)
	} else {
		poll := ""
		if mode == flows.ModeSockDiag {
			poll = fmt.Sprintf(", polling every %s: changes between polls are reported at the next poll", period)
		}
		if nf.target != nil {
			fmt.Fprintf(stdout, "%s: %s\n", printable(nf.target.label()), nf.target.criLine())
		}
		fmt.Fprintf(stdout, "watching %s: %s mode (%s%s)\n%s\n", printable(nf.label(ns)), mode, why, poll, summaryLine(sum))
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
			printProcs(stdout, out.val, src.Processes(), src.Kind().String()+": "+reason)
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
			printProcs(stdout, out.val, procs.Processes(), procs.Kind().String())
		case c := <-changes:
			if out.val == outputJSON {
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
	OldState  tcpstate.State  `json:"old_state"`
	NewState  tcpstate.State  `json:"new_state"`
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
func printProcs(w io.Writer, format outputFormat, procs []appprocs.Process, note string) {
	if format == outputJSON {
		json.NewEncoder(w).Encode(map[string]any{"time": time.Now(), "app_processes": procs, "source": note})
		return
	}
	line := fmt.Sprintf("%s app processes: %d (%s)", time.Now().Format("15:04:05.000000"), len(procs), printable(note))
	for i, p := range procs {
		if i == 8 {
			line += fmt.Sprintf(" +%d more", len(procs)-i)
			break
		}
		line += fmt.Sprintf(" %d:%s", p.PID, cell(p.Comm, commWidth))
	}
	fmt.Fprintln(w, line)
}
