package drain

import (
	"fmt"
	"time"
)

// AppExit says when the app is done (--app-exit).
type AppExit string

// App-exit policies.
const (
	// AppExitWait waits for the app itself: its processes when they can be
	// seen, else its listeners and flows.
	AppExitWait AppExit = "wait"
	// AppExitFlows ends the app's part once no app flow holds the drain.
	AppExitFlows AppExit = "flows"
)

// ProcView says how much of the app's processes draind can see.
type ProcView uint8

const (
	// ProcsUnseen means no process tracking (no eBPF and no shared PID
	// namespace, a hostNetwork pod, or --app-procs off).
	ProcsUnseen ProcView = iota
	// ProcsComplete means every process of the namespace is seen.
	ProcsComplete
	// ProcsPartial means processes are seen, but the kernel could not
	// promise all of them (a truncated walk): a count of zero is not proof.
	ProcsPartial
)

// GateInput is everything the gate decides on. It is plain data, so the
// decision is a pure function, table-tested on its own.
type GateInput struct {
	Now time.Time
	// AppExit is the --app-exit policy; Gateway means there is no app to
	// wait for; WaitListeners (prestop --wait-listeners) also waits for the
	// app's listeners under AppExitFlows.
	AppExit       AppExit
	Gateway       bool
	WaitListeners bool
	// The app's processes, as far as ProcView goes.
	ProcView ProcView
	AppProcs int
	// The kernel's view of the app's sockets.
	AppListeners int
	AppHolding   int // app flows holding the drain (idle-expired excluded)
	// SocketsOnlyUntil is the time before which, with no process view
	// (ProcsUnseen), an app with no socket open is not done (SocketsOnly):
	// between two of its connections it has none, and nothing else shows it
	// alive. Zero: no such hold.
	SocketsOnlyUntil time.Time
	// NoProxy is true when there is no Envoy to wait for (prestop).
	NoProxy bool
	// EnvoyKnown is set when the admin API answered with listener gauges;
	// EnvoyActive is then the sum of downstream_cx_active over the traffic
	// listeners.
	EnvoyKnown  bool
	EnvoyActive int
	// Downstream is the kernel's count of Envoy's downstream flows (the
	// proxy's accepted connections on traffic listeners) that still hold
	// the drain; DownstreamIdle of them are idle past --idle-timeout.
	Downstream     int
	DownstreamIdle int
	IdleTimeout    time.Duration
	// DownstreamParked of the Downstream flows had finished their last
	// exchange at least ParkedAfter before a snapshot taken once the app
	// was gone, with nothing left to deliver (flows.Idle); the idle-expired
	// ones count too. The machine sets it only from such a snapshot.
	DownstreamParked int
	// AwaitSignal is true when the drain began at a native sidecar's
	// preStop hook, and the kubelet's SIGTERM (sent once every app
	// container has exited) has not come yet, nor has the app been seen
	// gone (AppSeenGone): the sidecar stays until one of them does.
	AwaitSignal bool
}

// HoldKind says which part of the gate holds.
type HoldKind uint8

// What can hold the gate.
const (
	HoldAppProcs HoldKind = iota + 1
	HoldAppSockets
	HoldAppFlows
	HoldEnvoyActive
	HoldEnvoyKernel
	HoldSettle
	HoldAwaitSignal
	// HoldMinDrain is the wait for the pod to leave its Services'
	// rotation (--min-drain, fixed or auto) before the gate: it holds the
	// drain while Draining (State.Holds). The gate never returns it.
	HoldMinDrain
)

// String is the kind's label in the log's hold_kinds (stable, unlike a
// hold's text).
func (k HoldKind) String() string {
	if int(k) >= len(holdKindNames) || holdKindNames[k] == "" {
		return "unknown"
	}
	return holdKindNames[k]
}

var holdKindNames = [...]string{
	HoldAppProcs: "app-procs", HoldAppSockets: "app-sockets", HoldAppFlows: "app-flows",
	HoldEnvoyActive: "envoy-active", HoldEnvoyKernel: "envoy-kernel", HoldSettle: "settle", HoldAwaitSignal: "await-signal",
	HoldMinDrain: "min-drain",
}

// Hold says what keeps the gate closed.
type Hold struct {
	Kind HoldKind
	What string
}

func (h Hold) String() string {
	who := "app"
	switch h.Kind {
	case HoldEnvoyActive, HoldEnvoyKernel:
		who = "envoy"
	case HoldSettle:
		who = "settle"
	case HoldAwaitSignal:
		who = "kubelet"
	case HoldMinDrain:
		who = "rotation"
	}
	return who + ": " + h.What
}

// SocketsOnlyHold is how long an app seen only by its sockets is held,
// however few it has open, after the trigger and after its listeners close:
// the recipe's fixed wait, which such an app had before --min-drain auto,
// and which covered its pauses between connections (docs/design.md, "When
// is the app done").
const SocketsOnlyHold = DefaultMinDrain

// SocketsOnly is the hold on an app seen only by its sockets. It runs
// SocketsOnlyHold from the trigger, and again from the first look that
// finds the app's listeners all closed after one that found some: an app
// that stops accepting at its SIGTERM (which may come long after the
// trigger, at the end of its preStop) still calls out through the proxy
// while it finishes, holding no socket between two calls. The zero value
// holds nothing.
type SocketsOnly struct {
	// Until is when the hold ends (GateInput.SocketsOnlyUntil).
	Until     time.Time
	listening bool
	closedAt  time.Time
}

// NewSocketsOnly is the hold from a trigger at t.
func NewSocketsOnly(t time.Time) SocketsOnly { return SocketsOnly{Until: t.Add(SocketsOnlyHold)} }

// Observe takes in a look at now that found listeners of the app's open.
func (s *SocketsOnly) Observe(now time.Time, listeners int) {
	switch {
	case s.Until.IsZero() || !s.closedAt.IsZero():
	case listeners > 0:
		s.listening = true
	case s.listening:
		s.closedAt = now
		s.Until = later(s.Until, now.Add(SocketsOnlyHold))
	}
}

// AwaitsClose reports whether the hold still waits to see the app's
// listeners close: the machine looks at each change of the flows until then.
func (s SocketsOnly) AwaitsClose() bool { return !s.Until.IsZero() && s.closedAt.IsZero() }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// AppDone applies "When is the app done?" (docs/design.md).
func AppDone(in GateInput) (bool, Hold) {
	sockets := func() (bool, Hold) {
		if in.AppListeners > 0 || in.AppHolding > 0 {
			return false, Hold{HoldAppSockets, fmt.Sprintf("%d listeners, %d flows", in.AppListeners, in.AppHolding)}
		}
		return true, Hold{}
	}
	switch {
	case in.Gateway:
		return true, Hold{}
	case in.AppExit == AppExitFlows:
		if in.WaitListeners {
			return sockets()
		}
		if in.AppHolding > 0 {
			return false, Hold{HoldAppFlows, fmt.Sprintf("%d flows", in.AppHolding)}
		}
		return true, Hold{}
	case in.ProcView != ProcsUnseen && in.AppProcs > 0:
		return false, Hold{HoldAppProcs, fmt.Sprintf("%d processes", in.AppProcs)}
	case in.ProcView == ProcsComplete:
		return true, Hold{}
	}
	// No process view, or one that cannot prove the app gone: zero
	// processes never overrides live app sockets.
	if ok, h := sockets(); !ok {
		return false, h
	}
	if socketsOnlyHeld(in) {
		return false, Hold{HoldAppSockets, "no socket open; seen by its sockets alone, held to the fixed wait"}
	}
	return true, Hold{}
}

// socketsOnlyHeld reports whether the app, seen only by its sockets, has
// none open before SocketsOnlyUntil.
func socketsOnlyHeld(in GateInput) bool {
	return in.ProcView == ProcsUnseen && in.Now.Before(in.SocketsOnlyUntil)
}

// ParkedAfter is how long a downstream connection must have been idle,
// with nothing queued, to count as parked once the app is gone. With the
// app gone nothing more can come from upstream: what is left is Envoy
// writing out what it already read (microseconds, or a send queue, which
// keeps a flow busy), so this only covers that race and the kernel's
// jiffy-grained times.
const ParkedAfter = 200 * time.Millisecond

// AppGone reports whether the app is done and nothing listens behind Envoy
// any more, so a request Envoy receives now can only fail (a 503). Never
// for a gateway, whose upstreams live elsewhere.
func AppGone(in GateInput) bool {
	if in.Gateway || in.AppListeners > 0 {
		return false
	}
	done, _ := AppDone(in)
	return done
}

// AppSeenGone reports whether every process of the app is seen gone, in a
// view that proves it (ProcsComplete), and nothing of it listens or holds.
// A native sidecar's SIGTERM says the same (the kubelet sends it once every
// app container has exited), only later: the kubelet's turn to stop the
// sidecar came 0.03–0.7 s after the app's exit in `make bench-rollout`, a
// wait in which Envoy could only answer 503. A view that cannot prove it
// (sockets only: an idle app has none; a partial walk) waits for the
// SIGTERM, and so does --app-exit flows (its app stays alive idle). The
// app's lingering flows do not count, as in AppDone: the processes decide.
func AppSeenGone(in GateInput) bool {
	return in.ProcView == ProcsComplete && in.AppProcs == 0 && AppGone(in)
}

// EnvoyDrained reports whether downstream_cx_active is 0, or every
// downstream flow the kernel still sees is idle past --idle-timeout, or,
// the app being gone, parked (a client's pooled keep-alive: Envoy's drain
// closes an HTTP/1.1 connection only after its next request, which would
// now get a 503; stopping Envoy closes it, and the client's next request
// goes to another pod). When the admin API does not answer, or Envoy keeps
// no listener gauges, the kernel's view of Envoy's downstream sockets
// decides alone (an admin that hangs must not hold the pod).
func EnvoyDrained(in GateInput) (bool, Hold) {
	if in.NoProxy || in.EnvoyKnown && in.EnvoyActive == 0 {
		return true, Hold{}
	}
	live := in.Downstream - in.DownstreamIdle
	if in.IdleTimeout > 0 && live == 0 {
		return true, Hold{}
	}
	if in.DownstreamParked > 0 && in.DownstreamParked >= in.Downstream && AppGone(in) {
		return true, Hold{}
	}
	if !in.EnvoyKnown {
		if in.Downstream == 0 {
			return true, Hold{}
		}
		return false, Hold{HoldEnvoyKernel, fmt.Sprintf("%d downstream flows (kernel view)", in.Downstream)}
	}
	return false, Hold{HoldEnvoyActive, fmt.Sprintf("%d active downstream connections", in.EnvoyActive)}
}

// Gate holds the decision for --settle: it opens only when both halves
// have been done for that long without a break.
type Gate struct {
	Settle    time.Duration
	doneSince time.Time
}

// Verdict is one evaluation of the gate.
type Verdict struct {
	Open  bool
	Holds []Hold
	// WakeAt, when not zero, is when to evaluate again even if nothing
	// changes (the end of --settle).
	WakeAt time.Time
}

// Kinds is the set of what holds, for logging when it changes.
func (v Verdict) Kinds() uint32 {
	var k uint32
	for _, h := range v.Holds {
		k |= 1 << h.Kind
	}
	return k
}

// Step evaluates the gate at in.Now.
func (g *Gate) Step(in GateInput) Verdict {
	var v Verdict
	if ok, h := AppDone(in); !ok {
		v.Holds = append(v.Holds, h)
	}
	if ok, h := EnvoyDrained(in); !ok {
		v.Holds = append(v.Holds, h)
	}
	if in.AwaitSignal && !AppSeenGone(in) {
		v.Holds = append(v.Holds, Hold{HoldAwaitSignal, "the sidecar's SIGTERM, sent once every app container has exited"})
	}
	if len(v.Holds) > 0 {
		g.doneSince = time.Time{}
		if socketsOnlyHeld(in) && in.AppListeners == 0 && in.AppHolding == 0 {
			v.WakeAt = in.SocketsOnlyUntil // the hold ends then, with no event
		}
		return v
	}
	if g.doneSince.IsZero() {
		g.doneSince = in.Now
	}
	if end := g.doneSince.Add(g.Settle); in.Now.Before(end) {
		v.Holds = []Hold{{HoldSettle, fmt.Sprintf("done for %s of %s", in.Now.Sub(g.doneSince), g.Settle)}}
		v.WakeAt = end
		return v
	}
	v.Open = true
	return v
}
