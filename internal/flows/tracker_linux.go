package flows

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/btf"
	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// TrackerConfig configures OpenTracker. The zero value tracks in auto mode
// with the defaults of docs/design.md.
type TrackerConfig struct {
	// Mode is one of TrackerModes ("": ModeAuto).
	Mode   TrackerMode
	Policy Policy
	// PollPeriod is the sock_diag polling period (sockdiag mode).
	PollPeriod time.Duration
	// ReconcilePeriod is how often eBPF mode re-reads a full snapshot to
	// correct any drift (0: 5 minutes; negative: never). It is the only
	// timer eBPF mode arms while nothing happens.
	ReconcilePeriod time.Duration
	// RingSize is the eBPF ring buffer size in bytes (0:
	// probes.DefaultTCPRingSize).
	RingSize int
	// BTFCache shares the kernel's decoded BTF with the other eBPF loads
	// of the process (probes.TCPStateOptions.BTFCache); nil: the load
	// decodes its own.
	BTFCache *btf.Cache
	// Logger receives the mode choice and resync notices (nil: none).
	Logger *zap.Logger
	// Dormant opens the tracker without its live view: the eBPF probe is
	// loaded (verified, its maps made: the mode is decided) but not
	// attached, no snapshot is taken and nothing polls. Listening,
	// Summary and Snapshot then read the kernel when asked (filtered
	// sock_diag dumps), costing nothing in between. Start makes it live:
	// a pod pays for the live view only while it drains
	// (docs/design.md, "Track only while draining").
	Dormant bool
	// PodCgroup, when set, scopes eBPF mode's live view to the pod's own
	// sockets: a program on the pod's cgroup instead of the node-wide
	// tracepoint where it sees them all (probes.TCPStateOptions.PodCgroup;
	// docs/design.md, "Track only while draining"). Start must then run in
	// the pod's network namespace.
	PodCgroup *probes.PodCgroup
}

// DefaultPollPeriod is sockdiag mode's polling period: a LISTEN-and-flows
// dump of a pod's namespace costs well under a millisecond.
const DefaultPollPeriod = 100 * time.Millisecond

// Tracker keeps a FlowTable of one namespace live: from eBPF events with
// sock_diag snapshots at start and after any loss, or from sock_diag polls.
// Subscribers are told whenever the per-class counts change.
type Tracker struct {
	cfg    TrackerConfig
	name   string
	diag   *sockdiag.Conn
	probe  *probes.TCPState
	mode   TrackerMode
	reason string
	log    *zap.Logger

	mu      sync.Mutex
	table   *FlowTable
	since   time.Duration // eBPF: events older than the last snapshot are stale
	snapAt  atomic.Int64  // when the last snapshot (and its tcp_info) was read, unix ns
	subs    map[chan struct{}]struct{}
	watches map[chan Change]struct{}
	// Built once, so that a resync allocates no closure.
	replaceFn func(*sockdiag.Socket)
	emitFn    func(*Change)

	// How long OpenTracker's two steps took (Opened).
	probeLoad, firstSnapshot time.Duration

	// live is true when the table is kept current (events or polls); false
	// while Dormant, until Start. Set under mu, read anywhere.
	live atomic.Bool
	// onDemand classifies the sockets of dumps taken while dormant.
	onDemand *Classifier

	resyncs  atomic.Uint64
	lostSeen atomic.Uint64
	dropped  atomic.Uint64 // changes a slow watcher did not take

	closeOnce sync.Once
	closeErr  error
}

// OpenTracker opens the sources for ns (which must stay open while the
// tracker runs) and takes the first snapshot. Call Run to keep it live.
func OpenTracker(ns *namespace.Net, cfg TrackerConfig) (_ *Tracker, err error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if cfg.PollPeriod <= 0 {
		cfg.PollPeriod = DefaultPollPeriod
	}
	if cfg.ReconcilePeriod == 0 {
		cfg.ReconcilePeriod = 5 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	t := &Tracker{cfg: cfg, name: ns.Name(), log: log, subs: map[chan struct{}]struct{}{}, watches: map[chan Change]struct{}{}}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.diag, err = sockdiag.Dial(ns); err != nil {
		return nil, err
	}
	// Idle times are only needed for the idle timeout: without it, spare
	// the kernel the tcp_info of every socket on every snapshot.
	t.diag.SetInfo(cfg.Policy.IdleTimeout > 0)
	switch cfg.Mode {
	case ModeSockDiag:
		t.mode, t.reason = ModeSockDiag, "asked for (--tracker sockdiag)"
	case ModeEBPF, ModeAuto:
		loadStart := time.Now()
		p, perr := probes.OpenTCPState(ns.Inode(), probes.TCPStateOptions{RingSize: cfg.RingSize, BTFCache: cfg.BTFCache, Detached: cfg.Dormant, PodCgroup: cfg.PodCgroup})
		if perr != nil {
			var pu *probes.UnavailableError
			if cfg.Mode == ModeEBPF || !errors.As(perr, &pu) {
				return nil, fmt.Errorf("ebpf tracker: %w", perr)
			}
			t.mode, t.reason = ModeSockDiag, "eBPF unavailable: "+pu.Reason
		} else {
			t.probeLoad = time.Since(loadStart)
			t.probe = p
			t.mode, t.reason = ModeEBPF, "eBPF probe loaded"
			if !p.UsesCookie() {
				t.reason += " (no socket cookies in tracing programs before 5.12: keyed by 5-tuple)"
			}
		}
	default:
		return nil, errTrackerMode(cfg.Mode)
	}
	t.table = NewFlowTable(cfg.Policy, t.probe == nil || t.probe.UsesCookie())
	t.replaceFn, t.emitFn = t.table.replaceSocket, t.emitLocked
	t.onDemand = NewClassifier(cfg.Policy)
	if cfg.Dormant {
		return t, nil
	}
	if err := t.goLive(); err != nil {
		return nil, err
	}
	return t, nil
}

// Start makes a Dormant tracker live: eBPF mode attaches the probe first,
// then takes the snapshot, so that a change racing with it is in one or
// the other (applying an event twice is harmless: each sets an absolute
// state). A probe that cannot attach leaves the tracker polling, logged.
// Call Run after it. Idempotent; a tracker opened live is live already.
func (t *Tracker) Start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live.Load() {
		return nil
	}
	if t.probe != nil {
		if err := t.probe.Attach(); err != nil {
			t.mode, t.reason = ModeSockDiag, fmt.Sprintf("eBPF probe failed to attach (%v): polling", err)
			t.log.Warn("tracker falls back to sock_diag polling", logevent.TrackerPolls.Field(), zap.Error(err))
			t.probe.Close()
			t.probe = nil
		} else {
			scope, why := t.probe.Scope()
			t.log.Info("tcp tracking", logevent.TCPTracking.Field(), zap.String("scope", string(scope)), zap.String("reason", why))
		}
	}
	return t.goLiveLocked()
}

func (t *Tracker) goLive() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.goLiveLocked()
}

// goLiveLocked takes the first snapshot of the live table. eBPF: the probe
// is attached and buffering before it, so nothing from here on is missed.
func (t *Tracker) goLiveLocked() error {
	snapStart := time.Now()
	if err := t.resyncLocked(); err != nil {
		return err
	}
	t.firstSnapshot = time.Since(snapStart)
	t.live.Store(true)
	return nil
}

// Live reports whether the table is kept current (see Dormant).
func (t *Tracker) Live() bool { return t.live.Load() }

// Listening returns those of ports owner has no listener on: from the live
// table's listener set, or, while dormant, from one LISTEN dump the kernel
// filters to these ports.
func (t *Tracker) Listening(owner Owner, ports []uint16) (missing []uint16, err error) {
	t.mu.Lock() // the table, or the one on-demand classifier
	defer t.mu.Unlock()
	has := func(p uint16) bool { return t.table.Listens(owner, p) }
	if !t.live.Load() {
		found := make(map[uint16]bool, len(ports))
		err = t.diag.EachLocalPort(sockdiag.Mask(tcpstate.Listen), ports, func(s *sockdiag.Socket) {
			if f := t.onDemand.Flow(s); f.Owner == owner {
				found[s.Local.Port()] = true
			}
		})
		if err != nil {
			return nil, err
		}
		has = func(p uint16) bool { return found[p] }
	}
	for _, p := range ports {
		if !has(p) {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// dumpNowLocked attributes one fresh dump of the namespace (a dormant tracker's
// answer to Summary and Snapshot). The classifier and the dump buffer are
// the tracker's: one at a time, under mu.
func (t *Tracker) dumpNowLocked() Snapshot {
	socks, err := t.diag.Sockets(TableMask | sockdiag.Mask(tcpstate.Listen))
	if err != nil {
		t.log.Debug("sock_diag dump on demand", zap.Error(err))
		return Snapshot{Taken: time.Now(), Namespace: t.name}
	}
	snap := t.onDemand.Classify(socks)
	snap.Taken, snap.Namespace = time.Now(), t.name
	return snap
}

// Opened says how long OpenTracker's steps took: loading, verifying and
// attaching the eBPF probe (kernel BTF included unless a shared cache had
// it; 0 in sockdiag mode), and reading the first snapshot. For start-up
// logs.
func (t *Tracker) Opened() (probeLoad, firstSnapshot time.Duration) {
	return t.probeLoad, t.firstSnapshot
}

// Mode returns the mode that runs and why it was chosen. It changes once
// at most, when a probe failure after load makes Run fall back to polling.
func (t *Tracker) Mode() (mode TrackerMode, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mode, t.reason
}

// Resyncs counts full snapshots taken after the first.
func (t *Tracker) Resyncs() uint64 { return t.resyncs.Load() }

// Lost counts events the kernel could not queue (eBPF mode). Every loss
// is followed by a resync.
func (t *Tracker) Lost() uint64 {
	if t.probe == nil {
		return 0
	}
	return t.probe.Lost()
}

// Summary returns the current counts (dormant: of a dump taken now).
func (t *Tracker) Summary() Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.live.Load() {
		return t.dumpNowLocked().Summary
	}
	return t.table.Summary()
}

// Snapshot returns the table as a Snapshot (dormant: a dump taken now).
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.live.Load() {
		return t.dumpNowLocked()
	}
	s := t.table.Snapshot(time.Now())
	s.Namespace = t.name
	return s
}

// Flows returns copies of the tracked sockets for which keep returns true,
// with ages.
func (t *Tracker) Flows(keep func(*Flow) bool) []TrackedFlow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.table.Flows(time.Now(), keep)
}

// Each calls fn for every tracked socket (listeners included), with its
// age, until fn returns false: a walk of the table that copies nothing. It
// runs under the tracker's lock, which holds events back: fn must be quick
// and must not call the Tracker. The TrackedFlow is reused between calls:
// copy what you keep.
func (t *Tracker) Each(fn func(*TrackedFlow) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.table.Each(time.Now(), fn)
}

// Subscribe returns a channel that receives a value (coalesced) whenever
// the counts change, and a function to unsubscribe.
func (t *Tracker) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	return ch, register(&t.mu, t.subs, ch)
}

// Watch returns a channel of every change, buffered by buf; changes a slow
// reader does not take are counted (t.dropped), never block the tracker.
func (t *Tracker) Watch(buf int) (<-chan Change, func()) {
	ch := make(chan Change, buf)
	return ch, register(&t.mu, t.watches, ch)
}

// register adds ch to set under mu, and returns what removes it.
func register[C comparable](mu *sync.Mutex, set map[C]struct{}, ch C) func() {
	mu.Lock()
	set[ch] = struct{}{}
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(set, ch)
		mu.Unlock()
	}
}

// MeasureIdle makes every snapshot from now on read idle times (tcp_info),
// as --idle-timeout does from the start. The drain calls it at its trigger:
// once the app is gone, which of Envoy's connections are parked is known
// only from them; while Ready their cost is spared.
func (t *Tracker) MeasureIdle() { t.diag.SetInfo(true) }

// LastSnapshot is when the table was last read whole from sock_diag: the
// time its flows' idle times (IdleMS) were measured. Flows added by events
// since carry no idle time.
func (t *Tracker) LastSnapshot() time.Time { return time.Unix(0, t.snapAt.Load()) }

// Resync replaces the table with a fresh snapshot now (it also refreshes
// every flow's idle time, which events do not carry). When the dump fails
// (or the kernel interrupted it at every retry), Resync returns the error
// and the table keeps every socket it had, updated with what the dump
// read: no socket leaves on a partial dump.
func (t *Tracker) Resync() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.resyncLocked()
}

// dumpRetries bounds the dumps of one resync the kernel interrupts.
const dumpRetries = 5

// resyncLocked streams a dump into the table: each socket is decoded in
// place and updates its record (sockdiag.Conn.Each, FlowTable.beginReplace):
// no copy of the namespace is made, however large.
func (t *Tracker) resyncLocked() error {
	start := probes.KtimeNow()
	before := t.table.Summary()
	var err error
	for range dumpRetries {
		t.table.beginReplace()
		err = t.diag.Each(TableMask|sockdiag.Mask(tcpstate.Listen), t.replaceFn)
		if !errors.Is(err, sockdiag.ErrDumpInterrupted) {
			break
		}
	}
	var emit func(*Change)
	if len(t.watches) > 0 {
		emit = t.emitFn
	}
	now := time.Now()
	t.table.endReplace(now, err == nil, emit)
	t.notifyLocked(before)
	if err != nil {
		return err
	}
	// Events stamped before the dump began are already in it. Those that
	// race with the dump are re-applied: each sets an absolute state, so
	// applying one twice is harmless.
	t.since = start
	t.snapAt.Store(now.UnixNano())
	return nil
}

// emitLocked hands a change to every watcher that has room.
func (t *Tracker) emitLocked(c *Change) {
	for w := range t.watches {
		select {
		case w <- *c:
		default:
			t.dropped.Add(1)
		}
	}
}

// notifyLocked tells the subscribers when the counts differ from before.
func (t *Tracker) notifyLocked(before Summary) {
	if t.table.Summary() == before {
		return
	}
	for s := range t.subs {
		select {
		case s <- struct{}{}:
		default:
		}
	}
}

// Run keeps the table live until ctx ends or a source fails. In eBPF mode
// a probe failure after load falls back to polling (logged once) rather
// than ending the tracker. A Dormant tracker must be Started first.
func (t *Tracker) Run(ctx context.Context) error {
	if !t.live.Load() {
		return errors.New("tracker: Run before Start")
	}
	if t.probe != nil {
		err := t.runEBPF(ctx)
		if ctx.Err() != nil {
			return nil
		}
		t.mu.Lock()
		t.mode, t.reason = ModeSockDiag, fmt.Sprintf("eBPF probe failed after load (%v): polling", err)
		t.mu.Unlock()
		t.log.Warn("tracker falls back to sock_diag polling", logevent.TrackerPolls.Field(), zap.Error(err))
	}
	return t.runPoll(ctx)
}

func (t *Tracker) runPoll(ctx context.Context) error {
	tick := time.NewTicker(t.cfg.PollPeriod)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			if err := t.Resync(); err != nil {
				return fmt.Errorf("poll %s: %w", t.name, err)
			}
		}
	}
	return nil
}

// lostCheckAfter is how soon after a burst of events the lost counter is
// read: a map read per event would cost a syscall each, and a fixed timer
// would wake an idle draind.
const lostCheckAfter = 50 * time.Millisecond

func (t *Tracker) runEBPF(ctx context.Context) error {
	var reconcile <-chan time.Time
	if t.cfg.ReconcilePeriod > 0 {
		tk := time.NewTicker(t.cfg.ReconcilePeriod)
		defer tk.Stop()
		reconcile = tk.C
	}
	// A second goroutine owns the timers; it ends with this function.
	checkLost := make(chan struct{}, 1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var timer <-chan time.Time
		for {
			select {
			case <-done:
				return
			case <-checkLost:
				if timer == nil {
					timer = time.After(lostCheckAfter)
				}
			case <-timer:
				timer = nil
				if t.probe.Queued() > 0 {
					// The reader is behind: a resync now would stall it.
					// Look again once it has read on.
					timer = time.After(lostCheckAfter)
					continue
				}
				t.resyncIfLost()
			case <-reconcile:
				if err := t.Resync(); err == nil {
					t.resyncs.Add(1)
				}
			}
		}
	}()
	defer func() { close(done); wg.Wait() }()

	n := 0
	return probes.ReadUntil(ctx, t.probe, func(ev *probes.TCPEvent) error {
		t.mu.Lock()
		if ev.Time >= t.since {
			before := t.table.Summary()
			if ch, ok := t.table.Apply(ev, time.Now()); ok {
				t.emitLocked(&ch)
				t.notifyLocked(before)
			}
		}
		t.mu.Unlock()
		// A resync holds the table, and the reader with it: never while
		// events wait in the ring (the kernel would drop more), only once
		// caught up. Past a loss every event is stale anyway until it.
		if n++; n >= 4096 && !ev.More {
			n = 0
			t.resyncIfLost()
		}
		select {
		case checkLost <- struct{}{}:
		default:
		}
		return nil
	})
}

// resyncIfLost takes a snapshot when the kernel dropped events since the
// last check: the table cannot be trusted past a gap.
func (t *Tracker) resyncIfLost() {
	lost := t.probe.Lost()
	if lost == t.lostSeen.Load() {
		return
	}
	t.lostSeen.Store(lost)
	if err := t.Resync(); err != nil {
		t.log.Warn("resync after lost events failed", logevent.ResyncFailed.Field(), zap.Uint64("lost", lost), zap.Error(err))
		return
	}
	t.resyncs.Add(1)
	t.log.Info("resynced after lost events", logevent.Resynced.Field(), zap.Uint64("lost", lost))
}

// Close releases the probe and the netlink socket. Safe twice; call it
// after Run has returned.
func (t *Tracker) Close() error {
	t.closeOnce.Do(func() {
		var errs []error
		if t.probe != nil {
			errs = append(errs, t.probe.Close())
		}
		if t.diag != nil {
			errs = append(errs, t.diag.Close())
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}
