package drain

import "time"

// The late stop: a native sidecar's gate deadline reached while its app
// still runs.
//
// The gate deadline keeps the worst case of the stop steps inside the
// deadline: the quit, --stop-timeout for the proxy to exit, SIGTERM,
// --stop-timeout again, SIGKILL (StopReserve). Stopping the proxy then,
// with the app still running, cuts whatever the app still sends through
// it. A classic sidecar has no choice: the kubelet signalled the app and
// the proxy together and kills both at the end of the grace period. A
// native sidecar does: the kubelet sends its SIGTERM only once every app
// container has exited, and kills it no sooner than 2 s after that
// (kuberuntime's minimumGracePeriodInSeconds), so a proxy kept until the
// app's exit costs nothing but draind's own margin. `make bench-rollout`'s
// 40 pods deleted at once, draind above pilot-agent injected as a native
// sidecar: 17 of 800 outbound calls failed after draind stopped the proxy
// at 19.5 s with the app still calling out; pilot-agent alone, which stops
// at the kubelet's SIGTERM, lost none.
//
// So a native sidecar still awaiting its SIGTERM at the gate deadline
// (PastGateDeadline) holds on to LateGateDeadline, the deadline less the
// quit call and the kernel's part after SIGKILL (LateStopReserve): the
// stop that follows skips SIGTERM after a quit that worked (Envoy takes
// both alike) and waits for the proxy's exit up to the deadline's
// SIGKILL. The deadline itself stands: draind still exits inside it.

// PastGateDeadline reports whether the gate deadline, reached with in,
// moves to the late one: a native sidecar whose SIGTERM has not come,
// which the kubelet sends only after every app container has exited (nor
// has the app been seen gone: AwaitSignal), with a proxy to keep.
func PastGateDeadline(in GateInput) bool {
	return in.AwaitSignal && !in.NoProxy
}

// LateStopReserve is the stop steps' worst case after the late gate
// deadline: the quit call and the kernel's part after SIGKILL. The wait
// for the proxy's exit after the quit (after a failed one, SIGTERM) runs
// to the deadline less KillWait, what the quit left of the reserve
// included.
func (c Config) LateStopReserve() time.Duration {
	if c.Prestop {
		return 0
	}
	return c.quitTimeout() + KillWait
}

// LateGateDeadline is when, after the trigger, a gate held past its
// deadline (PastGateDeadline) stops waiting.
func (c Config) LateGateDeadline() time.Duration { return c.Deadline - c.LateStopReserve() }
