package envoy

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// ServerState is the value of Envoy's server.state gauge.
type ServerState uint64

// Envoy's server states (envoy.admin.v3.ServerInfo.State), in its order.
const (
	StateLive ServerState = iota
	StateDraining
	StatePreInitializing
	StateInitializing
)

// stateNames are the states' names, by value.
var stateNames = [...]string{"LIVE", "DRAINING", "PRE_INITIALIZING", "INITIALIZING"}

func (s ServerState) String() string {
	if s < ServerState(len(stateNames)) {
		return stateNames[s]
	}
	return "ServerState(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// Liveness is what [Client.Live] read.
type Liveness struct {
	// State is server.state. Envoy refreshes it on a stats flush (5 s by
	// default) and when its workers start; before that it is an unset
	// gauge reading 0, LIVE, which is why WorkersStarted is needed too.
	State ServerState
	// WorkersStarted is listener_manager.workers_started == 1: the
	// listeners run on the workers and accept connections.
	WorkersStarted bool
}

// Live tells whether Envoy serves: state LIVE and workers started.
func (l Liveness) Live() bool { return l.State == StateLive && l.WorkersStarted }

// liveFilter asks for the two gauges Live reads, and nothing else.
const liveFilter = `^(server\.state|listener_manager\.workers_started)$`

// Live reads server.state and listener_manager.workers_started with one
// GET /stats (without usedonly, so that the unset gauges of a starting
// Envoy are there). Either gauge missing, as under a stats_matcher that
// rejects it, is [ErrStatAbsent]: liveness cannot be told.
func (c *Client) Live(ctx context.Context) (Liveness, error) {
	stats, err := c.stats(ctx, liveFilter, false)
	if err != nil {
		return Liveness{}, err
	}
	var l Liveness
	var haveState, haveWorkers bool
	for _, s := range stats {
		switch s.name {
		case "server.state":
			l.State, haveState = ServerState(s.value), true
		case "listener_manager.workers_started":
			l.WorkersStarted, haveWorkers = s.value == 1, true
		}
	}
	var missing []string
	if !haveState {
		missing = append(missing, "server.state")
	}
	if !haveWorkers {
		missing = append(missing, "listener_manager.workers_started")
	}
	if len(missing) > 0 {
		return Liveness{}, fmt.Errorf("envoy admin: GET /stats: %s: %w", strings.Join(missing, ", "), ErrStatAbsent)
	}
	return l, nil
}

// Ready asks GET /ready, Envoy's own readiness, which reads no stat
// (source/server/admin/server_info_handler.cc): 200 "LIVE" once the
// server is initialized, 503 with the state's name otherwise
// (PRE_INITIALIZING, INITIALIZING, DRAINING after /healthcheck/fail). It
// is what readiness falls back to when a stats_matcher rejects the two
// stats [Client.Live] reads. Unlike Live it cannot tell whether the
// workers have started: Envoy turns LIVE when its init manager is done and
// starts the workers right after, on the same thread, so the gap is one
// event-loop turn.
func (c *Client) Ready(ctx context.Context) (ServerState, error) {
	_, body, err := c.do(ctx, request{method: "GET", path: "/ready", repeatable: true, accept: []int{200, 503}})
	if err != nil {
		return 0, err
	}
	name := strings.TrimSpace(string(body))
	for i, n := range stateNames {
		if n == name {
			return ServerState(i), nil
		}
	}
	return 0, malformed("GET /ready: answer %q is not a server state", truncate(body, 64))
}

// DrainOptions are /drain_listeners' flags.
type DrainOptions struct {
	// InboundOnly drains only listeners with traffic_direction INBOUND.
	InboundOnly bool
	// Graceful starts a drain period (--drain-time-s): HTTP/1.1 responses
	// carry Connection: close, HTTP/2 connections get a GOAWAY with their
	// next response, listeners keep accepting and stop at the end. Without
	// it, listeners stop at once.
	Graceful bool
	// SkipExit (with Graceful) never stops the listeners.
	SkipExit bool
}

func (o DrainOptions) encode() string {
	var parts []string
	if o.InboundOnly {
		parts = append(parts, "inboundonly")
	}
	if o.Graceful {
		parts = append(parts, "graceful")
	}
	if o.SkipExit {
		parts = append(parts, "skip_exit")
	}
	return strings.Join(parts, "&")
}

// DrainListeners POSTs /drain_listeners with bare flags, as pilot-agent
// does (?inboundonly&graceful). Envoy never exits because of it; repeating
// it is harmless, so a reset or cut answer is retried.
func (c *Client) DrainListeners(ctx context.Context, o DrainOptions) error {
	_, body, err := c.do(ctx, request{method: "POST", path: "/drain_listeners", query: o.encode(), repeatable: true})
	if err != nil {
		return err
	}
	// Envoy answers "OK\n": anything else did not come from a drain.
	if !bytes.HasPrefix(body, []byte("OK")) {
		return malformed("POST /drain_listeners: answer %q is not Envoy's OK", truncate(body, 64))
	}
	return nil
}

// QuitQuitQuit POSTs /quitquitquit: Envoy answers 200 and exits at once,
// closing open connections. A reset or cut answer is not retried (the
// request may have been acted on); only a failed dial is. It goes on a new
// connection (idle keep-alive connections are closed first), so that a
// stale one cannot fail it.
func (c *Client) QuitQuitQuit(ctx context.Context) error {
	c.hc.CloseIdleConnections()
	_, _, err := c.do(ctx, request{method: "POST", path: "/quitquitquit"})
	return err
}
