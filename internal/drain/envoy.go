package drain

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// The machine's calls to Envoy's admin API: the watch for LIVE, the work
// at LIVE, drain_listeners, the gauge check and the count the gate asks.
// Each runs beside the loop, never on it (the quit aside: it is a stop
// step, stop.go), so a hung admin API never holds a trigger, a quit or
// the proxy's exit.

// DrainListenersState is where the drain_listeners call stands.
type DrainListenersState int32

// States of the drain_listeners call.
const (
	DrainListenersNotSent DrainListenersState = iota
	DrainListenersRetrying
	DrainListenersDone
	DrainListenersGaveUp // the drain ended before it succeeded
)

func (s DrainListenersState) String() string {
	return [...]string{"not-sent", "retrying", "done", "gave-up"}[s]
}

// GaugesState says whether Envoy keeps the listener gauges.
type GaugesState int32

// States of the gauge check (made once Envoy is LIVE).
const (
	GaugesUnknown GaugesState = iota
	GaugesPresent
	GaugesAbsent
)

func (s GaugesState) String() string { return [...]string{"unknown", "present", "absent"}[s] }

// activeTimeout bounds one ask of Envoy's active downstream connections.
const activeTimeout = 500 * time.Millisecond

// adminQuiet is how long a failed ask leaves the admin API alone, so a
// hung one does not add its timeout to every evaluation.
const adminQuiet = 2 * time.Second

// envoyState is the machine's side of the admin API.
type envoyState struct {
	// work runs f on a goroutine Run owns, with a context Run cancels and
	// waits on as it returns (set by Run): the admin calls the loop needs
	// answered run there.
	work func(f func(context.Context))
	// liveC is closed once Envoy is LIVE (watchLive); stopLive ends that
	// watch, which polls only until Ready.
	liveC    chan struct{}
	stopLive func()
	// dlState and dlTries are where drain_listeners stands
	// (DrainListeners), read by /metrics while the retrier runs.
	dlState atomic.Int32
	dlTries atomic.Int64
	// dlAt is when drain_listeners succeeded (Unix ns; 0 before): from
	// then on Envoy's responses tell clients to go (Untold).
	dlAt atomic.Int64
	// stopDL ends the drain_listeners retrier with the drain.
	stopDL func()
	// gauges says whether Envoy keeps the listener gauges the gate reads
	// (GaugesState), set beside the loop.
	gauges atomic.Int32
	// quietUntil is when the count may be asked again after a failed ask
	// (adminQuiet): a hung admin API costs its timeout once, not per look.
	quietUntil time.Time
	// asking is set while the gate's ask runs beside the loop (askActive):
	// one at a time. answers brings its answer to the loop, and answer
	// keeps it for the evaluation right after.
	asking  bool
	answers chan activeAnswer
	answer  *activeAnswer
}

// activeAnswer is one ask of Envoy's active downstream connections.
type activeAnswer struct {
	// asked is set when Envoy keeps the gauges, so ActiveDownstream was
	// called and returned n, err; otherwise the kernel decides alone.
	asked bool
	n     int
	err   error
}

// DrainListeners is where the drain_listeners call stands, and how many
// attempts it took.
func (m *Machine) DrainListeners() (DrainListenersState, int64) {
	return DrainListenersState(m.envoy.dlState.Load()), m.envoy.dlTries.Load()
}

// Gauges says whether Envoy keeps the listener gauges (checked once LIVE).
func (m *Machine) Gauges() GaugesState { return GaugesState(m.envoy.gauges.Load()) }

// watchLive asks the admin API until Envoy is LIVE with its workers
// started: the only polling draind does while not draining, and only until
// Ready. It ends with Run, or when the machine leaves Starting.
func (m *Machine) watchLive(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	live := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Ask often at first (an Envoy that goes LIVE a moment after draind
		// starts is ready at once), then every 200 ms.
		wait := 10 * time.Millisecond
		for {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			ok, _ := m.admin.Live(cctx)
			ccancel()
			if ok {
				close(live)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 200*time.Millisecond)
		}
	})
	m.envoy.liveC = live
	m.envoy.stopLive = func() { cancel(); wg.Wait() }
}

// stopLiveWatch ends the watch for LIVE (Ready, a trigger, Run's end).
func (m *Machine) stopLiveWatch() {
	if m.envoy.stopLive != nil {
		m.envoy.stopLive()
		m.envoy.stopLive = nil
	}
	m.envoy.liveC = nil
}

// onLive makes the machine Ready once Envoy is LIVE, unless a drain began
// meanwhile, and learns once whether Envoy keeps the listener gauges the
// gate would read.
func (m *Machine) onLive() {
	m.stopLiveWatch()
	if m.Phase() == Starting {
		if m.begun.IsZero() {
			m.enter(Ready)
		} else {
			m.enter(Ready, zap.Duration("since_start", time.Since(m.begun)))
		}
	}
	// Beside the loop: a drain that starts before these end goes without
	// what they learn (stat names as given, the rate before unknown).
	m.envoy.work(func(ctx context.Context) {
		if h, ok := m.admin.(LiveHook); ok {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			h.AtLive(hctx)
			cancel()
		}
		m.checkGauges(ctx)
	})
}

// checkGauges asks, once it can be answered, whether Envoy keeps the
// listener gauges the gate would read. It runs beside the loop.
func (m *Machine) checkGauges(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	present, err := m.admin.Gauges(cctx)
	cancel()
	switch {
	case err != nil:
		m.log.Debug("could not tell whether Envoy keeps listener gauges; will ask again", zap.Error(err))
	case present:
		m.envoy.gauges.Store(int32(GaugesPresent))
	default:
		m.envoy.gauges.Store(int32(GaugesAbsent))
		m.log.Warn("no listener gauges in Envoy: the kernel's view decides",
			logevent.NoListenerGauges.Field())
	}
}

// startDrainListeners sends POST /drain_listeners until it succeeds or the
// drain ends (it is idempotent): an admin API stalled at SIGTERM must not
// leave Envoy undrained, its clients never told Connection: close.
func (m *Machine) startDrainListeners() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	m.envoy.dlState.Store(int32(DrainListenersRetrying))
	inbound := !m.cfg.Gateway
	wg.Go(func() {
		backoff := 50 * time.Millisecond
		// Each attempt gets longer (an admin API answering in 2 s must
		// still get the drain), never past the time left to drain.
		timeout := time.Second
		gateEnd := m.started.Add(m.cfg.GateDeadline())
		var lastErr string
		for {
			m.envoy.dlTries.Add(1)
			cctx, ccancel := context.WithTimeout(ctx, max(min(timeout, time.Until(gateEnd)), 100*time.Millisecond))
			timeout = min(2*timeout, 8*time.Second)
			err := m.admin.DrainListeners(cctx, inbound)
			ccancel()
			if err == nil {
				m.envoy.dlAt.Store(time.Now().UnixNano())
				m.envoy.dlState.Store(int32(DrainListenersDone))
				m.log.Info("drain_listeners sent", logevent.DrainListenersSent.Field(), zap.Bool("inbound_only", inbound), zap.Int64("attempts", m.envoy.dlTries.Load()))
				return
			}
			if ctx.Err() != nil {
				return
			}
			if e := err.Error(); e != lastErr {
				lastErr = e
				m.log.Warn("drain_listeners failed; retrying", logevent.DrainListenersFailed.Field(), zap.Error(err), zap.Int64("attempts", m.envoy.dlTries.Load()))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	})
	m.envoy.stopDL = func() {
		cancel()
		wg.Wait()
		if DrainListenersState(m.envoy.dlState.Load()) == DrainListenersRetrying {
			m.envoy.dlState.Store(int32(DrainListenersGaveUp))
			m.log.Warn("drain_listeners never succeeded", logevent.DrainListenersGaveUp.Field(), zap.Int64("attempts", m.envoy.dlTries.Load()))
		}
	}
}

// stopDrainListeners ends the retrier (the stop, Run's end), once.
func (m *Machine) stopDrainListeners() {
	if m.envoy.stopDL != nil {
		m.envoy.stopDL()
		m.envoy.stopDL = nil
	}
}

// envoyCount puts Envoy's own count of its active downstream connections
// into in, when the gate needs it (gateInput). It reports false while the
// count is being asked: the loop goes on meanwhile, and the answer's
// arrival evaluates the gate again. The gate then decides as it would have
// with the answer in hand, on views read as it arrives.
func (m *Machine) envoyCount(in *GateInput) bool {
	answer := m.envoy.answer
	m.envoy.answer = nil // it serves the evaluation right after it, or none
	if answer != nil {
		if answer.asked && answer.err == nil {
			in.EnvoyKnown, in.EnvoyActive = true, answer.n
		}
		return true
	}
	switch m.Gauges() {
	case GaugesAbsent:
		return true
	case GaugesPresent:
		if time.Now().Before(m.envoy.quietUntil) {
			return true // it failed a moment ago: the kernel decides meanwhile
		}
	}
	m.askActive()
	return false
}

// askActive asks, beside the loop, whether Envoy keeps the listener gauges
// if that is not known yet (the check at LIVE failed, or never ran), then
// its count; the answer comes back through answers (onActive).
func (m *Machine) askActive() {
	if m.envoy.asking {
		return
	}
	m.envoy.asking = true
	m.envoy.work(func(ctx context.Context) {
		var a activeAnswer
		if m.Gauges() == GaugesUnknown {
			m.checkGauges(ctx)
		}
		if m.Gauges() == GaugesPresent {
			actx, cancel := context.WithTimeout(ctx, activeTimeout)
			a.n, a.err = m.admin.ActiveDownstream(actx)
			cancel()
			a.asked = true
		}
		m.envoy.answers <- a // one ask at a time: the buffer never fills
	})
}

// onActive takes in the answer of askActive, on the loop, for the
// evaluation that follows.
func (m *Machine) onActive(a activeAnswer) {
	m.envoy.asking = false
	switch {
	case !a.asked, a.err == nil:
	case errors.Is(a.err, ErrNoGauges):
		if m.envoy.gauges.Swap(int32(GaugesAbsent)) != int32(GaugesAbsent) {
			m.log.Warn("no listener gauges in Envoy: the kernel's view decides",
				logevent.NoListenerGauges.Field())
		}
	default:
		m.envoy.quietUntil = time.Now().Add(adminQuiet)
		m.log.Debug("admin active connections", zap.Error(a.err))
	}
	m.envoy.answer = &a
}
