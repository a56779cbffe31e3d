package drain

import (
	"fmt"
	"time"
)

// DefaultDrainBeginWait is how long a caller of the out-of-rotation wait
// (the app's preStop hook) waits for a drain that has not begun
// (--drain-begin-wait). The kubelet runs every container's preStop at the
// pod's deletion at once, and signals a classic proxy's container then:
// that drain begins within milliseconds. A native sidecar's drain begins
// with its own preStop, an exec (`draind drain`), which the runtime can
// start seconds late: 2–3 s after the app's hook with 40 pods deleted at
// once on a 2-CPU node (make bench-rollout), when a 2 s wait let apps stop
// accepting still in rotation. Past the wait, the pod is taken as not
// leaving rotation (the app alone restarted, or a caller that is not the
// kubelet): only that case pays it, in the restarted app's preStop.
const DefaultDrainBeginWait = 10 * time.Second

// RotationWaitVerdict is what a caller waiting for the pod to leave
// rotation is told.
type RotationWaitVerdict struct {
	// Done says to answer now, with Outcome; otherwise wait for the next
	// State, or until Until when it is not zero (the end of the begin
	// wait).
	Done    bool
	Outcome RotationWaitOutcome
	Account string
	Until   time.Time
}

// RotationWaitOutcome says how the wait ended.
type RotationWaitOutcome uint8

// Outcomes of the wait.
const (
	// WaitOutOfRotation means the min-drain is over (fixed, or auto and
	// out).
	WaitOutOfRotation RotationWaitOutcome = iota + 1
	// WaitNoRotation means the drain has no rotation to leave (the app's
	// completion, a prestop-only drain): nothing to wait for.
	WaitNoRotation
	// WaitNoDrain means no drain began within the begin wait.
	WaitNoDrain
)

func (o RotationWaitOutcome) String() string {
	switch o {
	case WaitOutOfRotation:
		return "out-of-rotation"
	case WaitNoRotation:
		return "no-rotation"
	case WaitNoDrain:
		return "no-drain"
	}
	return "waiting"
}

// RotationWait decides the out-of-rotation wait (GET /wait/out-of-rotation)
// from the published State: asked at since, now is now, waiting at most
// beginWait for a drain to begin. It never changes
// the drain: it only reads. The wait is bounded by the machine's own: a
// Draining machine leaves Draining by the min-drain, its ceiling or the
// deadline.
func RotationWait(st State, since, now time.Time, beginWait time.Duration) RotationWaitVerdict {
	switch {
	case st.Cause == CauseNone && st.End != nil:
		return RotationWaitVerdict{Done: true, Outcome: WaitNoDrain, Account: "the proxy stopped without a drain"}
	case st.Cause == CauseNone:
		if end := since.Add(beginWait); now.Before(end) {
			return RotationWaitVerdict{Until: end}
		}
		return RotationWaitVerdict{Done: true, Outcome: WaitNoDrain,
			Account: fmt.Sprintf("no drain began within %s: the pod is not leaving rotation", beginWait)}
	case st.Phase == Draining:
		return RotationWaitVerdict{}
	case st.Cause == CauseAppDone || st.Shape == ShapePrestop:
		return RotationWaitVerdict{Done: true, Outcome: WaitNoRotation, Account: "the drain has no rotation to leave (" + st.Cause.String() + ")"}
	case st.Rotation != nil:
		return RotationWaitVerdict{Done: true, Outcome: WaitOutOfRotation,
			Account: fmt.Sprintf("out of rotation %s after the trigger: %s", st.Rotation.Took.Round(time.Millisecond), st.Rotation.Account)}
	}
	// A fixed min-drain over, or the drain ended before it was.
	took := "the min-drain is over"
	for _, h := range st.Held {
		if h.Kind == HoldMinDrain {
			took = fmt.Sprintf("the min-drain is over (%s)", h.For.Round(time.Millisecond))
		}
	}
	return RotationWaitVerdict{Done: true, Outcome: WaitOutOfRotation, Account: took}
}
