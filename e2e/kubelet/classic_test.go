package kubelet_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// load is the client side of a termination: short requests until the
// manifest is removed (a load balancer stops sending new ones when the
// endpoint goes; here, at once), and long requests in flight across it.
type load struct {
	shortOK, shortFail atomic.Int64
	longMu             sync.Mutex
	longResults        []string
	longFail           int
	wg                 sync.WaitGroup
	stopShort          chan struct{}
}

func startLoad(pd *pod, long int, longFor time.Duration) *load {
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
	for range long {
		l.wg.Go(func() {
			start := time.Now()
			// Its own connection: a fresh transport per long request.
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
			resp, err := c.Get(fmt.Sprintf("%s/slow?ms=%d", url, longFor.Milliseconds()))
			res := ""
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				c.CloseIdleConnections()
				res = fmt.Sprintf("%d after %s", resp.StatusCode, fmtDur(time.Since(start)))
			}
			l.longMu.Lock()
			defer l.longMu.Unlock()
			if err != nil || resp.StatusCode != 200 {
				l.longFail++
				if err != nil {
					res = fmt.Sprintf("error %v after %s", err, fmtDur(time.Since(start)))
				}
			}
			l.longResults = append(l.longResults, res)
		})
	}
	return l
}

func (l *load) wait() {
	l.wg.Wait()
}

// terminationOutcome is what one classic-sidecar termination measured.
type terminationOutcome struct {
	shortOK, shortFail   int64
	longFail             int
	longResults          []string
	callsOK, callsFail   int
	appExit, proxyExit   time.Time
	appCode, proxyCode   int32
	readinessFirst       string
	readinessOK, readyNo int
	trackerMode, reason  string
	liveness             string
	sigterm              time.Time // the kubelet began stopping draind's container
	notReady             time.Time // first non-200 from /healthz/ready, polled every 50 ms from the removal
	notReadyCode         int
}

// pollReadiness polls draind's readiness as the kubelet's probe would (an
// HTTP GET to the pod's address) until it fails or stop closes.
func pollReadiness(pd *pod, stop <-chan struct{}) (at time.Time, code int) {
	c := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://%s:%d/healthz/ready", pd.ip, statusPort)
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

// terminateUnderLoad runs the classic scenario's termination: short
// requests, two long ones in flight, removal of the manifest while the
// app then makes 30 outbound calls through the proxy.
func terminateUnderLoad(t *testing.T, pd *pod) terminationOutcome {
	startUpstream(t, pd.n.Config().Gateway)
	l := startLoad(pd, 2, 7*time.Second)
	time.Sleep(1500 * time.Millisecond) // short load running, long requests in flight
	pollStop := make(chan struct{})
	var o terminationOutcome
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		o.notReady, o.notReadyCode = pollReadiness(pd, pollStop)
	}()
	pd.remove()
	close(l.stopShort)
	l.wait()
	if !pd.waitContainersExited(45 * time.Second) {
		t.Errorf("containers still running 45 s after the manifest was removed")
	}
	close(pollStop)
	<-polled
	o.sigterm = pd.killedAt("draind")
	if o.sigterm.IsZero() {
		o.sigterm = pd.removedAt // not in the log: count from the removal
	}
	o.shortOK, o.shortFail = l.shortOK.Load(), l.shortFail.Load()
	o.longFail, o.longResults = l.longFail, l.longResults
	var fails []string
	o.callsOK, o.callsFail, fails = pd.appResults()
	for _, f := range fails {
		t.Logf("app call failed: %s", f)
	}
	if app := pd.container("app"); app != nil {
		o.appExit, o.appCode = app.finished, app.exitCode
	}
	if px := pd.container("draind"); px != nil {
		o.proxyExit, o.proxyCode = px.finished, px.exitCode
	}
	o.readinessFirst, o.readinessOK, o.readyNo = pd.readinessAfter(o.sigterm)
	logs := pd.draindLog(-1)
	if r := findLog(logs, "tracker"); r != nil {
		o.trackerMode, o.reason = fmt.Sprint(r["mode"]), fmt.Sprint(r["reason"])
	}
	if r := findLog(logs, "app liveness"); r != nil {
		o.liveness = fmt.Sprintf("%v (%v)", r["source"], r["reason"])
	}
	return o
}

func (o terminationOutcome) log(t *testing.T, name string, removedAt time.Time) {
	t.Logf("%s: tracker %s (%s); app liveness %s", name, o.trackerMode, o.reason, o.liveness)
	t.Logf("%s: short requests %d ok / %d failed; long requests %v (%d failed); app calls during shutdown %d ok / %d failed",
		name, o.shortOK, o.shortFail, o.longResults, o.longFail, o.callsOK, o.callsFail)
	t.Logf("%s: app exited %d at +%s; proxy container exited %d at +%s: %s after the app",
		name, o.appCode, fmtDur(o.appExit.Sub(removedAt)), o.proxyCode, fmtDur(o.proxyExit.Sub(removedAt)), fmtDur(o.proxyExit.Sub(o.appExit)))
	t.Logf("%s: kubelet SIGTERM at +%s; /healthz/ready first %d at +%s (%s after SIGTERM); kubelet readiness probes after SIGTERM: first %s, %d successful, %d failed",
		name, fmtDur(o.sigterm.Sub(removedAt)), o.notReadyCode, fmtDur(o.notReady.Sub(removedAt)), fmtDur(o.notReady.Sub(o.sigterm)), o.readinessFirst, o.readinessOK, o.readyNo)
	report.add("scenario", name, fmt.Sprintf("tracker=%s short=%d/%d-failed long-failed=%d calls=%d/%d-failed SIGTERM=+%s not-ready=+%s app-exit=+%s proxy-exit=+%s (app→proxy %s) kubelet-probes-after-SIGTERM=%d ok/%d failed (first: %s)",
		o.trackerMode, o.shortOK, o.shortFail, o.longFail, o.callsOK, o.callsFail, fmtDur(o.sigterm.Sub(removedAt)), fmtDur(o.notReady.Sub(removedAt)),
		fmtDur(o.appExit.Sub(removedAt)), fmtDur(o.proxyExit.Sub(removedAt)), fmtDur(o.proxyExit.Sub(o.appExit)), o.readinessOK, o.readyNo, o.readinessFirst))
}

// The classic sidecar under load, terminated by removing its manifest,
// with separate PID namespaces (the default) and a shared one.
func TestClassicSidecarUnderLoad(t *testing.T) {
	for _, share := range []bool{false, true} {
		name := fmt.Sprintf("classic-share-%v", share)
		t.Run(fmt.Sprintf("shareProcessNamespace=%v", share), func(t *testing.T) {
			pd := startPod(t, "classic.yaml", podParams{
				Name: name, ShareProcessNamespace: share,
				AppArgs: []string{"--on-term", "graceful", "--calls", "30", "--call-pause", "100ms", "--result", "/work/app.result"},
			})
			o := terminateUnderLoad(t, pd)
			o.log(t, name, pd.removedAt)
			if o.shortFail > 0 || o.longFail > 0 || o.callsFail > 0 || o.callsOK != 30 {
				t.Errorf("failures across the termination: %d short, %d long, %d calls (%d ok of 30)", o.shortFail, o.longFail, o.callsFail, o.callsOK)
			}
			if o.proxyExit.Before(o.appExit) {
				t.Errorf("the proxy exited %s before the app", fmtDur(o.appExit.Sub(o.proxyExit)))
			}
			if o.notReady.IsZero() || o.notReady.After(o.proxyExit) {
				t.Errorf("readiness did not fail before the proxy exited")
			}
		})
	}
}
