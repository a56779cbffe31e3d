package agent

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The state metrics are read at scrape time: draind_tracker_info follows a
// fall back from eBPF to polling (it was labelled once, at start).
func TestStateMetricFollowsTheState(t *testing.T) {
	mode := "ebpf"
	reg := prometheus.NewRegistry()
	reg.MustRegister(newOneOf("draind_tracker_info", "mode", "mode", []string{"ebpf", "sockdiag"}, func() string { return mode }))
	want := func(ebpf, sockdiag string) string {
		return "# HELP draind_tracker_info mode\n# TYPE draind_tracker_info gauge\n" +
			"draind_tracker_info{mode=\"ebpf\"} " + ebpf + "\ndraind_tracker_info{mode=\"sockdiag\"} " + sockdiag + "\n"
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("1", "0"))); err != nil {
		t.Fatal(err)
	}
	mode = "sockdiag"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("0", "1"))); err != nil {
		t.Fatal(err)
	}
}
