package envoysim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// parseText reads "name: value" lines; histograms (P0(...) or No recorded
// values) are returned apart.
func parseText(t *testing.T, body string) (names []string, values map[string]string, hists []string) {
	t.Helper()
	values = map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if line == "" {
			continue
		}
		name, v, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("line %q is not name: value", line)
		}
		if strings.HasPrefix(v, "P0(") || v == "No recorded values" {
			hists = append(hists, name)
			continue
		}
		if len(hists) > 0 {
			t.Errorf("%s after the histograms", name)
		}
		names = append(names, name)
		values[name] = v
	}
	return names, values, hists
}

func hasIPv6() bool {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func TestStatsFormat(t *testing.T) {
	echo := echoServer(t)
	ls := []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Upstream: echo},
		{Name: "vo", Address: "127.0.0.1:0", StatPrefix: "virtualOutbound", Upstream: echo},
	}
	v6 := hasIPv6()
	if v6 {
		ls = append(ls, envoysim.ListenerConfig{Name: "in6", Address: "[::1]:0", Upstream: echo})
	}
	sim := startSim(t, envoysim.Config{Concurrency: 3, Listeners: ls})
	in := sim.ListenerStatName("in")
	if _, port, _ := net.SplitHostPort(sim.ListenerAddr("in")); in != "127.0.0.1_"+port {
		t.Errorf("stat name %q for %s", in, sim.ListenerAddr("in"))
	}
	if sim.ListenerStatName("vo") != "virtualOutbound" {
		t.Errorf("stat_prefix: %q", sim.ListenerStatName("vo"))
	}
	conns := []net.Conn{}
	for range 4 {
		conns = append(conns, dialEcho(t, sim.ListenerAddr("in")))
	}
	if v6 {
		dialEcho(t, sim.ListenerAddr("in6"))
		if _, port, _ := net.SplitHostPort(sim.ListenerAddr("in6")); sim.ListenerStatName("in6") != "[__1]_"+port {
			t.Errorf("IPv6 stat name %q", sim.ListenerStatName("in6"))
		}
	}

	code, body := adminGet(t, sim, "/stats")
	if code != 200 {
		t.Fatal(code, body)
	}
	names, all, hists := parseText(t, body)
	if !slices.IsSorted(names) {
		t.Error("counters and gauges not in name order")
	}
	if !slices.Contains(hists, "server.initialization_time_ms") {
		t.Errorf("histograms %v", hists)
	}
	for name, want := range map[string]string{
		"listener." + in + ".downstream_cx_active":          "4",
		"listener." + in + ".downstream_cx_total":           "4",
		"listener." + in + ".worker_0.downstream_cx_active": "2", // round-robin
		"listener." + in + ".worker_1.downstream_cx_active": "1",
		"listener." + in + ".worker_2.downstream_cx_active": "1",
		"listener.virtualOutbound.downstream_cx_active":     "0",
		"listener.admin.downstream_cx_active":               "1", // this request's
		"listener.admin.main_thread.downstream_cx_active":   "1",
		"http.admin.downstream_cx_active":                   "1",
		"http.admin.downstream_rq_active":                   "1",
		"listener_manager.workers_started":                  "1",
		"server.state":                                      "0",
		"server.concurrency":                                "3",
	} {
		if all[name] != want {
			t.Errorf("%s = %q, want %q", name, all[name], want)
		}
	}
	if v6 {
		if all["server.total_connections"] != "5" {
			t.Errorf("server.total_connections %q", all["server.total_connections"])
		}
	}

	// usedonly hides what never changed: the stat_prefix listener took no
	// connection.
	_, used, _ := parseText(t, mustGet(t, sim, "/stats?usedonly"))
	if _, ok := used["listener.virtualOutbound.downstream_cx_active"]; ok {
		t.Error("usedonly shows a gauge that never changed")
	}
	if used["listener."+in+".downstream_cx_active"] != "4" {
		t.Error("usedonly hides a used gauge")
	}

	// filter: RE2, partial match.
	_, f, _ := parseText(t, mustGet(t, sim, "/stats?usedonly&filter=downstream_cx_active$"))
	for name := range f {
		if !strings.HasSuffix(name, "downstream_cx_active") {
			t.Errorf("filter matched %s", name)
		}
	}
	if _, ok := f["listener."+in+".worker_1.downstream_cx_active"]; !ok {
		t.Error("partial match missed a per-worker gauge")
	}
	if body := mustGet(t, sim, `/stats?filter=%5Elistener%5C.admin%5C.downstream_cx_active%24`); body != "listener.admin.downstream_cx_active: 1\n" {
		t.Errorf("exact filter: %q", body)
	}
	if body := mustGet(t, sim, "/stats?filter=nothing_matches_this"); body != "" {
		t.Errorf("empty match: %q", body)
	}

	// type=
	_, counters, _ := parseText(t, mustGet(t, sim, "/stats?type=Counters"))
	if _, ok := counters["server.state"]; ok || counters["listener."+in+".downstream_cx_total"] != "4" {
		t.Errorf("type=Counters: %v", counters)
	}

	// JSON carries the same values.
	var js struct {
		Stats []map[string]json.RawMessage `json:"stats"`
	}
	if err := json.Unmarshal([]byte(mustGet(t, sim, "/stats?format=json&filter=^listener")), &js); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range js.Stats {
		var name string
		if json.Unmarshal(e["name"], &name) != nil {
			continue
		}
		n++
		if name == "listener."+in+".downstream_cx_active" && string(e["value"]) != "4" {
			t.Errorf("json value %s", e["value"])
		}
	}
	if n == 0 {
		t.Error("no json stats")
	}

	if code, body := adminGet(t, sim, "/stats?format=html"); code != 200 || !strings.Contains(body, "listener.admin.downstream_cx_active: 1") || !strings.HasPrefix(body, "<!DOCTYPE html>") {
		t.Errorf("html: %d %q", code, body)
	}
	for _, q := range []string{"format=xml", "type=gauges", "filter=(", "filter=a%5C"} {
		if code, _ := adminGet(t, sim, "/stats?"+q); code != 400 {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
	if code, body := adminGet(t, sim, "/stats?format=prometheus"); code != 200 || !strings.Contains(body, "# TYPE envoy_server_state gauge") {
		t.Errorf("prometheus: %d", code)
	}

	// Closing connections brings the gauges down; used ones stay visible.
	for _, c := range conns {
		c.Close()
	}
	eventually(t, "gauges back to 0", func() error {
		_, used, _ := parseText(t, mustGet(t, sim, "/stats?usedonly"))
		if v := used["listener."+in+".downstream_cx_active"]; v != "0" {
			return fmt.Errorf("active %q", v)
		}
		return nil
	})
}

func mustGet(t *testing.T, s *envoysim.Sim, path string) string {
	t.Helper()
	code, body := adminGet(t, s, path)
	if code != 200 {
		t.Fatalf("GET %s: %d %q", path, code, body)
	}
	return body
}

// server.state is Envoy's unset gauge until the workers start or a stats
// flush refreshes it: it reads 0 and usedonly hides it. server.live
// follows /healthcheck/fail at once; server.state only on a refresh.
func TestServerStateAndLive(t *testing.T) {
	state := func(sim *envoysim.Sim, q string) string {
		return mustGet(t, sim, "/stats?"+q+"filter=%5Eserver%5C.(state%7Clive)%24")
	}
	t.Run("starting", func(t *testing.T) {
		sim := startSim(t, envoysim.Config{StartupDelay: 500 * time.Millisecond})
		if code, body := adminGet(t, sim, "/ready"); code != 503 || body != "PRE_INITIALIZING\n" {
			t.Errorf("ready %d %q", code, body)
		}
		if got := state(sim, ""); got != "server.live: 1\nserver.state: 0\n" {
			t.Errorf("starting: %q, want the unset server.state (0)", got)
		}
		if got := state(sim, "usedonly&"); got != "server.live: 1\n" {
			t.Errorf("starting, usedonly: %q, want no server.state", got)
		}
		if got := mustGet(t, sim, "/stats?filter=workers_started"); got != "listener_manager.workers_started: 0\n" {
			t.Errorf("starting: %q", got)
		}
		if err := sim.WaitLive(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := state(sim, "usedonly&"); got != "server.live: 1\nserver.state: 0\n" {
			t.Errorf("live, usedonly: %q", got)
		}
	})
	t.Run("flush before the workers start", func(t *testing.T) {
		sim := startSim(t, envoysim.Config{StartupDelay: 2 * time.Second, StatsFlushInterval: 50 * time.Millisecond})
		eventually(t, "a flush", func() error {
			if got := state(sim, "usedonly&"); got != "server.live: 1\nserver.state: 2\n" && got != "server.live: 1\nserver.state: 3\n" {
				return errors.New(got)
			}
			return nil
		})
	})
	t.Run("health check, refreshed on every read", func(t *testing.T) {
		sim := startSim(t, envoysim.Config{})
		adminDo(t, sim, "POST", "/healthcheck/fail")
		if got := state(sim, ""); got != "server.live: 0\nserver.state: 1\n" {
			t.Errorf("failed: %q", got)
		}
		adminDo(t, sim, "POST", "/healthcheck/ok")
		if got := state(sim, ""); got != "server.live: 1\nserver.state: 0\n" {
			t.Errorf("ok again: %q", got)
		}
		// A drain changes neither.
		adminDo(t, sim, "POST", "/drain_listeners?graceful")
		if got := state(sim, ""); got != "server.live: 1\nserver.state: 0\n" {
			t.Errorf("draining: %q", got)
		}
	})
	t.Run("health check, lagging a flush", func(t *testing.T) {
		sim := startSim(t, envoysim.Config{StatsFlushInterval: time.Hour})
		adminDo(t, sim, "POST", "/healthcheck/fail")
		if code, body := adminGet(t, sim, "/ready"); code != 503 || body != "DRAINING\n" {
			t.Errorf("ready %d %q", code, body)
		}
		if got := state(sim, ""); got != "server.live: 0\nserver.state: 0\n" {
			t.Errorf("before a flush: %q, want server.state still LIVE", got)
		}
		sim2 := startSim(t, envoysim.Config{StatsFlushInterval: 50 * time.Millisecond})
		adminDo(t, sim2, "POST", "/healthcheck/fail")
		eventually(t, "flushed", func() error {
			if got := state(sim2, ""); got != "server.live: 0\nserver.state: 1\n" {
				return errors.New(got)
			}
			return nil
		})
	})
}

func TestAdminEndpoints(t *testing.T) {
	echo := echoServer(t)
	sim := startSim(t, envoysim.Config{
		DrainTime: 1500 * time.Millisecond,
		Listeners: []envoysim.ListenerConfig{{Name: "in", Address: "127.0.0.1:0", Upstream: echo}},
	})
	if body := mustGet(t, sim, "/listeners"); body != "in::"+sim.ListenerAddr("in")+"\n" {
		t.Errorf("listeners %q", body)
	}
	var ls struct {
		Statuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(mustGet(t, sim, "/listeners?format=json")), &ls); err != nil || len(ls.Statuses) != 1 ||
		net.JoinHostPort(ls.Statuses[0].LocalAddress.SocketAddress.Address, fmt.Sprint(ls.Statuses[0].LocalAddress.SocketAddress.PortValue)) != sim.ListenerAddr("in") {
		t.Errorf("listeners json %+v %v", ls, err)
	}
	var si struct {
		State   string `json:"state"`
		Options struct {
			DrainTime     string `json:"drain_time"`
			DrainStrategy string `json:"drain_strategy"`
			Parent        string `json:"parent_shutdown_time"`
			Concurrency   int    `json:"concurrency"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal([]byte(mustGet(t, sim, "/server_info")), &si); err != nil {
		t.Fatal(err)
	}
	if si.State != "LIVE" || si.Options.DrainTime != "1.500s" || si.Options.DrainStrategy != "Gradual" || si.Options.Parent != "900s" || si.Options.Concurrency != 2 {
		t.Errorf("server_info %+v", si)
	}
	if code, body := adminGet(t, sim, "/help"); code != 200 || !strings.HasPrefix(body, "admin commands are:\n") || !strings.Contains(body, "/drain_listeners (POST): drain listeners\n") {
		t.Errorf("help %d %q", code, body)
	}
	// Counters reset; gauges do not.
	dialEcho(t, sim.ListenerAddr("in"))
	if code, _ := adminDo(t, sim, "POST", "/reset_counters"); code != 200 {
		t.Fatal(code)
	}
	_, v, _ := parseText(t, mustGet(t, sim, "/stats?filter=^listener%5C.127"))
	name := "listener." + sim.ListenerStatName("in")
	if v[name+".downstream_cx_total"] != "0" || v[name+".downstream_cx_active"] != "1" {
		t.Errorf("after reset: %v", v)
	}

	// The fault hook, over HTTP, for the envoysim program.
	if code, _ := adminGet(t, sim, "/envoysim/fault?admin=500"); code != 405 {
		t.Errorf("GET fault hook: %d", code)
	}
	adminDo(t, sim, "POST", "/envoysim/fault?admin=500")
	if code, body := adminGet(t, sim, "/ready"); code != 500 {
		t.Errorf("500 fault: %d %q", code, body)
	}
	adminDo(t, sim, "POST", "/envoysim/fault?admin=garbage")
	if code, body := adminGet(t, sim, "/stats"); code != 200 || !bytes.HasPrefix([]byte(body), []byte{0}) {
		t.Errorf("garbage fault: %d %q", code, body)
	}
	adminDo(t, sim, "POST", "/envoysim/fault?admin=ok")
	if code, body := adminGet(t, sim, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("fault cleared: %d %q", code, body)
	}
	if code, _ := adminDo(t, sim, "POST", "/envoysim/fault?admin=nope"); code != 400 {
		t.Errorf("bad fault: %d", code)
	}
	// The same hook with the config's fault object as a JSON body.
	post := func(body string) int {
		resp, err := http.Post("http://"+sim.AdminAddr()+"/envoysim/fault", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"admin":"500"}`); code != 200 {
		t.Fatalf("json fault: %d", code)
	}
	if code, _ := adminGet(t, sim, "/ready"); code != 500 {
		t.Errorf("json 500 fault: %d", code)
	}
	if code := post(`{"admin":""}`); code != 200 {
		t.Fatalf("json fault cleared: %d", code)
	}
	if code, _ := adminGet(t, sim, "/ready"); code != 200 {
		t.Errorf("json fault cleared: %d", code)
	}
	for _, bad := range []string{`{"admin":"nope"}`, `{"nope":1}`, `{`, `{"crash_after_ms":-1}`} {
		if code := post(bad); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
}

func TestMainExitCodes(t *testing.T) {
	ctx := t.Context()
	var out strings.Builder
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--version"}, 0},
		{[]string{"-h"}, 0},
		{[]string{"--nope"}, 1},
		{[]string{"--admin-address", "localhost:0"}, 1},
		{[]string{"--admin-address", "127.0.0.1:0", "--crash-after", "10ms", "--crash-exit-code", "139"}, 139},
		{[]string{"--admin-address", "127.0.0.1:0", "--fault-exit-at-start", "7"}, 7},
		{[]string{"--admin-address", "127.0.0.1:0", "--mode", "validate", "--stats-matcher", "istio"}, 0},
	} {
		if code := envoysim.Main(ctx, tc.args, &out, io.Discard); code != tc.code {
			t.Errorf("Main(%q) = %d, want %d", tc.args, code, tc.code)
		}
	}
}

// Quit, SIGTERM and a crash close connections as Envoy's exit does and as
// the kernel closes a dead process's sockets: a FIN, or a RST where data
// the peer sent was left unread.
func TestQuitClosesConnections(t *testing.T) {
	for _, how := range []string{"quitquitquit", "quit", "crash"} {
		t.Run(how, func(t *testing.T) {
			echo := echoServer(t)
			// An upstream that never reads: data sent through it piles up
			// unread in the proxy's socket.
			stuck, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer stuck.Close()
			held := make(chan net.Conn, 1)
			go func() {
				if c, err := stuck.Accept(); err == nil {
					held <- c
				}
			}()
			defer func() {
				select {
				case c := <-held:
					c.Close()
				default:
				}
			}()
			up := newUpstream(t)
			sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
				{Name: "in", Address: "127.0.0.1:0", Upstream: echo},
				{Name: "stuck", Address: "127.0.0.1:0", Upstream: stuck.Addr().String()},
				{Name: "http", Address: "127.0.0.1:0", Protocol: "http", Upstream: up.addr},
			}})
			idle := dialEcho(t, sim.ListenerAddr("in"))
			keepAlive := dialHTTP(t, sim.ListenerAddr("http"))
			keepAlive.get("/fast")
			unread := dial(t, sim.ListenerAddr("stuck"))
			fill(t, unread)

			switch how {
			case "quitquitquit":
				if code, body := adminDo(t, sim, "POST", "/quitquitquit"); code != 200 || body != "OK\n" {
					t.Fatalf("%d %q", code, body)
				}
			case "quit":
				sim.Quit()
			case "crash":
				sim.SetFault(envoysim.Fault{CrashAfter: time.Millisecond})
			}
			select {
			case <-sim.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("still running")
			}
			if (how == "crash") != errors.Is(sim.Err(), envoysim.ErrCrashed) {
				t.Errorf("Err() = %v", sim.Err())
			}
			for name, c := range map[string]net.Conn{"idle tcp": idle, "idle keep-alive": keepAlive.c} {
				if err := readErr(c); !errors.Is(err, io.EOF) {
					t.Errorf("%s connection: %v, want a FIN (EOF)", name, err)
				}
			}
			if err := readErr(unread); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("connection with unread data: %v, want a RST", err)
			}
			if !refused(sim.ListenerAddr("in")) || !refused(sim.AdminAddr()) {
				t.Error("still accepting")
			}
		})
	}
}

// fill writes to c until its send buffer and the peer's receive buffer are
// full: the peer has data it did not read.
func fill(t *testing.T, c net.Conn) {
	t.Helper()
	buf := make([]byte, 64<<10)
	for {
		c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Write(buf); err != nil {
			if !isTimeout(err) {
				t.Fatal(err)
			}
			c.SetWriteDeadline(time.Time{})
			return
		}
	}
}

// readErr reads c until an error.
func readErr(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		return io.EOF
	}
	return err
}

// simGoroutines lists goroutines running the sim's code.
func simGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/testenv/envoysim.") && !strings.Contains(g, "envoysim_test.") {
			out = append(out, g)
		}
	}
	return out
}

func TestCloseStopsEverything(t *testing.T) {
	up := newUpstream(t)
	echo := echoServer(t)
	sim, err := envoysim.Start(envoysim.Config{
		StartupDelay:       300 * time.Millisecond, // a timer still pending at close...
		StatsFlushInterval: time.Second,
		Fault:              envoysim.Fault{CrashAfter: time.Hour},
		Listeners: []envoysim.ListenerConfig{
			{Name: "h", Address: "127.0.0.1:0", Protocol: "http", Upstream: up.addr, Direction: "inbound"},
			{Name: "t", Address: "127.0.0.1:0", Upstream: echo},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitLive(t.Context()); err != nil {
		t.Fatal(err)
	}
	adminDo(t, sim, "POST", "/drain_listeners?graceful") // ... and a drain timer
	dialEcho(t, sim.ListenerAddr("t"))
	slow := dialHTTP(t, sim.ListenerAddr("h"))
	slow.send("/slow")
	<-up.arrived
	idle := dialHTTP(t, sim.ListenerAddr("h"))
	idle.get("/fast")
	sim.SetFault(envoysim.Fault{Admin: envoysim.AdminHang})
	hung := dial(t, sim.AdminAddr())
	io.WriteString(hung, "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
	if len(simGoroutines()) == 0 {
		t.Fatal("no sim goroutines seen: the check is broken")
	}

	done := make(chan error, 1)
	go func() { done <- sim.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs")
	}
	if err := sim.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	eventually(t, "sim goroutines gone", func() error {
		if g := simGoroutines(); len(g) > 0 {
			return fmt.Errorf("%d left, first:\n%s", len(g), g[0])
		}
		return nil
	})
}

func TestStartErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, cfg := range []envoysim.Config{
		{AdminAddress: taken.Addr().String()},
		{AdminAddress: "localhost:0"},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: taken.Addr().String(), Upstream: "127.0.0.1:1"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:1", Protocol: "udp"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:1", Direction: "in"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:1"}, {Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:1"}}},
		{DrainStrategy: "slow"},
		{Fault: envoysim.Fault{Admin: "teapot"}},
	} {
		if s, err := envoysim.Start(cfg); err == nil {
			s.Close()
			t.Errorf("%+v: no error", cfg)
		}
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := envoysim.ParseConfig([]byte(`{
  "admin_address": "127.0.0.1:15000",
  "concurrency": 2,
  "drain_time_s": 1.5,
  "drain_strategy": "immediate",
  "startup_delay_ms": 200,
  "stats_flush_interval_ms": 5000,
  "stats_matcher": "istio",
  "listeners": [
    {"name": "virtualInbound", "address": "0.0.0.0:15006", "direction": "inbound", "protocol": "http", "upstream": "127.0.0.1:original_dst_port",
     "transparent": true, "drain_timeout_ms": 250, "upstream_protocol": "h2c"},
    {"name": "virtualOutbound", "address": "[::]:15001", "direction": "outbound", "stat_prefix": "virtualOutbound", "upstream": "original_dst"}
  ],
  "fault": {"admin": "slow", "admin_delay_ms": 1500, "crash_after_ms": 3000, "crash_after_drain_ms": 100,
            "crash_exit_code": 139, "exit_at_start": 0, "never_live": true}
}`))
	if err != nil {
		t.Fatal(err)
	}
	in := cfg.Listeners[0]
	if cfg.AdminAddress != "127.0.0.1:15000" || cfg.DrainTime != 1500*time.Millisecond || cfg.StartupDelay != 200*time.Millisecond ||
		cfg.StatsFlushInterval != 5*time.Second || cfg.StatsMatcher != "istio" || len(cfg.Listeners) != 2 ||
		cfg.Listeners[1].StatPrefix != "virtualOutbound" || cfg.Listeners[1].Upstream != "original_dst" ||
		!in.Transparent || in.DrainTimeout != 250*time.Millisecond || in.UpstreamProtocol != "h2c" ||
		cfg.Fault != (envoysim.Fault{Admin: envoysim.AdminSlow, AdminDelay: 1500 * time.Millisecond, CrashAfter: 3 * time.Second,
			CrashAfterDrain: 100 * time.Millisecond, CrashExitCode: 139, ExitAtStart: true, ExitAtStartCode: 0, NeverLive: true}) {
		t.Errorf("%+v", cfg)
	}
	// An explicit drain_time_s 0 is Envoy's --drain-time-s 0; none is the default.
	if cfg, err := envoysim.ParseConfig([]byte(`{"drain_time_s": 0}`)); err != nil || cfg.DrainTime != envoysim.ZeroDrainTime {
		t.Errorf("drain_time_s 0: %v %v", cfg.DrainTime, err)
	}
	if cfg, err := envoysim.ParseConfig([]byte(`{}`)); err != nil || cfg.DrainTime != 0 {
		t.Errorf("no drain_time_s: %v %v", cfg.DrainTime, err)
	}
	for _, bad := range []string{`{"nope": 1}`, `{"listeners": [{"name": "a", "port": 1}]}`, `{"drain_time_s": -1}`, `[`,
		`{"drain_time_s": "1"}`, `{"fault": {"admin": "nope"}}`, `{"fault": {"exit_at_start": 300}}`} {
		if _, err := envoysim.ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	for _, bad := range []envoysim.Config{
		{StatsMatcher: "nope"},
		{StatsInclusion: &envoysim.StatsInclusion{Regexes: []string{"("}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "localhost:original_dst_port"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:http"}}},
		{Listeners: []envoysim.ListenerConfig{{Name: "a", Address: "127.0.0.1:0", Upstream: "127.0.0.1:1", UpstreamProtocol: "h3"}}},
	} {
		if s, err := envoysim.Start(bad); err == nil {
			s.Close()
			t.Errorf("%+v: no error", bad)
		}
	}
}

// The start-up faults and the crash after a drain, in process.
func TestStartupAndDrainFaults(t *testing.T) {
	sim, err := envoysim.Start(envoysim.Config{StartupDelay: 100 * time.Millisecond, Fault: envoysim.Fault{ExitAtStart: true, ExitAtStartCode: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if code, body := adminGet(t, sim, "/ready"); code != 503 {
		t.Errorf("before the exit: %d %q", code, body)
	}
	select {
	case <-sim.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no exit")
	}
	var ee *envoysim.ExitError
	if !errors.As(sim.Err(), &ee) || ee.Code != 3 {
		t.Errorf("Err() = %v", sim.Err())
	}

	never := startSim(t, envoysim.Config{Fault: envoysim.Fault{NeverLive: true}})
	time.Sleep(50 * time.Millisecond)
	if code, body := adminGet(t, never, "/ready"); code != 503 || body != "INITIALIZING\n" {
		t.Errorf("never live: %d %q", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := never.WaitLive(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("never live: WaitLive %v", err)
	}
	// Cleared through the hook: LIVE at once.
	if code := postJSON(t, never, "/envoysim/fault", `{"admin":"ok"}`); code != 200 {
		t.Fatal(code)
	}
	if code, body := adminGet(t, never, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("fault cleared: %d %q", code, body)
	}

	// A crash 50 ms after the first drain request, set through the hook.
	if code := postJSON(t, never, "/envoysim/fault", `{"crash_after_drain_ms": 50, "crash_exit_code": 9}`); code != 200 {
		t.Fatal(code)
	}
	time.Sleep(150 * time.Millisecond)
	select {
	case <-never.Done():
		t.Fatal("crashed before any drain")
	default:
	}
	adminDo(t, never, "POST", "/drain_listeners?graceful")
	select {
	case <-never.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no crash after the drain")
	}
	if !errors.Is(never.Err(), envoysim.ErrCrashed) || never.CrashExitCode() != 9 {
		t.Errorf("Err() = %v, exit code %d", never.Err(), never.CrashExitCode())
	}
}

func postJSON(t *testing.T, s *envoysim.Sim, path, body string) int {
	t.Helper()
	resp, err := http.Post("http://"+s.AdminAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The slow admin fault delays every answer but the hook's.
func TestAdminSlow(t *testing.T) {
	sim := startSim(t, envoysim.Config{Fault: envoysim.Fault{Admin: envoysim.AdminSlow, AdminDelay: 300 * time.Millisecond}})
	start := time.Now()
	if code, body := adminGet(t, sim, "/ready"); code != 200 || body != "LIVE\n" {
		t.Errorf("slow: %d %q", code, body)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("answered after %v, before the delay", d)
	}
	start = time.Now()
	adminDo(t, sim, "POST", "/envoysim/fault?admin=ok")
	adminGet(t, sim, "/ready")
	if d := time.Since(start); d >= 300*time.Millisecond {
		t.Logf("hook and answer took %v (slow machine?)", d)
	}
	if code := postJSON(t, sim, "/envoysim/fault", `{"admin_delay_ms": 200, "admin": "500"}`); code != 200 {
		t.Fatal(code)
	}
	start = time.Now()
	if code, _ := adminGet(t, sim, "/ready"); code != 500 || time.Since(start) < 200*time.Millisecond {
		t.Errorf("slow 500: %d after %v", code, time.Since(start))
	}
}

// A connection made straight to an original_dst listener has the listener
// itself as its original destination: refused as an upstream failure
// (a TCP close, an HTTP 503), not looped.
func TestOriginalDstNoLoop(t *testing.T) {
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "tcp", Address: "127.0.0.1:0", Upstream: "original_dst"},
		{Name: "http", Address: "127.0.0.1:0", Protocol: "http", Upstream: "127.0.0.1:original_dst_port"},
	}})
	c := dial(t, sim.ListenerAddr("tcp"))
	if err := readErr(c); !errors.Is(err, io.EOF) {
		t.Errorf("tcp: %v, want closed", err)
	}
	h := dialHTTP(t, sim.ListenerAddr("http"))
	if resp, body := h.get("/"); resp.StatusCode != 503 || !strings.HasPrefix(body, "upstream connect error") {
		t.Errorf("http: %d %q", resp.StatusCode, body)
	}
	for _, name := range []string{"cluster.tcp.upstream_cx_connect_fail", "cluster.http.upstream_cx_connect_fail"} {
		if v, _ := sim.Stat(name); v != 1 {
			t.Errorf("%s = %d", name, v)
		}
	}
}

// IP_TRANSPARENT needs CAP_NET_ADMIN: without it the listener cannot be
// created and Start says why; with it (root) the listener works.
func TestTransparentListener(t *testing.T) {
	echo := echoServer(t)
	cfg := envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Upstream: echo, Transparent: true},
	}}
	if os.Geteuid() != 0 {
		_, err := envoysim.Start(cfg)
		if err == nil || !strings.Contains(err.Error(), "IP_TRANSPARENT") {
			t.Fatalf("without CAP_NET_ADMIN: %v", err)
		}
		return
	}
	sim := startSim(t, cfg)
	dialEcho(t, sim.ListenerAddr("in"))
}
