package envoysim_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/testenv/envoysim"
)

// TestDrainInboundGraceful walks pilot-agent's drain, POST
// /drain_listeners?inboundonly&graceful, on real loopback sockets: an
// in-flight HTTP/1.1 request ends with Connection: close, an idle keep-alive
// connection stays, new inbound connections are accepted until the drain
// time and refused after, the outbound listener never stops, and
// downstream_cx_active follows every step. Only orders and generous bounds
// are asserted.
func TestDrainInboundGraceful(t *testing.T) {
	const drainTime = 2 * time.Second
	ctx := context.Background()
	up := newUpstream(t)
	echo := echoServer(t)
	sim := startSim(t, envoysim.Config{
		Concurrency:   2,
		DrainTime:     drainTime,
		DrainStrategy: "immediate",
		Listeners: []envoysim.ListenerConfig{
			{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up.addr},
			{Name: "out", Address: "127.0.0.1:0", Direction: "outbound", Protocol: "tcp", Upstream: echo},
		},
	})
	in, out := sim.ListenerAddr("in"), sim.ListenerAddr("out")
	inStat, outStat := sim.ListenerStatName("in"), sim.ListenerStatName("out")
	c := envoy.New(sim.AdminAddr(), envoy.WithTimeout(5*time.Second), envoy.WithExclude(envoy.ExcludeSet{}))

	expect := func(step string, wantIn, wantOut uint64) {
		t.Helper()
		eventually(t, step, func() error {
			ac, err := c.ActiveDownstream(ctx)
			if err != nil {
				return err
			}
			got := map[string]uint64{}
			for _, l := range ac.Listeners {
				got[l.Listener] = l.Active
			}
			if got[inStat] != wantIn || got[outStat] != wantOut || ac.Total != wantIn+wantOut {
				return fmt.Errorf("active in=%d out=%d total=%d; want in=%d out=%d", got[inStat], got[outStat], ac.Total, wantIn, wantOut)
			}
			return nil
		})
	}
	expect("before any connection", 0, 0)

	// An idle keep-alive connection, after one request.
	idle := dialHTTP(t, in)
	resp, body := idle.get("/fast")
	if resp.StatusCode != 200 || body != "fast" || resp.Close {
		t.Fatalf("keep-alive request: %d %q close=%t", resp.StatusCode, body, resp.Close)
	}
	// A slow request in flight.
	slow := dialHTTP(t, in)
	slow.send("/slow")
	select {
	case <-up.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow request never reached the upstream")
	}
	dialEcho(t, out)
	expect("idle + in-flight inbound, one outbound", 2, 1)

	drainStart := time.Now()
	if err := c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
		t.Fatal(err)
	}

	// Draining, within the drain time: new inbound connections are still
	// accepted, and their responses close them.
	fresh := dialHTTP(t, in)
	if time.Since(drainStart) >= drainTime {
		t.Skip("the machine is too slow to dial within the drain time")
	}
	resp, body = fresh.get("/fast")
	if resp.StatusCode != 200 || body != "fast" || !closes(resp) {
		t.Errorf("new inbound connection while draining: %d %q, headers %v; want Connection: close", resp.StatusCode, body, resp.Header)
	}
	if !fresh.closedByPeer() {
		t.Error("the proxy kept the drained connection open")
	}

	// The in-flight request completes, with Connection: close.
	close(up.release)
	resp, body = slow.read()
	if resp.StatusCode != 200 || body != "slow done" || !closes(resp) {
		t.Errorf("in-flight response: %d %q, headers %v; want Connection: close", resp.StatusCode, body, resp.Header)
	}
	if !slow.closedByPeer() {
		t.Error("the proxy kept the in-flight request's connection open")
	}
	expect("in-flight done, idle left", 1, 1)

	// Outbound is not drained: it accepts, and so on.
	dialEcho(t, out)
	expect("second outbound", 1, 2)

	// After the drain time, the inbound listener stops: refused.
	eventually(t, "inbound listener stopped", func() error {
		if !refused(in) {
			return fmt.Errorf("inbound still accepts %v after the drain began", time.Since(drainStart))
		}
		return nil
	})
	if d := time.Since(drainStart); d < drainTime {
		t.Errorf("inbound refused %v after the drain began, before the drain time %v", d, drainTime)
	}
	// ... but the outbound listener still accepts.
	dialEcho(t, out)
	expect("inbound stopped, idle still open, third outbound", 1, 3)

	// The idle connection survived the stop; its next response closes it.
	resp, body = idle.get("/fast")
	if resp.StatusCode != 200 || body != "fast" || !closes(resp) {
		t.Errorf("idle connection's next response: %d %q, headers %v", resp.StatusCode, body, resp.Header)
	}
	if !idle.closedByPeer() {
		t.Error("the proxy kept the idle connection open after Connection: close")
	}
	expect("all inbound gone", 0, 3)

	// The drain changed neither /ready nor server.state, and never exits.
	if code, body := adminGet(t, sim, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("ready %d %q", code, body)
	}
	if l, err := c.Live(ctx); !l.Live() || err != nil {
		t.Errorf("live %+v %v", l, err)
	}
	if v, ok := sim.Stat("listener_manager.listener_stopped"); v != 1 || !ok {
		t.Errorf("listener_stopped %d %t", v, ok)
	}
	if v, ok := sim.Stat("http.in.downstream_cx_drain_close"); v != 3 || !ok {
		t.Errorf("http.in.downstream_cx_drain_close %d %t, want 3", v, ok)
	}
	select {
	case <-sim.Done():
		t.Error("the sim exited on its own")
	default:
	}
}

func TestDrainNotGraceful(t *testing.T) {
	echo := echoServer(t)
	up := newUpstream(t)
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up.addr},
		{Name: "out", Address: "127.0.0.1:0", Direction: "outbound", Upstream: echo},
		{Name: "other", Address: "127.0.0.1:0", Upstream: echo},
	}})
	in, out, other := sim.ListenerAddr("in"), sim.ListenerAddr("out"), sim.ListenerAddr("other")
	keep := dialHTTP(t, in)
	keepOut := dialEcho(t, out)

	// inboundonly, not graceful: the inbound listener stops at once.
	if code, body := adminDo(t, sim, "POST", "/drain_listeners?inboundonly"); code != 200 || body != "OK\n" {
		t.Fatalf("%d %q", code, body)
	}
	if !refused(in) {
		t.Error("inbound still accepts")
	}
	if refused(out) || refused(other) {
		t.Error("an outbound or unspecified listener stopped")
	}
	// Existing connections stay, and are not drain-closed.
	if resp, _ := keep.get("/fast"); resp.StatusCode != 200 || resp.Close {
		t.Errorf("existing inbound connection: %d close=%t", resp.StatusCode, resp.Close)
	}
	// Everything, not graceful: every listener stops at once.
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners"); code != 200 {
		t.Fatal(code)
	}
	if !refused(out) || !refused(other) {
		t.Error("listeners still accept")
	}
	if _, err := keepOut.Write([]byte("x")); err != nil {
		t.Error(err)
	}
	buf := make([]byte, 1)
	if _, err := keepOut.Read(buf); err != nil || buf[0] != 'x' {
		t.Errorf("existing outbound connection: %v", err)
	}
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners"); code != 200 {
		t.Errorf("repeated drain: %d", code)
	}
	if code, body := adminGet(t, sim, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("ready %d %q", code, body)
	}
}

func TestDrainSkipExit(t *testing.T) {
	echo := echoServer(t)
	sim := startSim(t, envoysim.Config{
		DrainTime: 200 * time.Millisecond,
		Listeners: []envoysim.ListenerConfig{{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Upstream: echo}},
	})
	if code, body := adminDo(t, sim, "POST", "/drain_listeners?skip_exit"); code != 400 || body != "skip_exit requires graceful\n" {
		t.Errorf("skip_exit alone: %d %q", code, body)
	}
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners?graceful&skip_exit"); code != 200 {
		t.Fatal(code)
	}
	time.Sleep(1 * time.Second) // five drain times
	dialEcho(t, sim.ListenerAddr("in"))
}

func TestDrainGradualAfterDrainTime(t *testing.T) {
	up := newUpstream(t)
	sim := startSim(t, envoysim.Config{
		DrainTime:     300 * time.Millisecond,
		DrainStrategy: "gradual",
		Listeners: []envoysim.ListenerConfig{
			{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up.addr},
			{Name: "out", Address: "127.0.0.1:0", Direction: "outbound", Protocol: "http", Upstream: up.addr},
		},
	})
	conn := dialHTTP(t, sim.ListenerAddr("in"))
	outConn := dialHTTP(t, sim.ListenerAddr("out"))
	conn.get("/fast")
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners?graceful&inboundonly"); code != 200 {
		t.Fatal(code)
	}
	eventually(t, "drain time over", func() error {
		if !refused(sim.ListenerAddr("in")) {
			return fmt.Errorf("still accepting")
		}
		return nil
	})
	// Past the drain time the probability is 1.
	if resp, _ := conn.get("/fast"); !closes(resp) {
		t.Errorf("gradual, after the drain time: headers %v", resp.Header)
	}
	// The outbound listener is not draining.
	for range 20 {
		if resp, _ := outConn.get("/fast"); resp.Close {
			t.Fatal("outbound response drain-closed")
		}
	}
}

func TestHealthcheckFailDrainCloses(t *testing.T) {
	up := newUpstream(t)
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "def", Address: "127.0.0.1:0", Protocol: "http", Upstream: up.addr},
		{Name: "mod", Address: "127.0.0.1:0", Protocol: "http", Upstream: up.addr, DrainType: "modify_only"},
	}})
	def, mod := dialHTTP(t, sim.ListenerAddr("def")), dialHTTP(t, sim.ListenerAddr("mod"))
	if code, body := adminDo(t, sim, "POST", "/healthcheck/fail"); code != 200 || body != "OK\n" {
		t.Fatal(code, body)
	}
	if code, body := adminGet(t, sim, "/ready"); code != 503 || body != "DRAINING\n" {
		t.Errorf("ready %d %q", code, body)
	}
	if _, body := adminGet(t, sim, "/stats?filter=^server.state$"); body != "server.state: 1\n" {
		t.Errorf("stats %q", body)
	}
	if resp, _ := def.get("/fast"); !closes(resp) {
		t.Error("default drain type: not drain-closed")
	}
	// On the wire: the header itself, then the proxy closes.
	raw := dial(t, sim.ListenerAddr("def"))
	io.WriteString(raw, "GET /fast HTTP/1.1\r\nHost: app\r\n\r\n")
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(raw); err != nil || !strings.Contains(string(b), "\r\nConnection: close\r\n") {
		t.Errorf("raw response %q, %v", b, err)
	}
	if resp, _ := mod.get("/fast"); resp.Close {
		t.Error("modify_only: drain-closed")
	}
	if !refused(sim.ListenerAddr("def")) {
		dialHTTP(t, sim.ListenerAddr("def")) // still accepting, as Envoy does
	} else {
		t.Error("healthcheck/fail stopped a listener")
	}
	adminDo(t, sim, "POST", "/healthcheck/ok")
	if code, body := adminGet(t, sim, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("ready after ok: %d %q", code, body)
	}
}

// The gradual strategy closes with probability 1/N already in the first
// second of an N-second drain (Envoy's DrainManagerImpl::drainClose works
// in whole seconds of remaining time, rounded down): some responses close
// their connection, some do not.
func TestDrainGradualFirstSecond(t *testing.T) {
	up := newUpstream(t)
	sim := startSim(t, envoysim.Config{
		DrainTime:     3 * time.Second,
		DrainStrategy: "gradual",
		Listeners:     []envoysim.ListenerConfig{{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up.addr}},
	})
	conn := dialHTTP(t, sim.ListenerAddr("in"))
	start := time.Now()
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners?graceful"); code != 200 {
		t.Fatal(code)
	}
	n, closed := 0, 0
	for n < 60 && time.Since(start) < 900*time.Millisecond {
		resp, _ := conn.get("/fast")
		n++
		if closes(resp) {
			closed++
			conn.c.Close() // the client hangs up, as told (Envoy would wait drain_timeout for it)
			conn = dialHTTP(t, sim.ListenerAddr("in"))
		}
	}
	if time.Since(start) >= time.Second || n < 30 {
		t.Skipf("only %d responses in the first second (a loaded machine): nothing to judge", n)
	}
	if closed == 0 || closed == n {
		t.Errorf("%d of %d responses drain-closed in the first second of a 3 s drain, want about a third", closed, n)
	}
}
