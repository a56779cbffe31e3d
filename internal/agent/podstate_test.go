package agent

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/draind/draind/internal/drain"
)

func TestNewPodState(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   drain.State
		now  time.Time
		want string
	}{
		{"ready", drain.State{Phase: drain.Ready, Shape: drain.ShapeSidecar}, t0,
			`{"version":1,"now":"2026-11-28T04:00:00Z","phase":"ready","pod_shape":"sidecar","holds":[],"held":[]}`},
		{"gating, held by a request",
			drain.State{Phase: drain.Gating, Cause: drain.CauseSignal, Shape: drain.ShapeClassicSidecar, Triggered: t0, Deadline: t0.Add(24 * time.Second),
				Holds: []drain.Hold{{Kind: drain.HoldAppFlows, What: "1 inbound flows"}},
				Held:  []drain.HeldFor{{Kind: drain.HoldMinDrain, For: 5 * time.Second}, {Kind: drain.HoldAppFlows, For: 1500 * time.Millisecond}}},
			t0.Add(6500 * time.Millisecond),
			`{"version":1,"now":"2026-11-28T04:00:06.5Z","phase":"gating","pod_shape":"classic-sidecar","trigger":"signal","triggered_at":"2026-11-28T04:00:00Z","deadline":"2026-11-28T04:00:24Z","since_trigger_ms":6500,"deadline_in_ms":17500,"holds":[{"kind":"app-flows","what":"1 inbound flows"}],"held":[{"kind":"min-drain","ms":5000},{"kind":"app-flows","ms":1500}]}`},
		{"out of rotation, counted by kind of peer",
			drain.State{Phase: drain.Gating, Cause: drain.CauseSignal, Shape: drain.ShapeClassicSidecar, Triggered: t0, Deadline: t0.Add(24 * time.Second),
				Rotation: &drain.RotationEnd{Took: 4200 * time.Millisecond, Why: drain.RotationQuiet, Connections: 31, Window: 800 * time.Millisecond,
					Peers: drain.PeerCounts{Pod: 2, Node: 27, Other: 2, Probes: 4}, MeanGap: 100 * time.Millisecond,
					Before: drain.ArrivalsBefore{Known: true, Count: 600, Span: time.Minute, Source: drain.RateFromEnvoy}}},
			t0.Add(4200 * time.Millisecond),
			`{"version":1,"now":"2026-11-28T04:00:04.2Z","phase":"gating","pod_shape":"classic-sidecar","trigger":"signal","triggered_at":"2026-11-28T04:00:00Z","deadline":"2026-11-28T04:00:24Z","since_trigger_ms":4200,"deadline_in_ms":19800,"holds":[],"held":[],` +
				`"rotation":{"why":"quiet","took_ms":4200,"window_ms":800,"mean_gap_ms":100,"connections":31,"from_pods":2,"from_node":27,"from_other":2,"probes_left_out":4,"rate_known":true,"rate_source":"envoy","connections_before":600,"before_ms":60000}}`},
		{"exited at the deadline",
			drain.State{Phase: drain.Exited, Cause: drain.CausePreStop, Shape: drain.ShapeNativeSidecar, Triggered: t0, Deadline: t0.Add(time.Second),
				End: &drain.StateEnd{Why: "deadline", Took: time.Second, Cut: true, OpenFlows: 2, ExitCode: 0, ExitCodeKnown: true}},
			t0.Add(2 * time.Second),
			`{"version":1,"now":"2026-11-28T04:00:02Z","phase":"exited","pod_shape":"native-sidecar","trigger":"prestop-hook","triggered_at":"2026-11-28T04:00:00Z","deadline":"2026-11-28T04:00:01Z","since_trigger_ms":2000,"deadline_in_ms":-1000,"holds":[],"held":[],"end":{"why":"deadline","clean":false,"took_ms":1000,"cut":true,"open_flows":2,"exit_code":0}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(NewPodState(tc.st, tc.now))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got\n%s\nwant\n%s", b, tc.want)
			}
		})
	}
}
