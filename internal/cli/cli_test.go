package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/draind/draind/internal/testenv/testutil"
)

func TestConnsJSONInNamespace(t *testing.T) {
	ns := testutil.NewNetNS(t)
	var ln net.Listener
	var err error
	ns.Do(t, func() { ln, err = net.Listen("tcp4", "127.0.0.1:8080") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	ns.Do(t, func() { c, err = net.Dial("tcp4", "127.0.0.1:8080") })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	var out, errb bytes.Buffer
	if err := Run(context.Background(), []string{"conns", "--netns", ns.Path(), "-o", "json"}, &out, &errb); err != nil {
		t.Fatalf("conns: %v (%s)", err, errb.String())
	}
	var got struct {
		Summary map[string]int `json:"summary"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	want := map[string]int{"app_listeners": 1, "app_inbound": 1, "app_outbound": 1, "proxy_listeners": 0, "proxy_flows": 0}
	for k, v := range want {
		if n, ok := got.Summary[k]; !ok || n != v {
			t.Errorf("summary[%s] = %d (present %v), want %d", k, n, ok, v)
		}
	}
	out.Reset()
	if err := Run(context.Background(), []string{"conns", "--netns", ns.Path()}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "127.0.0.1:8080") || !strings.Contains(out.String(), "app_inbound=1") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{"conns", "--bogus"}, nil, 2, "flag provided but not defined: -bogus"},
		{[]string{"conns", "-o", "yaml"}, nil, 2, "must be one of table|json"},
		{[]string{"conns", "--netns", "/x", "--pid", "1"}, nil, 2, "--netns and --pid are exclusive"},
		{[]string{"conns"}, map[string]string{"DRAIND_IDLE_TIMEOUT": "abc"}, 2, `DRAIND_IDLE_TIMEOUT="abc"`},
		{[]string{"conns", "--proxy-ports", "80,x"}, nil, 2, `"x" is not a port`},
		{[]string{"conns", "--netns", "/nonexistent"}, nil, 1, "netns /nonexistent: no such file or directory"},
		{[]string{"conns", "--pid", "1073741824"}, nil, 1, "pid 1073741824: no such process"},
		{[]string{"conns", "--admin-addr", "127.0.0.1:99999"}, nil, 2, `conns: --admin-addr "127.0.0.1:99999": port is not a number 0-65535`},
		{[]string{"conns", "--status-addr", "a\x01b:15020"}, nil, 2, `conns: --status-addr "a\x01b:15020": host has control characters`},
		{[]string{"frobnicate"}, nil, 2, `unknown command "frobnicate"`},
		{[]string{"drain", "--status-addr", "127.0.0.1:1"}, nil, 1, "drain: no draind run answers at http://127.0.0.1:1/drain?cause=prestop"},
		{[]string{"drain", "--status-addr", "nonsense"}, nil, 2, `drain: --status-addr "nonsense"`},
		{[]string{"run", "--exit-with-app", "sometimes", "--", "envoy"}, nil, 2, "must be one of off|success|any"},
		{[]string{"run", "--drain-deadline", "3s", "--", "envoy"}, nil, 2, "--drain-deadline 3s leaves no time to drain"},
		{[]string{"run", "--", "envoy"}, map[string]string{"TERMINATION_DRAIN_DURATION_SECONDS": "1m"}, 2, `TERMINATION_DRAIN_DURATION_SECONDS="1m"`},
		{[]string{"run", "--app-exit", "maybe", "--", "envoy"}, nil, 2, "must be one of wait|flows"},
		{[]string{"run", "--min-drain", "soon", "--", "envoy"}, nil, 2, `for flag -min-drain: "soon" is not a duration (e.g. 500ms, 5s, 1m) nor auto`},
		{[]string{"run", "--min-drain", "auto", "--min-drain-floor", "3s", "--min-drain-ceiling", "2s", "--", "envoy"}, nil, 2, "--min-drain-floor 3s is longer than --min-drain-ceiling 2s"},
		{[]string{"run", "--min-drain", "auto", "--min-drain-ceiling", "0s", "--", "envoy"}, nil, 2, "--min-drain-ceiling must be positive"},
		{[]string{"run", "--min-drain-floor", "1x", "--", "envoy"}, nil, 2, `"1x" is not a duration`},
		{[]string{"run", "--debug-proc-ring-size", "1024", "--", "envoy"}, nil, 2, "--debug-proc-ring-size 1024: must be 0 (the default) or a power of two of at least the page size"},
		{[]string{"run", "--debug-ring-size", "100000", "--", "envoy"}, nil, 2, "--debug-ring-size 100000: must be 0"},
		{[]string{"run", "--debug-ring-size", "-4096", "--", "envoy"}, nil, 2, "--debug-ring-size -4096: must be 0"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			err := Run(context.Background(), tt.args, &out, &errb)
			code := exitCode(err, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), tt.code, tt.want)
			}
			if strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
				t.Errorf("error is not one line: %q", errb.String())
			}
		})
	}
}
