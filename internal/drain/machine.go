package drain

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

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

// Machine is the drain state machine. Build it with New, run it once.
//
// Its state is grouped by the rule that owns it, each group's type and
// methods in that rule's file. What other goroutines read (the accessors,
// the status server, /metrics) is atomic; the rest belongs to Run's
// goroutine.
type Machine struct {
	cfg Config

	// The parts (Parts), fixed at New. A part that one rule alone uses
	// lives in that rule's state (Arrivals, Untold).
	flows    Flows
	apps     Apps
	admin    Admin
	proxy    Proxy
	tracking Tracking
	reporter Reporter
	log      *zap.Logger
	begun    time.Time

	// inputs carries Trigger's and Quit's calls to Run, so that only Run's
	// goroutine changes the phase.
	inputs chan input

	// phase and cause are where the machine stands and what started the
	// drain: atomic, as the status server reads them while Run changes them.
	phase atomic.Int32
	cause atomic.Int32
	// started is the trigger's time: the deadlines count from it, and so
	// does every duration the drain logs.
	started time.Time
	// state is the last State published (State, Watch), with the channel
	// closed when a newer one is.
	state atomic.Pointer[published]

	// envoy is the admin API's side: the live watch, drain_listeners, the
	// gauges and the count the gate asks beside the loop (envoy.go).
	envoy envoyState
	// eval is the gate's evaluation: the gate, what holds, when to look
	// again (evaluate.go).
	eval evalState
	// rotation is the min-drain, fixed or --min-drain auto (rotation.go).
	rotation rotationState
	// untold is the closing of Envoy's untold keep-alives as the pod
	// leaves rotation (untold.go).
	untold untoldState
	// native is a native sidecar's wait for the kubelet's SIGTERM
	// (native_sidecar.go).
	native nativeState
	// late is the late stop: the gate held past its deadline for a native
	// sidecar's app (late_stop.go).
	late lateState
	// sockets holds an app seen only by its sockets (GateInput.SocketsOnlyUntil).
	sockets SocketsOnly
	// app is --exit-with-app's watch of the app while Ready (completion.go).
	app appWatch
	// end is the deadline and the stop (stop.go).
	end endState
}

// published is one State and the channel closed once it is superseded.
type published struct {
	st   State
	next chan struct{}
}

// input is one call of Trigger or Quit.
type input struct {
	cause Cause // CauseNone: a quit
}

// stopTimers stops the loop's timers as Run returns.
func (m *Machine) stopTimers() {
	for _, tm := range []*time.Timer{m.rotation.timer, m.end.deadline, m.eval.wake, m.app.timer} {
		if tm != nil {
			tm.Stop()
		}
	}
}

// chanOf is t's channel, nil (never ready in a select) while t is not armed.
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
		tracking: parts.Tracking, reporter: parts.Reporter, log: parts.Log, begun: parts.Begun,
		inputs: make(chan input, 8),
	}
	m.eval.gate = Gate{Settle: cfg.Settle}
	m.envoy.answers = make(chan activeAnswer, 1)
	m.rotation.arrivals = parts.Arrivals
	m.untold.closer = parts.Untold
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

// Config is the machine's configuration.
func (m *Machine) Config() Config { return m.cfg }

// Run runs the machine until the proxy is stopped (prestop: until the app
// is done or the deadline). Cancelling ctx stops the proxy at once.
func (m *Machine) Run(ctx context.Context) Result {
	defer m.stopTimers()
	// The admin calls run beside the loop (envoyState.work): a hung admin
	// API must not hold a SIGTERM or the proxy's exit. They end with Run.
	workCtx, cancelWork := context.WithCancel(ctx)
	var work sync.WaitGroup
	defer func() {
		cancelWork()
		work.Wait()
	}()
	m.envoy.work = func(f func(context.Context)) { work.Go(func() { f(workCtx) }) }
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
		m.app.since = time.Now()
	}
	for {
		var fc, ac <-chan struct{}
		switch p := m.Phase(); {
		case p == Draining && m.native.awaitSignal && m.apps != nil:
			if in, fv := m.baseInput(); m.seeAppGone(in, fv) {
				continue
			}
			fc, ac = flowsChanged, appsChanged
		case p == Draining && m.sockets.AwaitsClose():
			// The app's listeners close at its SIGTERM, often during
			// the min-drain (its preStop is the out-of-rotation wait).
			m.sockets.Observe(time.Now(), m.flows.Observe().AppListeners)
			fc = flowsChanged
		case p == Gating:
			if res, done := m.evaluate(); done {
				return res
			}
			m.lateAppGone()
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
		case <-m.envoy.liveC:
			m.onLive()
		case a := <-m.envoy.answers:
			m.onActive(a)
		case <-chanOf(m.rotation.timer):
			m.rotation.timer = nil
			if m.cfg.MinDrainAuto && m.Phase() == Draining {
				m.checkRotation()
				break
			}
			m.enter(Gating, zap.Duration("since_drain", time.Since(m.started)), zap.Any("flows", m.flows.Observe()))
		case <-chanOf(m.app.timer):
			m.app.timer = nil
			m.appDoneWaited()
		case <-chanOf(m.end.deadline):
			m.end.deadline = nil
			if m.holdPastGateDeadline() || m.holdPastLateGateDeadline() {
				break
			}
			return m.deadline()
		case <-chanOf(m.eval.wake):
			m.eval.wake = nil
			m.onWake()
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

// onTrigger handles a drain trigger in any phase: it begins the drain,
// ends a native sidecar's wait for its SIGTERM, or is logged and ignored.
func (m *Machine) onTrigger(c Cause) {
	switch p := m.Phase(); {
	case p == Starting || p == Ready:
		m.begin(c)
		return
	case (p == Draining || p == Gating) && c == CauseSignal && m.native.awaitSignal:
		m.onSignalAfterPrestop(p)
		return
	}
	m.log.Info("drain trigger ignored: already draining", logevent.TriggerIgnored.Field(), zap.Stringer("trigger", c),
		zap.Stringer("phase", m.Phase()), zap.Stringer("drain_trigger", m.Cause()))
}

// begin starts the drain: Draining, drain_listeners, the min-drain and the
// deadline.
func (m *Machine) begin(c Cause) {
	m.stopLiveWatch()
	if m.app.timer != nil {
		m.app.timer.Stop()
		m.app.timer = nil
	}
	m.started = time.Now()
	m.cause.Store(int32(c))
	m.native.awaitSignal = c == CausePreStop && !m.cfg.Prestop
	if m.apps == nil && m.cfg.MinDrainAuto && c != CauseAppDone && !m.cfg.Prestop && !m.cfg.Gateway && m.cfg.AppExit == AppExitWait {
		// A fixed min-drain holds the gate that long anyway; auto can end
		// far sooner, and nothing else shows such an app alive.
		m.sockets = NewSocketsOnly(m.started)
	}
	m.end.deadline = time.NewTimer(m.cfg.GateDeadline())
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
		if m.rotation.arrivals != nil {
			m.rotation.before = m.rotation.arrivals.Begin(m.started)
		}
		m.checkRotation()
		return
	}
	m.rotation.timer = time.NewTimer(minDrain)
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
