package agent

import (
	"net/http"
	"sync"

	"github.com/draind/draind/internal/drain"
)

// earlyControls holds what the status server and the signals ask for
// before the drain machine exists. The status server starts before the
// eBPF objects load (their verification is most of draind's start-up), so
// that readiness waits on Envoy, not on draind; a drain asked for meanwhile
// waits here and reaches the machine, in order, once it is built. The
// machine cannot finish a drain before its flow and process views are open:
// those are what it waits on.
type earlyControls struct {
	mu       sync.Mutex
	m        *drain.Machine // nil until attach
	metrics  http.Handler
	queued   []drain.Cause // drain.CauseNone: a quit
	draining bool          // a drain or quit was asked for
}

// machine is the machine once attached (nil before), with its metrics.
func (e *earlyControls) machine() (*drain.Machine, http.Handler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m, e.metrics
}

// asked reports whether a drain or a quit was asked for.
func (e *earlyControls) asked() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.draining
}

// trigger is Machine.Trigger, or queued until attach.
func (e *earlyControls) trigger(c drain.Cause) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.draining = true
	if e.m == nil {
		e.queued = append(e.queued, c)
		return
	}
	send(e.m, c)
}

func send(m *drain.Machine, c drain.Cause) {
	if c == drain.CauseNone {
		m.Quit()
		return
	}
	m.Trigger(c)
}

// quit is Machine.Quit, or queued until attach.
func (e *earlyControls) quit() {
	e.trigger(drain.CauseNone)
}

// attach hands over the machine (built, not yet running: Trigger and Quit
// queue in it) and what was asked for until now. Everything the status
// server reads of the agent is set before attach.
func (e *earlyControls) attach(m *drain.Machine, metrics http.Handler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m, e.metrics = m, metrics
	for _, c := range e.queued {
		send(m, c)
	}
	e.queued = nil
}
