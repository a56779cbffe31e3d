package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// Load, churn and ring-buffer overrun: the drain under traffic.

// loadStats counts what the load's clients saw.
type loadStats struct {
	mu        sync.Mutex
	ok        int
	failed    int
	fails     []string
	lastClose time.Time // the last client connection closed
	byDrain   int       // connections closed after a Connection: close
	lastDrain time.Time // the last of those
	// byStop counts the idle connections the proxy hung up on (it
	// stopped) before their client's pool closed them.
	byStop int
}

func (s *loadStats) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed++
	if len(s.fails) < 5 {
		s.fails = append(s.fails, fmt.Sprintf(format, args...))
	}
}

func (s *loadStats) closed(drain, byProxy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastClose = time.Now()
	if drain {
		s.byDrain++
		s.lastDrain = s.lastClose
	}
	if byProxy {
		s.byStop++
	}
}

func (s *loadStats) snapshot() (ok, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok, s.failed
}

// loadConn is one client connection: a request (GET /slow?ms=10, a
// keep-alive) every period from its first moment, until a response says
// Connection: close (Envoy is draining: a real client would now go to
// another endpoint) or an error. With idle set it makes one request, then
// idles until idleClose is closed (a client pool's idle timeout) and
// hangs up.
func loadConn(c net.Conn, first time.Time, period time.Duration, idle bool, idleClose <-chan struct{}, s *loadStats) {
	br := bufio.NewReader(c)
	for at := first; ; at = at.Add(period) {
		time.Sleep(time.Until(at))
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, "GET /slow?ms=10 HTTP/1.1\r\nHost: pod\r\n\r\n"); err != nil {
			s.fail("write: %v", err)
			c.Close()
			return
		}
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			s.fail("request: %v", err)
			c.Close()
			return
		}
		s.mu.Lock()
		s.ok++
		s.mu.Unlock()
		if resp.Close {
			c.Close()
			s.closed(true, false)
			return
		}
		if idle {
			hungUp := make(chan struct{})
			go func() { br.ReadByte(); close(hungUp) }() // EOF: the proxy closed it
			select {
			case <-idleClose:
				c.Close()
				<-hungUp
				s.closed(false, false)
			case <-hungUp:
				c.Close()
				s.closed(false, true)
			}
			return
		}
	}
}

// dialMany opens n connections to addr from the remote namespace.
func dialMany(t *testing.T, p *pod, n int, addr string) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	dial := p.remote.Dialer()
	for range 16 {
		wg.Go(func() {
			for i := range next {
				c, err := dial(context.Background(), "tcp", addr)
				if err != nil {
					errs <- err
					continue
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// fdCount counts a process's open files.
func fdCount(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// TestReliabilityLoad: 2,000 concurrent client connections (200 in the
// short run) through Envoy's inbound listener, one request every 2 s each
// (1,000 requests/s), across SIGTERM, with an app that shuts down
// gracefully (it serves 4 s more, then finishes what is in flight), and 20
// idle keep-alive connections that their client's pool would close 6 s
// after SIGTERM. No request fails; the proxy is told to quit after the
// last connection that carried a request closed (on Connection: close)
// and the app exited, within milliseconds (reported; asserted only within
// a generous 2 s): the idle ones, parked once the app is gone, hold
// nothing (drain.EnvoyDrained), and the proxy's stop closes them.
func TestReliabilityLoad(t *testing.T) {
	conns := pick(200, 2000)
	const (
		period    = 2 * time.Second
		idleConns = 20
		linger    = 4 * time.Second
		idleAfter = 6 * time.Second // after SIGTERM
	)
	p := newPod(t)
	p.startApp("--on-term", "graceful", "--linger", linger.String())
	// Envoy's drain alone: the raw clients below never look at an idle
	// connection before they send on it, so the untold keep-alives' FIN
	// would fail their next request, where any HTTP library dials again
	// (make bench-keepalive).
	p.startDraind([]string{"--min-drain", "1s", "--tracker", "ebpf", "--app-procs", "ebpf", "--close-idle-keepalives=false"})
	proxy := p.watchProxy()
	draindDone, draindAt := p.watchDraind()

	cs := dialMany(t, p, conns+idleConns, podIP+":15006")
	var stats loadStats
	idleClose := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now().Add(100 * time.Millisecond)
	for i, c := range cs {
		idle := i >= conns
		first := start.Add(time.Duration(i%conns) * period / time.Duration(conns))
		wg.Go(func() { loadConn(c, first, period, idle, idleClose, &stats) })
	}
	// Two full periods of steady load, then the kubelet's SIGTERM.
	time.Sleep(time.Until(start.Add(2 * period)))
	okBefore, failBefore := stats.snapshot()
	proxyFDs, draindFDs := fdCount(proxy.pid), fdCount(p.draindPid())
	flowsBefore := p.metric(`draind_tracked_flows{class="proxy_flows"}`)
	p.terminate()
	time.AfterFunc(idleAfter, func() { close(idleClose) })
	code := p.awaitExit(draindDone, proxy, 40*time.Second, "SIGTERM")
	wg.Wait()
	p.app.wait(10 * time.Second)
	_, _, appExit := p.appResults()
	quit := p.phaseTime("stopping")
	last := stats.lastDrain
	if appExit.After(last) {
		last = appExit
	}
	rel := func(at time.Time) string { return secs(at.Sub(p.drainedAt)) }
	t.Logf("%d connections + %d idle, %d requests ok before SIGTERM (%d failed), %d in all (%d failed, %d connections closed on Connection: close); "+
		"before SIGTERM: proxy %d fds, draind %d fds, %v proxy flows tracked",
		conns, idleConns, okBefore, failBefore, stats.ok+stats.failed, stats.failed, stats.byDrain, proxyFDs, draindFDs, flowsBefore)
	t.Logf("after SIGTERM: app exited %s, last busy connection closed %s, /quitquitquit %s (%s after the later), proxy exited %s (%s after it), draind exited %d at %s; %d of %d idle connections closed by the proxy's stop, the last flow closed %s",
		rel(appExit), rel(stats.lastDrain), rel(quit), quit.Sub(last), rel(proxy.at), proxy.at.Sub(last), code, rel(*draindAt), stats.byStop, idleConns, rel(stats.lastClose))
	for _, f := range stats.fails {
		t.Logf("failure: %s", f)
	}
	record(t, outcome{name: fmt.Sprintf("load: %d connections across SIGTERM", conns),
		injected:  fmt.Sprintf("%d keep-alive connections, a request every 2 s each (%d req/s), %d idle ones closed by their client at +6 s; graceful app (serves 4 s more)", conns, conns/2, idleConns),
		attempted: fmt.Sprint(stats.ok + stats.failed), failed: fmt.Sprint(stats.failed),
		stopped: fmt.Sprintf("%s; /quitquitquit %.1f ms and proxy exit %.1f ms after the later of the app's exit and the last busy connection's close (app exit %s, that close %s); the %d idle ones closed by the stop",
			rel(proxy.at), float64(quit.Sub(last).Microseconds())/1000, float64(proxy.at.Sub(last).Microseconds())/1000, rel(appExit), rel(stats.lastDrain), stats.byStop),
		exit: code,
		limit: fmt.Sprintf("%s: quit after the last busy connection and the app (%s); within %s of it; proxy %d fds, draind %d fds at peak (limit 20000)",
			yesNo(!quit.Before(last) && quit.Sub(last) < stopFollowsWithin), yesNo(!quit.Before(last)), stopFollowsWithin, proxyFDs, draindFDs)})
	if stats.failed > 0 || code != 0 {
		t.Errorf("%d requests failed, draind exit %d; log:\n%s", stats.failed, code, p.draindLog.String())
	}
	if stats.byDrain != conns {
		t.Errorf("%d of %d connections were closed by Envoy's drain (Connection: close)", stats.byDrain, conns)
	}
	if quit.IsZero() || quit.Before(last) || quit.Sub(last) > stopFollowsWithin {
		t.Errorf("/quitquitquit at %s, the last busy connection closed at %s and the app exited at %s", quit, stats.lastDrain, appExit)
	}
	if stats.byStop != idleConns {
		t.Errorf("%d of %d idle connections closed by the proxy's stop, want all (parked once the app was gone)", stats.byStop, idleConns)
	}
}

// keepAlive makes one request through Envoy's inbound listener on a
// client of its own and leaves the connection idle: a flow that holds the
// drain until the client closes it.
func keepAlive(t *testing.T, p *pod) *http.Client {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	resp, err := hc.Get("http://" + podIP + ":15006/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return hc
}

// sigtermDraindOnly starts the drain without telling the app: it serves
// on, so traffic can reach it from inside the pod while draind gates.
func sigtermDraindOnly(t *testing.T, p *pod) {
	t.Helper()
	p.drainedAt = time.Now()
	p.draind.Signal(syscall.SIGTERM)
	p.waitLog(10*time.Second, logevent.Phase, map[string]any{"phase": "gating"})
}

// lostResynced checks that every lost event was followed by a resync: the
// last "resynced after lost events" line covers the lost count given.
func lostResynced(p *pod, lost float64) bool {
	if lost == 0 {
		return true
	}
	lines := p.logLines(logevent.Resynced)
	return len(lines) > 0 && lines[len(lines)-1]["lost"] == lost
}

func describeTable(c tableCheck, tries int) string {
	s := fmt.Sprintf("%d listeners and %d holding flows, %d difference(s) (attempt %d); closing states: %d in draind's table, %d in the snapshot (TIME_WAIT is left out of the table)",
		c.listeners, c.holding, len(c.diffs), tries, c.closingTracker, c.closingFresh)
	if len(c.ownerDiffs) > 0 {
		s += fmt.Sprintf("; owner differs for %d: %s", len(c.ownerDiffs), strings.Join(c.ownerDiffs, "; "))
	}
	return s
}

// tableCell is the comparison in a few words, for the results table.
func tableCell(c tableCheck) string {
	return fmt.Sprintf("table = fresh snapshot: %d listeners, %d holding flows, %d differences", c.listeners, c.holding, len(c.diffs))
}

// TestReliabilityChurn: 20,000 short connections (2,000 in the short run)
// opened and closed against the app's port from inside the pod while the
// drain gates, held by an idle keep-alive through Envoy. Afterwards the
// tracker's table equals a fresh sock_diag snapshot (listeners and holding
// flows), every lost event was followed by a resync, and the gate still
// decides right: it holds while the app runs, opens when it exits.
func TestReliabilityChurn(t *testing.T) {
	n := pick(2000, 20000)
	p := newPod(t)
	p.startApp("--on-term", "exit")
	// The keep-alive stays open (no closer as the min-drain ends): the
	// gate's rule for it is the subject.
	p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf", "--drain-deadline", "60s", "--close-idle-keepalives=false"})
	proxy := p.watchProxy()
	draindDone, _ := p.watchDraind()
	held := keepAlive(t, p)
	sigtermDraindOnly(t, p)

	t0 := time.Now()
	failed := p.churn(n, 8, "127.0.0.1:8080", false)
	churnTook := time.Since(t0)
	time.Sleep(300 * time.Millisecond) // the lost-event check runs 50 ms after a burst
	select {
	case <-draindDone:
		t.Fatalf("draind exited during the churn with the app alive and a flow held; log:\n%s", p.draindLog.String())
	default:
	}
	c, tries := p.waitTableMatches(5)
	lost := p.metric("draind_tracker_lost_events_total")
	resyncs := p.metric("draind_tracker_resyncs_total")
	t.Logf("churn: %d connections in %s (%.0f/s), %d failed; tracker vs snapshot: %s; lost events %v, resyncs %v",
		n, churnTook, float64(n)/churnTook.Seconds(), failed, describeTable(c, tries), lost, resyncs)
	for _, d := range c.diffs {
		t.Errorf("table differs: %s", d)
	}

	// The held flow closes: the app's process still holds the gate.
	held.CloseIdleConnections()
	time.Sleep(500 * time.Millisecond)
	if p.draind.ended() {
		t.Fatalf("draind exited while the app still ran; log:\n%s", p.draindLog.String())
	}
	appTerm := time.Now()
	p.app.Signal(syscall.SIGTERM)
	code := p.awaitExit(draindDone, proxy, 20*time.Second, "the app's SIGTERM")
	_, _, appExit := p.appResults()
	quit := p.phaseTime("stopping")
	uncorrected := !lostResynced(p, lost)
	record(t, outcome{name: fmt.Sprintf("churn: %d connections while gating", n),
		injected:  fmt.Sprintf("%d connections to the app's port from inside the pod in %s (%.0f/s; a third with a request, a third reset), a keep-alive through Envoy holding the gate", n, secs(churnTook), float64(n)/churnTook.Seconds()),
		attempted: fmt.Sprint(n), failed: fmt.Sprint(failed),
		stopped: fmt.Sprintf("%s after SIGTERM; /quitquitquit %.1f ms after the app's exit", secs(proxy.at.Sub(p.drainedAt)), float64(quit.Sub(appExit).Microseconds())/1000),
		exit:    code,
		limit: fmt.Sprintf("%s: %s; lost events %v, resyncs %v, none uncorrected; gate held while the app ran, opened %s after its SIGTERM",
			yesNo(len(c.diffs) == 0 && !uncorrected && code == 0), tableCell(c), lost, resyncs, secs(quit.Sub(appTerm)))})
	if failed > 0 || code != 0 || uncorrected || quit.Before(appExit) {
		t.Errorf("%d connections failed, exit %d, lost %v uncorrected %v, quit %s app exit %s; log:\n%s", failed, code, lost, uncorrected, quit, appExit, p.draindLog.String())
	}
}

// TestReliabilityRingOverrun forces the eBPF ring buffer to overflow
// (--debug-ring-size 4096: a ring of a few dozen events) with bursts of
// connections while the drain gates on one held flow: a client's idle
// connection straight to the app's port (--app-exit flows: only the app's
// flows count, not its process). The loss is counted and a resync follows; the gate
// holds while the flow is open, and opens once it closed, even when its
// close event was one of those lost (it closes in the middle of the second
// burst); /metrics shows both counters.
func TestReliabilityRingOverrun(t *testing.T) {
	burst := pick(3000, 20000)
	p := newPod(t)
	p.startApp("--on-term", "exit")
	p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf", "--app-exit", "flows",
		"--debug-ring-size", "4096", "--drain-deadline", "60s"})
	proxy := p.watchProxy()
	draindDone, _ := p.watchDraind()
	held, err := p.remote.Dialer()(context.Background(), "tcp", podIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	sigtermDraindOnly(t, p)

	// Burst 1, the held flow open: the gate must stay closed.
	t0 := time.Now()
	failed := p.churn(burst, 4, "127.0.0.1:8080", true)
	took1 := time.Since(t0)
	time.Sleep(300 * time.Millisecond)
	lost1 := p.metric("draind_tracker_lost_events_total")
	resyncs1 := p.metric("draind_tracker_resyncs_total")
	if p.draind.ended() {
		t.Fatalf("the gate opened with the held flow still open; log:\n%s", p.draindLog.String())
	}
	appInbound := p.metric(`draind_tracked_flows{class="app_inbound"}`)
	c, tries := p.waitTableMatches(5)
	t.Logf("burst 1: %d connections in %s, %d failed; lost %v, resyncs %v; app inbound flows tracked %v; table: %s",
		burst, took1, failed, lost1, resyncs1, appInbound, describeTable(c, tries))
	if lost1 == 0 {
		t.Errorf("a burst of %d connections did not overrun a 4 KiB ring: no loss counted", burst)
	}
	if !lostResynced(p, lost1) || resyncs1 < 1 {
		t.Errorf("lost %v, resyncs %v: a loss without its resync; log:\n%s", lost1, resyncs1, p.draindLog.String())
	}
	if appInbound != 1 {
		t.Errorf("draind tracks %v app inbound flows after the burst, want the 1 held", appInbound)
	}
	for _, d := range c.diffs {
		t.Errorf("table differs: %s", d)
	}

	// Burst 2: the held flow closes in its middle.
	done := make(chan int, 1)
	go func() { done <- p.churn(burst, 4, "127.0.0.1:8080", true) }()
	time.Sleep(took1 / 2)
	closedAt := time.Now()
	held.Close()
	failed += <-done
	burstEnd := time.Now()
	code := p.awaitExit(draindDone, proxy, 20*time.Second, "the held flow closed")
	quit := p.phaseTime("stopping")
	resyncLines := p.logLines(logevent.Resynced)
	lostEnd := lost1
	if len(resyncLines) > 0 {
		lostEnd, _ = resyncLines[len(resyncLines)-1]["lost"].(float64)
	}
	t.Logf("burst 2: held flow closed at +%s of it, burst ended %s later; /quitquitquit %s after the close; %d resyncs after losses logged, last covering %v lost",
		took1/2, burstEnd.Sub(closedAt), quit.Sub(closedAt), len(resyncLines), lostEnd)
	record(t, outcome{name: "ring buffer overrun (--debug-ring-size 4096)",
		injected:  fmt.Sprintf("two bursts of %d connect/reset pairs to the app's port (first in %s) while gating on one held flow; the flow closes mid-burst 2", burst, secs(took1)),
		attempted: fmt.Sprint(2 * burst), failed: fmt.Sprint(failed),
		stopped: fmt.Sprintf("%s after SIGTERM; /quitquitquit %s after the held flow closed (burst ended %s after it)", secs(proxy.at.Sub(p.drainedAt)), secs(quit.Sub(closedAt)), secs(burstEnd.Sub(closedAt))),
		exit:    code,
		limit: fmt.Sprintf("%s: after burst 1 /metrics: draind_tracker_lost_events_total %v, draind_tracker_resyncs_total %v; gate held (1 app flow); %s; gate opened after the close; %d resyncs logged in all, the last covering %v lost",
			yesNo(lost1 > 0 && resyncs1 >= 1 && len(c.diffs) == 0 && !quit.Before(closedAt) && code == 0), lost1, resyncs1, tableCell(c), len(resyncLines), lostEnd)})
	if code != 0 || quit.Before(closedAt) {
		t.Errorf("exit %d; quit at %s, the held flow closed at %s; log:\n%s", code, quit, closedAt, p.draindLog.String())
	}
}
