package flows

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testutil"
)

// BenchmarkTrackerNotify measures the time from close() of a flow's last
// end to the tracker's subscriber being notified that no app flow holds,
// with eBPF events and with sock_diag polling at 100 ms and at 1 s.
// Run: go test -run '^$' -bench TrackerNotify -benchtime 50x ./internal/conntrack
func BenchmarkTrackerNotify(b *testing.B) {
	for _, tc := range []struct {
		name   string
		mode   string
		period time.Duration
	}{
		{"ebpf", ModeEBPF, 0},
		{"sockdiag-100ms", ModeSockDiag, 100 * time.Millisecond},
		{"sockdiag-1s", ModeSockDiag, time.Second},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ns := testutil.NewNetNS(b)
			h, err := namespace.Open(ns.Path())
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			tr, err := OpenTracker(h, TrackerConfig{Mode: tc.mode, PollPeriod: tc.period, Policy: DefaultPolicy()})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			ctx := b.Context()
			go tr.Run(ctx)
			var ln net.Listener
			ns.Do(b, func() { ln, err = net.Listen("tcp4", "127.0.0.1:9000") })
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			sub, unsub := tr.Subscribe()
			defer unsub()
			waitFor := func(cond func(Summary) bool) {
				deadline := time.After(10 * time.Second)
				for !cond(tr.Summary()) {
					select {
					case <-sub:
					case <-deadline:
						b.Fatalf("summary %+v", tr.Summary())
					}
				}
			}
			var lat []time.Duration
			for b.Loop() {
				var c net.Conn
				ns.Do(b, func() { c, err = net.Dial("tcp4", "127.0.0.1:9000") })
				if err != nil {
					b.Fatal(err)
				}
				s, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				waitFor(func(s Summary) bool { return s.AppHolding() == 2 })
				// Drain stale notifications, then close both ends.
				select {
				case <-sub:
				default:
				}
				c.Close()
				t0 := time.Now()
				s.Close()
				waitFor(func(s Summary) bool { return s.AppHolding() == 0 })
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[(len(lat)-1)*99/100]), "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
