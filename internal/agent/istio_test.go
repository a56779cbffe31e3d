package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// What Istio's injector writes (pkg/kube/inject: protoToJSON, defaults
// left out), what a hand-written YAML looks like, and the annotations file.
func TestReadIstio(t *testing.T) {
	dir := t.TempDir()
	annos := filepath.Join(dir, "annotations")
	for _, tc := range []struct {
		name, proxyConfig, annotations string
		want                           IstioSettings
		err                            string
	}{
		{name: "no Istio", want: IstioSettings{StatusPort: 15020, AdminPort: 15000}},
		{name: "injected defaults", proxyConfig: "{}\n", want: IstioSettings{ProxyConfig: true, StatusPort: 15020, AdminPort: 15000}},
		{name: "injected JSON", proxyConfig: `{"terminationDrainDuration":"40s","statusPort":15030,"proxyAdminPort":15100,"proxyMetadata":{"MINIMUM_DRAIN_DURATION":"3s"}}`,
			want: IstioSettings{ProxyConfig: true, TerminationDrain: 40 * time.Second, TerminationDrainFrom: "PROXY_CONFIG", StatusPort: 15030, StatusPortFrom: "PROXY_CONFIG", AdminPort: 15100, AdminPortSet: true}},
		{name: "YAML, proto names", proxyConfig: "termination_drain_duration: 0.5s\nstatus_port: \"15031\"\n",
			want: IstioSettings{ProxyConfig: true, TerminationDrain: 500 * time.Millisecond, TerminationDrainFrom: "PROXY_CONFIG", StatusPort: 15031, StatusPortFrom: "PROXY_CONFIG", AdminPort: 15000}},
		{name: "annotations win", proxyConfig: `{"terminationDrainDuration":"40s"}`,
			annotations: "app=\"web\"\nproxy.istio.io/config=\"terminationDrainDuration: 50s\\n\"\nstatus.sidecar.istio.io/port=\"15040\"\n",
			want:        IstioSettings{ProxyConfig: true, TerminationDrain: 50 * time.Second, TerminationDrainFrom: "annotation proxy.istio.io/config", StatusPort: 15040, StatusPortFrom: "annotation status.sidecar.istio.io/port", AdminPort: 15000}},
		{name: "bad duration", proxyConfig: `{"terminationDrainDuration":"1m"}`, err: `PROXY_CONFIG: terminationDrainDuration: 1m is not a protobuf duration`},
		{name: "bad port", proxyConfig: "statusPort: 70000", err: "PROXY_CONFIG: statusPort: 70000 is not a port"},
		{name: "not YAML", proxyConfig: "{", err: "PROXY_CONFIG: not YAML or JSON"},
		{name: "bad annotation", annotations: "status.sidecar.istio.io/port=\"x\"\n", err: `annotation status.sidecar.istio.io/port="x": not a port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(annos)
			if tc.annotations != "" {
				if err := os.WriteFile(annos, []byte(tc.annotations), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			env := map[string]string{}
			if tc.proxyConfig != "" {
				env[ProxyConfigEnv] = tc.proxyConfig
			}
			got, err := ReadIstio(envOf(env), annos)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
}

// resolveIstio: the proxy kind, the ports under pilot-agent, and which
// setting decides the deadline.
func TestResolveIstio(t *testing.T) {
	base := func(env map[string]string, cmd ...string) Config {
		c := DefaultConfig()
		c.Command = cmd
		c.LookupEnv = envOf(env)
		c.IstioAnnotations = filepath.Join(t.TempDir(), "none")
		return c
	}
	pa := "/usr/local/bin/pilot-agent"

	c := base(nil, "envoy", "-c", "x")
	if _, err := c.resolveIstio(); err != nil || c.ProxyKind != ProxyEnvoy || c.StatusAddr != DefaultStatusAddr || c.Proxy.SignalPIDOnly {
		t.Errorf("envoy: %+v %v", c, err)
	}

	c = base(map[string]string{ProxyConfigEnv: `{"proxyAdminPort":15100}`}, pa, "proxy", "sidecar")
	r, err := c.resolveIstio()
	if err != nil || c.ProxyKind != ProxyPilotAgent || c.StatusAddr != ":15022" || c.AdminAddr != "127.0.0.1:15100" || !c.Proxy.SignalPIDOnly || r.deadlineFrom != "default" {
		t.Errorf("pilot-agent: status %s admin %s kind %s pidOnly %v from %q %v", c.StatusAddr, c.AdminAddr, c.ProxyKind, c.Proxy.SignalPIDOnly, r.deadlineFrom, err)
	}

	// Istio's status port on 15022: draind takes the next free one.
	c = base(map[string]string{ProxyConfigEnv: `{"statusPort":15022}`}, pa)
	if _, err := c.resolveIstio(); err != nil || c.StatusAddr != ":15023" {
		t.Errorf("statusPort 15022: draind on %s, %v", c.StatusAddr, err)
	}

	c = base(nil, pa)
	c.StatusAddr, c.StatusAddrSet = "0.0.0.0:15020", true
	if _, err := c.resolveIstio(); err == nil || !strings.Contains(err.Error(), "--status-addr 0.0.0.0:15020: port 15020 is pilot-agent's status port") {
		t.Errorf("status addr on pilot-agent's port: %v", err)
	}

	c = base(nil, "envoy")
	c.ProxyKind = ProxyPilotAgent // explicit
	if _, err := c.resolveIstio(); err != nil || c.StatusAddr != ":15022" {
		t.Errorf("--proxy pilot-agent: %s %v", c.StatusAddr, err)
	}

	for _, tc := range []struct {
		name     string
		env      map[string]string
		set      string        // DeadlineSource when set
		grace    time.Duration // --grace-period
		want     time.Duration
		from     string
		warnings int
	}{
		{"the grace period decides", nil, "", 60 * time.Second, 55 * time.Second, "the pod's grace period 1m0s (DRAIND_GRACE_PERIOD) less 5s", 0},
		{"the grace period beats terminationDrainDuration", map[string]string{ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "", 30 * time.Second, 25 * time.Second,
			"the pod's grace period 30s (DRAIND_GRACE_PERIOD) less 5s; terminationDrainDuration 40s (PROXY_CONFIG) is not used: the grace period bounds the drain", 0},
		{"the flag beats the grace period", nil, "--drain-deadline", 60 * time.Second, 20 * time.Second, "--drain-deadline", 0},
		{"40s wins", map[string]string{ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "", 0, 40 * time.Second, "terminationDrainDuration (PROXY_CONFIG)", 0},
		{"5s never shortens", map[string]string{ProxyConfigEnv: `{"terminationDrainDuration":"5s"}`}, "", 0, 25 * time.Second, "default: terminationDrainDuration 5s (PROXY_CONFIG) is not longer, and never shortens the drain", 0},
		{"flag wins", map[string]string{ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "--drain-deadline", 0, 20 * time.Second, "--drain-deadline", 0},
		{"deprecated alias", nil, TerminationDrainEnv, 0, 20 * time.Second, TerminationDrainEnv, 1},
	} {
		c := base(tc.env, pa)
		if tc.set != "" {
			c.Drain.Deadline, c.DeadlineSet, c.DeadlineSource = 20*time.Second, true, tc.set
		}
		c.GracePeriod, c.GracePeriodSource = tc.grace, "DRAIND_GRACE_PERIOD"
		r, err := c.resolveIstio()
		if err != nil || c.Drain.Deadline != tc.want || r.deadlineFrom != tc.from || len(r.warnings) != tc.warnings {
			t.Errorf("%s: deadline %s from %q, warnings %q, %v", tc.name, c.Drain.Deadline, r.deadlineFrom, r.warnings, err)
		}
	}
	c = base(nil, pa)
	c.GracePeriod, c.GracePeriodSource = 7*time.Second, "--grace-period"
	if _, err := c.resolveIstio(); err == nil || !strings.Contains(err.Error(), "--grace-period 7s leaves no time to drain") {
		t.Errorf("a grace period too short: %v", err)
	}
	c = base(map[string]string{ExitOnZeroEnv: "true"}, pa)
	if r, _ := c.resolveIstio(); !r.exitOnZero {
		t.Error("EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true not noticed")
	}
}
