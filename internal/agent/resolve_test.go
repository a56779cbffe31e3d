package agent

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/logevent"
)

// resolveWant is what a Resolve case checks.
type resolveWant struct {
	deadline, minDrain, ceiling time.Duration
	statusAddr, adminAddr       string
	proxy                       istio.ProxyKind
	src                         Sources
	// warnings are the start-up warnings' events, in the log's order.
	warnings []logevent.Event
}

// TestResolve: flags and their variables (as internal/cli gives them),
// Istio's settings from the environment and the pod's annotations, the
// defaults, the grace period, and the deadlines as Reconcile leaves them.
func TestResolve(t *testing.T) {
	const pa = "/usr/local/bin/pilot-agent"
	const besidePilotAgent = "beside pilot-agent (the first port Istio leaves free)"
	dflt := drain.DefaultConfig()
	reserve := dflt.StopReserve()
	// want is the defaults' resolution for Envoy, changed by set.
	want := func(set func(*resolveWant)) resolveWant {
		w := resolveWant{deadline: drain.DefaultDeadline, minDrain: drain.DefaultMinDrain, ceiling: drain.DefaultRotationCeiling,
			statusAddr: DefaultStatusAddr, adminAddr: DefaultAdminAddr, proxy: istio.ProxyEnvoy,
			src: Sources{Deadline: fromDefault, GracePeriod: fromUnset, StatusAddr: fromDefault, AdminAddr: fromDefault, Proxy: fromProxyCommand}}
		if set != nil {
			set(&w)
		}
		return w
	}
	pilotAgent := func(w *resolveWant) {
		w.proxy, w.statusAddr, w.src.StatusAddr = istio.ProxyPilotAgent, ":15022", besidePilotAgent
	}
	deadline := func(d time.Duration, source string) func(*Config) {
		return func(c *Config) { c.Drain.Deadline, c.DeadlineSet, c.DeadlineSource = d, true, source }
	}
	grace := func(d time.Duration, source string) func(*Config) {
		return func(c *Config) { c.GracePeriod, c.GracePeriodSource = d, source }
	}
	fixedMinDrain := func(c *Config) { c.Drain.MinDrainAuto, c.Drain.MinDrain = false, 30*time.Second }
	ceiling := func(c *Config) { c.Drain.RotationCeiling, c.Drain.RotationCeilingSet = 30*time.Second, true }
	proxyConfig := func(doc string) map[string]string { return map[string]string{istio.ProxyConfigEnv: doc} }
	// deadline20 is a 20 s deadline's resolution: the default ceiling is
	// cut, without a word, to what its gate deadline allows.
	deadline20 := func(w *resolveWant, from string) {
		short := drain.DefaultConfig()
		short.Deadline = 20 * time.Second
		w.deadline, w.src.Deadline = short.Deadline, from
		w.ceiling, w.src.Reconciled = short.GateDeadline(), []string{ReconciledCeiling}
	}

	tests := []struct {
		name string
		cmd  string
		// set are the flags and their variables, as internal/cli sets them.
		set         []func(*Config)
		env         map[string]string
		annotations string
		want        resolveWant
	}{
		{name: "defaults, Envoy", cmd: "envoy", want: want(nil)},
		{name: "defaults, pilot-agent", cmd: pa, want: want(pilotAgent)},
		{name: "--proxy pilot-agent", cmd: "envoy", set: []func(*Config){func(c *Config) { c.ProxyKind = istio.ProxyPilotAgent }},
			want: want(func(w *resolveWant) { pilotAgent(w); w.src.Proxy = fromProxyGiven })},

		// The drain deadline: a flag or variable, the grace period, Istio's
		// terminationDrainDuration, the default.
		{name: "--drain-deadline beats terminationDrainDuration", cmd: pa, set: []func(*Config){deadline(20*time.Second, "--drain-deadline")},
			env:  proxyConfig(`{"terminationDrainDuration":"40s"}`),
			want: want(func(w *resolveWant) { pilotAgent(w); deadline20(w, "--drain-deadline") })},
		{name: "DRAIND_DRAIN_DEADLINE", cmd: "envoy", set: []func(*Config){deadline(20*time.Second, "DRAIND_DRAIN_DEADLINE")},
			want: want(func(w *resolveWant) { deadline20(w, "DRAIND_DRAIN_DEADLINE") })},
		{name: "TERMINATION_DRAIN_DURATION_SECONDS, deprecated", cmd: "envoy", set: []func(*Config){deadline(20*time.Second, istio.TerminationDrainEnv)},
			want: want(func(w *resolveWant) {
				deadline20(w, istio.TerminationDrainEnv)
				w.warnings = []logevent.Event{logevent.IstioSetting}
			})},
		{name: "terminationDrainDuration 40s (PROXY_CONFIG)", cmd: pa, env: proxyConfig(`{"terminationDrainDuration":"40s"}`),
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.deadline, w.src.Deadline, w.warnings = 40*time.Second, "terminationDrainDuration (PROXY_CONFIG)", []logevent.Event{logevent.GraceWarning}
			})},
		{name: "terminationDrainDuration from the pod's annotation", cmd: pa, env: proxyConfig(`{"terminationDrainDuration":"40s"}`),
			annotations: `proxy.istio.io/config="{\"terminationDrainDuration\":\"28s\"}"` + "\n",
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.deadline, w.src.Deadline = 28*time.Second, "terminationDrainDuration (annotation proxy.istio.io/config)"
			})},
		{name: "terminationDrainDuration 5s never shortens", cmd: pa, env: proxyConfig(`{"terminationDrainDuration":"5s"}`),
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.src.Deadline = "default: terminationDrainDuration 5s (PROXY_CONFIG) is not longer, and never shortens the drain"
			})},
		{name: "--grace-period", cmd: "envoy", set: []func(*Config){grace(60*time.Second, "--grace-period")},
			want: want(func(w *resolveWant) {
				w.deadline, w.src.GracePeriod, w.src.Deadline = 55*time.Second, "--grace-period", "the pod's grace period 1m0s (--grace-period) less 5s"
			})},
		{name: "DRAIND_GRACE_PERIOD beats terminationDrainDuration", cmd: pa, set: []func(*Config){grace(30*time.Second, "DRAIND_GRACE_PERIOD")},
			env: proxyConfig(`{"terminationDrainDuration":"40s"}`),
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.src.GracePeriod = "DRAIND_GRACE_PERIOD"
				w.src.Deadline = "the pod's grace period 30s (DRAIND_GRACE_PERIOD) less 5s; terminationDrainDuration 40s (PROXY_CONFIG) is not used: the grace period bounds the drain"
			})},
		{name: "--drain-deadline beats the grace period, past it", cmd: "envoy", set: []func(*Config){grace(30*time.Second, "--grace-period"), deadline(40*time.Second, "--drain-deadline")},
			want: want(func(w *resolveWant) {
				w.deadline, w.src.Deadline, w.src.GracePeriod, w.warnings = 40*time.Second, "--drain-deadline", "--grace-period", []logevent.Event{logevent.GraceWarning}
			})},

		// Where draind and Envoy's admin API listen.
		{name: "proxyAdminPort under pilot-agent", cmd: pa, env: proxyConfig(`{"proxyAdminPort":15100}`),
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.adminAddr, w.src.AdminAddr = "127.0.0.1:15100", fromIstioAdminPort
			})},
		{name: "--admin-addr beats proxyAdminPort", cmd: pa, env: proxyConfig(`{"proxyAdminPort":15100}`),
			set: []func(*Config){func(c *Config) { c.AdminAddr, c.AdminAddrSet = "127.0.0.1:15001", true }},
			want: want(func(w *resolveWant) {
				pilotAgent(w)
				w.adminAddr, w.src.AdminAddr = "127.0.0.1:15001", fromAdminAddrGiven
			})},
		{name: "proxyAdminPort is pilot-agent's only", cmd: "envoy", env: proxyConfig(`{"proxyAdminPort":15100}`), want: want(nil)},
		{name: "statusPort annotation moves draind's", cmd: pa, annotations: `status.sidecar.istio.io/port="15022"` + "\n",
			want: want(func(w *resolveWant) { pilotAgent(w); w.statusAddr = ":15023" })},
		{name: "DRAIND_STATUS_ADDR", cmd: pa, set: []func(*Config){func(c *Config) {
			c.StatusAddr, c.StatusAddrSet, c.StatusAddrSource = ":9000", true, istio.StatusAddrEnv
		}},
			want: want(func(w *resolveWant) { pilotAgent(w); w.statusAddr, w.src.StatusAddr = ":9000", istio.StatusAddrEnv })},
		{name: "--status-addr", cmd: "envoy", set: []func(*Config){func(c *Config) { c.StatusAddr, c.StatusAddrSet = ":9000", true }},
			want: want(func(w *resolveWant) { w.statusAddr, w.src.StatusAddr = ":9000", istio.StatusAddrFlag })},

		// The deadlines reconciled.
		{name: "a fixed min-drain raises the default deadline", cmd: "envoy", set: []func(*Config){fixedMinDrain},
			want: want(func(w *resolveWant) {
				w.deadline, w.minDrain = 30*time.Second+reserve, 30*time.Second
				w.src.Reconciled = []string{ReconciledDeadline}
				w.warnings = []logevent.Event{logevent.DeadlinesReconciled, logevent.GraceWarning}
			})},
		{name: "a given deadline cuts the min-drain", cmd: "envoy", set: []func(*Config){fixedMinDrain, deadline(20*time.Second, "--drain-deadline")},
			want: want(func(w *resolveWant) {
				w.deadline, w.minDrain, w.src.Deadline = 20*time.Second, 20*time.Second-reserve, "--drain-deadline"
				w.src.Reconciled = []string{ReconciledMinDrain}
				w.warnings = []logevent.Event{logevent.DeadlinesReconciled}
			})},
		{name: "a chosen ceiling raises the default deadline", cmd: "envoy", set: []func(*Config){ceiling},
			want: want(func(w *resolveWant) {
				w.deadline, w.ceiling = 30*time.Second+reserve, 30*time.Second
				w.src.Reconciled = []string{ReconciledDeadline}
				w.warnings = []logevent.Event{logevent.DeadlinesReconciled, logevent.GraceWarning}
			})},
		{name: "the grace period cuts a chosen ceiling", cmd: "envoy", set: []func(*Config){ceiling, grace(20*time.Second, "--grace-period")},
			want: want(func(w *resolveWant) {
				w.deadline, w.ceiling = 15*time.Second, 15*time.Second-reserve
				w.src.GracePeriod, w.src.Deadline = "--grace-period", "the pod's grace period 20s (--grace-period) less 5s"
				w.src.Reconciled = []string{ReconciledCeiling}
				w.warnings = []logevent.Event{logevent.DeadlinesReconciled}
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Command = []string{tt.cmd}
			for _, set := range tt.set {
				set(&cfg)
			}
			var ann Annotations
			if tt.annotations != "" {
				ann.Data = []byte(tt.annotations)
			}
			r, err := Resolve(cfg, envOf(tt.env), ann)
			if err != nil {
				t.Fatal(err)
			}
			c := r.Config
			got := resolveWant{deadline: c.Drain.Deadline, minDrain: c.Drain.MinDrain, ceiling: c.Drain.RotationCeiling,
				statusAddr: c.StatusAddr, adminAddr: c.AdminAddr, proxy: c.ProxyKind, src: r.Sources, warnings: warningEvents(t, r)}
			w := tt.want
			if got.deadline != w.deadline || got.minDrain != w.minDrain || got.ceiling != w.ceiling || got.statusAddr != w.statusAddr ||
				got.adminAddr != w.adminAddr || got.proxy != w.proxy || !slices.Equal(got.warnings, w.warnings) {
				t.Errorf("got  %+v\nwant %+v", got, w)
			}
			if !reflect.DeepEqual(got.src, w.src) {
				t.Errorf("sources:\ngot  %+v\nwant %+v", got.src, w.src)
			}
			if c.Drain.Grace != c.GracePeriod {
				t.Errorf("drain.Config.Grace %s, the grace period %s", c.Drain.Grace, c.GracePeriod)
			}
			if pilot := c.ProxyKind == istio.ProxyPilotAgent; c.Proxy.SignalPIDOnly != pilot || c.Drain.ProxyExitStands != pilot ||
				pilot && !slices.Contains(c.ExcludePorts, r.Istio.StatusPort) {
				t.Errorf("pilot-agent %v: SignalPIDOnly %v, ProxyExitStands %v, excluded %v", pilot, c.Proxy.SignalPIDOnly, c.Drain.ProxyExitStands, c.ExcludePorts)
			}
		})
	}
}

// warningEvents are the events of the warnings r logs, in order.
func warningEvents(t *testing.T, r Resolved) []logevent.Event {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	r.log(zap.New(core))
	var out []logevent.Event
	for _, e := range logs.All() {
		if e.Level == zapcore.WarnLevel {
			out = append(out, logevent.Event(e.ContextMap()[logevent.Key].(string)))
		}
	}
	return out
}

// TestResolveErrors: a setting that cannot work is a *ConfigError naming it.
func TestResolveErrors(t *testing.T) {
	const pa = "/usr/local/bin/pilot-agent"
	for _, tt := range []struct {
		name string
		cmd  string
		set  func(*Config)
		env  map[string]string
		ann  Annotations
		want string
	}{
		{"a grace period too short", "envoy", func(c *Config) { c.GracePeriod = 7 * time.Second }, nil, Annotations{}, "--grace-period 7s leaves no time to drain"},
		{"--status-addr on pilot-agent's port", pa, func(c *Config) { c.StatusAddr, c.StatusAddrSet = "0.0.0.0:15020", true }, nil, Annotations{},
			"--status-addr 0.0.0.0:15020: port 15020 is pilot-agent's status port"},
		{"PROXY_CONFIG not YAML", pa, nil, map[string]string{istio.ProxyConfigEnv: "{"}, Annotations{}, "PROXY_CONFIG: not YAML or JSON"},
		{"annotations unreadable", pa, nil, nil, Annotations{Path: "/etc/istio/pod/annotations", Err: errors.New("permission denied")},
			"/etc/istio/pod/annotations: permission denied"},
		{"statusPort annotation not a port", pa, nil, nil, Annotations{Path: "a", Data: []byte(`status.sidecar.istio.io/port="x"`)},
			`a, annotation status.sidecar.istio.io/port="x": not a port`},
	} {
		cfg := DefaultConfig()
		cfg.Command = []string{tt.cmd}
		if tt.set != nil {
			tt.set(&cfg)
		}
		_, err := Resolve(cfg, envOf(tt.env), tt.ann)
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want a *ConfigError with %q", tt.name, err, tt.want)
		}
	}
}

// TestResolvePure: Resolve reads only what it is given, leaves its input
// as it was, and its result reads the environment it was given.
func TestResolvePure(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Command = []string{"/usr/local/bin/pilot-agent"}
	excluded := slices.Clone(cfg.ExcludePorts)
	env := envOf(map[string]string{NodeIPEnv: " 10.0.0.7 ", istio.ExitOnZeroEnv: "true"})
	r, err := Resolve(cfg, env, Annotations{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.ExcludePorts, excluded) || cfg.ProxyKind != istio.ProxyAuto || cfg.LookupEnv != nil {
		t.Errorf("the input changed: %+v", cfg)
	}
	if r.NodeIP != netip.MustParseAddr("10.0.0.7") || !r.ExitOnZero {
		t.Errorf("node IP %s, exit on zero %v", r.NodeIP, r.ExitOnZero)
	}
	if v, ok := r.Config.lookupEnv(NodeIPEnv); !ok || v != " 10.0.0.7 " {
		t.Errorf("the result's environment: %q %v", v, ok)
	}
	if r, err := Resolve(cfg, nil, Annotations{}); err != nil || r.NodeIP.IsValid() || r.ExitOnZero {
		t.Errorf("no environment: %v %v %v", r.NodeIP, r.ExitOnZero, err)
	}
}

// TestResolvedLog: the start-up line says what decided each value.
func TestResolvedLog(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Command = []string{"/usr/local/bin/pilot-agent"}
	cfg.GracePeriod, cfg.GracePeriodSource = time.Minute, "DRAIND_GRACE_PERIOD"
	cfg.Drain.RotationCeiling, cfg.Drain.RotationCeilingSet = time.Minute, true
	r, err := Resolve(cfg, envOf(map[string]string{istio.ProxyConfigEnv: `{"proxyAdminPort":15100}`}), Annotations{})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	r.log(zap.New(core))
	lines := logs.FilterField(logevent.DeadlineDecided.Field()).All()
	if len(lines) != 1 {
		t.Fatalf("%d start-up lines", len(lines))
	}
	f := lines[0].ContextMap()
	for k, v := range map[string]any{
		"deadline": 55 * time.Second, "decided_by": "the pod's grace period 1m0s (DRAIND_GRACE_PERIOD) less 5s",
		"grace_period": time.Minute, "grace_period_from": "DRAIND_GRACE_PERIOD",
		"status_addr": ":15022", "status_addr_from": "beside pilot-agent (the first port Istio leaves free)",
		"admin_addr": "127.0.0.1:15100", "admin_addr_from": fromIstioAdminPort,
		"proxy": "pilot-agent", "proxy_from": fromProxyCommand,
	} {
		if f[k] != v {
			t.Errorf("%s: %v, want %v", k, f[k], v)
		}
	}
	if rec, _ := f["reconciled"].([]any); len(rec) != 1 || rec[0] != ReconciledCeiling {
		t.Errorf("reconciled: %v", f["reconciled"])
	}
	if n := len(lines[0].Message); n > 60 {
		t.Errorf("message of %d characters", n)
	}
}
