package drain

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/logevent"
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

// --- --exit-with-app (Jobs) ------------------------------------------------

func TestExitWithApp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  ExitWithApp
		code  int
		stops bool
	}{
		{"success mode, exit 0", ExitWithAppSuccess, 0, true},
		{"success mode, exit 1 (OnFailure restarts it)", ExitWithAppSuccess, 1, false},
		{"any mode, exit 1", ExitWithAppAny, 1, true},
		{"any mode, killed", ExitWithAppAny, -1, true},
		{"off", ExitWithAppOff, 0, false},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = tc.mode; c.AppRestartGrace = 50 * time.Millisecond }))
			r.waitPhase(Ready)
			r.apps.mainExits(tc.code)
			if !tc.stops {
				r.notDone(300 * time.Millisecond)
				if r.m.Phase() != Ready {
					t.Fatalf("phase %s after the app's exit, want ready", r.m.Phase())
				}
				r.m.Trigger(CauseSignal) // the pod's end
				r.wantResult(r.result(), 0, true, "drained")
				return
			}
			r.wantResult(r.result(), 0, true, "drained")
			if r.m.Cause() != CauseAppDone {
				t.Errorf("drain cause %s, want app-done", r.m.Cause())
			}
		}))
	}
}

func TestExitWithAppRestartWithinGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = ExitWithAppAny; c.AppRestartGrace = 300 * time.Millisecond }))
		r.waitPhase(Ready)
		for i := range 3 { // a crash loop: killed, back 100 ms later
			r.apps.mainExits(-1)
			r.notDone(100 * time.Millisecond) // inside the grace: the proxy stays
			r.apps.set(1)
			r.waitFor("the app's return", func() bool {
				return r.count(logevent.AppBack) == i+1
			})
		}
		r.notDone(500 * time.Millisecond)
		if r.m.Phase() != Ready || r.count(logevent.AppBack) != 3 {
			t.Fatalf("phase %s; log:\n%s", r.m.Phase(), r.log())
		}
		r.m.Quit()
		r.result()
	})
}

// An app never seen since the machine began watching (a Job's app
// container that ran and left before draind's process source was live, or
// one not started yet): --app-start-timeout after the machine's start,
// the app is taken as done and the proxy stops, exit 0; an app that
// appears before keeps it, and its own exit decides.
func TestExitWithAppNeverSeen(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name    string
		mode    ExitWithApp
		timeout time.Duration
		appears time.Duration // the app's first process comes then (0: never)
		blip    bool          // and goes without an exit (taken for another container's)
		stops   bool
	}{
		{"success, never seen", ExitWithAppSuccess, timeout, 0, false, true},
		{"any, never seen", ExitWithAppAny, timeout, 0, false, true},
		{"success, seen late, exit 0", ExitWithAppSuccess, timeout, timeout / 2, false, true},
		{"a process taken for the app for a moment", ExitWithAppSuccess, timeout, timeout / 2, true, true},
		{"no start timeout: awaited", ExitWithAppSuccess, 0, 0, false, false},
	} {
		t.Run(tc.name, inBubble(func(t *testing.T) {
			start := time.Now()
			r := newRig(t, setup(func(r *rig) { r.apps = newFakeApps(0, ProcsComplete) }),
				withConfig(func(c *Config) { c.ExitWithApp, c.AppStartTimeout = tc.mode, tc.timeout }))
			r.waitPhase(Ready)
			if tc.timeout > 0 {
				r.waitForLog(logevent.AppNotSeenYet, "app_start_timeout", tc.timeout.String())
			}
			switch {
			case tc.appears > 0 && tc.blip:
				time.Sleep(tc.appears - time.Since(start))
				r.apps.set(1)
				r.notDone(timeout / 4)
				r.apps.set(0) // no main exit: still never seen
			case tc.appears > 0:
				time.Sleep(tc.appears - time.Since(start))
				r.apps.set(1)
				r.notDone(2 * timeout) // past the start timeout: the app is there
				r.apps.mainExits(0)
			}
			if !tc.stops {
				r.notDone(time.Hour)
				r.m.Trigger(CauseSignal)
				r.wantResult(r.result(), 0, true, "drained")
				return
			}
			res := r.result()
			r.wantResult(res, 0, true, "drained")
			if r.m.Cause() != CauseAppDone {
				t.Errorf("drain cause %s, want app-done", r.m.Cause())
			}
			never := r.count(logevent.AppNeverSeen)
			if took := time.Since(start); (tc.appears == 0 || tc.blip) && (never != 1 || took < timeout || took >= timeout+timeout/4) {
				// The fake clock: the start timeout, not extended by a process
				// that came and went.
				t.Errorf("stopped %s after the start with %d app_never_seen lines, want at %s with one; log:\n%s", took, never, timeout, r.log())
			}
			if tc.appears > 0 && !tc.blip && never != 0 {
				t.Errorf("an app seen late was taken as never seen; log:\n%s", r.log())
			}
		}))
	}
}

// A main exit whose code draind could not read (its event lost, inferred
// from a snapshot) ends the proxy after the restart grace in success mode
// too: a Job must not hang on it.
func TestExitWithAppUnknownExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, withConfig(func(c *Config) { c.ExitWithApp = ExitWithAppSuccess; c.AppRestartGrace = 300 * time.Millisecond }))
		r.waitPhase(Ready)
		start := time.Now()
		r.apps.mainExitsUnknown()
		r.wantResult(r.result(), 0, true, "drained")
		if took := time.Since(start); took < 300*time.Millisecond || r.m.Cause() != CauseAppDone {
			t.Errorf("stopped %s after the exit by %s, want after the 300ms grace by app-done; log:\n%s", took, r.m.Cause(), r.log())
		}
	})
}
