package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// --- drain_listeners is retried ----------------------------------------------------

func TestDrainListenersRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.admin.dlFailures.Store(3)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.waitFor("drain_listeners", func() bool { st, _ := r.m.DrainListeners(); return st == DrainListenersDone })
		if _, n := r.m.DrainListeners(); n != 4 {
			t.Errorf("%d attempts, want 4", n)
		}
		if r.count(logevent.DrainListenersFailed) != 1 {
			t.Errorf("the same failure logged more than once; log:\n%s", r.log())
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestDrainListenersGivesUpWithTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.admin.dlFailures.Store(1 << 30)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if st, n := r.m.DrainListeners(); st != DrainListenersGaveUp || n < 1 {
			t.Errorf("drain_listeners %s after %d attempts, want gave-up", st, n)
		}
	})
}

// TestActiveAskedBesideTheLoop checks that the gate's ask of Envoy's count
// runs beside the loop: a quit (a SIGTERM, the proxy's exit) is not held
// by an admin API that hangs for the ask's whole timeout.
func TestActiveAskedBesideTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.waitFor("the gauge check", func() bool { return r.m.Gauges() == GaugesPresent })
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.admin.hang.Store(true)
		r.apps.exit() // the app done, no downstream flow: the gate asks Envoy
		r.waitFor("the ask", func() bool { return r.admin.activeCalls.Load() == 1 })
		start := time.Now()
		r.m.Quit()
		r.wantResult(r.result(), 0, false, "POST /quitquitquit")
		if took := time.Since(start); took >= activeTimeout {
			t.Errorf("the quit took %s with the ask hung: it waited for the ask (%s)", took, activeTimeout)
		}
	})
}
