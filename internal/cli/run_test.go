package cli

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/probes"
)

// Istio's variables, as Istio defines them, with their precedence: a flag
// beats its DRAIND_ twin, which beats Istio's variable.
func TestRunConfigIstioVariables(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		env         map[string]string
		auto        bool
		minDrain    time.Duration
		deadline    time.Duration
		deadlineSet bool
		err         string
	}{
		{"defaults: auto", nil, nil, true, 5 * time.Second, 25 * time.Second, false, ""},
		{"Istio's pair", nil, map[string]string{"MINIMUM_DRAIN_DURATION": "30s", "TERMINATION_DRAIN_DURATION_SECONDS": "45"}, false, 30 * time.Second, 45 * time.Second, true, ""},
		{"Istio's seconds are whole", nil, map[string]string{"TERMINATION_DRAIN_DURATION_SECONDS": "45s"}, false, 0, 0, false, `TERMINATION_DRAIN_DURATION_SECONDS="45s" (for --drain-deadline): "45s" is not a whole number of seconds`},
		{"Istio's duration has a unit", nil, map[string]string{"MINIMUM_DRAIN_DURATION": "30"}, false, 0, 0, false, `MINIMUM_DRAIN_DURATION="30" (for --min-drain): "30" is not a duration`},
		{"the twin beats Istio's", nil, map[string]string{"DRAIND_DRAIN_DEADLINE": "20s", "TERMINATION_DRAIN_DURATION_SECONDS": "45"}, true, 5 * time.Second, 20 * time.Second, true, ""},
		{"the flag beats both", []string{"--drain-deadline", "15s"}, map[string]string{"DRAIND_DRAIN_DEADLINE": "20s", "TERMINATION_DRAIN_DURATION_SECONDS": "45"}, true, 5 * time.Second, 15 * time.Second, true, ""},
		{"a fixed wait", []string{"--min-drain", "5s"}, nil, false, 5 * time.Second, 25 * time.Second, false, ""},
		{"a fixed wait from the twin", nil, map[string]string{"DRAIND_MIN_DRAIN": "2s"}, false, 2 * time.Second, 25 * time.Second, false, ""},
		{"auto, said", []string{"--min-drain", "auto"}, nil, true, 5 * time.Second, 25 * time.Second, false, ""},
		{"auto from the twin beats Istio's", nil, map[string]string{"DRAIND_MIN_DRAIN": "auto", "MINIMUM_DRAIN_DURATION": "30s"}, true, 5 * time.Second, 25 * time.Second, false, ""},
		{"neither auto nor a duration", []string{"--min-drain", "automatic"}, nil, false, 0, 0, false, `"automatic" is not a duration (e.g. 500ms, 5s, 1m) nor auto`},
		{"the old name means nothing", nil, map[string]string{"TERMINATION_DRAIN_DURATION": "45s"}, true, 5 * time.Second, 25 * time.Second, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, _, err := runConfig(append(tt.args, "--", "envoy"), io.Discard)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Drain.MinDrainAuto != tt.auto {
				t.Errorf("min-drain auto %v, want %v", cfg.Drain.MinDrainAuto, tt.auto)
			}
			if cfg.Drain.MinDrain != tt.minDrain || cfg.Drain.Deadline != tt.deadline || cfg.DeadlineSet != tt.deadlineSet {
				t.Errorf("min-drain %s deadline %s (set %v), want %s %s (%v)", cfg.Drain.MinDrain, cfg.Drain.Deadline, cfg.DeadlineSet, tt.minDrain, tt.deadline, tt.deadlineSet)
			}
		})
	}
}

// --exit-with-app given alone means success, before "--", before another
// flag and at the end; a word after it is its value.
func TestRunConfigExitWithAppBare(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--exit-with-app", "--", "envoy"}, "success"},
		{[]string{"-exit-with-app", "--", "envoy"}, "success"},
		{[]string{"--exit-with-app", "--proxy-uid", "0", "--", "envoy"}, "success"},
		{[]string{"--exit-with-app", "any", "--", "envoy"}, "any"},
		{[]string{"--exit-with-app", "off", "--", "envoy"}, "off"},
		{[]string{"--exit-with-app=true", "--", "envoy"}, "success"},
		{[]string{"--", "envoy", "--exit-with-app"}, "off"}, // the proxy's own argument
	}
	for _, tt := range tests {
		cfg, _, err := runConfig(tt.args, io.Discard)
		if err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		if got := string(cfg.Drain.ExitWithApp); got != tt.want {
			t.Errorf("%q: exit-with-app %s, want %s", tt.args, got, tt.want)
		}
		if last := cfg.Command[len(cfg.Command)-1]; tt.args[len(tt.args)-1] != last {
			t.Errorf("%q: command %q", tt.args, cfg.Command)
		}
	}
	if _, _, err := runConfig([]string{"--exit-with-app=sometimes", "--", "envoy"}, io.Discard); err == nil || !strings.Contains(err.Error(), "exit-with-app") {
		t.Errorf("a bad value: %v, want an error naming the flag", err)
	}
}

// --app-start-timeout: 2 minutes by default, set by the flag or its
// environment twin, 0 for no limit; a negative one is refused.
func TestRunConfigAppStartTimeout(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want time.Duration
	}{
		{[]string{"--exit-with-app", "--", "envoy"}, "", 2 * time.Minute},
		{[]string{"--exit-with-app", "--app-start-timeout", "30s", "--", "envoy"}, "", 30 * time.Second},
		{[]string{"--exit-with-app", "--", "envoy"}, "45s", 45 * time.Second},
		{[]string{"--exit-with-app", "--app-start-timeout", "0", "--", "envoy"}, "", 0},
	} {
		t.Setenv("DRAIND_APP_START_TIMEOUT", tc.env)
		cfg, _, err := runConfig(tc.args, io.Discard)
		if err != nil || cfg.Drain.AppStartTimeout != tc.want {
			t.Errorf("%q, env %q: %v, %v; want %v", tc.args, tc.env, cfg.Drain.AppStartTimeout, err, tc.want)
			continue
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%q: Validate: %v", tc.args, err)
		}
	}
	t.Setenv("DRAIND_APP_START_TIMEOUT", "")
	cfg, _, err := runConfig([]string{"--app-start-timeout", "-1s", "--", "envoy"}, io.Discard)
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		t.Error("--app-start-timeout -1s accepted")
	}
}

// Each mode flag of run accepts exactly its list's words, and its error
// names them: the lists in flows, appprocs, drain and agent are what the
// flags, agent.Config.Validate and the errors read.
func TestRunModeFlagsReadTheirLists(t *testing.T) {
	for _, tc := range []struct {
		flag  string
		words string
		got   func(agent.Config) string
	}{
		{"tracker", flows.Words(flows.TrackerModes, "|"), func(c agent.Config) string { return string(c.Tracker) }},
		{"app-procs", flows.Words(appprocs.Modes, "|"), func(c agent.Config) string { return string(c.AppProcs) }},
		{"host-network", flows.Words(agent.HostNetworks, "|"), func(c agent.Config) string { return string(c.HostNetwork) }},
		{"proxy", flows.Words(istio.ProxyKinds, "|"), func(c agent.Config) string { return string(c.ProxyKind) }},
		{"app-exit", flows.Words(drain.AppExits, "|"), func(c agent.Config) string { return string(c.Drain.AppExit) }},
		{"exit-with-app", flows.Words(drain.ExitWithApps, "|"), func(c agent.Config) string { return string(c.Drain.ExitWithApp) }},
		{"events", flows.Words(agent.EventsModes, "|"), func(c agent.Config) string { return string(c.Events) }},
	} {
		for w := range strings.SplitSeq(tc.words, "|") {
			cfg, _, err := runConfig([]string{"--" + tc.flag, w, "--", "envoy"}, io.Discard)
			if err != nil || tc.got(cfg) != w {
				t.Errorf("--%s %s: %q, %v", tc.flag, w, tc.got(cfg), err)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("--%s %s: Validate: %v", tc.flag, w, err)
			}
		}
		if _, _, err := runConfig([]string{"--" + tc.flag, "bogus", "--", "envoy"}, io.Discard); err == nil || !strings.Contains(err.Error(), "must be one of "+tc.words) {
			t.Errorf("--%s bogus: %v; want the words %s", tc.flag, err, tc.words)
		}
	}
	cfg := agent.DefaultConfig()
	cfg.Command = []string{"envoy"}
	cfg.Tracker = "bogus"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), flows.Words(flows.TrackerModes, "|")) {
		t.Errorf("Validate with tracker bogus: %v", err)
	}
}

// --debug-ring-size's default is the probe's: run passes 0, which the
// tracker and the probe read as probes.DefaultTCPRingSize, the size the
// help names.
func TestDebugRingSizeDefault(t *testing.T) {
	var help strings.Builder
	if _, _, err := runConfig([]string{"-h"}, &help); err == nil {
		t.Fatal("-h: no errHelp")
	}
	if want := fmt.Sprintf("0: %d KiB", probes.DefaultTCPRingSize>>10); !strings.Contains(help.String(), want) {
		t.Errorf("help does not say %q:\n%s", want, help.String())
	}
	cfg, _, err := runConfig([]string{"--", "envoy"}, io.Discard)
	if err != nil || cfg.RingSize != 0 {
		t.Errorf("default ring size %d (%v), want 0 (the probe's default)", cfg.RingSize, err)
	}
}

// --events: auto by default, off from the flag or its twin DRAIND_EVENTS.
func TestRunConfigEvents(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want agent.EventsMode
	}{
		{[]string{"--", "envoy"}, "", agent.EventsAuto},
		{[]string{"--", "envoy"}, "off", agent.EventsOff},
		{[]string{"--events", "auto", "--", "envoy"}, "off", agent.EventsAuto},
	} {
		t.Setenv("DRAIND_EVENTS", tc.env)
		cfg, _, err := runConfig(tc.args, io.Discard)
		if err != nil || cfg.Events != tc.want {
			t.Errorf("%q, DRAIND_EVENTS=%q: %q, %v; want %q", tc.args, tc.env, cfg.Events, err, tc.want)
		}
	}
}

func TestRunConfigGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     string
		want    time.Duration
		source  string
		wantErr string
	}{
		{[]string{"--", "envoy"}, "", 0, "", ""},
		{[]string{"--", "envoy"}, "60", time.Minute, "DRAIND_GRACE_PERIOD", ""},
		{[]string{"--grace-period", "90s", "--", "envoy"}, "60", 90 * time.Second, "--grace-period", ""},
		{[]string{"--grace-period", "0", "--", "envoy"}, "", 0, "", `a grace period must be positive`},
		{[]string{"--", "envoy"}, "soon", 0, "", `"soon" is neither whole seconds nor a duration`},
	} {
		t.Setenv("DRAIND_GRACE_PERIOD", tc.env)
		cfg, _, err := runConfig(tc.args, io.Discard)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q, DRAIND_GRACE_PERIOD=%q: %v, want %q", tc.args, tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || cfg.GracePeriod != tc.want || cfg.GracePeriodSource != tc.source {
			t.Errorf("%q, DRAIND_GRACE_PERIOD=%q: %s from %q, %v; want %s from %q", tc.args, tc.env, cfg.GracePeriod, cfg.GracePeriodSource, err, tc.want, tc.source)
		}
	}
}
