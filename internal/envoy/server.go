package envoy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ServerState is the value of Envoy's server.state gauge (and the names
// /ready and /server_info use).
type ServerState uint64

// Envoy's server states (envoy.admin.v3.ServerInfo.State).
const (
	StateLive            ServerState = 0
	StateDraining        ServerState = 1
	StatePreInitializing ServerState = 2
	StateInitializing    ServerState = 3
)

var stateNames = [...]string{
	StateLive:            "LIVE",
	StateDraining:        "DRAINING",
	StatePreInitializing: "PRE_INITIALIZING",
	StateInitializing:    "INITIALIZING",
}

func (s ServerState) String() string {
	if s < ServerState(len(stateNames)) {
		return stateNames[s]
	}
	return "ServerState(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// ParseServerState is the inverse of String for Envoy's four names.
func ParseServerState(name string) (ServerState, error) {
	for i, n := range stateNames {
		if n == name {
			return ServerState(i), nil
		}
	}
	return 0, fmt.Errorf("unknown envoy server state %q", name)
}

// ServerState returns the server.state gauge. Envoy refreshes it on a stats
// flush (every 5 s by default), so it lags; [Client.Ready] does not.
func (c *Client) ServerState(ctx context.Context) (ServerState, error) {
	v, err := c.Stat(ctx, "server.state")
	return ServerState(v), err
}

// WorkersStarted tells whether listener_manager.workers_started is 1: the
// listeners run on the workers and accept connections.
func (c *Client) WorkersStarted(ctx context.Context) (bool, error) {
	v, err := c.Stat(ctx, "listener_manager.workers_started")
	return v == 1, err
}

// Ready asks GET /ready. Envoy answers 200 "LIVE\n" when live and 503 with
// the state's name otherwise (PRE_INITIALIZING, INITIALIZING, DRAINING after
// /healthcheck/fail); a 503 is an answer here, not an error.
func (c *Client) Ready(ctx context.Context) (state string, ready bool, err error) {
	code, body, err := c.do(ctx, request{method: "GET", path: "/ready", repeatable: true,
		accept: []int{http.StatusOK, http.StatusServiceUnavailable}})
	if err != nil {
		return "", false, err
	}
	state = strings.TrimSpace(string(body))
	if state == "" || strings.ContainsAny(state, " \n\t") || len(state) > 64 {
		return "", false, fmt.Errorf("envoy admin: GET /ready: %w: %q", ErrMalformed, truncate(body, 80))
	}
	return state, code == http.StatusOK, nil
}

// ServerInfo is what draind reads from GET /server_info.
type ServerInfo struct {
	Version            string
	State              string        // LIVE, DRAINING, PRE_INITIALIZING, INITIALIZING
	Uptime             time.Duration // uptime_current_epoch
	Concurrency        int           // worker threads
	DrainTime          time.Duration // --drain-time-s
	DrainStrategy      string        // "Gradual" or "Immediate", as Envoy spells them
	ParentShutdownTime time.Duration // --parent-shutdown-time-s
}

// ServerInfo asks GET /server_info.
func (c *Client) ServerInfo(ctx context.Context) (ServerInfo, error) {
	_, body, err := c.do(ctx, request{method: "GET", path: "/server_info", repeatable: true})
	if err != nil {
		return ServerInfo{}, err
	}
	si, err := ParseServerInfo(body)
	if err != nil {
		return ServerInfo{}, fmt.Errorf("envoy admin: GET /server_info: %w", err)
	}
	return si, nil
}

// ParseServerInfo parses a /server_info body.
func ParseServerInfo(b []byte) (ServerInfo, error) {
	var raw struct {
		Version string `json:"version"`
		State   string `json:"state"`
		Uptime  string `json:"uptime_current_epoch"`
		Options *struct {
			Concurrency        json.Number `json:"concurrency"`
			DrainTime          string      `json:"drain_time"`
			DrainStrategy      string      `json:"drain_strategy"`
			ParentShutdownTime string      `json:"parent_shutdown_time"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return ServerInfo{}, fmt.Errorf("%w: server_info: %v", ErrMalformed, err)
	}
	if raw.State == "" || raw.Options == nil {
		return ServerInfo{}, fmt.Errorf("%w: server_info: no state or command_line_options", ErrMalformed)
	}
	si := ServerInfo{Version: raw.Version, State: raw.State, DrainStrategy: raw.Options.DrainStrategy}
	var err error
	if si.Uptime, err = protoDuration(raw.Uptime); err != nil {
		return ServerInfo{}, err
	}
	if si.DrainTime, err = protoDuration(raw.Options.DrainTime); err != nil {
		return ServerInfo{}, err
	}
	if si.ParentShutdownTime, err = protoDuration(raw.Options.ParentShutdownTime); err != nil {
		return ServerInfo{}, err
	}
	if raw.Options.Concurrency != "" {
		n, err := strconv.Atoi(raw.Options.Concurrency.String())
		if err != nil {
			return ServerInfo{}, fmt.Errorf("%w: server_info: concurrency %q", ErrMalformed, raw.Options.Concurrency)
		}
		si.Concurrency = n
	}
	return si, nil
}

// protoDuration parses a google.protobuf.Duration in JSON ("600s", "1.500s").
func protoDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if !strings.HasSuffix(s, "s") {
		return 0, fmt.Errorf("%w: duration %q", ErrMalformed, s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: duration %q", ErrMalformed, s)
	}
	return d, nil
}

// DrainOptions are /drain_listeners' flags.
type DrainOptions struct {
	// InboundOnly drains only listeners with traffic_direction INBOUND.
	InboundOnly bool
	// Graceful starts a drain period (--drain-time-s): HTTP/1.1 responses
	// carry Connection: close, HTTP/2 gets GOAWAY, listeners keep accepting
	// and stop at the end. Without it, listeners stop at once.
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
// it is harmless.
func (c *Client) DrainListeners(ctx context.Context, o DrainOptions) error {
	_, _, err := c.do(ctx, request{method: "POST", path: "/drain_listeners", query: o.encode(), repeatable: true})
	return err
}

// HealthcheckFail POSTs /healthcheck/fail: /ready turns 503 DRAINING.
func (c *Client) HealthcheckFail(ctx context.Context) error {
	_, _, err := c.do(ctx, request{method: "POST", path: "/healthcheck/fail", repeatable: true})
	return err
}

// HealthcheckOK POSTs /healthcheck/ok, undoing HealthcheckFail.
func (c *Client) HealthcheckOK(ctx context.Context) error {
	_, _, err := c.do(ctx, request{method: "POST", path: "/healthcheck/ok", repeatable: true})
	return err
}

// QuitQuitQuit POSTs /quitquitquit: Envoy answers 200 and exits at once,
// resetting open connections. A reset or cut answer is not retried (the
// request may have been acted on); only a failed dial is. It goes on a new
// connection (idle keep-alive connections are closed first), so that a
// stale one cannot fail it.
func (c *Client) QuitQuitQuit(ctx context.Context) error {
	c.hc.CloseIdleConnections()
	_, _, err := c.do(ctx, request{method: "POST", path: "/quitquitquit"})
	return err
}
