package envoy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/envoy/envoysim"
)

// echoServer is a TCP upstream that echoes, closed at the end of the test.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func hasIPv6(t *testing.T) bool {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func startSim(t *testing.T, cfg envoysim.Config) *envoysim.Sim {
	t.Helper()
	s, err := envoysim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// dialEcho opens a proxied connection and proves it works end to end.
func dialEcho(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through %s: %q, %v", addr, buf, err)
	}
	return c
}

// eventually polls f until it returns nil, for up to 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestClientAgainstSim(t *testing.T) {
	ctx := context.Background()
	echo := echoServer(t)
	ls := []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "tcp", Upstream: echo},
		{Name: "vo", Address: "127.0.0.1:0", StatPrefix: "virtualOutbound", Direction: "outbound", Upstream: echo},
		{Name: "status", Address: "127.0.0.1:0", Upstream: echo},
		{Name: "idle", Address: "127.0.0.1:0", Upstream: echo},
	}
	v6 := hasIPv6(t)
	if v6 {
		ls = append(ls, envoysim.ListenerConfig{Name: "in6", Address: "[::1]:0", Direction: "inbound", Upstream: echo})
	}
	sim := startSim(t, envoysim.Config{Concurrency: 2, DrainTime: 45 * time.Second, DrainStrategy: "immediate", Listeners: ls})
	c := fast(sim.AdminAddr())

	// A listener that never took a connection has no gauge under usedonly:
	// zero, not an error.
	ac, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{})
	if err != nil || ac.Total != 0 || len(ac.Listeners) != 0 {
		t.Fatalf("fresh sim: %+v, %v", ac, err)
	}

	dialEcho(t, sim.ListenerAddr("in"))
	dialEcho(t, sim.ListenerAddr("in"))
	dialEcho(t, sim.ListenerAddr("vo"))
	dialEcho(t, sim.ListenerAddr("status"))
	want := uint64(3)
	if v6 {
		dialEcho(t, sim.ListenerAddr("in6"))
		want++
	}
	_, statusPort, _ := net.SplitHostPort(sim.ListenerAddr("status"))
	port := func(s string) uint16 {
		var p uint16
		for _, c := range s {
			p = p*10 + uint16(c-'0')
		}
		return p
	}
	ac, err = c.ActiveDownstream(ctx, envoy.ExcludeSet{Ports: []uint16{port(statusPort)}})
	if err != nil {
		t.Fatal(err)
	}
	if ac.Total != want {
		t.Errorf("total %d, want %d: %+v", ac.Total, want, ac)
	}
	got := map[string]uint64{}
	for _, l := range ac.Listeners {
		got[l.Listener] = l.Active
	}
	if got[sim.ListenerStatName("in")] != 2 || got["virtualOutbound"] != 1 || len(ac.Excluded) != 1 || ac.Excluded[0].Active != 1 {
		t.Errorf("breakdown %+v", ac)
	}
	if v6 {
		name := sim.ListenerStatName("in6")
		if !strings.HasPrefix(name, "[__1]_") || got[name] != 1 {
			t.Errorf("IPv6 listener %q: %d", name, got[name])
		}
	}
	if _, err := c.Stat(ctx, "listener."+sim.ListenerStatName("idle")+".downstream_cx_active"); err != nil {
		t.Errorf("without usedonly the idle listener's gauge is there: %v", err)
	}

	if s, err := c.ServerState(ctx); err != nil || s != envoy.StateLive {
		t.Errorf("state %v, %v", s, err)
	}
	if ok, err := c.WorkersStarted(ctx); err != nil || !ok {
		t.Errorf("workers started %v, %v", ok, err)
	}
	if st, ready, err := c.Ready(ctx); st != "LIVE" || !ready || err != nil {
		t.Errorf("ready %q %t %v", st, ready, err)
	}
	si, err := c.ServerInfo(ctx)
	if err != nil || si.State != "LIVE" || si.DrainTime != 45*time.Second || si.DrainStrategy != "Immediate" ||
		si.Concurrency != 2 || si.ParentShutdownTime != 900*time.Second {
		t.Errorf("server info %+v, %v", si, err)
	}
	js, err := c.Stats(ctx, envoy.StatsQuery{Format: "json", UsedOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.Stats(ctx, envoy.StatsQuery{UsedOnly: true, Type: "Gauges"})
	if err != nil || len(text) == 0 || len(js) <= len(text) {
		t.Errorf("json %d stats, text gauges %d, %v", len(js), len(text), err)
	}

	// /healthcheck/fail changes /ready and server.state; ok undoes it.
	if err := c.HealthcheckFail(ctx); err != nil {
		t.Fatal(err)
	}
	if st, ready, err := c.Ready(ctx); st != "DRAINING" || ready || err != nil {
		t.Errorf("after fail: ready %q %t %v", st, ready, err)
	}
	if s, _ := c.ServerState(ctx); s != envoy.StateDraining {
		t.Errorf("after fail: state %v", s)
	}
	if err := c.HealthcheckOK(ctx); err != nil {
		t.Fatal(err)
	}
	if st, ready, _ := c.Ready(ctx); st != "LIVE" || !ready {
		t.Errorf("after ok: %q %t", st, ready)
	}

	// A drain changes neither /ready nor server.state.
	if err := c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
		t.Errorf("a repeated drain: %v", err)
	}
	if st, ready, _ := c.Ready(ctx); st != "LIVE" || !ready {
		t.Errorf("draining: ready %q %t", st, ready)
	}
	if s, _ := c.ServerState(ctx); s != envoy.StateLive {
		t.Errorf("draining: state %v", s)
	}
	var se *envoy.StatusError
	if err := c.DrainListeners(ctx, envoy.DrainOptions{SkipExit: true}); !errors.As(err, &se) || se.Code != 400 {
		t.Errorf("skip_exit without graceful: %v, want 400", err)
	}

	// Envoy's answers to mistakes.
	if _, err := c.Stats(ctx, envoy.StatsQuery{Filter: "("}); !errors.As(err, &se) || se.Code != 400 || se.Body != "Invalid re2 regex" {
		t.Errorf("bad regex: %v", err)
	}
	if _, err := c.Stats(ctx, envoy.StatsQuery{Type: "Nope"}); !errors.As(err, &se) || se.Code != 400 || se.Body != "invalid &type= param" {
		t.Errorf("bad type: %v", err)
	}

	if err := c.QuitQuitQuit(ctx); err != nil {
		t.Fatalf("quitquitquit: %v", err)
	}
	select {
	case <-sim.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("sim still running after quitquitquit")
	}
	if sim.Err() != nil {
		t.Errorf("quit: Err() = %v", sim.Err())
	}
	if _, err := c.ServerState(ctx); !errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("after quit: %v, want ErrUnreachable", err)
	}
}

func TestClientSimFaults(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, envoysim.Config{})
	c := envoy.New(sim.AdminAddr(), envoy.WithTimeout(300*time.Millisecond), envoy.WithBackoff(time.Millisecond))

	for _, tc := range []struct {
		fault envoysim.AdminFault
		check func(err error) bool
	}{
		{envoysim.AdminHang, func(err error) bool {
			return errors.Is(err, envoy.ErrUnreachable) && errors.Is(err, context.DeadlineExceeded)
		}},
		{envoysim.AdminError, func(err error) bool {
			var se *envoy.StatusError
			return errors.As(err, &se) && se.Code == 500
		}},
		{envoysim.AdminGarbage, func(err error) bool { return errors.Is(err, envoy.ErrMalformed) }},
	} {
		if err := sim.SetFault(envoysim.Fault{Admin: tc.fault}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{})
			done <- err
		}()
		select {
		case err := <-done:
			if !tc.check(err) {
				t.Errorf("fault %q: err = %v", tc.fault, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("fault %q: the call did not return by its timeout", tc.fault)
		}
		if _, _, err := c.Ready(ctx); err == nil {
			t.Errorf("fault %q: /ready answered", tc.fault)
		}
	}
	if err := sim.SetFault(envoysim.Fault{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); err != nil {
		t.Errorf("fault cleared: %v", err)
	}

	// A crash: everything goes, the client sees Envoy unreachable.
	if err := sim.SetFault(envoysim.Fault{CrashAfter: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sim.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no crash")
	}
	if !errors.Is(sim.Err(), envoysim.ErrCrashed) {
		t.Errorf("Err() = %v", sim.Err())
	}
	if _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); !errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("after crash: %v", err)
	}
}

func TestClientSimStartup(t *testing.T) {
	ctx := context.Background()
	echo := echoServer(t)
	sim := startSim(t, envoysim.Config{
		StartupDelay: 600 * time.Millisecond,
		Listeners:    []envoysim.ListenerConfig{{Name: "in", Address: "127.0.0.1:0", Upstream: echo}},
	})
	c := fast(sim.AdminAddr())
	// Before LIVE: /ready 503 with the init state, no workers, connections refused.
	st, ready, err := c.Ready(ctx)
	if err != nil || ready || (st != "PRE_INITIALIZING" && st != "INITIALIZING") {
		t.Errorf("starting: ready %q %t %v", st, ready, err)
	}
	if ok, err := c.WorkersStarted(ctx); err != nil || ok {
		t.Errorf("starting: workers started %t %v", ok, err)
	}
	if sim.State() != "LIVE" {
		if c, err := net.Dial("tcp", sim.ListenerAddr("in")); err == nil {
			c.Close()
			if sim.State() != "LIVE" {
				t.Error("a listener accepted before LIVE")
			}
		}
	}
	eventually(t, "LIVE", func() error {
		if _, ready, err := c.Ready(ctx); err != nil || !ready {
			return errors.New("not ready")
		}
		return nil
	})
	if ok, err := c.WorkersStarted(ctx); err != nil || !ok {
		t.Errorf("live: workers started %t %v", ok, err)
	}
	dialEcho(t, sim.ListenerAddr("in"))
}

// A raw look at the sim's admin answers the client never sees.
func TestSimAdminRaw(t *testing.T) {
	sim := startSim(t, envoysim.Config{})
	base := "http://" + sim.AdminAddr()
	for _, tc := range []struct {
		method, path string
		code         int
		prefix       string
	}{
		{"GET", "/quitquitquit", 405, "Method GET not allowed, POST required."},
		{"GET", "/drain_listeners?inboundonly&graceful", 405, "Method GET not allowed, POST required."},
		{"PUT", "/healthcheck/fail", 405, "Method PUT not allowed, POST required."},
		{"GET", "/nope", 404, "invalid path. admin commands are:\n"},
		{"GET", "/stats/", 404, "invalid path. "},
		{"GET", "/stats?format=xml", 400, "usage: /stats?format=(html|active-html|json|prometheus|text)\n\n"},
		{"GET", "/ready?x=1", 200, "LIVE\n"},
		{"POST", "/ready", 200, "LIVE\n"},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.HasPrefix(string(b), tc.prefix) {
			t.Errorf("%s %s: %d %q, want %d %q...", tc.method, tc.path, resp.StatusCode, b, tc.code, tc.prefix)
		}
		if tc.code == 405 && string(b) != tc.prefix {
			t.Errorf("%s %s: body %q, want exactly %q", tc.method, tc.path, b, tc.prefix)
		}
	}
}
