package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testapp"
)

// Envoy's faults (envoysim's, docs/envoysim.md) and draind's own death.
// Every case ends by the rules: the exit code documented (README "Exit
// codes", docs/design.md), and, when a drain was triggered, draind gone by
// --drain-deadline after the trigger (the deadline includes the stop
// steps), never later than the deadline plus 2 × --stop-timeout.

// faultCase is one injected fault.
type faultCase struct {
	name, injected string
	// envoyArgs are envoysim's flags; startupDelay its time to LIVE.
	envoyArgs    []string
	startupDelay time.Duration
	// minDrain replaces the suite's 300 ms.
	minDrain time.Duration
	// app is the app's flags (default: graceful, 4 calls out during its
	// shutdown); traffic sends a 1 s request through Envoy's inbound
	// listener, in flight at the trigger.
	app     []string
	traffic bool
	// notReady: the proxy is never ready (do not wait for it).
	notReady bool
	// act injects the fault and triggers (nil: SIGTERM to the pod); it
	// returns false when there is no trigger (the proxy dies on its own).
	act func(t *testing.T, p *pod, proxy *procWatch) bool
	// wantExit is the documented exit code; wantPhase the last phase
	// draind logged before it exited ("": none after starting).
	wantExit  int
	wantPhase string
}

// TestReliabilityEnvoyFaults injects each of envoysim's faults around a
// pod's termination.
func TestReliabilityEnvoyFaults(t *testing.T) {
	sigterm := func(t *testing.T, p *pod, _ *procWatch) bool { p.terminate(); return true }
	faultThenTerm := func(fault string) func(*testing.T, *pod, *procWatch) bool {
		return func(t *testing.T, p *pod, _ *procWatch) bool {
			setFault(t, p, fault)
			p.terminate()
			return true
		}
	}
	none := func(*testing.T, *pod, *procWatch) bool { return false }
	cases := []faultCase{
		{name: "admin hangs", injected: `admin API reads requests and never answers (from before SIGTERM)`, traffic: true,
			act: faultThenTerm(`{"admin":"hang"}`), wantExit: 0, wantPhase: "stopping"},
		{name: "admin answers 500", injected: `every admin answer is a 500`, traffic: true,
			act: faultThenTerm(`{"admin":"500"}`), wantExit: 0, wantPhase: "stopping"},
		{name: "admin answers garbage", injected: `every admin answer is a 200 with a body no parser accepts`, traffic: true,
			act: faultThenTerm(`{"admin":"garbage"}`), wantExit: 0, wantPhase: "stopping"},
		{name: "admin slow", injected: `every admin answer takes 2 s`, traffic: true,
			act: faultThenTerm(`{"admin":"slow","admin_delay_ms":2000}`), wantExit: 0, wantPhase: "stopping"},
		{name: "proxy SIGSTOPped mid-drain", injected: `SIGSTOP to envoysim once gating, a request in flight`, traffic: true,
			act: func(t *testing.T, p *pod, proxy *procWatch) bool {
				p.terminate()
				p.waitLog(10*time.Second, logevent.Phase, map[string]any{"phase": "gating"})
				unix.Kill(proxy.pid, unix.SIGSTOP)
				return true
			}, wantExit: 137, wantPhase: "stopping"},
		{name: "crash while Starting", injected: `SIGABRT 1 s after start, LIVE due at 3 s`, startupDelay: 3 * time.Second,
			envoyArgs: []string{"--crash-after", "1s"}, notReady: true, act: none, wantExit: 134, wantPhase: ""},
		{name: "crash while Ready", injected: `SIGABRT 3 s after start (Ready at ~0.1 s), no drain`,
			envoyArgs: []string{"--crash-after", "3s"}, act: none, wantExit: 134, wantPhase: "ready"},
		{name: "crash while Draining", injected: `SIGABRT 500 ms after SIGTERM, min-drain 3 s`, traffic: true, minDrain: 3 * time.Second,
			act: func(t *testing.T, p *pod, _ *procWatch) bool {
				p.terminate()
				setFault(t, p, `{"crash_after_ms":500}`)
				return true
			}, wantExit: 134, wantPhase: "draining"},
		{name: "crash while Gating", injected: `SIGABRT 500 ms into gating (the app ignores SIGTERM and holds it)`, traffic: true,
			app: []string{"--on-term", "ignore"},
			act: func(t *testing.T, p *pod, _ *procWatch) bool {
				p.terminate()
				p.waitLog(10*time.Second, logevent.Phase, map[string]any{"phase": "gating"})
				setFault(t, p, `{"crash_after_ms":500}`)
				return true
			}, wantExit: 134, wantPhase: "gating"},
		{name: "crash while Stopping", injected: `admin hangs, SIGABRT 1 s after SIGTERM: during the /quitquitquit wait (gate open at 300 ms; no listener gauges, so the gate asks no admin)`,
			envoyArgs: []string{"--stats-matcher", "istio"}, app: []string{"--on-term", "exit"},
			act: func(t *testing.T, p *pod, _ *procWatch) bool {
				setFault(t, p, `{"admin":"hang","crash_after_ms":1000}`)
				p.terminate()
				return true
			}, wantExit: 134, wantPhase: "stopping"},
		{name: "exits early at start", injected: `envoysim exits 3 at the end of its 1 s startup, never LIVE`, startupDelay: time.Second,
			envoyArgs: []string{"--fault-exit-at-start", "3"}, notReady: true, act: none, wantExit: 3, wantPhase: ""},
		{name: "never LIVE", injected: `envoysim stays INITIALIZING; SIGTERM 1 s after start`,
			envoyArgs: []string{"--fault-never-live"}, notReady: true,
			act: func(t *testing.T, p *pod, _ *procWatch) bool {
				time.Sleep(time.Second)
				if got := p.readyStatus(); got != 503 {
					t.Errorf("readiness %d while the proxy is not LIVE, want 503", got)
				}
				p.terminate()
				return true
			}, wantExit: 0, wantPhase: "stopping"},
	}
	for _, fc := range cases {
		if fc.act == nil {
			fc.act = sigterm
		}
		t.Run(strings.ReplaceAll(fc.name, " ", "-"), func(t *testing.T) { runFault(t, fc) })
	}
}

// The deadline and stop timeout of the fault cases: the defaults in the
// full suite, shorter in the short one.
func faultLimits() (deadline, stopTimeout time.Duration) {
	return pick(6*time.Second, 25*time.Second), pick(time.Second, 2*time.Second)
}

func runFault(t *testing.T, fc faultCase) {
	deadline, stopTimeout := faultLimits()
	minDrain := 300 * time.Millisecond
	if fc.minDrain > 0 {
		minDrain = fc.minDrain
	}
	p := newPod(t)
	app := fc.app
	if app == nil {
		app = []string{"--on-term", "graceful", "--outbound-count", "4", "--outbound-pause", "100ms"}
	}
	p.startApp(app...)
	p.envoyStartupDelay = fc.startupDelay
	args := []string{"--min-drain", minDrain.String(), "--drain-deadline", deadline.String(), "--stop-timeout", stopTimeout.String(), "--tracker", "ebpf", "--app-procs", "ebpf"}
	if fc.notReady {
		p.startDraindNoWait(args, fc.envoyArgs...)
		p.waitLog(10*time.Second, logevent.ProxyStarted, nil)
	} else {
		p.startDraind(args, fc.envoyArgs...)
	}
	proxy := p.watchProxy()
	draindDone, draindAt := p.watchDraind()

	// A request in flight at the trigger, on a connection of its own that
	// the client closes after the response.
	var inflight <-chan testapp.Reply
	if fc.traffic {
		hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 60 * time.Second}
		inflight = inFlight(t, hc, "http://"+podIP+":15006"+slowPath(time.Second))
	}
	triggered := fc.act(t, p, proxy)
	if !triggered {
		if !proxy.waitGone(20 * time.Second) {
			t.Fatal("the proxy did not die")
		}
		p.drainedAt = proxy.at // the clock starts at the proxy's death
	}
	select {
	case <-draindDone:
	case <-time.After(deadline + 2*stopTimeout + 10*time.Second):
		t.Fatalf("draind still running %s after the trigger; log:\n%s", deadline+2*stopTimeout+10*time.Second, p.draindLog.String())
	}
	code, took := p.draind.code, draindAt.Sub(p.drainedAt)
	if !proxy.waitGone(5 * time.Second) {
		t.Fatalf("draind exited %d and the proxy still runs", code)
	}
	appCalls := triggered && fc.app == nil // the app's calls out during its shutdown
	if triggered && (fc.app == nil || fc.app[1] != "ignore") {
		p.app.wait(15 * time.Second)
	}

	// What the clients saw.
	attempted, failed := 0, 0
	var fails []string
	if fc.traffic {
		attempted++
		select {
		case a := <-inflight:
			if a.Err != nil || a.Code != 200 {
				failed++
				fails = append(fails, fmt.Sprintf("in-flight request: %d %v", a.Code, a.Err))
			}
		case <-time.After(10 * time.Second):
			failed++
			fails = append(fails, "in-flight request: no answer 10 s after the proxy's end")
		}
	}
	if appCalls {
		ok, fail, _ := p.appResults()
		attempted += ok + fail
		failed += fail
		if fail > 0 {
			fails = append(fails, fmt.Sprintf("%d of the app's calls out", fail))
		}
	}

	phase := lastPhase(p)
	var stopped, limit string
	// Whether Envoy was told to drain (its clients told Connection: close).
	drained := "drain_listeners not sent"
	if l := p.logLines(logevent.DrainListenersSent); len(l) > 0 {
		drained = fmt.Sprintf("drain_listeners sent (attempt %v)", l[0]["attempts"])
	} else if l := p.logLines(logevent.DrainListenersGaveUp); len(l) > 0 {
		drained = fmt.Sprintf("drain_listeners never succeeded (%v attempts)", l[0]["attempts"])
	}
	var respected bool
	if triggered {
		stopped = secs(proxy.at.Sub(p.drainedAt))
		if q := p.phaseTime("stopping"); !q.IsZero() {
			stopped += fmt.Sprintf(" (/quitquitquit at %s)", secs(q.Sub(p.drainedAt)))
		}
		stopped += "; " + drained
		respected = took <= deadline+2*stopTimeout
		limit = fmt.Sprintf("%s: draind gone %s after the trigger; deadline %s: %s; deadline + 2 × stop-timeout %s: %s",
			yesNo(respected), secs(took), deadline, yesNo(took <= deadline), deadline+2*stopTimeout, yesNo(respected))
		if took > deadline {
			t.Logf("draind exited %s after the trigger: past --drain-deadline %s (within + 2 × stop-timeout: %v)", took, deadline, respected)
		}
	} else {
		stopped = fmt.Sprintf("no trigger: the proxy died on its own in %q; draind exited %s after it", phaseName(phase), secs(took))
		respected = took < 2*time.Second
		limit = fmt.Sprintf("%s: draind followed its proxy within 2 s (%s)", yesNo(respected), secs(took))
	}
	notes := ""
	if len(fails) > 0 {
		notes = " (" + strings.Join(fails, "; ") + ")"
	}
	record(t, outcome{name: "envoy fault: " + fc.name, injected: fc.injected, attempted: dashIfZero(attempted, fc.traffic || appCalls),
		failed: fmt.Sprint(failed) + notes, stopped: stopped, exit: code, limit: limit})
	if code != fc.wantExit {
		t.Errorf("draind exit %d, want %d; log:\n%s", code, fc.wantExit, p.draindLog.String())
	}
	if phase != fc.wantPhase {
		t.Errorf("last phase before the exit %q, want %q; log:\n%s", phase, fc.wantPhase, p.draindLog.String())
	}
	if !respected {
		t.Errorf("limit not respected: %s", limit)
	}
	if exited := p.logLines(logevent.Phase); len(exited) == 0 || exited[len(exited)-1]["phase"] != "exited" {
		t.Errorf("draind's last phase line is not \"exited\"; log:\n%s", p.draindLog.String())
	}
}

// lastPhase is the last phase draind entered before "exited" ("": none).
func lastPhase(p *pod) string {
	last := ""
	for _, l := range p.logLines(logevent.Phase) {
		if ph, _ := l["phase"].(string); ph != "exited" {
			last = ph
		}
	}
	return last
}

func phaseName(p string) string {
	if p == "" {
		return "starting"
	}
	return p
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func dashIfZero(n int, counted bool) string {
	if !counted {
		return "–"
	}
	return fmt.Sprint(n)
}

// TestReliabilityDraindKilled kills draind with SIGKILL mid-drain (the
// kubelet's SIGKILL at the end of the grace period, an OOM kill), as PID 1
// of its container and as the child of an init: the proxy goes with it
// (the PID namespace's end; the parent-death signal), and no BPF program,
// map or link of draind's stays loaded.
func TestReliabilityDraindKilled(t *testing.T) {
	requireBpftool(t)
	for _, underInit := range []bool{false, true} {
		name := "pid1"
		if underInit {
			name = "under-init"
		}
		t.Run(name, func(t *testing.T) {
			p := newPod(t)
			p.draindUnderInit = underInit
			p.startApp("--on-term", "ignore") // holds the drain open
			before := bpfLive(t)
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
			pid := p.draindPid()
			proxy := p.watchProxy()
			held := bpfHeld(pid)
			during := bpfLive(t)
			if len(held["prog"]) == 0 || len(held["map"]) == 0 {
				t.Fatalf("draind (pid %d) holds no BPF program or map: %s", pid, held)
			}
			p.terminate()
			p.waitLog(10*time.Second, logevent.Phase, map[string]any{"phase": "gating"})
			self := watchPid(t, pid, "draind")
			killed := time.Now()
			p.drainedAt = killed
			if err := unix.Kill(pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if !proxy.waitGone(5 * time.Second) {
				t.Fatalf("the proxy outlived a SIGKILLed draind by 5 s")
			}
			proxyGone := proxy.at.Sub(killed)
			self.waitGone(5 * time.Second)
			draindGone := self.at.Sub(killed)
			bpfGone := waitBPFGone(t, held, killed, 10*time.Second)
			after := bpfLive(t)
			how := "the PID namespace's end (draind was its PID 1)"
			if underInit {
				how = "the parent-death signal (draind under an init: the container lives on)"
				if left := childPids(p.draind.Pid()); len(left) != 0 {
					t.Errorf("the init still has children %v after draind's death", left)
				}
				if p.draind.ended() {
					t.Errorf("the container ended with draind: the test did not isolate the parent-death signal")
				}
			} else if !p.draind.wait(5 * time.Second) {
				t.Errorf("draind's container did not end")
			}
			if p.app.ended() {
				t.Errorf("the app's container ended with draind's")
			}
			t.Logf("draind (%s) SIGKILLed mid-drain: draind itself gone after %s, the proxy after %s by %s; draind's BPF objects (%s) gone after %s; machine-wide before %s, during %s, after %s",
				name, draindGone, proxyGone, how, held, bpfGone, before, during, after)
			record(t, outcome{name: "draind SIGKILLed, " + map[bool]string{false: "PID 1 of its container", true: "child of an init"}[underInit],
				injected: "SIGKILL to draind while gating (the app ignores SIGTERM)", attempted: "–", failed: "–",
				stopped: fmt.Sprintf("%s after the SIGKILL, by %s (draind itself gone after %s)", secs(proxyGone), how, secs(draindGone)), exit: 128 + int(syscall.SIGKILL),
				limit: fmt.Sprintf("%s: no proxy left; draind's %s unloaded %s after the kill (bpftool, machine-wide: %d before, %d during, %d after)",
					yesNo(true), held, secs(bpfGone), before.count(), during.count(), after.count())})
		})
	}
}
