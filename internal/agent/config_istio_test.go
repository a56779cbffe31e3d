package agent

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/istio"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
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
	if _, err := c.resolveIstio(); err != nil || c.ProxyKind != istio.ProxyEnvoy || c.StatusAddr != DefaultStatusAddr || c.Proxy.SignalPIDOnly {
		t.Errorf("envoy: %+v %v", c, err)
	}

	c = base(map[string]string{istio.ProxyConfigEnv: `{"proxyAdminPort":15100}`}, pa, "proxy", "sidecar")
	r, err := c.resolveIstio()
	if err != nil || c.ProxyKind != istio.ProxyPilotAgent || c.StatusAddr != ":15022" || c.AdminAddr != "127.0.0.1:15100" || !c.Proxy.SignalPIDOnly || r.deadlineFrom != "default" {
		t.Errorf("pilot-agent: status %s admin %s kind %s pidOnly %v from %q %v", c.StatusAddr, c.AdminAddr, c.ProxyKind, c.Proxy.SignalPIDOnly, r.deadlineFrom, err)
	}

	// Istio's status port on 15022: draind takes the next free one.
	c = base(map[string]string{istio.ProxyConfigEnv: `{"statusPort":15022}`}, pa)
	if _, err := c.resolveIstio(); err != nil || c.StatusAddr != ":15023" {
		t.Errorf("statusPort 15022: draind on %s, %v", c.StatusAddr, err)
	}

	c = base(nil, pa)
	c.StatusAddr, c.StatusAddrSet = "0.0.0.0:15020", true
	if _, err := c.resolveIstio(); err == nil || !strings.Contains(err.Error(), "--status-addr 0.0.0.0:15020: port 15020 is pilot-agent's status port") {
		t.Errorf("status addr on pilot-agent's port: %v", err)
	}

	c = base(nil, "envoy")
	c.ProxyKind = istio.ProxyPilotAgent // explicit
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
		{"the grace period beats terminationDrainDuration", map[string]string{istio.ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "", 30 * time.Second, 25 * time.Second,
			"the pod's grace period 30s (DRAIND_GRACE_PERIOD) less 5s; terminationDrainDuration 40s (PROXY_CONFIG) is not used: the grace period bounds the drain", 0},
		{"the flag beats the grace period", nil, "--drain-deadline", 60 * time.Second, 20 * time.Second, "--drain-deadline", 0},
		{"40s wins", map[string]string{istio.ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "", 0, 40 * time.Second, "terminationDrainDuration (PROXY_CONFIG)", 0},
		{"5s never shortens", map[string]string{istio.ProxyConfigEnv: `{"terminationDrainDuration":"5s"}`}, "", 0, 25 * time.Second, "default: terminationDrainDuration 5s (PROXY_CONFIG) is not longer, and never shortens the drain", 0},
		{"flag wins", map[string]string{istio.ProxyConfigEnv: `{"terminationDrainDuration":"40s"}`}, "--drain-deadline", 0, 20 * time.Second, "--drain-deadline", 0},
		{"deprecated alias", nil, istio.TerminationDrainEnv, 0, 20 * time.Second, istio.TerminationDrainEnv, 1},
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
	c = base(map[string]string{istio.ExitOnZeroEnv: "true"}, pa)
	if r, _ := c.resolveIstio(); !r.exitOnZero {
		t.Error("EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true not noticed")
	}
}
