package istio

import (
	"testing"
)

// TestStatusAddr is the rule for where a pod's draind listens, as each
// command meets it: `draind run` and `draind drain` with their settings
// read (flags, environment, Istio's), `draind pods` from another
// container's argv and environment.
func TestStatusAddr(t *testing.T) {
	moved := Settings{ProxyConfig: true, StatusPort: 15022, StatusPortFrom: "annotation " + annotationStatusPort, AdminPort: 15000}
	tests := []struct {
		name string
		// in is the input as run and drain build it; args and env, when
		// args is set, the container pods reads instead (in.Settings are
		// its Istio settings, as pods reads them when they are needed).
		in        StatusInput
		args, env []string
		want      StatusAddr
		notDraind bool
	}{
		{name: "nothing set", want: StatusAddr{":15020", "default"}},
		{name: "Istio's defaults beside pilot-agent", in: StatusInput{PilotAgent: true, Settings: Defaults()},
			want: StatusAddr{":15022", fromPilotAgent}},
		{name: "pilot-agent's status port moved to 15022", in: StatusInput{PilotAgent: true, Settings: moved},
			want: StatusAddr{":15023", fromPilotAgent}},
		{name: "Envoy's admin port moved to 15022", in: StatusInput{PilotAgent: true, Settings: Settings{StatusPort: 15020, AdminPort: 15022, AdminPortSet: true}},
			want: StatusAddr{":15023", fromPilotAgent}},
		{name: "Istio's settings are not read for Envoy", in: StatusInput{Settings: moved}, want: StatusAddr{":15020", "default"}},
		{name: "--status-addr", in: StatusInput{Given: ":15099", GivenBy: StatusAddrFlag}, want: StatusAddr{":15099", "--status-addr"}},
		{name: "DRAIND_STATUS_ADDR", in: StatusInput{Given: "0.0.0.0:16000", GivenBy: StatusAddrEnv}, want: StatusAddr{"0.0.0.0:16000", "DRAIND_STATUS_ADDR"}},
		{name: "an empty --status-addr stands, for the command to refuse", in: StatusInput{GivenBy: StatusAddrFlag, PilotAgent: true},
			want: StatusAddr{"", "--status-addr"}},
		{name: "given beside pilot-agent", in: StatusInput{Given: ":15030", GivenBy: StatusAddrFlag, PilotAgent: true, Settings: Defaults()},
			want: StatusAddr{":15030", "--status-addr"}},

		// Another container's argv and environment (draind pods).
		{name: "argv: the image's entrypoint", args: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoy", "-c", "x"},
			want: StatusAddr{":15020", "default"}},
		{name: "argv: --status-addr", args: []string{"draind", "run", "--status-addr", ":15099", "--", "envoy"}, want: StatusAddr{":15099", "--status-addr"}},
		{name: "argv: -status-addr=", args: []string{"draind", "run", "-status-addr=127.0.0.2:15021", "--", "envoy"}, want: StatusAddr{"127.0.0.2:15021", "--status-addr"}},
		{name: "argv: DRAIND_STATUS_ADDR", args: []string{"draind", "run", "--", "envoy"}, env: []string{"PATH=/bin", "DRAIND_STATUS_ADDR=0.0.0.0:16000"},
			want: StatusAddr{"0.0.0.0:16000", "DRAIND_STATUS_ADDR"}},
		{name: "argv: the last of a variable", args: []string{"draind", "run", "--", "envoy"}, env: []string{"DRAIND_STATUS_ADDR=:1", "DRAIND_STATUS_ADDR=:2"},
			want: StatusAddr{":2", "DRAIND_STATUS_ADDR"}},
		{name: "argv: an empty variable is unset", args: []string{"draind", "run", "--", "envoy"}, env: []string{"DRAIND_STATUS_ADDR="},
			want: StatusAddr{":15020", "default"}},
		{name: "argv: the flag beats the variable", args: []string{"draind", "run", "--status-addr=:1", "--", "envoy"}, env: []string{"DRAIND_STATUS_ADDR=:2"},
			want: StatusAddr{":1", "--status-addr"}},
		{name: "argv: a flag after -- is the proxy's", args: []string{"draind", "run", "--", "envoy", "--status-addr", ":1"},
			want: StatusAddr{":15020", "default"}},
		{name: "argv: tini as init", args: []string{"/sbin/tini", "--", "/usr/local/bin/draind", "run", "--", "envoy"}, want: StatusAddr{":15020", "default"}},
		{name: "argv: dumb-init as init, beside pilot-agent", args: []string{"/usr/bin/dumb-init", "--", "/usr/local/bin/draind", "run", "--", "/usr/local/bin/pilot-agent", "proxy", "sidecar"},
			in: StatusInput{Settings: Defaults()}, want: StatusAddr{":15022", fromPilotAgent}},
		// Istio's injection template: draind run -- pilot-agent: pilot-agent
		// keeps 15020, draind takes 15022.
		{name: "argv: Istio's template", args: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/pilot-agent", "proxy", "sidecar"},
			env: []string{`PROXY_CONFIG={"discoveryAddress":"istiod.istio-system.svc:15012"}`}, in: StatusInput{Settings: Defaults()},
			want: StatusAddr{":15022", fromPilotAgent}},
		{name: "argv: Istio's status port moved", args: []string{"draind", "run", "--", "pilot-agent", "proxy"}, env: []string{"PROXY_CONFIG={}"},
			in: StatusInput{Settings: moved}, want: StatusAddr{":15023", fromPilotAgent}},
		{name: "argv: --proxy pilot-agent", args: []string{"draind", "run", "--proxy", "pilot-agent", "--", "/opt/agent"},
			in: StatusInput{Settings: Defaults()}, want: StatusAddr{":15022", fromPilotAgent}},
		{name: "argv: DRAIND_PROXY=pilot-agent", args: []string{"draind", "run", "--", "/opt/agent"}, env: []string{"DRAIND_PROXY=pilot-agent"},
			in: StatusInput{Settings: Defaults()}, want: StatusAddr{":15022", fromPilotAgent}},
		{name: "argv: --proxy envoy before pilot-agent", args: []string{"draind", "run", "--proxy=envoy", "--", "pilot-agent"},
			in: StatusInput{Settings: moved}, want: StatusAddr{":15020", "default"}},
		{name: "argv: --status-addr beside pilot-agent", args: []string{"draind", "run", "--status-addr", ":15030", "--", "pilot-agent"},
			in: StatusInput{Settings: moved}, want: StatusAddr{":15030", "--status-addr"}},
		{name: "argv: pilot-agent alone", args: []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"}, notDraind: true},
		{name: "argv: draind prestop is no draind run", args: []string{"draind", "prestop"}, notDraind: true},
		{name: "argv: draind alone", args: []string{"draind"}, notDraind: true},
		{name: "argv: another run", args: []string{"npm", "run", "start"}, notDraind: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			if tt.args != nil {
				var ok bool
				in, _, ok = RunArgs(tt.args, tt.env)
				if ok == tt.notDraind {
					t.Fatalf("RunArgs: draind run %v, want %v", ok, !tt.notDraind)
				}
				if !ok {
					return
				}
				if in.NeedsSettings() {
					in.Settings = tt.in.Settings
				}
			}
			if got := StatusAddrOf(in); got != tt.want {
				t.Errorf("StatusAddrOf(%+v) = %+v, want %+v", in, got, tt.want)
			}
		})
	}
}

// RunArgs' lookup reads the container's environment, the last of a key
// winning, for Istio's settings.
func TestRunArgsLookup(t *testing.T) {
	_, lookup, ok := RunArgs([]string{"draind", "run", "--", "pilot-agent"}, []string{"PROXY_CONFIG={}", "A=1", "PROXY_CONFIG={\"statusPort\":15030}"})
	if !ok {
		t.Fatal("not draind run")
	}
	s, err := ReadFrom(lookup, PodAnnotations, func() ([]byte, error) { return nil, nil })
	if err != nil || s.StatusPort != 15030 || !s.ProxyConfig {
		t.Errorf("settings %+v, %v", s, err)
	}
	if _, ok := lookup("B"); ok {
		t.Error("B found")
	}
}
