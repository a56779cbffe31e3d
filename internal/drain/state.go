package drain

import (
	"slices"
	"time"
)

// State is where a drain stands, for those who look from outside the
// machine: the node's view (`draind pods`, over the status server's
// GET /debug/state) and the pod's Kubernetes Events. The machine publishes
// a new one when its phase changes and when what holds it changes (a hold's
// count included): a gate evaluation that changes nothing publishes
// nothing, and nothing is published while Ready.
type State struct {
	Phase Phase
	// Cause and Shape: what started the drain and the kind of pod it is
	// for (CauseNone and the start shape before the trigger).
	Cause Cause
	Shape PodShape
	// Triggered is the drain's start; Deadline the moment the gate gives
	// up (the stop steps' reserve after it). Zero before the trigger.
	Triggered, Deadline time.Time
	// Holds is what holds the drain now: the min-drain while Draining,
	// the gate's holds while Gating; none otherwise.
	Holds []Hold
	// Held is every kind that held since the trigger, and for how long in
	// all, in the order they first held.
	Held []HeldFor
	// Rotation is how the wait for the pod to leave rotation ended
	// (--min-drain auto), once it has.
	Rotation *RotationEnd
	// Since is when this state was published.
	Since time.Time
	// The end, once Stopping or Exited.
	End *StateEnd
}

// StateEnd is how a drain ended.
type StateEnd struct {
	// Why the proxy was stopped ("drained", "deadline", ...), and whether
	// the gate opened (the app done, Envoy drained).
	Why   string
	Clean bool
	// Took is from the trigger to the proxy's stop.
	Took time.Duration
	// Cut is true when the deadline ended the drain with these still open.
	Cut           bool
	OpenFlows     int
	AppProcesses  int
	ExitCode      int
	ExitCodeKnown bool
}

// HeldFor is how long one kind of hold kept the drain, in all.
type HeldFor struct {
	Kind HoldKind
	For  time.Duration
}

// holdTimes adds up how long each kind held. Observe is called when what
// holds changes (and once at the end), with what held until now.
type holdTimes struct {
	last  time.Time
	kinds []HoldKind
	held  []HeldFor
}

// observe records that until now, what held was the previous kinds; from
// now on it is kinds.
func (h *holdTimes) observe(now time.Time, kinds []HoldKind) {
	if !h.last.IsZero() {
		d := now.Sub(h.last)
		for _, k := range h.kinds {
			i := slices.IndexFunc(h.held, func(f HeldFor) bool { return f.Kind == k })
			if i < 0 {
				h.held = append(h.held, HeldFor{Kind: k})
				i = len(h.held) - 1
			}
			h.held[i].For += d
		}
	}
	h.last = now
	h.kinds = slices.Clone(kinds)
}

// result is the totals so far, a copy.
func (h *holdTimes) result() []HeldFor { return slices.Clone(h.held) }

// Longest is the kind that held longest, if any held.
func (s *State) Longest() (HeldFor, bool) {
	var best HeldFor
	for _, f := range s.Held {
		if f.For > best.For {
			best = f
		}
	}
	return best, best.Kind != 0
}

// kindsOf is the kinds of holds, in order.
func kindsOf(holds []Hold) []HoldKind {
	k := make([]HoldKind, len(holds))
	for i, h := range holds {
		k[i] = h.Kind
	}
	return k
}

// State is where the drain stands (a copy: the caller may keep it).
func (m *Machine) State() State { return m.state.Load().st }

// Watch is State, and a channel closed once a newer State is published:
// a caller waits on a change without polling.
func (m *Machine) Watch() (State, <-chan struct{}) {
	p := m.state.Load()
	return p.st, p.next
}

// publish makes a new State current: holds is what holds from now on,
// end how the drain ended (nil before). Run's goroutine only.
func (m *Machine) publish(holds []Hold, end *StateEnd) {
	now := time.Now()
	if !m.started.IsZero() {
		m.eval.held.observe(now, kindsOf(holds))
	}
	m.eval.curHolds = holds
	st := State{Phase: m.Phase(), Cause: m.Cause(), Shape: m.cfg.StartShape(),
		Holds: slices.Clone(holds), Held: m.eval.held.result(), Since: now, End: end}
	if c := m.Cause(); c != CauseNone {
		st.Shape = m.shape(c)
		st.Triggered, st.Deadline = m.started, m.started.Add(m.gateDeadline())
	}
	if r, ok := m.Rotation(); ok {
		st.Rotation = &r
	}
	if old := m.state.Swap(&published{st: st, next: make(chan struct{})}); old != nil {
		close(old.next)
	}
}
