package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/proxy"
	"github.com/draind/draind/internal/tcpstate"
)

// The drain machine reads the pod through small interfaces (package drain);
// these adapters put draind's real parts behind them.

// flowView is drain.Flows over a flows.Tracker: what of the namespace's
// sockets the gate reads.
type flowView struct {
	tr *flows.Tracker
	// nonTraffic are local ports whose connections are not Envoy's
	// downstream traffic: --exclude-ports, draind's status port, the admin.
	nonTraffic map[uint16]bool
	// excluded are the ports of the listeners --exclude-listeners names,
	// learned from Envoy once LIVE (read by the machine and /metrics).
	excluded atomic.Pointer[map[uint16]bool]
	// appPorts, when not nil, limits the app's listeners that count to
	// these ports (prestop --wait-listeners --app-ports); with portFlows,
	// its flows too (a hostNetwork pod, where the node's sockets are not
	// the app's).
	appPorts  map[uint16]bool
	portFlows bool
	idle      time.Duration
	changed   <-chan struct{}
	unsub     func()
}

func newFlowView(tr *flows.Tracker, nonTraffic, appPorts map[uint16]bool, idle time.Duration) *flowView {
	ch, unsub := tr.Subscribe()
	return &flowView{tr: tr, nonTraffic: nonTraffic, appPorts: appPorts, idle: idle, changed: ch, unsub: unsub}
}

func (v *flowView) Changed() <-chan struct{} { return v.changed }
func (v *flowView) Refresh() error           { return v.tr.Resync() }
func (v *flowView) Close()                   { v.unsub() }

// downstream reports whether f is one of Envoy's downstream flows: the
// proxy's accepted side of a connection on a traffic listener.
func (v *flowView) downstream(f *flows.Flow) bool {
	if f.Owner != flows.OwnerProxy || f.Direction != flows.DirInbound || v.nonTraffic[f.Local.Port()] {
		return false
	}
	if ex := v.excluded.Load(); ex != nil && (*ex)[f.Local.Port()] {
		return false
	}
	return true
}

// setExcluded adds the ports of listeners excluded by name.
func (v *flowView) setExcluded(ports []uint16) {
	m := portSet(ports)
	v.excluded.Store(&m)
}

// Observe reads the flows the gate decides on, walking the table in place.
func (v *flowView) Observe() drain.FlowView {
	snapAt := v.tr.LastSnapshot() // before Each: Each holds the tracker's lock
	out := drain.FlowView{Measured: snapAt}
	parkedMS := drain.ParkedAfter.Milliseconds()
	v.tr.Each(func(f *flows.TrackedFlow) bool {
		switch {
		case f.State == tcpstate.Listen:
			if f.Owner == flows.OwnerApp && (v.appPorts == nil || v.appPorts[f.Local.Port()]) {
				out.AppListeners++
			}
			return true
		case !flows.HoldsDrain(f.State):
			return true
		}
		down := v.downstream(&f.Flow)
		app := v.appFlow(&f.Flow)
		switch {
		case down:
			out.Downstream++
			if f.IdleExpired {
				out.DownstreamIdle++
			}
			// IdleMS is -1 for a flow born after the snapshot: not parked,
			// and due for the next one.
			if f.IdleExpired || f.IdleMS >= parkedMS {
				out.DownstreamParked++
			} else if at := idleExpiry(f.Flow, snapAt, drain.ParkedAfter); out.ParkedWake.IsZero() || at.Before(out.ParkedWake) {
				out.ParkedWake = at
			}
		case app && f.Holds:
			out.AppHolding++
		}
		if v.idle > 0 && f.Holds && (down || app) {
			if at := idleExpiry(f.Flow, snapAt, v.idle); out.IdleWake.IsZero() || at.Before(out.IdleWake) {
				out.IdleWake = at
			}
		}
		return true
	})
	return out
}

// appFlow reports whether f is one of the app's own flows: not control
// traffic, and on --app-ports where only those are the app's.
func (v *flowView) appFlow(f *flows.Flow) bool {
	return f.Owner == flows.OwnerApp && !f.Control && (!v.portFlows || v.appPorts[f.Local.Port()])
}

// idleExpiry is the earliest moment a holding flow can pass the idle
// timeout, judged from the snapshot that measured its idle time (a flow
// without one was born after it, so it cannot expire before snapAt +
// timeout). At that moment a fresh snapshot tells.
func idleExpiry(f flows.Flow, snapAt time.Time, timeout time.Duration) time.Time {
	idle := time.Duration(max(f.IdleMS, 0)) * time.Millisecond
	return snapAt.Add(timeout - idle + time.Millisecond)
}

// Holding lists the flows that hold the gate: the app's holding flows and
// Envoy's downstream flows. draind's own connections (to the admin API, to
// its status port) hold nothing and are left out.
func (v *flowView) Holding() []drain.OpenFlow {
	var out []drain.OpenFlow
	v.tr.Each(func(f *flows.TrackedFlow) bool {
		if f.State == tcpstate.Listen || !flows.HoldsDrain(f.State) || !(v.appFlow(&f.Flow) && f.Holds || v.downstream(&f.Flow)) {
			return true
		}
		out = append(out, drain.OpenFlow{
			Owner: f.Owner.String(), Direction: f.Direction.String(), State: f.State.String(),
			Local: f.Local, Remote: f.Remote, IdleMS: f.IdleMS, Age: f.Age,
		})
		return true
	})
	return out
}

// untold lists the inodes of Envoy's downstream connections from outside
// the pod that drain.Untold picks with toldFrom, as of the last snapshot.
// A hop from inside the pod (the app's outbound calls through Envoy,
// loopback) is left alone: Envoy's outbound listeners keep serving it.
func (v *flowView) untold(toldFrom time.Time) (map[uint32]bool, []string) {
	snapAt := v.tr.LastSnapshot()
	out := map[uint32]bool{}
	var picked []string
	v.tr.Each(func(f *flows.TrackedFlow) bool {
		remote := f.Remote.Addr().Unmap()
		if f.State != tcpstate.Established || f.Inode == 0 || !v.downstream(&f.Flow) ||
			!remote.IsValid() || remote.IsLoopback() || remote == f.Local.Addr().Unmap() {
			return true
		}
		if idle := time.Duration(f.IdleMS) * time.Millisecond; drain.Untold(idle, snapAt, toldFrom) {
			out[f.Inode] = true
			picked = append(picked, fmt.Sprintf("client %s idle %s (sent %s ago, received %s ago)", f.Remote, idle, f.LastDataSent, f.LastDataRecv))
		}
		return true
	})
	return out, picked
}

// untoldCloser is drain.UntoldCloser: the flows' view picks the
// connections, the proxy's process group gives them up (a FIN to each
// client; Envoy reads its end closed). Under Envoy's gradual drain a
// response after the drain began told its client nothing for sure
// (envoy.DrainTellsAtOnce): every parked connection is untold then.
type untoldCloser struct {
	fv      *flowView
	proxy   *proxy.Process
	gradual bool
}

func (u untoldCloser) CloseUntold(toldFrom time.Time) drain.UntoldClosed {
	if u.gradual {
		toldFrom = time.Time{}
	}
	// Idle times are only measured by a snapshot: a fresh one.
	if err := u.fv.Refresh(); err != nil {
		return drain.UntoldClosed{ToldFrom: toldFrom, Err: fmt.Errorf("re-read the flows: %w", err)}
	}
	inodes, picked := u.fv.untold(toldFrom)
	n, err := u.proxy.ShutdownSockets(inodes)
	return drain.UntoldClosed{ToldFrom: toldFrom, Found: len(inodes), Closed: n, Picked: picked, Err: err}
}

// appView is drain.Apps over an app process source.
type appView struct{ src appprocs.Source }

func (a appView) Changed() <-chan struct{} { return a.src.Changed() }
func (a appView) Count() (int, drain.ProcView) {
	switch {
	case a.src.Err() != nil:
		return 0, drain.ProcsUnseen
	case !a.src.Coverage().Complete:
		return a.src.Count(), drain.ProcsPartial
	}
	return a.src.Count(), drain.ProcsComplete
}

// MainExit is the last exit of a container's main process among the app's.
func (a appView) MainExit() (drain.MainExit, bool) {
	exits := a.src.Exits()
	for i := len(exits) - 1; i >= 0; i-- {
		e := exits[i]
		if !e.ParentOutside {
			continue
		}
		out := drain.MainExit{Seq: e.Seq, Known: e.Known, Status: "unknown"}
		if e.Known {
			out.Success = e.Status.Exited() && e.Status.ExitCode() == 0
			out.Status = e.Status.String()
		}
		return out, true
	}
	return drain.MainExit{}, false
}

// adminView is drain.Admin over the Envoy admin client (which knows the
// listeners to leave out of the sum). The machine's view and the
// readiness probe's share their adminShared.
type adminView struct {
	c  *envoy.Client
	sh *adminShared
}

// shared returns the view's shared state; a view built without one (a
// zero adminView) gets a fresh one, which learns nothing for long.
func (a adminView) shared() *adminShared {
	if a.sh == nil {
		return &adminShared{log: zap.NewNop()}
	}
	return a.sh
}

// adminShared is what draind learns about Envoy once and keeps.
type adminShared struct {
	log *zap.Logger
	// inboundOnly is true when the drain the machine asks for is inbound
	// only (not --gateway); the LIVE check then looks for inbound
	// listeners.
	inboundOnly bool
	// readyFallback is true when server.state or workers_started is absent
	// (a stats_matcher rejects it): readiness asks GET /ready instead.
	readyFallback atomic.Bool
	// liveSeen is true when Live once said LIVE with the workers started,
	// from the stats. Workers never stop: from then on readiness asks
	// GET /ready, which costs Envoy nothing, where /stats walks every stat
	// it has.
	liveSeen atomic.Bool
	// drainAll is true when no listener has traffic_direction INBOUND, so
	// an inbound-only drain would drain nothing; every listener is drained
	// instead, without ever stopping them (graceful&skip_exit).
	drainAll atomic.Bool
	// flows, once set, learns the ports of listeners excluded by name.
	flows *flowView
	// arrivals, under --min-drain auto, reads its baseline at LIVE.
	arrivals *arrivals
}

// Live reports whether Envoy is live: server.state LIVE and workers
// started, from /stats, until that is so once; then, or when a
// stats_matcher rejects either stat (said once), Envoy's own GET /ready,
// which reads no stat.
func (a adminView) Live(ctx context.Context) (bool, string) {
	sh := a.shared()
	if sh.readyFallback.Load() || sh.liveSeen.Load() {
		return a.ready(ctx)
	}
	l, err := a.c.Live(ctx)
	switch {
	case errors.Is(err, envoy.ErrStatAbsent):
		if sh.readyFallback.CompareAndSwap(false, true) {
			// Why, and what /ready misses: docs/design.md, "Start-up: readiness
			// waits on Envoy, not on draind".
			sh.log.Warn("readiness from Envoy's GET /ready: its stats lack the state", logevent.ReadinessFromReady.Field(),
				zap.Error(err))
		}
		return a.ready(ctx)
	case err != nil:
		return false, "envoy admin: " + err.Error()
	case l.State != envoy.StateLive:
		return false, "envoy state " + l.State.String()
	case !l.WorkersStarted:
		return false, "envoy workers not started"
	}
	sh.liveSeen.Store(true)
	return true, ""
}

func (a adminView) ready(ctx context.Context) (bool, string) {
	st, err := a.c.Ready(ctx)
	switch {
	case err != nil:
		return false, "envoy admin: " + err.Error()
	case st != envoy.StateLive:
		return false, "envoy state " + st.String() + " (GET /ready)"
	}
	return true, ""
}

// AtLive learns Envoy's listeners once it is LIVE (drain.LiveHook): the
// names given to --exclude-listeners become ports for the kernel's view
// and stat scopes for the admin sum; and a sidecar's inbound-only drain is
// checked against the listeners' traffic_direction.
func (a adminView) AtLive(ctx context.Context) {
	sh := a.shared()
	if sh.arrivals != nil {
		sh.arrivals.atLive(ctx)
	}
	ls, err := a.c.Listeners(ctx)
	if err != nil {
		// --exclude-listeners then matches stat names only, and
		// traffic_direction goes unchecked.
		sh.log.Warn("Envoy's listeners unreadable: names match stats only", logevent.ListenersUnread.Field(), zap.Error(err))
		return
	}
	ex := a.c.Exclude()
	if len(ex.Names) > 0 {
		resolved, unmatched := ex.Resolve(ls)
		a.c.SetExclude(resolved)
		if sh.flows != nil {
			sh.flows.setExcluded(resolved.Ports)
		}
		sh.log.Info("listeners excluded from the drain", logevent.ListenersExcluded.Field(), zap.Strings("names", ex.Names), zap.Stringer("resolved", resolved))
		if len(unmatched) > 0 {
			sh.log.Warn("--exclude-listeners: no such listener; kept as stat names", logevent.ListenersUnmatched.Field(), zap.Strings("unmatched", unmatched))
		}
	}
	if !sh.inboundOnly || len(ls) == 0 {
		return
	}
	var names []string
	for _, l := range ls {
		if l.Inbound() {
			return
		}
		names = append(names, fmt.Sprintf("%s (%s)", l.Name, directionName(l.Direction)))
	}
	sh.drainAll.Store(true)
	// inboundonly would drain nothing (no Connection: close, no
	// GOAWAY): every listener is drained, none stopped (skip_exit).
	sh.log.Warn("no INBOUND listener: draining every listener", logevent.NoInboundListener.Field(),
		zap.Strings("listeners", names))
}

func directionName(d string) string {
	if d == "" {
		return "UNSPECIFIED"
	}
	return d
}

// DrainListeners drains Envoy's listeners: inbound only, unless asked for
// all or no listener is inbound (see AtLive); then every listener, never
// stopped.
func (a adminView) DrainListeners(ctx context.Context, inboundOnly bool) error {
	if inboundOnly && a.shared().drainAll.Load() {
		return a.c.DrainListeners(ctx, envoy.DrainOptions{Graceful: true, SkipExit: true})
	}
	return a.c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: inboundOnly, Graceful: true})
}

func (a adminView) ActiveDownstream(ctx context.Context) (int, error) {
	// Under usedonly a listener that never took a connection shows no
	// gauge: zero gauges here is zero connections. Whether Envoy keeps the
	// gauges at all is Gauges' question.
	ac, err := a.c.ActiveDownstream(ctx)
	if err != nil {
		return 0, err
	}
	return int(ac.Total), nil
}

func (a adminView) Gauges(ctx context.Context) (bool, error) { return a.c.DownstreamGauges(ctx) }

func (a adminView) Quit(ctx context.Context) error { return a.c.QuitQuitQuit(ctx) }
