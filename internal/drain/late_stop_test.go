package drain

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

func TestPastGateDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   GateInput
		want bool
	}{
		{"a native sidecar awaiting its SIGTERM", GateInput{AwaitSignal: true, ProcView: ProcsComplete, AppProcs: 2}, true},
		{"awaiting it, no process view", GateInput{AwaitSignal: true, ProcView: ProcsUnseen}, true},
		{"its SIGTERM came (the app gone)", GateInput{ProcView: ProcsComplete}, false},
		{"a classic sidecar, the app still running", GateInput{ProcView: ProcsComplete, AppProcs: 2}, false},
		{"no proxy to keep (prestop)", GateInput{AwaitSignal: true, NoProxy: true, ProcView: ProcsComplete, AppProcs: 1}, false},
	} {
		if got := PastGateDeadline(tc.in); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestGraceSpent(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   GateInput
		want bool
	}{
		{"an app process still running", GateInput{ProcView: ProcsComplete, AppProcs: 1}, true},
		{"seen in a partial view", GateInput{ProcView: ProcsPartial, AppProcs: 2}, true},
		{"every app process gone", GateInput{ProcView: ProcsComplete}, false},
		{"no process view: the SIGTERM says the app exited", GateInput{ProcView: ProcsUnseen, AppListeners: 1}, false},
	} {
		if got := GraceSpent(tc.in); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if GraceSpentHold+2*KillWait > KubeletSidecarGrace {
		t.Errorf("hold %s: the quit, the exit and the SIGKILL step no longer fit in the kubelet's %s", GraceSpentHold, KubeletSidecarGrace)
	}
}

func TestLateStopReserveFits(t *testing.T) {
	c := DefaultConfig()
	if c.LateGateDeadline() <= c.GateDeadline() || c.LateGateDeadline()+c.LateStopReserve() != GracePeriod {
		t.Errorf("late gate deadline %s (reserve %s), gate deadline %s: want the grace period %s less the reserve", c.LateGateDeadline(), c.LateStopReserve(), c.GateDeadline(), GracePeriod)
	}
	for _, tc := range []struct {
		grace, deadline, lateEnd time.Duration
	}{
		{60 * time.Second, DeadlineForGrace(60 * time.Second), 60 * time.Second}, // --grace-period 60
		{0, 40 * time.Second, 45 * time.Second},                                  // --drain-deadline 40s alone
		{20 * time.Second, 25 * time.Second, 25 * time.Second},                   // a deadline past the grace period: never before it
	} {
		c := DefaultConfig()
		c.Grace, c.Deadline = tc.grace, tc.deadline
		if got := c.LateGateDeadline() + c.LateStopReserve(); got != tc.lateEnd {
			t.Errorf("grace %s, deadline %s: the late stop ends at %s, want %s", tc.grace, tc.deadline, got, tc.lateEnd)
		}
		// End: a State whose deadline is the late one ends then; one
		// whose deadline is the gate deadline, at the deadline.
		at := time.Unix(1000, 0)
		if got := c.End(State{Triggered: at, Deadline: at.Add(c.LateGateDeadline())}); got != tc.lateEnd {
			t.Errorf("grace %s, deadline %s: a late State ends at %s, want %s", tc.grace, tc.deadline, got, tc.lateEnd)
		}
		if got := c.End(State{Triggered: at, Deadline: at.Add(c.GateDeadline())}); got != c.Deadline {
			t.Errorf("grace %s, deadline %s: a State at the gate deadline ends at %s, want the deadline", tc.grace, tc.deadline, got)
		}
	}
	// The kubelet grants a native sidecar 2 s after its SIGTERM at least:
	// the late stop's own steps fit in it.
	if c.LateStopReserve() > 2*time.Second {
		t.Errorf("late stop reserve %s, more than the kubelet's 2 s", c.LateStopReserve())
	}
	c.Prestop = true
	if c.LateStopReserve() != 0 {
		t.Errorf("prestop late reserve %s", c.LateStopReserve())
	}
}

func TestLateStop(t *testing.T) {
	deadline := func(c *Config) { c.Deadline = 2 * time.Second }
	t.Run("a native sidecar keeps its proxy for the app past the gate deadline", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(deadline), setup(func(r *rig) {
			r.flows.holding = []OpenFlow{{Owner: "app", Direction: "inbound", State: "ESTABLISHED"}}
		}))
		r.waitPhase(Ready)
		start := time.Now()
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		cfg := r.m.Config()
		// The State (and the DrainStarted Event) say how long the app may
		// work: to the late gate deadline from the start.
		if st := r.m.State(); !st.Deadline.Equal(start.Add(cfg.LateGateDeadline())) {
			t.Errorf("State's deadline %s after the trigger, want the late %s", st.Deadline.Sub(start), cfg.LateGateDeadline())
		}
		time.Sleep(cfg.GateDeadline() + 10*time.Millisecond)
		r.notDone(0)
		if r.count(logevent.GateDeadlineLate) != 1 {
			t.Fatalf("no late gate deadline line; log:\n%s", r.log())
		}
		// The flow the grace period's end may cut is named at draind's
		// deadline: the stop that follows the app's end finds it closed.
		if r.count(logevent.OpenFlowAtDeadline) != 1 {
			t.Errorf("the open flow not named at the gate deadline; log:\n%s", r.log())
		}
		if st := r.m.State(); !st.Deadline.Equal(start.Add(cfg.LateGateDeadline())) {
			t.Errorf("State's deadline %s after the trigger, want the late %s", st.Deadline.Sub(start), cfg.LateGateDeadline())
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if s := r.proxy.sent(); len(s) != 0 {
			t.Errorf("signals %v: the quit alone stops a proxy that takes it", s)
		}
	}))
	t.Run("the kubelet's SIGTERM during the late hold", inBubble(func(t *testing.T) {
		// No process view: the SIGTERM alone says the app is gone.
		r := newRig(t, withoutApps(), withConfig(deadline))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		time.Sleep(r.m.Config().GateDeadline() + 10*time.Millisecond)
		r.notDone(0)
		if r.count(logevent.GateDeadlineLate) != 1 {
			t.Fatalf("no late gate deadline line; log:\n%s", r.log())
		}
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
	}))
	t.Run("the kubelet lags past the late gate deadline", inBubble(func(t *testing.T) {
		// Under a burst the kubelet SIGTERMed an app after the grace
		// period by draind's clock: the sidecar, not SIGTERMed until the
		// app exits, holds on for it.
		r := newRig(t, withoutApps(), withConfig(deadline))
		r.waitPhase(Ready)
		start := time.Now()
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		time.Sleep(r.m.Config().LateGateDeadline() + 10*time.Millisecond)
		r.notDone(5 * time.Second)
		if r.count(logevent.KubeletLags) != 1 {
			t.Fatalf("no kubelet_lags line; log:\n%s", r.log())
		}
		sigAt := time.Since(start)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
		if took := time.Since(start) - sigAt; took > KubeletSidecarGrace {
			t.Errorf("ended %s after the SIGTERM, past the kubelet's %s", took, KubeletSidecarGrace)
		}
	}))
	t.Run("no SIGTERM ever: the lag allowance ends it", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(deadline))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.wantResult(r.result(), 0, false, "deadline")
		want := r.m.Config().LateGateDeadline() + KubeletLagAllowance
		if st := r.m.State(); st.End == nil || st.End.Took != want {
			t.Errorf("stopping began %v after the trigger, want %s", st.End, want)
		}
	}))
	t.Run("past the gate deadline only the app holds", inBubble(func(t *testing.T) {
		// No process view: the SIGTERM says the app is gone. Envoy still
		// counts a connection, which held the gate to its deadline: the
		// proxy stops LateAppGoneWait after, killed inside the kubelet's
		// 2 s when it ignores the quit.
		r := newRig(t, withoutApps(), withConfig(deadline), setup(func(r *rig) { r.proxy.noExitOn = true }))
		r.waitPhase(Ready)
		start := time.Now()
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		r.flows.set(func(v *FlowView) { v.Downstream = 1 })
		time.Sleep(r.m.Config().GateDeadline() + 10*time.Millisecond)
		r.notDone(time.Second)
		goneAt := time.Since(start)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 137, false, "deadline")
		if st := r.m.State(); st.End == nil || st.End.Took != goneAt+LateAppGoneWait {
			t.Errorf("stopping began %v after the trigger, want %s after the SIGTERM (%s)", st.End, LateAppGoneWait, goneAt)
		}
		if took := time.Since(start) - goneAt; took > KubeletSidecarGrace {
			t.Errorf("ended %s after the SIGTERM, past the kubelet's %s", took, KubeletSidecarGrace)
		}
	}))
	t.Run("past the gate deadline the app gone, the gate opens within the wait", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { deadline(c); c.Settle = 100 * time.Millisecond }))
		r.holdLate()
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
	}))
	// The grace period spent: the kubelet SIGTERMs the sidecar at its end
	// with the app still running (its SIGTERM came as late), and SIGKILLs
	// both 2 s later. The proxy stays for the app's last calls.
	t.Run("the SIGTERM with the app running: it exits in the hold", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(deadline))
		start := r.holdLate()
		sigAt := time.Since(start)
		r.m.Trigger(CauseSignal)
		r.notDone(GraceSpentHold - 100*time.Millisecond)
		if r.count(logevent.GraceSpent) != 1 {
			t.Fatalf("no grace_spent line; log:\n%s", r.log())
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if took := time.Since(start) - sigAt; took > KubeletSidecarGrace {
			t.Errorf("ended %s after the SIGTERM, past the kubelet's %s", took, KubeletSidecarGrace)
		}
	}))
	t.Run("the SIGTERM with the app running: the hold ends it", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(deadline), setup(func(r *rig) { r.proxy.noExitOn = true }))
		start := r.holdLate()
		sigAt := time.Since(start)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 137, false, "deadline")
		if st := r.m.State(); st.End == nil || st.End.Took != sigAt+GraceSpentHold {
			t.Errorf("stopping began %v after the trigger, want %s after the SIGTERM (%s)", st.End, GraceSpentHold, sigAt)
		}
		if took := time.Since(start) - sigAt; took > KubeletSidecarGrace {
			t.Errorf("ended %s after the SIGTERM, past the kubelet's %s", took, KubeletSidecarGrace)
		}
	}))
	t.Run("without SIGTERM the late stop ends after the lag allowance", inBubble(func(t *testing.T) {
		// The app never exits, and no SIGTERM comes (the kubelet sends it
		// once the app has exited); the proxy takes the quit but does not
		// exit.
		r := newRig(t, withConfig(deadline), setup(func(r *rig) { r.proxy.noExitOn = true }))
		r.waitPhase(Ready)
		start := time.Now()
		r.m.Trigger(CausePreStop)
		res := r.result()
		took := time.Since(start)
		r.wantResult(res, 137, false, "deadline")
		if s := r.proxy.sent(); !slices.Equal(s, []syscall.Signal{syscall.SIGKILL}) {
			t.Errorf("signals %v, want SIGKILL alone after the quit", s)
		}
		if cfg := r.m.Config(); took > cfg.LateGateDeadline()+KubeletLagAllowance+cfg.StopTimeout+KillWait || took < cfg.LateGateDeadline()+KubeletLagAllowance {
			t.Errorf("ended %s after the trigger: want the late gate deadline %s and the lag allowance %s, then the stop", took, cfg.LateGateDeadline(), KubeletLagAllowance)
		}
	}))
	t.Run("a failed quit still gets SIGTERM", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(deadline), setup(func(r *rig) { r.proxy.ignore[syscall.SIGTERM] = true }))
		r.waitPhase(Ready)
		r.admin.hang.Store(true)
		start := time.Now()
		r.m.Trigger(CausePreStop)
		res := r.result()
		r.wantResult(res, 137, false, "deadline")
		if s := r.proxy.sent(); !slices.Equal(s, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
			t.Errorf("signals %v, want SIGTERM then SIGKILL", s)
		}
		if cfg := r.m.Config(); time.Since(start) > cfg.LateGateDeadline()+KubeletLagAllowance+2*cfg.StopTimeout+KillWait {
			t.Errorf("ended %s after the trigger, past the lag allowance and the stop", time.Since(start))
		}
	}))
	t.Run("a classic sidecar: the gate deadline stands", inBubble(func(t *testing.T) {
		// The kubelet signalled the app and the proxy together and kills
		// both at the end of the grace period: the app still running is no
		// reason to spend the stop reserve.
		r := newRig(t, withConfig(deadline))
		r.waitPhase(Ready)
		start := time.Now()
		r.m.Trigger(CauseSignal)
		r.waitPublished(Gating)
		if st := r.m.State(); !st.Deadline.Equal(start.Add(r.m.Config().GateDeadline())) {
			t.Errorf("State's deadline %s after the trigger, want the gate deadline %s", st.Deadline.Sub(start), r.m.Config().GateDeadline())
		}
		r.wantResult(r.result(), 0, false, "deadline")
		if r.count(logevent.GateDeadlineLate) != 0 {
			t.Errorf("held late in a classic sidecar; log:\n%s", r.log())
		}
		if took := time.Since(start); took > r.m.Config().GateDeadline()+r.m.Config().StopTimeout {
			t.Errorf("ended %s after the trigger, want the gate deadline %s", took, r.m.Config().GateDeadline())
		}
	}))
}

// holdLate starts a drain from the preStop hook and lets its gate deadline
// pass, the machine still running (the late hold); it returns when the
// drain was triggered.
func (r *rig) holdLate() time.Time {
	r.t.Helper()
	r.waitPhase(Ready)
	start := time.Now()
	r.m.Trigger(CausePreStop)
	r.waitPhase(Gating)
	time.Sleep(r.m.Config().GateDeadline() + 10*time.Millisecond)
	r.notDone(time.Second)
	return start
}
