// Command rotationsim measures the out-of-rotation rule (drain.OutOfRotation)
// against simulated arrivals: for each arrival process, many drains whose
// connections keep coming until the endpoint removal has propagated, and
// the share of them the rule declares out of rotation before the last
// connection came (each one a connection that could find the proxy gone),
// and how long after the last connection it declares them out.
//
// It drives the rule as the drain machine does: evaluated at the trigger
// and at the moment each verdict names, a connection that came meanwhile
// seen then. docs/design.md "Out of rotation" gives its figures: run
// `go run ./rotationsim` in tools/.
//
// The arrivals are traffic alone, from whatever peer: the rule leaves the
// kubelet's probes out by the port they reach, not by their source, so
// they are not simulated. A probe that reaches a traffic port is one more
// arrival to the rule: a longer wait, never a shorter one. -rate-unknown
// simulates a pod whose rate before the trigger cannot be read (Istio's
// default stats matcher keeps no listener counter).
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/draind/draind/internal/drain"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rotationsim:", err)
		os.Exit(2)
	}
}

// process is an arrival process: gaps drawn with the given mean.
type process struct {
	name string
	rate float64 // connections per second
	gap  func(r *rand.Rand, mean float64) float64
}

func poisson(r *rand.Rand, mean float64) float64 { return r.ExpFloat64() * mean }

// pareto1_5 draws Pareto gaps with shape 1.5 and the given mean (scale
// mean/3): bursts, then long silences.
func pareto1_5(r *rand.Rand, mean float64) float64 {
	const alpha = 1.5
	xm := mean * (alpha - 1) / alpha
	return xm / math.Pow(1-r.Float64(), 1/alpha)
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rotationsim", flag.ContinueOnError)
	drains := fs.Int("drains", 4000, "drains per arrival process")
	propagation := fs.Duration("propagation", 3200*time.Millisecond, "arrivals go on this long after the trigger (the slowest removal measured)")
	before := fs.Duration("before", time.Minute, "how long the rate before the trigger was counted")
	seed := fs.Uint64("seed", 1, "random seed")
	unknown := fs.Bool("rate-unknown", false, "the rate before the trigger is unknown (no listener counter)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	procs := []process{
		{"Poisson 20/s", 20, poisson},
		{"Poisson 2/s", 2, poisson},
		{"Poisson 50/s", 50, poisson},
		{"Pareto α 1.5, 20/s", 20, pareto1_5},
		{"Pareto α 1.5, 2/s", 2, pareto1_5},
		{"Poisson 0.5/s", 0.5, poisson},
	}
	fmt.Fprintf(out, "%d drains each; arrivals until %s after the trigger; floor %s, ceiling %s; rate before known: %t\n", *drains, *propagation, drain.DefaultRotationFloor, drain.DefaultRotationCeiling, !*unknown)
	fmt.Fprintf(out, "%-22s %8s %14s %14s %8s\n", "arrivals", "early", "out−last p50", "out−last p99", "ceiling")
	r := rand.New(rand.NewPCG(*seed, 0))
	for _, p := range procs {
		var early, ceiling int
		var after []time.Duration
		for range *drains {
			res := simulate(r, p, *propagation, *before, *unknown)
			if res.early {
				early++
			}
			if res.why == drain.RotationCeiling {
				ceiling++
			}
			after = append(after, res.afterLast)
		}
		slices.Sort(after)
		fmt.Fprintf(out, "%-22s %7.2f%% %14s %14s %7.1f%%\n", p.name, 100*float64(early)/float64(*drains),
			after[len(after)/2].Round(time.Millisecond), after[len(after)*99/100].Round(time.Millisecond), 100*float64(ceiling)/float64(*drains))
	}
	return nil
}

type result struct {
	early     bool
	afterLast time.Duration // out minus the last arrival (or the trigger)
	why       drain.RotationReason
}

func simulate(r *rand.Rand, p process, propagation, beforeSpan time.Duration, unknown bool) result {
	start := time.Unix(1000, 0)
	mean := 1 / p.rate
	// The arrivals after the trigger, until the removal has propagated; the
	// process runs from well before the trigger, so the first gap is a
	// residual one.
	var arrivals []time.Time
	t := -10 * mean
	for {
		t += p.gap(r, mean)
		if t < 0 {
			continue
		}
		if t > propagation.Seconds() {
			break
		}
		arrivals = append(arrivals, start.Add(time.Duration(t*float64(time.Second))))
	}
	in := drain.RotationInput{
		Start:   start,
		Now:     start,
		Before:  drain.ArrivalsBefore{Known: true, Count: int64(p.rate * beforeSpan.Seconds()), Span: beforeSpan},
		Floor:   drain.DefaultRotationFloor,
		Ceiling: drain.DefaultRotationCeiling,
	}
	if unknown {
		in.Before = drain.ArrivalsBefore{}
	}
	next := 0
	for {
		v := drain.OutOfRotation(in)
		if next < len(arrivals) && arrivals[next].Before(v.At) {
			// A connection came before the named moment: seen when it came
			// (the machine sees it at its next evaluation; the verdict is
			// the same).
			in.Since.Add(start, arrivals[next], 1)
			in.Now = arrivals[next]
			next++
			continue
		}
		last := start
		if len(arrivals) > 0 {
			last = arrivals[len(arrivals)-1]
		}
		return result{early: next < len(arrivals), afterLast: v.At.Sub(last), why: v.Why}
	}
}
