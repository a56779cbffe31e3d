// Package envoysim is a TEST PART: a stand-in for Envoy, for draind's tests,
// since no Envoy binary can be installed where they run. The image ships
// real Envoy; nothing in draind's product code imports this package.
//
// It proxies real traffic on real sockets and serves Envoy's admin API with
// Envoy's formats, status codes and drain semantics (the facts in
// docs/envoysim.md, "Envoy's behaviour, from its source"), so that the client in package envoy and the drain logic
// in draind can be tested end to end. It does not import package envoy: the
// two sides are written separately, so that a misreading of Envoy in one is
// not copied into the other. Package conformance holds the scenarios that
// pin its behaviour, runnable against a real Envoy too.
//
// # Use
//
// In a test, [Start] a [Sim] from a [Config] and [Sim.Close] it. As a
// process (for draind run, which supervises a child), build
// ./internal/testenv/envoysim/cmd/envoysim, or have a test binary call [Main]:
// it takes a JSON config (-c) and Envoy's flags; see docs/envoysim.md.
//
// # Lifecycle
//
// The admin API listens from the start. The listeners' sockets are bound
// at start (so port 0 is resolved at once, see [Sim.ListenerAddr]) but only
// listen when the server goes LIVE, after [Config.StartupDelay]: the state
// is PRE_INITIALIZING, then INITIALIZING, then LIVE, when the workers start
// (listener_manager.workers_started 1). Connections before that are refused.
// SIGTERM, SIGINT and POST /quitquitquit stop it at once ([Sim.Quit]):
// connections are closed normally (a FIN; a RST where data is left unread).
// A crash kills the program with SIGABRT. SIGHUP is ignored.
//
// # Proxying
//
// A "tcp" listener pipes bytes to its upstream (half-closes passed on), as
// tcp_proxy. An "http" listener is the HTTP connection manager with codec
// AUTO: HTTP/1.1 with keep-alive, or HTTP/2 cleartext with prior knowledge
// (told by the connection preface), each request forwarded to the upstream
// (HTTP/1.1 or h2c) as the router does. The upstream is fixed, or the
// connection's original destination (SO_ORIGINAL_DST after REDIRECT, the
// local address under TPROXY with a transparent listener). Connections go
// to the [Config.Concurrency] workers round-robin.
//
// # Draining
//
// POST /drain_listeners: without graceful the listeners (inbound only with
// inboundonly) stop at once, closing their listen sockets; open connections
// stay. With graceful, the next HTTP/1.1 response on a draining listener
// carries Connection: close (the connection closes when the client closes
// it, or after the listener's drain_timeout and the 1 s delayed close); the
// next HTTP/2 response is preceded by a GOAWAY with last-stream-id 2^31-1,
// and the final GOAWAY follows after the listener's drain_timeout (5 s);
// idle connections get nothing. That is Envoy through 1.39
// ([Drain139]) and 1.40 ([Drain140]); [DrainConnectionEvent] is the drain
// of Envoy main after 1.40.0, which also drains connections on their own
// in the last third of the drain time ([Config.DrainGeneration]). The
// listeners keep accepting for the drain time, then stop; with skip_exit
// they never stop. The sim never exits on its own, and neither /ready nor
// server.state changes. POST /healthcheck/fail turns /ready and server_info
// to DRAINING and server.live to 0.
//
// # Stats
//
// /stats serves text ("name: value", counters and gauges in name order,
// then histograms), JSON or HTML, honours usedonly (stats that never
// changed are hidden) and filter (RE2, partial match), and answers 400 to a
// bad regex, format or type. Names are Envoy's:
// listener.<ip>_<port>.downstream_cx_active ([::] as [__]), a stat_prefix
// in place of the address, listener.<name>.worker_N.*, listener.admin.*,
// http.admin.*, http.<prefix>.*, server.state, server.live,
// listener_manager.workers_started. A stats matcher ([Config.StatsMatcher],
// e.g. Istio's) makes the stats it rejects not exist. server.state is an
// unset gauge until the workers start or a stats flush.
//
// # Faults
//
// [Fault] makes the admin API hang, answer 500s, garbage or slowly, exits
// before LIVE, stays INITIALIZING, or crashes after a delay or after the
// first drain request. Set it in the Config (or program flags) or at run
// time with [Sim.SetFault] or POST /envoysim/fault (a test-only endpoint
// taking the config's fault object as JSON, or query parameters).
//
// # Goroutines
//
// Every goroutine the sim starts is stopped and waited for by Close, which
// is safe to call twice.
package envoysim
