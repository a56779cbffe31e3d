package drain

import (
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// The out-of-rotation rule (--min-drain auto, docs/design.md "Out of
// rotation"): the pod has left its Services' rotation once no new
// connection from outside it came for a quiet window sized from its own
// arrival rate, never before the floor and never after the ceiling, both
// counted from the trigger.

// Defaults of the adaptive wait, each in this one place.
const (
	// DefaultRotationFloor is the shortest wait: the fastest endpoint
	// removal measured (the real cluster: kube-proxy's rule gone 0.1 s
	// after SIGTERM) is ten times shorter; a pod whose clients pause right
	// at the trigger still waits this long.
	DefaultRotationFloor = time.Second
	// DefaultRotationCeiling bounds the wait however slow the pod's
	// traffic (and a pod with none): it leaves 4.5 s of the default gate
	// deadline (19.5 s) to the gate.
	DefaultRotationCeiling = 15 * time.Second
	// QuietGaps is k: the window is k mean gaps between arrivals. For
	// Poisson arrivals a gap longer than k means comes with probability
	// e^-k (e^-8 = 3.4e-4).
	QuietGaps = 8
	// QuietMargin widens the window: a silence as long as one already seen
	// to end in a new connection since the trigger is no proof; the window
	// is at least this many times the longest gap seen since the trigger.
	QuietMargin = 2
	// MinQuiet is the shortest window: scheduling noise on the clients'
	// side and the kernel's event path make shorter silences meaningless.
	MinQuiet = 250 * time.Millisecond
	// UnknownQuiet is the window when the pod's rate before the trigger
	// is unknown (neither Envoy's listener counters nor the kernel's
	// count could be read) and nothing arrived since: the recipe's fixed
	// wait, since a pod whose clients pause longer than a second would
	// otherwise leave rotation while they still send.
	UnknownQuiet = QuietCap
	// RateSamples is how many connections since the trigger it takes to
	// size the window from their rate alone, when the rate before the
	// trigger is unknown: a mean gap estimated from n gaps makes a window of
	// k such gaps pass in silence with probability (1+k/n)^-n for Poisson
	// arrivals, 11 % for n = 1 and 0.15 % for n = 16 (e^-8 for n → ∞).
	// Fewer, and the window is UnknownQuiet (docs/design.md, "Out of
	// rotation", has the simulated figures).
	RateSamples = 16
	// QuietCap is the longest window: the fixed wait of the usual recipe
	// (pilot-agent's MINIMUM_DRAIN_DURATION, the app's `preStop: sleep
	// 5`). A pod whose rate is too low for silence to prove anything (an
	// idle one: no connection since it was Ready) waits in silence no
	// longer than the recipe would, not until the ceiling: little is at
	// stake where little arrives. While connections keep coming it waits
	// on, up to the ceiling.
	QuietCap = DefaultMinDrain
)

// ArrivalsBefore is what the pod received before the trigger: Count new
// connections over Span, read from Source (RateFromEnvoy). Known is false
// when nothing could be read.
type ArrivalsBefore struct {
	Known  bool
	Count  int64
	Span   time.Duration
	Source string
}

// RateFromEnvoy is where the rate before the trigger is read: Envoy's
// listener.*.downstream_cx_total over the traffic listeners.
const RateFromEnvoy = "envoy"

// ArrivalsSince is what arrived since the trigger: Count new inbound
// connections from outside the pod, the first and last at First and Last,
// MaxGap the longest gap between two of them (the trigger counts as the
// first's predecessor). Peers splits Count by kind of peer, and counts
// the probes left out of it.
type ArrivalsSince struct {
	Count       int64
	First, Last time.Time
	MaxGap      time.Duration
	Peers       PeerCounts
}

// PeerKind is the kind of peer a new inbound connection came from.
type PeerKind uint8

// Kinds of peer. A probe is told by its target (a probe port), not by its
// source: every other kind counts as traffic.
const (
	// PeerPod is an address on the pod's own link (another pod on the
	// node's bridge).
	PeerPod PeerKind = iota + 1
	// PeerNode is the node, by the pod's default gateway or the node's own
	// address: what the node forwards with masquerade (a NodePort, a
	// ClusterIP from the node, a hostNetwork pod).
	PeerNode
	// PeerOther is any other address: an outside client kept by
	// externalTrafficPolicy Local, a pod on another node or behind a
	// routed CNI.
	PeerOther
	// PeerProbe is a connection to a probe port (draind's status port,
	// Istio's ports, --probe-ports): never counted as traffic.
	PeerProbe
	// PeerUnknown is a polled counter's step (sock_diag mode), whose
	// connections' peers were never seen.
	PeerUnknown
)

// PeerCounts counts new inbound connections by kind of peer: the traffic
// the rule counted (Pod, Node, Other) and the probes it left out.
type PeerCounts struct {
	Pod, Node, Other, Unknown, Probes int64
}

// Add counts n connections of kind k.
func (c *PeerCounts) Add(k PeerKind, n int64) {
	switch k {
	case PeerPod:
		c.Pod += n
	case PeerNode:
		c.Node += n
	case PeerOther:
		c.Other += n
	case PeerUnknown:
		c.Unknown += n
	case PeerProbe:
		c.Probes += n
	}
}

// Add records n arrivals at t from peers not seen (n > 1: a counter's
// step, read at t), the trigger at start. An arrival stamped before the
// one it follows counts at that one's time (events are stamped as read,
// never before the trigger's reads). Bounded: nothing is kept per
// connection.
func (s *ArrivalsSince) Add(start, t time.Time, n int64) {
	s.AddFrom(start, t, n, PeerUnknown)
}

// AddFrom is Add for connections from peers of kind k; a probe is counted
// in Peers and nowhere else.
func (s *ArrivalsSince) AddFrom(start, t time.Time, n int64, k PeerKind) {
	if n <= 0 {
		return
	}
	s.Peers.Add(k, n)
	if k == PeerProbe {
		return
	}
	prev := start
	if s.Count > 0 {
		prev = s.Last
	} else {
		s.First = t
	}
	if t.Before(prev) {
		t = prev
	}
	s.MaxGap = max(s.MaxGap, t.Sub(prev))
	s.Count += n
	s.Last = t
}

// RotationInput is everything the rule decides on.
type RotationInput struct {
	Start, Now     time.Time // the trigger, now
	Before         ArrivalsBefore
	Since          ArrivalsSince
	Floor, Ceiling time.Duration
}

// RotationReason says why the wait ended (or will end).
type RotationReason uint8

// Why the pod is out of rotation.
const (
	RotationQuiet RotationReason = iota + 1
	RotationFloor
	RotationCeiling
)

// RotationReasons lists them, for the metrics.
var RotationReasons = []RotationReason{RotationQuiet, RotationFloor, RotationCeiling}

func (r RotationReason) String() string {
	switch r {
	case RotationQuiet:
		return "quiet"
	case RotationFloor:
		return "floor"
	case RotationCeiling:
		return "ceiling"
	}
	return "none"
}

// RotationVerdict is the rule's answer: Out now or not, and At, when the
// pod is (or will be, if no connection comes meanwhile) out; Window is
// the quiet window and Gap the mean gap it was sized from (0: unknown).
type RotationVerdict struct {
	Out    bool
	At     time.Time
	Why    RotationReason
	Window time.Duration
	Gap    time.Duration
}

// Quiet is the verdict's one-line account, for the log: why, and for how
// long no new connection came.
func (v RotationVerdict) Quiet(in RotationInput) string {
	quiet := v.At.Sub(quietFrom(in))
	switch v.Why {
	case RotationCeiling:
		return fmt.Sprintf("ceiling %s: quiet for %s after %d new connections (window %s)", in.Ceiling, quiet, in.Since.Count, v.Window)
	case RotationFloor:
		return fmt.Sprintf("floor %s: quiet for %s after %d new connections (window %s)", in.Floor, quiet, in.Since.Count, v.Window)
	}
	return fmt.Sprintf("quiet for %s after %d new connections", quiet, in.Since.Count)
}

// quietFrom is when the current silence began: the last arrival, or the
// trigger.
func quietFrom(in RotationInput) time.Time {
	if in.Since.Count > 0 && in.Since.Last.After(in.Start) {
		return in.Since.Last
	}
	return in.Start
}

// MeanGap is the pod's mean gap between new connections: the larger of the
// rate before the trigger (Span/Count; with no connection, at least Span)
// and since it (from the trigger to the last arrival, over their count).
// The larger is the safe one: a pod that slowed down, or whose clients
// already began to leave, gets the longer window. 0: unknown, as it is
// when the rate before is, until RateSamples connections came since.
func MeanGap(b ArrivalsBefore, s ArrivalsSince, start time.Time) time.Duration {
	var g time.Duration
	if b.Known && b.Span > 0 {
		g = b.Span / time.Duration(max(b.Count, 1))
	}
	if !b.Known && s.Count < RateSamples {
		return 0
	}
	if s.Count > 0 && s.Last.After(start) {
		g = max(g, s.Last.Sub(start)/time.Duration(s.Count))
	}
	return g
}

// OutOfRotation applies the rule. The window is k mean gaps (QuietGaps), at
// least QuietMargin times the longest gap seen since the trigger and at
// least MinQuiet (UnknownQuiet when no rate is known), at most QuietCap;
// the pod is out once the silence since the last arrival (or the trigger)
// lasted the window, but never before Floor and always at Ceiling.
func OutOfRotation(in RotationInput) RotationVerdict {
	gap := MeanGap(in.Before, in.Since, in.Start)
	window := UnknownQuiet
	if gap > 0 {
		window = max(QuietGaps*gap, MinQuiet)
		if gap > in.Ceiling/QuietGaps { // the product could overflow
			window = in.Ceiling
		}
	}
	window = min(max(window, QuietMargin*in.Since.MaxGap), QuietCap)
	v := RotationVerdict{Window: window, Gap: gap, Why: RotationQuiet}
	v.At = quietFrom(in).Add(window)
	if floor := in.Start.Add(in.Floor); v.At.Before(floor) {
		v.At, v.Why = floor, RotationFloor
	}
	if ceil := in.Start.Add(in.Ceiling); !v.At.Before(ceil) {
		v.At, v.Why = ceil, RotationCeiling
	}
	v.Out = !in.Now.Before(v.At)
	return v
}

// RotationEnd is how the adaptive wait ended: when after the trigger, why,
// what was counted, and what the window was sized from.
type RotationEnd struct {
	Took        time.Duration
	Why         RotationReason
	Connections int64
	Window      time.Duration
	// Account is the rule's one line: why, and how long it was quiet.
	Account string
	// Peers splits Connections by kind of peer, with the probes left out.
	Peers PeerCounts
	// MeanGap is the gap the window was sized from (0: unknown); Before
	// the rate before the trigger it came from.
	MeanGap time.Duration
	Before  ArrivalsBefore
}

// NewRotationEnd is the record of the verdict v, which ended the wait, on in.
func NewRotationEnd(in RotationInput, v RotationVerdict) RotationEnd {
	return RotationEnd{Took: in.Now.Sub(in.Start), Why: v.Why, Connections: in.Since.Count, Window: v.Window,
		Account: v.Quiet(in), Peers: in.Since.Peers, MeanGap: v.Gap, Before: in.Before}
}

// rotationState is the loop's state for the min-drain: a fixed wait, or
// --min-drain auto's wait for the pod to leave rotation.
type rotationState struct {
	// timer ends the min-drain: a fixed one's end, or (auto) the moment
	// the pod is out if nothing arrives meanwhile. Nil while not armed.
	timer *time.Timer
	// arrivals counts new connections (Parts.Arrivals; nil: the rule
	// knows no rate and sees no arrival).
	arrivals Arrivals
	// before is what arrived before the trigger: the rate that sizes the
	// quiet window.
	before ArrivalsBefore
	// end is how the wait ended, once over (Rotation): atomic, for the
	// status server.
	end atomic.Pointer[RotationEnd]
}

// Rotation is how the adaptive wait ended (false before, or without one).
func (m *Machine) Rotation() (RotationEnd, bool) {
	if r := m.rotation.end.Load(); r != nil {
		return *r, true
	}
	return RotationEnd{}, false
}

// minDrainHold is what holds while Draining.
func (m *Machine) minDrainHold() Hold {
	if m.cfg.MinDrainAuto {
		return Hold{HoldMinDrain, fmt.Sprintf("waiting to leave rotation (auto: %s to %s)", m.cfg.RotationFloor, m.cfg.RotationCeiling)}
	}
	return Hold{HoldMinDrain, "--min-drain " + m.cfg.MinDrain.String()}
}

// rotationInput is the out-of-rotation rule's input now.
func (m *Machine) rotationInput() RotationInput {
	in := RotationInput{Start: m.started, Now: time.Now(), Before: m.rotation.before, Floor: m.cfg.RotationFloor, Ceiling: m.cfg.RotationCeiling}
	if m.rotation.arrivals != nil {
		in.Since = m.rotation.arrivals.Since()
	}
	return in
}

// checkRotation applies the rule (--min-drain auto): out, the wait ends
// and the gate takes over; otherwise the min-drain timer is armed for the
// moment the pod is out if nothing arrives meanwhile (a connection that
// does moves it later, seen then). No wake-up per connection.
func (m *Machine) checkRotation() {
	in := m.rotationInput()
	v := OutOfRotation(in)
	if !v.Out {
		m.rotation.timer = time.NewTimer(v.At.Sub(in.Now))
		return
	}
	if m.rotation.arrivals != nil {
		m.rotation.arrivals.End()
	}
	end := NewRotationEnd(in, v)
	m.rotation.end.Store(&end)
	p := in.Since.Peers
	m.log.Info("out of rotation", logevent.OutOfRotation.Field(), zap.Duration("took", end.Took), zap.Stringer("why", v.Why),
		zap.String("account", end.Account), zap.Int64("connections", in.Since.Count),
		zap.Int64("from_pods", p.Pod), zap.Int64("from_node", p.Node), zap.Int64("from_other", p.Other), zap.Int64("from_unknown", p.Unknown),
		zap.Int64("probes_left_out", p.Probes), zap.Duration("quiet", in.Now.Sub(quietFrom(in))), zap.Duration("window", v.Window),
		zap.Duration("mean_gap", v.Gap), zap.Bool("rate_known", in.Before.Known), zap.String("rate_source", in.Before.Source),
		zap.Int64("connections_before", in.Before.Count), zap.Duration("before_span", in.Before.Span),
		zap.Float64("took_ms", float64(end.Took.Microseconds())/1e3))
	m.enter(Gating, zap.Duration("since_drain", end.Took), zap.Any("flows", m.flows.Observe()))
}

// endMinDrain ends the min-drain before its time (a native sidecar's app
// gone: nothing can be served any more).
func (m *Machine) endMinDrain() {
	if m.rotation.timer != nil {
		m.rotation.timer.Stop()
		m.rotation.timer = nil
	}
	if m.cfg.MinDrainAuto && m.rotation.arrivals != nil {
		m.rotation.arrivals.End()
	}
}
