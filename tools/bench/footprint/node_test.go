package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The workloads run for real (loopback sockets, fork+exec of /bin/true)
// and stop at their bound, whichever comes first.
func TestNodeLoad(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{loadTCP, loadFork} {
		t.Run(kind, func(t *testing.T) {
			for _, c := range []struct {
				args    []string
				wantOps string
			}{
				{[]string{"--for", "200ms", "--max", "50"}, "50"},      // the count bound
				{[]string{"--for", "100ms", "--max", "100000000"}, ""}, // the time bound
			} {
				var out bytes.Buffer
				cmd := exec.Command(self, append([]string{"nodeload", kind}, c.args...)...)
				cmd.Stdout, cmd.Stderr = &out, &out
				start := time.Now()
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v: %v: %s", c.args, err, out.String())
				}
				f := strings.Fields(out.String())
				if len(f) != 2 || (c.wantOps != "" && f[0] != c.wantOps) || f[0] == "0" {
					t.Errorf("%v: output %q, want %s operations", c.args, out.String(), c.wantOps)
				}
				if took := time.Since(start); took > 30*time.Second {
					t.Errorf("%v: took %s", c.args, took)
				}
			}
		})
	}
}

func TestNodeFlags(t *testing.T) {
	if err := nodeLoad([]string{"tcp", "--for", "1h"}); err == nil || !strings.Contains(err.Error(), "--for 1h0m0s") {
		t.Errorf("nodeload --for 1h: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("footprint node checks for root before its flags")
	}
	for _, c := range []struct{ args, want string }{
		{"--pods 40,10", "--pods 40,10: want ascending"},
		{"--pods 0", "--pods 0: want ascending"},
		{"--sockdiag-pods x", `--sockdiag-pods: "x" is not a count`},
		{"--load-for 0s", "--load-for 0s"},
		{"--repeat 0", "--repeat in [1, 20]"},
	} {
		err := run(t.Context(), append([]string{"node"}, strings.Fields(c.args)...), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.args, err, c.want)
		}
	}
}

// The hook for drain trigger → tracking live: the field on a JSON line
// after the SIGTERM, as a zap duration or a number of milliseconds.
func TestTrackingLiveField(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
	}{
		{`{"msg":"tracking","tracking_live":"12.5ms"}`, 12500 * time.Microsecond},
		{`{"msg":"tracking","tracking_live_ms":3.25}`, 3250 * time.Microsecond},
		{`{"msg":"phase","phase":"draining"}`, -1},
	} {
		p := &nodePod{agent: &agentProc{lines: []line{
			{at: time.Second, text: `{"msg":"tracking","tracking_live":"99ms"}`}, // before the trigger
			{at: 3 * time.Second, text: c.line},
		}}, sigAt: 2 * time.Second}
		if got := p.trackingLive(); got != c.want {
			t.Errorf("%s: %v, want %v", c.line, got, c.want)
		}
	}
}
