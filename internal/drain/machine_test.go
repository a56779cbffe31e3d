package drain

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/draind/draind/internal/logevent"
)

// --- triggers ---------------------------------------------------------

func TestTriggers(t *testing.T) {
	for _, c := range Causes {
		t.Run(c.String(), inBubble(func(t *testing.T) {
			r := newRig(t)
			r.waitPhase(Ready)
			r.m.Trigger(c)
			r.waitPhase(Gating)
			if r.m.Cause() != c {
				t.Errorf("cause %s, want %s", r.m.Cause(), c)
			}
			r.notDone(20 * time.Millisecond) // the app still runs
			r.apps.exit()
			if c == CausePreStop {
				r.m.Trigger(CauseSignal) // a native sidecar's: once the app is gone
			}
			res := r.result()
			r.wantResult(res, 0, true, "drained")
			r.wantPhases("ready", "draining", "gating", "stopping", "exited")
			if r.admin.quitCalls.Load() != 1 || len(r.proxy.sent()) != 0 {
				t.Errorf("quit calls %d, signals %v: want one quit and no signal", r.admin.quitCalls.Load(), r.proxy.sent())
			}
			if st, _ := r.m.DrainListeners(); st != DrainListenersDone || !r.admin.dlInbound.Load() {
				t.Errorf("drain_listeners %s inbound %v", st, r.admin.dlInbound.Load())
			}
			// The app's completion needs no endpoint propagation wait.
			minDrain := r.lines(logevent.Phase).Filter(func(e observer.LoggedEntry) bool { return e.ContextMap()["phase"] == "draining" }).All()[0].ContextMap()["min_drain"]
			want := 30 * time.Millisecond
			if c == CauseAppDone {
				want = 0
			}
			if minDrain != want {
				t.Errorf("min_drain %v, want %v", minDrain, want)
			}
		}))
	}
}

func TestTriggerWhileStarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Not LIVE before the machine runs (set after newRig, its first
		// ask could find Envoy LIVE: ready first, under -race now and then).
		r := newRig(t, func(r *rig, _ *Config) { r.admin.notLive.Store(true) })
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("draining", "gating", "stopping", "exited")
	})
}

func TestGatewayDrainsAllListenersAndWaitsForNoApp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Gateway = true }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		res := r.result() // app processes still there: a gateway has no app
		r.wantResult(res, 0, true, "drained")
		if r.admin.dlInbound.Load() {
			t.Error("gateway drained inbound listeners only")
		}
	})
}

// --- second signals -------------------------------------------------------

func TestSecondSignalIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.MinDrain = 100 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Draining)
		r.m.Trigger(CauseSignal)
		r.waitForLog(logevent.TriggerIgnored, "trigger", CauseSignal.String())
		if r.m.Phase() != Draining {
			t.Errorf("a second signal ended the min-drain")
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("ready", "draining", "gating", "stopping", "exited")
	})
}

// --- prestop is the same machine --------------------------------------------------

func TestPrestop(t *testing.T) {
	t.Run("flows done", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows }),
			setup(func(r *rig) { r.flows.v = FlowView{AppHolding: 1, AppListeners: 1} }))
		r.waitPhase(Gating)
		r.notDone(20 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppHolding = 0 })
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("draining", "gating", "exited")
	}))
	t.Run("wait listeners", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows; c.WaitListeners = true }),
			setup(func(r *rig) { r.flows.v = FlowView{AppListeners: 1} }))
		r.waitPhase(Gating)
		r.notDone(20 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppListeners = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	}))
	t.Run("timeout", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows; c.Deadline = 100 * time.Millisecond }),
			setup(func(r *rig) { r.flows.v = FlowView{AppHolding: 1} }))
		r.wantResult(r.result(), 0, false, "deadline")
		if r.count(logevent.DeadlineReached) != 1 {
			t.Errorf("no prestop deadline line; log:\n%s", r.log())
		}
	}))
}

// --- configuration -----------------------------------------------------------------

func TestConfigReserveAndReconcile(t *testing.T) {
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := d.StopReserve(); got != time.Second+4*time.Second+KillWait {
		t.Errorf("default stop reserve %s", got)
	}
	if d.Deadline >= GracePeriod || d.GraceWarning(0) != "" {
		t.Errorf("defaults do not fit the default grace period: %s", d.Deadline)
	}
	bad := d
	bad.Deadline = 3 * time.Second
	var ce *ConfigError
	if err := bad.Validate(); !errors.As(err, &ce) || !strings.Contains(err.Error(), "leaves no time to drain") {
		t.Errorf("3s deadline with 2s stop timeout: %v", err)
	}
	long := d
	long.Deadline = time.Hour
	if w := long.GraceWarning(0); !strings.Contains(w, "terminationGracePeriodSeconds to at least 3602") {
		t.Errorf("grace warning %q", w)
	}
	// Istio: MINIMUM_DRAIN_DURATION=30s with the default deadline.
	c := d
	c.MinDrain, c.MinDrainAuto = 30*time.Second, false
	got, warn := c.Reconcile(false)
	if got.Deadline != 30*time.Second+d.StopReserve() || got.MinDrain != 30*time.Second || warn == "" {
		t.Errorf("default deadline: %+v %q", got, warn)
	}
	got, warn = c.Reconcile(true)
	if got.Deadline != d.Deadline || got.MinDrain != d.GateDeadline() || warn == "" {
		t.Errorf("explicit deadline: %+v %q", got, warn)
	}
	if got, warn := d.Reconcile(true); got != d || warn != "" {
		t.Errorf("nothing to mend: %+v %q", got, warn)
	}
	// --min-drain auto (the default) under a short deadline (a 15 s grace
	// period's 10 s): the default ceiling is cut to fit, quietly; one the
	// operator chose is cut with a warning, or raises a default deadline.
	short := d
	short.Deadline = 10 * time.Second
	if got, warn := short.Reconcile(true); got.RotationCeiling != short.GateDeadline() || got.RotationFloor != DefaultRotationFloor || got.Deadline != short.Deadline || warn != "" {
		t.Errorf("default ceiling, 10s deadline: %+v %q", got, warn)
	}
	short.RotationCeilingSet = true
	if got, warn := short.Reconcile(true); got.RotationCeiling != short.GateDeadline() || !strings.Contains(warn, "the ceiling is cut to 4.5s") {
		t.Errorf("chosen ceiling, 10s deadline: %+v %q", got, warn)
	}
	chosen := d
	chosen.RotationCeiling, chosen.RotationCeilingSet = 30*time.Second, true
	if got, warn := chosen.Reconcile(false); got.Deadline != 30*time.Second+d.StopReserve() || !strings.Contains(warn, "the deadline is raised") {
		t.Errorf("chosen ceiling 30s, default deadline: %+v %q", got, warn)
	}
}

// The live views start at the trigger, once, whatever the trigger: not
// while Ready, after drain_listeners is under way (its clients must not
// wait for draind's views), before the gate reads them. A failure to start
// is logged and the drain goes on.
func TestTrackingStartsAtTheTrigger(t *testing.T) {
	for _, c := range []Cause{CauseSignal, CausePOST, CausePreStop} {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail=%v", c, fail), inBubble(func(t *testing.T) {
				var tr *fakeTracking
				r := newRig(t, func(r *rig, _ *Config) {
					tr = &fakeTracking{}
					if fail {
						tr.startError = errors.New("attach: operation not permitted")
					}
				}, withTracking(&tr))
				tr.dlState = func() DrainListenersState { s, _ := r.m.DrainListeners(); return s }
				r.waitPhase(Ready)
				r.notDone(20 * time.Millisecond)
				if n := tr.calls.Load(); n != 0 {
					t.Fatalf("tracking started %d times while Ready", n)
				}
				r.m.Trigger(c)
				r.waitPhase(Draining)
				r.m.Trigger(CauseSignal) // a second trigger starts nothing
				r.apps.exit()
				if c == CausePreStop {
					r.m.Trigger(CauseSignal)
				}
				if res := r.result(); res.ExitCode != 0 {
					t.Fatalf("result %+v; log:\n%s", res, r.log())
				}
				if n := tr.calls.Load(); n != 1 {
					t.Errorf("tracking started %d times, want once", n)
				}
				if tr.dlAtStart == DrainListenersNotSent {
					t.Errorf("tracking started before drain_listeners was under way")
				}
				want := logevent.TrackingLive
				if fail {
					want = logevent.TrackingFailed
				}
				if r.count(want) != 1 {
					t.Errorf("no %q in the log:\n%s", want, r.log())
				}
			}))
		}
	}
}
