package drain

import (
	"strings"
	"testing"
	"time"
)

func TestGateDecisions(t *testing.T) {
	idle := 2 * time.Second
	tests := []struct {
		name  string
		in    GateInput
		open  bool
		holds string // substring of the joined holds
	}{
		{"idle pod, app gone", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true}, true, ""},
		{"app processes alive", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, AppProcs: 2, EnvoyKnown: true}, false, "app: 2 processes"},
		{"processes gone, flows left: wait trusts processes", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, AppHolding: 3, EnvoyKnown: true}, true, ""},
		{"no process view: listener left", GateInput{AppExit: AppExitWait, AppListeners: 1, EnvoyKnown: true}, false, "app: 1 listeners, 0 flows"},
		{"no process view: flow left (nginx after quit)", GateInput{AppExit: AppExitWait, AppHolding: 1, EnvoyKnown: true}, false, "app: 0 listeners, 1 flows"},
		{"no process view: nothing left", GateInput{AppExit: AppExitWait, EnvoyKnown: true}, true, ""},
		{"flows policy ignores live processes", GateInput{AppExit: AppExitFlows, ProcView: ProcsComplete, AppProcs: 1, AppListeners: 1, EnvoyKnown: true}, true, ""},
		{"flows policy holds on a flow", GateInput{AppExit: AppExitFlows, AppHolding: 1, EnvoyKnown: true}, false, "app: 1 flows"},
		{"gateway has no app", GateInput{Gateway: true, ProcView: ProcsComplete, AppProcs: 5, EnvoyKnown: true}, true, ""},
		{"envoy has active downstream", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 2, Downstream: 2}, false, "envoy: 2 active downstream"},
		{"envoy active but all idle past timeout", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1, DownstreamIdle: 1, IdleTimeout: idle}, true, ""},
		{"idle without timeout does not count", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1}, false, "envoy: 1 active"},
		{"app gone, every downstream flow parked", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 2, Downstream: 2, DownstreamParked: 2}, true, ""},
		{"app gone, admin down, parked", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, Downstream: 1, DownstreamParked: 1}, true, ""},
		{"app gone, one parked, one busy", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 2, Downstream: 2, DownstreamParked: 1}, false, "envoy: 2 active"},
		{"parked, but the app still listens (flows policy)", GateInput{AppExit: AppExitFlows, AppListeners: 1, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1, DownstreamParked: 1}, false, "envoy: 1 active"},
		{"parked, but app processes alive", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, AppProcs: 1, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1, DownstreamParked: 1}, false, "envoy: 1 active"},
		{"parked on a gateway: its upstreams serve on", GateInput{Gateway: true, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1, DownstreamParked: 1}, false, "envoy: 1 active"},
		{"admin down, kernel sees none", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete}, true, ""},
		{"admin down, kernel sees flows", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, Downstream: 1}, false, "kernel view"},
		{"partial process view: zero processes, a listener left", GateInput{AppExit: AppExitWait, ProcView: ProcsPartial, AppListeners: 1, EnvoyKnown: true}, false, "app: 1 listeners"},
		{"partial process view: a process left", GateInput{AppExit: AppExitWait, ProcView: ProcsPartial, AppProcs: 1, EnvoyKnown: true}, false, "app: 1 processes"},
		{"partial process view: nothing left", GateInput{AppExit: AppExitWait, ProcView: ProcsPartial, EnvoyKnown: true}, true, ""},
		{"prestop: flows only", GateInput{AppExit: AppExitFlows, NoProxy: true, AppListeners: 2}, true, ""},
		{"prestop --wait-listeners", GateInput{AppExit: AppExitFlows, WaitListeners: true, NoProxy: true, AppListeners: 2}, false, "app: 2 listeners, 0 flows"},
		{"prestop ignores envoy", GateInput{AppExit: AppExitFlows, NoProxy: true, Downstream: 3}, true, ""},
		{"both hold", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, AppProcs: 1, EnvoyKnown: true, EnvoyActive: 1}, false, "app: 1 processes; envoy: 1 active"},
		{"native sidecar: app seen gone, no SIGTERM needed", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, AwaitSignal: true}, true, ""},
		{"native sidecar: app processes alive", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, AppProcs: 1, EnvoyKnown: true, AwaitSignal: true}, false, "app: 1 processes; kubelet: the sidecar's SIGTERM"},
		{"native sidecar: no process view, nothing left", GateInput{AppExit: AppExitWait, EnvoyKnown: true, AwaitSignal: true}, false, "kubelet: the sidecar's SIGTERM"},
		{"native sidecar: partial view, nothing left", GateInput{AppExit: AppExitWait, ProcView: ProcsPartial, EnvoyKnown: true, AwaitSignal: true}, false, "kubelet: the sidecar's SIGTERM"},
		{"native sidecar: flows policy", GateInput{AppExit: AppExitFlows, ProcView: ProcsComplete, AppProcs: 1, EnvoyKnown: true, AwaitSignal: true}, false, "kubelet: the sidecar's SIGTERM"},
		{"native sidecar: app gone, Envoy busy", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, EnvoyActive: 1, Downstream: 1, AwaitSignal: true}, false, "envoy: 1 active"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := Gate{}
			v := g.Step(tt.in)
			var hs []string
			for _, h := range v.Holds {
				hs = append(hs, h.String())
			}
			joined := strings.Join(hs, "; ")
			if v.Open != tt.open || !strings.Contains(joined, tt.holds) {
				t.Fatalf("open=%v holds=%q; want open=%v holds containing %q", v.Open, joined, tt.open, tt.holds)
			}
		})
	}
}

func TestGateSettle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	done := GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true}
	busy := done
	busy.EnvoyActive = 1
	g := Gate{Settle: 300 * time.Millisecond}
	steps := []struct {
		at     time.Duration
		in     GateInput
		open   bool
		wakeAt time.Duration // 0: none
	}{
		{0, done, false, 300 * time.Millisecond},
		{100 * time.Millisecond, done, false, 300 * time.Millisecond},
		{200 * time.Millisecond, busy, false, 0}, // a break restarts the settle
		{250 * time.Millisecond, done, false, 550 * time.Millisecond},
		{549 * time.Millisecond, done, false, 550 * time.Millisecond},
		{550 * time.Millisecond, done, true, 0},
	}
	for i, s := range steps {
		in := s.in
		in.Now = t0.Add(s.at)
		v := g.Step(in)
		var wake time.Duration
		if !v.WakeAt.IsZero() {
			wake = v.WakeAt.Sub(t0)
		}
		if v.Open != s.open || wake != s.wakeAt {
			t.Fatalf("step %d at %s: open=%v wake=%s; want open=%v wake=%s", i, s.at, v.Open, wake, s.open, s.wakeAt)
		}
	}
	// Without settle the gate opens at the first done evaluation.
	g = Gate{}
	if v := g.Step(done); !v.Open {
		t.Fatalf("no settle: not open: %+v", v)
	}
}

// TestGateSocketsOnly: an app seen only by its sockets is not done between
// two of its connections before the fixed wait; a process view, or its
// end, lets the gate open on the app's exit alone.
func TestGateSocketsOnly(t *testing.T) {
	t0 := time.Unix(1000, 0)
	until := t0.Add(SocketsOnlyHold)
	tests := []struct {
		name   string
		in     GateInput
		open   bool
		wakeAt time.Time
	}{
		{"between two calls, before the fixed wait", GateInput{AppExit: AppExitWait, EnvoyKnown: true, SocketsOnlyUntil: until, Now: t0.Add(3600 * time.Millisecond)}, false, until},
		{"a call open: its socket holds, no wake-up needed", GateInput{AppExit: AppExitWait, EnvoyKnown: true, AppHolding: 1, SocketsOnlyUntil: until, Now: t0.Add(time.Second)}, false, time.Time{}},
		{"at the fixed wait", GateInput{AppExit: AppExitWait, EnvoyKnown: true, SocketsOnlyUntil: until, Now: until}, true, time.Time{}},
		{"a process view proves the app gone", GateInput{AppExit: AppExitWait, ProcView: ProcsComplete, EnvoyKnown: true, SocketsOnlyUntil: until, Now: t0.Add(time.Second)}, true, time.Time{}},
		{"no hold set", GateInput{AppExit: AppExitWait, EnvoyKnown: true, Now: t0.Add(time.Second)}, true, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := Gate{}
			v := g.Step(tt.in)
			if v.Open != tt.open || !v.WakeAt.Equal(tt.wakeAt) {
				t.Fatalf("open=%v wake=%v holds=%v; want open=%v wake=%v", v.Open, v.WakeAt, v.Holds, tt.open, tt.wakeAt)
			}
		})
	}
}

// TestSocketsOnlyFromListenersClose: the hold runs SocketsOnlyHold from
// the trigger, and from the first look that finds the app's listeners
// closed after one that found them open (its SIGTERM, at the end of its
// preStop), never shorter.
func TestSocketsOnlyFromListenersClose(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type look struct {
		at        time.Duration
		listeners int
	}
	tests := []struct {
		name    string
		looks   []look
		until   time.Time
		awaits  bool
		trigger bool
	}{
		{"no look: from the trigger", nil, at(SocketsOnlyHold), true, true},
		{"listening still", []look{{0, 1}, {20 * time.Second, 2}}, at(SocketsOnlyHold), true, true},
		{"closed at the trigger's hold end", []look{{0, 1}, {30 * time.Second, 0}}, at(30*time.Second + SocketsOnlyHold), false, true},
		{"closed soon after the trigger: the later end", []look{{0, 1}, {time.Second, 0}}, at(time.Second + SocketsOnlyHold), false, true},
		{"the first close counts, a reopen does not", []look{{0, 1}, {2 * time.Second, 0}, {3 * time.Second, 1}, {9 * time.Second, 0}}, at(2*time.Second + SocketsOnlyHold), false, true},
		{"never seen listening: the trigger's hold", []look{{0, 0}, {8 * time.Second, 0}}, at(SocketsOnlyHold), true, true},
		{"no hold: looks change nothing", []look{{0, 1}, {time.Second, 0}}, time.Time{}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s SocketsOnly
			if tt.trigger {
				s = NewSocketsOnly(t0)
			}
			for _, l := range tt.looks {
				s.Observe(at(l.at), l.listeners)
			}
			if !s.Until.Equal(tt.until) || s.AwaitsClose() != tt.awaits {
				t.Fatalf("until %v awaits %v; want %v, %v", s.Until, s.AwaitsClose(), tt.until, tt.awaits)
			}
		})
	}
}
