package drain

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

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
	// End: the wait is over; the counting may stop.
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
	// Known: the kernel said how it ended; Success: it exited 0.
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

// Result is how the machine ended.
type Result struct {
	// ExitCode is what draind exits with: 0 after a drain where the proxy
	// stopped when asked (also at the deadline), the proxy's code (or
	// 128+signal) when it ended on its own, 137 when it had to be killed.
	ExitCode int
	Reason   string
	// Clean is set when the gate opened: the app was done and Envoy
	// drained (for prestop: the app's flows were done).
	Clean bool
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

// DrainListenersState is where the drain_listeners call stands.
type DrainListenersState int32

// States of the drain_listeners call.
const (
	DrainListenersNotSent DrainListenersState = iota
	DrainListenersRetrying
	DrainListenersDone
	DrainListenersGaveUp // the drain ended before it succeeded
)

func (s DrainListenersState) String() string {
	return [...]string{"not-sent", "retrying", "done", "gave-up"}[s]
}

// GaugesState says whether Envoy keeps the listener gauges.
type GaugesState int32

// States of the gauge check (made once Envoy is LIVE).
const (
	GaugesUnknown GaugesState = iota
	GaugesPresent
	GaugesAbsent
)

func (s GaugesState) String() string { return [...]string{"unknown", "present", "absent"}[s] }

// Machine is the drain state machine. Build it with New, run it once.
type Machine struct {
	cfg Config
	// liveWork runs f on a goroutine Run owns, with a context Run cancels
	// and waits on as it returns (set by Run).
	liveWork func(f func(context.Context))
	// The parts (Parts), fixed at New.
	flows    Flows
	apps     Apps
	admin    Admin
	proxy    Proxy
	tracking Tracking
	arrivals Arrivals
	reporter Reporter
	untold   UntoldCloser
	log      *zap.Logger
	begun    time.Time

	inputs chan input

	phase   atomic.Int32
	cause   atomic.Int32
	dlState atomic.Int32
	dlTries atomic.Int64
	// dlAt is when drain_listeners succeeded (Unix ns; 0 before): from
	// then on Envoy's responses tell clients to go (Untold).
	dlAt    atomic.Int64
	gauges  atomic.Int32
	drainNS atomic.Int64 // from the trigger to the stop, once stopping
	// The adaptive wait's end (--min-drain auto), once over.
	rotation atomic.Pointer[RotationEnd]
	// untoldRes is what closing the untold keep-alives did, once done.
	untoldRes atomic.Pointer[UntoldClosed]
	// state is the last State published (State, Watch), with the channel
	// closed when a newer one is.
	state atomic.Pointer[published]

	// Owned by Run's goroutine.
	started time.Time // the trigger
	// awaitSignal: drained from the preStop hook, the kubelet's SIGTERM
	// not yet come (a native sidecar).
	awaitSignal bool
	// adminQuietUntil: ActiveDownstream failed; not asked again before.
	adminQuietUntil time.Time
	// appGoneAt is when the gate first saw the app gone (AppGone): only a
	// snapshot taken after it tells which downstream flows are parked.
	// lastRefresh is the machine's last re-read of the flows.
	appGoneAt, lastRefresh time.Time
	// failedSeq is the last failed main exit said to stay (success mode).
	failedSeq uint64
	gate      Gate
	// held adds up what held the drain (State.Held); curHolds is what
	// holds now.
	held     holdTimes
	curHolds []Hold
	// holdsLog keeps a flapping hold from filling the log.
	holdsLog holdsLog
	// cut is what the deadline left open (State's end).
	cut *StateEnd
	// late: the gate deadline came before a native sidecar's SIGTERM and
	// the gate held on to the late one (internal/drain/late_stop.go): the
	// stop skips SIGTERM after a quit that worked.
	late bool
	// lateGone: past the gate deadline the app went (the SIGTERM, or
	// seen gone); the gate has LateAppGoneWait to open. signalAt is when
	// a native sidecar's SIGTERM came.
	lateGone bool
	signalAt time.Time
	// socketsOnly: the app is seen by its sockets alone, and held
	// (GateInput.SocketsOnlyUntil).
	socketsOnly SocketsOnly
	// before is what arrived before the trigger (--min-drain auto).
	before   ArrivalsBefore
	backoff  time.Duration
	timers   timers
	liveC    chan struct{}
	stopLive func()
	stopDL   func()

	// watching is when Run began watching the app under --exit-with-app
	// (its process source is live by then): --app-start-timeout counts
	// from it.
	watching time.Time
}

// published is one State and the channel closed once it is superseded.
type published struct {
	st   State
	next chan struct{}
}

type input struct {
	cause Cause // CauseNone: a quit
}

// timers are the loop's: each channel is nil while its timer is not armed.
type timers struct {
	minDrain, deadline, wake *time.Timer
	refreshAt                time.Time // the wake is (also) a re-read of the flows
	// appDone runs while the app looks done under --exit-with-app, for the
	// verdict's After (the restart grace, the rest of the start timeout);
	// appDoneOn is the verdict it waits on.
	appDone   *time.Timer
	appDoneOn completionKey
}

// completionKey tells AppCompletion's verdicts apart: a new one restarts
// the wait.
type completionKey struct {
	state AppState
	seq   uint64
}

func (t *timers) stopAll() {
	for _, tm := range []*time.Timer{t.minDrain, t.deadline, t.wake, t.appDone} {
		if tm != nil {
			tm.Stop()
		}
	}
}

func chanOf(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// New builds a machine. cfg must be valid (Config.Validate).
func New(cfg Config, parts Parts) *Machine {
	if parts.Log == nil {
		parts.Log = zap.NewNop()
	}
	m := &Machine{
		cfg:   cfg,
		flows: parts.Flows, apps: parts.Apps, admin: parts.Admin, proxy: parts.Proxy,
		tracking: parts.Tracking, arrivals: parts.Arrivals, reporter: parts.Reporter, untold: parts.Untold, log: parts.Log, begun: parts.Begun,
		inputs: make(chan input, 8), gate: Gate{Settle: cfg.Settle},
	}
	m.phase.Store(int32(Starting))
	m.publish(nil, nil)
	return m
}

// Trigger asks for a drain (a signal, POST /drain, the preStop hook, the
// app's completion). It never blocks; a trigger while draining is logged
// and, for a signal after the preStop hook, ends the min-drain.
func (m *Machine) Trigger(c Cause) {
	select {
	case m.inputs <- input{cause: c}:
	default: // eight pending triggers say all there is to say
	}
}

// Quit asks for the proxy's stop now, without a drain (POST /quitquitquit).
func (m *Machine) Quit() {
	select {
	case m.inputs <- input{}:
	default:
	}
}

// Phase is the current phase.
func (m *Machine) Phase() Phase { return Phase(m.phase.Load()) }

// Cause is what started the drain (CauseNone before).
func (m *Machine) Cause() Cause { return Cause(m.cause.Load()) }

// DrainListeners is where the drain_listeners call stands, and how many
// attempts it took.
func (m *Machine) DrainListeners() (DrainListenersState, int64) {
	return DrainListenersState(m.dlState.Load()), m.dlTries.Load()
}

// Gauges says whether Envoy keeps the listener gauges (checked once LIVE).
func (m *Machine) Gauges() GaugesState { return GaugesState(m.gauges.Load()) }

// DrainDuration is the time from the trigger to the stop (0 before).
func (m *Machine) DrainDuration() time.Duration { return time.Duration(m.drainNS.Load()) }

// Config is the machine's configuration.
func (m *Machine) Config() Config { return m.cfg }

// State is where the drain stands (a copy: the caller may keep it).
func (m *Machine) State() State { return m.state.Load().st }

// Watch is State, and a channel closed once a newer State is published:
// a caller waits on a change without polling.
func (m *Machine) Watch() (State, <-chan struct{}) {
	p := m.state.Load()
	return p.st, p.next
}

// publish makes a new State current: holds is what holds from now on,
// end how the drain ended (nil before). Run's goroutine only.
func (m *Machine) publish(holds []Hold, end *StateEnd) {
	now := time.Now()
	if !m.started.IsZero() {
		m.held.observe(now, kindsOf(holds))
	}
	m.curHolds = holds
	st := State{Phase: m.Phase(), Cause: m.Cause(), Shape: m.cfg.StartShape(),
		Holds: slices.Clone(holds), Held: m.held.result(), Since: now, End: end}
	if c := m.Cause(); c != CauseNone {
		st.Shape = m.shape(c)
		st.Triggered, st.Deadline = m.started, m.started.Add(m.gateDeadline())
	}
	if r, ok := m.Rotation(); ok {
		st.Rotation = &r
	}
	if old := m.state.Swap(&published{st: st, next: make(chan struct{})}); old != nil {
		close(old.next)
	}
}

// Rotation is how the adaptive wait ended (false before, or without one).
func (m *Machine) Rotation() (RotationEnd, bool) {
	if r := m.rotation.Load(); r != nil {
		return *r, true
	}
	return RotationEnd{}, false
}

// Untold is what closing the untold keep-alives did (false before it ran,
// or when it does not: UntoldCloser).
func (m *Machine) Untold() (UntoldClosed, bool) {
	if r := m.untoldRes.Load(); r != nil {
		return *r, true
	}
	return UntoldClosed{}, false
}

// Run runs the machine until the proxy is stopped (prestop: until the app
// is done or the deadline). Cancelling ctx stops the proxy at once.
func (m *Machine) Run(ctx context.Context) Result {
	defer m.timers.stopAll()
	// The admin calls at LIVE run beside the loop (onLive): a hung admin
	// API must not hold a SIGTERM or the proxy's exit. They end with Run.
	liveCtx, cancelLive := context.WithCancel(ctx)
	var liveWork sync.WaitGroup
	defer func() {
		cancelLive()
		liveWork.Wait()
	}()
	m.liveWork = func(f func(context.Context)) { liveWork.Go(func() { f(liveCtx) }) }
	var exited <-chan struct{}
	if m.proxy != nil {
		exited = m.proxy.Exited()
	}
	if m.cfg.Prestop {
		m.begin(CausePreStop)
	} else {
		m.watchLive(ctx)
	}
	defer func() {
		m.stopLiveWatch()
		m.stopDrainListeners()
	}()
	var flowsChanged, appsChanged <-chan struct{}
	flowsChanged = m.flows.Changed()
	if m.apps != nil {
		appsChanged = m.apps.Changed()
	}
	watchApp := m.cfg.ExitWithApp.WatchesApp()
	if watchApp {
		m.watching = time.Now()
	}
	for {
		var fc, ac <-chan struct{}
		switch p := m.Phase(); {
		case p == Draining && m.awaitSignal && m.apps != nil:
			if in, fv := m.baseInput(); m.seeAppGone(in, fv) {
				continue
			}
			fc, ac = flowsChanged, appsChanged
		case p == Draining && m.socketsOnly.AwaitsClose():
			// The app's listeners close at its SIGTERM, often during
			// the min-drain (its preStop is the out-of-rotation wait).
			m.socketsOnly.Observe(time.Now(), m.flows.Observe().AppListeners)
			fc = flowsChanged
		case p == Gating:
			if res, done := m.evaluate(ctx); done {
				return res
			}
			if m.late && !m.awaitSignal && !m.lateGone {
				// Past the gate deadline only the app held
				// (late_stop.go): it is gone and the gate is not open
				// yet; it gets LateAppGoneWait, then the deadline's stop.
				m.lateGone = true
				m.timers.deadline.Stop()
				m.timers.deadline = time.NewTimer(max(0, min(LateAppGoneWait, m.cfg.LateGateDeadline()-time.Since(m.started))))
			}
			fc, ac = flowsChanged, appsChanged
		case p == Ready && watchApp:
			m.watchAppDone()
			ac = appsChanged
		}
		select {
		case <-ctx.Done():
			return m.stop("context cancelled", false)
		case <-exited:
			return m.proxyDied()
		case in := <-m.inputs:
			if in.cause == CauseNone {
				return m.stop("POST /quitquitquit", false)
			}
			m.onTrigger(in.cause)
		case <-m.liveC:
			m.onLive(ctx)
		case <-chanOf(m.timers.minDrain):
			m.timers.minDrain = nil
			if m.cfg.MinDrainAuto && m.Phase() == Draining {
				m.checkRotation()
				break
			}
			m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", m.flows.Observe()))
		case <-chanOf(m.timers.appDone):
			m.timers.appDone = nil
			if c, _ := m.completion(); c.Done && c.key() == m.timers.appDoneOn && m.Phase() == Ready {
				if c.State == AppNeverSeen {
					m.log.Warn("no app process seen within --app-start-timeout: the app is taken as done, having run and exited before draind could watch it (an app container started beside draind and shorter than its start-up); its exit code is unknown to draind, which stops the proxy and exits 0: the app container's own exit code decides the Job. Gate the app on `draind wait` (postStart) for its exit code to be seen",
						logevent.AppNeverSeen.Field(), zap.Duration("app_start_timeout", m.cfg.AppStartTimeout), zap.Duration("watching", time.Since(m.watching)))
				}
				m.begin(CauseAppDone)
			}
		case <-chanOf(m.timers.deadline):
			m.timers.deadline = nil
			if m.holdPastGateDeadline() {
				break
			}
			return m.deadline()
		case <-chanOf(m.timers.wake):
			m.timers.wake = nil
			if !m.timers.refreshAt.IsZero() && !time.Now().Before(m.timers.refreshAt) {
				m.lastRefresh = time.Now()
				if err := m.flows.Refresh(); err != nil {
					m.log.Warn("re-reading flows for idle times", zap.Error(err))
				}
			}
		case <-fc:
		case <-ac:
		}
	}
}

// enter is the one place the phase changes (the State follows; the end's
// phases publish their own, with the end).
func (m *Machine) enter(p Phase, fields ...zap.Field) {
	from := Phase(m.phase.Swap(int32(p)))
	m.log.Info("phase", append([]zap.Field{logevent.Phase.Field(), zap.String("phase", p.String())}, fields...)...)
	if from == Draining && p == Gating {
		// Before the publish below: it ends the out-of-rotation wait, and
		// the app stops accepting once that returns.
		m.closeUntold()
	}
	switch p {
	case Draining:
		m.publish([]Hold{m.minDrainHold()}, nil)
	case Stopping, Exited:
	default:
		m.publish(nil, nil)
	}
}

// closeUntold closes Envoy's untold keep-alives (Untold), once, as the
// min-drain ends.
func (m *Machine) closeUntold() {
	if m.untold == nil {
		return
	}
	var toldFrom time.Time
	if ns := m.dlAt.Load(); ns != 0 {
		toldFrom = time.Unix(0, ns)
	}
	start := time.Now()
	r := m.untold.CloseUntold(toldFrom)
	m.untoldRes.Store(&r)
	if r.Found == 0 && r.Err == nil {
		return
	}
	took := time.Since(start)
	fields := []zap.Field{logevent.UntoldClosed.Field(), zap.Int("found", r.Found), zap.Int("closed", r.Closed), zap.Strings("picked", r.Picked),
		zap.Bool("drain_listeners_done", !toldFrom.IsZero()), zap.String("rule", UntoldRule(!toldFrom.IsZero(), r.ToldFrom)),
		zap.Float64("took_ms", float64(took.Microseconds())/1e3)}
	if r.Err != nil {
		m.log.Warn("some idle keep-alives Envoy's drain never told could not be closed: their clients may send one more request after the app stops accepting",
			append(fields, zap.Error(r.Err))...)
		return
	}
	m.log.Info("closed the idle keep-alives Envoy's drain never told: their clients reconnect elsewhere", fields...)
}

// ended is end with what the deadline cut, if it did.
func (m *Machine) ended(end StateEnd) *StateEnd {
	if m.cut != nil {
		end.Cut, end.OpenFlows, end.AppProcesses = true, m.cut.OpenFlows, m.cut.AppProcesses
	}
	return &end
}

// minDrainHold is what holds while Draining.
func (m *Machine) minDrainHold() Hold {
	if m.cfg.MinDrainAuto {
		return Hold{HoldMinDrain, fmt.Sprintf("waiting to leave rotation (auto: %s to %s)", m.cfg.RotationFloor, m.cfg.RotationCeiling)}
	}
	return Hold{HoldMinDrain, "--min-drain " + m.cfg.MinDrain.String()}
}

// finish publishes the drain's end and tells the reporter (once a drain
// began).
func (m *Machine) finish(end StateEnd) {
	m.publish(nil, m.ended(end))
	if m.reporter != nil && m.Cause() != CauseNone {
		m.reporter.DrainEnded(m.State())
	}
}

// watchLive asks the admin API until Envoy is LIVE with its workers
// started: the only polling draind does while not draining, and only until
// Ready. It ends with Run, or when the machine leaves Starting.
func (m *Machine) watchLive(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	live := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Ask often at first (an Envoy that goes LIVE a moment after draind
		// starts is ready at once), then every 200 ms.
		wait := 10 * time.Millisecond
		for {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			ok, _ := m.admin.Live(cctx)
			ccancel()
			if ok {
				close(live)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 200*time.Millisecond)
		}
	})
	m.liveC = live
	m.stopLive = func() { cancel(); wg.Wait() }
}

func (m *Machine) stopLiveWatch() {
	if m.stopLive != nil {
		m.stopLive()
		m.stopLive = nil
	}
	m.liveC = nil
}

// onLive: Envoy is LIVE. Ready, unless a drain began meanwhile; and once,
// whether Envoy keeps the listener gauges the gate would read.
func (m *Machine) onLive(ctx context.Context) {
	m.stopLiveWatch()
	if m.Phase() == Starting {
		if m.begun.IsZero() {
			m.enter(Ready)
		} else {
			m.enter(Ready, zap.Duration("since_start", time.Since(m.begun)))
		}
	}
	// Off the loop: the trigger and the proxy's exit are not held by an
	// admin API that hangs (the drain then starts without what these
	// learn: stat names as given, the rate before unknown).
	m.liveWork(func(ctx context.Context) {
		if h, ok := m.admin.(LiveHook); ok {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			h.AtLive(hctx)
			cancel()
		}
		m.checkGauges(ctx)
	})
}

// checkGauges asks, once it can be answered, whether Envoy keeps the
// listener gauges the gate would read.
func (m *Machine) checkGauges(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	present, err := m.admin.Gauges(cctx)
	cancel()
	switch {
	case err != nil:
		m.log.Debug("could not tell whether Envoy keeps listener gauges; will ask again", zap.Error(err))
	case present:
		m.gauges.Store(int32(GaugesPresent))
	default:
		m.gauges.Store(int32(GaugesAbsent))
		m.log.Warn("Envoy keeps no downstream_cx_active listener gauges (e.g. Istio's stats matcher without EXIT_ON_ZERO_ACTIVE_CONNECTIONS): the kernel's view of Envoy's downstream connections decides alone",
			logevent.NoListenerGauges.Field())
	}
}

// completion applies AppCompletion to what the app's view says now, and
// returns the main exit it read. The count is read first: an app that
// leaves after it has its exit read.
func (m *Machine) completion() (Completion, MainExit) {
	n, view := m.apps.Count()
	exit, has := m.apps.MainExit()
	return AppCompletion(CompletionInput{
		Mode: m.cfg.ExitWithApp, View: view, Procs: n, Main: exit, HasMain: has,
		Watching: time.Since(m.watching), StartTimeout: m.cfg.AppStartTimeout, RestartGrace: m.cfg.restartGrace(),
	}), exit
}

func (c Completion) key() completionKey { return completionKey{c.State, c.Seq} }

// watchAppDone arms the wait when the app looks done (the restart grace,
// or the rest of the start timeout for an app never seen), and disarms it
// when the app is back (a crashed container the kubelet restarted) or
// first appears.
func (m *Machine) watchAppDone() {
	c, exit := m.completion()
	if c.State == AppFailedKept && c.Seq != m.failedSeq {
		m.failedSeq = c.Seq
		m.log.Info("the app's main process ended without success under --exit-with-app success: the proxy stays for its restart (restartPolicy OnFailure); with restartPolicy Never use --exit-with-app any",
			zap.String("main_exit", exit.Status))
	}
	switch {
	case c.Done && (m.timers.appDone == nil || c.key() != m.timers.appDoneOn):
		if m.timers.appDone != nil {
			m.timers.appDone.Stop() // it came back and left again: a new wait
		}
		if c.State == AppNeverSeen {
			m.log.Info("no app process seen yet: the proxy waits for the app's first one, at most --app-start-timeout since draind began watching (an app that already ran and exited cannot be told from one not started)",
				logevent.AppNotSeenYet.Field(), zap.Duration("app_start_timeout", m.cfg.AppStartTimeout), zap.Duration("left", c.After))
		} else {
			// A success is the app's work done: a Job's container is not
			// restarted after it. A failure, or an exit draind could not
			// read, may be a crash the kubelet restarts: the restart grace.
			m.log.Info("the app's processes are gone: the proxy stops after the restart grace unless the app comes back",
				zap.String("main_exit", exit.Status), zap.Stringer("app", c.State), zap.Duration("grace", c.After), zap.String("exit_with_app", string(m.cfg.ExitWithApp)))
		}
		m.timers.appDone, m.timers.appDoneOn = time.NewTimer(c.After), c.key()
	case !c.Done && m.timers.appDone != nil:
		m.timers.appDone.Stop()
		m.timers.appDone = nil
		if m.timers.appDoneOn.state == AppNeverSeen {
			m.log.Info("an app process is seen: the proxy stays for it", zap.Stringer("app", c.State))
		} else {
			m.log.Info("the app is back within the restart grace: the proxy stays", logevent.AppBack.Field(), zap.Stringer("app", c.State))
		}
	}
}

// onTrigger handles a drain trigger in any phase.
func (m *Machine) onTrigger(c Cause) {
	switch p := m.Phase(); p {
	case Starting, Ready:
		m.begin(c)
	case Draining, Gating:
		if c == CauseSignal && m.awaitSignal {
			// A native sidecar: the kubelet sends SIGTERM only after every
			// app container exited; the endpoint propagation wait already
			// ran alongside the app's shutdown. Finish now: only Envoy's
			// last flows remain for the gate.
			m.awaitSignal = false
			m.signalAt = time.Now()
			m.socketsOnly = SocketsOnly{} // every app container has exited
			if p == Draining && m.appGone() {
				m.endMinDrain()
				m.log.Info("SIGTERM after the preStop drain with the app gone (native sidecar): min-drain ends now", logevent.SigtermEndsMinDrain.Field())
				m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", m.flows.Observe()))
			} else {
				m.log.Info("SIGTERM after the preStop drain (native sidecar): the gate no longer waits for it", logevent.SigtermAfterPrestop.Field())
			}
			return
		}
		m.log.Info("drain trigger ignored: already draining", logevent.TriggerIgnored.Field(), zap.Stringer("trigger", c), zap.Stringer("phase", p),
			zap.Stringer("drain_trigger", m.Cause()))
	default:
		m.log.Info("drain trigger ignored: already draining", logevent.TriggerIgnored.Field(), zap.Stringer("trigger", c), zap.Stringer("phase", p),
			zap.Stringer("drain_trigger", m.Cause()))
	}
}

// endMinDrain ends the min-drain before its time.
func (m *Machine) endMinDrain() {
	if m.timers.minDrain != nil {
		m.timers.minDrain.Stop()
		m.timers.minDrain = nil
	}
	if m.cfg.MinDrainAuto && m.arrivals != nil {
		m.arrivals.End()
	}
}

// seeAppGone: a native sidecar waiting for its SIGTERM sees the app gone
// (AppSeenGone on in), the fact the SIGTERM would bring later: it waits for
// it no more, and a min-drain still running ends, as at that SIGTERM
// (nothing can be served any more). It reports whether it did.
func (m *Machine) seeAppGone(in GateInput, fv FlowView) bool {
	if !m.awaitSignal || !AppSeenGone(in) {
		return false
	}
	m.awaitSignal = false
	draining := m.Phase() == Draining
	m.log.Info("the app is seen gone (native sidecar): the kubelet's SIGTERM, which follows it, is not waited for",
		logevent.AppGoneEndsAwait.Field(), zap.Bool("min_drain_ended", draining), zap.Duration("since_drain", time.Since(m.started)))
	if draining {
		m.endMinDrain()
		m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", fv))
	}
	return true
}

// appGone reports whether the machine's own view says the app has no
// process left (a complete view only).
func (m *Machine) appGone() bool {
	if m.apps == nil {
		v := m.flows.Observe()
		return v.AppListeners == 0 && v.AppHolding == 0
	}
	n, view := m.apps.Count()
	return view == ProcsComplete && n == 0
}

// shape says what pod the trigger tells draind it is in.
func (m *Machine) shape(c Cause) PodShape {
	switch start := m.cfg.StartShape(); {
	case start == ShapePrestop || start == ShapeGateway:
		return start
	case c == CausePreStop:
		return ShapeNativeSidecar
	case c == CauseAppDone:
		return ShapeJob
	case c == CausePOST:
		return ShapePOSTSidecar
	}
	return ShapeClassicSidecar
}

// begin starts the drain: Draining, drain_listeners, the min-drain and the
// deadline.
func (m *Machine) begin(c Cause) {
	m.stopLiveWatch()
	if m.timers.appDone != nil {
		m.timers.appDone.Stop()
		m.timers.appDone = nil
	}
	m.started = time.Now()
	m.cause.Store(int32(c))
	m.awaitSignal = c == CausePreStop && !m.cfg.Prestop
	if m.apps == nil && m.cfg.MinDrainAuto && c != CauseAppDone && !m.cfg.Prestop && !m.cfg.Gateway && m.cfg.AppExit == AppExitWait {
		// A fixed min-drain holds the gate that long anyway; auto can end
		// far sooner, and nothing else shows such an app alive.
		m.socketsOnly = NewSocketsOnly(m.started)
	}
	m.timers.deadline = time.NewTimer(m.cfg.GateDeadline())
	minDrain := m.cfg.MinDrain
	if c == CauseAppDone || m.cfg.Prestop {
		minDrain = 0 // no endpoint to leave
	}
	// Envoy's drain first: its clients' Connection: close must not wait
	// for draind's own views, which the gate needs only later.
	if m.admin != nil {
		m.startDrainListeners()
	}
	m.startTracking()
	auto := m.cfg.MinDrainAuto && minDrain != 0
	fields := []zap.Field{zap.Stringer("trigger", c), zap.Stringer("pod_shape", m.shape(c))}
	if auto {
		fields = append(fields, zap.String("min_drain", "auto"),
			zap.Duration("min_drain_floor", m.cfg.RotationFloor), zap.Duration("min_drain_ceiling", m.cfg.RotationCeiling))
	} else {
		fields = append(fields, zap.Duration("min_drain", minDrain))
	}
	m.enter(Draining, append(fields, zap.Duration("deadline", m.cfg.Deadline), zap.Duration("gate_deadline", m.cfg.GateDeadline()),
		zap.Any("flows", m.flows.Observe()))...)
	if m.reporter != nil {
		m.reporter.DrainBegan(m.State())
	}
	if minDrain == 0 {
		m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)))
		return
	}
	if auto {
		if m.arrivals != nil {
			m.before = m.arrivals.Begin(m.started)
		}
		m.checkRotation()
		return
	}
	m.timers.minDrain = time.NewTimer(minDrain)
}

// rotationInput is the out-of-rotation rule's input now.
func (m *Machine) rotationInput() RotationInput {
	in := RotationInput{Start: m.started, Now: time.Now(), Before: m.before, Floor: m.cfg.RotationFloor, Ceiling: m.cfg.RotationCeiling}
	if m.arrivals != nil {
		in.Since = m.arrivals.Since()
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
		m.timers.minDrain = time.NewTimer(v.At.Sub(in.Now))
		return
	}
	if m.arrivals != nil {
		m.arrivals.End()
	}
	end := NewRotationEnd(in, v)
	m.rotation.Store(&end)
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

// startTracking makes the live views current before the gate first reads
// them. A failure is logged: the views then answer from what they have
// (the gate's other rules and the deadline still bound the drain).
func (m *Machine) startTracking() {
	if m.tracking == nil {
		return
	}
	start := time.Now()
	if err := m.tracking.Start(); err != nil {
		m.log.Error("tracking did not start: the gate reads what the views have", logevent.TrackingFailed.Field(), zap.Error(err))
		return
	}
	took := time.Since(start)
	m.log.Info("tracking live", logevent.TrackingLive.Field(), zap.Duration("took", took), zap.Float64("tracking_live_ms", float64(took.Microseconds())/1e3))
}

// startDrainListeners sends POST /drain_listeners until it succeeds or the
// drain ends (it is idempotent): an admin API stalled at SIGTERM must not
// leave Envoy undrained, its clients never told Connection: close.
func (m *Machine) startDrainListeners() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	m.dlState.Store(int32(DrainListenersRetrying))
	inbound := !m.cfg.Gateway
	wg.Go(func() {
		backoff := 50 * time.Millisecond
		// Each attempt gets longer (an admin API answering in 2 s must
		// still get the drain), never past the time left to drain.
		timeout := time.Second
		gateEnd := m.started.Add(m.cfg.GateDeadline())
		var lastErr string
		for {
			m.dlTries.Add(1)
			cctx, ccancel := context.WithTimeout(ctx, max(min(timeout, time.Until(gateEnd)), 100*time.Millisecond))
			timeout = min(2*timeout, 8*time.Second)
			err := m.admin.DrainListeners(cctx, inbound)
			ccancel()
			if err == nil {
				m.dlAt.Store(time.Now().UnixNano())
				m.dlState.Store(int32(DrainListenersDone))
				m.log.Info("drain_listeners sent", logevent.DrainListenersSent.Field(), zap.Bool("inbound_only", inbound), zap.Int64("attempts", m.dlTries.Load()))
				return
			}
			if ctx.Err() != nil {
				return
			}
			if e := err.Error(); e != lastErr {
				lastErr = e
				m.log.Warn("drain_listeners failed; retrying until it succeeds or the drain ends", logevent.DrainListenersFailed.Field(), zap.Error(err), zap.Int64("attempts", m.dlTries.Load()))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	})
	m.stopDL = func() {
		cancel()
		wg.Wait()
		if DrainListenersState(m.dlState.Load()) == DrainListenersRetrying {
			m.dlState.Store(int32(DrainListenersGaveUp))
			m.log.Warn("drain_listeners never succeeded", logevent.DrainListenersGaveUp.Field(), zap.Int64("attempts", m.dlTries.Load()))
		}
	}
}

func (m *Machine) stopDrainListeners() {
	if m.stopDL != nil {
		m.stopDL()
		m.stopDL = nil
	}
}

// evaluate looks at the gate once; done means the machine ended.
func (m *Machine) evaluate(ctx context.Context) (Result, bool) {
	in, fv := m.gateInput(ctx)
	m.seeAppGone(in, fv) // the gate's own rule lets it through; this says so, once
	v := m.gate.Step(in)
	if v.Open {
		return m.stop("drained", true), true
	}
	if !slices.Equal(v.Holds, m.curHolds) {
		// Published on any change (a count too), logged when the kinds change.
		kinds := v.Kinds()
		kindsChanged := kinds != (Verdict{Holds: m.curHolds}).Kinds()
		m.publish(v.Holds, nil)
		if kindsChanged {
			if log, unlogged := m.holdsLog.change(kinds, time.Now()); log {
				fields := []zap.Field{logevent.GateHolds.Field(), zap.Stringers("holds", v.Holds), zap.Stringers("hold_kinds", kindsOf(v.Holds)),
					zap.Duration("since_drain", time.Since(m.started))}
				if unlogged > 0 {
					fields = append(fields, zap.Int("unlogged_changes", unlogged))
				}
				m.log.Info("gate holds", fields...)
			}
		}
	}
	// Wake on the next change, or at a computed moment: the end of
	// --settle, a flow's idle expiry or parking, or a re-ask of an admin
	// API that lags behind the kernel. Never on a fixed tick.
	wake, refresh := v.WakeAt, m.refreshAt(in, fv)
	if !refresh.IsZero() && (wake.IsZero() || refresh.Before(wake)) {
		wake = refresh
	}
	if envoyOnlyHold(in, v) {
		m.backoff = min(max(2*m.backoff, 5*time.Millisecond), 250*time.Millisecond)
		if w := in.Now.Add(m.backoff); wake.IsZero() || w.Before(wake) {
			wake = w
		}
	} else {
		m.backoff = 0
	}
	if m.timers.wake != nil {
		m.timers.wake.Stop()
		m.timers.wake = nil
	}
	m.timers.refreshAt = time.Time{}
	if !wake.IsZero() {
		m.timers.wake = time.NewTimer(time.Until(wake))
		if wake.Equal(refresh) {
			m.timers.refreshAt = refresh
		}
	}
	return Result{}, false
}

// minRefreshGap spaces the machine's re-reads of the flows: a refresh
// that fails, or a flow born after the last one, cannot make it spin.
const minRefreshGap = ParkedAfter / 4

// refreshAt is when the flows' idle times must be re-read (zero: no
// need): when a holding flow passes --idle-timeout, and, the app being
// gone, once right away (times read before it tell nothing), then when a
// downstream flow not yet parked can be. fv is the view in was built
// from (one walk of the table per evaluation).
func (m *Machine) refreshAt(in GateInput, fv FlowView) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if m.cfg.IdleTimeout > 0 {
		earliest(fv.IdleWake)
	}
	if !m.appGoneAt.IsZero() && in.Downstream > in.DownstreamParked {
		if !fv.Measured.After(m.appGoneAt) {
			earliest(in.Now)
		} else {
			earliest(fv.ParkedWake)
		}
	}
	if !at.IsZero() && at.Before(m.lastRefresh.Add(minRefreshGap)) {
		at = m.lastRefresh.Add(minRefreshGap)
	}
	return at
}

// envoyOnlyHold: the kernel sees no live downstream flow of Envoy's but its
// admin API still counts some (its counters trail the sockets by a moment):
// re-ask with backoff.
func envoyOnlyHold(in GateInput, v Verdict) bool {
	if in.Downstream-in.DownstreamIdle > 0 {
		return false
	}
	for _, h := range v.Holds {
		if h.Kind == HoldEnvoyActive {
			return true
		}
	}
	return false
}

// gateInput gathers the gate's inputs. It asks Envoy's admin API only when
// the app is done and the kernel sees no live downstream flow (otherwise
// Envoy certainly has some), so a busy drain does not hammer the admin API.
// It returns the flow view it read too.
func (m *Machine) gateInput(ctx context.Context) (GateInput, FlowView) {
	in, fv := m.baseInput()
	switch {
	case !AppGone(in):
		m.appGoneAt = time.Time{}
	case m.appGoneAt.IsZero():
		m.appGoneAt = in.Now
	case fv.Measured.After(m.appGoneAt):
		in.DownstreamParked = fv.DownstreamParked
	}
	if m.admin == nil {
		return in, fv
	}
	if live := in.Downstream - in.DownstreamIdle; live > 0 {
		in.EnvoyKnown, in.EnvoyActive = true, live // the kernel's count stands in
		return in, fv
	}
	if done, _ := AppDone(in); !done {
		return in, fv
	}
	if m.Gauges() == GaugesUnknown {
		m.checkGauges(ctx) // the check at LIVE failed, or never ran
	}
	if m.Gauges() != GaugesPresent {
		return in, fv
	}
	if time.Now().Before(m.adminQuietUntil) {
		return in, fv // it failed a moment ago: the kernel decides meanwhile
	}
	actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	n, err := m.admin.ActiveDownstream(actx)
	cancel()
	switch {
	case err == nil:
		in.EnvoyKnown, in.EnvoyActive = true, n
	case errors.Is(err, ErrNoGauges):
		if m.gauges.Swap(int32(GaugesAbsent)) != int32(GaugesAbsent) {
			m.log.Warn("Envoy keeps no downstream_cx_active listener gauges: the kernel's view of Envoy's downstream connections decides alone",
				logevent.NoListenerGauges.Field())
		}
	default:
		// A hung or failing admin API must not add its timeout to every
		// evaluation: leave it be for a while.
		m.adminQuietUntil = time.Now().Add(2 * time.Second)
		m.log.Debug("admin active connections", zap.Error(err))
	}
	return in, fv
}

// baseInput is the gate's input from draind's own views (the flows, the
// app's processes), without the admin API's part or the parked flows.
func (m *Machine) baseInput() (GateInput, FlowView) {
	fv := m.flows.Observe()
	in := GateInput{
		Now: time.Now(), AppExit: m.cfg.AppExit, Gateway: m.cfg.Gateway, WaitListeners: m.cfg.WaitListeners,
		NoProxy: m.cfg.Prestop, IdleTimeout: m.cfg.IdleTimeout, AwaitSignal: m.awaitSignal,
		AppListeners: fv.AppListeners, AppHolding: fv.AppHolding,
		Downstream: fv.Downstream, DownstreamIdle: fv.DownstreamIdle,
	}
	m.socketsOnly.Observe(in.Now, fv.AppListeners)
	in.SocketsOnlyUntil = m.socketsOnly.Until
	if m.apps != nil {
		in.AppProcs, in.ProcView = m.apps.Count()
	}
	return in, fv
}

// gateDeadline is when, after the trigger, the gate stops waiting for the
// app: the late gate deadline once the gate held on to it, or while
// PastGateDeadline would hold it (a native sidecar awaiting its SIGTERM).
func (m *Machine) gateDeadline() time.Duration {
	if m.late || PastGateDeadline(GateInput{AwaitSignal: m.awaitSignal, NoProxy: m.cfg.Prestop}) {
		return m.cfg.LateGateDeadline()
	}
	return m.cfg.GateDeadline()
}

// holdPastGateDeadline: at the gate deadline, a native sidecar still
// awaiting its SIGTERM (PastGateDeadline) holds on to the late gate
// deadline; once.
func (m *Machine) holdPastGateDeadline() bool {
	if m.late {
		return false
	}
	in, _ := m.baseInput()
	left := m.cfg.LateGateDeadline() - time.Since(m.started)
	if !PastGateDeadline(in) || left <= 0 {
		return false
	}
	m.late = true
	m.timers.deadline = time.NewTimer(left)
	fields := []zap.Field{logevent.GateDeadlineLate.Field(), zap.Duration("after", time.Since(m.started)),
		zap.Duration("late_gate_deadline", m.cfg.LateGateDeadline())}
	if m.apps != nil {
		fields = append(fields, zap.Int("app_processes", in.AppProcs), zap.Bool("app_processes_complete", in.ProcView == ProcsComplete))
	}
	m.log.Info("gate deadline reached before the kubelet's SIGTERM (native sidecar: the app still runs): the proxy stays for the app's calls until the late gate deadline; the stop then skips SIGTERM after a quit that works",
		fields...)
	m.publish(m.curHolds, nil) // the State's deadline moved
	return true
}

// deadline stops the proxy anyway, naming every flow that still held.
func (m *Machine) deadline() Result {
	open := m.flows.Holding()
	fields := []zap.Field{logevent.DeadlineReached.Field(), zap.Duration("after", time.Since(m.started)), zap.Int("open_flows", len(open))}
	m.cut = &StateEnd{Cut: true, OpenFlows: len(open)}
	if m.apps != nil {
		n, view := m.apps.Count()
		m.cut.AppProcesses = n
		fields = append(fields, zap.Int("app_processes", n), zap.Bool("app_processes_complete", view == ProcsComplete))
	}
	msg := "drain deadline reached: stopping the proxy with flows still open"
	if m.cfg.Prestop {
		msg = "prestop deadline reached: returning with app flows still open"
	}
	m.log.Warn(msg, fields...)
	for _, f := range open {
		m.log.Warn("open flow at deadline", logevent.OpenFlowAtDeadline.Field(),
			zap.String("local", f.Local.String()), zap.String("remote", f.Remote.String()),
			zap.String("owner", f.Owner), zap.String("direction", f.Direction), zap.String("state", f.State),
			zap.Int64("idle_ms", f.IdleMS), zap.Duration("age", f.Age))
	}
	return m.stop("deadline", false)
}

// proxyDied: the proxy left on its own. A sidecar proxy that leaves on its
// own is a failure, whatever its code.
func (m *Machine) proxyDied() Result {
	m.stopDrainListeners()
	code := m.proxy.ExitCode()
	if code == 0 && !m.cfg.ProxyExitStands {
		code = 1
	}
	when := "during the drain"
	if p := m.Phase(); p == Starting || p == Ready {
		when = "before any drain"
	}
	m.enter(Exited, zap.String("why", "proxy exited on its own"), zap.String("when", when),
		zap.String("how", m.proxy.ExitDescription()), zap.Int("exit_code", code))
	res := Result{ExitCode: code, Reason: "proxy " + m.proxy.ExitDescription() + " " + when}
	var took time.Duration
	if !m.started.IsZero() {
		took = time.Since(m.started)
	}
	m.finish(StateEnd{Why: res.Reason, Took: took, ExitCode: code, ExitCodeKnown: true})
	return res
}

// stop: /quitquitquit, then SIGTERM, then SIGKILL, each given
// --stop-timeout (late: no SIGTERM after a quit that worked). clean says
// whether the gate opened.
func (m *Machine) stop(why string, clean bool) Result {
	m.stopDrainListeners()
	t0 := time.Now()
	if m.started.IsZero() {
		m.started = t0 // stopped without a drain (a quit, a cancel)
	}
	m.drainNS.Store(int64(t0.Sub(m.started)))
	if m.cfg.Prestop {
		m.enter(Exited, zap.String("why", why), zap.Duration("waited", t0.Sub(m.started)), zap.Bool("clean", clean))
		m.finish(StateEnd{Why: why, Clean: clean, Took: t0.Sub(m.started)})
		return Result{Reason: why, Clean: clean}
	}
	m.enter(Stopping, zap.String("why", why), zap.Duration("drain", t0.Sub(m.started)), zap.Bool("late", m.late),
		zap.Int64("quit_sent_unix_ns", t0.UnixNano()), zap.Any("flows", m.flows.Observe()))
	m.publish(nil, m.ended(StateEnd{Why: why, Clean: clean, Took: t0.Sub(m.started)}))
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.quitTimeout())
	err := m.admin.Quit(ctx)
	cancel()
	steps := []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL}
	if m.late {
		steps = []syscall.Signal{0, syscall.SIGKILL} // LateStopReserve
	}
	if err != nil {
		// Envoy did not take the quit: SIGTERM (the same to Envoy) now,
		// not after a wait for an exit that was never asked.
		m.log.Warn("quitquitquit failed: signalling at once", zap.Error(err))
		steps = []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	}
	killed := false
	for _, sig := range steps {
		if sig != 0 {
			m.log.Warn("proxy still running: signalling", zap.Stringer("signal", sig))
			if err := m.proxy.Signal(sig); err != nil {
				m.log.Warn("signalling the proxy failed", zap.Stringer("signal", sig), zap.Error(err))
			}
			killed = sig == syscall.SIGKILL
		}
		wait := m.cfg.StopTimeout
		switch {
		case sig == syscall.SIGKILL:
			wait = KillWait
		case m.late:
			// Up to the late stop's SIGKILL step (late_stop.go), the
			// quit's unused part included (under pilot-agent the
			// proxy's exit is pilot-agent's, after Envoy's), and inside
			// what the kubelet grants after its SIGTERM.
			end := m.started.Add(m.cfg.lateEnd() - KillWait)
			if k := m.signalAt.Add(KubeletSidecarGrace - KillWait); !m.signalAt.IsZero() && k.Before(end) {
				end = k
			}
			wait = max(0, time.Until(end))
		}
		t := time.NewTimer(wait)
		select {
		case <-m.proxy.Exited():
		case <-t.C:
			continue
		}
		t.Stop()
		break
	}
	res := Result{Reason: why, Clean: clean}
	select {
	case <-m.proxy.Exited():
		code := m.proxy.ExitCode()
		switch {
		case killed:
			res.ExitCode, res.Reason = 137, why+"; proxy had to be killed"
		case code == 0 || code == 128+int(syscall.SIGTERM):
		default:
			res.ExitCode, res.Reason = code, why+"; proxy "+m.proxy.ExitDescription()
		}
	default:
		res.ExitCode, res.Reason = 137, why+"; proxy did not exit even after SIGKILL"
	}
	res.Clean = clean && res.ExitCode == 0
	m.enter(Exited, zap.String("why", res.Reason), zap.Int("exit_code", res.ExitCode),
		zap.Duration("total", time.Since(m.started)), zap.Bool("clean", res.Clean))
	m.finish(StateEnd{Why: res.Reason, Clean: res.Clean, Took: t0.Sub(m.started), ExitCode: res.ExitCode, ExitCodeKnown: true})
	return res
}
