package kubelet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/draind/draind/internal/logevent"
)

// A native sidecar: at termination the kubelet runs draind's preStop hook
// (draind drain: the drain starts, draind returns at once) alongside the
// app's SIGTERM; it would SIGTERM draind only after the app exited, but
// draind, seeing the app gone, stops Envoy as soon as its last flows are
// done, without waiting for it, and the kubelet does not restart it.
func TestNativeSidecar(t *testing.T) {
	pd := startPod(t, "native.yaml", podParams{Name: "native", AppArgs: gracefulAppArgs()})
	o := terminateUnderLoad(t, pd)
	o.log(t, "native")
	hook := o.preStopDone.Sub(o.preStop)
	exit := o.proxyExit.Sub(o.appExit)
	// Where the sidecar's last moments go: draind's own log (ms) between
	// the app's exit and the container's end in the CRI.
	logs := pd.draindLog(-1)
	seen, stop, exited := logTime(findLog(logs, logevent.AppGoneEndsAwait)), logTime(findLogWith(logs, logevent.Phase, "phase", "stopping")), logTime(findLogWith(logs, logevent.Phase, "phase", "exited"))
	steps := fmt.Sprintf("app's exit → draind sees it gone %s → Envoy asked to quit %s → draind's exit log %s → the CRI's finish %s",
		fmtDur(seen.Sub(o.appExit)), fmtDur(stop.Sub(seen)), fmtDur(exited.Sub(stop)), fmtDur(o.proxyExit.Sub(exited)))
	t.Logf("native: preStop draind drain took %s; draind exited %s after the app (target 50 ms); the kubelet's StopContainer for it %s after the app: %s",
		fmtDur(hook), fmtDur(exit), fmtDur(o.draindTerm.Sub(o.appExit)), steps)
	report.add("scenario", "native: preStop hook took", fmtDur(hook))
	report.add("scenario", "native: app exit → draind exit", fmtDur(exit)+" (target 50 ms): "+steps)
	report.add("scenario", "native: app exit → the kubelet's SIGTERM (not waited for)", fmtDur(o.draindTerm.Sub(o.appExit)))
	if o.preStop.IsZero() || o.preStopDone.IsZero() {
		t.Fatalf("the kubelet did not run draind's preStop hook to completion (ran at %s, completed at %s)", o.rel(o.preStop), o.rel(o.preStopDone))
	}
	if o.trigger != "prestop-hook" {
		t.Errorf("drain trigger %q, want prestop-hook (draind drain)", o.trigger)
	}
	// The kubelet's ordering: the hook with the app's SIGTERM, draind's
	// own turn only after the app exited.
	if d := o.appTerm.Sub(o.preStop); d < -time.Second || d > time.Second {
		t.Errorf("app SIGTERM at %s, draind's preStop at %s: want them together", o.rel(o.appTerm), o.rel(o.preStop))
	}
	if !o.draindTerm.IsZero() && o.draindTerm.Before(o.appExit) {
		t.Errorf("draind SIGTERMed at %s, the app exited at %s: want after", o.rel(o.draindTerm), o.rel(o.appExit))
	}
	if seen.IsZero() {
		t.Errorf("draind did not log the app seen gone (%s): %d log records, %v at exit", logevent.AppGoneEndsAwait, len(logs), findLogWith(logs, logevent.Phase, "phase", "exited"))
	}
	if n := len(pd.attempts(pd.proxyName())); n != 1 {
		t.Errorf("draind's container ran %d times, want once: the kubelet must not restart a sidecar that ends during the pod's termination", n)
	}
	if hook > 2*time.Second {
		t.Errorf("draind drain took %s: it must return at once", fmtDur(hook))
	}
	o.checkProtected(t)
}

// jobRow is one Job pod: the app's task (10 calls through the proxy after
// 2 s, then its exit code) and draind's --exit-with-app.
type jobRow struct {
	name, mode  string // DRAIND_EXIT_WITH_APP
	restart     string // the pod's restartPolicy
	appArgs     []string
	share       bool                    // shareProcessNamespace
	sc          *corev1.SecurityContext // draind's; nil: the documented eBPF one
	wantPhase   string                  // "Running": the pod does not complete
	wantAppRuns int                     // the app container's attempts
	wantRefusal string                  // draind refuses the mode at start (exit 2) with this
}

// A Job's pod with a classic sidecar: the app runs to completion and
// draind run --exit-with-app (its env twin, as deploy/job-exit-with-app.yaml
// sets it) drains and stops the proxy, so the pod completes with no change
// to the app. Which mode for which restartPolicy, measured: Never with
// `any` (a failed task fails the pod after the 1 s restart grace; with
// `success` it would stay Running), OnFailure with `success` (the kubelet
// restarts the failed task, the proxy stays for it).
func TestJobExitWithApp(t *testing.T) {
	noCaps := securityContext(1337, true)
	for _, r := range []jobRow{
		{name: "job", mode: "true", restart: "Never", wantPhase: "Succeeded", wantAppRuns: 1},
		{name: "job-any-failed", mode: "any", restart: "Never", appArgs: []string{"--exit-code", "1"}, wantPhase: "Failed", wantAppRuns: 1},
		{name: "job-success-failed", mode: "success", restart: "Never", appArgs: []string{"--exit-code", "1"}, wantPhase: "Running", wantAppRuns: 1},
		{name: "job-onfailure", mode: "success", restart: "OnFailure", appArgs: []string{"--fail-once", "/work/failed-once"}, wantPhase: "Succeeded", wantAppRuns: 2},
		{name: "job-proc-any", mode: "any", restart: "Never", share: true, sc: noCaps, wantPhase: "Succeeded", wantAppRuns: 1},
		{name: "job-nocaps-success", mode: "success", restart: "Never", sc: noCaps, wantPhase: "Failed", wantAppRuns: 1,
			wantRefusal: "--exit-with-app success: the app's processes cannot be followed here"},
	} {
		t.Run(r.name, func(t *testing.T) { runJob(t, r) })
	}
}

func runJob(t *testing.T, r jobRow) {
	pd := startPod(t, "classic.yaml", podParams{
		Name: r.name, RestartPolicy: r.restart, ShareProcessNamespace: r.share, SecurityContext: r.sc,
		AppArgs: append([]string{"--job", "--job-delay", scaled(2 * time.Second).String(), "--calls", "10", "--result", "/work/app.result"}, r.appArgs...),
		// As deploy/job-exit-with-app.yaml: no --min-drain (no endpoint
		// to leave), the mode from the environment.
		DraindCommand: draindCommand(nil),
		DraindEnv:     []corev1.EnvVar{{Name: "DRAIND_EXIT_WITH_APP", Value: r.mode}, {Name: "DRAIND_MIN_DRAIN", Value: "0s"}},
		NoServer:      true,
		NoWait:        r.wantRefusal != "",
	})
	startUpstream(t, pd.n.Config().Gateway) // the bridge exists now; the task calls out after 2 s (scaled)
	phase := ""
	var appDone time.Time
	for end := time.Now().Add(45 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if phase = pd.kubeletPhase(); phase == "Succeeded" || phase == "Failed" {
			break
		}
		// A pod expected not to complete: watch it for 4 s after the app's exit.
		if a := pd.container("app"); r.wantPhase == "Running" && a != nil && !a.finished.IsZero() {
			if appDone.IsZero() {
				appDone = time.Now()
			}
			if time.Since(appDone) > 4*time.Second {
				break
			}
		}
	}
	pd.waitContainersExited(3 * time.Second)
	calls, _, _ := pd.appCalls(1 << 30)
	app, px := pd.container("app"), pd.firstAttempt("draind")
	if app == nil || px == nil {
		t.Fatalf("containers not seen (app %v, draind %v)", app, px)
	}
	proxy := "proxy still running"
	if !px.finished.IsZero() && !app.finished.IsZero() {
		proxy = fmt.Sprintf("proxy exit %d %s after the app", px.exitCode, fmtDur(px.finished.Sub(app.finished)))
	}
	logs := pd.draindLog(0)
	trigger, liveness := "", ""
	if rec := findLogWith(logs, logevent.Phase, "phase", "draining"); rec != nil {
		trigger = fmt.Sprint(rec["trigger"])
	}
	if rec := findLog(logs, logevent.AppLiveness); rec != nil {
		liveness = fmt.Sprint(rec["source"])
	}
	_, stderr := splitCRILog(px.log)
	refusal := errorLine(stderr)
	apps := pd.attempts("app")
	runs := len(apps)
	if runs > 1 {
		t.Logf("%s: the kubelet restarted the task %s after its exit", r.name, fmtDur(apps[1].started.Sub(apps[0].finished)))
	}
	t.Logf("%s: restartPolicy %s, DRAIND_EXIT_WITH_APP=%s, app liveness %s: pod phase %s; app ran %d time(s), last exit %d; calls %d ok / %d failed; %s; drain trigger %q",
		r.name, r.restart, r.mode, liveness, phase, runs, app.exitCode, calls.ok, calls.fail, proxy, trigger)
	result := fmt.Sprintf("restartPolicy=%s liveness=%s phase=%s app-runs=%d last-exit=%d calls=%d/%d-failed %s", r.restart, liveness, phase, runs, app.exitCode, calls.ok, calls.fail, proxy)
	if r.wantRefusal != "" {
		t.Logf("%s: draind exit %d: %s", r.name, px.exitCode, refusal)
		result += fmt.Sprintf(" draind refused: exit %d %s", px.exitCode, refusal)
	}
	report.add("job", r.name+" exit-with-app="+r.mode, result)
	if phase != r.wantPhase || runs != r.wantAppRuns {
		t.Errorf("pod phase %s (want %s), the app ran %d times (want %d)", phase, r.wantPhase, runs, r.wantAppRuns)
	}
	switch {
	case r.wantRefusal != "":
		if px.exitCode != 2 || !strings.Contains(refusal, r.wantRefusal) {
			t.Errorf("draind exit %d %q, want 2 and %q", px.exitCode, refusal, r.wantRefusal)
		}
		return
	case r.wantPhase == "Running":
		if !px.finished.IsZero() {
			t.Errorf("the proxy exited after a failed task under --exit-with-app success")
		}
	case trigger != "app-done" || px.exitCode != 0 || px.finished.Before(app.finished):
		t.Errorf("drain trigger %q, proxy exit %d at %v, app exit at %v: want app-done, 0, after the app", trigger, px.exitCode, px.finished, app.finished)
	}
	if calls.fail > 0 || calls.ok != 10*r.wantAppRuns {
		t.Errorf("calls %d ok / %d failed, want %d ok", calls.ok, calls.fail, 10*r.wantAppRuns)
	}
}

// kubeletPhase is the pod's phase as the kubelet reports it (/pods).
func (pd *pod) kubeletPhase() string {
	resp, err := http.Get(pd.n.Config().ReadOnlyURL() + "/pods")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var list corev1.PodList
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return ""
	}
	for _, p := range list.Items {
		if p.Name == pd.full {
			return string(p.Status.Phase)
		}
	}
	return ""
}

// The sidecar's PID 1 is killed while the app runs; the kubelet restarts
// the container, the new draind finds the app already running (in its own
// PID namespace or a shared one), and the app's shutdown is still
// protected.
func TestSidecarRestartedWhileAppRuns(t *testing.T) {
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("restart-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			pd := startPod(t, "classic.yaml", podParams{Name: name, ShareProcessNamespace: share, AppArgs: gracefulAppArgs()})
			first := pd.container("draind")
			pid := containerPID(t, pd, first.id)
			killed := time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill draind (pid %d): %v", pid, err)
			}
			var second *ctrRecord
			for end := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if c := pd.container("draind"); c != nil && c.attempt > first.attempt && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING && pd.get(statusPort, "/healthz/ready") == 200 {
					second = c
					break
				}
				if time.Now().After(end) {
					pd.dumpLogs()
					t.Fatalf("draind not restarted and ready 60 s after its PID 1 was killed")
				}
			}
			restarted := time.Since(killed)
			if app := pd.container("app"); app == nil || app.attempt != 0 || app.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
				t.Fatalf("the app did not keep running across the sidecar's restart: %+v", app)
			}
			o := terminateUnderLoad(t, pd)
			o.log(t, name)
			t.Logf("%s: draind restarted (attempt %d) and ready %s after SIGKILL; its app liveness: %s, app processes %v", name, second.attempt, fmtDur(restarted), o.liveness, o.livenessAppProcs)
			report.add("scenario", name+" restart→ready", fmtDur(restarted))
			o.checkProtected(t)
			if n, ok := o.livenessAppProcs.(float64); !ok || n < 1 {
				t.Errorf("the restarted draind found %v app processes, want the running app's", o.livenessAppProcs)
			}
		})
	}
}

// containerPID is the host PID of a container's PID 1 (CRI verbose status).
func containerPID(t *testing.T, pd *pod, id string) int {
	t.Helper()
	return criContainerPID(t, pd.n.Runtime, id)
}

// criContainerPID is a container's PID on the node, from the CRI's
// verbose status.
func criContainerPID(t *testing.T, rt runtimeapi.RuntimeServiceClient, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("no pid in the CRI's verbose status: %v", err)
	}
	return info.Pid
}
