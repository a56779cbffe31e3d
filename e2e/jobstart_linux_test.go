package e2e

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testutil"
)

// Issue 29: a Job's app container started beside draind, with no postStart
// gate, may run and leave before draind's process tracking is live (its
// eBPF load takes a tenth of a second here, seconds on a busy node). The
// proxy must end anyway, and draind exit 0: the app container's own exit
// code decides the Job.

// jobStartTimeout is --app-start-timeout in these tests: how long draind
// waits for an app it has never seen (the default, 2 minutes, leaves room
// for an image pull).
const jobStartTimeout = 3 * time.Second

// busyCPU keeps every CPU busy until the test ends, at most a minute:
// one spinning process a CPU outside the pod (nice 0, as a build beside
// the pod would be), each killed at the test's end or with the test.
func busyCPU(t *testing.T) {
	t.Helper()
	bin := testutil.SelfCopy(t)
	for range runtime.NumCPU() {
		cmd := exec.Command(bin, "__spin", "60s")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("cpu load: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

func init() { faultRoles["__spin"] = spinRole }

// spinRole spins one thread for the duration it is given.
func spinRole(args []string) int {
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return 2
	}
	runtime.GOMAXPROCS(1)
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
	return 0
}

// A Job whose app exits 0 after 50 ms, started 0.02, 0.2 or 0.6 s after
// draind with no gate, on an idle CPU and on busy ones; and one that works
// 5 s. Each ends with the proxy stopped by the app's completion and draind
// exiting 0. When draind's process source was live before the app exited,
// the app's exit 0 itself must end the proxy (seen alive, or by its exit
// event alone); otherwise the app was never seen, and the proxy ends
// --app-start-timeout after draind began watching.
func TestJobAppStartsBesideDraind(t *testing.T) {
	type jobCase struct {
		name  string
		busy  bool
		delay time.Duration // the app's start after draind's
		runs  time.Duration
	}
	var cases []jobCase
	for _, busy := range []bool{false, true} {
		load := "idle"
		if busy {
			load = "busy"
		}
		for _, d := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, 600 * time.Millisecond} {
			cases = append(cases, jobCase{fmt.Sprintf("%s/after-%s/runs-50ms", load, d), busy, d, 50 * time.Millisecond})
		}
		cases = append(cases, jobCase{load + "/after-20ms/runs-5s", busy, 20 * time.Millisecond, 5 * time.Second})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			if tc.busy {
				busyCPU(t)
			}
			draindAt := time.Now()
			p.startDraindNoWait([]string{"--exit-with-app", "--app-procs", "ebpf", "--app-start-timeout", jobStartTimeout.String()})
			time.Sleep(time.Until(draindAt.Add(tc.delay)))
			appAt := time.Now()
			p.startApp("--run-for", tc.runs.String(), "--exit-code", "0")
			if !p.app.wait(tc.runs + 10*time.Second) {
				t.Fatal("the app did not finish")
			}
			p.drainedAt = appAt
			code, _ := p.waitExit(jobStartTimeout + 30*time.Second)
			_, _, _, appExit := p.appCalls()
			live := logTime(p.waitLog(time.Second, logevent.AppLiveness, map[string]any{"source": "ebpf"}))
			quit := p.phaseTime("stopping")
			never := len(p.logLines(logevent.AppNeverSeen))
			how := "seen: its exit 0"
			if never > 0 {
				how = "never seen: --app-start-timeout"
			}
			t.Logf("%s: app started %s after draind, exited +%s; draind watching +%s; %s; quitquitquit %s after the app's exit; draind exit %d",
				tc.name, appAt.Sub(draindAt).Round(time.Millisecond), appExit.Sub(draindAt).Round(time.Millisecond),
				live.Sub(draindAt).Round(time.Millisecond), how, quit.Sub(appExit).Round(time.Millisecond), code)
			if code != 0 || quit.IsZero() || appExit.IsZero() || quit.Before(appExit) {
				t.Errorf("draind exit %d, quit at %s, app exit at %s; want 0, the proxy told to quit after the app's exit; log:\n%s", code, quit, appExit, p.draindLog.String())
			}
			if got := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})["trigger"]; got != "app-done" {
				t.Errorf("drain trigger %v, want app-done", got)
			}
			// The log's millisecond: the source was live before the app's
			// exit for sure when it was logged a millisecond before.
			if appExit.After(live.Add(time.Millisecond)) {
				if never > 0 || !p.sawMainExit("exit 0") {
					t.Errorf("draind was watching (+%s) before the app's exit (+%s), yet did not see its exit 0; log:\n%s",
						live.Sub(draindAt), appExit.Sub(draindAt), p.draindLog.String())
				}
			}
			if !p.sawMainExit("exit 0") && never == 0 {
				t.Errorf("the proxy stopped neither on the app's exit 0 nor on --app-start-timeout; log:\n%s", p.draindLog.String())
			}
		})
	}
}

// sawMainExit reports whether draind logged the app's main process gone
// with status (e.g. "exit 0").
func (p *pod) sawMainExit(status string) bool {
	for _, l := range p.logLines(logevent.AppGone) {
		if l["main_exit"] == status {
			return true
		}
	}
	return false
}

// A Job with draind as a native sidecar (no --exit-with-app): the app
// exits 0 after 50 ms, started 20 ms after draind, before draind's process
// tracking is live. Once the app's container has exited the kubelet runs
// the sidecar's preStop hook and then SIGTERMs it: draind stops the proxy
// and exits 0, the app never having been seen.
func TestNativeSidecarJobAppBeforeWatch(t *testing.T) {
	for _, busy := range []bool{false, true} {
		name := "idle"
		if busy {
			name = "busy"
		}
		t.Run(name, func(t *testing.T) {
			p := newPod(t)
			if busy {
				busyCPU(t)
			}
			draindAt := time.Now()
			p.startDraindNoWait([]string{"--min-drain", "1s", "--app-procs", "ebpf"})
			time.Sleep(time.Until(draindAt.Add(20 * time.Millisecond)))
			p.startApp("--run-for", "50ms", "--exit-code", "0")
			if !p.app.wait(10 * time.Second) {
				t.Fatal("the app did not finish")
			}
			// The kubelet: every regular container exited, so the sidecar's
			// preStop hook, then its SIGTERM.
			code, out := p.nativeHook()
			if code != 0 {
				t.Fatalf("draind drain: exit %d: %s; log:\n%s", code, out, p.draindLog.String())
			}
			p.drainedAt = time.Now()
			p.draind.Signal(syscall.SIGTERM)
			exit, took := p.waitExit(20 * time.Second)
			_, _, _, appExit := p.appCalls()
			quit := p.phaseTime("stopping")
			t.Logf("native sidecar Job (%s): app exited +%s; quitquitquit %s after SIGTERM; draind exit %d %s after SIGTERM",
				name, appExit.Sub(draindAt).Round(time.Millisecond), quit.Sub(p.drainedAt).Round(time.Millisecond), exit, took.Round(time.Millisecond))
			if exit != 0 || quit.IsZero() {
				t.Errorf("draind exit %d, quit at %s; want 0 and the proxy stopped; log:\n%s", exit, quit, p.draindLog.String())
			}
			if got := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})["trigger"]; got != "prestop-hook" {
				t.Errorf("drain trigger %v, want prestop-hook", got)
			}
		})
	}
}

// Issue 42: a task shorter than draind's own start-up ends its proxy
// within seconds, by its own exit code, not at --app-start-timeout. In a
// pod cgroup (as the kubelet makes one) with POD_UID set (the downward
// API's), a bare --exit-with-app on its defaults (2 min for an app never
// seen): the app starts 0.02, 0.1 or 0.2 s after draind and exits after
// 50 ms, with 0 (and, under any, with 3). draind's recorder of the pod's
// other containers' exits, live from its first milliseconds, saw it end:
// draind exits within 3 s of the app, every time.
func TestJobShortTaskBeforeWatch(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		mode string
		code int
	}{{"", 0}, {"=any", 3}} {
		for _, d := range []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
			t.Run(fmt.Sprintf("exit-%d/after-%s", tc.code, d), func(t *testing.T) {
				p := newPod(t, inPodCgroup)
				p.env = append(p.env, "POD_UID=6f1c1d2e-5b7a-4c3e-9a41-0d2f1e3c4b5a")
				draindAt := time.Now()
				p.startDraindNoWait([]string{"--exit-with-app" + tc.mode, "--app-procs", "ebpf"})
				time.Sleep(time.Until(draindAt.Add(d)))
				appAt := time.Now()
				p.startApp("--run-for", "50ms", "--exit-code", fmt.Sprint(tc.code))
				if !p.app.wait(10 * time.Second) {
					t.Fatal("the app did not finish")
				}
				p.drainedAt = appAt
				code, _ := p.waitExit(30 * time.Second)
				exitAt := time.Now()
				_, _, _, appExit := p.appCalls()
				rec := p.waitLog(time.Second, logevent.EarlyExits, nil)
				live := logTime(p.waitLog(time.Second, logevent.AppLiveness, map[string]any{"source": "ebpf"}))
				t.Logf("app started +%s, exited +%s; draind's process source live +%s; draind exit %d +%s (%s after the app); recorder %v",
					appAt.Sub(draindAt).Round(time.Millisecond), appExit.Sub(draindAt).Round(time.Millisecond), live.Sub(draindAt).Round(time.Millisecond),
					code, exitAt.Sub(draindAt).Round(time.Millisecond), exitAt.Sub(appExit).Round(time.Millisecond), rec)
				if rec["recording"] != true {
					t.Fatalf("the recorder did not run: %v", rec)
				}
				if code != 0 || appExit.IsZero() || exitAt.Sub(appExit) > 3*time.Second {
					t.Errorf("draind exit %d, %s after the app's exit; want 0 within 3 s; log:\n%s", code, exitAt.Sub(appExit), p.draindLog.String())
				}
				if want := fmt.Sprintf("exit %d", tc.code); !p.sawMainExit(want) || len(p.logLines(logevent.AppNeverSeen)) > 0 {
					t.Errorf("want the app's main exit seen with %q, never taken as never seen; log:\n%s", want, p.draindLog.String())
				}
			})
		}
	}
}
