package drain

import (
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// A native sidecar drained from its preStop hook: the kubelet sends its
// SIGTERM only once every app container has exited, so until then the
// gate waits for it (GateInput.AwaitSignal), unless the app is seen gone
// first (AppSeenGone), the fact that SIGTERM would bring later. A gate
// deadline that comes first is the late stop's (late_stop.go).

// nativeState is the loop's state for a native sidecar's SIGTERM.
type nativeState struct {
	// awaitSignal is set while a drain from the preStop hook awaits the
	// kubelet's SIGTERM (the app not seen gone either): the gate holds
	// for it.
	awaitSignal bool
	// signalAt is when that SIGTERM came: a late stop ends inside what
	// the kubelet grants after it (KubeletSidecarGrace).
	signalAt time.Time
}

// onSignalAfterPrestop takes in the kubelet's SIGTERM after the preStop
// drain, in phase p (Draining or Gating). Every app container has exited,
// and the endpoint propagation wait already ran alongside the app's
// shutdown: only Envoy's last flows remain for the gate.
func (m *Machine) onSignalAfterPrestop(p Phase) {
	m.native.awaitSignal = false
	m.native.signalAt = time.Now()
	m.sockets = SocketsOnly{} // every app container has exited
	if p == Draining && m.appGone() {
		m.endMinDrain()
		m.log.Info("SIGTERM after preStop, app gone: min-drain ends", logevent.SigtermEndsMinDrain.Field())
		m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", m.flows.Observe()))
		return
	}
	m.log.Info("SIGTERM after preStop: no longer awaited", logevent.SigtermAfterPrestop.Field())
}

// seeAppGone stops the wait for the SIGTERM once a native sidecar sees the
// app gone (AppSeenGone on in), the fact the SIGTERM would bring later; a
// min-drain still running ends, as at that SIGTERM (nothing can be served
// any more). It reports whether it did.
func (m *Machine) seeAppGone(in GateInput, fv FlowView) bool {
	if !m.native.awaitSignal || !AppSeenGone(in) {
		return false
	}
	m.native.awaitSignal = false
	draining := m.Phase() == Draining
	m.log.Info("app seen gone: the kubelet's SIGTERM is not awaited",
		logevent.AppGoneEndsAwait.Field(), zap.Bool("min_drain_ended", draining), zap.Duration("since_drain", time.Since(m.started)))
	if draining {
		m.endMinDrain()
		m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", fv))
	}
	return true
}

// appGone reports whether the machine's own view says the app has no
// process left (a complete view only).
func (m *Machine) appGone() bool {
	if m.apps == nil {
		v := m.flows.Observe()
		return v.AppListeners == 0 && v.AppHolding == 0
	}
	n, view := m.apps.Count()
	return view == ProcsComplete && n == 0
}
