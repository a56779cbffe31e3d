package agent

import (
	"time"

	"github.com/draind/draind/internal/drain"
)

// PodStateVersion is the version of GET /debug/state's answer. A field is
// only ever added; a change of meaning takes a new version.
const PodStateVersion = 1

// PodState is GET /debug/state: where this pod's drain stands, in a form
// made for `draind pods` on the node (which reaches it over the pod's
// loopback) and for people. It is built from the machine's published
// State: reading it costs no kernel or admin call.
type PodState struct {
	Version int       `json:"version"`
	Now     time.Time `json:"now"`
	// Phase is one of starting, ready, draining, gating, stopping, exited.
	Phase string `json:"phase"`
	// PodShape is the kind of pod (drain.PodShape.Name).
	PodShape string `json:"pod_shape"`
	// Trigger and the times: empty before the drain.
	Trigger     string     `json:"trigger,omitempty"`
	TriggeredAt *time.Time `json:"triggered_at,omitempty"`
	Deadline    *time.Time `json:"deadline,omitempty"`
	// SinceTriggerMS and DeadlineInMS are from Now (DeadlineInMS is
	// negative past the deadline).
	SinceTriggerMS int64 `json:"since_trigger_ms,omitempty"`
	DeadlineInMS   int64 `json:"deadline_in_ms,omitempty"`
	// Holds is what holds the drain now; Held what held it and how long.
	Holds []PodHold    `json:"holds"`
	Held  []PodHeldFor `json:"held"`
	// Rotation is how the wait for the pod to leave rotation ended
	// (--min-drain auto), once it has.
	Rotation *PodRotation `json:"rotation,omitempty"`
	End      *PodEnd      `json:"end,omitempty"`
}

// PodRotation is how --min-drain auto's wait ended: why (quiet, floor,
// ceiling), and what the rule counted from the trigger: new connections
// by kind of peer, and the probes it left out (docs/design.md, "Out of
// rotation").
type PodRotation struct {
	Why         string `json:"why"`
	TookMS      int64  `json:"took_ms"`
	WindowMS    int64  `json:"window_ms"`
	MeanGapMS   int64  `json:"mean_gap_ms"`
	Connections int64  `json:"connections"`
	FromPods    int64  `json:"from_pods"`
	FromNode    int64  `json:"from_node"`
	FromOther   int64  `json:"from_other"`
	FromUnknown int64  `json:"from_unknown,omitempty"`
	Probes      int64  `json:"probes_left_out"`
	// RateKnown is true when the rate before the trigger was read
	// (RateSource says from where), ConnectionsBefore over BeforeMS.
	RateKnown         bool   `json:"rate_known"`
	RateSource        string `json:"rate_source,omitempty"`
	ConnectionsBefore int64  `json:"connections_before"`
	BeforeMS          int64  `json:"before_ms"`
}

// PodHold is one thing that holds the drain: its kind (drain.HoldKind's
// stable name: app-procs, app-sockets, app-flows, envoy-active,
// envoy-kernel, settle, await-signal, min-drain) and what it is.
type PodHold struct {
	Kind string `json:"kind"`
	What string `json:"what"`
}

// PodHeldFor is how long one kind held the drain, in all.
type PodHeldFor struct {
	Kind string `json:"kind"`
	MS   int64  `json:"ms"`
}

// PodEnd is how the drain ended.
type PodEnd struct {
	Why          string `json:"why"`
	Clean        bool   `json:"clean"`
	TookMS       int64  `json:"took_ms"`
	Cut          bool   `json:"cut"`
	OpenFlows    int    `json:"open_flows,omitempty"`
	AppProcesses int    `json:"app_processes,omitempty"`
	ExitCode     *int   `json:"exit_code,omitempty"`
}

// NewPodState is st as GET /debug/state says it, at now.
func NewPodState(st drain.State, now time.Time) PodState {
	ps := PodState{Version: PodStateVersion, Now: now, Phase: st.Phase.String(), PodShape: st.Shape.Name(),
		Holds: make([]PodHold, len(st.Holds)), Held: make([]PodHeldFor, len(st.Held))}
	for i, h := range st.Holds {
		ps.Holds[i] = PodHold{Kind: h.Kind.String(), What: h.What}
	}
	for i, h := range st.Held {
		ps.Held[i] = PodHeldFor{Kind: h.Kind.String(), MS: h.For.Milliseconds()}
	}
	if st.Cause != drain.CauseNone {
		ps.Trigger = st.Cause.String()
		t, d := st.Triggered, st.Deadline
		ps.TriggeredAt, ps.Deadline = &t, &d
		ps.SinceTriggerMS, ps.DeadlineInMS = now.Sub(t).Milliseconds(), d.Sub(now).Milliseconds()
	}
	if r := st.Rotation; r != nil {
		ps.Rotation = &PodRotation{Why: r.Why.String(), TookMS: r.Took.Milliseconds(), WindowMS: r.Window.Milliseconds(), MeanGapMS: r.MeanGap.Milliseconds(),
			Connections: r.Connections, FromPods: r.Peers.Pod, FromNode: r.Peers.Node, FromOther: r.Peers.Other, FromUnknown: r.Peers.Unknown, Probes: r.Peers.Probes,
			RateKnown: r.Before.Known, RateSource: r.Before.Source, ConnectionsBefore: r.Before.Count, BeforeMS: r.Before.Span.Milliseconds()}
	}
	if e := st.End; e != nil {
		ps.End = &PodEnd{Why: e.Why, Clean: e.Clean, TookMS: e.Took.Milliseconds(), Cut: e.Cut, OpenFlows: e.OpenFlows, AppProcesses: e.AppProcesses}
		if e.ExitCodeKnown {
			c := e.ExitCode
			ps.End.ExitCode = &c
		}
	}
	return ps
}
