package flows

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/testenv/testutil"
)

// BenchmarkTrackerNotify measures the time from close() of a flow's last
// end to the tracker's subscriber being notified that no app flow holds,
// with eBPF events and with sock_diag polling at 100 ms and at 1 s.
// Run: go test -run '^$' -bench TrackerNotify -benchtime 50x ./internal/flows
func BenchmarkTrackerNotify(b *testing.B) {
	for _, tc := range []struct {
		name   string
		mode   TrackerMode
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

// BenchmarkTrackerThroughput measures state changes through the whole
// tracker (probe, ring, table, subscribers) at full speed: several threads
// open a listener and close it (2 changes, no packets) in a loop, for each
// ring size. Metrics: changes/s the table applied, events the kernel could
// not queue (lost) and the resyncs they caused.
// Run: go test -run '^$' -bench TrackerThroughput -benchtime 50000x ./internal/flows
func BenchmarkTrackerThroughput(b *testing.B) {
	// The default (probes.DefaultTCPRingSize, held while Ready) and larger;
	// as fast as 4 threads can (a burst far past any pod's drain), and paced
	// at the target rate of 100k changes/s.
	type run struct{ ring, rate int }
	var runs []run
	for _, ring := range []int{probes.DefaultTCPRingSize, 1 << 20, 2 << 20, 8 << 20} {
		runs = append(runs, run{ring, 0})
	}
	runs = append(runs, run{probes.DefaultTCPRingSize, 100_000})
	for _, r := range runs {
		ring := r.ring
		name := fmt.Sprintf("ring-%dKiB", ring>>10)
		if r.rate > 0 {
			name += fmt.Sprintf("/paced-%dk", r.rate/1000)
		}
		b.Run(name, func(b *testing.B) {
			testutil.RequireBTF(b)
			ns := testutil.NewNetNS(b)
			h, err := namespace.Open(ns.Path())
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			tr, err := OpenTracker(h, TrackerConfig{Mode: ModeEBPF, RingSize: ring, Policy: DefaultPolicy()})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- tr.Run(ctx) }()
			defer func() { cancel(); <-done }()
			var applied atomic.Int64
			changes, unwatch := tr.Watch(1 << 16)
			defer unwatch()
			go func() {
				for range changes {
					applied.Add(1)
				}
			}()
			workers := 4
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			// Each op is two changes (CLOSE->LISTEN, LISTEN->CLOSE).
			opsPerWorker := float64(r.rate) / 2 / float64(workers)
			for w := range workers {
				n := b.N / workers
				wg.Go(func() {
					ns.Do(b, func() {
						for i := range n {
							if opsPerWorker > 0 && i%32 == 0 {
								due := start.Add(time.Duration(float64(i) / opsPerWorker * float64(time.Second)))
								time.Sleep(time.Until(due))
							}
							fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
							if err != nil {
								b.Error(err)
								return
							}
							unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
							unix.Listen(fd, 1)
							unix.Close(fd)
						}
					})
					_ = w
				})
			}
			wg.Wait()
			want := int64(2 * (b.N / workers) * workers)
			for deadline := time.Now().Add(10 * time.Second); applied.Load() < want && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(applied.Load())/elapsed.Seconds(), "changes/s")
			b.ReportMetric(float64(tr.Lost()), "lost")
			b.ReportMetric(float64(tr.Resyncs()), "resyncs")
			b.ReportMetric(float64(tr.Dropped()), "watch-dropped")
			b.ReportMetric(0, "ns/op")
		})
	}
}
