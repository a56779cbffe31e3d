package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/namespace"
)

// PrestopConfig configures Prestop.
type PrestopConfig struct {
	Tracker flows.TrackerConfig
	// Timeout bounds the wait; at the end Prestop returns anyway (a hook
	// must not wedge a pod), logging what is still open.
	Timeout time.Duration
	// WaitListeners also waits for the app's listeners to close: those
	// on AppPorts when set, else all of them.
	WaitListeners bool
	AppPorts      []uint16
	Logger        *zap.Logger
}

// Prestop blocks until no app flow in ns holds the drain (and, if asked,
// the app's listeners are closed), woken by the tracker, never by a fixed
// tick. It is `draind prestop`, the replacement for the netstat loop: the
// drain machine with no admin API and no proxy. Clean is false when the
// timeout ended it.
func Prestop(ctx context.Context, ns *namespace.Net, cfg PrestopConfig) (drain.Result, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	dc := drain.Config{Prestop: true, AppExit: drain.AppExitFlows, WaitListeners: cfg.WaitListeners,
		Deadline: cfg.Timeout, IdleTimeout: cfg.Tracker.Policy.IdleTimeout}
	if err := dc.Validate(); err != nil {
		return drain.Result{}, err
	}
	tr, err := flows.OpenTracker(ns, cfg.Tracker)
	if err != nil {
		return drain.Result{}, err
	}
	defer tr.Close()
	mode, why := tr.Mode()
	log.Info("tracker", logevent.Tracker.Field(), zap.Stringer("mode", mode), zap.String("reason", why))
	// The tracker runs until the machine ends; a tracker that stops (a
	// failed poll) ends the machine at once: its table would no longer
	// change, and the wait would run to --timeout on stale counts.
	rctx, cancel := context.WithCancel(ctx)
	var trErr error // set before done closes
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		trErr = tr.Run(rctx)
	}()
	defer func() { cancel(); <-done }()

	var ports map[uint16]bool
	if cfg.WaitListeners && len(cfg.AppPorts) > 0 {
		ports = portSet(cfg.AppPorts)
	}
	fv := newFlowView(tr, nil, ports, dc.IdleTimeout)
	defer fv.Close()
	res := drain.New(dc, drain.Parts{Flows: fv, Log: log}).Run(rctx)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if rctx.Err() != nil {
		// Only the tracker cancels rctx while ctx lives.
		<-done
		err := trErr
		if err == nil {
			err = errors.New("stopped")
		}
		log.Error("tracker stopped: the app's flows can no longer be seen", logevent.TrackerStopped.Field(), zap.Error(err))
		return res, fmt.Errorf("tracker: %w", err)
	}
	return res, nil
}
