package conformance

import (
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// Stat names of the scenarios' listeners, named by stat_prefix so that a
// port-0 listener's name does not depend on the target.
const (
	inActive  = "listener.in.downstream_cx_active"
	outActive = "listener.out.downstream_cx_active"
)

var (
	// inboundHTTP is an inbound HTTP listener to the HTTP upstream, with a
	// short drain_timeout.
	inboundHTTP = Listener{Name: "in", Direction: "inbound", Protocol: "http", StatPrefix: "in",
		Upstream: UpstreamHTTP, DrainTimeout: 500 * time.Millisecond}
	outboundTCP = Listener{Name: "out", Direction: "outbound", Protocol: "tcp", StatPrefix: "out", Upstream: UpstreamEcho}
	inboundTCP  = Listener{Name: "in", Direction: "inbound", Protocol: "tcp", StatPrefix: "in", Upstream: UpstreamEcho}
	stuckTCP    = Listener{Name: "stuck", Protocol: "tcp", StatPrefix: "stuck", Upstream: UpstreamStuck}
)

// Scenarios returns every conformance scenario. Each pins one behaviour of
// Envoy (docs/envoysim.md cites Envoy's admin, drain and codec sources) that
// draind relies on or that its tests exercise through envoysim.
func Scenarios() []Scenario {
	const long = 60 * time.Second
	return []Scenario{
		{
			Name:  "admin answers",
			Setup: Setup{DrainTime: long},
			Steps: []Step{
				{Op: OpAdmin, Path: "/ready", Code: 200, Body: "LIVE\n"},
				{Op: OpAdmin, Path: "/ready?x=1", Code: 200, Body: "LIVE\n"},
				{Op: OpAdmin, Path: "/quitquitquit", Code: 405, Body: "Method GET not allowed, POST required."},
				{Op: OpAdmin, Path: "/drain_listeners?inboundonly&graceful", Code: 405, Body: "Method GET not allowed, POST required."},
				{Op: OpAdmin, Method: "PUT", Path: "/healthcheck/fail", Code: 405, Body: "Method PUT not allowed, POST required."},
				{Op: OpAdmin, Method: "POST", Path: "/ready", Code: 200, Body: "LIVE\n"},
				{Op: OpAdmin, Path: "/nope", Code: 404, BodyPrefix: "invalid path. "},
				{Op: OpAdmin, Path: "/stats/", Code: 404, BodyPrefix: "invalid path. "},
				{Op: OpAdmin, Path: "/stats?format=xml", Code: 400, BodyPrefix: "usage: /stats?format="},
				{Op: OpAdmin, Path: "/stats?type=gauges", Code: 400, BodyPrefix: "invalid &type= param"},
				{Op: OpAdmin, Path: "/stats?filter=(", Code: 400, BodyPrefix: "Invalid re2 regex"},
				{Op: OpAdmin, Path: "/stats?format=html", Code: 200, BodyPrefix: "<!DOCTYPE html>"},
				{Op: OpAdmin, Path: "/stats?filter=%5Elistener_manager%5C.workers_started%24", Code: 200, Body: "listener_manager.workers_started: 1\n"},
				{Op: OpAdmin, Method: "POST", Path: "/healthcheck/fail", Code: 200, Body: "OK\n"},
				{Op: OpAdmin, Path: "/ready", Code: 503, Body: "DRAINING\n"},
				{Op: OpStat, Stat: "server.live", Want: "present", Value: U64(0)},
				{Op: OpAdmin, Method: "POST", Path: "/healthcheck/ok", Code: 200, Body: "OK\n"},
				{Op: OpStat, Stat: "server.live", Want: "present", Value: U64(1)},
			},
		},
		{
			Name:  "usedonly hides gauges that never changed",
			Setup: Setup{DrainTime: long, Listeners: []Listener{inboundTCP, outboundTCP}},
			Steps: []Step{
				{Op: OpStat, Stat: inActive, Want: "present", Value: U64(0)},
				{Op: OpStat, Stat: inActive, UsedOnly: true, Want: "absent"},
				{Op: OpStat, Stat: "listener.admin.downstream_cx_active", UsedOnly: true, Want: "present"},
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "tcp"},
				{Op: OpStat, Stat: inActive, UsedOnly: true, Want: "present", Value: U64(1)},
				{Op: OpStat, Stat: outActive, UsedOnly: true, Want: "absent"},
			},
		},
		{
			Name:  "Istio's stats_matcher keeps no downstream_cx_active gauge",
			Setup: Setup{DrainTime: long, StatsMatcher: "istio", Listeners: []Listener{inboundTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "tcp"},
				{Op: OpStat, Stat: inActive, Want: "absent"},
				{Op: OpStat, Stat: inActive, UsedOnly: true, Want: "absent"},
				{Op: OpStat, Stat: "listener.admin.downstream_cx_active", Want: "absent"},
				{Op: OpAdmin, Path: "/stats?usedonly&filter=downstream_cx_active%24", Code: 200, Body: ""},
				{Op: OpStat, Stat: "server.state", Want: "present", Value: U64(0)},
				{Op: OpStat, Stat: "listener_manager.workers_started", Want: "present", Value: U64(1)},
			},
		},
		{
			Name:  "Istio's stats_matcher with EXIT_ON_ZERO_ACTIVE_CONNECTIONS keeps them",
			Setup: Setup{DrainTime: long, StatsMatcher: "istio_exit_on_zero", Listeners: []Listener{inboundTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "tcp"},
				{Op: OpStat, Stat: inActive, UsedOnly: true, Want: "present", Value: U64(1)},
				{Op: OpStat, Stat: "listener.admin.downstream_cx_active", Want: "present"},
				{Op: OpStat, Stat: "listener.in.downstream_cx_total", Want: "absent"},
			},
		},
		{
			Name:  "a drain without graceful stops listeners at once",
			Setup: Setup{DrainTime: long, Listeners: []Listener{inboundTCP, outboundTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "tcp"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly", Code: 200, Body: "OK\n"},
				{Op: OpDial, Listener: "in", Want: "refused", Within: 5 * time.Second},
				{Op: OpDial, Listener: "out", Want: "accepted"},
				{Op: OpClosed, Conn: "a", Want: "open", Within: 300 * time.Millisecond},
				{Op: OpStat, Stat: inActive, Want: "present", Value: U64(1)},
				{Op: OpAdmin, Path: "/ready", Code: 200, Body: "LIVE\n"},
			},
		},
		{
			Name:  "a graceful drain with --drain-time-s 0 stops listeners at once",
			Setup: Setup{DrainTime: 0, DrainStrategy: "immediate", Listeners: []Listener{inboundTCP, outboundTCP}},
			Steps: []Step{
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&graceful", Code: 200, Body: "OK\n"},
				{Op: OpDial, Listener: "in", Want: "refused", Within: 5 * time.Second},
				{Op: OpDial, Listener: "out", Want: "accepted"},
			},
		},
		{
			Name:  "HTTP/1.1 drain: Connection: close with the next response; idle keep-alives stay",
			Setup: Setup{DrainTime: long, DrainStrategy: "immediate", Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "http1"},
				{Op: OpOpen, Conn: "idle", Listener: "in", Proto: "http1"},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "keep-alive"},
				{Op: OpRequest, Conn: "idle", Path: "/fast", Want: "keep-alive"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&graceful", Code: 200, Body: "OK\n"},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "close"},
				// Envoy waits for the client to close, until drain_timeout
				// (0.5 s here) and the delayed close (1 s) have passed.
				{Op: OpClosed, Conn: "a", Want: "open", Within: 300 * time.Millisecond},
				{Op: OpClosed, Conn: "a", Want: "fin", Within: 3 * time.Second},
				{Op: OpQuiet, Conn: "idle", Within: 300 * time.Millisecond},
				{Op: OpStat, Stat: inActive, Want: "present", Value: U64(1)},
				{Op: OpDial, Listener: "in", Want: "accepted"},
				{Op: OpRequest, Conn: "idle", Path: "/fast", Want: "close"},
				{Op: OpClosed, Conn: "idle", Want: "fin"},
			},
		},
		{
			Name:  "HTTP/2 drain: GOAWAY only with the next response, the final one after drain_timeout; idle connections get nothing",
			Setup: Setup{DrainTime: long, DrainStrategy: "immediate", Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "h2c"},
				{Op: OpOpen, Conn: "idle", Listener: "in", Proto: "h2c"},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "no-goaway"},
				{Op: OpRequest, Conn: "idle", Path: "/fast", Want: "no-goaway"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&graceful", Code: 200, Body: "OK\n"},
				{Op: OpQuiet, Conn: "a", Within: 300 * time.Millisecond},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "goaway"},
				{Op: OpGoAway, Conn: "a", Within: 5 * time.Second},
				{Op: OpClosed, Conn: "a", Want: "fin", Within: 10 * time.Second},
				{Op: OpQuiet, Conn: "idle", Within: 300 * time.Millisecond},
				{Op: OpStat, Stat: inActive, Want: "present", Value: U64(1)},
				{Op: OpStat, Stat: "http.in.downstream_cx_http2_active", Want: "present", Value: U64(1)},
			},
		},
		{
			Name:  "/quitquitquit closes connections with a FIN, a RST where data was left unread",
			Setup: Setup{DrainTime: long, Listeners: []Listener{inboundTCP, inboundHTTPNamed("web"), stuckTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "tcp", Listener: "in", Proto: "tcp"},
				{Op: OpOpen, Conn: "h1", Listener: "web", Proto: "http1"},
				{Op: OpRequest, Conn: "h1", Path: "/fast", Want: "keep-alive"},
				{Op: OpOpen, Conn: "h2", Listener: "web", Proto: "h2c"},
				{Op: OpRequest, Conn: "h2", Path: "/fast", Want: "no-goaway"},
				{Op: OpOpen, Conn: "unread", Listener: "stuck", Proto: "tcp", Want: "no-echo"},
				{Op: OpFill, Conn: "unread"},
				{Op: OpAdmin, Method: "POST", Path: "/quitquitquit", Code: 200, Body: "OK\n"},
				{Op: OpExit},
				{Op: OpClosed, Conn: "tcp", Want: "fin"},
				{Op: OpClosed, Conn: "h1", Want: "fin"},
				{Op: OpClosed, Conn: "h2", Want: "fin"},
				{Op: OpClosed, Conn: "unread", Want: "rst"},
			},
		},
		{
			Name:  "stats_matcher reject_all: no stat at all, /ready still answers",
			Setup: Setup{DrainTime: long, StatsMatcher: "reject_all", Listeners: []Listener{inboundTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "tcp"},
				{Op: OpStat, Stat: "server.state", Want: "absent"},
				{Op: OpStat, Stat: "listener_manager.workers_started", Want: "absent"},
				{Op: OpStat, Stat: inActive, Want: "absent"},
				{Op: OpAdmin, Path: "/stats?filter=%5Eserver%5C.", Code: 200, Body: ""},
				{Op: OpAdmin, Path: "/ready", Code: 200, Body: "LIVE\n"},
			},
		},
		{
			Name: "1.39: idle connections are left alone for the whole drain",
			Setup: Setup{DrainTime: 3 * time.Second, DrainStrategy: "immediate", DrainGeneration: envoysim.Drain139,
				Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "h1", Listener: "in", Proto: "http1"},
				{Op: OpRequest, Conn: "h1", Path: "/fast", Want: "keep-alive"},
				{Op: OpOpen, Conn: "h2", Listener: "in", Proto: "h2c"},
				{Op: OpRequest, Conn: "h2", Path: "/fast", Want: "no-goaway"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&graceful", Code: 200, Body: "OK\n"},
				{Op: OpQuiet, Conn: "h1", Within: 3500 * time.Millisecond},
				{Op: OpQuiet, Conn: "h2", Within: 300 * time.Millisecond},
			},
		},
		{
			Name: "connection-event: idle connections drain on their own in the last third of the drain time",
			Setup: Setup{DrainTime: 3 * time.Second, DrainStrategy: "immediate", DrainGeneration: envoysim.DrainConnectionEvent,
				Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "h1", Listener: "in", Proto: "http1"},
				{Op: OpRequest, Conn: "h1", Path: "/fast", Want: "keep-alive"},
				{Op: OpOpen, Conn: "h2", Listener: "in", Proto: "h2c"},
				{Op: OpRequest, Conn: "h2", Path: "/fast", Want: "no-goaway"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&graceful", Code: 200, Body: "OK\n"},
				// The window is [2 s, 3 s - drain_timeout 0.5 s].
				{Op: OpQuiet, Conn: "h1", Within: 1500 * time.Millisecond},
				{Op: OpQuiet, Conn: "h2", Within: 300 * time.Millisecond},
				{Op: OpGoAway, Conn: "h2", Want: "notice", Within: 1500 * time.Millisecond},
				{Op: OpGoAway, Conn: "h2", Within: time.Second},
				{Op: OpClosed, Conn: "h2", Want: "fin", Within: 2 * time.Second},
				{Op: OpClosed, Conn: "h1", Want: "fin", Within: 3 * time.Second},
			},
		},
		{
			Name:  "1.39: skip_exit requires graceful",
			Setup: Setup{DrainTime: long, DrainGeneration: envoysim.Drain139, Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&skip_exit", Code: 400, Body: "skip_exit requires graceful\n"},
			},
		},
		{
			Name: "connection-event: a drain without graceful drains connections too, and skip_exit needs no graceful",
			Setup: Setup{DrainTime: long, DrainStrategy: "immediate", DrainGeneration: envoysim.DrainConnectionEvent,
				Listeners: []Listener{inboundHTTP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "a", Listener: "in", Proto: "http1"},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "keep-alive"},
				{Op: OpAdmin, Method: "POST", Path: "/drain_listeners?inboundonly&skip_exit", Code: 200, Body: "OK\n"},
				{Op: OpRequest, Conn: "a", Path: "/fast", Want: "close"},
				{Op: OpDial, Listener: "in", Want: "accepted"},
			},
		},
		{
			Name:  "SIGTERM closes connections with a FIN",
			Setup: Setup{DrainTime: long, Listeners: []Listener{inboundTCP, stuckTCP}},
			Steps: []Step{
				{Op: OpOpen, Conn: "tcp", Listener: "in", Proto: "tcp"},
				{Op: OpOpen, Conn: "unread", Listener: "stuck", Proto: "tcp", Want: "no-echo"},
				{Op: OpFill, Conn: "unread"},
				{Op: OpSignal},
				{Op: OpClosed, Conn: "tcp", Want: "fin"},
				{Op: OpClosed, Conn: "unread", Want: "rst"},
			},
		},
	}
}

func inboundHTTPNamed(name string) Listener {
	l := inboundHTTP
	l.Name, l.StatPrefix = name, name
	return l
}
