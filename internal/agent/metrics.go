package agent

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/flows"
)

// metrics are draind's Prometheus metrics. Every value is read at scrape
// time from the part that owns it: no goroutine keeps them up to date.
//
// reg is draind's own, served to everyone who reaches /metrics (the pod
// network included). The Go runtime's and the process collectors are
// served beside them only to the pod's loopback callers (withRuntime):
// the process collector reads the network namespace's byte counters
// (/proc/self/net/dev), which a neighbour must not get from the pod IP
// (issue 43); the pod's containers read them in /proc/net/dev anyway.
type metrics struct {
	reg         *prometheus.Registry
	withRuntime http.Handler
}

// oneOf is a GaugeVec-like collector whose one labelled series reads 1,
// the others 0: the state enums (phase, trigger, ...), read at scrape time.
type oneOf struct {
	desc   *prometheus.Desc
	values []string
	now    func() string
}

func (o oneOf) Describe(ch chan<- *prometheus.Desc) { ch <- o.desc }
func (o oneOf) Collect(ch chan<- prometheus.Metric) {
	cur := o.now()
	for _, v := range o.values {
		n := 0.0
		if v == cur {
			n = 1
		}
		ch <- prometheus.MustNewConstMetric(o.desc, prometheus.GaugeValue, n, v)
	}
}

func newOneOf(name, help, label string, values []string, now func() string) oneOf {
	return oneOf{desc: prometheus.NewDesc(name, help, []string{label}, nil), values: values, now: now}
}

func names[T interface{ String() string }](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

// recentFor is how long recent's value serves: the series of one scrape
// are read one after the other, within it.
const recentFor = 100 * time.Millisecond

// recent returns read, called at most once per recentFor: a dormant
// tracker answers each read with a dump of the namespace, and one scrape
// reads the counts nine times. No timer: nothing runs between scrapes.
func recent[T any](read func() T) func() T {
	var mu sync.Mutex
	var at time.Time
	var v T
	return func() T {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); at.IsZero() || now.Sub(at) >= recentFor {
			v, at = read(), now
		}
		return v
	}
}

func newMetrics(a *agent) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	// The Go runtime's own (heap in use, goroutines, GC): draind's
	// footprint, for loopback callers (tools/bench reads the heap).
	rt := prometheus.NewRegistry()
	rt.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.withRuntime = promhttp.HandlerFor(prometheus.Gatherers{m.reg, rt}, promhttp.HandlerOpts{})
	gauge := func(name, help string, get func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, get)
	}
	flowsOf := func(class string, get func() int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "draind_tracked_flows", Help: "Sockets the tracker sees, by class.", ConstLabels: prometheus.Labels{"class": class},
		}, func() float64 { return float64(get()) })
	}
	sum, mc := recent(a.tracker.Summary), a.machine
	m.reg.MustRegister(
		newOneOf("draind_phase", "1 for the drain phase draind is in.", "phase", names(drain.Phases),
			func() string { return mc.Phase().String() }),
		newOneOf("draind_drain_trigger", "1 for what started the drain (none before).", "trigger",
			append([]string{drain.CauseNone.String()}, names(drain.Causes)...), func() string { return mc.Cause().String() }),
		newOneOf("draind_drain_listeners", "1 for where POST /drain_listeners stands.", "state",
			names(drain.DrainListenersStates), func() string { s, _ := mc.DrainListeners(); return s.String() }),
		gauge("draind_drain_listeners_attempts", "POST /drain_listeners calls made.", func() float64 { _, n := mc.DrainListeners(); return float64(n) }),
		newOneOf("draind_envoy_listener_gauges", "1 for whether Envoy keeps downstream_cx_active listener gauges (absent: the kernel decides alone).", "state",
			names(drain.GaugesStates), func() string { return mc.Gauges().String() }),
		gauge("draind_drain_duration_seconds", "Time from the drain's trigger to the proxy's stop (set once stopping).",
			func() float64 { return mc.DrainDuration().Seconds() }),
		gauge("draind_out_of_rotation_seconds", "--min-drain auto: time from the trigger to the pod out of rotation (0 before, or with a fixed min-drain).",
			func() float64 { r, _ := mc.Rotation(); return r.Took.Seconds() }),
		gauge("draind_out_of_rotation_connections", "--min-drain auto: new connections from outside the pod counted from the trigger to the end of the wait.",
			func() float64 { r, _ := mc.Rotation(); return float64(r.Connections) }),
		newOneOf("draind_out_of_rotation_reason", "1 for why --min-drain auto's wait ended: quiet (no new connection for the window), floor, ceiling (none before).", "reason",
			append([]string{"none"}, names(drain.RotationReasons)...), func() string { r, _ := mc.Rotation(); return r.Why.String() }),
		gauge("draind_untold_keepalives_closed", "Envoy's downstream keep-alives idle since before its drain began, closed as the pod left rotation (--close-idle-keepalives; 0 before).",
			func() float64 { r, _ := mc.Untold(); return float64(r.Closed) }),
		gauge("draind_untold_keepalives_left", "Those found and not closed: gone meanwhile, or refused (no ptrace access to the proxy: the log's untold_closed line says why).",
			func() float64 { r, _ := mc.Untold(); return float64(r.Found - r.Closed) }),
		flowsOf("app_listeners", func() int { return sum().AppListeners }),
		flowsOf("app_inbound", func() int { return sum().AppInbound }),
		flowsOf("app_outbound", func() int { return sum().AppOutbound }),
		flowsOf("app_idle", func() int { return sum().AppIdle }),
		flowsOf("proxy_listeners", func() int { return sum().ProxyListeners }),
		flowsOf("proxy_flows", func() int { return sum().ProxyFlows }),
		flowsOf("proxy_idle", func() int { return sum().ProxyIdle }),
		flowsOf("control", func() int { return sum().Control }),
		flowsOf("closing", func() int { return sum().Closing }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "draind_tracker_lost_events_total", Help: "TCP state events the kernel could not queue (each followed by a resync).",
		}, func() float64 { return float64(a.tracker.Lost()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "draind_tracker_resyncs_total", Help: "Full sock_diag snapshots taken after the first.",
		}, func() float64 { return float64(a.tracker.Resyncs()) }),
		newOneOf("draind_tracker_info", "1 for the tracker mode that runs now (it can fall back to polling).", "mode",
			names(flows.RunningModes), func() string { mode, _ := a.tracker.Mode(); return string(mode) }),
		gauge("draind_app_processes", "The app's processes in the pod's network namespace (-1: not followed).", func() float64 {
			if a.procs == nil {
				return -1
			}
			return float64(a.procs.Count())
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "draind_app_process_lost_events_total", Help: "Process events the kernel could not queue (each followed by a resync of the app's processes).",
		}, func() float64 {
			if a.procs == nil {
				return 0
			}
			return float64(a.procs.Lost())
		}),
		newOneOf("draind_app_liveness", "1 for how draind tells the app is done: complete (every process of the namespace seen), partial (processes seen, zero is no proof: sockets decide too), sockets.", "source",
			[]string{"complete", "partial", "sockets"}, func() string {
				switch {
				case a.procs == nil:
					return "sockets"
				case a.procs.Coverage().Complete:
					return "complete"
				}
				return "partial"
			}),
		gauge("draind_host_network", "1 when the pod shares the node's network namespace.", func() float64 {
			if a.hostNet {
				return 1
			}
			return 0
		}),
	)
	return m
}
