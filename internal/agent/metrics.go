package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are draind's Prometheus metrics, read at scrape time where they
// come from a live source (no goroutine keeps them up to date).
type metrics struct {
	reg           *prometheus.Registry
	phase         *prometheus.GaugeVec
	drainDuration prometheus.Gauge
	quitLatency   prometheus.Gauge
}

func newMetrics(a *Agent) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.phase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "draind_phase", Help: "1 for the drain phase draind is in.",
	}, []string{"phase"})
	m.drainDuration = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "draind_drain_duration_seconds", Help: "Time from the drain's start to the proxy's stop (set once stopping).",
	})
	m.quitLatency = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "draind_gate_open_to_quit_seconds", Help: "Time from the gate opening to /quitquitquit being sent.",
	})
	flows := func(class string, get func() int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "draind_tracked_flows", Help: "Sockets the tracker sees, by class.", ConstLabels: prometheus.Labels{"class": class},
		}, func() float64 { return float64(get()) })
	}
	sum := a.tracker.Summary
	m.reg.MustRegister(m.phase, m.drainDuration, m.quitLatency,
		flows("app_listeners", func() int { return sum().AppListeners }),
		flows("app_inbound", func() int { return sum().AppInbound }),
		flows("app_outbound", func() int { return sum().AppOutbound }),
		flows("app_idle", func() int { return sum().AppIdle }),
		flows("proxy_listeners", func() int { return sum().ProxyListeners }),
		flows("proxy_flows", func() int { return sum().ProxyFlows }),
		flows("closing", func() int { return sum().Closing }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "draind_tracker_lost_events_total", Help: "TCP state events the kernel could not queue (each followed by a resync).",
		}, func() float64 { return float64(a.tracker.Lost()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "draind_tracker_resyncs_total", Help: "Full sock_diag snapshots taken after the first.",
		}, func() float64 { return float64(a.tracker.Resyncs()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "draind_tracker_info", Help: "1, labelled with the tracker mode.", ConstLabels: prometheus.Labels{"mode": a.trackerMode},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "draind_app_processes", Help: "The app's processes in the pod's network namespace (-1: not visible).",
		}, func() float64 {
			if a.procs == nil {
				return -1
			}
			return float64(a.procs.Count())
		}),
	)
	return m
}

func (m *metrics) setPhase(p Phase) {
	for _, q := range allPhases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.phase.WithLabelValues(q.String()).Set(v)
	}
}
