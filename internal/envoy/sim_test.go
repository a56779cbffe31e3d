package envoy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/testenv/envoysim"
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

func hasIPv6() bool {
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

// adminPost POSTs to an admin path, for what the client does not do.
func adminPost(t *testing.T, addr, path string) int {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func portOf(t *testing.T, addr string) uint16 {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(n)
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
	v6 := hasIPv6()
	if v6 {
		ls = append(ls, envoysim.ListenerConfig{Name: "in6", Address: "[::1]:0", Direction: "inbound", Upstream: echo})
	}
	sim := startSim(t, envoysim.Config{Concurrency: 2, DrainTime: 45 * time.Second, DrainStrategy: "immediate", Listeners: ls})
	c := fast(sim.AdminAddr(), envoy.WithExclude(envoy.ExcludeSet{Ports: []uint16{portOf(t, sim.ListenerAddr("status"))}}))

	// A listener that never took a connection has no gauge under usedonly:
	// zero over zero gauges, not an error. Without usedonly they are there.
	ac, err := c.ActiveDownstream(ctx)
	if err != nil || ac.Total != 0 || ac.Gauges != 0 {
		t.Fatalf("fresh sim: %+v, %v", ac, err)
	}
	if present, err := c.DownstreamGauges(ctx); err != nil || !present {
		t.Errorf("fresh sim: gauges %t %v, want present", present, err)
	}

	dialEcho(t, sim.ListenerAddr("in"))
	dialEcho(t, sim.ListenerAddr("in"))
	dialEcho(t, sim.ListenerAddr("vo"))
	dialEcho(t, sim.ListenerAddr("status"))
	want, gauges := uint64(3), 2
	if v6 {
		dialEcho(t, sim.ListenerAddr("in6"))
		want, gauges = want+1, gauges+1
	}
	ac, err = c.ActiveDownstream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Total != want || ac.Gauges != gauges {
		t.Errorf("total %d over %d gauges, want %d over %d: %+v", ac.Total, ac.Gauges, want, gauges, ac)
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
	if l, err := c.Live(ctx); err != nil || !l.Live() {
		t.Errorf("live: %+v %v", l, err)
	}

	// A drain changes no liveness; a repeated drain is an OK.
	for range 2 {
		if err := c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: true, Graceful: true}); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := c.Live(ctx); err != nil || !l.Live() {
		t.Errorf("draining: %+v %v", l, err)
	}
	var se *envoy.StatusError
	if err := c.DrainListeners(ctx, envoy.DrainOptions{SkipExit: true}); !errors.As(err, &se) || se.Code != 400 {
		t.Errorf("skip_exit without graceful: %v, want 400", err)
	}
	// /healthcheck/fail: server.state DRAINING, so not live.
	adminPost(t, sim.AdminAddr(), "/healthcheck/fail")
	if l, err := c.Live(ctx); err != nil || l.Live() || l.State != envoy.StateDraining {
		t.Errorf("health check failed: %+v %v", l, err)
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
	if _, err := c.Live(ctx); !errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("after quit: %v, want ErrUnreachable", err)
	}
}

// Under Istio's default stats_matcher there is no downstream_cx_active
// gauge: ActiveDownstream says 0 over 0 gauges, DownstreamGauges says
// absent, liveness still reads. With EXIT_ON_ZERO_ACTIVE_CONNECTIONS's
// suffix, the gauges are back.
func TestClientSimStatsMatcher(t *testing.T) {
	ctx := context.Background()
	echo := echoServer(t)
	for _, tc := range []struct {
		matcher string
		gauges  bool
	}{
		{"istio", false},
		{"istio_exit_on_zero", true},
		{"", true},
	} {
		t.Run("matcher="+tc.matcher, func(t *testing.T) {
			sim := startSim(t, envoysim.Config{StatsMatcher: tc.matcher, Listeners: []envoysim.ListenerConfig{
				{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Upstream: echo},
			}})
			c := fast(sim.AdminAddr())
			dialEcho(t, sim.ListenerAddr("in"))
			ac, err := c.ActiveDownstream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if present, err := c.DownstreamGauges(ctx); err != nil || present != tc.gauges {
				t.Errorf("gauges %t %v, want %t", present, err, tc.gauges)
			}
			wantTotal, wantGauges := uint64(0), 0
			if tc.gauges {
				wantTotal, wantGauges = 1, 1
			}
			if ac.Total != wantTotal || ac.Gauges != wantGauges {
				t.Errorf("active %+v, want %d over %d gauges", ac, wantTotal, wantGauges)
			}
			if l, err := c.Live(ctx); err != nil || !l.Live() {
				t.Errorf("live %+v %v", l, err)
			}
		})
	}
}

func TestClientSimLive(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, envoysim.Config{StartupDelay: 600 * time.Millisecond})
	c := fast(sim.AdminAddr())
	// Starting: server.state is the unset gauge (0, LIVE), the workers have
	// not started: not live.
	l, err := c.Live(ctx)
	if err != nil || l.Live() || l.WorkersStarted || l.State != envoy.StateLive {
		t.Errorf("starting: %+v %v", l, err)
	}
	eventually(t, "live", func() error {
		if l, err := c.Live(ctx); err != nil || !l.Live() {
			return errors.New("not live")
		}
		return nil
	})

	never := startSim(t, envoysim.Config{Fault: envoysim.Fault{NeverLive: true}})
	c = fast(never.AdminAddr())
	time.Sleep(100 * time.Millisecond)
	if l, err := c.Live(ctx); err != nil || l.Live() {
		t.Errorf("never live: %+v %v", l, err)
	}
	never.SetFault(envoysim.Fault{})
	if l, err := c.Live(ctx); err != nil || !l.Live() {
		t.Errorf("fault cleared: %+v %v", l, err)
	}
}

// No call outlives its timeout, whatever the admin API does; a crash is
// unreachable.
func TestClientSimFaults(t *testing.T) {
	ctx := context.Background()
	sim := startSim(t, envoysim.Config{})
	c := envoy.New(sim.AdminAddr(), envoy.WithTimeout(300*time.Millisecond), envoy.WithBackoff(time.Millisecond))

	calls := map[string]func() error{
		"ActiveDownstream": func() error { _, err := c.ActiveDownstream(ctx); return err },
		"DownstreamGauges": func() error { _, err := c.DownstreamGauges(ctx); return err },
		"Live":             func() error { _, err := c.Live(ctx); return err },
		"DrainListeners":   func() error { return c.DrainListeners(ctx, envoy.DrainOptions{Graceful: true, SkipExit: true}) },
	}
	timeout := func(err error) bool {
		return errors.Is(err, envoy.ErrUnreachable) && errors.Is(err, context.DeadlineExceeded)
	}
	for _, tc := range []struct {
		fault envoysim.Fault
		check func(call string, err error) bool
	}{
		{envoysim.Fault{Admin: envoysim.AdminHang}, func(_ string, err error) bool { return timeout(err) }},
		{envoysim.Fault{Admin: envoysim.AdminSlow}, func(_ string, err error) bool { return timeout(err) }},
		{envoysim.Fault{Admin: envoysim.AdminError}, func(_ string, err error) bool {
			var se *envoy.StatusError
			return errors.As(err, &se) && se.Code == 500
		}},
		{envoysim.Fault{Admin: envoysim.AdminGarbage}, func(call string, err error) bool {
			if call == "QuitQuitQuit" {
				return err == nil // a 200: the body of a quit is not read
			}
			return errors.Is(err, envoy.ErrMalformed) // drain_listeners too: not Envoy's OK
		}},
	} {
		if err := sim.SetFault(tc.fault); err != nil {
			t.Fatal(err)
		}
		for name, call := range calls {
			done := make(chan error, 1)
			go func() { done <- call() }()
			select {
			case err := <-done:
				if !tc.check(name, err) {
					t.Errorf("fault %+v: %s: err = %v", tc.fault, name, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("fault %+v: %s did not return by its timeout", tc.fault, name)
			}
		}
	}
	if err := sim.SetFault(envoysim.Fault{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ActiveDownstream(ctx); err != nil {
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
	for name, call := range calls {
		if err := call(); !errors.Is(err, envoy.ErrUnreachable) {
			t.Errorf("after crash: %s: %v", name, err)
		}
	}
}
