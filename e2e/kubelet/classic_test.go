package kubelet_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testapp"
)

// load is the client side of a termination: short requests until the
// manifest is removed (a load balancer stops sending new ones when the
// endpoint goes; here, at once), and long requests in flight across it.
type load struct {
	shortOK, shortFail atomic.Int64
	longMu             sync.Mutex
	longResults        []string
	longEnds           []time.Time // when each long request's response ended (or failed)
	longFail           int
	wg                 sync.WaitGroup
	stopShort          chan struct{}
	longFrom           time.Time // when the long requests were sent
}

// startLoad starts the load and returns once the long requests are in
// flight (or failed).
func startLoad(t *testing.T, pd *pod, long int, longFor time.Duration) *load {
	l := &load{stopShort: make(chan struct{})}
	url := fmt.Sprintf("http://%s:%d", pd.ip, inboundPort)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}
	l.wg.Go(func() {
		for {
			select {
			case <-l.stopShort:
				// The client leaves the endpoint: its keep-alive
				// connection closes (else it holds Envoy's drain).
				client.CloseIdleConnections()
				return
			default:
			}
			resp, err := client.Get(url + "/")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != 200 {
				l.shortFail.Add(1)
			} else {
				l.shortOK.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	l.longFrom = time.Now()
	for range long {
		start := time.Now()
		// Its own connection: a fresh transport per long request.
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
		reply, err := testapp.InFlight(t.Context(), c, fmt.Sprintf("%s/slow?ms=%d", url, longFor.Milliseconds()), 30*time.Second)
		l.wg.Go(func() {
			var r testapp.Reply
			if err == nil {
				r = <-reply
				err = r.Err
				c.CloseIdleConnections()
			}
			res := fmt.Sprintf("%d after %s", r.Code, fmtDur(time.Since(start)))
			l.longMu.Lock()
			defer l.longMu.Unlock()
			if err != nil || r.Code != 200 {
				l.longFail++
				if err != nil {
					res = fmt.Sprintf("error %v after %s", err, fmtDur(time.Since(start)))
				}
			}
			l.longResults = append(l.longResults, res)
			l.longEnds = append(l.longEnds, time.Now())
		})
	}
	return l
}

func (l *load) wait() {
	l.wg.Wait()
}

// The app's behaviour in the termination scenarios: on SIGTERM it stops
// accepting, finishes its in-flight requests and meanwhile makes
// shutdownCalls outbound calls through the proxy; then, its listener
// closed and no request in flight, tailCalls more, 300 ms apart (only its
// process tells that it is not done yet).
const (
	shutdownCalls = 30
	tailCalls     = 5
)

func gracefulAppArgs() []string {
	return []string{"--on-term", "graceful", "--calls", fmt.Sprint(shutdownCalls), "--call-pause", "100ms",
		"--tail-calls", fmt.Sprint(tailCalls), "--tail-pause", "300ms", "--result", "/work/app.result"}
}

// termination is what one termination of a pod measured: the kubelet's
// steps from its log, the containers' exits through the CRI, draind's
// readiness polled from the host, the clients' and the app's results.
type termination struct {
	removed              time.Time // the manifest was removed
	preStop, preStopDone time.Time // the kubelet ran draind's preStop hook (native sidecar), and it returned
	appTerm, draindTerm  time.Time // the kubelet's StopContainer (SIGTERM) of each
	notReady             time.Time // first non-200 of /healthz/ready, polled every 50 ms from the removal
	notReadyCode         int
	appExit, proxyExit   time.Time
	appCode, proxyCode   int32
	shortOK, shortFail   int64
	longFail             int
	longResults          []string
	longEnds             []time.Time
	calls, tail          callCount
	kubeletProbes        string // the kubelet's readiness results for draind after termination started
	trigger, shape       string // draind's drain: its trigger and the pod shape it logged
	tracker, liveness    string
	livenessAppProcs     any
	appCallFailures      []string
}

type callCount struct{ ok, fail int }

// start is when the kubelet began terminating the pod: its first preStop
// hook or StopContainer.
func (o *termination) start() time.Time {
	s := time.Time{}
	for _, t := range []time.Time{o.preStop, o.appTerm, o.draindTerm} {
		if !t.IsZero() && (s.IsZero() || t.Before(s)) {
			s = t
		}
	}
	if s.IsZero() {
		return o.removed
	}
	return s
}

// pollReadiness polls draind's readiness as the kubelet's probe would (an
// HTTP GET to the pod's address) until it fails or stop closes.
func pollReadiness(pd *pod, stop <-chan struct{}) (at time.Time, code int) {
	c := &http.Client{Timeout: scaled(500 * time.Millisecond), Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://%s:%d/healthz/ready", pd.ip, pd.statusPort())
	for {
		code := 0
		if resp, err := c.Get(url); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		if code != 200 {
			return time.Now(), code
		}
		select {
		case <-stop:
			return time.Time{}, 200
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// terminateUnderLoad runs a termination: short requests, two 7 s requests
// in flight, removal of the manifest while the app makes its calls
// through the proxy (gracefulAppArgs).
func terminateUnderLoad(t *testing.T, pd *pod) *termination {
	return terminateUnderLoadFor(t, pd, 7*time.Second)
}

// terminateUnderLoadFor is terminateUnderLoad with requests of longFor,
// started 1.5 s before the removal.
func terminateUnderLoadFor(t *testing.T, pd *pod, longFor time.Duration) *termination {
	startUpstream(t, pd.n.Config().Gateway)
	l := startLoad(t, pd, 2, longFor) // long requests in flight
	// The requests' age at the removal, not their being in flight: they
	// end longFor-1.5 s after it, as the scenario's figures assume.
	time.Sleep(time.Until(l.longFrom.Add(1500 * time.Millisecond)))
	pollStop := make(chan struct{})
	o := &termination{}
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		o.notReady, o.notReadyCode = pollReadiness(pd, pollStop)
	}()
	pd.remove()
	o.removed = pd.removedAt
	close(l.stopShort)
	l.wait()
	if !pd.waitContainersExited(45 * time.Second) {
		t.Errorf("containers still running 45 s after the manifest was removed")
	}
	close(pollStop)
	<-polled
	ev := pd.kubeletEvents()
	o.preStop = ev.first("Running preStop hook", pd.proxyName())
	o.preStopDone = ev.first("PreStop hook completed", pd.proxyName())
	o.appTerm = ev.first(killMsg, "app")
	o.draindTerm = ev.first(killMsg, pd.proxyName())
	o.shortOK, o.shortFail = l.shortOK.Load(), l.shortFail.Load()
	o.longFail, o.longResults, o.longEnds = l.longFail, l.longResults, l.longEnds
	o.calls, o.tail, o.appCallFailures = pd.appCalls(shutdownCalls)
	if app := pd.container("app"); app != nil {
		o.appExit, o.appCode = app.finished, app.exitCode
	}
	if px := pd.container(pd.proxyName()); px != nil {
		o.proxyExit, o.proxyCode = px.finished, px.exitCode
	}
	first, ok, failed := pd.readinessAfter(o.start())
	noStatus := 0
	for _, e := range ev {
		if e.msg == "No status for pod" && e.at.After(o.start()) {
			noStatus++
		}
	}
	// A removed static pod leaves the kubelet's pod manager at once and its
	// status at the next housekeeping (every 2 s); the probe worker then
	// skips each period with "No status for pod".
	o.kubeletProbes = fmt.Sprintf("%d ok / %d failed (first: %s), then %d probe periods skipped (No status for pod)", ok, failed, first, noStatus)
	logs := pd.draindLog(-1)
	if r := findLogWith(logs, logevent.Phase, "phase", "draining"); r != nil {
		o.trigger, o.shape = fmt.Sprint(r["trigger"]), fmt.Sprint(r["pod_shape"])
	}
	if r := findLog(logs, logevent.Tracker); r != nil {
		o.tracker = fmt.Sprintf("%v (%v)", r["mode"], r["reason"])
	}
	if r := findLog(logs, logevent.AppLiveness); r != nil {
		o.liveness = fmt.Sprintf("%v (%v)", r["source"], r["reason"])
		o.livenessAppProcs = r["app_processes"]
	}
	return o
}

// rel is t relative to the removal, or "-" when it did not happen.
func (o *termination) rel(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return "+" + fmtDur(t.Sub(o.removed))
}

func (o *termination) log(t *testing.T, name string) {
	t.Helper()
	t.Logf("%s: tracker %s; app liveness %s, app processes %v; drain trigger %s (%s)", name, o.tracker, o.liveness, o.livenessAppProcs, o.trigger, o.shape)
	t.Logf("%s: short requests %d ok / %d failed; long requests %v (%d failed); app calls during its shutdown %d ok / %d failed, after its last request %d ok / %d failed",
		name, o.shortOK, o.shortFail, o.longResults, o.longFail, o.calls.ok, o.calls.fail, o.tail.ok, o.tail.fail)
	for _, f := range o.appCallFailures {
		t.Logf("%s: app call failed: %s", name, f)
	}
	t.Logf("%s: from the removal: preStop %s (returned %s), app SIGTERM %s, draind SIGTERM %s; /healthz/ready first %d at %s (%s after termination started); app exit %d at %s; proxy exit %d at %s (%s after the app)",
		name, o.rel(o.preStop), o.rel(o.preStopDone), o.rel(o.appTerm), o.rel(o.draindTerm), o.notReadyCode, o.rel(o.notReady),
		fmtDur(o.notReady.Sub(o.start())), o.appCode, o.rel(o.appExit), o.proxyCode, o.rel(o.proxyExit), fmtDur(o.proxyExit.Sub(o.appExit)))
	t.Logf("%s: the kubelet's readiness probes of draind after termination started: %s", name, o.kubeletProbes)
	report.add("scenario", name, fmt.Sprintf("short=%d/%d-failed long-failed=%d calls=%d/%d-failed tail=%d/%d-failed trigger=%s term=%s ready→%d %s after term; app-exit=%s proxy-exit=%s app→proxy %s; kubelet probes after term: %s",
		o.shortOK, o.shortFail, o.longFail, o.calls.ok, o.calls.fail, o.tail.ok, o.tail.fail, o.trigger, o.rel(o.start()), o.notReadyCode,
		fmtDur(o.notReady.Sub(o.start())), o.rel(o.appExit), o.rel(o.proxyExit), fmtDur(o.proxyExit.Sub(o.appExit)), o.kubeletProbes))
}

// checkProtected is the contract for every termination: no failed request
// or call, readiness failed (503) at once, and the proxy outlived the app
// but not by much. The bound asserted is generous (a shared 2-core
// machine); the figure is reported against the target.
func (o *termination) checkProtected(t *testing.T) {
	t.Helper()
	if o.shortFail > 0 || o.longFail > 0 || o.calls.fail > 0 || o.tail.fail > 0 || o.calls.ok != shutdownCalls || o.tail.ok != tailCalls {
		t.Errorf("failures across the termination: %d short, %d long, %d+%d calls (%d+%d ok of %d+%d)",
			o.shortFail, o.longFail, o.calls.fail, o.tail.fail, o.calls.ok, o.tail.ok, shutdownCalls, tailCalls)
	}
	if o.appExit.IsZero() || o.proxyExit.IsZero() {
		t.Fatalf("exits not seen: app %v, proxy %v", o.appExit, o.proxyExit)
	}
	if d := o.proxyExit.Sub(o.appExit); d < 0 || d > stopFollowsWithin {
		t.Errorf("the proxy container exited %s after the app's, want within [0, %s]", fmtDur(d), stopFollowsWithin)
	}
	if o.notReadyCode != http.StatusServiceUnavailable || o.notReady.Sub(o.start()) > scaled(time.Second) || !o.notReady.Before(o.appExit) {
		t.Errorf("/healthz/ready: first %d %s after termination started (the app exited %s after): want 503 at once",
			o.notReadyCode, fmtDur(o.notReady.Sub(o.start())), fmtDur(o.appExit.Sub(o.start())))
	}
	if o.proxyCode != 0 || o.appCode != 0 {
		t.Errorf("exit codes: app %d, proxy %d; want 0 and 0", o.appCode, o.proxyCode)
	}
}

// The classic sidecar under load, terminated by removing its manifest,
// with separate PID namespaces (the default) and a shared one.
func TestClassicSidecarUnderLoad(t *testing.T) {
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("classic-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			pd := startPod(t, "classic.yaml", podParams{Name: name, ShareProcessNamespace: share, AppArgs: gracefulAppArgs()})
			o := terminateUnderLoad(t, pd)
			o.log(t, name)
			o.checkProtected(t)
			if o.trigger != "signal" {
				t.Errorf("drain trigger %q, want signal", o.trigger)
			}
			// Both at once, as a classic sidecar: each SIGTERM before the
			// app's exit (its graceful shutdown lasts seconds), not
			// draind's after it as in a native sidecar. Not a bound on
			// time: the kubelet's goroutines are scheduled as the node
			// allows.
			if o.appTerm.IsZero() || o.draindTerm.IsZero() || o.appExit.IsZero() || !o.draindTerm.Before(o.appExit) {
				t.Errorf("the kubelet SIGTERMed the app at %s and draind at %s, the app exited at %s: want both before the app's exit (a classic sidecar)", o.rel(o.appTerm), o.rel(o.draindTerm), o.rel(o.appExit))
			}
		})
	}
}
