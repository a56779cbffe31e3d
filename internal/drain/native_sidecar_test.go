package drain

import (
	"fmt"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

func TestNativeSidecarSIGTERMAfterPreStop(t *testing.T) {
	// No process view: only the app's sockets can say it is gone, which
	// no idle app's can prove; the kubelet's SIGTERM does.
	partial := func(r *rig, _ *Config) {
		r.apps = nil
		r.flows.set(func(v *FlowView) { v.AppListeners = 1 })
	}
	appGone := func(r *rig) { r.flows.set(func(v *FlowView) { v.AppListeners = 0 }) }
	t.Run("app gone during the min-drain", inBubble(func(t *testing.T) {
		r := newRig(t, partial, withConfig(func(c *Config) { c.MinDrain = time.Hour; c.Deadline = 2 * time.Hour }))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Draining)
		appGone(r)
		r.notDone(50 * time.Millisecond)
		r.m.Trigger(CauseSignal) // the kubelet: every app container has exited
		r.wantResult(r.result(), 0, true, "drained")
		if r.count(logevent.SigtermEndsMinDrain) != 1 {
			t.Errorf("no native-sidecar line; log:\n%s", r.log())
		}
	}))
	t.Run("the gate waits for the SIGTERM", inBubble(func(t *testing.T) {
		r := newRig(t, partial)
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		appGone(r)
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldAwaitSignal}))
		r.notDone(50 * time.Millisecond)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
	}))
	// The app seen gone stands in for the SIGTERM, in the gate (Gating)
	// and during the min-drain (Draining), which it ends.
	for _, at := range []Phase{Gating, Draining} {
		t.Run("the app seen gone while "+at.String(), inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) {
				if at == Draining {
					c.MinDrain, c.Deadline = time.Hour, 2*time.Hour
				}
			}))
			r.waitPhase(Ready)
			r.m.Trigger(CausePreStop)
			r.waitPhase(at)
			r.notDone(50 * time.Millisecond)
			r.apps.exit()
			r.wantResult(r.result(), 0, true, "drained")
			r.wantPhases("ready", "draining", "gating", "stopping", "exited")
			if r.count(logevent.AppGoneEndsAwait) != 1 || r.count(logevent.SigtermAfterPrestop) != 0 {
				t.Errorf("want one app_gone_ends_await line, no SIGTERM; log:\n%s", r.log())
			}
		}))
	}
	t.Run("the app seen gone, Envoy still busy", inBubble(func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		r.flows.set(func(v *FlowView) { v.Downstream = 1 })
		r.apps.exit()
		r.waitForLog(logevent.AppGoneEndsAwait, "", "")
		r.notDone(50 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	}))
	t.Run("a classic sidecar with the hook", inBubble(func(t *testing.T) {
		// SIGTERM right after the hook, the app still running: it is the
		// kubelet's for this container; the min-drain and the gate go on.
		r := newRig(t, withConfig(func(c *Config) { c.MinDrain = 100 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.m.Trigger(CauseSignal)
		r.waitForLog(logevent.SigtermAfterPrestop, "", "")
		r.waitPhase(Gating)
		r.notDone(30 * time.Millisecond)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	}))
}
