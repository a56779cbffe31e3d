package kubeevents

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/draind/draind/internal/drain"
)

func TestBeganText(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 3, 40, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   drain.State
		want string
	}{
		{"SIGTERM, classic", drain.State{Phase: drain.Draining, Cause: drain.CauseSignal, Shape: drain.ShapeClassicSidecar, Triggered: t0, Deadline: t0.Add(22500 * time.Millisecond)},
			"Drain started by signal (pod shape classic-sidecar): readiness fails, Envoy drains its listeners; draind waits for the app's work at most 22.5s (until 03:40:22 UTC), then stops the proxy"},
		{"preStop hook, native", drain.State{Phase: drain.Draining, Cause: drain.CausePreStop, Shape: drain.ShapeNativeSidecar, Triggered: t0, Deadline: t0.Add(20 * time.Second)},
			"Drain started by prestop-hook (pod shape native-sidecar): readiness fails, Envoy drains its listeners; draind waits for the app's work at most 20s (until 03:40:20 UTC), then stops the proxy"},
		{"no deadline known", drain.State{Cause: drain.CauseAppDone, Shape: drain.ShapeJob},
			"Drain started by app-done (pod shape job): readiness fails, Envoy drains its listeners"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := BeganText(tc.st)
			want := Text{Type: TypeNormal, Reason: ReasonStarted, Message: tc.want}
			if got != want {
				t.Errorf("BeganText\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestEndedText(t *testing.T) {
	held := []drain.HeldFor{{Kind: drain.HoldAppProcs, For: 3012 * time.Millisecond}, {Kind: drain.HoldEnvoyKernel, For: 2900400 * time.Microsecond}}
	for _, tc := range []struct {
		name string
		st   drain.State
		want Text
	}{
		{"clean, held by a request in flight",
			drain.State{Held: held, End: &drain.StateEnd{Why: "drained", Clean: true, Took: 3015 * time.Millisecond, ExitCodeKnown: true}},
			Text{TypeNormal, ReasonDrained, "Drained in 3.015s; held longest by app-procs (3.012s); held by app-procs 3.012s, envoy-kernel 2.9s; proxy stopped: drained (exit code 0)"}},
		{"a hold of a moment is not listed",
			drain.State{Held: []drain.HeldFor{{Kind: drain.HoldMinDrain, For: 300 * time.Microsecond}, held[0], held[1]}, End: &drain.StateEnd{Why: "drained", Clean: true, Took: 3304 * time.Millisecond, ExitCodeKnown: true}},
			Text{TypeNormal, ReasonDrained, "Drained in 3.304s; held longest by app-procs (3.012s); held by app-procs 3.012s, envoy-kernel 2.9s; proxy stopped: drained (exit code 0)"}},
		{"clean, one kind",
			drain.State{Held: []drain.HeldFor{{Kind: drain.HoldMinDrain, For: 5 * time.Second}}, End: &drain.StateEnd{Why: "drained", Clean: true, Took: 5001 * time.Millisecond, ExitCodeKnown: true}},
			Text{TypeNormal, ReasonDrained, "Drained in 5.001s; held longest by min-drain (5s); proxy stopped: drained (exit code 0)"}},
		{"nothing held",
			drain.State{End: &drain.StateEnd{Why: "drained", Clean: true, Took: 12 * time.Millisecond}},
			Text{TypeNormal, ReasonDrained, "Drained in 12ms; nothing held it; proxy stopped: drained"}},
		{"cut by the deadline",
			drain.State{Held: []drain.HeldFor{{Kind: drain.HoldAppFlows, For: 22500 * time.Millisecond}}, End: &drain.StateEnd{Why: "deadline", Took: 22500 * time.Millisecond, Cut: true, OpenFlows: 2, AppProcesses: 1, ExitCodeKnown: true}},
			Text{TypeWarning, ReasonCut, "Drain cut by the deadline after 22.5s: 2 flows still open, 1 app process still running; held longest by app-flows (22.5s); proxy stopped: deadline (exit code 0)"}},
		{"cut, one flow, processes",
			drain.State{Held: []drain.HeldFor{{Kind: drain.HoldAppProcs, For: time.Second}}, End: &drain.StateEnd{Why: "deadline", Took: time.Second, Cut: true, OpenFlows: 1, AppProcesses: 3}},
			Text{TypeWarning, ReasonCut, "Drain cut by the deadline after 1s: 1 flow still open, 3 app processes still running; held longest by app-procs (1s); proxy stopped: deadline"}},
		{"proxy killed",
			drain.State{Held: held[:1], End: &drain.StateEnd{Why: "drained; proxy had to be killed", Took: 3 * time.Second, ExitCode: 137, ExitCodeKnown: true}},
			Text{TypeWarning, ReasonIncomplete, "Drain incomplete after 3s; held longest by app-procs (3.012s); proxy stopped: drained; proxy had to be killed (exit code 137)"}},
		{"proxy left on its own",
			drain.State{End: &drain.StateEnd{Why: "proxy exited with code 1 during the drain", Took: 800 * time.Millisecond, ExitCode: 1, ExitCodeKnown: true}},
			Text{TypeWarning, ReasonIncomplete, "Drain incomplete after 800ms; nothing held it; proxy stopped: proxy exited with code 1 during the drain (exit code 1)"}},
		{"no end (never published so)",
			drain.State{},
			Text{TypeWarning, ReasonIncomplete, "Drain incomplete after 0s; nothing held it; proxy stopped: unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EndedText(tc.st); got != tc.want {
				t.Errorf("EndedText\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// A message stays within the API server's limit, in whole runes.
func TestClip(t *testing.T) {
	long := strings.Repeat("é", MaxMessage)
	got := clip(long)
	if len(got) > MaxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("clip: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if clip("short") != "short" {
		t.Error("a short message changed")
	}
}
