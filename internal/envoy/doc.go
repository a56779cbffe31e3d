// Package envoy is draind's client for the Envoy admin API: the few
// endpoints draind needs to start, watch, drain and stop a sidecar Envoy.
//
// # Calls
//
// A [Client] talks plain HTTP/1.1 to the admin address (127.0.0.1:15000 in a
// sidecar). Every call takes a context and has its own timeout
// ([WithTimeout], 1 s by default) that covers the whole call, retries
// included, so a call never outlives it. Bodies are read up to a limit
// ([WithMaxBody], 4 MiB) and always closed. Status codes are checked:
// anything but the expected code is a [*StatusError].
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
//   - [ErrStatAbsent]: the stat asked for is not in the answer. Absent is
//     neither zero nor unreachable: with usedonly, Envoy hides stats that
//     never changed.
//   - [ErrMalformed]: the answer could not be parsed (garbage, truncated
//     JSON, an empty stats answer where one line at least must exist).
//
// When the caller's own context ends first, the error wraps the context's
// error instead of [ErrUnreachable].
//
// # Stats formats
//
// [ParseStatsText] reads Envoy's text format: quoted text readouts first,
// then counters and gauges as "name: value" in name order, then histograms
// ("P0(nan,1) P25(...)" or "No recorded values"). Readouts and histograms
// are recognised and skipped; any other line that is not "name: uint64" is
// an error. [ParseStatsJSON] reads {"stats":[{"name":..,"value":N},...]},
// skipping string values (readouts) and the histograms element. Both are
// exported for fuzzing and fixtures; neither panics on any input.
//
// # Active downstream connections
//
// [Client.ActiveDownstream] asks /stats?usedonly&filter=[ActiveFilter] and
// [SumActive] adds up listener.<name>.downstream_cx_active, leaving out the
// admin listener, per-worker duplicates (listener.<name>.worker_N...),
// Envoy-internal listeners, and the caller's excluded ports (status,
// metrics), matched by port whatever the address form: 0.0.0.0_15021,
// 127.0.0.1_15090, [__]_15021 and [__1]_15090 are all port-matched. A
// listener named by a stat_prefix has no port and is kept unless excluded
// by name.
//
// With usedonly, a listener that never took a connection has no gauge at
// all, so an answer with no listener gauge is a total of 0, not an error.
// The answer is never empty when Envoy is healthy, though: the admin
// listener's own gauge counts the connection that asks, so an empty body is
// [ErrMalformed].
//
// The package logs nothing.
package envoy
