package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// Issue 12: every pod shape. The app runs in its own container (own PID
// namespace), as in a pod.

// nativeHook runs `draind drain` as the kubelet runs a native sidecar's
// preStop hook: in the sidecar's container (here one of its own, same
// network), and returns when it exits.
func (p *pod) nativeHook() (int, string) {
	p.t.Helper()
	var out syncBuffer
	c := p.runContainer("prestop-hook", -1, &out, "__draind", "drain", "--status-addr", "0.0.0.0:15020")
	if !c.wait(10 * time.Second) {
		p.t.Fatal("draind drain did not return")
	}
	return c.code, out.String()
}

// A native sidecar, sequenced as the kubelet does: `draind drain` (the
// preStop hook) and the app's SIGTERM at t=0; the app lingers 1 s, closes
// its listener, finishes a 3 s request and makes 10 calls out over 2.5 s;
// the kubelet would SIGTERM draind once the app has exited, and draind,
// seeing the app gone, does not wait for it.
func TestNativeSidecar(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "10", "--outbound-pause", "250ms")
	p.startDraind([]string{"--min-drain", "1s", "--tracker", "ebpf", "--app-procs", "ebpf"})
	p.wantSources("ebpf", "ebpf")
	slow := inFlight(t, p.client, "http://"+podIP+":15006"+slowPath(3*time.Second))

	hookAt := time.Now()
	p.app.Signal(syscall.SIGTERM)
	code, out := p.nativeHook()
	hookDone := time.Now()
	ready := p.readyStatus()
	if code != 0 || ready != 503 {
		t.Fatalf("draind drain: exit %d (%s); first readiness probe after it: %d, want exit 0 and 503", code, out, ready)
	}
	drainSent := p.waitLog(5*time.Second, logevent.DrainListenersSent, nil)

	a := <-slow
	if !p.app.wait(20 * time.Second) {
		t.Fatal("the app did not exit")
	}
	p.drainedAt = p.app.exitedAt
	exit, took := p.exitsBeforeSidecarTurn()
	ok, closed, fail, appExit := p.appCalls()
	quit := p.phaseTime("stopping")
	draining := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})
	t.Logf("native sidecar: hook returned in %s; drain_listeners at +%v; request %v (Connection: close %v); %d calls ok (%d with Connection: close), %d failed; app exited +%s; quitquitquit %s after it; draind exit %d %s after it, no SIGTERM",
		hookDone.Sub(hookAt), drainSent["ts"], a.Err, a.Close, ok, closed, fail, appExit.Sub(hookAt), quit.Sub(appExit), exit, took)
	if a.Err != nil || a.Code != 200 || !a.Close {
		t.Errorf("the request in flight: %d, %v; want 200 with Connection: close", a.Code, a.Err)
	}
	if ok != 10 || closed != 0 || fail != 0 {
		t.Errorf("outbound calls: %d ok, %d told to close, %d failed; want 10, 0, 0", ok, closed, fail)
	}
	if draining["trigger"] != "prestop-hook" || quit.Before(appExit) || exit != 0 {
		t.Errorf("trigger %v; quit at %s, the app's exit at %s; exit %d; log:\n%s", draining["trigger"], quit, appExit, exit, p.draindLog.String())
	}
	if sent, _ := time.Parse("2006-01-02T15:04:05.000Z0700", drainSent["ts"].(string)); !sent.Before(appExit) {
		t.Errorf("drain_listeners went out at %s, not before the app's exit at %s", sent, appExit)
	}
}

// A native sidecar whose app still calls out at the gate deadline (the
// late stop, internal/drain/late_stop.go): --drain-deadline 14s with
// --stop-timeout 4s puts the gate deadline at 4.5 s and the late one at
// 17.5 s (the grace period the deadline implies, 19 s, less 1.5 s); the
// app, SIGTERMed with the hook, lingers 1 s and makes 10 calls out 600 ms
// apart (7 s at least). The proxy stays for every call, and draind, seeing
// the app gone, stops it cleanly: no deadline line.
func TestLateStopNativeSidecar(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "10", "--outbound-pause", "600ms")
	p.startDraind([]string{"--min-drain", "1s", "--drain-deadline", "14s", "--stop-timeout", "4s", "--tracker", "ebpf", "--app-procs", "ebpf"})
	p.wantSources("ebpf", "ebpf")

	hookAt := time.Now()
	p.app.Signal(syscall.SIGTERM)
	if code, out := p.nativeHook(); code != 0 {
		t.Fatalf("draind drain: exit %d (%s)", code, out)
	}
	if !p.app.wait(20 * time.Second) {
		t.Fatal("the app did not exit")
	}
	p.drainedAt = p.app.exitedAt
	exit, took := p.exitsBeforeSidecarTurn()
	ok, closed, fail, appExit := p.appCalls()
	late := p.waitLog(time.Second, logevent.GateDeadlineLate, nil)
	quit := p.phaseTime("stopping")
	t.Logf("native sidecar past its gate deadline: late hold at +%v (to %v); %d calls ok, %d failed; app exited +%s; quitquitquit %s after it; draind exit %d %s after it",
		late["after"], late["late_gate_deadline"], ok, fail, appExit.Sub(hookAt), quit.Sub(appExit), exit, took)
	if ok != 10 || closed != 0 || fail != 0 {
		t.Errorf("outbound calls: %d ok, %d told to close, %d failed; want 10, 0, 0", ok, closed, fail)
	}
	if quit.Before(appExit) || exit != 0 || len(p.logLines(logevent.DeadlineReached)) != 0 {
		t.Errorf("quit at %s, the app's exit at %s; exit %d; log:\n%s", quit, appExit, exit, p.draindLog.String())
	}
}

// A native sidecar whose pod's grace period is spent before its app's
// SIGTERM (the app's own preStop held it, or the kubelet lagged under a
// burst of deletions): the kubelet then SIGTERMs the app and the sidecar
// together, the sidecar's wait for its turn over, and SIGKILLs both 2 s
// later. Past its gate deadline (4.5 s, as above), draind takes that
// SIGTERM with the app still running as the grace period spent
// (drain.GraceSpent): the proxy stays for the app's last calls (11, 65 ms
// apart) and stops once the app has exited, inside the kubelet's 2 s.
func TestLateStopGraceSpent(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful", "--outbound-count", "11", "--outbound-pause", "65ms")
	p.startDraind([]string{"--min-drain", "1s", "--drain-deadline", "14s", "--stop-timeout", "4s", "--tracker", "ebpf", "--app-procs", "ebpf"})
	p.wantSources("ebpf", "ebpf")

	if code, out := p.nativeHook(); code != 0 {
		t.Fatalf("draind drain: exit %d (%s)", code, out)
	}
	p.waitLog(10*time.Second, logevent.GateDeadlineLate, nil)
	termAt := time.Now()
	p.app.Signal(syscall.SIGTERM)
	p.draind.Signal(syscall.SIGTERM)
	if !p.app.wait(20 * time.Second) {
		t.Fatal("the app did not exit")
	}
	p.drainedAt = termAt
	exit, took := p.waitExit(10 * time.Second)
	ok, closed, fail, appExit := p.appCalls()
	spent := p.waitLog(time.Second, logevent.GraceSpent, nil)
	quit := p.phaseTime("stopping")
	t.Logf("grace period spent: %d calls ok, %d failed; app exited %s after the SIGTERM; hold %v; quitquitquit %s after the app's exit; draind exit %d %s after the SIGTERM",
		ok, fail, appExit.Sub(termAt), spent["hold"], quit.Sub(appExit), exit, took)
	if ok != 11 || closed != 0 || fail != 0 {
		t.Errorf("outbound calls: %d ok, %d told to close, %d failed; want 11, 0, 0", ok, closed, fail)
	}
	if quit.Before(appExit) || exit != 0 {
		t.Errorf("quit at %s, the app's exit at %s; exit %d; log:\n%s", quit, appExit, exit, p.draindLog.String())
	}
}

// A Job with a classic sidecar and --exit-with-app: the app works 2 s and
// exits; no app change, no quitquitquit call from it.
func TestJobExitWithApp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  string
		code  string
		stops bool
	}{
		{"success, exit 0", "success", "0", true},
		{"success, exit 1", "success", "1", false},
		{"any, exit 1", "any", "1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			// draind first: its start-up (3.5 s on arm64 under qemu)
			// must not outlast the app's 2 s of work, or it never sees
			// the app at all.
			p.startDraind([]string{"--exit-with-app", tc.mode, "--app-procs", "ebpf"})
			p.wantSources("", "ebpf")
			p.startApp("--run-for", "2s", "--exit-code", tc.code)
			if !p.app.wait(10 * time.Second) {
				t.Fatal("the app did not finish")
			}
			_, _, _, appExit := p.appCalls()
			if !tc.stops {
				select {
				case <-p.draind.done:
					t.Fatalf("draind ended after an exit %s in success mode; log:\n%s", tc.code, p.draindLog.String())
				case <-time.After(2 * time.Second):
				}
				p.drainedAt = time.Now()
				p.draind.Signal(syscall.SIGTERM)
			}
			code, _ := p.waitExit(20 * time.Second)
			quit := p.phaseTime("stopping")
			t.Logf("%s: quitquitquit %s after the app's exit; draind exit %d", tc.name, quit.Sub(appExit), code)
			if code != 0 || quit.Before(appExit) {
				t.Errorf("exit %d, quit at %s, app exit at %s; log:\n%s", code, quit, appExit, p.draindLog.String())
			}
			want := "app-done"
			if !tc.stops {
				want = "signal"
			}
			if got := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})["trigger"]; got != want {
				t.Errorf("drain trigger %v, want %s", got, want)
			}
		})
	}
}

// A Deployment's crash loop under --exit-with-app any: the app is killed
// and restarted 300 ms later, three times. Envoy is never stopped, and
// readiness follows the app's port.
func TestDeploymentCrashLoop(t *testing.T) {
	p := newPod(t)
	p.startApp()
	p.startDraind([]string{"--exit-with-app", "any", "--app-procs", "ebpf", "--app-ports", "8080"})
	for i := range 3 {
		p.app.Kill()
		p.app.wait(5 * time.Second)
		waitReadiness(t, p, 503)
		time.Sleep(300 * time.Millisecond)
		p.startApp()
		waitReadiness(t, p, 200)
		t.Logf("restart %d: readiness 503 while the app was down, 200 once it listened again", i+1)
	}
	select {
	case <-p.draind.done:
		t.Fatalf("draind ended during the crash loop; log:\n%s", p.draindLog.String())
	case <-time.After(2 * time.Second):
	}
	if n := len(p.logLines(logevent.Phase)); n != 1 { // ready, and nothing since
		t.Errorf("%d phase changes, want only ready; log:\n%s", n, p.draindLog.String())
	}
}

func waitReadiness(t *testing.T, p *pod, want int) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for got := p.readyStatus(); got != want; got = p.readyStatus() {
		if time.Now().After(end) {
			t.Fatalf("readiness %d, want %d; log:\n%s", got, want, p.draindLog.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
