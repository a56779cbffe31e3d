package envoysim

import (
	"testing"
	"time"
)

// proactiveDrainDelay is Network::proactiveDrainDelay with window start 2/3
// and the drain_timeout as grace: a delay inside [2/3 d, d - grace] from
// the drain's start, none when that window is empty or already open.
func TestProactiveDrainDelay(t *testing.T) {
	for range 200 {
		d := proactiveDrainDelay(45*time.Second, 5*time.Second, 0)
		if d < 30*time.Second || d >= 40*time.Second {
			t.Fatalf("45 s drain, 5 s drain_timeout: %v, want in [30 s, 40 s)", d)
		}
		if d := proactiveDrainDelay(45*time.Second, 5*time.Second, 20*time.Second); d < 10*time.Second || d >= 20*time.Second {
			t.Fatalf("20 s into it: %v, want in [10 s, 20 s) from now", d)
		}
	}
	for _, c := range []struct{ drain, grace, elapsed time.Duration }{
		{15 * time.Second, 5 * time.Second, 0}, // window [10 s, 10 s]: empty
		{5 * time.Second, 5 * time.Second, 0},
		{0, 5 * time.Second, 0},
		{45 * time.Second, 5 * time.Second, 30 * time.Second}, // the window is open: accepted late
	} {
		if d := proactiveDrainDelay(c.drain, c.grace, c.elapsed); d != 0 {
			t.Errorf("%+v: %v, want none", c, d)
		}
	}
}
