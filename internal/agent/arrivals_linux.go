package agent

import (
	"context"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
)

// arrivals is drain.Arrivals (--min-drain auto): before the trigger,
// Envoy's accepted-connection counters (read at LIVE and at the trigger:
// nothing while Ready); after it, the tracker's changes (every new inbound
// flow, in eBPF mode), and in sock_diag mode, where a connection shorter
// than the poll is never seen, Envoy's counters read every poll period
// during the wait instead for Envoy's listeners.
type arrivals struct {
	tr     *flows.Tracker
	fv     *flowView
	client *envoy.Client
	log    *zap.Logger
	filter arrivalFilter
	poll   time.Duration

	mu     sync.Mutex
	base   uint64
	baseAt time.Time
	known  bool // base read at LIVE
	count  arrivalCount
	stop   func()
}

func newArrivals(tr *flows.Tracker, fv *flowView, client *envoy.Client, log *zap.Logger) *arrivals {
	a := &arrivals{tr: tr, fv: fv, client: client, log: log, poll: flows.DefaultPollPeriod}
	r4, _ := os.Open("/proc/net/route")
	r6, _ := os.Open("/proc/net/ipv6_route")
	a.filter.probeSources = defaultGateways(r4, r6)
	if r4 != nil {
		r4.Close()
	}
	if r6 != nil {
		r6.Close()
	}
	a.filter.traffic = func(f *flows.Flow) bool { return fv.downstream(f) || fv.appFlow(f) }
	return a
}

// total reads Envoy's accepted connections; ok is false when it could not,
// or Envoy keeps no such counter (a stats_matcher: the rate before the
// trigger is then unknown, not zero).
func (a *arrivals) total(ctx context.Context) (uint64, bool) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	n, counters, err := a.client.DownstreamTotal(ctx)
	return n, err == nil && counters > 0
}

// atLive reads the baseline: the rate before the trigger is counted from
// Envoy's LIVE on.
func (a *arrivals) atLive(ctx context.Context) {
	n, ok := a.total(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if ok && !a.known {
		a.base, a.baseAt, a.known = n, time.Now(), true
	}
}

// Begin reads what arrived since LIVE, and starts counting.
func (a *arrivals) Begin(at time.Time) drain.ArrivalsBefore {
	now, ok := a.total(context.Background())
	a.mu.Lock()
	defer a.mu.Unlock()
	var before drain.ArrivalsBefore
	if ok && a.known && now >= a.base {
		before = drain.ArrivalsBefore{Known: true, Count: int64(now - a.base), Span: at.Sub(a.baseAt)}
	}
	a.count.reset(at)
	mode, _ := a.tr.Mode()
	fromCounter := ok && mode == flows.ModeSockDiag
	filter := a.filter
	if fromCounter {
		// Envoy's listeners are counted by Envoy; the kernel counts the
		// app's own inbound flows only.
		filter.traffic = func(f *flows.Flow) bool { return !a.fv.downstream(f) && a.fv.appFlow(f) }
	}
	ch, unwatch := a.tr.Watch(4096)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-ch:
				if filter.arrival(&c) {
					a.count.add(c.Time, 1)
				}
			}
		}
	})
	if fromCounter {
		wg.Go(func() {
			last := now
			tk := time.NewTicker(a.poll)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				if n, ok := a.total(ctx); ok && n > last {
					a.count.add(time.Now(), int64(n-last))
					last = n
				}
			}
		})
	}
	a.stop = func() { cancel(); wg.Wait(); unwatch() }
	a.log.Debug("counting new connections", zap.Bool("envoy_counters", fromCounter), zap.Stringers("probe_sources", a.filter.probeSources))
	return before
}

func (a *arrivals) Since() drain.ArrivalsSince { return a.count.since() }

// End stops the counting (safe twice, and before Begin).
func (a *arrivals) End() {
	a.mu.Lock()
	stop := a.stop
	a.stop = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}
