package drain

import (
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/logevent"
)

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
	// AppUntold means the view cannot prove the app gone (no complete
	// view).
	AppUntold AppState = iota
	// AppRunning means it has processes.
	AppRunning
	// AppSucceeded means the app is gone, its main process exited 0.
	AppSucceeded
	// AppFailed means the app is gone after a failure (non-zero, a signal),
	// under any.
	AppFailed
	// AppFailedKept means the app is gone after a failure under success:
	// kept for the kubelet's restart (restartPolicy OnFailure).
	AppFailedKept
	// AppExitUnknown means the app is gone, its main process's exit status
	// unknown (an exit inferred from a snapshot after lost events, /proc's
	// polling).
	AppExitUnknown
	// AppNeverSeen means no app process now and no main exit since draind
	// began watching. It has not started yet, or it ran and left before
	// draind could watch (an app container started next to draind, shorter
	// than draind's start-up): nothing in the kernel tells the two apart. A
	// process taken for the app for a moment and then for another
	// container's (one exec'd into the proxy's container enters the pod's
	// network namespace before its mount namespace) changes nothing.
	AppNeverSeen
	// AppNotStarted means the app was never seen, and --app-start-timeout
	// is 0: the app is awaited without limit.
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
	// Done is true when the app's work is over, once it has stayed so for
	// After.
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

// appWatch is the loop's state for --exit-with-app while Ready.
type appWatch struct {
	// since is when Run began watching the app (its process source is
	// live by then): --app-start-timeout counts from it.
	since time.Time
	// failedSeq is the last failed main exit said to stay (success
	// mode), so that each is logged once.
	failedSeq uint64
	// timer runs while the app looks done, for the verdict's After (the
	// restart grace, the rest of the start timeout); nil while not armed.
	timer *time.Timer
	// on is the verdict timer waits on: a new one restarts the wait.
	on completionKey
}

// completionKey tells AppCompletion's verdicts apart.
type completionKey struct {
	state AppState
	seq   uint64
}

func (c Completion) key() completionKey { return completionKey{c.State, c.Seq} }

// completion applies AppCompletion to what the app's view says now, and
// returns the main exit it read. The count is read first: an app that
// leaves after it has its exit read.
func (m *Machine) completion() (Completion, MainExit) {
	n, view := m.apps.Count()
	exit, has := m.apps.MainExit()
	return AppCompletion(CompletionInput{
		Mode: m.cfg.ExitWithApp, View: view, Procs: n, Main: exit, HasMain: has,
		Watching: time.Since(m.app.since), StartTimeout: m.cfg.AppStartTimeout, RestartGrace: m.cfg.restartGrace(),
	}), exit
}

// watchAppDone arms the wait when the app looks done (the restart grace,
// or the rest of the start timeout for an app never seen), and disarms it
// when the app is back (a crashed container the kubelet restarted) or
// first appears.
func (m *Machine) watchAppDone() {
	c, exit := m.completion()
	if c.State == AppFailedKept && c.Seq != m.app.failedSeq {
		m.app.failedSeq = c.Seq
		// docs/configuration.md: under restartPolicy Never, "any" is the policy.
		m.log.Info("app failed: the proxy stays for its restart", logevent.AppFailedKept.Field(), zap.String("main_exit", exit.Status))
	}
	switch {
	case c.Done && (m.app.timer == nil || c.key() != m.app.on):
		if m.app.timer != nil {
			m.app.timer.Stop() // it came back and left again: a new wait
		}
		if c.State == AppNeverSeen {
			m.log.Info("no app process seen yet: waiting for the first",
				logevent.AppNotSeenYet.Field(), zap.Duration("app_start_timeout", m.cfg.AppStartTimeout), zap.Duration("left", c.After))
		} else {
			// A success is the app's work done: a Job's container is not
			// restarted after it. A failure, or an exit draind could not
			// read, may be a crash the kubelet restarts: the restart grace.
			m.log.Info("app gone: the proxy stops after the restart grace", logevent.AppGone.Field(),
				zap.String("main_exit", exit.Status), zap.Stringer("app", c.State), zap.Duration("grace", c.After), zap.String("exit_with_app", string(m.cfg.ExitWithApp)))
		}
		m.app.timer, m.app.on = time.NewTimer(c.After), c.key()
	case !c.Done && m.app.timer != nil:
		m.app.timer.Stop()
		m.app.timer = nil
		if m.app.on.state == AppNeverSeen {
			m.log.Info("app process seen: the proxy stays", logevent.AppSeen.Field(), zap.Stringer("app", c.State))
		} else {
			m.log.Info("app back within the restart grace", logevent.AppBack.Field(), zap.Stringer("app", c.State))
		}
	}
}

// appDoneWaited is the end of the wait watchAppDone armed: the app still
// done on the same verdict, it starts the drain (CauseAppDone).
func (m *Machine) appDoneWaited() {
	c, _ := m.completion()
	if !c.Done || c.key() != m.app.on || m.Phase() != Ready {
		return
	}
	if c.State == AppNeverSeen {
		// What it means and how to avoid it: docs/design.md, "When is the app done".
		m.log.Warn("no app process seen in --app-start-timeout: taken as done",
			logevent.AppNeverSeen.Field(), zap.Duration("app_start_timeout", m.cfg.AppStartTimeout), zap.Duration("watching", time.Since(m.app.since)))
	}
	m.begin(CauseAppDone)
}
