package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
)

// 1. Idle pod, app exits on SIGTERM: draind exits 0 soon after min-drain;
// readiness is 503 from the first probe after SIGTERM.
func TestIdlePodAppExits(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "exit")
	p.startDraind([]string{"--min-drain", "500ms"})
	p.terminate()
	// Signal delivery is asynchronous: the first probe after draind has
	// taken the signal (it logs the draining phase) must see 503.
	p.waitLog(5*time.Second, logevent.Phase, map[string]any{"phase": "draining"})
	if got := p.readyStatus(); got != 503 {
		t.Errorf("first readiness probe after the drain began: %d, want 503", got)
	}
	code, took := p.waitExit(10 * time.Second)
	t.Logf("idle pod: draind exited %d, %s after SIGTERM (min-drain 500ms)", code, took)
	if code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, p.draindLog.String())
	}
	if took < 500*time.Millisecond {
		t.Errorf("exited %s after SIGTERM: before min-drain", took)
	}
}

// 1b. An app that ignores SIGTERM holds draind (--app-exit wait) until it
// is killed, and draind says so; with no kill, the deadline ends it.
func TestAppIgnoringSIGTERM(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "20s", "--app-procs", "ebpf"})
		p.wantSources("", "ebpf")
		p.terminate()
		time.Sleep(1500 * time.Millisecond)
		select {
		case <-p.draind.done:
			t.Fatalf("draind exited (%d) while the app still ran; log:\n%s", p.draind.code, p.draindLog.String())
		default:
		}
		if !p.gateHeldBy(drain.HoldAppProcs) {
			t.Errorf("log does not say the app's process holds the drain:\n%s", p.draindLog.String())
		}
		killed := time.Now()
		p.app.Kill()
		code, _ := p.waitExit(10 * time.Second)
		t.Logf("draind exited %d, %s after the app was killed", code, time.Since(killed))
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "4s", "--stop-timeout", "500ms"})
		p.terminate()
		code, took := p.waitExit(10 * time.Second)
		t.Logf("draind exited %d, %s after SIGTERM (deadline 4s)", code, took)
		if len(p.logLines(logevent.DeadlineReached)) != 1 {
			t.Errorf("no deadline line in the log:\n%s", p.draindLog.String())
		}
		if took < 2*time.Second || code != 0 {
			t.Errorf("exit %d after %s: before the deadline's gate part (4s less 2s of stop steps)", code, took)
		}
	})
}

// 2. A 5 s request in flight at SIGTERM completes through Envoy; draind
// stops Envoy right after the app is done and the last downstream flow
// closed, and exits 0.
func TestLongRequestCompletes(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful")
	p.startDraind([]string{"--min-drain", "200ms"})
	done := inFlight(t, p.client, "http://"+podIP+":15006"+slowPath(5*time.Second))
	p.terminate()
	r := <-done
	if r.Err != nil || r.Code != 200 {
		t.Fatalf("in-flight request: %d %q %v; log:\n%s", r.Code, r.Body, r.Err, p.draindLog.String())
	}
	p.client.CloseIdleConnections() // the client hangs up, as Connection: close asks
	code, took := p.waitExit(15 * time.Second)
	_, _, appExit := p.appResults()
	stopping := p.phaseTime("stopping")
	last := r.At
	if appExit.After(last) {
		last = appExit
	}
	t.Logf("request done %s after SIGTERM (Connection: close %v); app exited at +%s; quitquitquit at +%s: %s after the later of the two; draind exit %d at +%s",
		r.At.Sub(p.drainedAt), r.Close, appExit.Sub(p.drainedAt), stopping.Sub(p.drainedAt), stopping.Sub(last), code, took)
	if code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, p.draindLog.String())
	}
	if stopping.Before(r.At) || stopping.Before(appExit) {
		t.Errorf("proxy stopped before the request finished or the app exited")
	}
}

// 3. The app calls out through Envoy during its own 3 s shutdown: every
// call succeeds and Envoy stops only after the app exited.
func TestAppOutboundDuringShutdown(t *testing.T) {
	for _, tc := range []struct{ name, tracker, procs, liveness string }{
		{"ebpf", "ebpf", "ebpf", "ebpf"},
		{"sockdiag", "sockdiag", "off", "sockets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.startApp("--on-term", "graceful", "--outbound-for", "4s", "--outbound-pause", "500ms")
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", tc.tracker, "--app-procs", tc.procs})
			p.wantSources(tc.tracker, tc.liveness)
			p.terminate()
			code, took := p.waitExit(20 * time.Second)
			stopping := p.phaseTime("stopping")
			// Let the app finish its own shutdown before reading its results.
			appDone := make(chan struct{})
			go func() { <-p.app.done; close(appDone) }()
			select {
			case <-appDone:
			case <-time.After(15 * time.Second):
				t.Errorf("app still running 15 s after SIGTERM")
			}
			ok, fail, appExit := p.appResults()
			t.Logf("%s: %d calls ok, %d failed; app exited +%s; quitquitquit +%s (%s after app exit); draind exit %d at +%s",
				tc.name, ok, fail, appExit.Sub(p.drainedAt), stopping.Sub(p.drainedAt), stopping.Sub(appExit), code, took)
			if tc.tracker == "sockdiag" {
				// The socket approximation may end in a pause between
				// calls (that is why processes are followed by default):
				// what it promises is that the proxy stays until the app's
				// listener and its in-flight calls are gone.
				gating := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "stopping"})
				if code != 0 || ok == 0 || gating["flows"].(map[string]any)["app_listeners"] != float64(0) {
					t.Errorf("exit %d, %d calls ok; stopped with %v; log:\n%s", code, ok, gating["flows"], p.draindLog.String())
				}
				return
			}
			if fail > 0 || ok < 4 {
				t.Errorf("%d calls ok, %d failed", ok, fail)
			}
			if code != 0 || appExit.IsZero() || stopping.Before(appExit) {
				t.Errorf("exit %d; proxy stopped at %s, app exited at %s; log:\n%s", code, stopping, appExit, p.draindLog.String())
			}
		})
	}
}

// 4. An idle keep-alive connection held open forever, to an app that
// stays (it ignores SIGTERM and keeps its listener; --app-exit flows):
// --idle-timeout ends the drain about that long after the flow went idle;
// without it the deadline does, naming the flow. (Once the app is gone,
// such a flow holds nothing: TestParkedKeepAliveAfterAppExit.)
func TestIdleKeepAlive(t *testing.T) {
	run := func(t *testing.T, args []string) (*pod, time.Duration, int) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		// The connection stays open (no closer as the min-drain ends): the
		// gate's rule for it is the subject.
		p.startDraind(append([]string{"--min-drain", "200ms", "--app-exit", "flows", "--close-idle-keepalives=false"}, args...))
		// A keep-alive client: one request, then the connection idles.
		resp, err := p.client.Get("http://" + podIP + ":15006/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		idleFrom := time.Now()
		p.terminate()
		code, _ := p.waitExit(20 * time.Second)
		return p, time.Since(idleFrom), code
	}
	t.Run("idle-timeout", func(t *testing.T) {
		_, took, code := run(t, []string{"--idle-timeout", "2s", "--drain-deadline", "15s"})
		t.Logf("--idle-timeout 2s: drain ended %s after the flow went idle (exit %d)", took, code)
		if code != 0 || took < 2*time.Second || took > 10*time.Second {
			t.Errorf("exit %d after %s", code, took)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		p, took, code := run(t, []string{"--drain-deadline", "3s", "--stop-timeout", "500ms"})
		t.Logf("no idle timeout: drain ended %s after the flow went idle (exit %d)", took, code)
		named := false
		for _, l := range p.logLines(logevent.OpenFlowAtDeadline) {
			if strings.HasSuffix(fmt.Sprint(l["local"]), ":15006") && strings.HasPrefix(fmt.Sprint(l["remote"]), remoteIP) {
				named = true
			}
		}
		if !named {
			t.Errorf("the deadline log does not name the idle flow:\n%s", p.draindLog.String())
		}
	})
}

// 4b. Once the app is gone, a client's pooled keep-alive (one request
// answered, then idle) holds Envoy no more: a request on it could only get
// a 503, while stopping Envoy closes it and the client's next request goes
// elsewhere. A large response Envoy is still delivering to a slow reader
// holds it to the last byte (its send queue keeps the flow busy).
func TestParkedKeepAliveAfterAppExit(t *testing.T) {
	p := newPod(t)
	p.startApp("--on-term", "graceful")
	// The keep-alive stays open (no closer as the min-drain ends): the
	// gate's rule for it is the subject.
	p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "20s", "--close-idle-keepalives=false"})
	dial := func() net.Conn {
		c, err := p.remote.Dialer()(t.Context(), "tcp4", podIP+":15006")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	pooled := dial()
	pooledR := bufio.NewReader(pooled)
	io.WriteString(pooled, "GET / HTTP/1.1\r\nHost: app\r\n\r\n")
	resp, err := http.ReadResponse(pooledR, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	const mib = 16
	slow := dial()
	io.WriteString(slow, fmt.Sprintf("GET /big?mib=%d HTTP/1.1\r\nHost: app\r\n\r\n", mib))
	slowR := bufio.NewReaderSize(slow, 64<<10)
	resp, err = http.ReadResponse(slowR, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.terminate()
	// 64 KiB every 20 ms: about 3 MiB/s, 5 s for the whole body.
	var got int64
	buf := make([]byte, 64<<10)
	for {
		n, err := io.ReadFull(resp.Body, buf)
		got += int64(n)
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	bodyAt := time.Now()
	if got != mib<<20 {
		t.Errorf("the slow reader got %d bytes of %d: the response was cut; log:\n%s", got, mib<<20, p.draindLog.String())
	}
	// The pooled connection: closed by Envoy's stop (EOF), not by the deadline.
	pooled.SetReadDeadline(time.Now().Add(25 * time.Second))
	_, perr := pooledR.ReadByte()
	closedAt := time.Now()
	code, _ := p.waitExit(25 * time.Second)
	_, _, appExit := p.appResults()
	stopping := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "stopping"})
	t.Logf("app exited +%s; slow body done +%s; Envoy stopped +%s (%s after the app exited); pooled connection closed +%s (%v); draind exit %d",
		appExit.Sub(p.drainedAt).Round(time.Millisecond), bodyAt.Sub(p.drainedAt).Round(time.Millisecond),
		logTime(stopping).Sub(p.drainedAt).Round(time.Millisecond), logTime(stopping).Sub(appExit).Round(time.Millisecond),
		closedAt.Sub(p.drainedAt).Round(time.Millisecond), perr, code)
	if errors.Is(perr, os.ErrDeadlineExceeded) || perr == nil {
		t.Errorf("the pooled connection was not closed (%v)", perr)
	}
	if code != 0 || stopping["why"] != "drained" || len(p.logLines(logevent.DeadlineReached)) != 0 {
		t.Errorf("exit %d, stopping %v; want 0, drained, no deadline; log:\n%s", code, stopping["why"], p.draindLog.String())
	}
	if appExit.IsZero() || logTime(stopping).Before(appExit) {
		t.Errorf("Envoy stopped at %s, before the app exited (%s)", logTime(stopping), appExit)
	}
	if !p.gateHeldBy(drain.HoldEnvoyActive) && !p.gateHeldBy(drain.HoldEnvoyKernel) {
		t.Errorf("the gate never held on Envoy's connections (the slow response); log:\n%s", p.draindLog.String())
	}
}

// 5. The proxy crashes mid-drain: draind exits non-zero at once. The admin
// API hangs: draind still exits by its deadline. A second SIGTERM changes
// nothing.
func TestProxyFailures(t *testing.T) {
	t.Run("crash", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "20s"}, "--crash-after", "3s")
		p.terminate()
		code, took := p.waitExit(10 * time.Second)
		t.Logf("crash: draind exit %d at +%s (proxy crashed ~3 s after start)", code, took)
		if code == 0 {
			t.Fatalf("exit 0 after a proxy crash; log:\n%s", p.draindLog.String())
		}
	})
	t.Run("admin-hangs", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "ignore")
		p.startDraind([]string{"--min-drain", "200ms", "--drain-deadline", "4s", "--stop-timeout", "500ms"})
		// Envoysim's test hook turns its admin API into a black hole.
		setFault(t, p, `{"admin":"hang"}`)
		p.terminate()
		code, took := p.waitExit(15 * time.Second)
		t.Logf("admin hangs: draind exit %d at +%s (deadline 4s, stop-timeout 500ms)", code, took)
		// The drain was lost (drain_listeners never went through), the
		// deadline ended it, and the proxy, unreachable by its admin API,
		// was stopped by SIGTERM: exit 0, inside the deadline.
		if len(p.logLines(logevent.DrainListenersGaveUp)) != 1 || len(p.logLines(logevent.DeadlineReached)) != 1 {
			t.Errorf("the lost drain or the deadline is not in the log:\n%s", p.draindLog.String())
		}
		if code != 0 || took > 8*time.Second {
			t.Errorf("draind exit %d after %s with a hung admin API", code, took)
		}
	})
	t.Run("second-sigterm", func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "graceful", "--outbound-for", "1s")
		p.startDraind([]string{"--min-drain", "300ms"})
		p.terminate()
		time.Sleep(100 * time.Millisecond)
		p.draind.Signal(syscall.SIGTERM)
		code, _ := p.waitExit(10 * time.Second)
		if code != 0 || len(p.logLines(logevent.TriggerIgnored)) != 1 || len(p.logLines(logevent.Phase)) == 0 {
			t.Errorf("exit %d; log:\n%s", code, p.draindLog.String())
		}
		draining := 0
		for _, l := range p.logLines(logevent.Phase) {
			if l["phase"] == "draining" {
				draining++
			}
		}
		if draining != 1 {
			t.Errorf("%d draining phases, want 1", draining)
		}
	})
}

// setFault posts to envoysim's test hook from inside the pod.
func setFault(t *testing.T, p *pod, body string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: p.ns.Dialer()}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("http://127.0.0.1:15000/envoysim/fault", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("set fault: %d %s", resp.StatusCode, b)
	}
}

// 7. draind wait exits 0 once the proxy turns LIVE after a start-up delay,
// non-zero on timeout.
func TestWaitCommand(t *testing.T) {
	p := newPod(t)
	p.envoyStartupDelay = 2 * time.Second
	p.startDraindNoWait(nil)
	// The postStart hook runs in the proxy's container: here, one of its own.
	wait := func(timeout string) (int, time.Duration, string) {
		var out syncBuffer
		start := time.Now()
		c := p.runContainer("wait", -1, &out, "__draind", "wait", "--url", "http://127.0.0.1:15020/healthz/ready", "--timeout", timeout, "--period", "100ms")
		if !c.wait(30 * time.Second) {
			t.Fatal("draind wait did not return")
		}
		return c.code, time.Since(start), out.String()
	}
	code, took, out := wait("500ms")
	if code == 0 {
		t.Errorf("wait with 500ms timeout before LIVE: exit 0")
	}
	t.Logf("wait --timeout 500ms: exit %d after %s: %s", code, took, strings.TrimSpace(out))
	code, took, out = wait("20s")
	t.Logf("wait --timeout 20s: exit %d after %s", code, took)
	if code != 0 {
		t.Errorf("wait: exit %d: %s", code, out)
	}
}
