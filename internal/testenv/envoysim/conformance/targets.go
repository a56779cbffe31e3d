package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// Sim is the in-process envoysim target.
func Sim() Target { return simTarget{} }

type simTarget struct{}

func (simTarget) Name() string { return "envoysim" }

func (simTarget) Start(t *testing.T, s Setup) Instance {
	t.Helper()
	cfg := envoysim.Config{
		DrainTime:       s.DrainTime,
		DrainStrategy:   s.DrainStrategy,
		StatsMatcher:    s.StatsMatcher,
		DrainGeneration: s.DrainGeneration,
	}
	if s.DrainTime == 0 {
		cfg.DrainTime = envoysim.ZeroDrainTime
	}
	for _, l := range s.Listeners {
		cfg.Listeners = append(cfg.Listeners, envoysim.ListenerConfig{
			Name: l.Name, Address: "127.0.0.1:0", Direction: l.Direction, Protocol: l.Protocol,
			StatPrefix: l.StatPrefix, Upstream: l.UpstreamAddr, DrainTimeout: l.DrainTimeout,
		})
	}
	sim, err := envoysim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	if err := sim.WaitLive(context.Background()); err != nil {
		t.Fatal(err)
	}
	return simInstance{sim}
}

type simInstance struct{ *envoysim.Sim }

// Signal stops the sim as the signal stops Envoy: SIGTERM and SIGINT quit.
func (s simInstance) Signal(sig os.Signal) error {
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT:
		s.Quit()
		return nil
	}
	return fmt.Errorf("envoysim in process: %v not supported", sig)
}

// Envoy is the real Envoy target: the binary named by ENVOY_BIN, else
// envoy on PATH. Scenarios skip, saying why, when there is none.
func Envoy() Target { return envoyTarget{} }

type envoyTarget struct{}

func (envoyTarget) Name() string { return "envoy" }

// EnvoyBinary returns the Envoy binary to run, or why there is none.
func EnvoyBinary() (string, error) {
	if p := os.Getenv("ENVOY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("ENVOY_BIN: %w", err)
		}
		return p, nil
	}
	p, err := exec.LookPath("envoy")
	if err != nil {
		return "", fmt.Errorf("no envoy binary: ENVOY_BIN unset and %w", err)
	}
	return p, nil
}

func (envoyTarget) Start(t *testing.T, s Setup) Instance {
	t.Helper()
	bin, err := EnvoyBinary()
	if err != nil {
		t.Skip(err)
	}
	boot, err := Bootstrap(s)
	if err != nil {
		t.Fatal(err)
	}
	return startProcess(t, "envoy", bin, "bootstrap.json", boot, s)
}

// Program is the envoysim program at bin, run as a process with a config
// equivalent to the setup (SIGTERM then reaches a real process).
func Program(bin string) Target { return programTarget{bin} }

type programTarget struct{ bin string }

func (programTarget) Name() string { return "envoysim-program" }

func (p programTarget) Start(t *testing.T, s Setup) Instance {
	t.Helper()
	type listener struct {
		Name           string  `json:"name"`
		Address        string  `json:"address"`
		Direction      string  `json:"direction,omitempty"`
		Protocol       string  `json:"protocol,omitempty"`
		StatPrefix     string  `json:"stat_prefix,omitempty"`
		Upstream       string  `json:"upstream"`
		DrainTimeoutMs float64 `json:"drain_timeout_ms,omitempty"`
	}
	cfg := struct {
		AdminAddress    string     `json:"admin_address"`
		StatsMatcher    string     `json:"stats_matcher,omitempty"`
		DrainGeneration string     `json:"drain_generation,omitempty"`
		Listeners       []listener `json:"listeners"`
	}{AdminAddress: "127.0.0.1:0", StatsMatcher: s.StatsMatcher, DrainGeneration: s.DrainGeneration}
	for _, l := range s.Listeners {
		cfg.Listeners = append(cfg.Listeners, listener{l.Name, "127.0.0.1:0", l.Direction, l.Protocol, l.StatPrefix,
			l.UpstreamAddr, float64(l.DrainTimeout) / float64(time.Millisecond)})
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return startProcess(t, "envoysim", p.bin, "envoysim.json", b, s)
}

// startProcess runs an Envoy-like binary with config and Envoy's flags,
// and waits until it is LIVE.
func startProcess(t *testing.T, name, bin, configName string, config []byte, s Setup) Instance {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, configName)
	if err := os.WriteFile(cfg, config, 0o644); err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "admin-address")
	strategy := s.DrainStrategy
	if strategy == "" {
		strategy = "gradual"
	}
	cmd := exec.Command(bin, "-c", cfg, "--admin-address-path", addrFile,
		"--drain-time-s", strconv.Itoa(int(s.DrainTime/time.Second)), "--drain-strategy", strategy,
		"--concurrency", "2", "--disable-hot-restart", "-l", "warning")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: &logs}, &lockedWriter{w: &logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in := &processInstance{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(in.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-in.done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for in.admin == "" || !in.live() {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			in.admin = strings.TrimSpace(string(b))
		}
		select {
		case <-in.done:
			t.Fatalf("%s exited at start:\n%s", name, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not LIVE after 30 s:\n%s", name, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := in.readListeners(); err != nil {
		t.Fatal(err)
	}
	return in
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

type processInstance struct {
	cmd       *exec.Cmd
	done      chan struct{}
	admin     string
	listeners map[string]string
}

func (e *processInstance) AdminAddr() string               { return e.admin }
func (e *processInstance) ListenerAddr(name string) string { return e.listeners[name] }
func (e *processInstance) Signal(sig os.Signal) error      { return e.cmd.Process.Signal(sig) }
func (e *processInstance) Done() <-chan struct{}           { return e.done }

func (e *processInstance) live() bool {
	if e.admin == "" {
		return false
	}
	resp, err := adminClient.Get("http://" + e.admin + "/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// readListeners learns the bound addresses from /listeners?format=json.
func (e *processInstance) readListeners() error {
	resp, err := adminClient.Get("http://" + e.admin + "/listeners?format=json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
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
	if err := json.NewDecoder(resp.Body).Decode(&ls); err != nil {
		return fmt.Errorf("/listeners: %w", err)
	}
	e.listeners = map[string]string{}
	for _, s := range ls.Statuses {
		sa := s.LocalAddress.SocketAddress
		e.listeners[s.Name] = net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue))
	}
	return nil
}

// Bootstrap writes an Envoy bootstrap (JSON) equivalent to a Setup: an
// admin API on 127.0.0.1:0, each listener on 127.0.0.1:0 with its
// traffic_direction and stat_prefix, an HTTP connection manager (codec
// AUTO, drain_timeout, a route to the listener's cluster) or a tcp_proxy,
// one static cluster per listener, and the stats_matcher.
func Bootstrap(s Setup) ([]byte, error) {
	type m = map[string]any
	addr := func(hostPort string) (m, error) {
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil {
			return nil, err
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, err
		}
		return m{"socket_address": m{"address": host, "port_value": p}}, nil
	}
	var listeners, clusters []any
	for _, l := range s.Listeners {
		up, err := addr(l.UpstreamAddr)
		if err != nil {
			return nil, fmt.Errorf("listener %s: upstream: %w", l.Name, err)
		}
		cluster := "cluster_" + l.Name
		c := m{"name": cluster, "type": "STATIC", "connect_timeout": "5s",
			"load_assignment": m{"cluster_name": cluster, "endpoints": []any{m{"lb_endpoints": []any{m{"endpoint": m{"address": up}}}}}}}
		clusters = append(clusters, c)
		var filter m
		if l.Protocol == "http" {
			hcm := m{
				"@type":       "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
				"stat_prefix": l.Name, "codec_type": "AUTO",
				"route_config": m{"virtual_hosts": []any{m{"name": "all", "domains": []any{"*"},
					"routes": []any{m{"match": m{"prefix": "/"}, "route": m{"cluster": cluster}}}}}},
				"http_filters": []any{m{"name": "envoy.filters.http.router",
					"typed_config": m{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}},
			}
			if l.DrainTimeout > 0 {
				hcm["drain_timeout"] = fmt.Sprintf("%.3fs", l.DrainTimeout.Seconds())
			}
			filter = m{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
		} else {
			filter = m{"name": "envoy.filters.network.tcp_proxy", "typed_config": m{
				"@type":       "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
				"stat_prefix": l.Name, "cluster": cluster}}
		}
		lst := m{"name": l.Name, "address": m{"socket_address": m{"address": "127.0.0.1", "port_value": 0}},
			"filter_chains": []any{m{"filters": []any{filter}}}}
		if l.StatPrefix != "" {
			lst["stat_prefix"] = l.StatPrefix
		}
		switch l.Direction {
		case "inbound":
			lst["traffic_direction"] = "INBOUND"
		case "outbound":
			lst["traffic_direction"] = "OUTBOUND"
		}
		listeners = append(listeners, lst)
	}
	boot := m{
		"admin":            m{"address": m{"socket_address": m{"address": "127.0.0.1", "port_value": 0}}},
		"static_resources": m{"listeners": listeners, "clusters": clusters},
	}
	if s.DrainGeneration == envoysim.Drain139 {
		// A newer Envoy drains as 1.39 did with its runtime guards off.
		boot["layered_runtime"] = m{"layers": []any{m{"name": "static", "static_layer": m{
			"envoy.reloadable_features.use_connection_event_drain":              false,
			"envoy.reloadable_features.non_graceful_drain_notifies_connections": false,
		}}}}
	}
	switch s.StatsMatcher {
	case "":
	case "reject_all":
		boot["stats_config"] = m{"stats_matcher": m{"reject_all": true}}
	case "istio", "istio_exit_on_zero":
		in := envoysim.IstioStatsInclusion(s.StatsMatcher == "istio_exit_on_zero")
		var patterns []any
		for _, p := range in.Prefixes {
			patterns = append(patterns, m{"prefix": p})
		}
		for _, p := range in.Suffixes {
			patterns = append(patterns, m{"suffix": p})
		}
		for _, p := range in.Regexes {
			patterns = append(patterns, m{"safe_regex": m{"regex": p}})
		}
		boot["stats_config"] = m{"stats_matcher": m{"inclusion_list": m{"patterns": patterns}}}
	default:
		return nil, fmt.Errorf("stats matcher %q", s.StatsMatcher)
	}
	return json.MarshalIndent(boot, "", "  ")
}
