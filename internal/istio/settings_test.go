package istio

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
func TestRead(t *testing.T) {
	dir := t.TempDir()
	annos := filepath.Join(dir, "annotations")
	for _, tc := range []struct {
		name, proxyConfig, annotations string
		want                           Settings
		err                            string
	}{
		{name: "no Istio", want: Settings{StatusPort: 15020, AdminPort: 15000}},
		{name: "injected defaults", proxyConfig: "{}\n", want: Settings{ProxyConfig: true, StatusPort: 15020, AdminPort: 15000}},
		{name: "injected JSON", proxyConfig: `{"terminationDrainDuration":"40s","statusPort":15030,"proxyAdminPort":15100,"proxyMetadata":{"MINIMUM_DRAIN_DURATION":"3s"}}`,
			want: Settings{ProxyConfig: true, TerminationDrain: 40 * time.Second, TerminationDrainFrom: "PROXY_CONFIG", StatusPort: 15030, StatusPortFrom: "PROXY_CONFIG", AdminPort: 15100, AdminPortSet: true}},
		{name: "YAML, proto names", proxyConfig: "termination_drain_duration: 0.5s\nstatus_port: \"15031\"\n",
			want: Settings{ProxyConfig: true, TerminationDrain: 500 * time.Millisecond, TerminationDrainFrom: "PROXY_CONFIG", StatusPort: 15031, StatusPortFrom: "PROXY_CONFIG", AdminPort: 15000}},
		{name: "annotations win", proxyConfig: `{"terminationDrainDuration":"40s"}`,
			annotations: "app=\"web\"\nproxy.istio.io/config=\"terminationDrainDuration: 50s\\n\"\nstatus.sidecar.istio.io/port=\"15040\"\n",
			want:        Settings{ProxyConfig: true, TerminationDrain: 50 * time.Second, TerminationDrainFrom: "annotation proxy.istio.io/config", StatusPort: 15040, StatusPortFrom: "annotation status.sidecar.istio.io/port", AdminPort: 15000}},
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
			got, err := Read(envOf(env), annos)
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

// FreePort skips Istio's ports and the pod's own settings.
func TestFreePort(t *testing.T) {
	for _, tc := range []struct {
		s    Settings
		want uint16
	}{
		{Defaults(), 15022},
		{Settings{StatusPort: 15022, AdminPort: 15000}, 15023},
		{Settings{StatusPort: 15020, AdminPort: 15022}, 15023},
		{Settings{StatusPort: 15022, AdminPort: 15023}, 15024},
	} {
		if got := tc.s.FreePort(); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestProxyKindOf(t *testing.T) {
	for _, tc := range []struct {
		kind ProxyKind
		cmd  []string
		want ProxyKind
	}{
		{ProxyAuto, []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"}, ProxyPilotAgent},
		{"", []string{"pilot-agent"}, ProxyPilotAgent},
		{ProxyAuto, []string{"/usr/local/bin/envoy", "-c", "x"}, ProxyEnvoy},
		{ProxyAuto, nil, ProxyEnvoy},
		{ProxyEnvoy, []string{"pilot-agent"}, ProxyEnvoy},
		{ProxyPilotAgent, []string{"/opt/agent"}, ProxyPilotAgent},
	} {
		if got := tc.kind.Of(tc.cmd); got != tc.want {
			t.Errorf("%q.Of(%q) = %q, want %q", tc.kind, tc.cmd, got, tc.want)
		}
	}
}
