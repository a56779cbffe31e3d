package drain

import (
	"slices"
	"sync"
	"testing"
	"time"
)

func TestHoldTimes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms    int
		kinds []HoldKind
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  []HeldFor
	}{
		{"nothing held", []step{{0, nil}, {500, nil}}, nil},
		{"one kind, then released", []step{{0, []HoldKind{HoldMinDrain}}, {5000, nil}},
			[]HeldFor{{HoldMinDrain, 5 * time.Second}}},
		{"two at once count each", []step{{0, []HoldKind{HoldAppProcs, HoldEnvoyKernel}}, {300, []HoldKind{HoldEnvoyKernel}}, {1000, nil}},
			[]HeldFor{{HoldAppProcs, 300 * time.Millisecond}, {HoldEnvoyKernel, time.Second}}},
		{"a kind back later adds up", []step{{0, []HoldKind{HoldAppFlows}}, {100, nil}, {200, []HoldKind{HoldAppFlows}}, {450, nil}},
			[]HeldFor{{HoldAppFlows, 350 * time.Millisecond}}},
		{"first-held order", []step{{0, []HoldKind{HoldSettle}}, {10, []HoldKind{HoldAppProcs, HoldSettle}}, {20, nil}},
			[]HeldFor{{HoldSettle, 20 * time.Millisecond}, {HoldAppProcs, 10 * time.Millisecond}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h holdTimes
			for _, s := range tc.steps {
				h.observe(at(s.ms), s.kinds)
			}
			if got := h.result(); !slices.Equal(got, tc.want) {
				t.Errorf("held %v, want %v", got, tc.want)
			}
		})
	}
}

// recordingReporter keeps what the machine reported.
type recordingReporter struct {
	mu           sync.Mutex
	began, ended []State
}

func (r *recordingReporter) DrainBegan(s State) {
	r.mu.Lock()
	r.began = append(r.began, s)
	r.mu.Unlock()
}
func (r *recordingReporter) DrainEnded(s State) {
	r.mu.Lock()
	r.ended = append(r.ended, s)
	r.mu.Unlock()
}

func (r *recordingReporter) got() (began, ended []State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.began), slices.Clone(r.ended)
}

func withReporter(rep *recordingReporter) rigOption {
	return func(r *rig, _ *Config) { r.reporter = rep }
}

func TestStatePublished(t *testing.T) {
	t.Run("a clean drain held by the app", inBubble(func(t *testing.T) {
		rep := &recordingReporter{}
		r := newRig(t, withReporter(rep))
		r.waitPublished(Ready)
		if st := r.m.State(); st.Phase != Ready || st.Cause != CauseNone || !st.Triggered.IsZero() || st.End != nil {
			t.Fatalf("ready: %+v", st)
		}
		start := time.Now()
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.waitFor("the app's hold published", func() bool {
			st := r.m.State()
			return len(st.Holds) == 1 && st.Holds[0].Kind == HoldAppProcs
		})
		st := r.m.State()
		if !st.Triggered.Equal(start) || !st.Deadline.Equal(start.Add(r.m.Config().GateDeadline())) || st.Shape != ShapeClassicSidecar {
			t.Errorf("gating: %+v", st)
		}
		time.Sleep(2 * time.Second)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		began, ended := rep.got()
		if len(began) != 1 || began[0].Phase != Draining || len(began[0].Holds) != 1 || began[0].Holds[0].Kind != HoldMinDrain {
			t.Errorf("began %+v", began)
		}
		if len(ended) != 1 {
			t.Fatalf("ended %+v", ended)
		}
		e := ended[0]
		if e.Phase != Exited || e.End == nil || !e.End.Clean || e.End.Cut || !e.End.ExitCodeKnown || e.End.ExitCode != 0 || len(e.Holds) != 0 {
			t.Errorf("end %+v %+v", e, e.End)
		}
		want := []HeldFor{{HoldMinDrain, r.m.Config().MinDrain}, {HoldAppProcs, 2 * time.Second}} // the app held from Gating until it exited
		if !slices.Equal(e.Held, want) {
			t.Errorf("held %v, want %v", e.Held, want)
		}
		if l, _ := e.Longest(); l.Kind != HoldAppProcs {
			t.Errorf("longest %v", l)
		}
		if got := r.m.State(); got.Phase != Exited || got.End == nil {
			t.Errorf("state after the end %+v", got)
		}
	}))
	t.Run("the deadline cuts", inBubble(func(t *testing.T) {
		rep := &recordingReporter{}
		r := newRig(t, withReporter(rep), withConfig(func(c *Config) { c.Deadline = time.Second }), setup(func(r *rig) {
			r.flows.holding = []OpenFlow{{Owner: "app", Direction: "inbound", State: "ESTABLISHED"}}
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, false, "deadline")
		_, ended := rep.got()
		if len(ended) != 1 || ended[0].End == nil || !ended[0].End.Cut || ended[0].End.OpenFlows != 1 || ended[0].End.AppProcesses != 1 {
			t.Fatalf("ended %+v", ended)
		}
	}))
	t.Run("no drain, no report", inBubble(func(t *testing.T) {
		rep := &recordingReporter{}
		r := newRig(t, withReporter(rep))
		r.waitPhase(Ready)
		r.proxy.exit(3)
		r.wantResult(r.result(), 3, false, "before any drain")
		if began, ended := rep.got(); len(began)+len(ended) != 0 {
			t.Errorf("reported %v %v", began, ended)
		}
		if st := r.m.State(); st.Phase != Exited || st.End == nil || st.End.ExitCode != 3 {
			t.Errorf("state %+v", st)
		}
	}))
}
