package drain

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

func TestUntold(t *testing.T) {
	ms := time.Millisecond
	measured := time.Date(2026, 11, 28, 12, 0, 10, 0, time.UTC)
	told := measured.Add(-3 * time.Second) // drain_listeners succeeded 3 s before the snapshot
	for _, tc := range []struct {
		name     string
		idle     time.Duration
		toldFrom time.Time
		want     bool
	}{
		{"idle since before the drain: never told", 5 * time.Second, told, true},
		{"last response just after the drain began: told", 2900 * ms, told, false},
		{"last response a jiffy after: may have read as before", 3010 * ms, told, true},
		{"within the margin", 3 * time.Second, told, true},
		{"past the margin after", 2970 * ms, told, false},
		{"busy or just answered (idle 0)", 0, told, false},
		{"born after the snapshot (-1)", -ms, told, false},
		{"drain never sent: every parked flow", 300 * ms, time.Time{}, true},
		{"drain never sent: not yet parked", 150 * ms, time.Time{}, false},
		{"told long ago, parked only just", ParkedAfter, measured.Add(-10 * time.Second), false},
		{"drain sent just now: idle a while", 250 * ms, measured.Add(-10 * ms), true},
		{"drain sent just now: idle less than ParkedAfter", 100 * ms, measured.Add(-10 * ms), false},
	} {
		if got := Untold(tc.idle, measured, tc.toldFrom); got != tc.want {
			t.Errorf("%s: Untold(%v) = %v, want %v", tc.name, tc.idle, got, tc.want)
		}
	}
}

func TestUntoldRule(t *testing.T) {
	told := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		dlDone   bool
		toldFrom time.Time
		want     string
	}{
		{true, told, "idle since before drain_listeners succeeded"},
		{true, time.Time{}, "every parked flow: Envoy's gradual drain tells no client for sure"},
		{false, time.Time{}, "every parked flow: drain_listeners never succeeded"},
	} {
		if got := UntoldRule(tc.dlDone, tc.toldFrom); got != tc.want {
			t.Errorf("UntoldRule(%t, %v) = %q, want %q", tc.dlDone, tc.toldFrom, got, tc.want)
		}
	}
}

// fakeUntold records the machine's calls: when, with what, and what the
// published State said then.
type fakeUntold struct {
	m   **Machine
	res UntoldClosed

	mu    sync.Mutex // calls: written by the machine's goroutine, read by the test's
	calls []untoldCall
}

type untoldCall struct {
	at, toldFrom time.Time
	published    Phase
}

func (f *fakeUntold) CloseUntold(toldFrom time.Time) UntoldClosed {
	c := untoldCall{time.Now(), toldFrom, (*f.m).State().Phase}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	r := f.res
	r.ToldFrom = toldFrom // as the agent's closer under an immediate drain
	return r
}

func (f *fakeUntold) recorded() []untoldCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]untoldCall(nil), f.calls...)
}

// TestUntoldClosedAsMinDrainEnds: the machine closes the untold
// keep-alives once, as the min-drain ends, before it publishes Gating
// (which ends the app's out-of-rotation wait), with toldFrom the moment
// drain_listeners succeeded; what failed is a warning.
func TestUntoldClosedAsMinDrainEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		res   UntoldClosed
		lines int
		level string
	}{
		{"none found: no line", UntoldClosed{}, 0, ""},
		{"two closed", UntoldClosed{Found: 2, Closed: 2}, 1, "info"},
		{"one refused", UntoldClosed{Found: 2, Closed: 1, Err: errors.New("no access")}, 1, "warn"},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			var m *Machine
			fu := &fakeUntold{m: &m, res: tc.res}
			r := newRig(t, func(r *rig, c *Config) { r.untold = fu; c.MinDrain = 2 * time.Second })
			m = r.m
			r.waitPhase(Ready)
			r.m.Trigger(CauseSignal)
			r.waitPhase(Draining)
			start := time.Now()
			r.waitFor("drain_listeners", func() bool { s, _ := r.m.DrainListeners(); return s == DrainListenersDone })
			r.notDone(time.Second)
			if calls := fu.recorded(); len(calls) != 0 {
				t.Fatalf("called during the min-drain: %+v", calls)
			}
			r.apps.exit()
			r.wantResult(r.result(), 0, true, "drained")
			calls := fu.recorded()
			if len(calls) != 1 {
				t.Fatalf("%d calls, want 1; log:\n%s", len(calls), r.log())
			}
			c := calls[0]
			if c.at.Sub(start) != 2*time.Second || c.published != Draining || c.toldFrom.IsZero() || c.toldFrom.After(c.at) {
				t.Errorf("call %+v: want at the min-drain's end (%s), Gating not yet published, told from drain_listeners' success", c, start.Add(2*time.Second))
			}
			lines := r.lines(logevent.UntoldClosed).All()
			if len(lines) != tc.lines || tc.lines == 1 && lines[0].Level.String() != tc.level {
				t.Errorf("untold_closed lines %v, want %d at %s", lines, tc.lines, tc.level)
			}
			if want := UntoldRule(true, c.toldFrom); tc.lines == 1 && lines[0].ContextMap()["rule"] != want {
				t.Errorf("untold_closed rule %v, want %q", lines[0].ContextMap()["rule"], want)
			}
		}))
	}
}
