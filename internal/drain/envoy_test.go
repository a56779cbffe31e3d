package drain

import (
	"testing"
	"testing/synctest"

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
