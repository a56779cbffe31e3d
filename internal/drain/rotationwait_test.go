package drain

import (
	"testing"
	"time"
)

func TestRotationWait(t *testing.T) {
	t0 := time.Unix(5000, 0)
	asked := t0
	const wait = 3 * time.Second // not the default: the caller's wait decides
	for _, tc := range []struct {
		name    string
		st      State
		now     time.Time
		done    bool
		outcome RotationWaitOutcome
		until   time.Time
	}{
		{"ready, just asked: wait for the drain", State{Phase: Ready}, t0.Add(10 * time.Millisecond), false, 0, asked.Add(wait)},
		{"starting, just asked", State{Phase: Starting}, t0, false, 0, asked.Add(wait)},
		{"ready past the begin wait: no drain", State{Phase: Ready}, asked.Add(wait), true, WaitNoDrain, time.Time{}},
		{"stopped without a drain (a quit)", State{Phase: Exited, End: &StateEnd{Why: "POST /quitquitquit"}}, t0, true, WaitNoDrain, time.Time{}},
		{"draining: wait for the min-drain's end", State{Phase: Draining, Cause: CauseSignal}, t0.Add(time.Hour), false, 0, time.Time{}},
		{"gating after auto", State{Phase: Gating, Cause: CauseSignal, Rotation: &RotationEnd{Took: 1200 * time.Millisecond, Why: RotationQuiet, Account: "quiet for 1s after 3 new connections"}},
			t0, true, WaitOutOfRotation, time.Time{}},
		{"gating after a fixed min-drain", State{Phase: Gating, Cause: CauseSignal, Held: []HeldFor{{HoldMinDrain, 5 * time.Second}}}, t0, true, WaitOutOfRotation, time.Time{}},
		{"stopped at the deadline while draining", State{Phase: Exited, Cause: CauseSignal, End: &StateEnd{Why: "deadline", Cut: true}}, t0, true, WaitOutOfRotation, time.Time{}},
		{"a Job's drain has no rotation", State{Phase: Gating, Cause: CauseAppDone, Shape: ShapeJob}, t0, true, WaitNoRotation, time.Time{}},
		{"a native sidecar drained from its preStop", State{Phase: Gating, Cause: CausePreStop, Shape: ShapeNativeSidecar, Held: []HeldFor{{HoldMinDrain, time.Second}}}, t0, true, WaitOutOfRotation, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := RotationWait(tc.st, asked, tc.now, wait)
			if v.Done != tc.done || v.Outcome != tc.outcome || !v.Until.Equal(tc.until) {
				t.Errorf("got %+v, want done %v outcome %s until %v", v, tc.done, tc.outcome, tc.until)
			}
			if v.Done && v.Account == "" {
				t.Error("done with no account")
			}
		})
	}
}
