// Package drain is draind's drain: one state machine that takes a pod's
// proxy from start-up through the drain to its stop, and decides, from the
// kernel's view of the pod and Envoy's own, when the proxy may go.
//
// # The machine
//
//	Starting --(Envoy LIVE, workers started)--> Ready
//	Ready --(a trigger: SIGTERM, POST /drain, the preStop hook, app done)--> Draining
//	Draining: POST /drain_listeners (retried until it succeeds), then
//	          --min-drain for endpoint propagation (interruptible)
//	Gating:   the gate (gate.go) opens when the app is done AND Envoy is
//	          drained, held for --settle; woken by flow and process changes
//	          and by computed moments, never by a fixed tick
//	Stopping: POST /quitquitquit, then SIGTERM, then SIGKILL
//	Exited
//
// A deadline counted from the trigger bounds the whole of it, the stop
// steps included ([Config.GateDeadline]). The proxy exiting on its own ends
// the machine at once, in any phase.
//
// [Machine.Run] owns the loop: one select over every input, one function
// that changes phase ([Machine.enter]). The inputs come through small
// interfaces — [Flows] (the kernel's view of sockets), [Apps] (the app's
// processes), [Admin] (Envoy's admin API) and [Proxy] (the supervised
// process) — so the whole machine runs in unit tests with fakes. `draind
// prestop` is the same machine with no admin and no proxy: it drains at
// once and ends when the app's flows are done ([Config.Prestop]).
//
// # Goroutines
//
// Run starts its helpers and stops each before it returns: the start-up
// watcher (asks Admin.Live until Envoy is LIVE, only while Starting), the
// drain_listeners retrier (only while draining), and the admin calls the
// loop needs answered (the work at LIVE, the gate's ask of Envoy's count),
// run beside it so that a hung admin API holds no trigger, quit or exit;
// only the stop's quit runs on the loop. Trigger and Quit may be called
// from any goroutine; they never block.
//
// # Files
//
// machine.go is the machine itself: its type, New, Run and the phase
// changes; parts.go its inputs' interfaces. Each rule keeps its pure
// function and its share of the loop's state and methods in one file:
// evaluate.go (the gate's evaluation; the gate itself in gate.go),
// rotation.go (the min-drain, --min-drain auto), untold.go, native_sidecar.go
// (a native sidecar's SIGTERM), late_stop.go, completion.go
// (--exit-with-app), envoy.go (the admin API's calls), stop.go (the
// deadline and the stop), state.go (the published State).
//
// # Logging
//
// The machine logs its phase changes (with their cause), what holds the
// gate when that changes (not when counts move), admin failures once per
// kind, and at the deadline every flow that still held the gate. Each of
// those lines carries its event (package logevent): tests and scripts
// match the event and the fields, never the message's wording.
package drain
