package agent

import (
	"context"
	"time"

	"github.com/draind/draind/internal/conntrack"
	"go.uber.org/zap"
)

// PrestopConfig configures Prestop.
type PrestopConfig struct {
	Tracker conntrack.TrackerConfig
	// Timeout bounds the wait; at the end Prestop returns anyway (a hook
	// must not wedge a pod), logging what is still open.
	Timeout time.Duration
	// WaitListeners also waits for the app's listeners to close: those
	// on AppPorts when set, else all of them.
	WaitListeners bool
	AppPorts      []uint16
	Logger        *zap.Logger
}

// PrestopResult says how the wait ended.
type PrestopResult struct {
	Done     bool // false: the timeout ended it
	Waited   time.Duration
	Open     []conntrack.TrackedFlow
	Listener []conntrack.TrackedFlow
}

// Prestop blocks until no app flow in ns holds the drain (and, if asked,
// the app's listeners are closed), woken by the tracker, never by a fixed
// tick. It is `draind prestop`, the replacement for the netstat loop.
func Prestop(ctx context.Context, ns *conntrack.NetNS, cfg PrestopConfig) (PrestopResult, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	start := time.Now()
	tr, err := conntrack.OpenTracker(ns, cfg.Tracker)
	if err != nil {
		return PrestopResult{}, err
	}
	defer tr.Close()
	mode, why := tr.Mode()
	log.Info("tracker", zap.String("mode", mode), zap.String("reason", why))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); tr.Run(rctx) }()
	defer func() { cancel(); <-done }()

	sub, unsub := tr.Subscribe()
	defer unsub()
	ports := map[uint16]bool{}
	for _, p := range cfg.AppPorts {
		ports[p] = true
	}
	timeout := time.NewTimer(cfg.Timeout)
	defer timeout.Stop()
	idle := cfg.Tracker.Policy.IdleTimeout
	for {
		snapAt := tr.LastSnapshot()
		var res PrestopResult
		var wake time.Time
		for _, f := range tr.Flows(func(f *conntrack.Flow) bool { return f.Owner == conntrack.OwnerApp }) {
			switch {
			case f.State == conntrack.Listen:
				if cfg.WaitListeners && (len(ports) == 0 || ports[f.Local.Port()]) {
					res.Listener = append(res.Listener, f)
				}
			case f.Holds:
				res.Open = append(res.Open, f)
				if at := idleExpiry(f.Flow, snapAt, idle); idle > 0 && (wake.IsZero() || at.Before(wake)) {
					wake = at
				}
			}
		}
		res.Waited = time.Since(start)
		if len(res.Open) == 0 && len(res.Listener) == 0 {
			res.Done = true
			log.Info("app done", zap.Duration("waited", res.Waited))
			return res, nil
		}
		var timer <-chan time.Time
		stopTimer := func() bool { return false }
		if !wake.IsZero() {
			t := time.NewTimer(time.Until(wake))
			timer, stopTimer = t.C, t.Stop
		}
		select {
		case <-sub:
			stopTimer()
		case <-timer:
			tr.Resync()
		case <-timeout.C:
			log.Warn("prestop timeout: returning with app flows still open", zap.Duration("waited", res.Waited),
				zap.Int("flows", len(res.Open)), zap.Int("listeners", len(res.Listener)))
			for _, f := range append(res.Open, res.Listener...) {
				log.Warn("still open", zap.String("local", f.Local.String()), zap.String("remote", f.Remote.String()),
					zap.Stringer("direction", f.Direction), zap.Stringer("state", f.State), zap.Int64("idle_ms", f.IdleMS), zap.Duration("age", f.Age))
			}
			return res, nil
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
}
