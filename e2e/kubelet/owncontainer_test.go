package kubelet_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/e2e/kubelet/internal/ociimage"
	"github.com/draind/draind/internal/logevent"
)

// Who is the app, under the kubelet: nothing of the proxy's own container
// is (issue 20). The pod harness (e2e/owncontainer_linux_test.go) covers
// the same shapes with more variations; these run them as a kubelet does:
// an image whose entrypoint is an init wrapper, a postStart hook the
// kubelet execs into the proxy's container.

// tiniSrc is Debian's statically linked tini (package tini, which
// hack/e2e.sh installs), copied into imgDraindTini as /usr/bin/tini.
const tiniSrc = "/usr/bin/tini-static"

// tiniMissing says why imgDraindTini was not built, when it was not.
var tiniMissing error

// tiniImage is the draind image as one built FROM a base whose entrypoint
// is an init wrapper: ENTRYPOINT ["tini", "--", "draind", "run", "--",
// "envoy"], run as root (draind starts the proxy as 1337 with
// DRAIND_RUN_PROXY_AS). It also carries posthook, the Job's postStart
// hook. Not built (and its tests skip) without tini on the host.
func tiniImage(bin func(string) string) (ociimage.Spec, bool) {
	if _, err := os.Stat(tiniSrc); err != nil {
		tiniMissing = fmt.Errorf("no %s (apt-get install tini): %w", tiniSrc, err)
		return ociimage.Spec{}, false
	}
	return ociimage.Spec{
		Ref: imgDraindTini,
		Files: []ociimage.File{
			{Src: tiniSrc, Dst: "/usr/bin/tini"},
			{Src: bin("draind"), Dst: "/usr/local/bin/draind", Caps: imageFileCaps},
			{Src: bin("envoysim"), Dst: "/usr/local/bin/envoysim"},
			{Src: bin("posthook"), Dst: "/usr/local/bin/posthook"},
		},
		Dirs:       []string{"/tmp"},
		Entrypoint: []string{"/usr/bin/tini", "--", "/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoysim"},
		Cmd:        []string{"-c", "/work/envoysim.json"},
		User:       "0",
	}, true
}

func requireTiniImage(t *testing.T) {
	t.Helper()
	requireNode(t)
	if tiniMissing != nil {
		t.Skip(tiniMissing)
	}
}

// rootEBPF is the documented securityContext for draind as root, starting
// the proxy as 1337 (docs/kubernetes.md): drop ALL, add BPF, PERFMON,
// SETUID, SETGID, KILL, SETPCAP, no privilege escalation.
func rootEBPF() *corev1.SecurityContext {
	return securityContext(0, true, "BPF", "PERFMON", "SETUID", "SETGID", "KILL", "SETPCAP")
}

// stoppedAfter is when draind told the proxy to quit (its log's
// quit_sent_unix_ns), and why, relative to at.
func stoppedAfter(logs []map[string]any, at time.Time) (d time.Duration, why string, ok bool) {
	r := findLogWith(logs, logevent.Phase, "phase", "stopping")
	if r == nil {
		return 0, "", false
	}
	why, _ = r["why"].(string)
	sent := logTime(r)
	if ns, ok := r["quit_sent_unix_ns"].(float64); ok {
		sent = time.Unix(0, int64(ns))
	}
	return sent.Sub(at), why, true
}

// appExitStamp is the app's own "exit UNIXNANO CODE" line in its result
// file, written right before it exits: the process's exit, which the CRI's
// container exit follows by a few ms, and by 100–250 ms in a shared PID
// namespace (containerd's shim then kills what is left of the container
// before it reports the exit).
func appExitStamp(pd *pod) time.Time {
	b, _ := os.ReadFile(filepath.Join(pd.dir, "app.result"))
	at := time.Time{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "exit" {
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				at = time.Unix(0, ns)
			}
		}
	}
	return at
}

// ownContainer is what draind logged as its own container's processes.
func ownContainer(logs []map[string]any) []string {
	var out []string
	for _, r := range logs {
		if r[logevent.Key] != string(logevent.OwnContainer) {
			continue
		}
		procs, _ := r["processes"].([]any)
		for _, p := range procs {
			out = append(out, fmt.Sprint(p))
		}
	}
	return out
}

func hasComm(procs []string, comm string) bool {
	for _, p := range procs {
		// "PID COMM uid UID"
		if f := strings.Fields(p); len(f) > 1 && f[1] == comm {
			return true
		}
	}
	return false
}

// An image whose entrypoint is tini (root, draind its child, the proxy run
// as 1337); the app in its own container; classic termination (the kubelet
// SIGTERMs both at once: tini forwards it to draind). The wrapper is
// draind's own, never the app: the proxy is told to quit as soon as the app
// has exited, not at the drain deadline, and the wrapper's container exits
// 0.
func TestInitWrapperEntrypoint(t *testing.T) {
	requireTiniImage(t)
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("tini-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			pd := startPod(t, "owncontainer.yaml", podParams{
				Name: name, ShareProcessNamespace: share, AppArgs: gracefulAppArgs(),
				DraindImage: imgDraindTini, SecurityContext: rootEBPF(),
				// The image's entrypoint; the pod gives Envoy's args and
				// draind's settings in the environment.
				DraindArgs: []string{"-c", "/work/envoysim.json", "--drain-time-s", "45", "--drain-strategy", "immediate"},
				DraindEnv:  []corev1.EnvVar{{Name: "DRAIND_RUN_PROXY_AS", Value: "1337"}, {Name: "DRAIND_MIN_DRAIN", Value: "2s"}},
			})
			o := terminateUnderLoad(t, pd)
			o.log(t, name)
			logs := pd.draindLog(-1)
			own := ownContainer(logs)
			appExit := appExitStamp(pd)
			quit, why, stopped := stoppedAfter(logs, appExit)
			t.Logf("%s: own container as draind logged it: %q; the proxy told to quit %s after the app's exit (target 0–50 ms; the app's container exit in the CRI: %s after the app's): %s; wrapper's container exit %d",
				name, own, fmtDur(quit), fmtDur(o.appExit.Sub(appExit)), why, o.proxyCode)
			report.add("scenario", name+": app exit → proxy told to quit", fmtDur(quit)+" (target 0–50 ms); own container "+strings.Join(own, ", "))
			o.checkProtected(t)
			if !hasComm(own, "tini") {
				t.Errorf("draind's own container, as logged, has no tini: %q", own)
			}
			if appExit.IsZero() || !stopped || quit < 0 || quit > stopFollowsWithin || strings.Contains(why, "deadline") {
				t.Errorf("the proxy told to quit %s after the app's exit (%q, seen %v): want soon after, not at the deadline", fmtDur(quit), why, stopped)
			}
			if o.trigger != "signal" {
				t.Errorf("drain trigger %q, want signal (tini forwards the kubelet's SIGTERM)", o.trigger)
			}
		})
	}
}

// hookStamps reads posthook's stamp file: when draind wait returned (and
// its exit code) and when the hook did.
func hookStamps(path string) (waitReturned time.Time, waitCode int, hookDone time.Time) {
	b, _ := os.ReadFile(path)
	waitCode = -1
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch {
		case f[0] == "returned" && len(f) == 3:
			waitReturned = time.Unix(0, ns)
			waitCode, _ = strconv.Atoi(f[2])
		case f[0] == "done":
			hookDone = time.Unix(0, ns)
		}
	}
	return waitReturned, waitCode, hookDone
}

// A Job (restartPolicy Never) whose proxy container runs as root (the
// proxy as 1337), listed before the app, with the postStart hook
// `draind wait` and --exit-with-app success (given bare with separate PID
// namespaces, as DRAIND_EXIT_WITH_APP=success with a shared one). The hook is posthook:
// draind wait, then 3 s more in the proxy's container, so the kubelet
// starts the app's container 3 s after draind wait returned with no app
// process alive meanwhile, while root processes of the proxy's container
// exit 0 (draind wait, then posthook): the old bug's trigger. The proxy
// must still be up when the app starts, stop right after its exit 0, and
// the pod Succeed.
func TestJobRootProxyPostStartHook(t *testing.T) {
	requireTiniImage(t)
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("job-root-hook-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			stampPath := "/work/hook.stamp"
			// The mode both ways: --exit-with-app bare (right before
			// "--"), and its environment twin.
			flags, env := []string{"--run-proxy-as", "1337", "--exit-with-app"}, []corev1.EnvVar{{Name: "DRAIND_MIN_DRAIN", Value: "0s"}}
			if share {
				flags, env = flags[:2], append(env, corev1.EnvVar{Name: "DRAIND_EXIT_WITH_APP", Value: "success"})
			}
			pd := startPod(t, "owncontainer.yaml", podParams{
				Name: name, RestartPolicy: "Never", ShareProcessNamespace: share,
				DraindImage: imgDraindTini, SecurityContext: rootEBPF(),
				DraindCommand: draindCommand(flags), DraindEnv: env,
				PostStart: []string{"/usr/local/bin/posthook", "--then", "3s", "--stamp", stampPath, "--", "/usr/local/bin/draind", "wait", "--period", "100ms"},
				AppArgs:   []string{"--job", "--job-delay", "1s", "--calls", "10", "--result", "/work/app.result"},
				NoServer:  true,
			})
			startUpstream(t, pd.n.Config().Gateway) // the task calls out 1 s after it starts
			phase := ""
			for end := time.Now().Add(45 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if phase = pd.kubeletPhase(); phase == "Succeeded" || phase == "Failed" {
					break
				}
			}
			pd.waitContainersExited(3 * time.Second)
			waitReturned, waitCode, hookDone := hookStamps(filepath.Join(pd.dir, filepath.Base(stampPath)))
			calls, _, _ := pd.appCalls(1 << 30)
			app, px := pd.container("app"), pd.firstAttempt("draind")
			if app == nil || px == nil {
				t.Fatalf("containers not seen (app %v, draind %v); phase %s", app, px, phase)
			}
			logs := pd.draindLog(0)
			mode, trigger := "", ""
			if r := findLog(logs, logevent.PodShape); r != nil {
				mode = fmt.Sprint(r["exit_with_app"])
			}
			var drainAt time.Time
			if r := findLogWith(logs, logevent.Phase, "phase", "draining"); r != nil {
				trigger, drainAt = fmt.Sprint(r["trigger"]), logTime(r)
			}
			appExit := appExitStamp(pd)
			quit, why, stopped := stoppedAfter(logs, appExit)
			t.Logf("%s: draind wait returned (exit %d), the hook %s later, the app container started %s after draind wait returned; app exit %d, %d/%d calls ok/failed; exit-with-app %s, drain trigger %q %s after the app's exit; proxy told to quit %s after it (%s); containers' exits in the CRI: the app's %s after its exit, draind's (exit %d) %s after the app's; pod %s",
				name, waitCode, fmtDur(hookDone.Sub(waitReturned)), fmtDur(app.started.Sub(waitReturned)), app.exitCode, calls.ok, calls.fail,
				mode, trigger, fmtDur(drainAt.Sub(appExit)), fmtDur(quit), why, fmtDur(app.finished.Sub(appExit)), px.exitCode, fmtDur(px.finished.Sub(app.finished)), phase)
			report.add("job", name, fmt.Sprintf("draind wait→app start %s; app exit 0 → proxy told to quit %s; app container exit → draind's (exit %d) %s; calls %d/%d-failed; phase %s",
				fmtDur(app.started.Sub(waitReturned)), fmtDur(quit), px.exitCode, fmtDur(px.finished.Sub(app.finished)), calls.ok, calls.fail, phase))
			if phase != "Succeeded" {
				t.Errorf("pod phase %q, want Succeeded", phase)
			}
			if mode != "success" {
				t.Errorf("--exit-with-app: mode %q, want success", mode)
			}
			if waitReturned.IsZero() || waitCode != 0 || hookDone.IsZero() {
				t.Fatalf("the postStart hook did not run to completion: draind wait returned %v (exit %d), the hook done %v", waitReturned, waitCode, hookDone)
			}
			if d := app.started.Sub(waitReturned); d < 3*time.Second || d > 6*time.Second {
				t.Errorf("the app started %s after draind wait returned, want about 3 s (after the hook)", fmtDur(d))
			}
			// Up when the app started: neither drained nor exited before.
			if !px.finished.IsZero() && px.finished.Before(app.started) || !drainAt.IsZero() && drainAt.Before(app.started) {
				t.Errorf("the proxy drained at %v / exited at %v, before the app started at %v", drainAt, px.finished, app.started)
			}
			if app.exitCode != 0 || calls.ok != 10 || calls.fail != 0 {
				t.Errorf("the task: exit %d, %d calls ok, %d failed; want 0, 10, 0", app.exitCode, calls.ok, calls.fail)
			}
			if trigger != "app-done" || px.exitCode != 0 || px.finished.IsZero() || px.finished.Before(appExit) {
				t.Errorf("drain trigger %q, draind exit %d at %v, the app's at %v: want app-done, 0, after the app", trigger, px.exitCode, px.finished, appExit)
			}
			if appExit.IsZero() || !stopped || quit < 0 || quit > stopFollowsWithin {
				t.Errorf("the proxy told to quit %s after the app's exit (%q, seen %v): want soon after", fmtDur(quit), why, stopped)
			}
		})
	}
}
