// Package envoy is draind's client for the Envoy admin API: the few calls
// draind makes to drain, watch and stop a sidecar Envoy.
//
// # Calls
//
//   - [Client.DrainListeners]: POST /drain_listeners (?inboundonly&graceful).
//   - [Client.ActiveDownstream]: the sum of the traffic listeners'
//     downstream_cx_active gauges, with how many gauges were summed.
//   - [Client.DownstreamGauges]: whether Envoy exposes those gauges at all.
//   - [Client.Live]: server.state LIVE and listener_manager.workers_started 1.
//   - [Client.Ready]: GET /ready, Envoy's own state, which reads no stat.
//   - [Client.Listeners]: the listeners' names, bound ports, stat_prefix and
//     traffic_direction (GET /listeners?format=json and
//     /config_dump?resource=static_listeners|dynamic_listeners), to map
//     names to ports ([ExcludeSet.Resolve]) and check the drain's reach.
//   - [Client.QuitQuitQuit]: POST /quitquitquit.
//
// A [Client] talks plain HTTP/1.1 to the admin address (127.0.0.1:15000 in a
// sidecar). Every call takes a context and has its own timeout
// ([WithTimeout], 1 s by default) that covers the whole call, retries
// included, so a call never outlives it, whether the admin API hangs,
// answers slowly, answers 500s or garbage. Bodies are read up to a limit
// ([WithMaxBody], 4 MiB) and always closed. Status codes are checked:
// anything but 200 is a [*StatusError].
//
// # Retries
//
// Transient failures are retried with exponential backoff and jitter
// ([WithRetries], 2 extra attempts by default), never past the call's
// deadline: a refused or failed dial, a 5xx answer, and, for requests that
// are safe to repeat, a connection reset or cut before the answer. A 4xx is
// never retried, nor is a timeout (the time is spent), nor a
// /quitquitquit whose request may already have reached Envoy.
//
// # Errors
//
// Errors are lowercase and wrapped with %w, so callers branch with
// errors.Is and errors.As:
//
//   - [ErrUnreachable]: Envoy did not answer: dial failed, connection reset,
//     or no answer within the timeout (the error also wraps the cause, e.g.
//     context.DeadlineExceeded or syscall.ECONNREFUSED). See [*UnreachableError].
//   - [*StatusError]: Envoy answered with an unexpected status code; the
//     body is kept, truncated.
//   - [ErrStatAbsent]: a stat [Client.Live] needs is not in the answer (a
//     stats_matcher rejects it).
//   - [ErrMalformed]: the answer could not be parsed (garbage, HTML, JSON,
//     a truncated line).
//
// When the caller's own context ends first, the error wraps the context's
// error instead of [ErrUnreachable].
//
// # Active downstream connections
//
// ActiveDownstream asks /stats?usedonly&filter=^listener\..*downstream_cx_active$
// and adds up listener.<name>.downstream_cx_active, leaving out the admin
// listener, per-worker duplicates (listener.<name>.worker_N...),
// Envoy-internal listeners, and the excluded ports given to [New] with
// [WithExclude] (default [DefaultExclude]: 15020, 15021, 15090), matched by
// port whatever the address form: 0.0.0.0_15021, 127.0.0.1_15090,
// [__]_15021 and [__1]_15090 are all port-matched. A listener named by a
// stat_prefix has no port and is kept unless excluded by name
// ([ExcludeSet.Resolve] turns a listener's name into its stat scope and
// bound port; [Client.SetExclude] installs the result).
//
// Zero gauges is not zero connections. With usedonly, a listener that
// never took a connection has no gauge; and Istio's default bootstrap
// stats_matcher keeps no downstream_cx_active gauge at all unless
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS is set, so the answer is empty (not even
// the admin listener's own gauge). [ActiveConns.Gauges] says how many
// gauges were summed and DownstreamGauges (no usedonly) whether any exists.
//
// # Stats format
//
// The text format is parsed: quoted text readouts first, then counters and
// gauges as "name: value" in name order, then histograms. Readouts and
// histograms are recognised and skipped; any other line that is not
// "name: uint64" is [ErrMalformed]. The parser never panics on any input
// (it is fuzzed).
//
// The package logs nothing.
package envoy
