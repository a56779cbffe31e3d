package drain

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// fakeArrivals stands for the agent's counter: arrivals are added by the
// test as the fake clock runs.
type fakeArrivals struct {
	mu     sync.Mutex
	before ArrivalsBefore
	since  ArrivalsSince
	begun  time.Time
	ended  int
}

func (a *fakeArrivals) Begin(at time.Time) ArrivalsBefore {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.begun = at
	return a.before
}

func (a *fakeArrivals) Since() ArrivalsSince {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since
}

func (a *fakeArrivals) End() {
	a.mu.Lock()
	a.ended++
	a.mu.Unlock()
}

func (a *fakeArrivals) arrive(now time.Time) {
	a.mu.Lock()
	a.since.Add(a.begun, now, 1)
	a.mu.Unlock()
}

// TestMinDrainAuto: the machine leaves Draining when the rule says so,
// re-checking only at computed moments: clients every 50 ms until 3 s
// after the trigger, then none; out 400 ms (8 gaps) after the last.
func TestMinDrainAuto(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		arr := &fakeArrivals{before: ArrivalsBefore{Known: true, Count: 100, Span: 5 * time.Second}}
		r := newRig(t, withConfig(func(c *Config) {
			c.Gateway, c.MinDrainAuto, c.RotationFloor, c.RotationCeiling, c.Deadline = true, true, time.Second, 10*time.Second, 20*time.Second
		}), func(r *rig, _ *Config) { r.arrivals = arr })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Draining)
		start := time.Now()
		var last time.Time
		for time.Since(start) < 3*time.Second {
			time.Sleep(50 * time.Millisecond)
			last = time.Now()
			arr.arrive(last)
			if p := r.m.Phase(); p != Draining {
				t.Fatalf("phase %s %s after the trigger, clients still arriving", p, time.Since(start))
			}
		}
		r.wantResult(r.result(), 0, true, "drained")
		end, ok := r.m.Rotation()
		if !ok || end.Why != RotationQuiet || end.Connections != 60 || end.Window != 400*time.Millisecond || end.Took != last.Add(400*time.Millisecond).Sub(start) {
			t.Errorf("rotation end %+v (ok %v), want quiet after 60 connections, 400 ms after the last (%s)", end, ok, last.Sub(start))
		}
		if r.count(logevent.OutOfRotation) != 1 || arr.ended != 1 {
			t.Errorf("out_of_rotation lines %d, End calls %d; log:\n%s", r.count(logevent.OutOfRotation), arr.ended, r.log())
		}
	})
}

// TestMinDrainAutoFloorAndCeiling: no client at all after the trigger
// ends the wait at the floor for a busy pod, at the ceiling for an idle one.
func TestMinDrainAutoFloorAndCeiling(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before ArrivalsBefore
		want   time.Duration
		why    RotationReason
	}{
		{"busy", ArrivalsBefore{Known: true, Count: 1000, Span: 10 * time.Second}, time.Second, RotationFloor},
		{"idle", ArrivalsBefore{Known: true, Span: time.Hour}, 4 * time.Second, RotationCeiling},
	} {
		t.Run(tt.name, inBubble(func(t *testing.T) {
			arr := &fakeArrivals{before: tt.before}
			r := newRig(t, withConfig(func(c *Config) {
				c.Gateway, c.MinDrainAuto, c.RotationFloor, c.RotationCeiling = true, true, time.Second, 4*time.Second
			}), func(r *rig, _ *Config) { r.arrivals = arr })
			r.waitPhase(Ready)
			r.m.Trigger(CauseSignal)
			r.wantResult(r.result(), 0, true, "drained")
			if end, _ := r.m.Rotation(); end.Took != tt.want || end.Why != tt.why {
				t.Errorf("rotation end %+v, want %s at %s", end, tt.why, tt.want)
			}
		}))
	}
}

// TestSocketsOnlyHoldFromListenersClose: an app seen by its sockets alone
// closes its listener at its SIGTERM, which its preStop (the out-of-rotation
// wait) held past the trigger's fixed wait: the gate holds SocketsOnlyHold
// from the close, for the calls it still makes through the proxy.
func TestSocketsOnlyHoldFromListenersClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		arr := &fakeArrivals{before: ArrivalsBefore{Known: true, Span: time.Hour}}
		r := newRig(t, withoutApps(), withConfig(func(c *Config) {
			c.MinDrainAuto, c.RotationFloor, c.RotationCeiling, c.Deadline = true, time.Second, 8*time.Second, 30*time.Second
		}), func(r *rig, _ *Config) { r.arrivals = arr; r.flows.v = FlowView{AppListeners: 1} })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		start := time.Now()
		r.waitPhase(Gating)
		time.Sleep(200 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppListeners = 0 })
		closed := time.Now()
		r.wantResult(r.result(), 0, true, "drained")
		if got, want := time.Since(start), closed.Add(SocketsOnlyHold).Sub(start); got != want {
			t.Errorf("drained %s after the trigger, want %s (the hold from the listener's close at %s); log:\n%s",
				got, want, closed.Sub(start), r.log())
		}
	})
}
