package envoy

import (
	"strings"
	"testing"
)

func TestDrainTellsAtOnce(t *testing.T) {
	for args, want := range map[string]bool{
		"": false, // Envoy's default: gradual, 600 s
		"-c /etc/envoy/envoy.yaml --drain-time-s 45 --drain-strategy immediate": true,
		"--drain-strategy=immediate":                          true,
		"--drain-strategy gradual":                            false,
		"--drain-strategy immediate --drain-strategy gradual": false,
		"--drain-time-s 0":                                    true,
		"--drain-time-s=0":                                    true,
		"--drain-time-s 00":                                   true,
		"--drain-time-s 10":                                   false,
		"--drain-time-s 30 --drain-strategy":                  false, // no value
		"--drain-strategy-x immediate":                        false,
	} {
		if got := DrainTellsAtOnce(strings.Fields(args)); got != want {
			t.Errorf("DrainTellsAtOnce(%q) = %v, want %v", args, got, want)
		}
	}
}
