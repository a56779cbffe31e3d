package e2e

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// Who is the app: nothing of the proxy's own container is. These pods put
// root processes in the proxy's container beside draind, as real pods do:
// an init wrapper as its PID 1, the kubelet's postStart hook, `kubectl
// exec` sessions. Each runs in both PID namespace shapes: a PID namespace a
// container (the default), and one shared by the pod
// (shareProcessNamespace: true), where every container still has a mount
// namespace of its own.

// tiniPath is Debian's tini (package tini), statically linked: the init
// wrapper many proxy images run as PID 1.
const tiniPath = "/usr/bin/tini-static"

func requireTini(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(tiniPath); err != nil {
		t.Skipf("no %s (apt-get install tini): %v", tiniPath, err)
	}
}

// An init wrapper is the proxy container's PID 1, root, draind its child;
// the app in its own container; classic SIGTERM to both. The wrapper is
// draind's (never the app): the proxy is told to quit as soon as the app
// has exited, not at the deadline, and the wrapper exits 0.
func TestInitWrapperInProxyContainer(t *testing.T) {
	requireTini(t)
	for _, tc := range []struct {
		name     string
		sharePID bool
		procs    string
	}{
		{"own-pid-namespaces", false, "ebpf"},
		{"shareProcessNamespace", true, "ebpf"},
		{"shareProcessNamespace-proc", true, "proc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.sharePID = tc.sharePID
			// -s: a subreaper when tini is not PID 1 (a shared PID
			// namespace, where pause is). tini forwards SIGTERM to its
			// child, draind.
			p.draindWrapper = []string{tiniPath, "-s", "--"}
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", tc.procs})
			p.startApp("--on-term", "graceful", "--outbound-count", "12", "--outbound-pause", "250ms")
			p.wantSources("ebpf", tc.procs)
			if !ownContainerHas(p, "tini") {
				t.Errorf("draind's own container, as logged, has no tini; log:\n%s", p.draindLog.String())
			}
			// The /proc backend sees the app at its next poll.
			for end := time.Now().Add(5 * time.Second); p.metric("draind_app_processes") != 1; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("draind sees %v app processes, want 1 (the app); log:\n%s", p.metric("draind_app_processes"), p.draindLog.String())
				}
			}
			p.terminate() // SIGTERM to tini, which forwards it to draind
			code, _ := p.waitExit(20 * time.Second)
			if !p.app.wait(10 * time.Second) {
				t.Fatal("the app did not exit")
			}
			ok, fail, appExit := p.appResults()
			quit := p.phaseTime("stopping")
			t.Logf("%s: %d of 12 calls ok, %d failed; quitquitquit %s after the app's exit; wrapper exit %d",
				tc.name, ok, fail, quit.Sub(appExit), code)
			if ok != 12 || fail != 0 || code != 0 {
				t.Errorf("%d calls ok, %d failed, wrapper exit %d; log:\n%s", ok, fail, code, p.draindLog.String())
			}
			if appExit.IsZero() || quit.Before(appExit) {
				t.Errorf("the proxy was told to quit at %s, before the app exited at %s", quit, appExit)
			}
			if r := stopReason(p); strings.Contains(r, "deadline") {
				t.Errorf("the drain ended at the deadline (%s): the wrapper was taken for the app; log:\n%s", r, p.draindLog.String())
			}
		})
	}
}

// A Job whose proxy container runs as root (the proxy as 1337) with the
// postStart hook `draind wait`, started bare as `--exit-with-app`: the hook
// and root processes exec'd into the proxy container before the app
// starts and while it runs exit 0 and change nothing; the app's container
// starts 3 s after the hook returned; the proxy stops after the app's exit
// 0 and draind exits 0.
func TestJobPostStartHookInProxyContainer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sharePID bool
	}{
		{"own-pid-namespaces", false},
		{"shareProcessNamespace", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.sharePID = tc.sharePID
			p.startDraindNoWait([]string{"--exit-with-app", "--app-procs", "ebpf"})
			hookOut := &syncBuffer{}
			hook := p.execIn(p.draind, hookOut, p.bin, "__draind", "wait", "--period", "50ms", "--timeout", "20s")
			if err := hook.Wait(); err != nil {
				t.Fatalf("postStart draind wait: %v: %s; log:\n%s", err, hookOut.String(), p.draindLog.String())
			}
			hookDone := time.Now()
			if got := p.waitLog(5*time.Second, logevent.PodShape, nil)["exit_with_app"]; got != "success" {
				t.Errorf("bare --exit-with-app: mode %v, want success", got)
			}
			// `kubectl exec` into the proxy's container before the app
			// starts: root processes that exit 0.
			for range 3 {
				execAndWait(t, p, "/bin/sh", "-c", "exit 0")
			}
			select {
			case <-p.draind.done:
				t.Fatalf("draind exited %d before the app started; log:\n%s", p.draind.code, p.draindLog.String())
			case <-time.After(time.Until(hookDone.Add(3 * time.Second))):
			}
			appStart := time.Now()
			p.startApp("--run-for", "2s", "--exit-code", "0")
			if p.readyStatus() != 200 {
				t.Errorf("the proxy is not ready when the app starts")
			}
			// And while it runs.
			execAndWait(t, p, "/bin/sh", "-c", "sleep 0.2; exit 0")
			select {
			case <-p.draind.done:
				t.Fatalf("draind exited %d while the app ran; log:\n%s", p.draind.code, p.draindLog.String())
			default:
			}
			if !p.app.wait(10 * time.Second) {
				t.Fatal("the app did not finish")
			}
			code, _ := p.waitExit(20 * time.Second)
			_, _, _, appExit := p.appCalls()
			quit := p.phaseTime("stopping")
			t.Logf("%s: app started %s after the hook returned; quitquitquit %s after the app's exit 0; draind exit %d",
				tc.name, appStart.Sub(hookDone), quit.Sub(appExit), code)
			if code != 0 || appExit.IsZero() || quit.Before(appExit) {
				t.Errorf("exit %d, quit at %s, app exit at %s; log:\n%s", code, quit, appExit, p.draindLog.String())
			}
			if got := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})["trigger"]; got != "app-done" {
				t.Errorf("drain trigger %v, want app-done", got)
			}
		})
	}
}

// execAndWait runs argv in the proxy's container as root and checks it
// exits 0.
func execAndWait(t *testing.T, p *pod, argv ...string) {
	t.Helper()
	var out syncBuffer
	if err := p.execIn(p.draind, io.Writer(&out), argv...).Wait(); err != nil {
		t.Fatalf("exec %v in the proxy's container: %v: %s", argv, err, out.String())
	}
}

// ownContainerHas reports whether draind logged comm among its own
// container's processes.
func ownContainerHas(p *pod, comm string) bool {
	for _, m := range p.logLines(logevent.OwnContainer) {
		procs, _ := m["processes"].([]any)
		for _, pr := range procs {
			if s, _ := pr.(string); strings.Contains(s, " "+comm) {
				return true
			}
		}
	}
	return false
}

// stopReason is the reason draind logged for stopping the proxy.
func stopReason(p *pod) string {
	for _, m := range p.logLines(logevent.Phase) {
		if m["phase"] == "stopping" {
			r, _ := m["why"].(string)
			return r
		}
	}
	return ""
}
