package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/envoysim"
	"github.com/draind/draind/internal/testenv/mesh"
)

// Issue 22: Istio's own pilot-agent under `draind run`, as Istio's injector
// leaves the istio-proxy container once its command is draind's
// (deploy/istio): `draind run -- pilot-agent proxy sidecar ...` with
// Istio's variables and no DRAIND_* setting. pilot-agent is the real one
// (tools/peers/pilot-agent.sh); its Envoy is envoysim, which pilot-agent
// starts from ProxyConfig binaryPath with the bootstrap it rendered from
// its template (here envoysim's own config: it has no template actions, so
// pilot-agent writes it as it is). draind runs as root with
// --run-proxy-as 1337, as the harness's other pods: pilot-agent, and
// Envoy under it, run as Istio's proxy uid.

// A copy of the test binary named envoy is envoysim: pilot-agent runs
// binaryPath with Envoy's flags and no room for a role argument.
func init() {
	if filepath.Base(os.Args[0]) == "envoy" {
		os.Exit(envoysimRole(os.Args[1:]))
	}
}

// istioStatusPort is pilot-agent's (Istio's default); draindStatusPort is
// where draind puts its own next to it (istio.FirstFreePort).
const (
	istioStatusPort  = "15020"
	draindStatusPort = "15022"
	// appProbePath is the app's readiness probe as Istio's injector
	// rewrites it (pilot-agent serves it from ISTIO_KUBE_APP_PROBERS).
	appProbePath = "/app-health/app/readyz"
)

// istioPod is a pod whose proxy container is draind above pilot-agent.
type istioPod struct {
	*pod
	pilotAgent, envoyBin, bootstrap string
}

// newIstioPod makes the pod, pilot-agent's working directory (it writes
// ./etc/istio/proxy and ./var/run relative to it: the test's, here p.dir)
// and the variables Istio's injector sets, plus those that let pilot-agent
// run without istiod and a CA (docs/peers.md). proxyConfig
// is merged over the ProxyConfig every pod needs.
func newIstioPod(t *testing.T, proxyConfig map[string]any, opts ...podOption) *istioPod {
	t.Helper()
	for _, kv := range os.Environ() {
		// The test binary's own opt-out (cgo_optout_linux_test.go) says
		// how it was built, not how the pod is set.
		if strings.HasPrefix(kv, "DRAIND_") && !strings.HasPrefix(kv, agent.AllowUndroppedCapsEnv+"=") {
			t.Fatalf("%s is set: these tests run draind with no DRAIND_* setting", kv)
		}
	}
	pa := mesh.PilotAgent(t)
	p := &istioPod{pod: newPod(t, opts...)}
	p.pilotAgent = filepath.Join(p.dir, "pilot-agent")
	if err := linkOrCopy(pa, p.pilotAgent); err != nil {
		t.Fatal(err)
	}
	p.envoyBin = filepath.Join(filepath.Dir(p.bin), "envoy")
	if err := os.Link(p.bin, p.envoyBin); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	p.bootstrap = filepath.Join(p.dir, "envoy_bootstrap_tmpl.json")
	tmpl, _ := json.Marshal(map[string]any{
		"admin_address": "127.0.0.1:15000",
		"xds":           true, // the update counters pilot-agent's readiness waits for
		"listeners": []map[string]any{
			{"name": "virtualInbound", "address": "0.0.0.0:15006", "direction": "inbound", "protocol": "http", "upstream": "127.0.0.1:8080"},
			{"name": "virtualOutbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": remoteIP + ":9000"},
		},
	})
	if err := os.WriteFile(p.bootstrap, tmpl, 0o644); err != nil {
		t.Fatal(err)
	}
	pc := map[string]any{
		"binaryPath":             p.envoyBin,
		"configPath":             filepath.Join(p.dir, "etc/istio/proxy"),
		"discoveryAddress":       "127.0.0.1:15012",
		"controlPlaneAuthPolicy": "NONE",
	}
	for k, v := range proxyConfig {
		pc[k] = v
	}
	pcJSON, _ := json.Marshal(pc) // as the injector writes it: JSON
	probers, _ := json.Marshal(map[string]any{
		appProbePath: map[string]any{"httpGet": map[string]any{"path": "/", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1},
	})
	for k, v := range map[string]string{
		"PROXY_CONFIG":              string(pcJSON),
		"ISTIO_KUBE_APP_PROBERS":    string(probers),
		"POD_NAME":                  "web-0",
		"POD_NAMESPACE":             "default",
		"INSTANCE_IP":               podIP,
		"SERVICE_ACCOUNT":           "default",
		"ISTIO_META_DNS_CAPTURE":    "false",
		"FILE_MOUNTED_CERTS":        "true", // offline: no CA
		"CLOUD_PLATFORM":            "none", // offline: no metadata server
		"ISTIO_META_POD_PORTS":      `[{"containerPort":8080,"protocol":"TCP"}]`,
		"ISTIO_META_APP_CONTAINERS": "app",
	} {
		t.Setenv(k, v)
	}
	t.Chdir(p.dir)
	return p
}

// useIstioStats makes the stand-in keep only the stats Istio's bootstrap
// lets Envoy keep (envoysim.IstioStatsTemplate, rendered by pilot-agent),
// and gives pilot-agent the pod's annotations where the downward API puts
// them (./etc/istio/pod/annotations, relative to its working directory).
func (p *istioPod) useIstioStats(annotations map[string]string) {
	p.t.Helper()
	b, err := os.ReadFile(p.bootstrap)
	if err != nil {
		p.t.Fatal(err)
	}
	tmpl := "{" + envoysim.IstioStatsTemplate + "," + strings.TrimPrefix(string(b), "{")
	if err := os.WriteFile(p.bootstrap, []byte(tmpl), 0o644); err != nil {
		p.t.Fatal(err)
	}
	var lines []string
	for k, v := range annotations {
		lines = append(lines, fmt.Sprintf("%s=%q", k, v))
	}
	dir := filepath.Join(p.dir, "etc/istio/pod")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	// pilot-agent, as the proxy's uid, writes beside it (etc/istio/proxy).
	for _, d := range []string{"etc", "etc/istio"} {
		os.Chmod(filepath.Join(p.dir, d), 0o777)
	}
	if err := os.WriteFile(filepath.Join(dir, "annotations"), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// TestIstioPilotAgentRateBefore (issue 41): under Istio's bootstrap stats
// matcher no listener counter exists, and the rate before the drain is
// unknown; the annotation the `draind` template writes keeps the inbound
// listener's, and pilot-agent's bootstrap passes it to Envoy: the rate is
// read from it.
func TestIstioPilotAgentRateBefore(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		known       bool
	}{
		{"istio-default", nil, false},
		{"draind-template", map[string]string{"sidecar.istio.io/statsInclusionRegexps": inboundTotalRegexp}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newIstioPod(t, nil)
			p.useIstioStats(tc.annotations)
			p.startApp()
			p.start()
			p.checkStarted()
			const requests = 5
			hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 5 * time.Second}
			for range requests { // a new connection each
				resp, err := hc.Get("http://" + podIP + ":15006/")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			p.terminate()
			if code, _ := p.waitExit(30 * time.Second); code != 0 {
				t.Fatalf("draind exited %d; log:\n%s", code, p.draindLog.String())
			}
			lines := p.logLines(logevent.OutOfRotation)
			if len(lines) != 1 {
				t.Fatalf("out_of_rotation lines %v", lines)
			}
			out := lines[0]
			known, _ := out["rate_known"].(bool)
			n, _ := out["connections_before"].(float64)
			if known != tc.known || tc.known && (out["rate_source"] != drain.RateFromEnvoy || n < requests) {
				t.Errorf("rate known %v from %v, %v connections before; want known %v, at least %d", known, out["rate_source"], n, tc.known, requests)
			}
			t.Logf("out of rotation %v (%v, window %v); rate known %v: %v connections in %v", out["took"], out["why"], out["window"], known, n, out["before_span"])
		})
	}
}

// TestIstioPilotAgentIdleProbed (issue 41, acceptance 2, with Istio's
// probe rewrite): an idle pod under pilot-agent, probed from the node
// through the drain on draind's port and on the app's probe that Istio
// rewrote to pilot-agent's, leaves rotation on quiet with no connection
// counted, on a bridge and on a routed CNI.
func TestIstioPilotAgentIdleProbed(t *testing.T) {
	for _, shape := range cniShapes {
		t.Run(string(shape), func(t *testing.T) {
			p := newIstioPod(t, nil, withCNI(shape))
			p.useIstioStats(nil)
			p.startApp()
			p.start()
			p.checkStarted()
			base := "http://" + podIP + ":"
			drainIdleProbed(t, p.pod, base+draindStatusPort+agent.RotationWaitPath, base+draindStatusPort+"/healthz/ready", base+istioStatusPort+appProbePath)
		})
	}
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// start runs the istio-proxy container: `draind run -- pilot-agent proxy
// sidecar`, and waits for draind's readiness (which includes
// pilot-agent's) on draind's own port.
func (p *istioPod) start() {
	p.t.Helper()
	p.startAs(-1, "--run-proxy-as", "1337")
}

// startAs is start with the container's uid (< 0: root) and draind's flags.
func (p *istioPod) startAs(uid int, flags ...string) {
	p.t.Helper()
	args := append(append([]string{"run"}, flags...), "--", p.pilotAgent, "proxy", "sidecar", "--templateFile", p.bootstrap)
	p.draindLog = &syncBuffer{}
	p.draind = p.runContainer("istio-proxy", uid, io.MultiWriter(p.draindLog, testWriter{p.t}), "__draind", args...)
	end := time.Now().Add(30 * time.Second)
	for p.get(draindStatusPort, "/healthz/ready") != 200 || p.get(draindStatusPort, "/metrics") != 200 {
		select {
		case <-p.draind.done:
			p.t.Fatalf("draind exited %d before the pod was ready; log:\n%s", p.draind.code, p.draindLog.String())
		default:
		}
		if time.Now().After(end) {
			p.t.Fatalf("pod not ready; log:\n%s", p.draindLog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get is a GET of the pod's port and path from the remote namespace, as
// the kubelet's prober: its status code, or 0 without an HTTP answer.
func (p *istioPod) get(port, path string) int {
	resp, err := p.client.Get("http://" + podIP + ":" + port + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// poll GETs port/path every 50 ms until stop is closed, recording each
// answer (0: no HTTP answer) and when.
type pollResult struct {
	at   time.Time
	code int
}

func (p *istioPod) poll(port, path string, stop <-chan struct{}) func() []pollResult {
	var (
		mu  sync.Mutex
		out []pollResult
		wg  sync.WaitGroup
	)
	c := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 2 * time.Second}
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			code := 0
			if resp, err := c.Get("http://" + podIP + ":" + port + path); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			out = append(out, pollResult{time.Now(), code})
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	return func() []pollResult { wg.Wait(); mu.Lock(); defer mu.Unlock(); return out }
}

// answer is how a request through Envoy's inbound listener ended.
type answer struct {
	code int
	err  error
	at   time.Time
}

// slowRequest sends GET /slow?ms=ms through Envoy's inbound listener and
// returns once it is in flight.
func (p *istioPod) slowRequest(ms int) <-chan answer {
	p.t.Helper()
	// No client timeout: a request that never ends stays in flight until
	// the proxy goes.
	c := &http.Client{Transport: p.client.Transport}
	reply := inFlight(p.t, c, "http://"+podIP+":15006"+slowPath(time.Duration(ms)*time.Millisecond))
	ch := make(chan answer, 1)
	go func() {
		r := <-reply
		ch <- answer{r.Code, r.Err, r.At}
	}()
	return ch
}

// checkStarted: pilot-agent's status server runs (no bind error) and
// answers its own readiness and the app's rewritten probe; draind said
// which ports it took.
func (p *istioPod) checkStarted() {
	p.t.Helper()
	line := p.waitLog(5*time.Second, logevent.ProxyIsPilotAgent, nil)
	if fmt.Sprint(line["status_addr"]) != ":"+draindStatusPort || fmt.Sprint(line["pilot_agent_status_port"]) != istioStatusPort {
		p.t.Errorf("ports: %v", line)
	}
	if strings.Contains(p.draindLog.String(), "Error listening on status port") {
		p.t.Errorf("pilot-agent could not listen on its status port; log:\n%s", p.draindLog.String())
	}
	if got, app := p.get(istioStatusPort, "/healthz/ready"), p.get(istioStatusPort, appProbePath); got != 200 || app != 200 {
		p.t.Fatalf("pilot-agent's status port: /healthz/ready %d, %s %d; want 200 and 200; log:\n%s", got, appProbePath, app, p.draindLog.String())
	}
}

// terminateClassic sends SIGTERM to the app and draind together, with a
// 4 s request in flight and the probes polled, and checks the drain
// (report).
func (p *istioPod) terminateClassic(t *testing.T) {
	t.Helper()
	slow := p.slowRequest(4000)
	stop := make(chan struct{})
	appProbes := p.poll(istioStatusPort, appProbePath, stop)
	readiness := p.poll(draindStatusPort, "/healthz/ready", stop)
	istioReadiness := p.poll(istioStatusPort, "/healthz/ready", stop)
	p.terminate()
	a := <-slow
	code, took := p.waitExit(30 * time.Second)
	close(stop)
	probes, ready, istioReady := appProbes(), readiness(), istioReadiness()
	p.report(t, a, code, took, probes, ready, istioReady)
}

// Acceptance 1: the classic sidecar. SIGTERM reaches the app and draind
// together; a 4 s request is in flight and the app makes 12 calls out
// during its 3 s shutdown.
func TestIstioPilotAgentClassic(t *testing.T) {
	p := newIstioPod(t, nil)
	p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "12", "--outbound-pause", "250ms")
	p.start()
	p.checkStarted()
	p.wantSources("ebpf", "ebpf")

	p.terminateClassic(t)
}

// TestIstioPilotAgentClassicSocketsOnly (issue 41, acceptance 5): the same
// pod as Istio runs it with the `draind` template alone: the container as
// uid 1337 with no capability, so no eBPF, and the app in a PID namespace
// of its own: draind sees the app by its sockets alone. Between two of
// the app's calls it has none open; the gate holds it to the fixed 5 s,
// and no call is lost.
func TestIstioPilotAgentClassicSocketsOnly(t *testing.T) {
	p := newIstioPod(t, nil)
	p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "12", "--outbound-pause", "250ms")
	p.startAs(1337)
	p.checkStarted()
	p.wantSources("sockdiag", "sockets")

	p.terminateClassic(t)
	_, _, _, appExit := p.appCalls()
	quit := p.phaseTime("stopping")
	held := p.drainedAt.Add(drain.SocketsOnlyHold)
	if appExit.After(held) {
		held = appExit
	}
	if quit.Before(p.drainedAt.Add(drain.SocketsOnlyHold)) {
		t.Errorf("quitquitquit %s after SIGTERM, before the fixed %s: the app was seen by its sockets alone", quit.Sub(p.drainedAt), drain.SocketsOnlyHold)
	}
	t.Logf("quitquitquit %s after the later of the app's exit and the fixed %s", quit.Sub(held), drain.SocketsOnlyHold)
}

// report checks what acceptance 1 and 2 share and logs the figures. The
// quit must follow the later of the app's exit, the request's end and
// min-drain's end, the gate opened by it (also in the native order:
// draind sees the app gone and needs no SIGTERM); how soon is logged here
// and measured by tools/bench/exit.sh.
func (p *istioPod) report(t *testing.T, a answer, code int, took time.Duration, probes, ready, istioReady []pollResult) {
	t.Helper()
	ok, closed, fail, appExit := p.appCalls()
	draining := p.phaseTime("draining")
	quit := p.phaseTime("stopping")
	minDrainEnd := p.phaseTime("gating") // the min-drain's end (auto, the default: out of rotation)
	last := appExit
	for _, x := range []time.Time{a.at, minDrainEnd} {
		if x.After(last) {
			last = x
		}
	}
	exited := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "exited"})
	// The app probe until the app's exit; draind's readiness from the
	// drain's start.
	probeCodes := map[int]int{}
	firstProbeFail := time.Time{}
	for _, r := range probes {
		if r.at.After(appExit) {
			break
		}
		probeCodes[r.code]++
		if r.code != 200 && firstProbeFail.IsZero() {
			firstProbeFail = r.at
		}
	}
	readyAfter := map[int]int{}
	// From the drain's start until draind logs its end (its status
	// server closes right after: a probe then finds nothing listening).
	ended := p.phaseTime("exited")
	for _, r := range ready {
		if r.at.After(draining.Add(5*time.Millisecond)) && r.at.Before(ended) {
			readyAfter[r.code]++
		}
	}
	istioAfter := map[int]int{}
	for _, r := range istioReady {
		if r.at.After(draining.Add(5*time.Millisecond)) && r.at.Before(appExit) {
			istioAfter[r.code]++
		}
	}
	t.Logf("request: %d %v, done +%s; calls: %d ok (%d told to close), %d failed; app exit +%s; min-drain end +%s; quitquitquit +%s = %s after the later of the app's exit, the request and min-drain; draind exit %d at +%s (%v)",
		a.code, a.err, a.at.Sub(p.drainedAt), ok, closed, fail, appExit.Sub(p.drainedAt), minDrainEnd.Sub(p.drainedAt), quit.Sub(p.drainedAt), quit.Sub(last), code, took, exited["why"])
	t.Logf("app probe %s on pilot-agent's port until the app's exit: %v (first non-200 at +%s); draind's readiness (:%s) after the drain began: %v; Istio's own (:%s) meanwhile: %v",
		appProbePath, probeCodes, firstProbeFail.Sub(p.drainedAt), draindStatusPort, readyAfter, istioStatusPort, istioAfter)
	if a.err != nil || a.code != 200 {
		t.Errorf("the request in flight: %d %v", a.code, a.err)
	}
	if ok != 12 || fail != 0 {
		t.Errorf("calls: %d ok, %d failed; want 12 and 0", ok, fail)
	}
	if d := quit.Sub(last); d < 0 || d > stopFollowsWithin || exited["why"] != "drained" {
		t.Errorf("quitquitquit %s after the later of the app's exit, the request and min-drain, why %v; want after it, within %s, the gate open (drained)", d, exited["why"], stopFollowsWithin)
	}
	if code != 0 || fmt.Sprint(exited["exit_code"]) != "0" {
		t.Errorf("draind exit %d (logged %v); want 0 (pilot-agent exited 0 after the quit)", code, exited["exit_code"])
	}
	if probeCodes[0] != 0 || len(probes) == 0 {
		t.Errorf("the app probe went unanswered %d times before the app's exit: %v", probeCodes[0], probeCodes)
	}
	if len(readyAfter) != 1 || readyAfter[503] == 0 {
		t.Errorf("draind's readiness after the drain began: %v; want 503 only", readyAfter)
	}
}

// Acceptance 2: the native sidecar. The kubelet runs the preStop hook
// `draind drain` (no flag: it finds draind's port from Istio's settings)
// and SIGTERMs the app together, and would SIGTERM draind after the app
// exited: draind, seeing the app gone, does not wait for it.
func TestIstioPilotAgentNative(t *testing.T) {
	p := newIstioPod(t, nil)
	p.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "12", "--outbound-pause", "250ms")
	p.start()
	p.checkStarted()

	slow := p.slowRequest(4000)
	stop := make(chan struct{})
	appProbes := p.poll(istioStatusPort, appProbePath, stop)
	readiness := p.poll(draindStatusPort, "/healthz/ready", stop)
	istioReadiness := p.poll(istioStatusPort, "/healthz/ready", stop)
	p.drainedAt = time.Now()
	p.app.Signal(syscall.SIGTERM)
	var out syncBuffer
	hook := p.runContainer("prestop-hook", 1337, &out, "__draind", "drain")
	if !hook.wait(10*time.Second) || hook.code != 0 {
		t.Fatalf("draind drain: exit %d: %s", hook.code, out.String())
	}
	hookDone := time.Now()
	a := <-slow
	if !p.app.wait(20 * time.Second) {
		t.Fatal("the app did not exit")
	}
	code, took := p.exitsBeforeSidecarTurn()
	close(stop)
	draining := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "draining"})
	t.Logf("native: draind drain returned in %s (%s); draind's exit %s after the app's, no SIGTERM; trigger %v",
		hookDone.Sub(p.drainedAt), strings.TrimSpace(out.String()), p.draind.exitedAt.Sub(p.app.exitedAt), draining["trigger"])
	if draining["trigger"] != "prestop-hook" {
		t.Errorf("drain trigger %v; want prestop-hook", draining["trigger"])
	}
	p.report(t, a, code, took, appProbes(), readiness(), istioReadiness())
}

// Acceptance 3: ProxyConfig terminationDrainDuration. 40 s, with the app
// ignoring SIGTERM and a request that never ends: the drain ends by 40 s
// and says what held it. 5 s (Istio's default) with a 10 s request: the
// request completes, the deadline staying draind's 25 s.
func TestIstioTerminationDrainDuration(t *testing.T) {
	t.Run("40s", func(t *testing.T) {
		p := newIstioPod(t, map[string]any{"terminationDrainDuration": "40s"})
		p.startApp("--on-term", "ignore")
		p.start()
		decided := p.waitLog(5*time.Second, logevent.DeadlineDecided, nil)
		slow := p.slowRequest(120000)
		p.terminate()
		code, took := p.waitExit(45 * time.Second)
		reached := p.logLines(logevent.DeadlineReached)
		t.Logf("deadline %v decided by %q; draind exit %d at +%s; report: %v", decided["deadline"], decided["decided_by"], code, took, reached)
		if decided["deadline"] != "40s" || decided["decided_by"] != "terminationDrainDuration (PROXY_CONFIG)" {
			t.Errorf("deadline line: %v", decided)
		}
		if took > 40*time.Second || took < 30*time.Second || len(reached) != 1 || code != 0 {
			t.Errorf("exit %d at +%s, %d deadline reports; want 0, by 40 s (after its gate part), one report; log:\n%s", code, took, len(reached), p.draindLog.String())
		}
		select {
		case a := <-slow:
			t.Logf("the stuck request ended with the proxy: %d %v", a.code, a.err)
		case <-time.After(5 * time.Second):
		}
	})
	t.Run("5s", func(t *testing.T) {
		p := newIstioPod(t, map[string]any{"terminationDrainDuration": "5s"})
		p.startApp("--on-term", "graceful")
		p.start()
		decided := p.waitLog(5*time.Second, logevent.DeadlineDecided, nil)
		slow := p.slowRequest(10000)
		p.terminate()
		a := <-slow
		code, took := p.waitExit(30 * time.Second)
		t.Logf("deadline %v decided by %q; the 10 s request: %d %v at +%s; draind exit %d at +%s",
			decided["deadline"], decided["decided_by"], a.code, a.err, a.at.Sub(p.drainedAt), code, took)
		if decided["deadline"] != "25s" || !strings.HasPrefix(fmt.Sprint(decided["decided_by"]), "default: terminationDrainDuration 5s") {
			t.Errorf("deadline line: %v", decided)
		}
		if a.err != nil || a.code != 200 || code != 0 {
			t.Errorf("request %d %v, exit %d; want 200 and 0", a.code, a.err, code)
		}
	})
}

// Istio's Job recipe: the app ends its sidecar with POST
// localhost:15020/quitquitquit, pilot-agent's. pilot-agent ends Envoy and
// exits 0; draind keeps that 0 (pilot-agent's exit code is its own), as
// the container exited without draind.
func TestIstioPilotAgentQuitquitquit(t *testing.T) {
	p := newIstioPod(t, nil)
	p.start()
	c := &http.Client{Transport: &http.Transport{DialContext: p.ns.Dialer()}, Timeout: 5 * time.Second}
	resp, err := c.Post("http://127.0.0.1:"+istioStatusPort+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	p.drainedAt = time.Now()
	code, took := p.waitExit(20 * time.Second)
	exited := p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "exited"})
	t.Logf("pilot-agent's /quitquitquit: %d; draind exit %d %s later (%v: %v, %v)", resp.StatusCode, code, took, exited["why"], exited["how"], exited["when"])
	if resp.StatusCode != 200 || code != 0 {
		t.Errorf("quit answered %d, draind exit %d; want 200 and 0; log:\n%s", resp.StatusCode, code, p.draindLog.String())
	}
}
