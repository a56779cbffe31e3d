package drain

import (
	"context"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// The drain's end: the deadline, the proxy's stop and its escalation
// (/quitquitquit, SIGTERM, SIGKILL), and the proxy leaving on its own.

// endState is the loop's state for the drain's end.
type endState struct {
	// deadline fires at the gate deadline (the late one once the gate held
	// on to it: late_stop.go); the proxy then stops with flows still open.
	deadline *time.Timer
	// drainNS is the time from the trigger to the stop, once stopping
	// (DrainDuration): atomic, for /metrics.
	drainNS atomic.Int64
	// cut is what the deadline left open, for the State's end.
	cut *StateEnd
}

// DrainDuration is the time from the trigger to the stop (0 before).
func (m *Machine) DrainDuration() time.Duration { return time.Duration(m.end.drainNS.Load()) }

// deadline stops the proxy anyway, naming every flow that still held.
func (m *Machine) deadline() Result {
	open := m.flows.Holding()
	fields := []zap.Field{logevent.DeadlineReached.Field(), zap.Duration("after", time.Since(m.started)), zap.Int("open_flows", len(open))}
	m.end.cut = &StateEnd{Cut: true, OpenFlows: len(open)}
	if m.apps != nil {
		n, view := m.apps.Count()
		m.end.cut.AppProcesses = n
		fields = append(fields, zap.Int("app_processes", n), zap.Bool("app_processes_complete", view == ProcsComplete))
	}
	if m.cfg.Prestop {
		m.log.Warn("prestop deadline reached with app flows open", fields...)
	} else {
		m.log.Warn("drain deadline reached: stopping with flows open", fields...)
	}
	m.logOpenFlows(open)
	return m.stop("deadline", false)
}

// logOpenFlows names each flow still open at a deadline, a line each.
func (m *Machine) logOpenFlows(open []OpenFlow) {
	for _, f := range open {
		m.log.Warn("open flow at deadline", logevent.OpenFlowAtDeadline.Field(),
			zap.String("local", f.Local.String()), zap.String("remote", f.Remote.String()),
			zap.String("owner", f.Owner), zap.String("direction", f.Direction), zap.String("state", f.State),
			zap.Int64("idle_ms", f.IdleMS), zap.Duration("age", f.Age))
	}
}

// proxyDied ends the machine when the proxy left on its own. A sidecar
// proxy that leaves on its own is a failure, whatever its code.
func (m *Machine) proxyDied() Result {
	m.stopDrainListeners()
	code := m.proxy.ExitCode()
	if code == 0 && !m.cfg.ProxyExitStands {
		code = 1
	}
	when := "during the drain"
	if p := m.Phase(); p == Starting || p == Ready {
		when = "before any drain"
	}
	m.enter(Exited, zap.String("why", "proxy exited on its own"), zap.String("when", when),
		zap.String("how", m.proxy.ExitDescription()), zap.Int("exit_code", code))
	res := Result{ExitCode: code, Reason: "proxy " + m.proxy.ExitDescription() + " " + when}
	var took time.Duration
	if !m.started.IsZero() {
		took = time.Since(m.started)
	}
	m.finish(StateEnd{Why: res.Reason, Took: took, ExitCode: code, ExitCodeKnown: true})
	return res
}

// stop stops the proxy: /quitquitquit, then SIGTERM, then SIGKILL, each
// given --stop-timeout (after a late hold: no SIGTERM after a quit that
// worked). clean says whether the gate opened. The quit runs on the loop:
// nothing the loop could do meanwhile would change the stop.
func (m *Machine) stop(why string, clean bool) Result {
	m.stopDrainListeners()
	t0 := time.Now()
	if m.started.IsZero() {
		m.started = t0 // stopped without a drain (a quit, a cancel)
	}
	m.end.drainNS.Store(int64(t0.Sub(m.started)))
	if m.cfg.Prestop {
		m.enter(Exited, zap.String("why", why), zap.Duration("waited", t0.Sub(m.started)), zap.Bool("clean", clean))
		m.finish(StateEnd{Why: why, Clean: clean, Took: t0.Sub(m.started)})
		return Result{Reason: why, Clean: clean}
	}
	m.enter(Stopping, zap.String("why", why), zap.Duration("drain", t0.Sub(m.started)), zap.Bool("late", m.late.held),
		zap.Int64("quit_sent_unix_ns", t0.UnixNano()), zap.Any("flows", m.flows.Observe()))
	m.publish(nil, m.ended(StateEnd{Why: why, Clean: clean, Took: t0.Sub(m.started)}))
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.quitTimeout())
	err := m.admin.Quit(ctx)
	cancel()
	steps := []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL}
	if m.late.held {
		steps = []syscall.Signal{0, syscall.SIGKILL} // LateStopReserve
	}
	if err != nil {
		// Envoy did not take the quit: SIGTERM (the same to Envoy) now,
		// not after a wait for an exit that was never asked.
		m.log.Warn("quitquitquit failed: signalling at once", logevent.QuitFailed.Field(), zap.Error(err))
		steps = []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	}
	killed := false
	for _, sig := range steps {
		if sig != 0 {
			m.log.Warn("proxy still running: signalling", logevent.ProxySignalled.Field(), zap.Stringer("signal", sig))
			if err := m.proxy.Signal(sig); err != nil {
				m.log.Warn("signalling the proxy failed", logevent.ProxySignalled.Field(), zap.Stringer("signal", sig), zap.Error(err))
			}
			killed = sig == syscall.SIGKILL
		}
		t := time.NewTimer(m.stepWait(sig))
		select {
		case <-m.proxy.Exited():
		case <-t.C:
			continue
		}
		t.Stop()
		break
	}
	res := Result{Reason: why, Clean: clean}
	select {
	case <-m.proxy.Exited():
		code := m.proxy.ExitCode()
		switch {
		case killed:
			res.ExitCode, res.Reason = 137, why+"; proxy had to be killed"
		case code == 0 || code == 128+int(syscall.SIGTERM):
		default:
			res.ExitCode, res.Reason = code, why+"; proxy "+m.proxy.ExitDescription()
		}
	default:
		res.ExitCode, res.Reason = 137, why+"; proxy did not exit even after SIGKILL"
	}
	res.Clean = clean && res.ExitCode == 0
	m.enter(Exited, zap.String("why", res.Reason), zap.Int("exit_code", res.ExitCode),
		zap.Duration("total", time.Since(m.started)), zap.Bool("clean", res.Clean))
	m.finish(StateEnd{Why: res.Reason, Clean: res.Clean, Took: t0.Sub(m.started), ExitCode: res.ExitCode, ExitCodeKnown: true})
	return res
}

// stepWait is how long the proxy gets to exit after a stop step (sig 0:
// the quit).
func (m *Machine) stepWait(sig syscall.Signal) time.Duration {
	switch {
	case sig == syscall.SIGKILL:
		return KillWait
	case m.late.held:
		// Up to the late stop's SIGKILL step (late_stop.go), the quit's
		// unused part included (under pilot-agent the proxy's exit is
		// pilot-agent's, after Envoy's), and inside what the kubelet
		// grants after its SIGTERM.
		end := m.started.Add(m.cfg.lateEnd() - KillWait)
		if m.late.lagging {
			end = time.Now().Add(m.cfg.StopTimeout) // past the grace period: the kubelet's pace
		}
		if k := m.native.signalAt.Add(KubeletSidecarGrace - KillWait); !m.native.signalAt.IsZero() && k.Before(end) {
			end = k
		}
		return max(0, time.Until(end))
	}
	return m.cfg.StopTimeout
}

// ended is end with what the deadline cut, if it did.
func (m *Machine) ended(end StateEnd) *StateEnd {
	if m.end.cut != nil {
		end.Cut, end.OpenFlows, end.AppProcesses = true, m.end.cut.OpenFlows, m.end.cut.AppProcesses
	}
	return &end
}

// finish publishes the drain's end and tells the reporter (once a drain
// began).
func (m *Machine) finish(end StateEnd) {
	m.publish(nil, m.ended(end))
	if m.reporter != nil && m.Cause() != CauseNone {
		m.reporter.DrainEnded(m.State())
	}
}
