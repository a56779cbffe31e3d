package envoysim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"time"
)

// Config is what a Sim runs. The zero value is usable: an admin API on
// 127.0.0.1:0, no listeners, Envoy's defaults for the rest.
type Config struct {
	// AdminAddress is the admin API's host:port (port 0: any free port,
	// see [Sim.AdminAddr]). Default 127.0.0.1:0.
	AdminAddress string
	// AdminAddressPath, when set, is a file the bound admin address is
	// written to once it listens, as Envoy's --admin-address-path.
	AdminAddressPath string
	// Concurrency is the number of worker threads (--concurrency): each
	// listener has worker_0..N-1 stats and hands connections to the workers
	// round-robin. Default 2.
	Concurrency int
	// DrainTime is --drain-time-s. Default 600 s.
	DrainTime time.Duration
	// DrainStrategy is --drain-strategy: "gradual" (default) or "immediate".
	DrainStrategy string
	// ParentShutdownTime is --parent-shutdown-time-s, only reported. Default 900 s.
	ParentShutdownTime time.Duration
	// StartupDelay is how long the server takes to initialize: the state is
	// PRE_INITIALIZING for the first half, INITIALIZING for the second, then
	// LIVE, when the listeners start listening and workers_started turns 1.
	StartupDelay time.Duration
	// StatsFlushInterval, when positive, refreshes server.state,
	// server.live, server.uptime and server.total_connections only on a
	// flush of that period, as Envoy does (5 s by default). Zero refreshes
	// them on every read.
	StatsFlushInterval time.Duration
	// Listeners are the proxy's listeners.
	Listeners []ListenerConfig
	// Fault is the fault the sim starts with (see [Sim.SetFault]).
	Fault Fault
	// Log, when set, receives a few Envoy-like log lines.
	Log io.Writer
	// ConfigPath is only reported (server_info's config_path).
	ConfigPath string
}

// ListenerConfig is one listener.
type ListenerConfig struct {
	// Name is the listener's name (unique).
	Name string
	// Address is an IP literal and port, "0.0.0.0:15006", "[::]:15001";
	// port 0 binds any free port (see [Sim.ListenerAddr]).
	Address string
	// Direction is "inbound", "outbound" or "" (unspecified), Envoy's
	// traffic_direction: /drain_listeners?inboundonly affects only inbound.
	Direction string
	// StatPrefix, when set, replaces the address in listener.<...> stats.
	StatPrefix string
	// Protocol is "tcp" (a byte pipe, as tcp_proxy) or "http" (HTTP/1.1
	// with keep-alive, as the HTTP connection manager and router).
	Protocol string
	// Upstream is the host:port connections or requests go to.
	Upstream string
	// FilterStatPrefix is the stat_prefix of the listener's filter: the
	// HTTP connection manager's (http.<prefix>. stats) or tcp_proxy's
	// (tcp.<prefix>.). Default: StatPrefix, else Name.
	FilterStatPrefix string
	// DrainType is "default" or "modify_only". Only "default" listeners
	// drain-close responses while /healthcheck/fail is in force.
	DrainType string
}

// AdminFault is how the admin API misbehaves.
type AdminFault string

// Admin faults.
const (
	AdminOK      AdminFault = ""        // answers as Envoy does
	AdminHang    AdminFault = "hang"    // accepts, reads the request, never answers
	AdminError   AdminFault = "500"     // every answer is a 500
	AdminGarbage AdminFault = "garbage" // every answer is a 200 with a garbage body
)

// Fault is a failure to inject.
type Fault struct {
	// Admin makes the admin API misbehave (the test hook endpoint
	// /envoysim/fault is exempt).
	Admin AdminFault
	// CrashAfter, when positive, makes the sim crash that long after the
	// fault is set (at start, or by SetFault): every socket is reset at
	// once and [Sim.Err] is [ErrCrashed]; the envoysim program exits with
	// CrashExitCode.
	CrashAfter time.Duration
	// CrashExitCode is the envoysim program's exit code on a crash. Default
	// 134 (what a shell reports for SIGABRT).
	CrashExitCode int
}

func (f Fault) validate() error {
	switch f.Admin {
	case AdminOK, AdminHang, AdminError, AdminGarbage:
	default:
		return fmt.Errorf("admin fault %q: want hang, 500 or garbage", f.Admin)
	}
	if f.CrashAfter < 0 {
		return fmt.Errorf("crash after %v: negative", f.CrashAfter)
	}
	if f.CrashExitCode < 0 || f.CrashExitCode > 255 {
		return fmt.Errorf("crash exit code %d: want 0..255", f.CrashExitCode)
	}
	return nil
}

// withDefaults fills in defaults and checks the config.
func (c Config) withDefaults() (Config, error) {
	if c.AdminAddress == "" {
		c.AdminAddress = "127.0.0.1:0"
	}
	if c.Concurrency == 0 {
		c.Concurrency = 2
	}
	if c.Concurrency < 1 || c.Concurrency > 256 {
		return c, fmt.Errorf("concurrency %d: want 1..256", c.Concurrency)
	}
	if c.DrainTime == 0 {
		c.DrainTime = 600 * time.Second
	}
	if c.DrainTime < 0 {
		return c, fmt.Errorf("drain time %v: negative", c.DrainTime)
	}
	if c.ParentShutdownTime == 0 {
		c.ParentShutdownTime = 900 * time.Second
	}
	switch c.DrainStrategy {
	case "":
		c.DrainStrategy = "gradual"
	case "gradual", "immediate":
	default:
		return c, fmt.Errorf("drain strategy %q: want gradual or immediate", c.DrainStrategy)
	}
	if c.StartupDelay < 0 || c.StatsFlushInterval < 0 {
		return c, fmt.Errorf("negative startup delay or stats flush interval")
	}
	if c.Fault.CrashExitCode == 0 {
		c.Fault.CrashExitCode = 134
	}
	if err := c.Fault.validate(); err != nil {
		return c, err
	}
	if _, err := parseHostPort(c.AdminAddress); err != nil {
		return c, fmt.Errorf("admin address: %w", err)
	}
	c.Listeners = append([]ListenerConfig(nil), c.Listeners...)
	names := map[string]bool{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		if l.Name == "" {
			return c, fmt.Errorf("listener %d: no name", i)
		}
		if names[l.Name] {
			return c, fmt.Errorf("listener %q: name used twice", l.Name)
		}
		names[l.Name] = true
		if _, err := parseHostPort(l.Address); err != nil {
			return c, fmt.Errorf("listener %q: address: %w", l.Name, err)
		}
		switch l.Direction {
		case "", "inbound", "outbound":
		default:
			return c, fmt.Errorf("listener %q: direction %q: want inbound or outbound", l.Name, l.Direction)
		}
		switch l.Protocol {
		case "":
			l.Protocol = "tcp"
		case "tcp", "http":
		default:
			return c, fmt.Errorf("listener %q: protocol %q: want tcp or http", l.Name, l.Protocol)
		}
		if _, _, err := net.SplitHostPort(l.Upstream); err != nil {
			return c, fmt.Errorf("listener %q: upstream %q: %w", l.Name, l.Upstream, err)
		}
		switch l.DrainType {
		case "":
			l.DrainType = "default"
		case "default", "modify_only":
		default:
			return c, fmt.Errorf("listener %q: drain type %q: want default or modify_only", l.Name, l.DrainType)
		}
		if l.FilterStatPrefix == "" {
			l.FilterStatPrefix = l.StatPrefix
			if l.FilterStatPrefix == "" {
				l.FilterStatPrefix = l.Name
			}
		}
	}
	return c, nil
}

// parseHostPort parses an IP literal and a port: "127.0.0.1:0", "[::]:15001".
func parseHostPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, fmt.Errorf("%q: want ip:port with an IP literal", s)
	}
	return ap, nil
}

// fileConfig is the JSON form of Config (see docs/envoysim.md).
type fileConfig struct {
	AdminAddress         string         `json:"admin_address"`
	AdminAddressPath     string         `json:"admin_address_path"`
	Concurrency          int            `json:"concurrency"`
	DrainTimeS           float64        `json:"drain_time_s"`
	DrainStrategy        string         `json:"drain_strategy"`
	ParentShutdownTimeS  float64        `json:"parent_shutdown_time_s"`
	StartupDelayMs       float64        `json:"startup_delay_ms"`
	StatsFlushIntervalMs float64        `json:"stats_flush_interval_ms"`
	Listeners            []fileListener `json:"listeners"`
	Fault                *fileFault     `json:"fault"`
}

type fileListener struct {
	Name             string `json:"name"`
	Address          string `json:"address"`
	Direction        string `json:"direction"`
	StatPrefix       string `json:"stat_prefix"`
	Protocol         string `json:"protocol"`
	Upstream         string `json:"upstream"`
	FilterStatPrefix string `json:"filter_stat_prefix"`
	DrainType        string `json:"drain_type"`
}

type fileFault struct {
	Admin         string  `json:"admin"`
	CrashAfterMs  float64 `json:"crash_after_ms"`
	CrashExitCode int     `json:"crash_exit_code"`
}

func seconds(f float64, what string) (time.Duration, error) {
	if f < 0 || math.IsNaN(f) || f > float64(math.MaxInt64)/float64(time.Second) {
		return 0, fmt.Errorf("%s %v: out of range", what, f)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// ParseConfig reads the JSON config format. Unknown fields are errors.
func ParseConfig(b []byte) (Config, error) {
	var fc fileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return Config{}, fmt.Errorf("envoysim config: %w", err)
	}
	c := Config{
		AdminAddress:     fc.AdminAddress,
		AdminAddressPath: fc.AdminAddressPath,
		Concurrency:      fc.Concurrency,
		DrainStrategy:    fc.DrainStrategy,
	}
	var err error
	for _, d := range []struct {
		dst  *time.Duration
		v    float64
		unit float64
		what string
	}{
		{&c.DrainTime, fc.DrainTimeS, 1, "drain_time_s"},
		{&c.ParentShutdownTime, fc.ParentShutdownTimeS, 1, "parent_shutdown_time_s"},
		{&c.StartupDelay, fc.StartupDelayMs, 1e-3, "startup_delay_ms"},
		{&c.StatsFlushInterval, fc.StatsFlushIntervalMs, 1e-3, "stats_flush_interval_ms"},
	} {
		if *d.dst, err = seconds(d.v*d.unit, d.what); err != nil {
			return Config{}, fmt.Errorf("envoysim config: %w", err)
		}
	}
	for _, l := range fc.Listeners {
		c.Listeners = append(c.Listeners, ListenerConfig(l))
	}
	if fc.Fault != nil {
		c.Fault.Admin = AdminFault(fc.Fault.Admin)
		c.Fault.CrashExitCode = fc.Fault.CrashExitCode
		if c.Fault.CrashAfter, err = seconds(fc.Fault.CrashAfterMs/1e3, "crash_after_ms"); err != nil {
			return Config{}, fmt.Errorf("envoysim config: %w", err)
		}
	}
	return c, nil
}

// LoadConfig reads a JSON config file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("envoysim config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, err
	}
	c.ConfigPath = path
	return c, nil
}
