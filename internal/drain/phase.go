package drain

// Phase is where the machine is.
type Phase int32

// Phases, in order.
const (
	Starting Phase = iota
	Ready
	Draining
	Gating
	Stopping
	Exited
)

// Phases lists every phase (for metrics).
var Phases = []Phase{Starting, Ready, Draining, Gating, Stopping, Exited}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return "unknown"
	}
	return phaseNames[p]
}

var phaseNames = [...]string{"starting", "ready", "draining", "gating", "stopping", "exited"}

// Cause is what started the drain: one input of the machine, logged and
// exported with the drain.
type Cause int32

// Causes. CauseNone means no drain has started.
const (
	CauseNone Cause = iota
	// CauseSignal is SIGTERM or SIGINT (the kubelet's termination).
	CauseSignal
	// CausePOST is POST /drain from a caller in the pod.
	CausePOST
	// CausePreStop is `draind drain`, the native sidecar's preStop hook.
	CausePreStop
	// CauseAppDone means the app's last process exited (--exit-with-app).
	CauseAppDone
)

// Causes lists every cause a drain can have (for metrics).
var Causes = []Cause{CauseSignal, CausePOST, CausePreStop, CauseAppDone}

func (c Cause) String() string {
	if c < 0 || int(c) >= len(causeNames) {
		return "unknown"
	}
	return causeNames[c]
}

var causeNames = [...]string{"none", "signal", "post-drain", "prestop-hook", "app-done"}
