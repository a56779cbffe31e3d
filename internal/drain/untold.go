package drain

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

// Untold keep-alives: the connections Envoy's drain never reaches.
//
// Envoy's drain tells a client to go only with a response: `Connection:
// close` on HTTP/1.1, GOAWAY on HTTP/2. A pooled connection idle since
// before the drain got no response since, so its client still holds it
// as good (Envoy closes an idle HTTP/1.1 keep-alive only at its
// idle_timeout, 1 h by default; an idle HTTP/2 connection gets no GOAWAY).
// Once out of rotation the app is told to stop (its preStop hook, the
// out-of-rotation wait, returns and the kubelet sends SIGTERM); the
// client's next request on that connection then reaches an app that no
// longer accepts, and Envoy answers 503 (measured: docs/design.md,
// "Untold keep-alives"). So when the out-of-rotation wait ends, before the app hears of it, draind closes
// (FIN) Envoy's downstream connections idle since before the drain
// began: their clients open new ones, which the Service now sends
// elsewhere. A server closing an idle keep-alive is ordinary HTTP (Go's
// http.Server.Shutdown and nginx's quit do it at once).

// UntoldMargin widens "since before the drain began": the kernel keeps
// a flow's last send in jiffies (up to 10 ms apart), so a response sent
// just before drain_listeners took effect can read as just after. A
// connection counted untold by the margin was told a moment before:
// closing it early loses nothing.
const UntoldMargin = 20 * time.Millisecond

// Untold reports whether one of Envoy's downstream flows has been idle,
// in the request/response sense (flows.Idle: a request awaiting its
// response is never idle), since before toldFrom: the moment Envoy
// began telling clients to go (drain_listeners succeeded; the zero time
// when it never did, or when Envoy's gradual drain strategy tells only
// some, which leaves every parked flow untold). idle is the
// flow's idle time when measured (-1: born after that snapshot, so
// neither idle nor untold). A flow idle less than ParkedAfter is never
// untold: a response and the next request can be that close.
//
// What it cannot tell apart: a streamed response that paused since
// before toldFrom (server-sent events, an HTTP/2 stream with nothing to
// say) looks the same; it is cut too (docs/design.md, "Untold
// keep-alives").
func Untold(idle time.Duration, measured, toldFrom time.Time) bool {
	if idle < ParkedAfter {
		return false
	}
	if toldFrom.IsZero() {
		return true
	}
	return measured.Add(-idle).Before(toldFrom.Add(UntoldMargin))
}

// UntoldRule names, for the log, the rule the untold connections were
// picked by: the toldFrom CloseUntold handed Untold (zero: every parked
// flow) and whether drain_listeners had succeeded (dlDone), which tells a
// gradual drain's zero from a drain never sent. A stream paused
// ParkedAfter is cut by the last two.
func UntoldRule(dlDone bool, toldFrom time.Time) string {
	switch {
	case !toldFrom.IsZero():
		return "idle since before drain_listeners succeeded"
	case dlDone:
		return "every parked flow: Envoy's gradual drain tells no client for sure"
	}
	return "every parked flow: drain_listeners never succeeded"
}

// UntoldClosed is what closing the untold connections did.
type UntoldClosed struct {
	// ToldFrom is the toldFrom Untold was given (zero: every parked
	// flow was picked), for UntoldRule.
	ToldFrom time.Time
	// Found counts the flows Untold picked; Closed of them were shut
	// (a FIN sent to their client).
	Found, Closed int
	// Picked describes each flow picked ("client ADDR idle 1.2s"), for
	// the log: which clients were told to go.
	Picked []string
	// Err says why the others were not (nil when none failed).
	Err error
}

// UntoldCloser closes Envoy's untold downstream connections (package
// agent: the flows' view and the proxy's process group). Nil when the
// pod has no proxy (prestop) or --close-idle-keepalives is off.
type UntoldCloser interface {
	// CloseUntold re-reads the flows and shuts every downstream
	// connection Untold picks with toldFrom. It returns within a few
	// milliseconds: it runs on the machine's goroutine, before the
	// out-of-rotation wait's callers hear that it ended.
	CloseUntold(toldFrom time.Time) UntoldClosed
}

// untoldState is the loop's state for the untold keep-alives.
type untoldState struct {
	// closer closes them (Parts.Untold; nil: not done).
	closer UntoldCloser
	// result is what closing them did, once done (Untold): atomic, for
	// the status server.
	result atomic.Pointer[UntoldClosed]
}

// Untold is what closing the untold keep-alives did (false before it ran,
// or when it does not: UntoldCloser).
func (m *Machine) Untold() (UntoldClosed, bool) {
	if r := m.untold.result.Load(); r != nil {
		return *r, true
	}
	return UntoldClosed{}, false
}

// closeUntold closes Envoy's untold keep-alives (Untold), once, as the
// min-drain ends.
func (m *Machine) closeUntold() {
	if m.untold.closer == nil {
		return
	}
	var toldFrom time.Time
	if ns := m.envoy.dlAt.Load(); ns != 0 {
		toldFrom = time.Unix(0, ns)
	}
	start := time.Now()
	r := m.untold.closer.CloseUntold(toldFrom)
	m.untold.result.Store(&r)
	if r.Found == 0 && r.Err == nil {
		return
	}
	took := time.Since(start)
	fields := []zap.Field{logevent.UntoldClosed.Field(), zap.Int("found", r.Found), zap.Int("closed", r.Closed), zap.Strings("picked", r.Picked),
		zap.Bool("drain_listeners_done", !toldFrom.IsZero()), zap.String("rule", UntoldRule(!toldFrom.IsZero(), r.ToldFrom)),
		zap.Float64("took_ms", float64(took.Microseconds())/1e3)}
	if r.Err != nil {
		m.log.Warn("some untold keep-alives could not be closed",
			append(fields, zap.Error(r.Err))...)
		return
	}
	m.log.Info("closed the untold keep-alives", fields...)
}
