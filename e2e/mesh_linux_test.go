package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/envoysim/conformance"
	"github.com/draind/draind/internal/testenv/mesh"
)

// Issue 13: a pod under Istio's own interception (`pilot-agent
// istio-iptables`, REDIRECT and TPROXY). Clients dial the app's port
// (192.0.2.1:8080) and the app dials real destinations (192.0.2.2:9000);
// iptables sends both to envoysim, which runs as uid 1337 and is configured
// as Istio's sidecar Envoy is for the mode. Nothing here dials 15006 or
// 15001.

// The two stats matchers of Istio's bootstrap: with
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS Envoy keeps listener.*.downstream_cx_active;
// by default it keeps none.
const (
	gaugesPresent = "istio_exit_on_zero"
	gaugesAbsent  = "istio"
)

// appPort is the app's port, the one clients dial.
const appPort = "8080"

// meshPod is a pod with Istio's interception installed in its network
// namespace before any of its containers but the sandbox started, as
// istio-init does.
type meshPod struct {
	*pod
	mode mesh.Mode
}

// newMeshPod makes a pod under mode's interception, with envoysim as the
// sidecar proxy configured for that mode and statsMatcher.
func newMeshPod(t *testing.T, mode mesh.Mode, statsMatcher string) *meshPod {
	t.Helper()
	p := newPod(t)
	mesh.Intercept(t, p.ns, mode)
	cfg := p.meshEnvoyConfig(mode, statsMatcher)
	p.proxyCommand = []string{p.bin, "__envoysim", "-c", cfg}
	if mode == mesh.TProxy {
		// draind's --run-proxy-as gives the proxy uid 1337 and no
		// capability (proxy.Options has Credential only), and Envoy's
		// transparent listeners need CAP_NET_ADMIN. Until draind can
		// pass one on, this test-only wrapper does what that option
		// would: draind starts it as root, and it takes uid 1337 with
		// CAP_NET_ADMIN as an ambient capability and execs envoysim.
		p.proxyCommand = append([]string{p.bin, "__proxyas", strconv.Itoa(mesh.ProxyUID)}, p.proxyCommand...)
	}
	return &meshPod{pod: p, mode: mode}
}

// meshEnvoyConfig writes envoysim's config as Istio's sidecar Envoy has it
// for mode: virtualInbound on 15006 to the app on localhost at the
// original destination's port, virtualOutbound on 15001 to the original
// destination, both transparent under TPROXY (Istio's listener builder
// sets transparent on both), Istio's drain flags (45 s, immediate) and
// stats matcher.
func (p *pod) meshEnvoyConfig(mode mesh.Mode, statsMatcher string) string {
	transparent := mode == mesh.TProxy
	cfg := map[string]any{
		"admin_address":  "127.0.0.1:" + strconv.Itoa(adminPort),
		"drain_time_s":   45,
		"drain_strategy": "immediate",
		"stats_matcher":  statsMatcher,
		"listeners": []map[string]any{
			{"name": "virtualInbound", "address": fmt.Sprintf("0.0.0.0:%d", mesh.InboundCapturePort), "direction": "inbound",
				"transparent": transparent, "protocol": "http", "upstream": "127.0.0.1:original_dst_port"},
			{"name": "virtualOutbound", "address": fmt.Sprintf("0.0.0.0:%d", mesh.OutboundCapturePort), "direction": "outbound",
				"transparent": transparent, "protocol": "http", "upstream": "original_dst"},
		},
	}
	if meshDrainGeneration != "" { // envoy_config_linux_test.go
		cfg["drain_generation"] = meshDrainGeneration
	}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(p.dir, "envoy-mesh.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// startDraind starts draind with the harness's flags and args; under
// TPROXY draind starts the proxy as root (the wrapper takes uid 1337).
func (m *meshPod) startDraind(args ...string) {
	m.t.Helper()
	if m.mode == mesh.TProxy {
		args = append(args, "--run-proxy-as", "-1") // the last one wins over the harness's 1337
	}
	m.pod.startDraind(args)
}

// wantGauges waits until draind's /metrics says Envoy keeps the listener
// gauges (present) or not (absent), as statsMatcher makes it, or fails;
// it returns which.
func (m *meshPod) wantGauges(statsMatcher string) string {
	m.t.Helper()
	state := "present"
	if statsMatcher == gaugesAbsent {
		state = "absent"
	}
	series := `draind_envoy_listener_gauges{state="` + state + `"}`
	end := time.Now().Add(5 * time.Second)
	for m.metric(series) != 1 {
		if time.Now().After(end) {
			m.t.Fatalf("%s is not 1 five seconds after ready; log:\n%s", series, m.draindLog.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return state
}

// checkGaugeWarning: with no gauges draind warned exactly once, else never.
func (m *meshPod) checkGaugeWarning(state string) {
	m.t.Helper()
	n := len(m.logLines(logevent.NoListenerGauges))
	if want := map[string]int{"present": 0, "absent": 1}[state]; n != want {
		m.t.Errorf("gauges %s: draind warned %d times that Envoy keeps no listener gauges, want %d", state, n, want)
	}
}

// proxyAsRole is a test-only stand-in for an option draind lacks: run the
// proxy as a uid with CAP_NET_ADMIN kept (ambient), as Go's
// SysProcAttr{Credential, AmbientCaps} would from draind. Started as root,
// it keeps its capabilities across the uid change (PR_SET_KEEPCAPS, on this
// thread only, which then execs), keeps CAP_NET_ADMIN alone, raises it as
// ambient, re-arms the parent-death signal a credential change clears, and
// execs the proxy: argv uid COMMAND ARGS...
func proxyAsRole(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "proxyas: uid and command needed")
		return 2
	}
	id, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyas: uid:", err)
		return 2
	}
	runtime.LockOSThread() // capabilities are per thread: this one execs
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "proxyas: %s: %v\n", what, err)
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		return fail("keep capabilities", err)
	}
	// Raw calls: this thread alone changes credentials (Go's wrappers
	// change every thread's, and the other threads do not keep caps).
	u := uintptr(id)
	for _, call := range [][4]uintptr{{unix.SYS_SETGROUPS, 0, 0, 0}, {unix.SYS_SETRESGID, u, u, u}, {unix.SYS_SETRESUID, u, u, u}} {
		if _, _, e := unix.RawSyscall(call[0], call[1], call[2], call[3]); e != 0 {
			return fail(fmt.Sprintf("credentials (syscall %d)", call[0]), e)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	const netAdmin = 1 << unix.CAP_NET_ADMIN
	data[0].Permitted, data[0].Effective, data[0].Inheritable = netAdmin, netAdmin, netAdmin
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fail("capset", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_NET_ADMIN, 0, 0); err != nil {
		return fail("raise ambient CAP_NET_ADMIN", err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fail("parent-death signal", err)
	}
	argv := args[1:]
	err = unix.Exec(argv[0], argv, os.Environ())
	return fail("exec", err)
}

// holdOutbound makes one HTTP/1.1 call to addr and returns its keep-alive
// connection, left open.
func holdOutbound(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /ping HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && (resp.StatusCode != 200 || resp.Close) {
			err = fmt.Errorf("status %d, close %v", resp.StatusCode, resp.Close)
		}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// meshLoad is the R scenario's client side, in the remote namespace:
// short requests every 20 ms on a keep-alive client until stopShort, and
// long requests each on its own connection. Every response must come from
// Envoy (server: envoy), never from the app directly.
type meshLoad struct {
	stopShort chan struct{}
	// shortRuns is closed once the first short request was answered.
	shortRuns chan struct{}
	// longFrom is when the long requests were sent.
	longFrom time.Time
	wg       sync.WaitGroup

	mu                    sync.Mutex
	shortOK, shortFail    int
	longOK, longFail      int
	longTook, fails       []string
	lastDone, lastLongEnd time.Time
}

// startMeshLoad starts the load and returns once the long requests are in
// flight and a short one was answered.
func (p *pod) startMeshLoad(long int, longFor time.Duration) *meshLoad {
	p.t.Helper()
	l := &meshLoad{stopShort: make(chan struct{}), shortRuns: make(chan struct{})}
	url := "http://" + podIP + ":" + appPort
	check := func(code int, h http.Header, err error) error {
		switch {
		case err != nil:
			return err
		case code != 200:
			return fmt.Errorf("status %d", code)
		case h.Get("Server") != "envoy":
			return fmt.Errorf("answered by %q, not through Envoy", h.Get("Server"))
		}
		return nil
	}
	get := func(c *http.Client, path string) error {
		resp, err := c.Get(url + path)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return check(resp.StatusCode, resp.Header, err)
	}
	record := func(ok *int, bad *int, err error, what string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lastDone = time.Now()
		if err != nil {
			*bad++
			l.fails = append(l.fails, fmt.Sprintf("%s: %v", what, err))
			return
		}
		*ok++
	}
	short := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 10 * time.Second}
	l.wg.Go(func() {
		defer short.CloseIdleConnections() // the client leaves: its keep-alive closes
		for first := true; ; first = false {
			select {
			case <-l.stopShort:
				return
			default:
			}
			err := get(short, "/")
			record(&l.shortOK, &l.shortFail, err, "short")
			if first {
				close(l.shortRuns)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	l.longFrom = time.Now()
	for range long {
		c := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer()}, Timeout: 30 * time.Second}
		start := time.Now()
		reply := inFlight(p.t, c, url+slowPath(longFor))
		l.wg.Go(func() {
			defer c.CloseIdleConnections()
			r := <-reply
			record(&l.longOK, &l.longFail, check(r.Code, r.Header, r.Err), "long")
			l.mu.Lock()
			l.longTook = append(l.longTook, r.At.Sub(start).Round(time.Millisecond).String())
			l.lastLongEnd = r.At
			l.mu.Unlock()
		})
	}
	select {
	case <-l.shortRuns:
	case <-time.After(inFlightWithin):
		p.t.Fatalf("no short request answered within %s", inFlightWithin)
	}
	return l
}

// rRow is one row of the R scenario's report. Times are after SIGTERM.
type rRow struct {
	mode, gauges              string
	shortOK, shortFail        int
	longOK, longFail          int
	callsOK, viaEnvoy, fail   int
	appExit, appReaped        time.Duration // its last act (its result's exit line); its container's end as the test saw it
	quit, draindExit, lastReq time.Duration
	code                      int
}

func (r rRow) String() string {
	ms := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("%-8s gauges %-7s | short %d ok / %d failed | long %d ok / %d failed | app calls %d ok (%d through Envoy) / %d failed | last request done +%s, app exit +%s (reaped +%s) | quitquitquit %s after the app's exit, draind exit %s after it (code %d)",
		r.mode, r.gauges, r.shortOK, r.shortFail, r.longOK, r.longFail, r.callsOK, r.viaEnvoy, r.fail,
		ms(r.lastReq), ms(r.appExit), ms(r.appReaped), ms(r.quit-r.appExit), ms(r.draindExit-r.appExit), r.code)
}

// Acceptance 1: the R scenario under Istio's interception, REDIRECT and
// TPROXY, with Envoy's listener gauges present and absent. Short requests
// every 20 ms, two 7 s requests in flight at SIGTERM, and the app's 30
// outbound calls through the proxy after SIGTERM (they outlast the
// inbound requests): nothing fails, every response and call went through
// Envoy, and the proxy is told to quit only after the app exited and the
// last request completed.
func TestMeshRScenario(t *testing.T) {
	var rows []string
	for _, mode := range []mesh.Mode{mesh.Redirect, mesh.TProxy} {
		for _, matcher := range []string{gaugesPresent, gaugesAbsent} {
			t.Run(string(mode)+"/"+matcher, func(t *testing.T) {
				row := runMeshR(t, mode, matcher)
				rows = append(rows, row.String())
			})
		}
	}
	t.Logf("R scenario under Istio's interception:\n%s", strings.Join(rows, "\n"))
}

func runMeshR(t *testing.T, mode mesh.Mode, matcher string) rRow {
	m := newMeshPod(t, mode, matcher)
	m.startApp("--on-term", "graceful", "--linger", "1s", "--outbound-count", "30", "--outbound-pause", "200ms",
		"--outbound-url", "http://"+remoteIP+":9000/ping")
	m.startDraind("--min-drain", "1s", "--tracker", "ebpf", "--app-procs", "ebpf")
	m.wantSources("ebpf", "ebpf")
	state := m.wantGauges(matcher)
	l := m.startMeshLoad(2, 7*time.Second) // short load running, long requests in flight
	// The requests' age at SIGTERM, not their being in flight: they end
	// 5.5 s after it, before the app's calls do.
	time.Sleep(time.Until(l.longFrom.Add(1500 * time.Millisecond)))
	m.terminate()
	time.Sleep(500 * time.Millisecond) // endpoints propagate: clients still come
	close(l.stopShort)
	l.wg.Wait()
	code, _ := m.waitExit(30 * time.Second)
	if !m.app.wait(10 * time.Second) {
		t.Fatal("the app did not exit")
	}
	ok, _, fail, appExit := m.appCalls()
	row := rRow{mode: string(mode), gauges: state, shortOK: l.shortOK, shortFail: l.shortFail, longOK: l.longOK, longFail: l.longFail,
		callsOK: ok, viaEnvoy: m.appCallsViaEnvoy(), fail: fail, code: code,
		appExit: appExit.Sub(m.drainedAt), appReaped: m.app.exitedAt.Sub(m.drainedAt), quit: m.phaseTime("stopping").Sub(m.drainedAt),
		draindExit: m.draind.exitedAt.Sub(m.drainedAt), lastReq: l.lastDone.Sub(m.drainedAt)}
	t.Log(row)
	for _, f := range l.fails {
		t.Errorf("request failed: %s", f)
	}
	if l.shortFail+l.longFail+fail > 0 || l.longOK != 2 || ok != 30 || code != 0 {
		t.Errorf("failures: %d short, %d long (%d ok of 2), %d app calls (%d ok of 30), draind exit %d; log:\n%s",
			l.shortFail, l.longFail, l.longOK, fail, ok, code, m.draindLog.String())
	}
	if row.viaEnvoy != 30 {
		t.Errorf("%d of the app's 30 calls were answered by Envoy (server: envoy): the others bypassed it", row.viaEnvoy)
	}
	if appExit.IsZero() || row.quit < row.appExit || row.quit < row.lastReq {
		t.Errorf("the proxy was told to quit at +%s, before the app exited (+%s) or the last request completed (+%s)",
			row.quit, row.appExit, row.lastReq)
	}
	m.checkGaugeWarning(state)
	return row
}

// appCallsViaEnvoy counts the app's outbound calls answered by Envoy.
func (p *pod) appCallsViaEnvoy() int {
	b, _ := os.ReadFile(p.appResult)
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "ok ") && strings.HasSuffix(line, " via-envoy") {
			n++
		}
	}
	return n
}

// h2cClient is a gRPC-like client in the remote namespace: HTTP/2
// cleartext with prior knowledge (net/http's UnencryptedHTTP2).
func (p *pod) h2cClient() *http.Client {
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: protos, DialContext: p.remote.Dialer()}, Timeout: 30 * time.Second}
}

// h2Frames reads a raw HTTP/2 connection's frames into a log of the
// ones that matter (GOAWAY, HEADERS, trailers, DATA), with when each came.
type h2Frames struct {
	t   *testing.T
	h   *conformance.H2Conn
	log []string
	at  []time.Time
}

func (f *h2Frames) next() conformance.Frame {
	f.t.Helper()
	fr, err := f.h.Next(15 * time.Second)
	if err != nil {
		f.t.Fatalf("after %v: %v", f.log, err)
	}
	var e string
	if last, _, ok := fr.GoAway(); ok {
		e = fmt.Sprintf("goaway %d", last)
	} else {
		switch {
		case fr.Type == conformance.FrameHeaders && fr.EndStream():
			e = fmt.Sprintf("trailers %d", fr.Stream)
		case fr.Type == conformance.FrameHeaders:
			e = fmt.Sprintf("headers %d", fr.Stream)
		case fr.Type == conformance.FrameData:
			e = fmt.Sprintf("data %d", fr.Stream)
		default:
			e = fr.String()
		}
	}
	f.log = append(f.log, e)
	f.at = append(f.at, time.Now())
	return fr
}

// when is when the first frame logged as e came.
func (f *h2Frames) when(e string) time.Time {
	for i, x := range f.log {
		if x == e {
			return f.at[i]
		}
	}
	return time.Time{}
}

// Acceptance 2, the stream: a gRPC-style server stream over HTTP/2
// through envoysim's inbound listener (the client dials the app's port)
// runs across SIGTERM. On a raw HTTP/2 connection the next response after
// the drain brings the GOAWAY (last-stream-id 2^31-1), the final GOAWAY
// follows Envoy's drain_timeout (5 s) later, the stream completes with its
// grpc-status trailer, and the connection closes. Go's HTTP/2 client's
// stream completes too, and its next request after the GOAWAY goes on a
// new connection. The proxy is told to quit only after the streams ended.
func TestMeshH2Stream(t *testing.T) {
	for _, mode := range []mesh.Mode{mesh.Redirect, mesh.TProxy} {
		t.Run(string(mode), func(t *testing.T) {
			m := newMeshPod(t, mode, gaugesPresent)
			m.startApp("--on-term", "graceful", "--linger", "5s") // serving through the requests below, however slow the machine
			m.startDraind("--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "ebpf")
			m.wantSources("ebpf", "ebpf")
			authority := podIP + ":" + appPort
			const streamPath = "/stream?n=35&ms=200" // 7 s
			var h *conformance.H2Conn
			var err error
			m.remote.Do(t, func() { h, err = conformance.DialH2(context.Background(), authority) })
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			raw := &h2Frames{t: t, h: h}
			stream, err := h.Get(authority, streamPath)
			if err != nil {
				t.Fatal(err)
			}
			for raw.next().Type != conformance.FrameData {
			}

			// Go's client: its own stream, and where its later requests go.
			hc := m.h2cClient()
			defer hc.CloseIdleConnections()
			goStream := make(chan string, 1)
			goStarted := make(chan struct{})
			go func() {
				resp, err := hc.Get("http://" + authority + streamPath)
				if err != nil {
					close(goStarted)
					goStream <- "error: " + err.Error()
					return
				}
				close(goStarted)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				goStream <- fmt.Sprintf("%s %d chunks, grpc-status %q, err %v", resp.Proto, strings.Count(string(b), "chunk"), resp.Trailer.Get("Grpc-Status"), err)
			}()
			<-goStarted
			time.Sleep(300 * time.Millisecond)

			m.terminate()
			m.waitLog(5*time.Second, logevent.DrainListenersSent, nil)
			drained := time.Now()
			second, err := h.Get(authority, "/")
			if err != nil {
				t.Fatal(err)
			}
			ended := false
			for fr := raw.next(); fr.Stream != second || fr.Type != conformance.FrameHeaders; fr = raw.next() {
				ended = ended || fr.Stream == stream && fr.EndStream()
			}
			goConns := m.goRequestsAfterDrain(hc, "http://"+authority+"/", 3)
			for !ended {
				fr := raw.next()
				ended = fr.Stream == stream && fr.EndStream()
			}
			streamEnd := time.Now()
			_, eofErr := h.Next(15 * time.Second)
			closedAt := time.Now()
			goResult := <-goStream
			code, _ := m.waitExit(30 * time.Second)
			quit := m.phaseTime("stopping")

			got := strings.Join(raw.log, ", ")
			var order []string
			for _, e := range raw.log {
				if e != fmt.Sprintf("data %d", stream) && (len(order) == 0 || order[len(order)-1] != e) {
					order = append(order, e)
				}
			}
			first, final := fmt.Sprintf("goaway %d", conformance.MaxStreamID), fmt.Sprintf("goaway %d", second)
			t.Logf("%s: raw HTTP/2 frames (stream %d's data aside): %s", mode, stream, strings.Join(order, ", "))
			t.Logf("%s: first GOAWAY +%s after drain_listeners, final GOAWAY %s after the first; stream done +%s after SIGTERM, connection closed (%v) %s after it; quitquitquit +%s after SIGTERM (%s after the stream's end); draind exit %d",
				mode, raw.when(first).Sub(drained).Round(time.Millisecond), raw.when(final).Sub(raw.when(first)).Round(time.Millisecond),
				streamEnd.Sub(m.drainedAt).Round(time.Millisecond), eofErr, closedAt.Sub(streamEnd).Round(time.Millisecond),
				quit.Sub(m.drainedAt).Round(time.Millisecond), quit.Sub(streamEnd).Round(time.Millisecond), code)
			t.Logf("%s: Go h2c client: stream %s; requests after the drain reused a connection: %v", mode, goResult, goConns)
			want := []string{
				fmt.Sprintf("headers %d", stream), first,
				fmt.Sprintf("headers %d", second), fmt.Sprintf("data %d", second),
				final, fmt.Sprintf("trailers %d", stream),
			}
			if strings.Join(order, ", ") != strings.Join(want, ", ") {
				t.Errorf("frames: %s\nwant (stream %d's data aside): %s", got, stream, strings.Join(want, ", "))
			}
			if n := strings.Count(got, fmt.Sprintf("data %d", stream)); n < 35 {
				t.Errorf("%d data frames on the stream, want 35", n)
			}
			if !errors.Is(eofErr, io.EOF) {
				t.Errorf("after the stream: %v, want the connection closed with a FIN", eofErr)
			}
			if goResult != `HTTP/2.0 35 chunks, grpc-status "0", err <nil>` {
				t.Errorf("Go client's stream: %s", goResult)
			}
			// The first request after the drain rides the old connection
			// and brings the GOAWAY; the client then opens a new one.
			if len(goConns) != 3 || !goConns[0] || goConns[1] {
				t.Errorf("Go client's requests after the drain reused a connection: %v; want [true false ...]", goConns)
			}
			if code != 0 || quit.Before(streamEnd) {
				t.Errorf("draind exit %d, told the proxy to quit at %s, the stream ended at %s; log:\n%s", code, quit, streamEnd, m.draindLog.String())
			}
		})
	}
}

// goRequestsAfterDrain makes n requests with Go's HTTP/2 client, 100 ms
// apart, and says for each whether it went on a connection used before.
func (m *meshPod) goRequestsAfterDrain(hc *http.Client, url string, n int) []bool {
	m.t.Helper()
	var reused []bool
	for range n {
		var r bool
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { r = i.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			m.t.Fatalf("Go client request during the drain: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			m.t.Fatalf("Go client request during the drain: %s %d", resp.Proto, resp.StatusCode)
		}
		reused = append(reused, r)
		time.Sleep(100 * time.Millisecond)
	}
	return reused
}

// Acceptance 2, idle: an HTTP/2 connection left idle after its one
// request gets nothing from Envoy's drain and stays in its
// downstream_cx_active (gauges kept). To an app that stays (it ignores
// SIGTERM; --app-exit flows), --idle-timeout 2s lets it go 2 s after it
// went idle. Once the app is gone it is parked, and holds nothing without
// an idle timeout (drain.EnvoyDrained).
func TestMeshH2IdleConnection(t *testing.T) {
	for _, mode := range []mesh.Mode{mesh.Redirect, mesh.TProxy} {
		for _, app := range []string{"stays", "gone"} {
			t.Run(string(mode)+"/app-"+app, func(t *testing.T) {
				m := newMeshPod(t, mode, gaugesPresent)
				// The connection stays open (no closer as the min-drain
				// ends): the gate's rule for it is the subject.
				args := []string{"--min-drain", "200ms", "--drain-deadline", "20s", "--tracker", "ebpf", "--app-procs", "ebpf", "--close-idle-keepalives=false"}
				if app == "stays" {
					m.startApp("--on-term", "ignore")
					args = append(args, "--idle-timeout", "2s", "--app-exit", "flows")
				} else {
					m.startApp("--on-term", "exit")
				}
				m.startDraind(args...)
				m.wantSources("ebpf", "ebpf")
				hc := m.h2cClient()
				defer hc.CloseIdleConnections()
				resp, err := hc.Get("http://" + podIP + ":" + appPort + "/")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				idleFrom := time.Now()
				if resp.ProtoMajor != 2 || resp.Header.Get("Server") != "envoy" {
					t.Fatalf("%s, server %q: not HTTP/2 through Envoy", resp.Proto, resp.Header.Get("Server"))
				}
				time.Sleep(500 * time.Millisecond) // idle before the drain too
				m.terminate()
				var active string
				if app == "stays" {
					// Envoy's drain sends the idle connection nothing: its
					// gauge still counts it a second into the drain.
					time.Sleep(time.Second)
					active = m.envoyStat(`^listener\.0\.0\.0\.0_15006\.downstream_cx_active$`)
				}
				code, _ := m.waitExit(20 * time.Second)
				stopping := m.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "stopping"})
				quit := m.phaseTime("stopping")
				released := quit.Sub(idleFrom)
				t.Logf("%s, app %s: idle HTTP/2 connection: Envoy's %q a second into the drain; the proxy told to quit %s after it went idle (%s after SIGTERM), with %v; draind exit %d",
					mode, app, active, released.Round(time.Millisecond), quit.Sub(m.drainedAt).Round(time.Millisecond), stopping["flows"], code)
				fl, _ := stopping["flows"].(map[string]any)
				if code != 0 || stopping["why"] != "drained" {
					t.Errorf("exit %d, stopping %v; log:\n%s", code, stopping["why"], m.draindLog.String())
				}
				if app == "gone" {
					if fl["envoy_downstream"] != float64(1) || fl["envoy_downstream_parked"] != float64(1) {
						t.Errorf("stopped with %v: want the idle HTTP/2 connection still open, and parked", fl)
					}
					return
				}
				if fl["envoy_downstream"] != float64(1) || fl["envoy_downstream_idle"] != float64(1) {
					t.Errorf("stopped with %v: want the idle HTTP/2 connection still open and idle", fl)
				}
				if active != "listener.0.0.0.0_15006.downstream_cx_active: 1" {
					t.Errorf("Envoy's gauge a second into the drain: %q, want the idle connection counted", active)
				}
				if released < 2*time.Second {
					t.Errorf("released %s after the connection went idle, before --idle-timeout 2s", released)
				}
			})
		}
	}
}

// Acceptance 3: `draind conns -o json`, run in a container of its own in a
// TPROXY pod, with two inbound requests in flight through Envoy (the
// clients dial the app's port) and the app's one outbound keep-alive call
// through Envoy held open. Envoy's downstream flows are its inbound ones,
// exactly: the two TPROXY'd connections (local address the app's port) and
// the app's call accepted on 15001. Checked twice: over the flows of the
// traffic (draind's own connections to Envoy's admin API and to its status
// port set aside), and in the summary conns prints, which must count the
// same.
func TestMeshConnsTPROXY(t *testing.T) {
	m := newMeshPod(t, mesh.TProxy, gaugesPresent)
	m.startDraind("--min-drain", "200ms")
	m.startApp("--on-term", "exit", "--hold-outbound", remoteIP+":9000")
	for range 2 {
		go func() {
			c := &http.Client{Transport: &http.Transport{DialContext: m.remote.Dialer()}}
			defer c.CloseIdleConnections()
			if resp, err := c.Get("http://" + podIP + ":" + appPort + "/slow?ms=60000"); err == nil {
				resp.Body.Close()
			}
		}()
	}
	m.client.CloseIdleConnections() // the harness's own keep-alive to draind's status port
	want := flows.Summary{AppInbound: 2, AppOutbound: 1, ProxyInbound: 3, ProxyOutbound: 3}
	var snap connsOutput
	var traffic flows.Summary
	var out string
	var lines []string
	for end := time.Now().Add(10 * time.Second); ; {
		snap, out = m.conns()
		traffic, lines = snap.traffic()
		if traffic == want || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("draind conns -o json: summary %+v\nflows holding the drain (as conns classified them):\n%s", snap.Summary, strings.Join(lines, "\n"))
	if traffic != want {
		t.Errorf("the traffic's flows, as conns classified them: %+v; want app_inbound %d, app_outbound %d, proxy_inbound %d, proxy_outbound %d\n%s",
			traffic, want.AppInbound, want.AppOutbound, want.ProxyInbound, want.ProxyOutbound, out)
	}
	// Each of Envoy's TPROXY'd downstream sockets by itself: the local
	// address is the app's, the owner Envoy, the direction inbound.
	tproxied := 0
	for _, f := range snap.Flows {
		if f.Local == podIP+":"+appPort && strings.HasPrefix(f.Remote, remoteIP+":") && f.Holds {
			tproxied++
			if f.Owner != "proxy" || f.Direction != "inbound" || !f.Transparent || f.UID != mesh.ProxyUID {
				t.Errorf("Envoy's TPROXY'd socket %s -> %s: owner %s direction %s transparent %v uid %d", f.Local, f.Remote, f.Owner, f.Direction, f.Transparent, f.UID)
			}
		}
	}
	if tproxied != 2 {
		t.Errorf("%d sockets with the app's address as local and the client as remote, want Envoy's 2", tproxied)
	}
	// draind run's own tracker in the same pod, for comparison (its
	// policy knows draind's admin and status ports; its gate also leaves
	// out Envoy's admin side).
	var tracked []string
	for _, class := range []string{"app_listeners", "app_inbound", "app_outbound", "proxy_listeners", "proxy_flows"} {
		tracked = append(tracked, fmt.Sprintf("%s %v", class, m.metric(`draind_tracked_flows{class="`+class+`"}`)))
	}
	t.Logf("draind run's tracker (/metrics): %s", strings.Join(tracked, ", "))
	s := snap.Summary
	if s.AppInbound != want.AppInbound || s.AppOutbound != want.AppOutbound || s.ProxyInbound != want.ProxyInbound || s.ProxyOutbound != want.ProxyOutbound {
		t.Errorf("conns' summary: app_inbound %d, app_outbound %d, proxy_inbound %d, proxy_outbound %d; want %d, %d, %d, %d "+
			"(draind conns counts draind's own keep-alive connections to Envoy's admin API, uid 0 to 127.0.0.1:%d, as the app's outbound flows and Envoy's side of them as its downstream)",
			s.AppInbound, s.AppOutbound, s.ProxyInbound, s.ProxyOutbound, want.AppInbound, want.AppOutbound, want.ProxyInbound, want.ProxyOutbound, adminPort)
	}
}

// draind's own ports in the pod: Envoy's admin API, which draind calls, and
// draind's status server.
const (
	adminPort  = 15000
	statusPort = mesh.StatusPort
)

// traffic counts the flows holding the drain by owner and direction as
// conns classified them, leaving out draind's own connections (to Envoy's
// admin API and to draind's status port), and lists every holding flow.
func (c connsOutput) traffic() (flows.Summary, []string) {
	var s flows.Summary
	var lines []string
	for _, f := range c.Flows {
		if !f.Holds {
			continue
		}
		control := false
		for _, a := range []string{f.Local, f.Remote} {
			port := a[strings.LastIndex(a, ":")+1:]
			control = control || port == strconv.Itoa(adminPort) || port == strconv.Itoa(statusPort)
		}
		note := ""
		if control {
			note = "  (draind's own)"
		}
		lines = append(lines, fmt.Sprintf("%-5s %-8s %-21s -> %-21s uid %-4d transparent %-5v %s%s", f.Owner, f.Direction, f.Local, f.Remote, f.UID, f.Transparent, f.State, note))
		switch {
		case control:
		case f.Owner == "proxy" && f.Direction == "inbound":
			s.ProxyInbound++
		case f.Owner == "proxy":
			s.ProxyOutbound++
		case f.Direction == "inbound":
			s.AppInbound++
		default:
			s.AppOutbound++
		}
	}
	return s, lines
}

// connsOutput is what `draind conns -o json` prints, as read back.
type connsOutput struct {
	Summary flows.Summary `json:"summary"`
	Flows   []struct {
		State, Local, Remote, Owner, Direction string
		UID                                    uint32
		Transparent, Holds                     bool
	} `json:"flows"`
}

// envoyStat reads Envoy's stats matching filter from inside the pod (the
// test's uid is not intercepted), trimmed.
func (m *meshPod) envoyStat(filter string) string {
	m.t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: m.ns.Dialer()}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(adminPort) + "/stats?filter=" + url.QueryEscape(filter))
	if err != nil {
		m.t.Fatalf("envoy stats: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// conns runs `draind conns -o json` in a container of its own in the pod
// and decodes it.
func (m *meshPod) conns() (connsOutput, string) {
	m.t.Helper()
	var out syncBuffer
	c := m.runContainer("conns", -1, &out, "__draind", "conns", "-o", "json")
	if !c.wait(20*time.Second) || c.code != 0 {
		m.t.Fatalf("draind conns: exit %d: %s", c.code, out.String())
	}
	var snap connsOutput
	if err := json.Unmarshal([]byte(out.String()), &snap); err != nil {
		m.t.Fatalf("draind conns -o json: %v\n%s", err, out.String())
	}
	return snap, out.String()
}
