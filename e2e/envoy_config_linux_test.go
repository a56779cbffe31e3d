package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/envoysim"
	"github.com/draind/draind/internal/testenv/envoysim/conformance"
	"github.com/draind/draind/internal/testenv/mesh"
	"github.com/draind/draind/internal/testenv/testapp"
)

// Issue 23: Envoy as users configure it. Each test runs envoysim with a
// config of its own (p.proxyCommand) in the plain pod: clients in the
// remote namespace dial the pod's listeners.

// simListener is one listener of envoysim's JSON config.
type simListener struct {
	Name           string  `json:"name"`
	Address        string  `json:"address"`
	Direction      string  `json:"direction,omitempty"`
	StatPrefix     string  `json:"stat_prefix,omitempty"`
	Protocol       string  `json:"protocol"`
	Upstream       string  `json:"upstream"`
	DrainTimeoutMs float64 `json:"drain_timeout_ms,omitempty"`
}

// simConfig is envoysim's JSON config (docs/envoysim.md).
type simConfig struct {
	AdminAddress     string        `json:"admin_address"`
	DrainTimeS       float64       `json:"drain_time_s"`
	DrainStrategy    string        `json:"drain_strategy"`
	DrainGeneration  string        `json:"drain_generation,omitempty"`
	StatsMatcher     string        `json:"stats_matcher,omitempty"`
	LogAdminRequests bool          `json:"log_admin_requests,omitempty"`
	Listeners        []simListener `json:"listeners"`
}

// podListeners are the pod harness's two listeners (pod.envoyConfig):
// inbound 15006 to the app, outbound 15001 to the upstream service.
func podListeners() []simListener {
	return []simListener{
		{Name: "inbound", Address: "0.0.0.0:15006", Direction: "inbound", Protocol: "http", Upstream: "127.0.0.1:8080"},
		{Name: "outbound", Address: "127.0.0.1:15001", Direction: "outbound", Protocol: "http", Upstream: remoteIP + ":9000"},
	}
}

// useSim makes the pod's proxy envoysim with cfg (Istio's drain flags, 45
// s immediate, unless cfg says otherwise).
func (p *pod) useSim(cfg simConfig) {
	p.t.Helper()
	cfg.AdminAddress = "127.0.0.1:15000"
	if cfg.DrainTimeS == 0 {
		cfg.DrainTimeS = 45
	}
	if cfg.DrainStrategy == "" {
		cfg.DrainStrategy = "immediate"
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	path := filepath.Join(p.dir, "envoysim.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.proxyCommand = []string{p.bin, "__envoysim", "-c", path}
}

// keepAlive opens an HTTP/1.1 keep-alive connection from the remote
// namespace to addr and makes one request on it; the connection then
// idles, held open by the test.
func (p *pod) keepAlive(addr string) net.Conn {
	p.t.Helper()
	var c net.Conn
	var err error
	p.remote.Do(p.t, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: metrics\r\n\r\n"); err != nil {
		p.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		p.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetReadDeadline(time.Time{})
	if resp.StatusCode != 200 || resp.Close {
		p.t.Fatalf("keep-alive request to %s: %d close=%t", addr, resp.StatusCode, resp.Close)
	}
	return c
}

// Acceptance 1: a metrics listener named by a listener-level stat_prefix
// (its gauge has no port in it) holds one Prometheus keep-alive. Excluded
// by name, by its listener name or by its stat_prefix, on Istio's 15090
// or on a port the defaults do not exclude, the kernel's and the admin
// API's views both leave it out: the proxy stops right after the app's
// exit, the gate open (stopFollowsWithin). Not excluded, it counts: on
// 15091 it holds the drain until it is parked, the app gone
// (drain.EnvoyDrained); on 15090, which the kernel's view leaves out by
// port, only the admin API counts it, and it holds to the deadline (no
// kernel flow to find parked).
func TestExcludeListenerByName(t *testing.T) {
	for _, tc := range []struct {
		name, addr, exclude string
		held, deadline      bool
	}{
		{"listener name, 15090", "0.0.0.0:15090", "metrics", false, false},
		{"stat_prefix, port 15091", "0.0.0.0:15091", "prometheus_stats", false, false},
		{"not excluded, 15090 (the admin API counts it)", "0.0.0.0:15090", "", true, true},
		{"not excluded, port 15091", "0.0.0.0:15091", "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			ls := append(podListeners(), simListener{Name: "metrics", Address: tc.addr, StatPrefix: "prometheus_stats",
				Protocol: "http", Upstream: remoteIP + ":9000"})
			p.useSim(simConfig{Listeners: ls})
			p.startApp("--on-term", "graceful", "--linger", "1s")
			// The keep-alive stays open (no closer as the min-drain ends):
			// what counts it is the subject.
			args := []string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf", "--drain-deadline", "6s", "--stop-timeout", "500ms", "--close-idle-keepalives=false"}
			if tc.exclude != "" {
				args = append(args, "--exclude-listeners", tc.exclude)
			}
			p.startDraind(args)
			p.wantSources("ebpf", "ebpf")
			_, port, _ := net.SplitHostPort(tc.addr)
			p.keepAlive(podIP + ":" + port)
			if tc.exclude != "" {
				l := p.waitLog(5*time.Second, logevent.ListenersExcluded, nil)
				t.Logf("draind: %v", l["resolved"])
			}
			p.terminate()
			code, took := p.waitExit(15 * time.Second)
			_, _, appExit := p.appResults()
			stopping := p.phaseTime("stopping")
			after := stopping.Sub(appExit)
			t.Logf("%s: app exited +%s, quitquitquit +%s (%s after the app's exit), draind exit %d at +%s",
				tc.name, appExit.Sub(p.drainedAt).Round(time.Millisecond), stopping.Sub(p.drainedAt).Round(time.Millisecond),
				after.Round(100*time.Microsecond), code, took.Round(time.Millisecond))
			deadline := len(p.logLines(logevent.DeadlineReached)) > 0
			fl, _ := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "stopping"})["flows"].(map[string]any)
			held := p.gateHeldBy(drain.HoldEnvoyActive) || p.gateHeldBy(drain.HoldEnvoyKernel)
			switch {
			case code != 0 || appExit.IsZero():
				t.Fatalf("exit %d, app exit %v; log:\n%s", code, appExit, p.draindLog.String())
			case tc.deadline && !deadline:
				t.Errorf("the keep-alive the admin API counts did not hold the drain: the test shows nothing")
			case tc.held && !tc.deadline && (deadline || !held || fl["envoy_downstream"] != float64(1) || fl["envoy_downstream_parked"] != float64(1)):
				t.Errorf("without the exclusion the keep-alive must count and hold the drain until parked: held %t, deadline %t, stopped with %v; log:\n%s", held, deadline, fl, p.draindLog.String())
			case !tc.held && (held || fl["envoy_downstream"] != float64(0)):
				// Held by Envoy's flows, the proxy would stop as the
				// keep-alive parks, ParkedAfter after the app: too soon
				// for any bound on time to tell.
				t.Errorf("excluded, the keep-alive still counted: the gate held by Envoy's flows %t, stopped with %v", held, fl)
			case !tc.held && (deadline || after < 0 || after > stopFollowsWithin):
				t.Errorf("proxy stopped %s after the app's exit (deadline: %t), want after it, within %s, not by the deadline; log:\n%s", after, deadline, stopFollowsWithin, p.draindLog.String())
			}
		})
	}
}

// Acceptance 2: a stats matcher that rejects every stat: server.state and
// workers_started are gone, yet the pod becomes Ready (Envoy's /ready),
// draind says so once, and drains and stops as usual.
func TestReadinessUnderRejectAll(t *testing.T) {
	p := newPod(t)
	p.useSim(simConfig{StatsMatcher: "reject_all", Listeners: podListeners()})
	p.startApp("--on-term", "graceful", "--linger", "500ms")
	p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
	for range 5 { // more probes: still one line
		if got := p.readyStatus(); got != 200 {
			t.Fatalf("readiness %d", got)
		}
	}
	resp, err := p.client.Get("http://" + podIP + ":15006/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	p.client.CloseIdleConnections()
	p.terminate()
	code, took := p.waitExit(15 * time.Second)
	lines := p.logLines(logevent.ReadinessFromReady)
	gauges := p.logLines(logevent.NoListenerGauges)
	_, _, appExit := p.appResults()
	stopping := p.phaseTime("stopping")
	t.Logf("reject_all: ready; %d readiness-source line(s), %d no-gauges line(s); app exit +%s, quitquitquit %s after it; draind exit %d at +%s",
		len(lines), len(gauges), appExit.Sub(p.drainedAt).Round(time.Millisecond), stopping.Sub(appExit).Round(100*time.Microsecond), code, took.Round(time.Millisecond))
	if len(lines) != 1 {
		t.Errorf("%d lines say where readiness comes from, want 1; log:\n%s", len(lines), p.draindLog.String())
	}
	if code != 0 || appExit.IsZero() || stopping.Before(appExit) || len(p.logLines(logevent.DeadlineReached)) > 0 {
		t.Errorf("exit %d; stopped at %s, app exit %s; log:\n%s", code, stopping, appExit, p.draindLog.String())
	}
}

// Acceptance 3: a bootstrap with no traffic_direction. draind warns once
// Envoy is LIVE, naming the listeners, and drains every listener without
// stopping any (docs/design.md, "Draining"): the inbound keep-alive's next
// response carries Connection: close; the app's outbound calls during its
// shutdown still succeed (told Connection: close too), and the outbound
// listener still accepts after the drain time (1 s here) has passed.
func TestNoTrafficDirection(t *testing.T) {
	p := newPod(t)
	ls := podListeners()
	for i := range ls {
		ls[i].Direction = ""
	}
	p.useSim(simConfig{DrainTimeS: 1, Listeners: ls})
	p.startApp("--on-term", "graceful", "--linger", "1500ms", "--outbound-count", "5", "--outbound-pause", "200ms")
	p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
	warn := p.waitLog(5*time.Second, logevent.NoInboundListener, nil)
	t.Logf("warning names %v", warn["listeners"])
	if fmt.Sprint(warn["listeners"]) != "[inbound (UNSPECIFIED) outbound (UNSPECIFIED)]" {
		t.Errorf("warning names %v", warn["listeners"])
	}
	c := p.keepAlive(podIP + ":15006")
	br := bufio.NewReader(c)
	p.terminate()
	p.waitLog(5*time.Second, logevent.DrainListenersSent, nil)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: app\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.Close()                           // as told
	time.Sleep(1200 * time.Millisecond) // past the drain time: skip_exit keeps the listeners
	var dialErr error
	p.ns.Do(t, func() {
		var oc net.Conn
		if oc, dialErr = net.DialTimeout("tcp", "127.0.0.1:15001", time.Second); dialErr == nil {
			oc.Close()
		}
	})
	code, _ := p.waitExit(15 * time.Second)
	p.app.wait(10 * time.Second)
	ok, closed, fail, _ := p.appCalls()
	t.Logf("inbound keep-alive's response after the drain: Connection: close %t; app calls %d ok (%d told close), %d failed; outbound listener after the drain time: %v; draind exit %d",
		resp.Close, ok, closed, fail, dialErr, code)
	if len(p.logLines(logevent.NoInboundListener)) != 1 {
		t.Errorf("the warning was logged %d times", len(p.logLines(logevent.NoInboundListener)))
	}
	if !resp.Close || ok != 5 || fail != 0 || closed != 5 || dialErr != nil || code != 0 {
		t.Errorf("want Connection: close inbound, 5 calls ok all told close, the outbound listener open, exit 0; log:\n%s", p.draindLog.String())
	}
}

// drainGenerations are envoysim's two drain generations, each as draind's
// scenarios run it: 1.39 with Istio's flags (45 s, immediate); the
// connection-event drain with a drain time short enough (6 s, inbound
// drain_timeout 1 s) that its proactive drain, in [4 s, 5 s], falls inside
// the scenarios.
var drainGenerations = []struct {
	gen            string
	drainTimeS     float64
	drainTimeoutMs float64
}{
	{envoysim.Drain139, 45, 0},
	{envoysim.DrainConnectionEvent, 6, 1000},
}

func (p *pod) useGeneration(gen string, drainTimeS, drainTimeoutMs float64) {
	ls := podListeners()
	ls[0].DrainTimeoutMs = drainTimeoutMs
	p.useSim(simConfig{DrainGeneration: gen, DrainTimeS: drainTimeS, Listeners: ls})
}

// Acceptance 4, the R-style scenario against both drain generations: short
// requests every 20 ms until 0.5 s after SIGTERM, a 5 s request in flight,
// an idle keep-alive held by a client that never closes it (with
// --idle-timeout 2s), and the app's outbound calls through the proxy for
// 3 s of its shutdown. Nothing fails; the proxy is told to quit only
// after the app exited and the long request completed, before the
// deadline.
func TestRScenarioDrainGenerations(t *testing.T) {
	var rows []string
	for _, g := range drainGenerations {
		t.Run(g.gen, func(t *testing.T) {
			p := newPod(t)
			p.useGeneration(g.gen, g.drainTimeS, g.drainTimeoutMs)
			p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-for", "3s", "--outbound-pause", "200ms")
			p.startDraind([]string{"--min-drain", "1s", "--idle-timeout", "2s", "--drain-deadline", "20s", "--tracker", "ebpf", "--app-procs", "ebpf"})
			p.wantSources("ebpf", "ebpf")
			idle := p.keepAlive(podIP + ":15006")
			_ = idle
			var mu sync.Mutex
			var shortOK, shortFail int
			var fails []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			short := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 10 * time.Second}
			defer short.CloseIdleConnections()
			wg.Go(func() {
				for {
					select {
					case <-stop:
						short.CloseIdleConnections()
						return
					default:
					}
					resp, err := short.Get("http://" + podIP + ":15006/")
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if err == nil && resp.StatusCode != 200 {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
					mu.Lock()
					if err != nil {
						shortFail++
						fails = append(fails, err.Error())
					} else {
						shortOK++
					}
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
				}
			})
			c := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 30 * time.Second}
			defer c.CloseIdleConnections()
			long := inFlight(t, c, "http://"+podIP+":15006"+slowPath(5*time.Second))
			p.terminate()
			time.Sleep(500 * time.Millisecond) // the short clients still come as endpoints propagate
			close(stop)
			wg.Wait()
			lr := <-long
			longErr, longEnd := lr.Err, lr.At
			if longErr == nil && lr.Code != 200 {
				longErr = fmt.Errorf("status %d", lr.Code)
			}
			code, took := p.waitExit(25 * time.Second)
			p.app.wait(10 * time.Second)
			ok, _, fail, appExit := p.appCalls()
			quit := p.phaseTime("stopping")
			deadline := len(p.logLines(logevent.DeadlineReached)) > 0
			row := fmt.Sprintf("%-16s | short %d ok / %d failed | long: %v, done +%s | app calls %d ok / %d failed, app exit +%s | quitquitquit +%s (%s after the later of the two) | deadline %t | draind exit %d at +%s",
				g.gen, shortOK, shortFail, longErr, longEnd.Sub(p.drainedAt).Round(time.Millisecond), ok, fail,
				appExit.Sub(p.drainedAt).Round(time.Millisecond), quit.Sub(p.drainedAt).Round(time.Millisecond),
				quit.Sub(later(appExit, longEnd)).Round(100*time.Microsecond), deadline, code, took.Round(time.Millisecond))
			t.Log(row)
			rows = append(rows, row)
			if shortFail > 0 || longErr != nil || fail > 0 || ok < 5 || code != 0 || deadline {
				t.Errorf("failures: %v; log:\n%s", fails, p.draindLog.String())
			}
			if appExit.IsZero() || quit.Before(appExit) || quit.Before(longEnd) {
				t.Errorf("quit at %s before the app's exit %s or the long request's end %s", quit, appExit, longEnd)
			}
		})
	}
	t.Logf("R-style scenario by drain generation:\n%s", strings.Join(rows, "\n"))
}

// meshDrainGeneration, when set, is the drain generation of the mesh
// pods' envoysim (meshEnvoyConfig).
var meshDrainGeneration string

// Acceptance 4, issue 13's R scenario itself (mesh_linux_test.go: Istio's
// REDIRECT interception, gauges kept, Istio's 45 s immediate drain) under
// both drain generations.
func TestMeshRScenarioDrainGenerations(t *testing.T) {
	var rows []string
	for _, gen := range []string{envoysim.Drain139, envoysim.DrainConnectionEvent} {
		t.Run(gen, func(t *testing.T) {
			meshDrainGeneration = gen
			defer func() { meshDrainGeneration = "" }()
			row := runMeshR(t, mesh.Redirect, gaugesPresent)
			rows = append(rows, gen+": "+row.String())
		})
	}
	t.Logf("R scenario by drain generation:\n%s", strings.Join(rows, "\n"))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Acceptance 4, the HTTP/2 stream against both drain generations: a
// gRPC-style server stream (7 s) on a raw HTTP/2 connection runs across
// SIGTERM; the next response after the drain brings the GOAWAY notice,
// the final GOAWAY follows the inbound drain_timeout later, the stream
// completes with its trailers and the connection closes; the proxy is
// told to quit only after that.
func TestH2StreamDrainGenerations(t *testing.T) {
	for _, g := range drainGenerations {
		t.Run(g.gen, func(t *testing.T) {
			p := newPod(t)
			p.useGeneration(g.gen, g.drainTimeS, g.drainTimeoutMs)
			p.startApp("--on-term", "graceful", "--linger", "7500ms")
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
			p.wantSources("ebpf", "ebpf")
			authority := podIP + ":15006"
			var h *conformance.H2Conn
			var err error
			p.remote.Do(t, func() { h, err = conformance.DialH2(context.Background(), authority) })
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			raw := &h2Frames{t: t, h: h}
			stream, err := h.Get(authority, "/stream?n=35&ms=200") // 7 s
			if err != nil {
				t.Fatal(err)
			}
			for raw.next().Type != conformance.FrameData {
			}
			time.Sleep(300 * time.Millisecond)
			p.terminate()
			p.waitLog(5*time.Second, logevent.DrainListenersSent, nil)
			second, err := h.Get(authority, "/")
			if err != nil {
				t.Fatal(err)
			}
			ended := false
			for !ended {
				fr := raw.next()
				ended = fr.Stream == stream && fr.EndStream()
			}
			streamEnd := time.Now()
			_, eofErr := h.Next(15 * time.Second)
			closedAt := time.Now()
			code, _ := p.waitExit(30 * time.Second)
			quit := p.phaseTime("stopping")
			var order []string
			for _, e := range raw.log {
				if e != fmt.Sprintf("data %d", stream) && e != fmt.Sprintf("data %d", second) && (len(order) == 0 || order[len(order)-1] != e) {
					order = append(order, e)
				}
			}
			first, final := fmt.Sprintf("goaway %d", conformance.MaxStreamID), fmt.Sprintf("goaway %d", second)
			t.Logf("%s: frames (data aside): %s; final GOAWAY %s after the first; stream done +%s, connection closed (%v) %s after; quitquitquit %s after the stream's end; draind exit %d",
				g.gen, strings.Join(order, ", "), raw.when(final).Sub(raw.when(first)).Round(time.Millisecond),
				streamEnd.Sub(p.drainedAt).Round(time.Millisecond), eofErr, closedAt.Sub(streamEnd).Round(time.Millisecond),
				quit.Sub(streamEnd).Round(time.Millisecond), code)
			want := []string{fmt.Sprintf("headers %d", stream), first, fmt.Sprintf("headers %d", second), final, fmt.Sprintf("trailers %d", stream)}
			if strings.Join(order, ", ") != strings.Join(want, ", ") {
				t.Errorf("frames %v, want %v", order, want)
			}
			if code != 0 || quit.Before(streamEnd) || eofErr == nil {
				t.Errorf("exit %d, quit %s, stream end %s, connection end %v; log:\n%s", code, quit, streamEnd, eofErr, p.draindLog.String())
			}
		})
	}
}

// Acceptance 5: the admin calls draind makes during one drain, counted
// from envoysim's log of its admin requests between SIGTERM and the quit,
// for the shapes of docs/benchmarks.md ("Envoy's /stats per drain").
func TestStatsCallsPerDrain(t *testing.T) {
	var rows []string
	for _, tc := range []struct {
		name, matcher string
		inFlight      bool
	}{
		{"idle pod", "", false},
		{"request in flight", "", true},
		{"gauges absent (Istio's default matcher)", "istio", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.useSim(simConfig{StatsMatcher: tc.matcher, LogAdminRequests: true, Listeners: podListeners()})
			p.startApp("--on-term", "graceful", "--linger", "1s")
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
			p.wantSources("ebpf", "ebpf")
			p.waitLiveWork() // its GET /stats is the gauge check's, not a probe's
			probesFrom := len(p.draindLog.String())
			for range 5 { // the kubelet's readiness probes while Ready
				if got := p.readyStatus(); got != 200 {
					t.Logf("readiness %d (a loaded machine: the probe's call to Envoy timed out)", got)
				}
			}
			time.Sleep(100 * time.Millisecond) // the proxy's log lines come through a pipe
			probeCalls, _ := adminCalls(p.draindLog.String()[probesFrom:])
			before := len(p.draindLog.String())
			var done <-chan testapp.Reply
			c := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 30 * time.Second}
			if tc.inFlight {
				done = inFlight(t, c, "http://"+podIP+":15006"+slowPath(2*time.Second))
			}
			p.terminate()
			if done != nil {
				<-done
				c.CloseIdleConnections()
			}
			code, took := p.waitExit(15 * time.Second)
			calls, total := adminCalls(p.draindLog.String()[before:])
			row := fmt.Sprintf("%-40s | 5 readiness probes: GET /stats %d, GET /ready %d | drain: GET /stats %d | POST /drain_listeners %d | POST /quitquitquit %d | other %d | drain %s (exit %d)",
				tc.name, probeCalls["GET /stats"], probeCalls["GET /ready"], calls["GET /stats"], calls["POST /drain_listeners"], calls["POST /quitquitquit"],
				total-calls["GET /stats"]-calls["POST /drain_listeners"]-calls["POST /quitquitquit"],
				took.Round(time.Millisecond), code)
			t.Log(row)
			rows = append(rows, row)
			if code != 0 || calls["POST /drain_listeners"] != 1 || calls["POST /quitquitquit"] != 1 || probeCalls["GET /stats"] > 0 ||
				calls["GET /stats"] > 2 { // 1; 2 when the first timed out on a loaded machine and was asked again
				t.Errorf("calls %v, exit %d", calls, code)
			}
		})
	}
	t.Logf("admin calls per drain:\n%s", strings.Join(rows, "\n"))
}

// adminCalls counts envoysim's logged admin requests in a stretch of
// draind's output (the proxy's stderr is draind's), by method and path.
func adminCalls(out string) (map[string]int, int) {
	calls, total := map[string]int{}, 0
	for line := range strings.SplitSeq(out, "\n") {
		_, call, ok := strings.Cut(line, "[envoysim] admin ")
		if !ok {
			continue
		}
		path, _, _ := strings.Cut(call, "?")
		calls[path]++
		total++
	}
	return calls, total
}
