package agent

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
)

// arrivals is drain.Arrivals (--min-drain auto): before the trigger,
// Envoy's accepted-connection counters (read at LIVE and at the trigger:
// nothing while Ready); after it, the tracker's changes (every new inbound
// flow, in eBPF mode). In sock_diag mode a connection shorter than the
// poll is never seen, so a counter is read every poll period during the
// wait instead: Envoy's for its listeners (the kernel's tracker still
// counts the app's own flows), or, when Envoy keeps none (Istio's default
// stats matcher), the kernel's own count of the namespace's accepted
// connections (PassiveOpens, passiveOpensPath), which also counts what the
// filter would leave out (the kubelet's probes, loopback hops): more
// arrivals, a later end, never an earlier one by a missed connection.
type arrivals struct {
	tr       *flows.Tracker
	fv       *flowView
	client   *envoy.Client
	outbound envoy.ExcludeSet
	log      *zap.Logger
	filter   arrivalFilter
	poll     time.Duration

	mu     sync.Mutex
	base   uint64
	baseAt time.Time
	known  bool // base read at LIVE
	count  arrivalCount
	stop   func()
}

// arrivalsConfig is what the counting knows of the pod.
type arrivalsConfig struct {
	// probePorts are the local ports only probes target.
	probePorts map[uint16]bool
	// nodeIP is the node's address (zero: unknown; the pod's default
	// gateways stand for the node either way).
	nodeIP netip.Addr
	// outbound are Envoy's listeners that take the app's own calls
	// (envoy.IstioOutbound under pilot-agent): never arrivals.
	outbound envoy.ExcludeSet
}

// newArrivals counts for the out-of-rotation rule.
func newArrivals(tr *flows.Tracker, fv *flowView, client *envoy.Client, cfg arrivalsConfig, log *zap.Logger) *arrivals {
	a := &arrivals{tr: tr, fv: fv, client: client, outbound: cfg.outbound, log: log, poll: flows.DefaultPollPeriod}
	r4, _ := os.Open("/proc/net/route")
	r6, _ := os.Open("/proc/net/ipv6_route")
	a.filter.peers.node = defaultGateways(r4, r6)
	if r4 != nil {
		r4.Close()
	}
	if r6 != nil {
		r6.Close()
	}
	if cfg.nodeIP.IsValid() {
		a.filter.peers.node = append(a.filter.peers.node, cfg.nodeIP.Unmap())
	}
	a.filter.peers.podNets = podNets(interfacePrefixes())
	a.filter.probePorts = cfg.probePorts
	a.filter.traffic = func(f *flows.Flow) bool { return fv.downstream(f) || fv.appFlow(f) }
	return a
}

// interfacePrefixes are the addresses of the namespace's interfaces, with
// their prefixes (none when they cannot be read: every peer that is not
// the node then counts as "other").
func interfacePrefixes() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		ones, bits := n.Mask.Size()
		if !ok || bits == 0 {
			continue
		}
		if bits == 32 {
			ip = ip.Unmap()
		}
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out
}

// total reads Envoy's accepted connections from outside the pod; ok is
// false when it could not, or Envoy keeps no such counter (a
// stats_matcher: the rate before the trigger is then unknown, not zero).
func (a *arrivals) total(ctx context.Context) (uint64, bool) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	n, counters, err := a.client.ArrivalTotal(ctx, a.outbound)
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
		before = drain.ArrivalsBefore{Known: true, Count: int64(now - a.base), Span: at.Sub(a.baseAt), Source: drain.RateFromEnvoy}
	}
	a.count.reset(at)
	// In sock_diag mode a counter is polled during the wait: Envoy's
	// (the kernel's tracker then counts the app's own flows only), else
	// the namespace's PassiveOpens (which counts them all).
	filter := a.filter
	var counter func(context.Context) (uint64, bool)
	var last uint64
	var counterName string
	if mode, _ := a.tr.Mode(); mode == flows.ModeSockDiag {
		if ok {
			counter, last, counterName = a.total, now, "envoy downstream_cx_total"
			filter.traffic = func(f *flows.Flow) bool { return !a.fv.downstream(f) && a.fv.appFlow(f) }
		} else if n, err := readPassiveOpens(); err == nil {
			counter, last, counterName = passiveOpensCounter, n, "kernel PassiveOpens"
			filter.traffic = func(*flows.Flow) bool { return false }
		} else {
			// Arrivals shorter than the poll then go unseen.
			a.log.Warn("no arrival counter: polling sees only longer ones", logevent.ArrivalsUncounted.Field(), zap.Error(err))
		}
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
				if k, ok := filter.arrival(&c); ok {
					a.count.add(c.Time, 1, k)
				}
			}
		}
	})
	if counter != nil {
		wg.Go(func() {
			tk := time.NewTicker(a.poll)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				if n, ok := counter(ctx); ok && n > last {
					a.count.add(time.Now(), int64(n-last), drain.PeerUnknown)
					last = n
				}
			}
		})
	}
	a.stop = func() { cancel(); wg.Wait(); unwatch() }
	a.log.Debug("counting new connections", zap.String("polled_counter", counterName), zap.Stringers("node_addrs", a.filter.peers.node),
		zap.Stringers("pod_nets", a.filter.peers.podNets), zap.Uint16s("probe_ports", slices.Sorted(maps.Keys(a.filter.probePorts))))
	return before
}

func (a *arrivals) Since() drain.ArrivalsSince { return a.count.since() }

// passiveOpensPath is the kernel's TCP counters of the reading thread's
// network namespace: the pod's, for draind.
const passiveOpensPath = "/proc/thread-self/net/snmp"

// passiveOpensCounter is readPassiveOpens as a polled counter.
func passiveOpensCounter(context.Context) (uint64, bool) {
	n, err := readPassiveOpens()
	return n, err == nil
}

func readPassiveOpens() (uint64, error) {
	f, err := os.Open(passiveOpensPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return passiveOpens(f)
}

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
