package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/draind/draind/internal/conntrack"
	"github.com/draind/draind/internal/envoy"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Phase is where the drain state machine is (DESIGN.md, "The drain").
type Phase int32

const (
	PhaseStarting Phase = iota
	PhaseReady
	PhaseDraining
	PhaseGating
	PhaseStopping
	PhaseExited
)

var allPhases = []Phase{PhaseStarting, PhaseReady, PhaseDraining, PhaseGating, PhaseStopping, PhaseExited}

func (p Phase) String() string {
	return [...]string{"starting", "ready", "draining", "gating", "stopping", "exited"}[p]
}

// Agent is `draind run`: the proxy's supervisor and the drain.
type Agent struct {
	cfg         Config
	log         *zap.Logger
	admin       *envoy.Client
	ns          *conntrack.NetNS
	tracker     *conntrack.Tracker
	trackerMode string
	procs       conntrack.AppProcSource
	proxy       *Proxy
	metrics     *metrics
	status      *statusServer

	phase      atomic.Int32
	drainReq   chan string
	quitReq    chan struct{}
	quitOnce   sync.Once
	appPortSet map[uint16]bool
	// nonTraffic are local ports whose connections are not Envoy's
	// downstream traffic: --exclude-ports, draind's status port, the admin.
	nonTraffic map[uint16]bool
}

// Result is how a run ended.
type Result struct {
	// ExitCode is what draind exits with: 0 after a clean drain, the
	// proxy's code (or 128+signal) when it crashed, 137 when draind had to
	// SIGKILL it.
	ExitCode int
	Reason   string
}

// Run is `draind run`: it starts the proxy, serves the status endpoints and
// drains on SIGTERM/SIGINT or POST /drain, until the proxy is stopped.
// Cancelling ctx stops the proxy at once (no drain). Errors are start-up
// failures; a *ConfigError is the operator's to fix.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	a := &Agent{cfg: cfg, log: log, drainReq: make(chan string, 4), quitReq: make(chan struct{})}
	a.appPortSet = map[uint16]bool{}
	for _, p := range cfg.AppPorts {
		a.appPortSet[p] = true
	}

	// Signals first: a SIGTERM during start-up must drain, not kill us.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)

	var closers []func() error
	defer func() {
		var errs []error
		for _, c := range slices.Backward(closers) {
			errs = append(errs, c())
		}
		if cerr := errors.Join(errs...); cerr != nil && err == nil {
			log.Warn("cleanup", zap.Error(cerr))
		}
	}()

	ln, err := net.Listen("tcp", cfg.StatusAddr)
	if err != nil {
		return Result{}, configErr("--status-addr %s: %v", cfg.StatusAddr, errors.Unwrap(err))
	}
	closers = append(closers, func() error { ln.Close(); return nil })
	_, statusPort, _ := splitPort(ln.Addr().String())
	_, adminPort, _ := splitPort(cfg.AdminAddr)
	a.nonTraffic = map[uint16]bool{statusPort: true, adminPort: true}
	for _, p := range cfg.ExcludePorts {
		a.nonTraffic[p] = true
	}

	if a.ns, err = conntrack.CurrentNetNS(); err != nil {
		return Result{}, err
	}
	closers = append(closers, a.ns.Close)
	policy := conntrack.Policy{
		ProxyUID:         cfg.ProxyUID,
		ProxyPorts:       append(slices.Clone(cfg.ProxyPorts), statusPort),
		ProxyRemotePorts: []uint16{adminPort, statusPort},
		IdleTimeout:      cfg.IdleTimeout,
	}
	a.tracker, err = conntrack.OpenTracker(a.ns, conntrack.TrackerConfig{Mode: cfg.Tracker, Policy: policy, Logger: log})
	if err != nil {
		return Result{}, fmt.Errorf("tracker: %w", err)
	}
	closers = append(closers, a.tracker.Close)
	mode, why := a.tracker.Mode()
	a.trackerMode = mode
	log.Info("tracker", zap.String("mode", mode), zap.String("reason", why))

	a.admin = envoy.New(cfg.AdminAddr, envoy.WithTimeout(time.Second))
	closers = append(closers, func() error { a.admin.CloseIdleConnections(); return nil })

	if a.proxy, err = StartProxy(cfg.Command, cfg.Proxy); err != nil {
		return Result{}, err
	}
	// From here on the proxy must not outlive us: every return path below
	// ends with it stopped.
	log.Info("proxy started", zap.Int("pid", a.proxy.Pid()), zap.Strings("command", cfg.Command))
	a.openAppProcs()
	if a.procs != nil {
		closers = append(closers, a.procs.Close)
	}

	a.metrics = newMetrics(a)
	a.setPhase(PhaseStarting)
	a.status = newStatusServer(a, ln)

	// Owned goroutines: the tracker, the status server, the start-up
	// watcher. All end before Run returns.
	runCtx, cancelRun := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.tracker.Run(runCtx); err != nil {
			log.Error("tracker stopped", zap.Error(err))
		}
	})
	wg.Go(func() {
		if err := a.status.serve(); err != nil {
			log.Error("status server", zap.Error(err))
		}
	})
	wg.Go(func() { a.watchStartup(runCtx) })
	defer func() {
		a.status.shutdown()
		cancelRun()
		wg.Wait()
	}()

	return a.loop(ctx, sigc), nil
}

// openAppProcs picks the app-liveness source (DESIGN.md, "When is the app
// done?"), logging which and why.
func (a *Agent) openAppProcs() {
	if a.cfg.AppProcs == "off" || a.cfg.Gateway {
		a.log.Info("app liveness", zap.String("source", "sockets"), zap.String("reason", "process tracking off"))
		return
	}
	if hostNetNS(a.ns) {
		// hostNetwork: every process of the node shares this namespace.
		a.log.Info("app liveness", zap.String("source", "sockets"), zap.String("reason", "host network namespace: its processes are the node's, not the app's"))
		return
	}
	rules := conntrack.AppProcRules{SelfPIDs: []int{os.Getpid()}, ProxyUID: a.cfg.ProxyUID, ProxyPIDs: []int{a.proxy.Pid()}}
	mode := conntrack.ProcModeAuto
	switch a.cfg.AppProcs {
	case "ebpf":
		mode = conntrack.ProcModeEBPF
	case "proc":
		mode = conntrack.ProcModeProc
	}
	src, reason, err := conntrack.OpenAppProcSource(a.ns.Inode(), rules, mode)
	if err != nil {
		a.log.Info("app liveness", zap.String("source", "sockets"), zap.String("reason", err.Error()))
		return
	}
	if src.Source() == "proc" && a.cfg.AppProcs == "auto" && src.Count() == 0 {
		// /proc shows only our own PID namespace: with no app process in
		// view, the app is most likely in another container, not absent.
		src.Close()
		a.log.Info("app liveness", zap.String("source", "sockets"), zap.String("reason", reason+"; no app process visible in /proc (no shared PID namespace)"))
		return
	}
	a.procs = src
	a.log.Info("app liveness", zap.String("source", src.Source()), zap.String("reason", reason), zap.Int("app_processes", src.Count()))
}

// Phase returns the current phase.
func (a *Agent) Phase() Phase { return Phase(a.phase.Load()) }

func (a *Agent) setPhase(p Phase) {
	a.phase.Store(int32(p))
	a.metrics.setPhase(p)
}

func (a *Agent) requestDrain(why string) {
	select {
	case a.drainReq <- why:
	default:
	}
}

func (a *Agent) requestQuit() { a.quitOnce.Do(func() { close(a.quitReq) }) }

// watchStartup polls Envoy until it is LIVE with workers started: the only
// polling draind does while not draining, and only until Ready.
func (a *Agent) watchStartup(ctx context.Context) {
	start := time.Now()
	for a.Phase() == PhaseStarting {
		if ok, _ := a.envoyLive(ctx); ok {
			if a.phase.CompareAndSwap(int32(PhaseStarting), int32(PhaseReady)) {
				a.metrics.setPhase(PhaseReady)
				a.log.Info("phase", zap.String("phase", "ready"), zap.Duration("after", time.Since(start)))
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// envoyLive: server.state LIVE and listener_manager.workers_started 1.
func (a *Agent) envoyLive(ctx context.Context) (bool, string) {
	stats, err := a.admin.Stats(ctx, envoy.StatsQuery{Filter: `^(server\.state|listener_manager\.workers_started)$`})
	if err != nil {
		return false, "envoy admin: " + err.Error()
	}
	state, workers := uint64(99), uint64(0)
	for _, s := range stats {
		switch s.Name {
		case "server.state":
			state = s.Value
		case "listener_manager.workers_started":
			workers = s.Value
		}
	}
	if state != uint64(envoy.StateLive) {
		return false, "envoy state " + envoy.ServerState(state).String()
	}
	if workers != 1 {
		return false, "envoy workers not started"
	}
	return true, ""
}

func (a *Agent) readiness(ctx context.Context) (bool, string) {
	if p := a.Phase(); p != PhaseReady {
		if p == PhaseStarting {
			if ok, why := a.envoyLive(ctx); !ok {
				return false, why
			}
			return false, "starting"
		}
		return false, p.String()
	}
	if ok, why := a.envoyLive(ctx); !ok {
		return false, why
	}
	if len(a.appPortSet) > 0 {
		have := map[uint16]bool{}
		for _, f := range a.tracker.Flows(func(f *conntrack.Flow) bool {
			return f.State == conntrack.Listen && f.Owner == conntrack.OwnerApp
		}) {
			have[f.Local.Port()] = true
		}
		for p := range a.appPortSet {
			if !have[p] {
				return false, fmt.Sprintf("app not listening on port %d", p)
			}
		}
	}
	return true, ""
}

// loop waits for the drain trigger, then drains and stops the proxy.
func (a *Agent) loop(ctx context.Context, sigc <-chan os.Signal) Result {
	var why string
	select {
	case <-a.proxy.Exited():
		return a.proxyDied("before any drain")
	case sig := <-sigc:
		why = sig.String()
	case why = <-a.drainReq:
	case <-a.quitReq:
		return a.stop(time.Now(), "POST /quitquitquit", false)
	case <-ctx.Done():
		return a.stop(time.Now(), "context cancelled", false)
	}
	return a.drain(ctx, why, sigc)
}

func (a *Agent) proxyDied(when string) Result {
	a.setPhase(PhaseExited)
	code := a.proxy.ExitCode()
	if code == 0 {
		code = 1 // a sidecar proxy that leaves on its own is a failure
	}
	a.log.Error("proxy exited on its own", zap.String("when", when), zap.String("how", a.proxy.ExitDescription()), zap.Int("exit_code", code))
	return Result{ExitCode: code, Reason: "proxy " + a.proxy.ExitDescription() + " " + when}
}

// drain runs Draining and Gating, then stops the proxy.
func (a *Agent) drain(ctx context.Context, why string, sigc <-chan os.Signal) Result {
	start := time.Now()
	deadline := time.NewTimer(a.cfg.DrainDeadline)
	defer deadline.Stop()
	a.setPhase(PhaseDraining)
	sum := a.tracker.Summary()
	a.log.Info("phase", zap.String("phase", "draining"), zap.String("trigger", why),
		zap.Duration("min_drain", a.cfg.MinDrain), zap.Duration("deadline", a.cfg.DrainDeadline), zap.Any("flows", sum))

	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := a.admin.DrainListeners(dctx, envoy.DrainOptions{InboundOnly: !a.cfg.Gateway, Graceful: true})
	cancel()
	if err != nil {
		a.log.Warn("drain_listeners failed; draining on without it", zap.Error(err))
	}

	// Let endpoint removal propagate before the app's in-flight work is
	// all that matters. Interruptible by everything but a repeated signal.
	minDrain := time.NewTimer(a.cfg.MinDrain)
	defer minDrain.Stop()
wait:
	for {
		select {
		case <-minDrain.C:
			break wait
		case <-a.proxy.Exited():
			return a.proxyDied("during the drain")
		case <-deadline.C:
			return a.deadline(start)
		case <-a.quitReq:
			return a.stop(start, "POST /quitquitquit", false)
		case <-ctx.Done():
			return a.stop(start, "context cancelled", false)
		case sig := <-sigc:
			a.log.Info("signal during drain ignored: already draining", zap.String("signal", sig.String()))
		case <-a.drainReq:
		}
	}
	return a.gate(ctx, start, deadline.C, sigc)
}

func (a *Agent) gate(ctx context.Context, start time.Time, deadline <-chan time.Time, sigc <-chan os.Signal) Result {
	a.setPhase(PhaseGating)
	a.log.Info("phase", zap.String("phase", "gating"), zap.Duration("since_drain", time.Since(start)), zap.Any("flows", a.tracker.Summary()))
	flowsChanged, unsub := a.tracker.Subscribe()
	defer unsub()
	var procsChanged <-chan struct{}
	if a.procs != nil {
		procsChanged = a.procs.Notify()
	}
	g := Gate{Settle: a.cfg.Settle}
	var lastHolds string
	adminBackoff := time.Duration(0)
	for {
		in, idleWake := a.gateInput(ctx)
		v := g.Step(in)
		if v.Open {
			return a.stop(start, "drained", true)
		}
		if h := fmt.Sprint(v.Holds); h != lastHolds {
			lastHolds = h
			a.log.Info("gate holds", zap.Stringers("holds", v.Holds), zap.Duration("since_drain", time.Since(start)))
		}
		// Wake on the next change, or at a computed moment: the end of
		// --settle, a flow's idle timeout, or a re-ask of an admin API
		// that lags behind the kernel. Never on a fixed tick.
		wake := v.WakeAt
		if !idleWake.IsZero() && (wake.IsZero() || idleWake.Before(wake)) {
			wake = idleWake
		}
		if a.envoyOnlyHold(in, v) {
			adminBackoff = min(max(2*adminBackoff, 5*time.Millisecond), 250*time.Millisecond)
			if w := in.Now.Add(adminBackoff); wake.IsZero() || w.Before(wake) {
				wake = w
			}
		} else {
			adminBackoff = 0
		}
		var timer <-chan time.Time
		stopTimer := func() bool { return false }
		if !wake.IsZero() {
			t := time.NewTimer(time.Until(wake))
			timer, stopTimer = t.C, t.Stop
		}
		res, done := a.gateWait(ctx, start, flowsChanged, procsChanged, timer, idleWake, deadline, sigc)
		stopTimer()
		if done {
			return res
		}
	}
}

// gateWait waits for one reason to look at the gate again; done means the
// drain ended (the proxy died, the deadline passed, a quit was asked).
func (a *Agent) gateWait(ctx context.Context, start time.Time, flowsChanged, procsChanged <-chan struct{}, timer <-chan time.Time,
	idleWake time.Time, deadline <-chan time.Time, sigc <-chan os.Signal) (Result, bool) {
	select {
	case <-flowsChanged:
	case <-procsChanged:
	case <-timer:
		if !idleWake.IsZero() && !time.Now().Before(idleWake) {
			a.tracker.Resync() // idle times come from sock_diag, not events
		}
	case <-a.proxy.Exited():
		return a.proxyDied("during the drain"), true
	case <-deadline:
		return a.deadline(start), true
	case <-a.quitReq:
		return a.stop(start, "POST /quitquitquit", false), true
	case <-ctx.Done():
		return a.stop(start, "context cancelled", false), true
	case sig := <-sigc:
		a.log.Info("signal during drain ignored: already draining", zap.String("signal", sig.String()))
	case <-a.drainReq:
	}
	return Result{}, false
}

// envoyOnlyHold: the kernel sees no live downstream flow of Envoy's but
// its admin API still counts some (its counters trail the sockets by a
// moment, or it did not answer): re-ask with backoff.
func (a *Agent) envoyOnlyHold(in GateInput, v Verdict) bool {
	if in.ProxyDownstream-in.ProxyDownstreamIdle > 0 {
		return false
	}
	for _, h := range v.Holds {
		if h.Who == "envoy" {
			return true
		}
	}
	return false
}

// gateInput gathers the gate's inputs. It asks Envoy's admin API only
// when the kernel sees no live downstream flow (otherwise Envoy certainly
// has some), so a busy drain does not hammer the admin API. idleWake is
// when the next holding flow will pass --idle-timeout, if any.
func (a *Agent) gateInput(ctx context.Context) (GateInput, time.Time) {
	now := time.Now()
	in := GateInput{Now: now, AppExit: a.cfg.AppExit, Gateway: a.cfg.Gateway, IdleTimeout: a.cfg.IdleTimeout}
	sum := a.tracker.Summary()
	in.AppListeners = sum.AppListeners
	in.AppHolding = sum.AppHolding()
	if a.procs != nil && a.procs.Err() == nil {
		in.AppProcsKnown = true
		in.AppProcs = a.procs.Count()
	}
	exclude := a.nonTraffic
	var idleWake time.Time
	snapAt := a.tracker.LastSnapshot()
	for _, f := range a.tracker.Flows(func(f *conntrack.Flow) bool { return f.State.HoldsDrain() && f.State != conntrack.Listen }) {
		downstream := f.Owner == conntrack.OwnerProxy && f.Direction == conntrack.DirInbound && !exclude[f.Local.Port()]
		if downstream {
			in.ProxyDownstream++
			if f.IdleExpired {
				in.ProxyDownstreamIdle++
			}
		}
		if a.cfg.IdleTimeout > 0 && f.Holds && (downstream || f.Owner == conntrack.OwnerApp) {
			if at := idleExpiry(f.Flow, snapAt, a.cfg.IdleTimeout); idleWake.IsZero() || at.Before(idleWake) {
				idleWake = at
			}
		}
	}
	if in.ProxyDownstream-in.ProxyDownstreamIdle == 0 {
		if done, _ := AppDone(in); done {
			actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			ac, err := a.admin.ActiveDownstream(actx, envoy.ExcludeSet{Ports: a.cfg.ExcludePorts})
			cancel()
			if err == nil {
				in.EnvoyKnown = true
				in.EnvoyActive = int(ac.Total)
			} else {
				a.log.Debug("admin active connections", zap.Error(err))
			}
		}
	} else {
		in.EnvoyKnown = true
		in.EnvoyActive = in.ProxyDownstream // the kernel's count stands in
	}
	return in, idleWake
}

// idleExpiry is the earliest moment a holding flow can pass the idle
// timeout, judged from the snapshot that measured its idle time (a flow
// without one was born after it, so it cannot expire before snapAt +
// timeout). At that moment a fresh snapshot tells.
func idleExpiry(f conntrack.Flow, snapAt time.Time, timeout time.Duration) time.Time {
	idle := time.Duration(max(f.IdleMS, 0)) * time.Millisecond
	return snapAt.Add(timeout - idle + time.Millisecond)
}

// deadline stops the proxy anyway, naming every flow still open.
func (a *Agent) deadline(start time.Time) Result {
	flows := a.tracker.Flows(func(f *conntrack.Flow) bool { return f.State.HoldsDrain() && f.State != conntrack.Listen })
	fields := []zap.Field{zap.Duration("after", time.Since(start)), zap.Int("open_flows", len(flows))}
	if a.procs != nil {
		fields = append(fields, zap.Int("app_processes", a.procs.Count()))
	}
	a.log.Warn("drain deadline reached: stopping the proxy with flows still open", fields...)
	for _, f := range flows {
		a.log.Warn("open flow at deadline",
			zap.String("local", f.Local.String()), zap.String("remote", f.Remote.String()),
			zap.Stringer("owner", f.Owner), zap.Stringer("direction", f.Direction), zap.Stringer("state", f.State),
			zap.Int64("idle_ms", f.IdleMS), zap.Duration("age", f.Age))
	}
	return a.stop(start, "deadline", false)
}

// stop: /quitquitquit, then SIGTERM, then SIGKILL, each given
// --stop-timeout. clean says whether the drain finished.
func (a *Agent) stop(start time.Time, why string, clean bool) Result {
	a.setPhase(PhaseStopping)
	t0 := time.Now()
	a.metrics.drainDuration.Set(t0.Sub(start).Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, a.cfg.StopTimeout))
	err := a.admin.QuitQuitQuit(ctx)
	cancel()
	a.metrics.quitLatency.Set(time.Since(t0).Seconds())
	a.log.Info("phase", zap.String("phase", "stopping"), zap.String("why", why), zap.Duration("drain", t0.Sub(start)),
		zap.Int64("quit_sent_unix_ns", t0.UnixNano()),
		zap.Bool("quitquitquit_ok", err == nil), zap.Any("flows", a.tracker.Summary()))
	if err != nil {
		a.log.Warn("quitquitquit failed", zap.Error(err))
	}
	killed := false
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if sig != 0 {
			a.log.Warn("proxy still running: signalling", zap.Stringer("signal", sig))
			a.proxy.Signal(sig)
			killed = sig == syscall.SIGKILL
		}
		wait := a.cfg.StopTimeout
		if sig == syscall.SIGKILL {
			wait = 5 * time.Second // the kernel's part; it does not fail
		}
		select {
		case <-a.proxy.Exited():
		case <-time.After(wait):
			continue
		}
		break
	}
	a.setPhase(PhaseExited)
	res := Result{Reason: why}
	select {
	case <-a.proxy.Exited():
	default:
		res.ExitCode, res.Reason = 137, why+"; proxy did not exit even after SIGKILL"
		return res
	}
	code := a.proxy.ExitCode()
	switch {
	case killed:
		res.ExitCode = 137
		res.Reason = why + "; proxy had to be killed"
	case code == 0 || code == 128+int(syscall.SIGTERM):
		res.ExitCode = 0
	default:
		res.ExitCode = code
		res.Reason = why + "; proxy " + a.proxy.ExitDescription()
	}
	a.log.Info("phase", zap.String("phase", "exited"), zap.String("why", res.Reason), zap.Int("exit_code", res.ExitCode),
		zap.Duration("total", time.Since(start)), zap.Bool("clean", clean && res.ExitCode == 0))
	return res
}

// initPIDNSInode is the initial PID namespace's fixed inode
// (PROC_PID_INIT_INO).
const initPIDNSInode = 0xEFFFFFFC

// hostNetNS reports whether ns is the host's (init's) network namespace.
// It can only tell from the host's PID namespace, where /proc/1 is the
// node's init; in a container's own PID namespace /proc/1 is a neighbour.
func hostNetNS(ns *conntrack.NetNS) bool {
	var pid, net unix.Stat_t
	return unix.Stat("/proc/self/ns/pid", &pid) == nil && pid.Ino == initPIDNSInode &&
		unix.Stat("/proc/1/ns/net", &net) == nil && net.Ino == ns.Inode()
}
