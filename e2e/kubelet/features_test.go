package kubelet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// draindHas asks the draind binary built for the images whether it has a
// feature: a command (its -h succeeds) or a run flag (named in run -h).
func draindHas(t *testing.T, feature string) bool {
	t.Helper()
	bin := filepath.Join(binDir, "draind")
	if cmd, ok := strings.CutPrefix(feature, "command "); ok {
		return exec.Command(bin, cmd, "-h").Run() == nil
	}
	out, _ := exec.Command(bin, "run", "-h").CombinedOutput()
	return bytes.Contains(out, []byte(feature))
}

// requireFeature skips a scenario whose draind feature is missing, unless
// DRAIND_E2E_FORCE_FEATURES=1 asks to run it anyway (to watch the kubelet's
// side of it).
func requireFeature(t *testing.T, feature, what string) {
	t.Helper()
	if !draindHas(t, feature) && os.Getenv("DRAIND_E2E_FORCE_FEATURES") != "1" {
		t.Skipf("draind has no %s yet (%s): the lead is adding it", feature, what)
	}
}

// A native sidecar: the kubelet runs draind's preStop (draind drain) and
// SIGTERMs the app at termination; it SIGTERMs draind only after the app
// exited, and draind, already drained, exits at once.
func TestNativeSidecar(t *testing.T) {
	requireNode(t)
	requireFeature(t, "command drain", "`draind drain`, the native sidecar's preStop hook")
	pd := startPod(t, "native.yaml", podParams{
		Name:    "native",
		AppArgs: []string{"--on-term", "graceful", "--calls", "30", "--call-pause", "100ms", "--result", "/work/app.result"},
	})
	o := terminateUnderLoad(t, pd)
	o.log(t, "native", pd.removedAt)
	appTerm, draindTerm := pd.killedAt("app"), pd.killedAt("draind")
	t.Logf("native: app SIGTERM at +%s, app exit at +%s; draind SIGTERM at +%s (%s after the app exited), draind exit %s after its SIGTERM",
		fmtDur(appTerm.Sub(pd.removedAt)), fmtDur(o.appExit.Sub(pd.removedAt)), fmtDur(draindTerm.Sub(pd.removedAt)),
		fmtDur(draindTerm.Sub(o.appExit)), fmtDur(o.proxyExit.Sub(draindTerm)))
	report.add("scenario", "native sidecar SIGTERM→exit", fmtDur(o.proxyExit.Sub(draindTerm)))
	if o.shortFail > 0 || o.longFail > 0 || o.callsFail > 0 {
		t.Errorf("failures: %d short, %d long, %d calls", o.shortFail, o.longFail, o.callsFail)
	}
	if draindTerm.Before(o.appExit) {
		t.Errorf("the kubelet SIGTERMed the sidecar before the app exited")
	}
	if d := o.proxyExit.Sub(draindTerm); d > 50*time.Millisecond {
		t.Errorf("draind exited %s after its SIGTERM, want within 50ms", fmtDur(d))
	}
}

// A Job's pod with a classic sidecar: the app runs to completion with
// code 0, and draind run --exit-with-app drains and stops the proxy, so
// the pod reaches Succeeded with no change to the app.
func TestJobExitWithApp(t *testing.T) {
	requireNode(t)
	requireFeature(t, "exit-with-app", "`draind run --exit-with-app`, for Jobs")
	// The env twin, as deploy/job-exit-with-app.yaml sets it (a draind
	// without the feature ignores it: the pod then never completes).
	pd := startPod(t, "classic.yaml", podParams{
		Name: "job", RestartPolicy: "Never",
		AppArgs:   []string{"--job", "--job-delay", "3s", "--calls", "10", "--result", "/work/app.result"},
		DraindEnv: []corev1.EnvVar{{Name: "DRAIND_EXIT_WITH_APP", Value: "true"}},
		NoServer:  true,
	})
	startUpstream(t, pd.n.Config().Gateway) // the bridge exists now; the task calls out after 3 s
	phase := ""
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if phase = pd.kubeletPhase(); phase == "Succeeded" || phase == "Failed" {
			break
		}
	}
	ok, fail, _ := pd.appResults()
	app, px := pd.container("app"), pd.container("draind")
	if app == nil || px == nil {
		t.Fatalf("job: containers not seen (app %v, draind %v)", app, px)
	}
	proxyAfter := "proxy still running"
	if !px.finished.IsZero() && !app.finished.IsZero() {
		proxyAfter = fmt.Sprintf("proxy exit %d %s after the app", px.exitCode, fmtDur(px.finished.Sub(app.finished)))
	}
	t.Logf("job: pod phase %s; app calls %d ok / %d failed; app exit %d; %s", phase, ok, fail, app.exitCode, proxyAfter)
	report.add("scenario", "job --exit-with-app", fmt.Sprintf("phase=%s calls=%d/%d-failed %s", phase, ok, fail, proxyAfter))
	if phase != "Succeeded" || fail > 0 {
		t.Errorf("pod phase %s, %d failed calls", phase, fail)
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
// the container, the new draind finds the app already running, and the
// app's shutdown is still protected.
func TestSidecarRestartedWhileAppRuns(t *testing.T) {
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("restart-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			pd := startPod(t, "classic.yaml", podParams{
				Name: name, ShareProcessNamespace: share,
				AppArgs: []string{"--on-term", "graceful", "--calls", "30", "--call-pause", "100ms", "--result", "/work/app.result"},
			})
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
			o := terminateUnderLoad(t, pd)
			o.log(t, name, pd.removedAt)
			live := findLog(pd.draindLog(int(second.attempt)), "app liveness")
			t.Logf("%s: draind restarted (attempt %d) and ready %s after SIGKILL; its app liveness: %v", name, second.attempt, fmtDur(restarted), live)
			report.add("scenario", name+" restart→ready", fmtDur(restarted))
			if o.callsFail > 0 || o.callsOK != 30 || o.longFail > 0 || o.shortFail > 0 {
				t.Errorf("failures after a sidecar restart: %d calls (%d ok), %d long, %d short", o.callsFail, o.callsOK, o.longFail, o.shortFail)
			}
			if o.proxyExit.Before(o.appExit) {
				t.Errorf("the proxy exited %s before the app", fmtDur(o.appExit.Sub(o.proxyExit)))
			}
		})
	}
}

// containerPID is the host PID of a container's PID 1 (CRI verbose status).
func containerPID(t *testing.T, pd *pod, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := pd.n.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
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
