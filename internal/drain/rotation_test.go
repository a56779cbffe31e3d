package drain

import (
	"testing"
	"time"
)

func TestOutOfRotation(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	at := func(n int) time.Time { return t0.Add(ms(n)) }
	floor, ceil := time.Second, 15*time.Second
	// Clients every 50 ms for 10 s before the trigger.
	busy := ArrivalsBefore{Known: true, Count: 200, Span: 10 * time.Second}
	// One every 2 s for a minute.
	slow := ArrivalsBefore{Known: true, Count: 30, Span: time.Minute}
	tests := []struct {
		name   string
		before ArrivalsBefore
		since  ArrivalsSince
		now    int // ms after the trigger
		out    bool
		at     int // ms after the trigger
		why    RotationReason
		window time.Duration
	}{
		{"busy, clients gone at once: the floor", busy, ArrivalsSince{}, 500, false, 1000, RotationFloor, ms(400)},
		{"busy, clients gone at once: out at the floor", busy, ArrivalsSince{}, 1000, true, 1000, RotationFloor, ms(400)},
		{"busy, clients stop 0.3 s after: the floor", busy, ArrivalsSince{Count: 6, First: at(50), Last: at(300), MaxGap: ms(50)}, 1000, true, 1000, RotationFloor, ms(400)},
		{"busy, clients stop 7 s after: quiet 400 ms later", busy, ArrivalsSince{Count: 140, First: at(50), Last: at(7000), MaxGap: ms(60)}, 7300, false, 7400, RotationQuiet, ms(400)},
		{"busy, clients stop 7 s after: out", busy, ArrivalsSince{Count: 140, First: at(50), Last: at(7000), MaxGap: ms(60)}, 7400, true, 7400, RotationQuiet, ms(400)},
		{"a hiccup since the trigger widens the window", busy, ArrivalsSince{Count: 100, First: at(50), Last: at(5000), MaxGap: ms(700)}, 5500, false, 6400, RotationQuiet, ms(1400)},
		{"clients thinning out: the rate since the trigger is the slower", busy, ArrivalsSince{Count: 10, First: at(100), Last: at(3000), MaxGap: ms(500)}, 3000, false, 5400, RotationQuiet, ms(2400)},
		{"20 ms gaps: the shortest window", ArrivalsBefore{Known: true, Count: 500, Span: 10 * time.Second}, ArrivalsSince{Count: 200, First: at(20), Last: at(4000), MaxGap: ms(40)}, 4250, true, 4250, RotationQuiet, MinQuiet},
		{"2 s gaps: 16 s of silence would prove it, the cap says 5", slow, ArrivalsSince{Count: 3, First: at(1000), Last: at(5000), MaxGap: ms(2000)}, 9000, false, 10000, RotationQuiet, QuietCap},
		{"2 s gaps: out 5 s after the last", slow, ArrivalsSince{Count: 3, First: at(1000), Last: at(5000), MaxGap: ms(2000)}, 10000, true, 10000, RotationQuiet, QuietCap},
		{"2 s gaps still coming at 12 s: the ceiling", slow, ArrivalsSince{Count: 6, First: at(1000), Last: at(12000), MaxGap: ms(2000)}, 15000, true, 15000, RotationCeiling, QuietCap},
		{"400 ms gaps: quiet for 3.2 s", ArrivalsBefore{Known: true, Count: 50, Span: 20 * time.Second}, ArrivalsSince{Count: 5, First: at(300), Last: at(2000), MaxGap: ms(450)}, 5200, true, 5200, RotationQuiet, ms(3200)},
		{"no connection ever: the cap, not the ceiling", ArrivalsBefore{Known: true, Span: time.Hour}, ArrivalsSince{}, 2000, false, 5000, RotationQuiet, QuietCap},
		{"rate unknown, nothing since: the recipe's 5 s, not 1 s", ArrivalsBefore{}, ArrivalsSince{}, 1000, false, 5000, RotationQuiet, UnknownQuiet},
		{"rate unknown, clients every 2 s: out 5 s after the last", ArrivalsBefore{}, ArrivalsSince{Count: 3, First: at(900), Last: at(4900), MaxGap: ms(2000)}, 9000, false, 9900, RotationQuiet, QuietCap},
		{"rate unknown, few arrivals since: too few for a rate", ArrivalsBefore{}, ArrivalsSince{Count: 10, First: at(100), Last: at(1000), MaxGap: ms(150)}, 1500, false, 6000, RotationQuiet, UnknownQuiet},
		{"rate unknown, enough arrivals since: their rate", ArrivalsBefore{}, ArrivalsSince{Count: RateSamples, First: at(100), Last: at(1600), MaxGap: ms(150)}, 1700, false, 2400, RotationQuiet, ms(800)},
		{"a ceiling below the floor's window: the ceiling wins", busy, ArrivalsSince{Count: 400, First: at(50), Last: at(14900), MaxGap: ms(60)}, 15000, true, 15000, RotationCeiling, ms(400)},
		{"a huge gap does not overflow", ArrivalsBefore{Known: true, Count: 0, Span: 1 << 62}, ArrivalsSince{}, 0, false, 5000, RotationQuiet, QuietCap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := RotationInput{Start: t0, Now: at(tt.now), Before: tt.before, Since: tt.since, Floor: floor, Ceiling: ceil}
			v := OutOfRotation(in)
			if v.Out != tt.out || !v.At.Equal(at(tt.at)) || v.Why != tt.why || v.Window != tt.window {
				t.Fatalf("got out=%v at=%s why=%s window=%s; want out=%v at=%s why=%s window=%s",
					v.Out, v.At.Sub(t0), v.Why, v.Window, tt.out, ms(tt.at), tt.why, tt.window)
			}
			if v.Quiet(in) == "" {
				t.Fatal("no account")
			}
		})
	}
}

// TestOutOfRotationBounds: whatever the arrivals, the pod is
// never out before the floor nor after the ceiling, and a new arrival
// never brings the moment earlier than the silence it ended.
func TestOutOfRotationBounds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	floor, ceil := 700*time.Millisecond, 9*time.Second
	for _, b := range []ArrivalsBefore{{}, {Known: true, Span: time.Second}, {Known: true, Count: 1e6, Span: time.Second}, {Known: true, Count: 3, Span: time.Hour}} {
		for _, last := range []time.Duration{0, time.Millisecond, 5 * time.Second, 8999 * time.Millisecond, 20 * time.Second} {
			s := ArrivalsSince{}
			if last > 0 {
				s = ArrivalsSince{Count: 1, First: t0.Add(last), Last: t0.Add(last), MaxGap: last}
			}
			v := OutOfRotation(RotationInput{Start: t0, Now: t0, Before: b, Since: s, Floor: floor, Ceiling: ceil})
			if d := v.At.Sub(t0); d < floor || d > ceil {
				t.Errorf("before %+v, last %s: out at %s, outside [%s, %s]", b, last, d, floor, ceil)
			}
			if last > 0 && last < ceil && v.At.Before(t0.Add(last)) {
				t.Errorf("before %+v, last %s: out at %s, before the last arrival", b, last, v.At.Sub(t0))
			}
		}
	}
}
