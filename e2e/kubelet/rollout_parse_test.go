package kubelet_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// logOf is a podLog holding text, its stream ended.
func logOf(text string) *podLog {
	l := &podLog{done: make(chan struct{})}
	l.buf.WriteString(text)
	close(l.done)
	return l
}

// TestRolloutLogParsing checks the rollout's reading of the containers'
// logs (kubelet timestamps, the app's lines, draind's gate lines) on
// lines shaped as the cluster gives them.
func TestRolloutLogParsing(t *testing.T) {
	at := func(s string) time.Time {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	app := strings.Join([]string{
		"2026-11-28T13:00:00.100000000Z ready 1",
		"2026-11-28T13:00:05.000000000Z term 2 terminated",
		"2026-11-28T13:00:05.100000000Z ok 0",
		"2026-11-28T13:00:05.200000000Z fail 1 Get \"http://10.0.0.9/\": dial tcp: connection refused",
		"2026-11-28T13:00:07.500000000Z exit 3 0",
	}, "\n")
	proxy := strings.Join([]string{
		`2026-11-28T13:00:03.950000001Z {"level":"info","ts":"2026-11-28T13:00:03.950Z","msg":"phase","event":"phase","phase":"draining"}`,
		`2026-11-28T13:00:04.000000002Z 2026-11-28T13:00:04.000000Z	info	pilot-agent's own line, not JSON`,
		`2026-11-28T13:00:06.000000001Z {"level":"info","ts":"2026-11-28T13:00:06.250Z","msg":"phase","event":"phase","phase":"gating"}`,
		`2026-11-28T13:00:06.000000002Z {"level":"info","ts":"2026-11-28T13:00:06.254Z","msg":"closed the untold keep-alives","event":"untold_closed","found":3,"closed":2}`,
		`2026-11-28T13:00:06.300000001Z {"level":"info","ts":"2026-11-28T13:00:06.300Z","msg":"gate holds","event":"gate_holds","hold_kinds":["app-procs"]}`,
		`2026-11-28T13:00:07.600000001Z {"level":"info","ts":"2026-11-28T13:00:07.600Z","msg":"phase","event":"phase","phase":"stopping"}`,
	}, "\n")
	p := &podLife{name: "web-1", proxy: "envoy", logs: map[string]*podLog{"app": logOf(app), "envoy": logOf(proxy)},
		deleting: at("2026-11-28T13:00:03.9Z"), gone: at("2026-11-28T13:00:07.8Z")}
	if got, want := p.appExit(), at("2026-11-28T13:00:07.5Z"); !got.Equal(want) {
		t.Errorf("appExit = %v, want %v", got, want)
	}
	if got, want := p.minDrainEnd(), at("2026-11-28T13:00:06.25Z"); !got.Equal(want) {
		t.Errorf("minDrainEnd = %v, want %v", got, want)
	}
	if found, closed := p.untold(); found != 3 || closed != 2 {
		t.Errorf("untold = %d found, %d closed; want 3, 2", found, closed)
	}
	if got, want := p.stopping(), at("2026-11-28T13:00:07.6Z"); !got.Equal(want) {
		t.Errorf("stopping = %v, want %v", got, want)
	}
	if got := p.stepAt(at("2026-11-28T13:00:05.2Z")); got != "web-1: app SIGTERM 200ms before" {
		t.Errorf("stepAt = %q", got)
	}
	if got, want := p.proxyLastLine(), at("2026-11-28T13:00:07.600000001Z"); !got.Equal(want) {
		t.Errorf("proxyLastLine = %v, want %v", got, want)
	}
	// A drain that goes from its min-drain straight to the stop.
	p.logs["envoy"] = logOf(strings.Join([]string{
		`2026-11-28T13:00:04.000000001Z {"ts":"2026-11-28T13:00:04.000Z","event":"phase","phase":"draining"}`,
		`2026-11-28T13:00:09.000000001Z {"ts":"2026-11-28T13:00:09.000Z","event":"phase","phase":"stopping"}`,
	}, "\n"))
	if got, want := p.minDrainEnd(), at("2026-11-28T13:00:09Z"); !got.Equal(want) {
		t.Errorf("minDrainEnd (straight to the stop) = %v, want %v", got, want)
	}
	// pilot-agent's log alone: no min-drain of draind's.
	p.logs["envoy"] = logOf("2026-11-28T13:00:04.000000002Z 2026-11-28T13:00:04.000000Z\tinfo\tAgent draining Proxy")
	if got := p.minDrainEnd(); !got.IsZero() {
		t.Errorf("minDrainEnd (pilot-agent) = %v, want zero", got)
	}

	// A failure's steps for the table: each terminating pod's, in the
	// lifecycle's order.
	p.logs["envoy"] = logOf(proxy)
	q := &podLife{name: "web-2", proxy: "envoy", logs: map[string]*podLog{"app": logOf(""), "envoy": logOf("")},
		deleting: at("2026-11-28T13:00:05.1Z"), gone: at("2026-11-28T13:00:09Z")}
	r := &podLife{name: "web-3", proxy: "envoy", logs: map[string]*podLog{"app": logOf(""), "envoy": logOf("")},
		deleting: at("2026-11-28T13:00:05.15Z"), gone: at("2026-11-28T13:00:09Z")}
	pl := &podLives{pods: map[string]*podLife{"web-1": p, "web-2": q, "web-3": r}}
	for _, c := range []struct{ at, want string }{
		{"2026-11-28T13:00:03.0Z", "no pod terminating"},
		{"2026-11-28T13:00:04.5Z", "deleting"},
		{"2026-11-28T13:00:05.2Z", "deleting ×2, app SIGTERM"},
		{"2026-11-28T13:00:07.7Z", "deleting ×2, proxy's last log line"},
		{"2026-11-28T13:00:08.0Z", "deleting ×2"},
	} {
		if got := pl.stepsKey(at(c.at)); got != c.want {
			t.Errorf("stepsKey(%s) = %q, want %q", c.at, got, c.want)
		}
	}
	// A burst: the span of steps alone.
	for i := range stepsKeyPods {
		name := fmt.Sprint("web-b", i)
		pl.pods[name] = &podLife{name: name, proxy: "envoy", logs: map[string]*podLog{"app": logOf(""), "envoy": logOf("")},
			deleting: at("2026-11-28T13:00:05.15Z"), gone: at("2026-11-28T13:00:09Z")}
	}
	if got, want := pl.stepsKey(at("2026-11-28T13:00:05.2Z")), "8 pods, deleting to app SIGTERM"; got != want {
		t.Errorf("stepsKey (a burst) = %q, want %q", got, want)
	}

	sum, fails, err := parseLoad(strings.Join([]string{
		`2026-11-28T13:00:06.000000000Z {"t":1795870806000000000,"class":"refused","err":"dial tcp: connection refused"}`,
		`2026-11-28T13:01:00.000000000Z {"sent":1200,"ok":1199,"failed":1,"by_class":{"refused":1}}`,
	}, "\n"))
	if err != nil || sum.Sent != 1200 || sum.Failed != 1 || len(fails) != 1 || fails[0].class != "refused" {
		t.Errorf("parseLoad = %+v, %+v, %v", sum, fails, err)
	}
}

// TestCPUWatch: the watch counts this process's own busy loop under its
// command name.
func TestCPUWatch(t *testing.T) {
	w := watchCPU()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
	}
	got := w.String()
	t.Log(got)
	if !strings.Contains(got, "node busy") || !strings.Contains(got, "kubelet.test") {
		t.Errorf("watch = %q, want the node's load with this test's own command", got)
	}
}

// TestConvergenceSummary checks the reading of istiod's convergence
// histogram: an event's pushes are the difference of two reads, the
// median interpolated within its bucket.
func TestConvergenceSummary(t *testing.T) {
	// Bounds .1, .5, 1, 3, 5, 10, 20, 30, +Inf; cumulative counts.
	before := []float64{10, 12, 12, 12, 12, 12, 12, 12, 12}
	for _, tc := range []struct {
		name  string
		after []float64
		want  string
	}{
		{"none", before, "0 pushes"},
		{"all under 100 ms", []float64{14, 16, 16, 16, 16, 16, 16, 16, 16}, "4 pushes p50 0.05s max ≤0.1s"},
		{"spread", []float64{11, 14, 16, 20, 20, 20, 20, 20, 20}, "8 pushes p50 1.00s max ≤3s"},
		{"past the last bound", []float64{10, 12, 12, 12, 12, 12, 12, 12, 14}, "2 pushes p50 +Infs max ≤+Inf"},
	} {
		if got := convergenceSummary(before, tc.after); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := convergenceSummary(nil, before); got != "unknown" {
		t.Errorf("no first read: %q, want unknown", got)
	}
}

func TestDurQuantiles(t *testing.T) {
	ms := func(ns ...int) (ds []time.Duration) {
		for _, n := range ns {
			ds = append(ds, time.Duration(n)*time.Millisecond)
		}
		return ds
	}
	for _, tc := range []struct {
		in   []time.Duration
		want string
	}{
		{nil, "none"},
		{ms(300, 100, 200), "3 p50 200ms max 300ms"},
		{ms(400, 100, 300, 200), "4 p50 200ms max 400ms"},
	} {
		if got := durQuantiles(tc.in); got != tc.want {
			t.Errorf("durQuantiles(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
