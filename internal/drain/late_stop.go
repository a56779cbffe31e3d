package drain

import (
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// The late stop: a native sidecar's gate deadline reached while its app
// still runs.
//
// The gate deadline keeps the worst case of the stop steps inside the
// deadline: the quit, --stop-timeout for the proxy to exit, SIGTERM,
// --stop-timeout again, SIGKILL (StopReserve). Stopping the proxy then,
// with the app still running, cuts whatever the app still sends through
// it. A classic sidecar has no choice: the kubelet signalled the app and
// the proxy together and kills both at the end of the grace period. A
// native sidecar does: the kubelet sends its SIGTERM only once every app
// container has exited (or was killed at the grace period's end), and
// kills it no sooner than 2 s after that (kuberuntime's
// minimumGracePeriodInSeconds), so a proxy kept until the app's exit
// costs nothing but draind's own margin, and an app that calls out late
// in its shutdown keeps its proxy (the measurements: docs/design.md, "The
// drain machine", the late stop).
//
// So a native sidecar still awaiting its SIGTERM at the gate deadline
// (PastGateDeadline) holds for its app to LateGateDeadline: the pod's
// grace period less the quit call and the kernel's part after SIGKILL
// (LateStopReserve). Past the gate deadline only the app holds: once the
// SIGTERM comes or the app is seen gone, the gate has LateAppGoneWait to
// open, then the proxy stops as at the deadline, inside the kubelet's
// 2 s. The stop after a held gate skips SIGTERM after a quit that worked
// (Envoy takes both alike) and waits for the proxy's exit up to the
// grace period's SIGKILL step, and no later than the kubelet's own after
// its SIGTERM.

// KubeletSidecarGrace is the least the kubelet grants a native sidecar
// after its SIGTERM (kuberuntime's minimumGracePeriodInSeconds): a late
// stop after that SIGTERM ends inside it.
const KubeletSidecarGrace = 2 * time.Second

// LateAppGoneWait is what the gate gets to open once the app goes past
// the gate deadline (the SIGTERM, or the app seen gone): a fresh read of
// its last flows (parked keep-alives), --settle's start. Still held, the
// proxy stops as at the deadline. With LateStopReserve it fits
// KubeletSidecarGrace.
const LateAppGoneWait = 500 * time.Millisecond

// PastGateDeadline reports whether the gate deadline, reached with in,
// moves to the late one: a native sidecar whose SIGTERM has not come,
// which the kubelet sends only after every app container has exited (nor
// has the app been seen gone: AwaitSignal), with a proxy to keep.
func PastGateDeadline(in GateInput) bool {
	return in.AwaitSignal && !in.NoProxy
}

// LateStopReserve is the stop steps' worst case after the late gate
// deadline: the quit call and the kernel's part after SIGKILL. The wait
// for the proxy's exit after the quit (after a failed one, SIGTERM) runs
// to lateEnd less KillWait, what the quit left of the reserve included.
func (c Config) LateStopReserve() time.Duration {
	if c.Prestop {
		return 0
	}
	return c.quitTimeout() + KillWait
}

// LateGateDeadline is when, after the trigger, a gate held past its
// deadline for the app (PastGateDeadline) stops waiting.
func (c Config) LateGateDeadline() time.Duration { return c.lateEnd() - c.LateStopReserve() }

// End is when, after the trigger, the drain whose State is st ends at the
// latest, its stop steps included: the deadline, or the late stop's end
// when the State's deadline is past the gate deadline (a native sidecar
// that held, or could hold, for its app).
func (c Config) End(st State) time.Duration {
	if st.Deadline.Sub(st.Triggered) > c.GateDeadline() {
		return c.lateEnd()
	}
	return c.Deadline
}

// lateEnd is when, after the trigger, a late stop ends: the pod's grace
// period (Grace, else the one the deadline implies), never before the
// deadline. The kubelet starts that period a moment before the preStop
// hook that triggers the drain; an app still running at its end is
// killed, and the sidecar's SIGTERM follows, which ends the hold anyway.
func (c Config) lateEnd() time.Duration {
	grace := c.Grace
	if grace <= 0 {
		grace = c.Deadline + GraceMargin
	}
	return max(grace, c.Deadline)
}

// KubeletLagAllowance is how long past the late gate deadline a native
// sidecar still awaiting its SIGTERM keeps holding for its app. The late
// gate deadline is the grace period by draind's clock, but the kubelet
// stops the app, then the sidecar, at its own pace: under a burst of
// deletions on a loaded node it sent an app its SIGTERM after that
// deadline, with the app's calls still to make through the proxy
// (docs/design.md, "The late stop"). The kubelet SIGTERMs the
// sidecar only once the app has exited, so holding costs nothing; the
// allowance bounds a SIGTERM that never comes (a drain asked by hand).
const KubeletLagAllowance = 30 * time.Second

// GraceSpent reports whether a native sidecar's SIGTERM past its gate
// deadline, taken with in, came with the pod's grace period spent: an app
// process still runs. The kubelet SIGTERMs a sidecar before its app has
// exited only once the grace period is over (kuberuntime's waitForTurn),
// the app's own SIGTERM often just as late (its preStop, or the kubelet
// lagging), and SIGKILLs both KubeletSidecarGrace later. (A classic
// sidecar drained by the hook gets its SIGTERM right after it, before
// any gate deadline, the app running.)
func GraceSpent(in GateInput) bool {
	return in.ProcView != ProcsUnseen && in.AppProcs > 0
}

// GraceSpentHold is how long after a SIGTERM with the grace period spent
// (GraceSpent) the gate holds for the app's last calls through the proxy:
// the stop's quit, the proxy's exit and the SIGKILL step then still fit in
// KubeletSidecarGrace. The app exits sooner: the gate opens then.
const GraceSpentHold = KubeletSidecarGrace - 2*KillWait

// lateState is the loop's state for the late stop.
type lateState struct {
	// lagging is set once the late gate deadline came with the SIGTERM
	// still awaited: the hold goes on (KubeletLagAllowance), and the stop
	// after it runs at the kubelet's pace, not the grace period's.
	lagging bool
	// held is set once the gate deadline came before a native sidecar's
	// SIGTERM and the gate held on to the late one: the stop then skips
	// SIGTERM after a quit that worked.
	held bool
	// appGone is set once the app went past the gate deadline (the
	// SIGTERM, or seen gone): the gate then gets LateAppGoneWait, once.
	appGone bool
}

// gateDeadline is when, after the trigger, the gate stops waiting for the
// app: the late gate deadline once the gate held on to it, or while
// PastGateDeadline would hold it (a native sidecar awaiting its SIGTERM).
func (m *Machine) gateDeadline() time.Duration {
	if m.late.held || PastGateDeadline(GateInput{AwaitSignal: m.native.awaitSignal, NoProxy: m.cfg.Prestop}) {
		return m.cfg.LateGateDeadline()
	}
	return m.cfg.GateDeadline()
}

// holdPastGateDeadline is the gate deadline's check: a native sidecar
// still awaiting its SIGTERM (PastGateDeadline) holds on to the late gate
// deadline, once. It reports whether it did.
func (m *Machine) holdPastGateDeadline() bool {
	if m.late.held {
		return false
	}
	in, _ := m.baseInput()
	left := m.cfg.LateGateDeadline() - time.Since(m.started)
	if !PastGateDeadline(in) || left <= 0 {
		return false
	}
	m.late.held = true
	m.end.deadline = time.NewTimer(left)
	// The flows open now are those the grace period's end may cut: the
	// kubelet kills the app there, and the stop that follows finds them
	// closed. Named here, at draind's own deadline, as the deadline's
	// stop names them.
	open := m.flows.Holding()
	fields := []zap.Field{logevent.GateDeadlineLate.Field(), zap.Duration("after", time.Since(m.started)),
		zap.Duration("late_gate_deadline", m.cfg.LateGateDeadline()), zap.Int("open_flows", len(open))}
	if m.apps != nil {
		fields = append(fields, zap.Int("app_processes", in.AppProcs), zap.Bool("app_processes_complete", in.ProcView == ProcsComplete))
	}
	m.log.Info("gate deadline before SIGTERM: held to the late gate deadline", fields...)
	m.logOpenFlows(open)
	m.publish(m.eval.curHolds, nil) // the State's deadline moved
	return true
}

// holdPastLateGateDeadline is the late gate deadline's check: a native
// sidecar still awaiting its SIGTERM (the kubelet lags behind the grace
// period) holds on for KubeletLagAllowance more, once. It reports whether
// it did.
func (m *Machine) holdPastLateGateDeadline() bool {
	if !m.late.held || m.late.lagging || m.late.appGone || !m.native.awaitSignal {
		return false
	}
	m.late.lagging = true
	m.end.deadline = time.NewTimer(KubeletLagAllowance)
	m.log.Warn("late gate deadline before SIGTERM: the kubelet lags; held", logevent.KubeletLags.Field(),
		zap.Duration("after", time.Since(m.started)), zap.Duration("allowance", KubeletLagAllowance))
	return true
}

// lateAppGone runs after each evaluation that left the gate shut: past the
// gate deadline only the app held, and once it is gone (the SIGTERM, or
// seen gone) the gate gets LateAppGoneWait, then the deadline's stop. A
// SIGTERM with an app process still running (GraceSpent) gets
// GraceSpentHold from the SIGTERM instead.
func (m *Machine) lateAppGone() {
	if !m.late.held || m.native.awaitSignal || m.late.appGone {
		return
	}
	m.late.appGone = true
	m.end.deadline.Stop()
	wait := LateAppGoneWait
	if !m.late.lagging {
		wait = max(0, min(wait, m.cfg.LateGateDeadline()-time.Since(m.started)))
	}
	if in, _ := m.baseInput(); !m.native.signalAt.IsZero() && GraceSpent(in) {
		wait = max(0, time.Until(m.native.signalAt.Add(GraceSpentHold)))
		m.log.Warn("SIGTERM with the app running: grace period spent", logevent.GraceSpent.Field(),
			zap.Int("app_processes", in.AppProcs), zap.Duration("since_drain", time.Since(m.started)), zap.Duration("hold", wait))
	}
	m.end.deadline = time.NewTimer(wait)
}
