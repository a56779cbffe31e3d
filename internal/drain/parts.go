package drain

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// The machine's parts: the interfaces behind which package agent puts the
// kernel's views, Envoy's admin API and the proxy process, so the machine
// knows nothing of Linux and its tests run on fakes.

// Tracking starts the kernel's live view of the pod (package agent: the
// flow tracker and the app's process source) at the drain trigger.
type Tracking interface {
	// Start returns once the views are current: attached, then
	// snapshot and walk.
	Start() error
}

// Flows is the kernel's view of the pod's flows, as the gate reads it.
// *flows.Tracker behind an adapter in package agent implements it.
type Flows interface {
	// Changed is signalled (coalesced) whenever what Observe returns may
	// have changed.
	Changed() <-chan struct{}
	// Observe reads the flows the gate decides on.
	Observe() FlowView
	// Refresh re-reads every flow from the kernel (idle times are only
	// measured by a snapshot).
	Refresh() error
	// Holding lists the flows that hold the gate, for the deadline report.
	Holding() []OpenFlow
}

// FlowView is what the gate reads from the flows.
type FlowView struct {
	AppListeners int `json:"app_listeners"`
	AppHolding   int `json:"app_holding"`
	// Downstream counts Envoy's downstream flows (its accepted connections
	// on traffic listeners) that hold the drain; DownstreamIdle of them are
	// idle past --idle-timeout.
	Downstream     int `json:"envoy_downstream"`
	DownstreamIdle int `json:"envoy_downstream_idle"`
	// DownstreamParked of them had been idle at least ParkedAfter, with
	// nothing left to deliver, when Measured (or are idle past
	// --idle-timeout).
	DownstreamParked int `json:"envoy_downstream_parked"`
	// IdleWake, when not zero, is the earliest moment a holding flow can
	// pass --idle-timeout: a fresh snapshot then tells. ParkedWake is the
	// same for ParkedAfter and the downstream flows not yet parked.
	IdleWake   time.Time `json:"-"`
	ParkedWake time.Time `json:"-"`
	// Measured is when the idle times were read (the last snapshot).
	Measured time.Time `json:"-"`
}

// OpenFlow is one flow still holding at the deadline.
type OpenFlow struct {
	Owner, Direction, State string
	Local, Remote           netip.AddrPort
	IdleMS                  int64
	Age                     time.Duration
}

// Arrivals counts the new inbound connections that reach the pod from
// outside it (not the kubelet's probes, not loopback), for --min-drain
// auto. *agent.arrivals implements it.
type Arrivals interface {
	// Begin is called once, at the trigger, once the tracking is live:
	// it returns what arrived before and starts counting what arrives
	// after.
	Begin(at time.Time) ArrivalsBefore
	// Since is what arrived since Begin.
	Since() ArrivalsSince
	// End says the wait is over: the counting may stop.
	End()
}

// Apps follows the app's processes. Nil when they are not followed.
type Apps interface {
	// Changed is signalled (coalesced) whenever the count may have changed.
	Changed() <-chan struct{}
	// Count is the number of the app's processes and how complete that
	// view is.
	Count() (int, ProcView)
	// MainExit is how the app's main process (a container's PID 1: its
	// parent is outside the namespace) last left, if one has.
	MainExit() (MainExit, bool)
}

// MainExit is how the app's main process ended.
type MainExit struct {
	// Seq tells exits apart: a later exit has a larger one.
	Seq uint64
	// Known is set when the kernel said how it ended, Success when it
	// exited 0.
	Known, Success bool
	Status         string // "exit 0", "signal 9", "unknown"
}

// Admin is Envoy's admin API. Every call returns by its context's end.
type Admin interface {
	// Live reports whether Envoy is LIVE with its workers started, or why
	// not.
	Live(ctx context.Context) (bool, string)
	// DrainListeners starts Envoy's graceful drain (inbound listeners only,
	// unless all). Repeating it is harmless.
	DrainListeners(ctx context.Context, inboundOnly bool) error
	// ActiveDownstream is the sum of downstream_cx_active over the traffic
	// listeners; ErrNoGauges when Envoy keeps no such gauges.
	ActiveDownstream(ctx context.Context) (int, error)
	// Gauges reports whether Envoy keeps the listener gauges at all.
	Gauges(ctx context.Context) (bool, error)
	// Quit asks Envoy to exit (POST /quitquitquit).
	Quit(ctx context.Context) error
}

// LiveHook is an Admin with work to do once, when Envoy is first LIVE,
// before the machine asks whether it keeps the listener gauges: learning
// its listeners (names to ports) and checking its configuration. It
// returns by its context's end.
type LiveHook interface {
	AtLive(ctx context.Context)
}

// ErrNoGauges means Envoy exposes no downstream_cx_active listener gauges
// (Istio's stats matcher hides them unless EXIT_ON_ZERO_ACTIVE_CONNECTIONS
// is set): the kernel's view of Envoy's sockets decides alone.
var ErrNoGauges = errors.New("envoy keeps no downstream_cx_active listener gauges")

// Proxy is the supervised proxy process.
type Proxy interface {
	// Exited is closed once the proxy has exited.
	Exited() <-chan struct{}
	// Signal signals the proxy's process group.
	Signal(sig syscall.Signal) error
	// ExitCode is the exit status once Exited is closed: the code, or
	// 128+N for signal N.
	ExitCode() int
	// ExitDescription says how it ended, for logs.
	ExitDescription() string
}

// Parts are the machine's inputs, handed to New: a running machine keeps
// its own copy, out of its callers' reach. Admin and Proxy are nil for prestop;
// Apps is nil when the app's processes are not followed.
type Parts struct {
	Flows Flows
	Apps  Apps
	Admin Admin
	Proxy Proxy
	// Tracking, when set, starts the live views Flows and Apps read, at
	// the trigger: nothing of them runs while the pod is Ready.
	Tracking Tracking
	// Arrivals, when set, counts new connections for --min-drain auto
	// (without it the rule knows no rate and sees no arrival).
	Arrivals Arrivals
	Log      *zap.Logger
	// Begun is when the process began (for the ready line's since_start).
	Begun time.Time
	// Reporter, when set, is told of the drain's start and end.
	Reporter Reporter
	// Untold, when set, closes Envoy's untold keep-alives as the pod
	// leaves rotation (UntoldCloser).
	Untold UntoldCloser
}

// Reporter is told of a drain's start and end (the pod's Kubernetes
// Events). Its methods are called on the machine's goroutine: they must
// not block (queue the state and return).
type Reporter interface {
	DrainBegan(State)
	DrainEnded(State)
}
