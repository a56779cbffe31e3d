package agent

import (
	"fmt"
	"time"
)

// App-exit policies (--app-exit).
const (
	// AppExitWait waits for the app itself: its processes when they can be
	// seen, else its listeners and flows.
	AppExitWait = "wait"
	// AppExitFlows ends the app's part once no app flow holds the drain.
	AppExitFlows = "flows"
)

// GateInput is everything the gate decides on. It is plain data, so the
// decision is a pure function, table-tested on its own.
type GateInput struct {
	Now time.Time
	// AppExit is AppExitWait or AppExitFlows; Gateway means there is no
	// app to wait for.
	AppExit string
	Gateway bool
	// AppProcsKnown is set when the app's processes can be seen (eBPF or
	// /proc); AppProcs is then their number.
	AppProcsKnown bool
	AppProcs      int
	// The kernel's view of the app's sockets.
	AppListeners int
	AppHolding   int // app flows holding the drain (idle-expired excluded)
	// EnvoyKnown is set when the admin API answered; EnvoyActive is then
	// the sum of downstream_cx_active over the traffic listeners.
	EnvoyKnown  bool
	EnvoyActive int
	// ProxyDownstream is the kernel's count of Envoy's downstream flows
	// (proxy inbound, on traffic ports) that still hold the drain;
	// ProxyDownstreamIdle of them are idle past --idle-timeout.
	ProxyDownstream     int
	ProxyDownstreamIdle int
	IdleTimeout         time.Duration
}

// Hold says what keeps the gate closed.
type Hold struct {
	Who  string `json:"who"` // "app" or "envoy"
	What string `json:"what"`
}

func (h Hold) String() string { return h.Who + ": " + h.What }

// AppDone applies "When is the app done?" (DESIGN.md).
func AppDone(in GateInput) (bool, Hold) {
	switch {
	case in.Gateway:
		return true, Hold{}
	case in.AppExit == AppExitFlows:
		if in.AppHolding > 0 {
			return false, Hold{"app", fmt.Sprintf("%d flows", in.AppHolding)}
		}
		return true, Hold{}
	case in.AppProcsKnown:
		if in.AppProcs > 0 {
			return false, Hold{"app", fmt.Sprintf("%d processes", in.AppProcs)}
		}
		return true, Hold{}
	case in.AppListeners > 0 || in.AppHolding > 0:
		return false, Hold{"app", fmt.Sprintf("%d listeners, %d flows", in.AppListeners, in.AppHolding)}
	}
	return true, Hold{}
}

// EnvoyDrained: downstream_cx_active is 0, or every downstream flow the
// kernel still sees is idle past --idle-timeout. When the admin API does
// not answer, the kernel's view of Envoy's downstream sockets decides
// alone (an admin that hangs must not hold the pod).
func EnvoyDrained(in GateInput) (bool, Hold) {
	if in.EnvoyKnown && in.EnvoyActive == 0 {
		return true, Hold{}
	}
	live := in.ProxyDownstream - in.ProxyDownstreamIdle
	if in.IdleTimeout > 0 && live == 0 {
		return true, Hold{}
	}
	if !in.EnvoyKnown {
		if in.ProxyDownstream == 0 {
			return true, Hold{}
		}
		return false, Hold{"envoy", fmt.Sprintf("%d downstream flows (admin API not answering)", in.ProxyDownstream)}
	}
	return false, Hold{"envoy", fmt.Sprintf("%d active downstream connections", in.EnvoyActive)}
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

// Step evaluates the gate at in.Now.
func (g *Gate) Step(in GateInput) Verdict {
	var v Verdict
	if ok, h := AppDone(in); !ok {
		v.Holds = append(v.Holds, h)
	}
	if ok, h := EnvoyDrained(in); !ok {
		v.Holds = append(v.Holds, h)
	}
	if len(v.Holds) > 0 {
		g.doneSince = time.Time{}
		return v
	}
	if g.doneSince.IsZero() {
		g.doneSince = in.Now
	}
	if end := g.doneSince.Add(g.Settle); in.Now.Before(end) {
		v.Holds = []Hold{{"settle", fmt.Sprintf("done for %s of %s", in.Now.Sub(g.doneSince), g.Settle)}}
		v.WakeAt = end
		return v
	}
	v.Open = true
	return v
}
