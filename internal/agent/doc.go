// Package agent wires draind's parts into its two long-running commands:
// [Run] is `draind run` (supervise the proxy, serve readiness, drain it on
// termination, stop it inside the grace period) and [Prestop] is `draind
// prestop` (a preStop hook that waits until the app's flows are done). The
// decisions are not made here: the drain machine (internal/drain) decides
// when the proxy may go; this package builds what it observes and acts on.
//
// # Parts
//
// Run builds, in this order, and closes in reverse on every return path:
//
//   - the status server (status.go): the kubelet's probes, /metrics, and,
//     to loopback callers only, POST /drain, POST /quitquitquit and the
//     /debug views (docs/threat-model.md);
//   - the supervised proxy (internal/proxy), Envoy or Istio's pilot-agent
//     (internal/istio reads Istio's settings: drain durations, the status
//     port; config.go's resolveIstio applies them);
//   - the flow tracker (internal/flows) and the app's process source
//     (internal/appprocs), their eBPF objects loaded and verified at start
//     but attached only at the drain trigger (liveViews);
//   - the drain machine (internal/drain), which sees those parts through
//     adapters (views_linux.go: flowView, appView, adminView);
//   - the metrics (metrics.go), every value read at scrape time from the
//     part that owns it.
//
// A drain asked for before the machine exists (a SIGTERM during start-up, a
// POST /drain while the eBPF objects verify) waits in earlyControls and
// reaches the machine once it is built. Privileges are raised for the load,
// limited for the proxy, and dropped once the kernel objects are open
// (privs_linux.go).
//
// # Goroutines
//
// Run's own goroutine runs the drain machine's loop and returns when the
// machine does. Every other goroutine Run starts ends before it returns:
// the status server and the signal forwarder (stopped by Run's defer:
// Shutdown, cancel, wait); the two eBPF loaders (Run waits for both before
// going on); the tracker's and the process source's Run loops (started by
// liveViews at the trigger, or at start for --exit-with-app; cancelled and
// waited for by Run's defer, then closed). Prestop runs its tracker on a
// goroutine it waits for before returning. docs/design.md, "Goroutines, and
// who stops each", has the table for the whole of draind.
//
// # Errors
//
// Errors from Run and Prestop are start-up failures, wrapped with %w; a
// *ConfigError names the flag or setting the operator must fix. How a run
// ended is a [Result] (the exit code and its reason), not an error.
package agent
