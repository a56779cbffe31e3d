package drain

import (
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// The gate's evaluation while Gating: the machine builds a GateInput from
// its views (and, when they cannot tell, Envoy's own count), steps the
// Gate, publishes and logs what holds, and sets when to look again.

// evalState is the loop's state for the gate's evaluation.
type evalState struct {
	// gate holds the verdict for --settle.
	gate Gate
	// held adds up how long each kind held the drain (State.Held).
	held holdTimes
	// curHolds is what holds now: a verdict that differs is published.
	curHolds []Hold
	// holdsLog keeps a flapping hold from filling the log.
	holdsLog holdsLog
	// appGoneAt is when the gate first saw the app gone (AppGone): only a
	// snapshot taken after it tells which downstream flows are parked.
	appGoneAt time.Time
	// lastRefresh is the machine's last re-read of the flows, which
	// minRefreshGap spaces.
	lastRefresh time.Time
	// backoff spaces the re-asks of an admin API whose count trails the
	// kernel's (envoyOnlyHold).
	backoff time.Duration
	// wake evaluates again at a computed moment no event marks (the end of
	// --settle, an idle expiry, a re-ask); nil while not armed.
	wake *time.Timer
	// refreshAt, when set, is the moment wake also re-reads the flows.
	refreshAt time.Time
}

// evaluate looks at the gate once; done means the machine ended.
func (m *Machine) evaluate() (Result, bool) {
	in, fv, ready := m.gateInput()
	m.seeAppGone(in, fv) // the gate's own rule lets it through; this says so, once
	if !ready {
		return Result{}, false // Envoy's count is being asked; its answer brings the next look
	}
	v := m.eval.gate.Step(in)
	if v.Open {
		return m.stop("drained", true), true
	}
	if !slices.Equal(v.Holds, m.eval.curHolds) {
		m.publishHolds(v)
	}
	m.armWake(in, fv, v)
	return Result{}, false
}

// publishHolds publishes a verdict's holds (a count's change too) and logs
// them when their kinds change (holdsLog).
func (m *Machine) publishHolds(v Verdict) {
	kinds := v.Kinds()
	kindsChanged := kinds != (Verdict{Holds: m.eval.curHolds}).Kinds()
	m.publish(v.Holds, nil)
	if !kindsChanged {
		return
	}
	log, unlogged := m.eval.holdsLog.change(kinds, time.Now())
	if !log {
		return
	}
	fields := []zap.Field{logevent.GateHolds.Field(), zap.Stringers("holds", v.Holds), zap.Stringers("hold_kinds", kindsOf(v.Holds)),
		zap.Duration("since_drain", time.Since(m.started))}
	if unlogged > 0 {
		fields = append(fields, zap.Int("unlogged_changes", unlogged))
	}
	m.log.Info("gate holds", fields...)
}

// armWake sets when to evaluate again without an event: the end of
// --settle, a flow's idle expiry or parking, or a re-ask of an admin API
// that lags behind the kernel. Never on a fixed tick.
func (m *Machine) armWake(in GateInput, fv FlowView, v Verdict) {
	wake, refresh := v.WakeAt, m.refreshAt(in, fv)
	if !refresh.IsZero() && (wake.IsZero() || refresh.Before(wake)) {
		wake = refresh
	}
	if envoyOnlyHold(in, v) {
		m.eval.backoff = min(max(2*m.eval.backoff, 5*time.Millisecond), 250*time.Millisecond)
		if w := in.Now.Add(m.eval.backoff); wake.IsZero() || w.Before(wake) {
			wake = w
		}
	} else {
		m.eval.backoff = 0
	}
	if m.eval.wake != nil {
		m.eval.wake.Stop()
		m.eval.wake = nil
	}
	m.eval.refreshAt = time.Time{}
	if !wake.IsZero() {
		m.eval.wake = time.NewTimer(time.Until(wake))
		if wake.Equal(refresh) {
			m.eval.refreshAt = refresh
		}
	}
}

// onWake is the wake's timer: a re-read of the flows when it was armed for
// one (the loop then evaluates again).
func (m *Machine) onWake() {
	if !m.eval.refreshAt.IsZero() && !time.Now().Before(m.eval.refreshAt) {
		m.eval.lastRefresh = time.Now()
		if err := m.flows.Refresh(); err != nil {
			m.log.Warn("re-reading flows for idle times", logevent.FlowsRefreshFailed.Field(), zap.Error(err))
		}
	}
}

// minRefreshGap spaces the machine's re-reads of the flows: a refresh
// that fails, or a flow born after the last one, cannot make it spin.
const minRefreshGap = ParkedAfter / 4

// refreshAt is when the flows' idle times must be re-read (zero: no
// need): when a holding flow passes --idle-timeout, and, the app being
// gone, once right away (times read before it tell nothing), then when a
// downstream flow not yet parked can be. fv is the view in was built
// from (one walk of the table per evaluation).
func (m *Machine) refreshAt(in GateInput, fv FlowView) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if m.cfg.IdleTimeout > 0 {
		earliest(fv.IdleWake)
	}
	if !m.eval.appGoneAt.IsZero() && in.Downstream > in.DownstreamParked {
		if !fv.Measured.After(m.eval.appGoneAt) {
			earliest(in.Now)
		} else {
			earliest(fv.ParkedWake)
		}
	}
	if !at.IsZero() && at.Before(m.eval.lastRefresh.Add(minRefreshGap)) {
		at = m.eval.lastRefresh.Add(minRefreshGap)
	}
	return at
}

// envoyOnlyHold reports whether the kernel sees no live downstream flow
// of Envoy's while its admin API still counts some (its counters trail the
// sockets by a moment): the count is asked again with backoff.
func envoyOnlyHold(in GateInput, v Verdict) bool {
	if in.Downstream-in.DownstreamIdle > 0 {
		return false
	}
	for _, h := range v.Holds {
		if h.Kind == HoldEnvoyActive {
			return true
		}
	}
	return false
}

// gateInput gathers the gate's inputs, and the flow view it read. It asks
// Envoy's admin API only when the app is done and the kernel sees no live
// downstream flow (otherwise Envoy certainly has some), so a busy drain
// does not hammer the admin API. ready is false while that ask runs
// (envoyCount).
func (m *Machine) gateInput() (in GateInput, fv FlowView, ready bool) {
	in, fv = m.baseInput()
	switch {
	case !AppGone(in):
		m.eval.appGoneAt = time.Time{}
	case m.eval.appGoneAt.IsZero():
		m.eval.appGoneAt = in.Now
	case fv.Measured.After(m.eval.appGoneAt):
		in.DownstreamParked = fv.DownstreamParked
	}
	if m.admin == nil {
		return in, fv, true
	}
	if live := in.Downstream - in.DownstreamIdle; live > 0 {
		m.envoy.answer = nil
		in.EnvoyKnown, in.EnvoyActive = true, live // the kernel's count stands in
		return in, fv, true
	}
	if done, _ := AppDone(in); !done {
		m.envoy.answer = nil
		return in, fv, true
	}
	return in, fv, m.envoyCount(&in)
}

// baseInput is the gate's input from draind's own views (the flows, the
// app's processes), without the admin API's part or the parked flows.
func (m *Machine) baseInput() (GateInput, FlowView) {
	fv := m.flows.Observe()
	in := GateInput{
		Now: time.Now(), AppExit: m.cfg.AppExit, Gateway: m.cfg.Gateway, WaitListeners: m.cfg.WaitListeners,
		NoProxy: m.cfg.Prestop, IdleTimeout: m.cfg.IdleTimeout, AwaitSignal: m.native.awaitSignal,
		AppListeners: fv.AppListeners, AppHolding: fv.AppHolding,
		Downstream: fv.Downstream, DownstreamIdle: fv.DownstreamIdle,
	}
	m.sockets.Observe(in.Now, fv.AppListeners)
	in.SocketsOnlyUntil = m.sockets.Until
	if m.apps != nil {
		in.AppProcs, in.ProcView = m.apps.Count()
	}
	return in, fv
}
