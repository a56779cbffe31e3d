package envoysim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrCrashed is [Sim.Err] after an injected crash.
var ErrCrashed = errors.New("envoysim: crashed (injected fault)")

// ExitError is [Sim.Err] after the exit-at-start fault: the sim exited
// before going LIVE, as an Envoy whose initialization fails.
type ExitError struct{ Code int }

func (e *ExitError) Error() string {
	return fmt.Sprintf("envoysim: exited at start with code %d (injected fault)", e.Code)
}

// ExitCode is the program's exit code.
func (e *ExitError) ExitCode() int { return e.Code }

// Server states, as Envoy numbers them in server.state.
const (
	stateLive            = 0
	stateDraining        = 1
	statePreInitializing = 2
	stateInitializing    = 3
)

var stateNames = [...]string{"LIVE", "DRAINING", "PRE_INITIALIZING", "INITIALIZING"}

type phase int

const (
	phasePreInit phase = iota
	phaseInitializing
	phaseLive
)

// drainState is a drain sequence started by /drain_listeners?graceful.
type drainState struct {
	start time.Time
	all   bool // drains every listener; false: inbound only
	done  bool // the drain time has passed
	// stops are the listener stops to run when the drain time ends, one
	// per request without skip_exit: true stops all, false inbound only.
	stops []bool
}

// Sim is a running Envoy stand-in. Its methods are safe for concurrent use.
type Sim struct {
	cfg   Config
	st    *store
	start time.Time

	adminLn   net.Listener
	adminSrv  *http.Server
	adminAddr string
	listeners []*listener
	byName    map[string]*listener

	// ctx ends when the sim stops: upstream dials and timers watch it.
	ctx    context.Context
	cancel context.CancelFunc

	mu             sync.Mutex
	phase          phase
	startupOver    bool // the startup delay has passed (LIVE unless NeverLive)
	workersStarted bool // server.* gauges may be refreshed on a read
	hcFailed       bool
	drain          *drainState
	fault          Fault
	faultGen       int  // invalidates crash timers armed by an earlier fault
	drainCrashArm  bool // the fault's CrashAfterDrain waits for a drain
	closing        bool
	conns          map[*conn]struct{}
	reason         error // why the sim stopped: nil, ErrCrashed or an *ExitError
	closeErr       error
	wg             sync.WaitGroup
	done           chan struct{}
	totalConns     atomic.Int64

	server struct {
		state, live, uptime, totalConns, concurrency *metric
	}
	lm struct {
		workersStarted, listenersActive, listenerStopped, createFailure *metric
		ldsSuccess, cdsSuccess                                          *metric // nil without Config.XDS
	}
	admin struct {
		cxActive, cxTotal, mainActive, mainTotal            *metric
		httpCxActive, httpCxTotal, rqActive, rqTotal, rq2xx *metric
		rq4xx, rq5xx                                        *metric
	}
}

// Start binds the admin API and the listeners' sockets and starts the
// sim. The listeners start listening when the server goes LIVE, at once
// with no StartupDelay (when Start returns). Stop it with Close.
func Start(cfg Config) (*Sim, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("envoysim: %w", err)
	}
	s := &Sim{
		cfg:    cfg,
		st:     newStore(cfg.StatsInclusion),
		start:  time.Now(),
		byName: map[string]*listener{},
		conns:  map[*conn]struct{}{},
		done:   make(chan struct{}),
		fault:  cfg.Fault,
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.initStats()

	ln, err := net.Listen("tcp", cfg.AdminAddress)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("envoysim: admin address: %w", err)
	}
	s.adminLn = ln
	s.adminAddr = ln.Addr().String()
	for _, lc := range cfg.Listeners {
		l, err := s.newListener(lc)
		if err != nil {
			s.abortStart()
			return nil, fmt.Errorf("envoysim: listener %q: %w", lc.Name, err)
		}
		s.listeners = append(s.listeners, l)
		s.byName[lc.Name] = l
	}
	if cfg.AdminAddressPath != "" {
		if err := os.WriteFile(cfg.AdminAddressPath, []byte(s.adminAddr), 0o644); err != nil {
			s.abortStart()
			return nil, fmt.Errorf("envoysim: admin address path: %w", err)
		}
	}
	s.logf("admin address: %s", s.adminAddr)
	for _, l := range s.listeners {
		s.logf("listener %s: %s bound (stats listener.%s)", l.cfg.Name, l.addr, l.scope)
	}

	s.adminSrv = &http.Server{
		Handler:     http.HandlerFunc(s.serveAdmin),
		ErrorLog:    log.New(io.Discard, "", 0),
		IdleTimeout: time.Hour,
	}
	s.goTracked(func() { s.adminSrv.Serve(&acceptor{ln: ln, track: s.trackAdmin}) })
	if cfg.StatsFlushInterval > 0 {
		s.goTracked(s.flushLoop)
	}
	if cfg.StartupDelay > 0 {
		s.after(cfg.StartupDelay/2, func() {
			s.mu.Lock()
			if s.phase == phasePreInit {
				s.phase = phaseInitializing
			}
			s.mu.Unlock()
			s.logf("initializing")
		})
		s.after(cfg.StartupDelay, s.startupDone)
	} else {
		s.startupDone()
	}
	s.mu.Lock()
	s.armCrashLocked()
	s.mu.Unlock()
	return s, nil
}

// abortStart undoes a Start that failed half-way.
func (s *Sim) abortStart() {
	s.cancel()
	s.adminLn.Close()
	for _, l := range s.listeners {
		l.sock.close()
	}
}

func (s *Sim) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		fmt.Fprintf(s.cfg.Log, "[%s][envoysim] %s\n", time.Now().UTC().Format("2006-01-02 15:04:05.000"), fmt.Sprintf(format, args...))
	}
}

func (s *Sim) initStats() {
	g, c := s.st.gauge, s.st.counter
	s.server.state = g("server.state") // unset until the first refresh
	s.server.live = g("server.live")
	s.server.live.set(1) // failHealthcheck(false) at initialization
	s.server.uptime = g("server.uptime")
	s.server.totalConns = g("server.total_connections")
	s.server.concurrency = g("server.concurrency")
	s.server.concurrency.set(uint64(s.cfg.Concurrency))
	s.st.histogram("server.initialization_time_ms")
	s.lm.workersStarted = g("listener_manager.workers_started")
	s.lm.listenersActive = g("listener_manager.total_listeners_active")
	s.lm.listenerStopped = c("listener_manager.listener_stopped")
	s.lm.createFailure = c("listener_manager.listener_create_failure")
	if s.cfg.XDS {
		s.lm.cdsSuccess = c("cluster_manager.cds.update_success")
		c("cluster_manager.cds.update_rejected")
		s.lm.ldsSuccess = c("listener_manager.lds.update_success")
		c("listener_manager.lds.update_rejected")
	}
	s.admin.cxActive = g("listener.admin.downstream_cx_active")
	s.admin.cxTotal = c("listener.admin.downstream_cx_total")
	s.admin.mainActive = g("listener.admin.main_thread.downstream_cx_active")
	s.admin.mainTotal = c("listener.admin.main_thread.downstream_cx_total")
	s.admin.httpCxActive = g("http.admin.downstream_cx_active")
	s.admin.httpCxTotal = c("http.admin.downstream_cx_total")
	s.admin.rqActive = g("http.admin.downstream_rq_active")
	s.admin.rqTotal = c("http.admin.downstream_rq_total")
	s.admin.rq2xx = c("http.admin.downstream_rq_2xx")
	s.admin.rq4xx = c("http.admin.downstream_rq_4xx")
	s.admin.rq5xx = c("http.admin.downstream_rq_5xx")
}

// goTracked runs f on a goroutine Close waits for; false once closing.
func (s *Sim) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goLocked(f)
}

func (s *Sim) goLocked(f func()) bool {
	if s.closing {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// enter registers a request handler Close waits for; false once closing.
func (s *Sim) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Sim) leave() { s.wg.Done() }

// after runs f after d unless the sim stops first.
func (s *Sim) after(d time.Duration, f func()) bool {
	return s.goTracked(func() { s.wait(d, nil, f) })
}

func (s *Sim) afterLocked(d time.Duration, f func()) bool {
	return s.goLocked(func() { s.wait(d, nil, f) })
}

// wait runs f after d unless the sim stops or cancel closes first.
func (s *Sim) wait(d time.Duration, cancel <-chan struct{}, f func()) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		f()
	case <-cancel:
	case <-s.ctx.Done():
	}
}

// startupDone is the end of the startup delay: the server goes LIVE,
// unless a fault makes it exit or stay INITIALIZING.
func (s *Sim) startupDone() {
	s.mu.Lock()
	s.startupOver = true
	f := s.fault
	s.mu.Unlock()
	switch {
	case f.ExitAtStart:
		s.logf("exiting before going LIVE with code %d (injected fault)", f.ExitAtStartCode)
		s.stop(&ExitError{Code: f.ExitAtStartCode})
	case f.NeverLive:
		s.mu.Lock()
		s.phase = phaseInitializing
		s.mu.Unlock()
		s.logf("staying INITIALIZING (injected fault)")
	default:
		s.goLive()
	}
}

// goLive is the end of initialization: the listeners start listening, the
// workers start, the state turns LIVE and the server gauges are refreshed
// (Envoy's startWorkers callback).
func (s *Sim) goLive() {
	s.mu.Lock()
	if s.closing || s.phase == phaseLive {
		s.mu.Unlock()
		return
	}
	s.phase = phaseLive
	active := 0
	for _, l := range s.listeners {
		l.initWorkerStats()
		if l.stopped {
			continue
		}
		ln, err := l.sock.listen()
		if err != nil {
			s.lm.createFailure.inc()
			l.stopped = true
			s.logf("listener %s: %v", l.cfg.Name, err)
			continue
		}
		l.ln = ln
		active++
		s.goLocked(func() { l.serve(ln) })
	}
	s.lm.listenersActive.set(uint64(active))
	s.lm.workersStarted.set(1)
	if s.cfg.XDS { // the first CDS and LDS answers are what started the workers
		s.lm.cdsSuccess.inc()
		s.lm.ldsSuccess.inc()
	}
	s.workersStarted = true
	s.mu.Unlock()
	ms := float64(time.Since(s.start).Microseconds()) / 1000
	s.st.histogram("server.initialization_time_ms").record(ms)
	s.refreshServerStats()
	s.logf("starting workers; all listeners listening; state LIVE")
}

// stateLocked is Envoy's server state: the init phase, then LIVE or, after
// /healthcheck/fail, DRAINING. Draining listeners do not change it.
func (s *Sim) stateLocked() int {
	switch {
	case s.phase == phasePreInit:
		return statePreInitializing
	case s.phase == phaseInitializing:
		return stateInitializing
	case s.hcFailed:
		return stateDraining
	}
	return stateLive
}

func (s *Sim) stateName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return stateNames[s.stateLocked()]
}

// refreshServerStats is Envoy's updateServerStats, run on a stats flush
// and when the workers start.
func (s *Sim) refreshServerStats() {
	s.mu.Lock()
	state := s.stateLocked()
	s.mu.Unlock()
	s.server.state.set(uint64(state))
	s.server.uptime.set(uint64(time.Since(s.start) / time.Second))
	s.server.totalConns.set(uint64(max(s.totalConns.Load(), 0)))
}

// statsRead is called before stats are read: with no flush interval, a
// read after the workers started sees current server gauges.
func (s *Sim) statsRead() {
	if s.cfg.StatsFlushInterval > 0 {
		return
	}
	s.mu.Lock()
	started := s.workersStarted
	s.mu.Unlock()
	if started {
		s.refreshServerStats()
	}
}

func (s *Sim) flushLoop() {
	t := time.NewTicker(s.cfg.StatsFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.refreshServerStats()
		case <-s.ctx.Done():
			return
		}
	}
}

// AdminAddr is the admin API's bound address, "127.0.0.1:40123".
func (s *Sim) AdminAddr() string { return s.adminAddr }

// ListenerAddr is a listener's bound address (port 0 resolved), or "" for
// an unknown name. It is bound from Start on; it accepts once LIVE.
func (s *Sim) ListenerAddr(name string) string {
	if l, ok := s.byName[name]; ok {
		return l.addr.String()
	}
	return ""
}

// ListenerStatName is the name a listener has in listener.<name>. stats:
// its stat_prefix, or its bound address with ':' as '_' ("127.0.0.1_40123",
// "[__1]_40123").
func (s *Sim) ListenerStatName(name string) string {
	if l, ok := s.byName[name]; ok {
		return l.scope
	}
	return ""
}

// State is the server state's name: PRE_INITIALIZING, INITIALIZING, LIVE
// or DRAINING.
func (s *Sim) State() string { return s.stateName() }

// Stat returns a counter's or gauge's current value, whether or not it
// ever changed; false if the sim has no such stat (the stats matcher may
// have rejected it).
func (s *Sim) Stat(name string) (uint64, bool) {
	s.statsRead()
	return s.st.lookup(name)
}

// WaitLive waits until the server is LIVE (listeners accepting), the sim
// stops, or ctx ends.
func (s *Sim) WaitLive(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		live := s.phase == phaseLive
		s.mu.Unlock()
		if live {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return errors.New("envoysim: stopped before going live")
		case <-t.C:
		}
	}
}

// SetFault replaces the fault in force (a test hook). The admin fault
// applies to the next request; a hang in progress stays hung. CrashAfter
// counts from now; zero disarms an earlier crash. CrashAfterDrain waits
// for the next drain request. ExitAtStart and NeverLive act when the
// startup delay ends; clearing NeverLive after it makes the sim go LIVE.
func (s *Sim) SetFault(f Fault) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("envoysim: %w", err)
	}
	s.mu.Lock()
	s.fault = f
	s.armCrashLocked()
	resume := s.startupOver && !f.NeverLive && s.phase != phaseLive
	s.mu.Unlock()
	if resume {
		s.goLive()
	}
	return nil
}

func (s *Sim) currentFault() Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// armCrashLocked arms the fault's crash timer, invalidating older ones.
func (s *Sim) armCrashLocked() {
	s.faultGen++
	s.drainCrashArm = s.fault.CrashAfterDrain > 0
	if s.fault.CrashAfter > 0 {
		s.crashInLocked(s.fault.CrashAfter)
	}
}

// crashInLocked crashes the sim after d unless the fault changes first.
func (s *Sim) crashInLocked(d time.Duration) {
	gen := s.faultGen
	s.afterLocked(d, func() {
		s.mu.Lock()
		current := gen == s.faultGen
		s.mu.Unlock()
		if current {
			s.Crash()
		}
	})
}

// drainRequestedLocked arms CrashAfterDrain on the first drain request.
func (s *Sim) drainRequestedLocked() {
	if s.drainCrashArm {
		s.drainCrashArm = false
		s.crashInLocked(s.fault.CrashAfterDrain)
	}
}

// CrashExitCode is what a crash does to the envoysim program: 0 for death
// by SIGABRT, else the exit code.
func (s *Sim) CrashExitCode() int { return s.currentFault().CrashExitCode }

// Crash stops the sim abruptly, as a crashing Envoy. With a zero
// CrashExitCode and an OnCrash hook (the program), the hook kills the
// process; otherwise every socket, admin ones included, is closed, as the
// kernel closes a dead process's sockets, and Err returns ErrCrashed.
func (s *Sim) Crash() {
	s.logf("caught Aborted: crashing (injected fault)")
	if s.cfg.OnCrash != nil && s.CrashExitCode() == 0 {
		s.cfg.OnCrash()
	}
	s.stop(ErrCrashed)
}

// Quit stops the sim as SIGTERM or /quitquitquit stop Envoy: at once,
// without draining. Every connection is closed normally (the peer sees a
// FIN, or a RST if data it sent was left unread).
func (s *Sim) Quit() { s.stop(nil) }

// Done is closed once the sim has stopped (quit, crash, exit at start or Close).
func (s *Sim) Done() <-chan struct{} { return s.done }

// Err is why the sim stopped: nil for a quit or Close, ErrCrashed for a
// crash, an *ExitError for the exit-at-start fault. It is nil while the
// sim runs.
func (s *Sim) Err() error {
	select {
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.reason
	default:
		return nil
	}
}

// Close stops the sim, if it still runs, and waits for every goroutine it
// started. It is safe to call more than once; it returns the errors met
// while closing sockets, joined.
func (s *Sim) Close() error {
	s.stop(nil)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeErr
}

// stop closes everything at once; the first call decides the reason.
// Connections are closed as Envoy's are when it exits, and as the kernel
// closes a crashed process's: a FIN, or a RST where data is left unread.
func (s *Sim) stop(reason error) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	s.reason = reason
	var errs []error
	for _, l := range s.listeners {
		l.sock.close()
		if l.ln != nil {
			if err := l.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("listener %s: %w", l.cfg.Name, err))
			}
		}
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	s.cancel()
	if err := s.adminLn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, fmt.Errorf("admin listener: %w", err))
	}
	for _, c := range conns {
		c.Close()
	}
	if s.adminSrv != nil {
		s.adminSrv.Close()
	}
	for _, l := range s.listeners {
		l.shutdown()
	}
	s.mu.Lock()
	s.closeErr = errors.Join(errs...)
	s.mu.Unlock()
	if reason == nil {
		s.logf("shutting down server instance; exiting")
	}
	close(s.done)
}

// formatDuration writes a google.protobuf.Duration as JSON: "600s", "1.500s".
func formatDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) + "s"
}
