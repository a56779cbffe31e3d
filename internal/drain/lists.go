package drain

// The values of the machine's enumerations, each listed once: what flags
// accept and errors name (AppExits, ExitWithApps), and the label values
// of the metrics that export them.

// AppExits are the --app-exit policies.
var AppExits = []AppExit{AppExitWait, AppExitFlows}

// ExitWithApps are the --exit-with-app policies.
var ExitWithApps = []ExitWithApp{ExitWithAppOff, ExitWithAppSuccess, ExitWithAppAny}

// DrainListenersStates are the states of the drain_listeners call.
var DrainListenersStates = []DrainListenersState{DrainListenersNotSent, DrainListenersRetrying, DrainListenersDone, DrainListenersGaveUp}

// GaugesStates are the states of the gauge check.
var GaugesStates = []GaugesState{GaugesUnknown, GaugesPresent, GaugesAbsent}

// PodShape is the kind of pod a drain is for, as the logs name it: at
// start what the configuration tells (Config.StartShape), at the drain
// what its trigger tells too (the "draining" phase line).
type PodShape uint8

// Pod shapes.
const (
	// ShapeSidecar is a sidecar at start: classic, or native when its
	// preStop hook drains it (told at the drain).
	ShapeSidecar PodShape = iota
	ShapeGateway
	ShapeJob
	ShapePrestop
	ShapeNativeSidecar
	ShapePOSTSidecar
	ShapeClassicSidecar
)

var podShapeNames = [...]string{
	ShapeSidecar:        "sidecar (classic, or native when the preStop hook drains it: told at the drain)",
	ShapeGateway:        "gateway (no app: every listener drains)",
	ShapeJob:            "run to completion (a Job: the proxy ends with the app's work)",
	ShapePrestop:        "preStop hook (draind prestop)",
	ShapeNativeSidecar:  "native sidecar (drained from its preStop hook while the app shuts down; its SIGTERM comes once the app is gone)",
	ShapePOSTSidecar:    "sidecar (drain asked over POST /drain)",
	ShapeClassicSidecar: "classic sidecar (SIGTERM with the app)",
}

// String is the shape's token, as Name: log fields hold a token.
func (s PodShape) String() string { return s.Name() }

// Describe says in a sentence what the shape means, for the start-up line.
func (s PodShape) Describe() string {
	if int(s) >= len(podShapeNames) {
		return "unknown"
	}
	return podShapeNames[s]
}

// Name is the shape's short, stable name (the node's view, Events).
func (s PodShape) Name() string {
	if int(s) >= len(podShapeShort) {
		return "unknown"
	}
	return podShapeShort[s]
}

var podShapeShort = [...]string{
	ShapeSidecar: "sidecar", ShapeGateway: "gateway", ShapeJob: "job", ShapePrestop: "prestop",
	ShapeNativeSidecar: "native-sidecar", ShapePOSTSidecar: "post-drain-sidecar", ShapeClassicSidecar: "classic-sidecar",
}

// StartShape is the shape the configuration tells before any drain.
func (c *Config) StartShape() PodShape {
	switch {
	case c.Prestop:
		return ShapePrestop
	case c.Gateway:
		return ShapeGateway
	case c.ExitWithApp.WatchesApp():
		return ShapeJob
	}
	return ShapeSidecar
}
