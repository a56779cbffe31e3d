package drain

import (
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// --- the gate -----------------------------------------------------------

func TestGateWaitsForEnvoyDownstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.flows.set(func(v *FlowView) { v.Downstream = 2 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		// The machine logs gating, then evaluates the gate: let it hold on
		// the app first (the first of the two lines counted below).
		synctest.Wait()
		r.apps.exit()
		r.notDone(30 * time.Millisecond)
		if r.admin.activeCalls.Load() != 0 {
			t.Errorf("asked the admin API while the kernel sees live downstream flows")
		}
		// The kernel sees them go; Envoy's counter trails by a moment.
		r.admin.active.Store(1)
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.notDone(30 * time.Millisecond)
		r.admin.active.Store(0) // re-asked with backoff, no event needed
		r.wantResult(r.result(), 0, true, "drained")
		if n := r.admin.activeCalls.Load(); n < 2 {
			t.Errorf("admin asked %d times, want a re-ask", n)
		}
		if n := r.count(logevent.GateHolds); n != 2 {
			// app and envoy, then envoy alone (the kernel's count, then the
			// admin API's): logged when what holds changes, not its counts.
			t.Errorf("%d 'gate holds' lines, want 2; log:\n%s", n, r.log())
		}
	})
}

func TestGateHoldsLoggedOnlyWhenTheyChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.flows.set(func(v *FlowView) { v.Downstream = 1 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		for i := 2; i < 40; i++ {
			r.flows.set(func(v *FlowView) { v.Downstream = i })
			synctest.Wait() // the machine has read this count before the next
		}
		if n := r.count(logevent.GateHolds); n != 1 {
			t.Errorf("%d 'gate holds' lines for 40 count changes, want 1; log:\n%s", n, r.log())
		}
		r.apps.exit()
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldEnvoyActive})) // the kernel's count stands in
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	})
}

// TestGateHoldsFlapLoggedOnce checks a flapping hold's log: a keep-alive
// client's requests turn envoy-active on and off while the app runs; each
// set of kinds is logged once, the flapping is not (HoldsRelogAfter).
func TestGateHoldsFlapLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		for i := range 40 {
			r.flows.set(func(v *FlowView) { v.Downstream = (i + 1) % 2 })
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
		}
		if n := r.count(logevent.GateHolds); n != 2 {
			t.Errorf("%d 'gate holds' lines for 40 flips in 2 s, want 2 (app, app and envoy); log:\n%s", n, r.log())
		}
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestGateNoGauges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) { r.admin.noGauges = true }))
		r.waitPhase(Ready)
		r.waitFor("the gauge check", func() bool { return r.m.Gauges() == GaugesAbsent })
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if n := r.admin.activeCalls.Load(); n != 0 {
			t.Errorf("asked for gauges Envoy does not keep %d times", n)
		}
		if r.count(logevent.NoListenerGauges) != 1 {
			t.Errorf("no warning about the missing gauges; log:\n%s", r.log())
		}
	})
}

func TestGateAdminErrorsLeaveTheKernel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) { r.admin.activeErr = errors.New("admin: 500") }))
		r.admin.active.Store(3)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		// The kernel sees no downstream flow: an erroring admin must not hold.
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestMachineSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Settle = 80 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldSettle}))
		r.apps.set(1) // a break restarts the settle
		r.apps.set(0)
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestGateIdleWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One keep-alive downstream flow, idle, expiring in 50 ms: no event
		// will come; the machine must wake itself and re-read the flows.
		r := newRig(t, withConfig(func(c *Config) { c.IdleTimeout = time.Second }), setup(func(r *rig) {
			r.flows.v = FlowView{Downstream: 1, IdleWake: time.Now().Add(50 * time.Millisecond)}
			r.flows.onRefresh = func(v *FlowView) {
				// Idle from IdleWake on, as package agent's view says it
				// (its IdleWake is already past the threshold).
				if !time.Now().Before(v.IdleWake) {
					v.DownstreamIdle = 1
				}
			}
		}))
		r.apps.exit()
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
		r.flows.mu.Lock()
		defer r.flows.mu.Unlock()
		if r.flows.refreshes == 0 {
			t.Error("the idle expiry did not re-read the flows")
		}
	})
}

// TestGateParkedOnceAppGone checks that a client's pooled keep-alive to
// Envoy holds no more once the app is gone. Idle times read before it tell
// nothing (a request may have come since), so the machine re-reads the
// flows at once, then again when the one still busy can be parked.
func TestGateParkedOnceAppGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) {
			r.flows.v = FlowView{Downstream: 2, DownstreamParked: 2, Measured: time.Now()}
			r.flows.onRefresh = func(v *FlowView) {
				// The first re-read: one parked, one answered 100 ms ago;
				// the next: both parked.
				switch {
				case v.ParkedWake.IsZero():
					v.DownstreamParked, v.ParkedWake = 1, time.Now().Add(ParkedAfter-100*time.Millisecond)
				default:
					v.DownstreamParked = 2
				}
				v.Measured = time.Now()
			}
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		time.Sleep(2 * time.Second) // the app runs on: the parked flows hold, nothing re-read
		synctest.Wait()
		if r.m.Phase() != Gating {
			t.Fatalf("phase %s with the app alive, want gating", r.m.Phase())
		}
		r.flows.mu.Lock()
		before := r.flows.refreshes
		r.flows.mu.Unlock()
		if before != 0 {
			t.Errorf("%d re-reads while the app ran, want none", before)
		}
		r.apps.exit()
		start := time.Now()
		r.wantResult(r.result(), 0, true, "drained")
		r.flows.mu.Lock()
		defer r.flows.mu.Unlock()
		if n := r.flows.refreshes - before; n != 2 {
			t.Errorf("%d re-reads after the app went, want 2 (at once, then at the parking)", n)
		}
		if took := time.Since(start); took > ParkedAfter {
			t.Errorf("drained %s after the app went, want within ParkedAfter (%s)", took, ParkedAfter)
		}
	})
}

func TestGatePartialProcessViewNeverOverridesSockets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, func(r *rig, _ *Config) { r.apps = newFakeApps(0, ProcsPartial) })
		r.flows.set(func(v *FlowView) { v.AppListeners = 1 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.notDone(30 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppListeners = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	})
}
