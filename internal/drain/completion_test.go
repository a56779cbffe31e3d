package drain

import (
	"testing"
	"time"
)

// TestAppCompletion: --exit-with-app's rules, over plain data. The app
// leaves with a main exit (seen alive, or by its exit event alone), or is
// never seen: a Job's app container started beside draind that ran and
// left before draind watched cannot be told from one whose image is still
// pulled.
func TestAppCompletion(t *testing.T) {
	grace, timeout := time.Second, 2*time.Minute
	ok := MainExit{Seq: 3, Known: true, Success: true, Status: "exit 0"}
	failed := MainExit{Seq: 4, Known: true, Status: "exit 1"}
	unknown := MainExit{Seq: 5, Status: "unknown"}
	base := func(mode ExitWithApp) CompletionInput {
		return CompletionInput{Mode: mode, View: ProcsComplete, StartTimeout: timeout, RestartGrace: grace}
	}
	with := func(in CompletionInput, f func(*CompletionInput)) CompletionInput { f(&in); return in }
	for _, tc := range []struct {
		name string
		in   CompletionInput
		want Completion
	}{
		{"running", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.Procs = 2 }),
			Completion{State: AppRunning}},
		{"partial view: zero proves nothing", with(base(ExitWithAppAny), func(in *CompletionInput) { in.View, in.Main, in.HasMain = ProcsPartial, ok, true }),
			Completion{State: AppUntold}},
		{"no process view", with(base(ExitWithAppAny), func(in *CompletionInput) { in.View = ProcsUnseen }),
			Completion{State: AppUntold}},
		{"exit 0: at once", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.Main, in.HasMain = ok, true }),
			Completion{Done: true, Seq: 3, State: AppSucceeded}},
		{"exit 0 under any", with(base(ExitWithAppAny), func(in *CompletionInput) { in.Main, in.HasMain = ok, true }),
			Completion{Done: true, Seq: 3, State: AppSucceeded}},
		{"success mode, exit 1: kept for the restart", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.Main, in.HasMain = failed, true }),
			Completion{Seq: 4, State: AppFailedKept}},
		{"any mode, exit 1: after the grace", with(base(ExitWithAppAny), func(in *CompletionInput) { in.Main, in.HasMain = failed, true }),
			Completion{Done: true, After: grace, Seq: 4, State: AppFailed}},
		{"back after a failure", with(base(ExitWithAppAny), func(in *CompletionInput) { in.Procs, in.Main, in.HasMain = 1, failed, true }),
			Completion{State: AppRunning}},
		{"success mode, exit unknown: after the grace", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.Main, in.HasMain = unknown, true }),
			Completion{Done: true, After: grace, Seq: 5, State: AppExitUnknown}},
		{"any mode, exit unknown: after the grace", with(base(ExitWithAppAny), func(in *CompletionInput) { in.Main, in.HasMain = unknown, true }),
			Completion{Done: true, After: grace, Seq: 5, State: AppExitUnknown}},
		{"never seen: the rest of the start timeout", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.Watching = 30 * time.Second }),
			Completion{Done: true, After: 90 * time.Second, State: AppNeverSeen}},
		{"never seen, the start timeout passed", with(base(ExitWithAppAny), func(in *CompletionInput) { in.Watching = 3 * time.Minute }),
			Completion{Done: true, State: AppNeverSeen}},
		{"never seen, no start timeout: awaited", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.StartTimeout, in.Watching = 0, time.Hour }),
			Completion{State: AppNotStarted}},
		{"never seen, partial view", with(base(ExitWithAppSuccess), func(in *CompletionInput) { in.View, in.Watching = ProcsPartial, time.Hour }),
			Completion{State: AppUntold}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AppCompletion(tc.in); got != tc.want {
				t.Errorf("AppCompletion = %+v (%s), want %+v (%s)", got, got.State, tc.want, tc.want.State)
			}
		})
	}
}
