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
