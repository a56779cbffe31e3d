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

// setup changes the fakes before the machine starts (their plain fields
// are not safe to change while it runs).
func setup(fn func(*rig)) rigOption { return func(r *rig, _ *Config) { fn(r) } }

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
