package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/draind/draind/internal/logevent"
)

// The machine runs here against fakes of its four inputs: no root, no
// kernel, no Envoy. Each scenario runs in a synctest bubble: the machine's
// timers and the rig's waits read a fake clock that moves only when every
// goroutine of the bubble is blocked, so a scenario's timings are exact,
// take no real time, and never depend on the machine's load. A wait never
// polls: it wakes on the machine's next log line (every change the
// scenarios wait for is logged) or at a fake-clock timeout that only a
// stuck machine reaches.

// inBubble runs a subtest in its own synctest bubble.
func inBubble(f func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) { synctest.Test(t, f) }
}

type fakeFlows struct {
	mu        sync.Mutex
	v         FlowView
	holding   []OpenFlow
	changed   chan struct{}
	refreshes int
	onRefresh func(*FlowView)
}

func newFakeFlows(v FlowView) *fakeFlows {
	return &fakeFlows{v: v, changed: make(chan struct{}, 1)}
}

func (f *fakeFlows) Changed() <-chan struct{} { return f.changed }
func (f *fakeFlows) Observe() FlowView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.v
}
func (f *fakeFlows) Refresh() error {
	f.mu.Lock()
	f.refreshes++
	if f.onRefresh != nil {
		f.onRefresh(&f.v)
	}
	f.mu.Unlock()
	return nil
}
func (f *fakeFlows) Holding() []OpenFlow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holding
}
func (f *fakeFlows) set(fn func(*FlowView)) {
	f.mu.Lock()
	fn(&f.v)
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
	// The machine takes in each fact before the test's next step: a fact
	// set just before another (the app's exit) is otherwise read after it.
	synctest.Wait()
}

type fakeApps struct {
	n       atomic.Int32
	view    ProcView
	changed chan struct{}
	mu      sync.Mutex
	last    MainExit
	exited  bool
}

func newFakeApps(n int, view ProcView) *fakeApps {
	a := &fakeApps{view: view, changed: make(chan struct{}, 1)}
	a.n.Store(int32(n))
	return a
}
func (a *fakeApps) Changed() <-chan struct{} { return a.changed }
func (a *fakeApps) Count() (int, ProcView)   { return int(a.n.Load()), a.view }
func (a *fakeApps) exit()                    { a.set(0) }

func (a *fakeApps) MainExit() (MainExit, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last, a.exited
}

// mainExits: the app's main process ends with code (-1: killed).
func (a *fakeApps) mainExits(code int) {
	a.mu.Lock()
	a.last = MainExit{Seq: a.last.Seq + 1, Known: true, Success: code == 0, Status: fmt.Sprintf("exit %d", code)}
	if code < 0 {
		a.last.Status = "signal 9"
	}
	a.exited = true
	a.mu.Unlock()
	a.set(0)
}

// mainExitsUnknown: the app's main process is gone, how is not known (an
// exit inferred from a snapshot).
func (a *fakeApps) mainExitsUnknown() {
	a.mu.Lock()
	a.last = MainExit{Seq: a.last.Seq + 1, Status: "unknown"}
	a.exited = true
	a.mu.Unlock()
	a.set(0)
}

func (a *fakeApps) set(n int) {
	a.n.Store(int32(n))
	select {
	case a.changed <- struct{}{}:
	default:
	}
	synctest.Wait() // as fakeFlows.set
}

type fakeProxy struct {
	exited   chan struct{}
	once     sync.Once
	code     atomic.Int32
	mu       sync.Mutex
	signals  []syscall.Signal
	ignore   map[syscall.Signal]bool // signals it survives
	noExitOn bool                    // /quitquitquit does not make it exit
}

func newFakeProxy() *fakeProxy {
	return &fakeProxy{exited: make(chan struct{}), ignore: map[syscall.Signal]bool{}}
}
func (p *fakeProxy) Exited() <-chan struct{} { return p.exited }
func (p *fakeProxy) exit(code int) {
	p.once.Do(func() { p.code.Store(int32(code)); close(p.exited) })
}
func (p *fakeProxy) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	p.mu.Unlock()
	if !p.ignore[sig] {
		p.exit(128 + int(sig))
	}
	return nil
}
func (p *fakeProxy) ExitCode() int { return int(p.code.Load()) }
func (p *fakeProxy) ExitDescription() string {
	return fmt.Sprintf("exited with code %d", p.code.Load())
}
func (p *fakeProxy) sent() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]syscall.Signal(nil), p.signals...)
}

type fakeAdmin struct {
	proxy *fakeProxy

	notLive     atomic.Bool  // Live says no
	dlFailures  atomic.Int32 // drain_listeners fails this many times first
	dlCalls     atomic.Int32
	dlInbound   atomic.Bool
	active      atomic.Int32 // downstream_cx_active
	activeErr   error
	activeCalls atomic.Int32
	noGauges    bool
	quitErr     error
	quitCalls   atomic.Int32
	hang        atomic.Bool // every call blocks until its context ends
	liveCalls   atomic.Int32
	gaugeCalls  atomic.Int32
}

func (a *fakeAdmin) block(ctx context.Context) error {
	if a.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
func (a *fakeAdmin) Live(ctx context.Context) (bool, string) {
	a.liveCalls.Add(1)
	if err := a.block(ctx); err != nil {
		return false, err.Error()
	}
	if a.notLive.Load() {
		return false, "envoy state INITIALIZING"
	}
	return true, ""
}
func (a *fakeAdmin) DrainListeners(ctx context.Context, inboundOnly bool) error {
	a.dlCalls.Add(1)
	a.dlInbound.Store(inboundOnly)
	if err := a.block(ctx); err != nil {
		return err
	}
	if a.dlFailures.Add(-1) >= 0 {
		return errors.New("admin: 503")
	}
	return nil
}
func (a *fakeAdmin) ActiveDownstream(ctx context.Context) (int, error) {
	a.activeCalls.Add(1)
	if err := a.block(ctx); err != nil {
		return 0, err
	}
	if a.noGauges {
		return 0, ErrNoGauges
	}
	return int(a.active.Load()), a.activeErr
}
func (a *fakeAdmin) Gauges(ctx context.Context) (bool, error) {
	a.gaugeCalls.Add(1)
	if err := a.block(ctx); err != nil {
		return false, err
	}
	return !a.noGauges, nil
}
func (a *fakeAdmin) Quit(ctx context.Context) error {
	a.quitCalls.Add(1)
	if err := a.block(ctx); err != nil {
		return err
	}
	if a.quitErr != nil {
		return a.quitErr
	}
	if !a.proxy.noExitOn {
		a.proxy.exit(0)
	}
	return nil
}

// rig is one machine with its fakes, running.
type rig struct {
	t      *testing.T
	m      *Machine
	flows  *fakeFlows
	apps   *fakeApps
	admin  *fakeAdmin
	proxy  *fakeProxy
	logs   *observer.ObservedLogs
	res    chan Result
	cancel context.CancelFunc
	// logged is signalled (coalesced) after each line the machine logs.
	logged chan struct{}
	// tracking, when set, is Parts.Tracking (withTracking).
	tracking Tracking
	// arrivals, when set, is Parts.Arrivals.
	arrivals Arrivals
	// reporter, when set, is Parts.Reporter.
	reporter Reporter
	// untold, when set, is Parts.Untold.
	untold UntoldCloser
}

func testConfig() Config {
	return Config{MinDrain: 30 * time.Millisecond, AppExit: AppExitWait, Deadline: 5 * time.Second, StopTimeout: 50 * time.Millisecond}
}

type rigOption func(*rig, *Config)

func newRig(t *testing.T, opts ...rigOption) *rig {
	t.Helper()
	cfg := testConfig()
	proxy := newFakeProxy()
	r := &rig{t: t, flows: newFakeFlows(FlowView{}), apps: newFakeApps(1, ProcsComplete), proxy: proxy, admin: &fakeAdmin{proxy: proxy}, res: make(chan Result, 1)}
	for _, o := range opts {
		o(r, &cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	r.logs, r.logged = logs, make(chan struct{}, 1)
	notify := func(zapcore.Entry) error {
		select {
		case r.logged <- struct{}{}:
		default:
		}
		return nil
	}
	parts := Parts{Flows: r.flows, Log: zap.New(core, zap.Hooks(notify))}
	if r.tracking != nil {
		parts.Tracking = r.tracking
	}
	if r.arrivals != nil {
		parts.Arrivals = r.arrivals
	}
	if r.reporter != nil {
		parts.Reporter = r.reporter
	}
	if r.untold != nil {
		parts.Untold = r.untold
	}
	if r.apps != nil {
		parts.Apps = r.apps
	}
	if !cfg.Prestop {
		parts.Admin, parts.Proxy = r.admin, r.proxy
	}
	r.m = New(cfg, parts)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	ended := make(chan struct{})
	// The machine ends before the bubble does: its stop steps need the
	// fake clock, which stops once the test's goroutine returns.
	t.Cleanup(func() { cancel(); <-ended })
	go func() { defer close(ended); r.res <- r.m.Run(ctx) }()
	return r
}

func withConfig(fn func(*Config)) rigOption { return func(_ *rig, c *Config) { fn(c) } }
func withoutApps() rigOption                { return func(r *rig, _ *Config) { r.apps = nil } }

// withTracking makes *tr (set by an earlier option) the machine's Tracking.
func withTracking(tr **fakeTracking) rigOption {
	return func(r *rig, _ *Config) { r.tracking = *tr }
}

// waitFor waits until cond holds, checking it after each line the
// machine logs. The fake clock moves on meanwhile, firing the machine's
// timers in order; the timeout (fake too) is reached only by a machine
// that is stuck.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	timeout := time.NewTimer(time.Hour)
	defer timeout.Stop()
	for !cond() {
		// The machine logs a phase before it publishes the State that
		// follows: let it finish what it can at this instant, then look
		// again, so a wake on the log never misses the publish after it.
		synctest.Wait()
		if cond() {
			return
		}
		select {
		case <-r.logged:
		case <-timeout.C:
			r.t.Fatalf("waited an hour (fake clock) for %s; phase %s; log:\n%s", what, r.m.Phase(), r.log())
		}
	}
}

// waitPhase waits for the machine to reach p (each phase change is logged).
func (r *rig) waitPhase(p Phase) {
	r.t.Helper()
	r.waitFor("phase "+p.String(), func() bool { return r.m.Phase() == p })
}

// waitPublished waits for a State in phase p: enter changes the phase
// before it publishes the State that follows, so a test that reads State
// waits on State, not on Phase.
func (r *rig) waitPublished(p Phase) {
	r.t.Helper()
	r.waitFor("state "+p.String()+" published", func() bool { return r.m.State().Phase == p })
}

func (r *rig) result() Result {
	r.t.Helper()
	select {
	case res := <-r.res:
		return res
	case <-time.After(time.Hour):
		r.t.Fatalf("machine still running in %s; log:\n%s", r.m.Phase(), r.log())
	}
	return Result{}
}

// notDone checks the machine is still running, after letting it work.
func (r *rig) notDone(settle time.Duration) {
	r.t.Helper()
	select {
	case res := <-r.res:
		r.t.Fatalf("machine ended early: %+v; log:\n%s", res, r.log())
	case <-time.After(settle):
	}
}

func (r *rig) log() string {
	var b strings.Builder
	for _, e := range r.logs.All() {
		fmt.Fprintf(&b, "%s %s", e.Level, e.Message)
		for k, v := range e.ContextMap() {
			fmt.Fprintf(&b, " %s=%v", k, v)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// lines are the lines logged as ev.
func (r *rig) lines(ev logevent.Event) *observer.ObservedLogs {
	return r.logs.Filter(func(e observer.LoggedEntry) bool { return e.ContextMap()[logevent.Key] == string(ev) })
}

func (r *rig) count(ev logevent.Event) int { return r.lines(ev).Len() }

// phases is the sequence of phases the machine logged.
func (r *rig) phases() []string {
	var out []string
	for _, e := range r.lines(logevent.Phase).All() {
		out = append(out, e.ContextMap()["phase"].(string))
	}
	return out
}

func (r *rig) wantPhases(want ...string) {
	r.t.Helper()
	if got := strings.Join(r.phases(), " "); got != strings.Join(want, " ") {
		r.t.Errorf("phases %q, want %q", got, strings.Join(want, " "))
	}
}

func (r *rig) wantResult(res Result, code int, clean bool, reason string) {
	r.t.Helper()
	if res.ExitCode != code || res.Clean != clean || !strings.Contains(res.Reason, reason) {
		r.t.Errorf("result %+v, want exit %d clean %v reason containing %q; log:\n%s", res, code, clean, reason, r.log())
	}
}

// --- triggers ---------------------------------------------------------

func TestTriggers(t *testing.T) {
	for _, c := range Causes {
		t.Run(c.String(), inBubble(func(t *testing.T) {
			r := newRig(t)
			r.waitPhase(Ready)
			r.m.Trigger(c)
			r.waitPhase(Gating)
			if r.m.Cause() != c {
				t.Errorf("cause %s, want %s", r.m.Cause(), c)
			}
			r.notDone(20 * time.Millisecond) // the app still runs
			r.apps.exit()
			if c == CausePreStop {
				r.m.Trigger(CauseSignal) // a native sidecar's: once the app is gone
			}
			res := r.result()
			r.wantResult(res, 0, true, "drained")
			r.wantPhases("ready", "draining", "gating", "stopping", "exited")
			if r.admin.quitCalls.Load() != 1 || len(r.proxy.sent()) != 0 {
				t.Errorf("quit calls %d, signals %v: want one quit and no signal", r.admin.quitCalls.Load(), r.proxy.sent())
			}
			if st, _ := r.m.DrainListeners(); st != DrainListenersDone || !r.admin.dlInbound.Load() {
				t.Errorf("drain_listeners %s inbound %v", st, r.admin.dlInbound.Load())
			}
			// The app's completion needs no endpoint propagation wait.
			minDrain := r.lines(logevent.Phase).Filter(func(e observer.LoggedEntry) bool { return e.ContextMap()["phase"] == "draining" }).All()[0].ContextMap()["min_drain"]
			want := 30 * time.Millisecond
			if c == CauseAppDone {
				want = 0
			}
			if minDrain != want {
				t.Errorf("min_drain %v, want %v", minDrain, want)
			}
		}))
	}
}

func TestTriggerWhileStarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Not LIVE before the machine runs (set after newRig, its first
		// ask could find Envoy LIVE: ready first, under -race now and then).
		r := newRig(t, func(r *rig, _ *Config) { r.admin.notLive.Store(true) })
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("draining", "gating", "stopping", "exited")
	})
}

func TestGatewayDrainsAllListenersAndWaitsForNoApp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Gateway = true }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		res := r.result() // app processes still there: a gateway has no app
		r.wantResult(res, 0, true, "drained")
		if r.admin.dlInbound.Load() {
			t.Error("gateway drained inbound listeners only")
		}
	})
}

// --- the gate -----------------------------------------------------------

func TestGateWaitsForEnvoyDownstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.flows.set(func(v *FlowView) { v.Downstream = 2 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		// The machine logs gating, then evaluates the gate: let it hold on
		// the app first (the first of the two lines counted below).
		synctest.Wait()
		r.apps.exit()
		r.notDone(30 * time.Millisecond)
		if r.admin.activeCalls.Load() != 0 {
			t.Errorf("asked the admin API while the kernel sees live downstream flows")
		}
		// The kernel sees them go; Envoy's counter trails by a moment.
		r.admin.active.Store(1)
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.notDone(30 * time.Millisecond)
		r.admin.active.Store(0) // re-asked with backoff, no event needed
		r.wantResult(r.result(), 0, true, "drained")
		if n := r.admin.activeCalls.Load(); n < 2 {
			t.Errorf("admin asked %d times, want a re-ask", n)
		}
		if n := r.count(logevent.GateHolds); n != 2 {
			// app and envoy, then envoy alone (the kernel's count, then the
			// admin API's): logged when what holds changes, not its counts.
			t.Errorf("%d 'gate holds' lines, want 2; log:\n%s", n, r.log())
		}
	})
}

func TestGateHoldsLoggedOnlyWhenTheyChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.flows.set(func(v *FlowView) { v.Downstream = 1 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		for i := 2; i < 40; i++ {
			r.flows.set(func(v *FlowView) { v.Downstream = i })
			synctest.Wait() // the machine has read this count before the next
		}
		if n := r.count(logevent.GateHolds); n != 1 {
			t.Errorf("%d 'gate holds' lines for 40 count changes, want 1; log:\n%s", n, r.log())
		}
		r.apps.exit()
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldEnvoyActive})) // the kernel's count stands in
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	})
}

// TestGateHoldsFlapLoggedOnce: a keep-alive client's requests turn
// envoy-active on and off while the app runs; each set of kinds is logged
// once, the flapping is not (drain.HoldsRelogAfter).
func TestGateHoldsFlapLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		for i := range 40 {
			r.flows.set(func(v *FlowView) { v.Downstream = (i + 1) % 2 })
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
		}
		if n := r.count(logevent.GateHolds); n != 2 {
			t.Errorf("%d 'gate holds' lines for 40 flips in 2 s, want 2 (app, app and envoy); log:\n%s", n, r.log())
		}
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestGateNoGauges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) { r.admin.noGauges = true }))
		r.waitPhase(Ready)
		r.waitFor("the gauge check", func() bool { return r.m.Gauges() == GaugesAbsent })
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if n := r.admin.activeCalls.Load(); n != 0 {
			t.Errorf("asked for gauges Envoy does not keep %d times", n)
		}
		if r.count(logevent.NoListenerGauges) != 1 {
			t.Errorf("no warning about the missing gauges; log:\n%s", r.log())
		}
	})
}

func TestGateAdminErrorsLeaveTheKernel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) { r.admin.activeErr = errors.New("admin: 500") }))
		r.admin.active.Store(3)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		// The kernel sees no downstream flow: an erroring admin must not hold.
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestMachineSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Settle = 80 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldSettle}))
		r.apps.set(1) // a break restarts the settle
		r.apps.set(0)
		r.wantResult(r.result(), 0, true, "drained")
	})
}

// waitForLog waits for a line logged as ev whose field key, printed,
// is want (any line when key is "").
func (r *rig) waitForLog(ev logevent.Event, key, want string) {
	r.t.Helper()
	r.waitFor(fmt.Sprintf("a %s line with %s=%s", ev, key, want), func() bool {
		for _, e := range r.lines(ev).All() {
			if key == "" || fmt.Sprint(e.ContextMap()[key]) == want {
				return true
			}
		}
		return false
	})
}

func TestGateIdleWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One keep-alive downstream flow, idle, expiring in 50 ms: no event
		// will come; the machine must wake itself and re-read the flows.
		r := newRig(t, withConfig(func(c *Config) { c.IdleTimeout = time.Second }), setup(func(r *rig) {
			r.flows.v = FlowView{Downstream: 1, IdleWake: time.Now().Add(50 * time.Millisecond)}
			r.flows.onRefresh = func(v *FlowView) {
				// Idle from IdleWake on, as package agent's view says it
				// (its IdleWake is already past the threshold).
				if !time.Now().Before(v.IdleWake) {
					v.DownstreamIdle = 1
				}
			}
		}))
		r.apps.exit()
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
		r.flows.mu.Lock()
		defer r.flows.mu.Unlock()
		if r.flows.refreshes == 0 {
			t.Error("the idle expiry did not re-read the flows")
		}
	})
}

// TestGateParkedOnceAppGone: a client's pooled keep-alive to Envoy holds
// no more once the app is gone. Idle times read before it tell nothing
// (a request may have come since), so the machine re-reads the flows at
// once, then again when the one still busy can be parked.
func TestGateParkedOnceAppGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) {
			r.flows.v = FlowView{Downstream: 2, DownstreamParked: 2, Measured: time.Now()}
			r.flows.onRefresh = func(v *FlowView) {
				// The first re-read: one parked, one answered 100 ms ago;
				// the next: both parked.
				switch {
				case v.ParkedWake.IsZero():
					v.DownstreamParked, v.ParkedWake = 1, time.Now().Add(ParkedAfter-100*time.Millisecond)
				default:
					v.DownstreamParked = 2
				}
				v.Measured = time.Now()
			}
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		time.Sleep(2 * time.Second) // the app runs on: the parked flows hold, nothing re-read
		synctest.Wait()
		if r.m.Phase() != Gating {
			t.Fatalf("phase %s with the app alive, want gating", r.m.Phase())
		}
		r.flows.mu.Lock()
		before := r.flows.refreshes
		r.flows.mu.Unlock()
		if before != 0 {
			t.Errorf("%d re-reads while the app ran, want none", before)
		}
		r.apps.exit()
		start := time.Now()
		r.wantResult(r.result(), 0, true, "drained")
		r.flows.mu.Lock()
		defer r.flows.mu.Unlock()
		if n := r.flows.refreshes - before; n != 2 {
			t.Errorf("%d re-reads after the app went, want 2 (at once, then at the parking)", n)
		}
		if took := time.Since(start); took > ParkedAfter {
			t.Errorf("drained %s after the app went, want within ParkedAfter (%s)", took, ParkedAfter)
		}
	})
}

func TestGatePartialProcessViewNeverOverridesSockets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, func(r *rig, _ *Config) { r.apps = newFakeApps(0, ProcsPartial) })
		r.flows.set(func(v *FlowView) { v.AppListeners = 1 })
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.notDone(30 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppListeners = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	})
}

// --- second signals -------------------------------------------------------

func TestSecondSignalIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.MinDrain = 100 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Draining)
		r.m.Trigger(CauseSignal)
		r.waitForLog(logevent.TriggerIgnored, "trigger", CauseSignal.String())
		if r.m.Phase() != Draining {
			t.Errorf("a second signal ended the min-drain")
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("ready", "draining", "gating", "stopping", "exited")
	})
}

func TestNativeSidecarSIGTERMAfterPreStop(t *testing.T) {
	// No process view: only the app's sockets can say it is gone, which
	// no idle app's can prove; the kubelet's SIGTERM does.
	partial := func(r *rig, _ *Config) {
		r.apps = nil
		r.flows.set(func(v *FlowView) { v.AppListeners = 1 })
	}
	appGone := func(r *rig) { r.flows.set(func(v *FlowView) { v.AppListeners = 0 }) }
	t.Run("app gone during the min-drain", inBubble(func(t *testing.T) {
		r := newRig(t, partial, withConfig(func(c *Config) { c.MinDrain = time.Hour; c.Deadline = 2 * time.Hour }))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Draining)
		appGone(r)
		r.notDone(50 * time.Millisecond)
		r.m.Trigger(CauseSignal) // the kubelet: every app container has exited
		r.wantResult(r.result(), 0, true, "drained")
		if r.count(logevent.SigtermEndsMinDrain) != 1 {
			t.Errorf("no native-sidecar line; log:\n%s", r.log())
		}
	}))
	t.Run("the gate waits for the SIGTERM", inBubble(func(t *testing.T) {
		r := newRig(t, partial)
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		appGone(r)
		r.waitForLog(logevent.GateHolds, "hold_kinds", fmt.Sprint([]HoldKind{HoldAwaitSignal}))
		r.notDone(50 * time.Millisecond)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, true, "drained")
	}))
	// The app seen gone stands in for the SIGTERM, in the gate (Gating)
	// and during the min-drain (Draining), which it ends.
	for _, at := range []Phase{Gating, Draining} {
		t.Run("the app seen gone while "+at.String(), inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) {
				if at == Draining {
					c.MinDrain, c.Deadline = time.Hour, 2*time.Hour
				}
			}))
			r.waitPhase(Ready)
			r.m.Trigger(CausePreStop)
			r.waitPhase(at)
			r.notDone(50 * time.Millisecond)
			r.apps.exit()
			r.wantResult(r.result(), 0, true, "drained")
			r.wantPhases("ready", "draining", "gating", "stopping", "exited")
			if r.count(logevent.AppGoneEndsAwait) != 1 || r.count(logevent.SigtermAfterPrestop) != 0 {
				t.Errorf("want one app_gone_ends_await line, no SIGTERM; log:\n%s", r.log())
			}
		}))
	}
	t.Run("the app seen gone, Envoy still busy", inBubble(func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.waitPhase(Gating)
		r.flows.set(func(v *FlowView) { v.Downstream = 1 })
		r.apps.exit()
		r.waitForLog(logevent.AppGoneEndsAwait, "", "")
		r.notDone(50 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.Downstream = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	}))
	t.Run("a classic sidecar with the hook", inBubble(func(t *testing.T) {
		// SIGTERM right after the hook, the app still running: it is the
		// kubelet's for this container; the min-drain and the gate go on.
		r := newRig(t, withConfig(func(c *Config) { c.MinDrain = 100 * time.Millisecond }))
		r.waitPhase(Ready)
		r.m.Trigger(CausePreStop)
		r.m.Trigger(CauseSignal)
		r.waitForLog(logevent.SigtermAfterPrestop, "", "")
		r.waitPhase(Gating)
		r.notDone(30 * time.Millisecond)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	}))
}

// --- quit, cancel -----------------------------------------------------------

func TestQuitAndCancel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase Phase
		do    func(*rig)
		why   string
	}{
		{"quit when ready", Ready, func(r *rig) { r.m.Quit() }, "POST /quitquitquit"},
		{"quit when gating", Gating, func(r *rig) { r.m.Quit() }, "POST /quitquitquit"},
		{"cancel when ready", Ready, func(r *rig) { r.cancel() }, "context cancelled"},
		{"cancel when gating", Gating, func(r *rig) { r.cancel() }, "context cancelled"},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			r := newRig(t)
			r.waitPhase(Ready)
			if tc.phase == Gating {
				r.m.Trigger(CauseSignal)
				r.waitPhase(Gating)
			}
			tc.do(r)
			r.wantResult(r.result(), 0, false, tc.why)
			if r.admin.quitCalls.Load() != 1 {
				t.Errorf("%d quit calls, want 1", r.admin.quitCalls.Load())
			}
		}))
	}
}

// --- the proxy ends on its own, in each phase ---------------------------------

func TestProxyExitsInEachPhase(t *testing.T) {
	for _, tc := range []struct {
		phase    Phase
		minDrain time.Duration
		when     string
	}{
		{Starting, time.Hour, "before any drain"},
		{Ready, time.Hour, "before any drain"},
		{Draining, time.Hour, "during the drain"},
		{Gating, 0, "during the drain"},
	} {
		t.Run(tc.phase.String(), inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) { c.MinDrain = tc.minDrain; c.Deadline = 2 * time.Hour }))
			if tc.phase == Starting {
				r.admin.notLive.Store(true)
			} else {
				r.waitPhase(Ready)
			}
			if tc.phase >= Draining {
				r.m.Trigger(CauseSignal)
				r.waitPhase(tc.phase)
			}
			r.proxy.exit(134)
			r.wantResult(r.result(), 134, false, "proxy exited with code 134 "+tc.when)
			if r.admin.quitCalls.Load() != 0 {
				t.Error("asked a dead proxy to quit")
			}
		}))
	}
	t.Run("exit 0 is a failure too", inBubble(func(t *testing.T) {
		r := newRig(t)
		r.waitPhase(Ready)
		r.proxy.exit(0)
		r.wantResult(r.result(), 1, false, "before any drain")
	}))
	t.Run("exit 0 stands for a supervisor that decides it", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ProxyExitStands = true }))
		r.waitPhase(Ready)
		r.proxy.exit(0)
		r.wantResult(r.result(), 0, false, "proxy exited with code 0 before any drain")
	}))
	t.Run("stopping", inBubble(func(t *testing.T) {
		r := newRig(t, setup(func(r *rig) {
			r.admin.quitErr = errors.New("admin: 500")
			r.proxy.ignore[syscall.SIGTERM] = true
			r.proxy.noExitOn = true
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.apps.exit()
		r.waitPhase(Stopping)
		r.proxy.exit(134) // crashes while being stopped
		r.wantResult(r.result(), 134, false, "proxy exited with code 134")
	}))
}

// --- the stop steps -------------------------------------------------------------

func TestStopEscalates(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(*rig)
		signals []syscall.Signal
		code    int
	}{
		{"quit works", func(r *rig) {}, nil, 0},
		{"quit fails, SIGTERM works", func(r *rig) { r.admin.quitErr = errors.New("admin: 500") }, []syscall.Signal{syscall.SIGTERM}, 0},
		{"quit ignored, SIGTERM works", func(r *rig) { r.proxy.noExitOn = true }, []syscall.Signal{syscall.SIGTERM}, 0},
		{"SIGTERM ignored too", func(r *rig) { r.proxy.noExitOn = true; r.proxy.ignore[syscall.SIGTERM] = true }, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, 137},
		{"admin hangs", nil, []syscall.Signal{syscall.SIGTERM}, 0},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			if tc.setup == nil { // the admin API hangs once Envoy is LIVE
				tc.setup = func(*rig) {}
			}
			r := newRig(t, setup(tc.setup))
			r.waitPhase(Ready)
			if tc.name == "admin hangs" {
				r.admin.hang.Store(true)
			}
			r.m.Trigger(CauseSignal)
			r.apps.exit()
			res := r.result()
			if res.ExitCode != tc.code || fmt.Sprint(r.proxy.sent()) != fmt.Sprint(tc.signals) {
				t.Errorf("exit %d signals %v, want %d %v; log:\n%s", res.ExitCode, r.proxy.sent(), tc.code, tc.signals, r.log())
			}
		}))
	}
}

// --- deadlines -----------------------------------------------------------------

func TestDeadlineInEachPhase(t *testing.T) {
	t.Run("gating", inBubble(func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.Deadline = time.Second }), setup(func(r *rig) {
			r.flows.holding = []OpenFlow{{Owner: "app", Direction: "inbound", State: "ESTABLISHED"}}
		}))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		res := r.result() // the app never exits
		r.wantResult(res, 0, false, "deadline")
		if r.count(logevent.DeadlineReached) != 1 || r.count(logevent.OpenFlowAtDeadline) != 1 {
			t.Errorf("deadline report missing; log:\n%s", r.log())
		}
	}))
	t.Run("draining", inBubble(func(t *testing.T) {
		// Reconcile keeps a min-drain inside the deadline; the machine must
		// still end by the deadline if handed one that is not.
		cfg := testConfig()
		cfg.Deadline, cfg.MinDrain = time.Second, time.Hour
		r := newRig(t, withConfig(func(c *Config) { *c = cfg }))
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.wantResult(r.result(), 0, false, "deadline")
		r.wantPhases("ready", "draining", "stopping", "exited")
	}))
	t.Run("the whole drain fits", inBubble(func(t *testing.T) {
		// Everything stuck: the app never exits, the admin API hangs, the
		// proxy ignores SIGTERM. The stop steps run inside the deadline.
		r := newRig(t, withConfig(func(c *Config) { c.Deadline = time.Second }), setup(func(r *rig) {
			r.proxy.noExitOn = true
			r.proxy.ignore[syscall.SIGTERM] = true
		}))
		r.waitPhase(Ready)
		r.admin.hang.Store(true)
		start := time.Now()
		r.m.Trigger(CauseSignal)
		res := r.result()
		took := time.Since(start)
		r.wantResult(res, 137, false, "deadline")
		if took > r.m.Config().Deadline { // the fake clock is exact: no slack for a loaded machine
			t.Errorf("ended %s after the trigger: the stop steps ran past the deadline", took)
		}
		t.Logf("everything stuck: ended %s after the trigger (deadline 1s, stop reserve %s)", took, r.m.Config().StopReserve())
	}))
}

// --- drain_listeners is retried ----------------------------------------------------

func TestDrainListenersRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.admin.dlFailures.Store(3)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.waitFor("drain_listeners", func() bool { st, _ := r.m.DrainListeners(); return st == DrainListenersDone })
		if _, n := r.m.DrainListeners(); n != 4 {
			t.Errorf("%d attempts, want 4", n)
		}
		if r.count(logevent.DrainListenersFailed) != 1 {
			t.Errorf("the same failure logged more than once; log:\n%s", r.log())
		}
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
	})
}

func TestDrainListenersGivesUpWithTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.admin.dlFailures.Store(1 << 30)
		r.waitPhase(Ready)
		r.m.Trigger(CauseSignal)
		r.waitPhase(Gating)
		r.apps.exit()
		r.wantResult(r.result(), 0, true, "drained")
		if st, n := r.m.DrainListeners(); st != DrainListenersGaveUp || n < 1 {
			t.Errorf("drain_listeners %s after %d attempts, want gave-up", st, n)
		}
	})
}

// --- prestop is the same machine --------------------------------------------------

func TestPrestop(t *testing.T) {
	t.Run("flows done", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows }),
			setup(func(r *rig) { r.flows.v = FlowView{AppHolding: 1, AppListeners: 1} }))
		r.waitPhase(Gating)
		r.notDone(20 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppHolding = 0 })
		r.wantResult(r.result(), 0, true, "drained")
		r.wantPhases("draining", "gating", "exited")
	}))
	t.Run("wait listeners", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows; c.WaitListeners = true }),
			setup(func(r *rig) { r.flows.v = FlowView{AppListeners: 1} }))
		r.waitPhase(Gating)
		r.notDone(20 * time.Millisecond)
		r.flows.set(func(v *FlowView) { v.AppListeners = 0 })
		r.wantResult(r.result(), 0, true, "drained")
	}))
	t.Run("timeout", inBubble(func(t *testing.T) {
		r := newRig(t, withoutApps(), withConfig(func(c *Config) { c.Prestop = true; c.AppExit = AppExitFlows; c.Deadline = 100 * time.Millisecond }),
			setup(func(r *rig) { r.flows.v = FlowView{AppHolding: 1} }))
		r.wantResult(r.result(), 0, false, "deadline")
		if r.count(logevent.DeadlineReached) != 1 {
			t.Errorf("no prestop deadline line; log:\n%s", r.log())
		}
	}))
}

// --- configuration -----------------------------------------------------------------

func TestConfigReserveAndReconcile(t *testing.T) {
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := d.StopReserve(); got != time.Second+4*time.Second+KillWait {
		t.Errorf("default stop reserve %s", got)
	}
	if d.Deadline >= GracePeriod || d.GraceWarning(0) != "" {
		t.Errorf("defaults do not fit the default grace period: %s", d.Deadline)
	}
	bad := d
	bad.Deadline = 3 * time.Second
	var ce *ConfigError
	if err := bad.Validate(); !errors.As(err, &ce) || !strings.Contains(err.Error(), "leaves no time to drain") {
		t.Errorf("3s deadline with 2s stop timeout: %v", err)
	}
	long := d
	long.Deadline = time.Hour
	if w := long.GraceWarning(0); !strings.Contains(w, "terminationGracePeriodSeconds to at least 3602") {
		t.Errorf("grace warning %q", w)
	}
	// Istio: MINIMUM_DRAIN_DURATION=30s with the default deadline.
	c := d
	c.MinDrain, c.MinDrainAuto = 30*time.Second, false
	got, warn := c.Reconcile(false)
	if got.Deadline != 30*time.Second+d.StopReserve() || got.MinDrain != 30*time.Second || warn == "" {
		t.Errorf("default deadline: %+v %q", got, warn)
	}
	got, warn = c.Reconcile(true)
	if got.Deadline != d.Deadline || got.MinDrain != d.GateDeadline() || warn == "" {
		t.Errorf("explicit deadline: %+v %q", got, warn)
	}
	if got, warn := d.Reconcile(true); got != d || warn != "" {
		t.Errorf("nothing to mend: %+v %q", got, warn)
	}
	// --min-drain auto (the default) under a short deadline (a 15 s grace
	// period's 10 s): the default ceiling is cut to fit, quietly; one the
	// operator chose is cut with a warning, or raises a default deadline.
	short := d
	short.Deadline = 10 * time.Second
	if got, warn := short.Reconcile(true); got.RotationCeiling != short.GateDeadline() || got.RotationFloor != DefaultRotationFloor || got.Deadline != short.Deadline || warn != "" {
		t.Errorf("default ceiling, 10s deadline: %+v %q", got, warn)
	}
	short.RotationCeilingSet = true
	if got, warn := short.Reconcile(true); got.RotationCeiling != short.GateDeadline() || !strings.Contains(warn, "the ceiling is cut to 4.5s") {
		t.Errorf("chosen ceiling, 10s deadline: %+v %q", got, warn)
	}
	chosen := d
	chosen.RotationCeiling, chosen.RotationCeilingSet = 30*time.Second, true
	if got, warn := chosen.Reconcile(false); got.Deadline != 30*time.Second+d.StopReserve() || !strings.Contains(warn, "the deadline is raised") {
		t.Errorf("chosen ceiling 30s, default deadline: %+v %q", got, warn)
	}
}

// setup changes the fakes before the machine starts (their plain fields
// are not safe to change while it runs).
func setup(fn func(*rig)) rigOption { return func(r *rig, _ *Config) { fn(r) } }

// --- --exit-with-app (Jobs) ------------------------------------------------

func TestExitWithApp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  ExitWithApp
		code  int
		stops bool
	}{
		{"success mode, exit 0", ExitWithAppSuccess, 0, true},
		{"success mode, exit 1 (OnFailure restarts it)", ExitWithAppSuccess, 1, false},
		{"any mode, exit 1", ExitWithAppAny, 1, true},
		{"any mode, killed", ExitWithAppAny, -1, true},
		{"off", ExitWithAppOff, 0, false},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = tc.mode; c.AppRestartGrace = 50 * time.Millisecond }))
			r.waitPhase(Ready)
			r.apps.mainExits(tc.code)
			if !tc.stops {
				r.notDone(300 * time.Millisecond)
				if r.m.Phase() != Ready {
					t.Fatalf("phase %s after the app's exit, want ready", r.m.Phase())
				}
				r.m.Trigger(CauseSignal) // the pod's end
				r.wantResult(r.result(), 0, true, "drained")
				return
			}
			r.wantResult(r.result(), 0, true, "drained")
			if r.m.Cause() != CauseAppDone {
				t.Errorf("drain cause %s, want app-done", r.m.Cause())
			}
		}))
	}
}

func TestExitWithAppRestartWithinGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = ExitWithAppAny; c.AppRestartGrace = 300 * time.Millisecond }))
		r.waitPhase(Ready)
		for i := range 3 { // a crash loop: killed, back 100 ms later
			r.apps.mainExits(-1)
			r.notDone(100 * time.Millisecond) // inside the grace: the proxy stays
			r.apps.set(1)
			r.waitFor("the app's return", func() bool {
				return r.count(logevent.AppBack) == i+1
			})
		}
		r.notDone(500 * time.Millisecond)
		if r.m.Phase() != Ready || r.count(logevent.AppBack) != 3 {
			t.Fatalf("phase %s; log:\n%s", r.m.Phase(), r.log())
		}
		r.m.Quit()
		r.result()
	})
}

// An app never seen since the machine began watching (a Job's app
// container that ran and left before draind's process source was live, or
// one not started yet): --app-start-timeout after the machine's start,
// the app is taken as done and the proxy stops, exit 0; an app that
// appears before keeps it, and its own exit decides.
func TestExitWithAppNeverSeen(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name    string
		mode    ExitWithApp
		timeout time.Duration
		appears time.Duration // the app's first process comes then (0: never)
		blip    bool          // and goes without an exit (taken for another container's)
		stops   bool
	}{
		{"success, never seen", ExitWithAppSuccess, timeout, 0, false, true},
		{"any, never seen", ExitWithAppAny, timeout, 0, false, true},
		{"success, seen late, exit 0", ExitWithAppSuccess, timeout, timeout / 2, false, true},
		{"a process taken for the app for a moment", ExitWithAppSuccess, timeout, timeout / 2, true, true},
		{"no start timeout: awaited", ExitWithAppSuccess, 0, 0, false, false},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			start := time.Now()
			r := newRig(t, setup(func(r *rig) { r.apps = newFakeApps(0, ProcsComplete) }),
				withConfig(func(c *Config) { c.ExitWithApp, c.AppStartTimeout = tc.mode, tc.timeout }))
			r.waitPhase(Ready)
			if tc.timeout > 0 {
				r.waitForLog(logevent.AppNotSeenYet, "app_start_timeout", tc.timeout.String())
			}
			switch {
			case tc.appears > 0 && tc.blip:
				time.Sleep(tc.appears - time.Since(start))
				r.apps.set(1)
				r.notDone(timeout / 4)
				r.apps.set(0) // no main exit: still never seen
			case tc.appears > 0:
				time.Sleep(tc.appears - time.Since(start))
				r.apps.set(1)
				r.notDone(2 * timeout) // past the start timeout: the app is there
				r.apps.mainExits(0)
			}
			if !tc.stops {
				r.notDone(time.Hour)
				r.m.Trigger(CauseSignal)
				r.wantResult(r.result(), 0, true, "drained")
				return
			}
			res := r.result()
			r.wantResult(res, 0, true, "drained")
			if r.m.Cause() != CauseAppDone {
				t.Errorf("drain cause %s, want app-done", r.m.Cause())
			}
			never := r.count(logevent.AppNeverSeen)
			if took := time.Since(start); (tc.appears == 0 || tc.blip) && (never != 1 || took < timeout || took >= timeout+timeout/4) {
				// The fake clock: the start timeout, not extended by a process
				// that came and went.
				t.Errorf("stopped %s after the start with %d app_never_seen lines, want at %s with one; log:\n%s", took, never, timeout, r.log())
			}
			if tc.appears > 0 && !tc.blip && never != 0 {
				t.Errorf("an app seen late was taken as never seen; log:\n%s", r.log())
			}
		}))
	}
}

// A main exit whose code draind could not read (its event lost, inferred
// from a snapshot) ends the proxy after the restart grace in success mode
// too: a Job must not hang on it.
func TestExitWithAppUnknownExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = ExitWithAppSuccess; c.AppRestartGrace = 300 * time.Millisecond }))
		r.waitPhase(Ready)
		start := time.Now()
		r.apps.mainExitsUnknown()
		r.wantResult(r.result(), 0, true, "drained")
		if took := time.Since(start); took < 300*time.Millisecond || r.m.Cause() != CauseAppDone {
			t.Errorf("stopped %s after the exit by %s, want after the 300ms grace by app-done; log:\n%s", took, r.m.Cause(), r.log())
		}
	})
}

// fakeTracking records how often the machine started the live views, and
// where drain_listeners stood then.
type fakeTracking struct {
	calls      atomic.Int32
	dlAtStart  DrainListenersState
	dlState    func() DrainListenersState
	startError error
}

func (f *fakeTracking) Start() error {
	f.calls.Add(1)
	f.dlAtStart = f.dlState()
	return f.startError
}

// The live views start at the trigger, once, whatever the trigger: not
// while Ready, after drain_listeners is under way (its clients must not
// wait for draind's views), before the gate reads them. A failure to start
// is logged and the drain goes on.
func TestTrackingStartsAtTheTrigger(t *testing.T) {
	for _, c := range []Cause{CauseSignal, CausePOST, CausePreStop} {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail=%v", c, fail), inBubble(func(t *testing.T) {
				var tr *fakeTracking
				r := newRig(t, func(r *rig, _ *Config) {
					tr = &fakeTracking{}
					if fail {
						tr.startError = errors.New("attach: operation not permitted")
					}
				}, withTracking(&tr))
				tr.dlState = func() DrainListenersState { s, _ := r.m.DrainListeners(); return s }
				r.waitPhase(Ready)
				r.notDone(20 * time.Millisecond)
				if n := tr.calls.Load(); n != 0 {
					t.Fatalf("tracking started %d times while Ready", n)
				}
				r.m.Trigger(c)
				r.waitPhase(Draining)
				r.m.Trigger(CauseSignal) // a second trigger starts nothing
				r.apps.exit()
				if c == CausePreStop {
					r.m.Trigger(CauseSignal)
				}
				if res := r.result(); res.ExitCode != 0 {
					t.Fatalf("result %+v; log:\n%s", res, r.log())
				}
				if n := tr.calls.Load(); n != 1 {
					t.Errorf("tracking started %d times, want once", n)
				}
				if tr.dlAtStart == DrainListenersNotSent {
					t.Errorf("tracking started before drain_listeners was under way")
				}
				want := logevent.TrackingLive
				if fail {
					want = logevent.TrackingFailed
				}
				if r.count(want) != 1 {
					t.Errorf("no %q in the log:\n%s", want, r.log())
				}
			}))
		}
	}
}
