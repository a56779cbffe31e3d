package drain

import "time"

// CompletionInput is everything --exit-with-app decides on. It is plain
// data, so the decision is a pure function, table-tested on its own (as
// GateInput is for the gate).
type CompletionInput struct {
	Mode ExitWithApp
	// The app's processes now, as far as View goes.
	View  ProcView
	Procs int
	// Main is the last exit of a container's main process, when HasMain:
	// seen alive and gone, or seen by its exit event alone.
	Main    MainExit
	HasMain bool
	// Watching is how long draind has been watching the app's processes;
	// StartTimeout is --app-start-timeout (0: no limit).
	Watching     time.Duration
	StartTimeout time.Duration
	// RestartGrace is how long an app gone after a failure, or with an
	// exit code draind could not read, must stay gone.
	RestartGrace time.Duration
}

// AppState says which rule of AppCompletion decided.
type AppState uint8

// The app's states under --exit-with-app.
const (
	// AppUntold: the view cannot prove the app gone (no complete view).
	AppUntold AppState = iota
	// AppRunning: it has processes.
	AppRunning
	// AppSucceeded: gone, its main process exited 0.
	AppSucceeded
	// AppFailed: gone after a failure (non-zero, a signal), under any.
	AppFailed
	// AppFailedKept: gone after a failure under success: kept for the
	// kubelet's restart (restartPolicy OnFailure).
	AppFailedKept
	// AppExitUnknown: gone, its main process's exit status unknown (an
	// exit inferred from a snapshot after lost events, /proc's polling).
	AppExitUnknown
	// AppNeverSeen: no app process now and no main exit since draind began
	// watching. It has not started yet, or it ran and left before draind
	// could watch (an app container started next to draind, shorter than
	// draind's start-up): nothing in the kernel tells the two apart. A
	// process taken for the app for a moment and then for another
	// container's (one exec'd into the proxy's container enters the pod's
	// network namespace before its mount namespace) changes nothing.
	AppNeverSeen
	// AppNotStarted: never seen, and --app-start-timeout is 0: the app is
	// awaited without limit.
	AppNotStarted
)

var appStateNames = [...]string{
	AppUntold: "untold", AppRunning: "running", AppSucceeded: "succeeded", AppFailed: "failed",
	AppFailedKept: "failed-kept", AppExitUnknown: "exit-unknown", AppNeverSeen: "never-seen", AppNotStarted: "not-started",
}

func (s AppState) String() string {
	if int(s) < len(appStateNames) {
		return appStateNames[s]
	}
	return "unknown"
}

// Completion is one verdict of AppCompletion.
type Completion struct {
	// Done: the app's work is over, once it has stayed so for After.
	Done  bool
	After time.Duration
	// Seq is the main exit the verdict rests on (0: none). With State it
	// tells verdicts apart: a new one restarts the wait.
	Seq   uint64
	State AppState
}

// AppCompletion applies --exit-with-app's rules (docs/design.md, "When is
// the app done"): the app's last process gone (a complete view), then its
// main process's last exit decides — 0 ends the proxy at once; a failure
// after the restart grace under any, never under success (the kubelet
// restarts it); an exit whose status draind could not read after the
// restart grace in both modes. An app with no main exit (never seen
// leaving) is done once StartTimeout has passed since draind began
// watching (never, when it is 0): its exit code is unknown, and its own
// container's code decides the Job.
func AppCompletion(in CompletionInput) Completion {
	switch {
	case in.View != ProcsComplete:
		return Completion{State: AppUntold}
	case in.Procs > 0:
		return Completion{State: AppRunning}
	case in.HasMain && in.Main.Known && in.Main.Success:
		return Completion{Done: true, Seq: in.Main.Seq, State: AppSucceeded}
	case in.HasMain && in.Main.Known && in.Mode == ExitWithAppSuccess:
		return Completion{Seq: in.Main.Seq, State: AppFailedKept}
	case in.HasMain && in.Main.Known:
		return Completion{Done: true, After: in.RestartGrace, Seq: in.Main.Seq, State: AppFailed}
	case in.HasMain:
		return Completion{Done: true, After: in.RestartGrace, Seq: in.Main.Seq, State: AppExitUnknown}
	case in.StartTimeout <= 0:
		return Completion{State: AppNotStarted}
	}
	return Completion{Done: true, After: max(in.StartTimeout-in.Watching, 0), State: AppNeverSeen}
}
