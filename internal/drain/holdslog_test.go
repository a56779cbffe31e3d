package drain

import (
	"testing"
	"time"
)

func TestHoldsLog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	app, appEnvoy := uint32(1<<HoldAppProcs), uint32(1<<HoldAppProcs|1<<HoldEnvoyActive)
	type step struct {
		kinds    uint32
		at       time.Duration
		log      bool
		unlogged int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"each new set is logged", []step{{appEnvoy, 0, true, 0}, {app, 100 * time.Millisecond, true, 0}, {0, 200 * time.Millisecond, true, 0}}},
		{"a flapping set is left out, counted, and logged again after the quiet", []step{
			{appEnvoy, 0, true, 0}, {app, 100 * time.Millisecond, true, 0},
			{appEnvoy, 200 * time.Millisecond, false, 0}, {app, 300 * time.Millisecond, false, 0}, {appEnvoy, 400 * time.Millisecond, false, 0},
			{app, HoldsRelogAfter + 100*time.Millisecond, true, 3},
			{appEnvoy, HoldsRelogAfter + 200*time.Millisecond, true, 0},
			{app, HoldsRelogAfter + 300*time.Millisecond, false, 0},
		}},
		{"a set back after the quiet is logged", []step{{app, 0, true, 0}, {appEnvoy, time.Second, true, 0}, {app, HoldsRelogAfter, true, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l holdsLog
			for i, s := range tc.steps {
				log, unlogged := l.change(s.kinds, t0.Add(s.at))
				if log != s.log || unlogged != s.unlogged {
					t.Errorf("step %d (kinds %b at +%s): log %v unlogged %d, want %v %d", i, s.kinds, s.at, log, unlogged, s.log, s.unlogged)
				}
			}
		})
	}
}
