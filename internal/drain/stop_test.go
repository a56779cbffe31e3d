package drain

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// --- quit, cancel -----------------------------------------------------------

func TestQuitAndCancel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase Phase
		do    func(*rig)
		why   string
	}{
		{"quit when ready", Ready, func(r *rig) { r.m.Quit() }, "POST /quitquitquit"},
		{"quit when gating", Gating, func(r *rig) { r.m.Quit() }, "POST /quitquitquit"},
		{"cancel when ready", Ready, func(r *rig) { r.cancel() }, "context cancelled"},
		{"cancel when gating", Gating, func(r *rig) { r.cancel() }, "context cancelled"},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			r := newRig(t)
			r.waitPhase(Ready)
			if tc.phase == Gating {
				r.m.Trigger(CauseSignal)
				r.waitPhase(Gating)
			}
			tc.do(r)
			r.wantResult(r.result(), 0, false, tc.why)
			if r.admin.quitCalls.Load() != 1 {
				t.Errorf("%d quit calls, want 1", r.admin.quitCalls.Load())
			}
		}))
	}
}

// --- the proxy ends on its own, in each phase ---------------------------------

func TestProxyExitsInEachPhase(t *testing.T) {
	for _, tc := range []struct {
		phase    Phase
		minDrain time.Duration
		when     string
	}{
		{Starting, time.Hour, "before any drain"},
		{Ready, time.Hour, "before any drain"},
		{Draining, time.Hour, "during the drain"},
		{Gating, 0, "during the drain"},
	} {
		t.Run(tc.phase.String(), inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) { c.MinDrain = tc.minDrain; c.Deadline = 2 * time.Hour }))
			if tc.phase == Starting {
				r.admin.notLive.Store(true)
			} else {
				r.waitPhase(Ready)
			}
			if tc.phase >= Draining {
				r.m.Trigger(CauseSignal)
				r.waitPhase(tc.phase)
			}
			r.proxy.exit(134)
			r.wantResult(r.result(), 134, false, "proxy exited with code 134 "+tc.when)
			if r.admin.quitCalls.Load() != 0 {
				t.Error("asked a dead proxy to quit")
			}
		}))
	}
	t.Run("exit 0 is a failure too", inBubble(func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.proxy.exit(0)
		r.wantResult(r.result(), 1, false, "before any drain")
	}))
	t.Run("exit 0 stands for a supervisor that decides it", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ProxyExitStands = true }))
		r.waitPhase(Ready)
		r.proxy.exit(0)
		r.wantResult(r.result(), 0, false, "proxy exited with code 0 before any drain")
	}))
	t.Run("stopping", inBubble(func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) {
			r.admin.quitErr = errors.New("admin: 500")
			r.proxy.ignore[syscall.SIGTERM] = true
			r.proxy.noExitOn = true
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		r.waitPhase(Stopping)
		r.proxy.exit(134) // crashes while being stopped
		r.wantResult(r.result(), 134, false, "proxy exited with code 134")
	}))
}

// --- the stop steps -------------------------------------------------------------

func TestStopEscalates(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(*rig)
		signals []syscall.Signal
		code    int
	}{
		{"quit works", func(r *rig) {}, nil, 0},
		{"quit fails, SIGTERM works", func(r *rig) { r.admin.quitErr = errors.New("admin: 500") }, []syscall.Signal{syscall.SIGTERM}, 0},
		{"quit ignored, SIGTERM works", func(r *rig) { r.proxy.noExitOn = true }, []syscall.Signal{syscall.SIGTERM}, 0},
		{"SIGTERM ignored too", func(r *rig) { r.proxy.noExitOn = true; r.proxy.ignore[syscall.SIGTERM] = true }, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, 137},
		{"admin hangs", nil, []syscall.Signal{syscall.SIGTERM}, 0},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			if tc.setup == nil { // the admin API hangs once Envoy is LIVE
				tc.setup = func(*rig) {}
			}
			r := newRig(t, setup(tc.setup))
			r.waitPhase(Ready)
			if tc.name == "admin hangs" {
				r.admin.hang.Store(true)
			}
			r.m.Trigger(CauseSignal)
			r.apps.exit()
			res := r.result()
			if res.ExitCode != tc.code || fmt.Sprint(r.proxy.sent()) != fmt.Sprint(tc.signals) {
				t.Errorf("exit %d signals %v, want %d %v; log:\n%s", res.ExitCode, r.proxy.sent(), tc.code, tc.signals, r.log())
			}
		}))
	}
}

// --- deadlines -----------------------------------------------------------------

func TestDeadlineInEachPhase(t *testing.T) {
	t.Run("gating", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Deadline = time.Second }), setup(func(r *rig) {
			r.flows.holding = []OpenFlow{{Owner: "app", Direction: "inbound", State: "ESTABLISHED"}}
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		res := r.result() // the app never exits
		r.wantResult(res, 0, false, "deadline")
		if r.count(logevent.DeadlineReached) != 1 || r.count(logevent.OpenFlowAtDeadline) != 1 {
			t.Errorf("deadline report missing; log:\n%s", r.log())
		}
	}))
	t.Run("draining", inBubble(func(t *testing.T) {
		// Reconcile keeps a min-drain inside the deadline; the machine must
		// still end by the deadline if handed one that is not.
		cfg := testConfig()
		cfg.Deadline, cfg.MinDrain = time.Second, time.Hour
		r := newRig(t, withConfig(func(c *Config) { *c = cfg }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, false, "deadline")
		r.wantPhases("ready", "draining", "stopping", "exited")
	}))
	t.Run("the whole drain fits", inBubble(func(t *testing.T) {
		// Everything stuck: the app never exits, the admin API hangs, the
		// proxy ignores SIGTERM. The stop steps run inside the deadline.
		r := newRig(t, withConfig(func(c *Config) { c.Deadline = time.Second }), setup(func(r *rig) {
			r.proxy.noExitOn = true
			r.proxy.ignore[syscall.SIGTERM] = true
		}))
		r.waitPhase(Ready)
		r.admin.hang.Store(true)
		start := time.Now()
		r.m.Trigger(CauseSignal)
		res := r.result()
		took := time.Since(start)
		r.wantResult(res, 137, false, "deadline")
		if took > r.m.Config().Deadline { // the fake clock is exact: no slack for a loaded machine
			t.Errorf("ended %s after the trigger: the stop steps ran past the deadline", took)
		}
		t.Logf("everything stuck: ended %s after the trigger (deadline 1s, stop reserve %s)", took, r.m.Config().StopReserve())
	}))
}
