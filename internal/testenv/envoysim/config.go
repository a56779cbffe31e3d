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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ZeroDrainTime is the [Config.DrainTime] of Envoy's --drain-time-s 0: a
// graceful drain closes at once. (A zero DrainTime means the default, 600 s.)
const ZeroDrainTime time.Duration = -1

// DefaultDrainTimeout is the HTTP connection manager's drain_timeout: the
// time between the first GOAWAY of an HTTP/2 connection's drain and the
// final one.
const DefaultDrainTimeout = 5 * time.Second

// DelayedCloseTimeout is the HTTP connection manager's
// delayed_close_timeout: after its last response a draining connection
// waits that long for the client to close before closing it itself.
const DelayedCloseTimeout = time.Second

// Drain generations: how a drain reaches a listener's connections
// (docs/envoysim.md, "Drain generations").
const (
	// Drain139 is Envoy through 1.39.x: a drain acts only when a response
	// is sent on a connection (DrainDecision polled in encodeHeaders).
	Drain139 = "1.39"
	// Drain140 is Envoy 1.40.x (runtime guards
	// envoy.reloadable_features.use_connection_event_drain and
	// non_graceful_drain_notifies_connections, both on): the drain is pushed
	// to every connection of the drained listeners, but still acts only
	// when a response is sent on a connection; the gradual ramp runs over
	// the whole drain time from whole seconds elapsed (no drain in the first
	// second); a drain without graceful drains connections too, and
	// skip_exit no longer needs graceful.
	Drain140 = "1.40"
	// DrainConnectionEvent is Envoy main after 1.40.0: as [Drain140], but
	// the gradual ramp runs over half the drain time and connections not
	// yet draining are drained proactively at a random moment in the last
	// third of the drain time (before drain time - drain_timeout).
	DrainConnectionEvent = "connection_event"
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
	// DrainTime is --drain-time-s. Zero means the default, 600 s;
	// [ZeroDrainTime] is Envoy's --drain-time-s 0.
	DrainTime time.Duration
	// DrainStrategy is --drain-strategy: "gradual" (default) or "immediate".
	DrainStrategy string
	// DrainGeneration is [Drain139] (default), [Drain140] or
	// [DrainConnectionEvent].
	DrainGeneration string
	// ParentShutdownTime is --parent-shutdown-time-s, only reported. Default 900 s.
	ParentShutdownTime time.Duration
	// StartupDelay is how long the server takes to initialize: the state is
	// PRE_INITIALIZING for the first half, INITIALIZING for the second, then
	// LIVE, when the listeners start listening and workers_started turns 1.
	StartupDelay time.Duration
	// StatsFlushInterval, when positive, refreshes server.state,
	// server.uptime and server.total_connections only when the workers
	// start and on a flush of that period (the first one interval after
	// start), as Envoy does (5 s by default). Zero refreshes them on every
	// read once the workers have started. Before the first refresh
	// server.state is an unset gauge: it reads 0 and usedonly hides it.
	StatsFlushInterval time.Duration
	// StatsMatcher is a preset of the bootstrap's stats_matcher: "" keeps
	// every stat (Envoy's default); "istio" is Istio's default inclusion
	// list, which has no downstream_cx_active gauge at all; "istio_exit_on_zero"
	// is Istio's list with EXIT_ON_ZERO_ACTIVE_CONNECTIONS set, which adds
	// the downstream_cx_active suffix (see [IstioStatsInclusion]);
	// "reject_all" is stats_matcher {reject_all: true}: no stat exists, not
	// even server.state.
	StatsMatcher string
	// StatsInclusion, when set, is an inclusion list of its own (it wins
	// over StatsMatcher): a stat exists only if it matches one pattern.
	StatsInclusion *StatsInclusion
	// XDS says the listeners and clusters came from a control plane, as
	// under Istio: cluster_manager.cds.update_success and
	// listener_manager.lds.update_success turn 1 when the workers start
	// (pilot-agent's readiness waits for both), their _rejected twins stay
	// 0. Without it, as an Envoy with a static bootstrap, they do not exist.
	XDS bool
	// Listeners are the proxy's listeners.
	Listeners []ListenerConfig
	// Fault is the fault the sim starts with (see [Sim.SetFault]).
	Fault Fault
	// Log, when set, receives a few Envoy-like log lines.
	Log io.Writer
	// LogAdminRequests logs every admin request ("admin GET /stats?...")
	// to Log: tests count the calls draind makes.
	LogAdminRequests bool
	// ConfigPath is only reported (server_info's config_path).
	ConfigPath string
	// OnCrash, when set, is called by a crash before the sim stops, if the
	// fault's CrashExitCode is 0. The envoysim program kills itself there
	// with SIGABRT, so that the kernel closes its sockets as it does for
	// a crashing Envoy. If OnCrash returns, the sim stops as a crash.
	OnCrash func()
}

// StatsInclusion is a stats_matcher inclusion_list: a stat is created only
// if its name has one of the prefixes or suffixes or fully matches one of
// the regular expressions (Envoy's StringMatcher safe_regex is a full
// match). Stats it rejects do not exist: /stats never lists them, with or
// without usedonly.
type StatsInclusion struct {
	Prefixes []string `json:"prefixes"`
	Suffixes []string `json:"suffixes"`
	Regexes  []string `json:"regexes"`
}

// IstioStatsInclusion is Istio's default stats_matcher (Istio's
// istio.io/istio/pkg/bootstrap/config.go and
// istio.io/istio/tools/packaging/common/envoy_bootstrap.json): the prefixes
// reporter=, cluster_manager, listener_manager, server, cluster.xds-grpc,
// wasm, component and istio; the suffixes rbac.allowed, rbac.denied,
// shadow_allowed and shadow_denied, plus downstream_cx_active when
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS is set; and the regex vhost\..*\.route\..*
// (as fixed by istio#51640: the older vhost\.*\.route\.* matched no route
// stat).
// Without that suffix no listener.*, http.* or admin gauge is kept.
func IstioStatsInclusion(exitOnZeroActiveConnections bool) StatsInclusion {
	in := StatsInclusion{
		Prefixes: []string{"reporter=", "cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm", "component", "istio"},
		Suffixes: []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"},
		Regexes:  []string{`vhost\..*\.route\..*`},
	}
	if exitOnZeroActiveConnections {
		in.Suffixes = append(in.Suffixes, "downstream_cx_active")
	}
	return in
}

// IstioStatsTemplate is the "stats_inclusion" member of envoysim's config
// as a bootstrap template that pilot-agent renders (Go's text/template,
// with the options it renders Envoy's with): the inclusion list of
// istio.io/istio/tools/packaging/common/envoy_bootstrap.json, filled from
// the proxy config, the pod's sidecar.istio.io/statsInclusion* annotations
// and EXIT_ON_ZERO_ACTIVE_CONNECTIONS (istio.io/istio/pkg/bootstrap/config.go,
// getStatsOptions). A stand-in started by pilot-agent from it keeps the
// stats Istio's bootstrap lets Envoy keep, no more.
const IstioStatsTemplate = `"stats_inclusion": {
    "prefixes": ["reporter="
      {{- if .metadata_discovery }}, "workload_discovery"{{ end }}
      {{- range $a, $s := .inclusionPrefix }}, "{{ $s }}"{{ end }}, "component", "istio"],
    "suffixes": [{{- range $i, $s := .inclusionSuffix }}{{ if $i }}, {{ end }}"{{ $s }}"{{ end }}],
    "regexes": [{{- range $i, $s := .inclusionRegexps }}{{ if $i }}, {{ end }}"{{ js $s }}"{{ end }}]
  }`

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
	// Protocol is "tcp" (a byte pipe, as tcp_proxy) or "http" (the HTTP
	// connection manager with codec_type AUTO and the router: HTTP/1.1
	// with keep-alive, or HTTP/2 cleartext with prior knowledge, told
	// apart by the HTTP/2 connection preface).
	Protocol string
	// Upstream is where connections or requests go: a host:port; or
	// "original_dst", the connection's original destination (the address
	// SO_ORIGINAL_DST reports after an iptables REDIRECT, else the accepted
	// socket's local address, which TPROXY keeps), as Envoy's ORIGINAL_DST
	// cluster; or "HOST:original_dst_port", HOST with the original
	// destination's port ("127.0.0.1:original_dst_port": the app on
	// localhost, as Istio's inbound clusters). A connection whose original
	// destination is the listener's own port is refused (no loop).
	Upstream string
	// UpstreamProtocol is the HTTP listener's upstream protocol: "http1"
	// (default) or "h2c" (HTTP/2 cleartext, prior knowledge).
	UpstreamProtocol string
	// FilterStatPrefix is the stat_prefix of the listener's filter: the
	// HTTP connection manager's (http.<prefix>. stats) or tcp_proxy's
	// (tcp.<prefix>.). Default: StatPrefix, else Name.
	FilterStatPrefix string
	// DrainType is "default" or "modify_only". Only "default" listeners
	// drain-close responses while /healthcheck/fail is in force.
	DrainType string
	// DrainTimeout is the HTTP connection manager's drain_timeout: an
	// HTTP/2 connection gets its final GOAWAY that long after the first.
	// Default [DefaultDrainTimeout] (5 s).
	DrainTimeout time.Duration
	// Transparent sets IP_TRANSPARENT (IPV6_TRANSPARENT) on the listen
	// socket, as Envoy's transparent listener option for TPROXY
	// interception; it needs CAP_NET_ADMIN.
	Transparent bool
	// FilterChains are filter chains matched on the destination port: a
	// connection whose original destination port (as "original_dst" reads
	// it: SO_ORIGINAL_DST after a REDIRECT, else the accepted socket's
	// local port) is a chain's DestinationPort goes to that chain's
	// Upstream with its UpstreamProtocol; any other connection uses the
	// listener's own Upstream and UpstreamProtocol (Envoy's
	// default_filter_chain). Stats and drain stay the listener's.
	FilterChains []FilterChain
}

// FilterChain is a listener's filter chain with a filter_chain_match of
// destination_port only, as Istio's virtualInbound has one per inbound
// service port (Envoy: FilterChainManagerImpl::findFilterChain,
// source/common/listener_manager/filter_chain_manager_impl.cc).
type FilterChain struct {
	// DestinationPort is the original destination port the chain matches
	// (1..65535; one chain per port).
	DestinationPort uint16
	// Upstream is the chain's upstream, of the forms of
	// [ListenerConfig.Upstream] (required: a chain is whole, it takes
	// nothing from the listener's).
	Upstream string
	// UpstreamProtocol is "http1" (default) or "h2c", as the listener's:
	// "h2c" is an Istio cluster for a grpc or http2 port
	// (http2_protocol_options).
	UpstreamProtocol string
}

// AdminFault is how the admin API misbehaves.
type AdminFault string

// Admin faults.
const (
	AdminOK      AdminFault = ""        // answers as Envoy does
	AdminHang    AdminFault = "hang"    // accepts, reads the request, never answers
	AdminError   AdminFault = "500"     // every answer is a 500
	AdminGarbage AdminFault = "garbage" // every answer is a 200 with a garbage body
	AdminSlow    AdminFault = "slow"    // every answer comes after Fault.AdminDelay (default 2 s)
)

// DefaultAdminDelay is the delay of the slow admin fault when none is given.
const DefaultAdminDelay = 2 * time.Second

// Fault is a failure to inject.
type Fault struct {
	// Admin makes the admin API misbehave (the test hook endpoint
	// /envoysim/fault is exempt).
	Admin AdminFault
	// AdminDelay delays every admin answer (hook exempt) by that long,
	// whatever Admin is; Admin "slow" with no delay is 2 s.
	AdminDelay time.Duration
	// CrashAfter, when positive, makes the sim crash that long after the
	// fault is set (at start, or by SetFault).
	CrashAfter time.Duration
	// CrashAfterDrain, when positive, makes the sim crash that long after
	// the first POST /drain_listeners that follows the fault.
	CrashAfterDrain time.Duration
	// CrashExitCode is what a crash does to the envoysim program: 0 (the
	// default) kills the process with SIGABRT, as a crashing Envoy dies
	// (a parent sees "killed by signal 6"; a shell reports 134); any other
	// value makes it exit with that code instead, after closing its
	// sockets. In process, a crash closes every socket and [Sim.Err] is
	// [ErrCrashed].
	CrashExitCode int
	// ExitAtStart makes the sim exit with ExitAtStartCode when it would go
	// LIVE (after StartupDelay), as an Envoy that fails its initialization:
	// the listeners never listen; [Sim.Err] is an [*ExitError].
	ExitAtStart     bool
	ExitAtStartCode int
	// NeverLive keeps the server INITIALIZING: the listeners never listen
	// and the workers never start. Clearing it (SetFault) after the
	// startup delay makes the sim go LIVE at once.
	NeverLive bool
}

func (f Fault) validate() error {
	switch f.Admin {
	case AdminOK, AdminHang, AdminError, AdminGarbage, AdminSlow:
	default:
		return fmt.Errorf("admin fault %q: want hang, 500, garbage or slow", f.Admin)
	}
	if f.CrashAfter < 0 || f.CrashAfterDrain < 0 || f.AdminDelay < 0 {
		return fmt.Errorf("negative crash delay or admin delay")
	}
	if f.CrashExitCode < 0 || f.CrashExitCode > 255 {
		return fmt.Errorf("crash exit code %d: want 0..255", f.CrashExitCode)
	}
	if f.ExitAtStartCode < 0 || f.ExitAtStartCode > 255 {
		return fmt.Errorf("exit at start code %d: want 0..255", f.ExitAtStartCode)
	}
	return nil
}

// adminDelay is how long every admin answer waits.
func (f Fault) adminDelay() time.Duration {
	if f.AdminDelay == 0 && f.Admin == AdminSlow {
		return DefaultAdminDelay
	}
	return f.AdminDelay
}

// upstreamKind is how a listener picks its upstream.
type upstreamKind int

const (
	upstreamFixed        upstreamKind = iota // host:port
	upstreamOriginalDst                      // original_dst
	upstreamOriginalPort                     // HOST:original_dst_port
)

const (
	originalDstName = "original_dst"
	originalDstPort = "original_dst_port"
)

// parseUpstream checks an upstream and says which kind it is.
func parseUpstream(s string) (upstreamKind, error) {
	if s == originalDstName {
		return upstreamOriginalDst, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return 0, err
	}
	if port == originalDstPort {
		if _, err := netip.ParseAddr(host); err != nil {
			return 0, fmt.Errorf("%q: with original_dst_port the host must be an IP literal", s)
		}
		return upstreamOriginalPort, nil
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return 0, fmt.Errorf("%q: bad port", s)
	}
	return upstreamFixed, nil
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
	switch {
	case c.DrainTime == 0:
		c.DrainTime = 600 * time.Second
	case c.DrainTime == ZeroDrainTime:
		c.DrainTime = 0
	case c.DrainTime < 0:
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
	switch c.DrainGeneration {
	case "":
		c.DrainGeneration = Drain139
	case Drain139, Drain140, DrainConnectionEvent:
	default:
		return c, fmt.Errorf("drain generation %q: want %s, %s or %s", c.DrainGeneration, Drain139, Drain140, DrainConnectionEvent)
	}
	if c.StartupDelay < 0 || c.StatsFlushInterval < 0 {
		return c, fmt.Errorf("negative startup delay or stats flush interval")
	}
	if c.StatsInclusion == nil {
		switch c.StatsMatcher {
		case "":
		case "istio", "istio_exit_on_zero":
			in := IstioStatsInclusion(c.StatsMatcher == "istio_exit_on_zero")
			c.StatsInclusion = &in
		case "reject_all":
			c.StatsInclusion = &StatsInclusion{} // an empty inclusion list keeps nothing
		default:
			return c, fmt.Errorf("stats matcher %q: want istio, istio_exit_on_zero or reject_all", c.StatsMatcher)
		}
	}
	if in := c.StatsInclusion; in != nil {
		for _, r := range in.Regexes {
			if _, err := regexp.Compile(r); err != nil {
				return c, fmt.Errorf("stats inclusion regex %q: %w", r, err)
			}
		}
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
		if err := l.withDefaults(i, names); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (l *ListenerConfig) withDefaults(i int, names map[string]bool) error {
	if l.Name == "" {
		return fmt.Errorf("listener %d: no name", i)
	}
	if names[l.Name] {
		return fmt.Errorf("listener %q: name used twice", l.Name)
	}
	names[l.Name] = true
	if _, err := parseHostPort(l.Address); err != nil {
		return fmt.Errorf("listener %q: address: %w", l.Name, err)
	}
	for _, e := range []struct {
		field   *string
		what    string
		def     string
		allowed []string
	}{
		{&l.Direction, "direction", "", []string{"inbound", "outbound"}},
		{&l.Protocol, "protocol", "tcp", []string{"tcp", "http"}},
		{&l.UpstreamProtocol, "upstream protocol", "http1", []string{"http1", "h2c"}},
		{&l.DrainType, "drain type", "default", []string{"default", "modify_only"}},
	} {
		if *e.field == "" {
			*e.field = e.def
		}
		if *e.field != "" && !slices.Contains(e.allowed, *e.field) {
			return fmt.Errorf("listener %q: %s %q: want %s", l.Name, e.what, *e.field, strings.Join(e.allowed, " or "))
		}
	}
	if _, err := parseUpstream(l.Upstream); err != nil {
		return fmt.Errorf("listener %q: upstream %q: %w", l.Name, l.Upstream, err)
	}
	if err := l.filterChainsWithDefaults(); err != nil {
		return fmt.Errorf("listener %q: %w", l.Name, err)
	}
	if l.DrainTimeout == 0 {
		l.DrainTimeout = DefaultDrainTimeout
	}
	if l.DrainTimeout < 0 {
		return fmt.Errorf("listener %q: drain timeout %v: negative", l.Name, l.DrainTimeout)
	}
	if l.FilterStatPrefix == "" {
		l.FilterStatPrefix = l.StatPrefix
		if l.FilterStatPrefix == "" {
			l.FilterStatPrefix = l.Name
		}
	}
	return nil
}

// filterChainsWithDefaults checks the filter chains: a port once (Envoy
// refuses two chains with the same filter_chain_match), not 0 (Envoy's
// "any port": the listener's own upstream is that here), and an upstream
// and protocol each.
func (l *ListenerConfig) filterChainsWithDefaults() error {
	l.FilterChains = slices.Clone(l.FilterChains)
	seen := map[uint16]int{}
	for i := range l.FilterChains {
		fc := &l.FilterChains[i]
		if fc.DestinationPort == 0 {
			return fmt.Errorf("filter chain %d: destination port 0 (missing?): want 1..65535; connections to unlisted ports use the listener's own upstream", i)
		}
		if j, ok := seen[fc.DestinationPort]; ok {
			return fmt.Errorf("filter chains %d and %d: both match destination port %d", j, i, fc.DestinationPort)
		}
		seen[fc.DestinationPort] = i
		if fc.Upstream == "" {
			return fmt.Errorf("filter chain %d (port %d): no upstream", i, fc.DestinationPort)
		}
		if _, err := parseUpstream(fc.Upstream); err != nil {
			return fmt.Errorf("filter chain %d (port %d): upstream %q: %w", i, fc.DestinationPort, fc.Upstream, err)
		}
		switch fc.UpstreamProtocol {
		case "":
			fc.UpstreamProtocol = "http1"
		case "http1", "h2c":
		default:
			return fmt.Errorf("filter chain %d (port %d): upstream protocol %q: want http1 or h2c", i, fc.DestinationPort, fc.UpstreamProtocol)
		}
	}
	return nil
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
	AdminAddress         string          `json:"admin_address"`
	AdminAddressPath     string          `json:"admin_address_path"`
	Concurrency          int             `json:"concurrency"`
	DrainTimeS           *float64        `json:"drain_time_s"`
	DrainStrategy        string          `json:"drain_strategy"`
	DrainGeneration      string          `json:"drain_generation"`
	LogAdminRequests     bool            `json:"log_admin_requests"`
	ParentShutdownTimeS  float64         `json:"parent_shutdown_time_s"`
	StartupDelayMs       float64         `json:"startup_delay_ms"`
	StatsFlushIntervalMs float64         `json:"stats_flush_interval_ms"`
	StatsMatcher         string          `json:"stats_matcher"`
	StatsInclusion       *StatsInclusion `json:"stats_inclusion"`
	XDS                  bool            `json:"xds"`
	Listeners            []fileListener  `json:"listeners"`
	Fault                *fileFault      `json:"fault"`
}

type fileListener struct {
	Name             string  `json:"name"`
	Address          string  `json:"address"`
	Direction        string  `json:"direction"`
	StatPrefix       string  `json:"stat_prefix"`
	Protocol         string  `json:"protocol"`
	Upstream         string  `json:"upstream"`
	UpstreamProtocol string  `json:"upstream_protocol"`
	FilterStatPrefix string  `json:"filter_stat_prefix"`
	DrainType        string  `json:"drain_type"`
	DrainTimeoutMs   float64 `json:"drain_timeout_ms"`
	Transparent      bool    `json:"transparent"`

	FilterChains []fileFilterChain `json:"filter_chains"`
}

type fileFilterChain struct {
	DestinationPort  int    `json:"destination_port"`
	Upstream         string `json:"upstream"`
	UpstreamProtocol string `json:"upstream_protocol"`
}

// fileFault is the JSON form of Fault, in the config and in the
// /envoysim/fault hook's body.
type fileFault struct {
	Admin             string  `json:"admin"`
	AdminDelayMs      float64 `json:"admin_delay_ms"`
	CrashAfterMs      float64 `json:"crash_after_ms"`
	CrashAfterDrainMs float64 `json:"crash_after_drain_ms"`
	CrashExitCode     int     `json:"crash_exit_code"`
	ExitAtStart       *int    `json:"exit_at_start"`
	NeverLive         bool    `json:"never_live"`
}

func (ff fileFault) fault() (Fault, error) {
	f := Fault{Admin: AdminFault(ff.Admin), CrashExitCode: ff.CrashExitCode, NeverLive: ff.NeverLive}
	if f.Admin == "ok" {
		f.Admin = AdminOK
	}
	if ff.ExitAtStart != nil {
		f.ExitAtStart, f.ExitAtStartCode = true, *ff.ExitAtStart
	}
	for _, d := range []struct {
		dst  *time.Duration
		ms   float64
		what string
	}{
		{&f.AdminDelay, ff.AdminDelayMs, "admin_delay_ms"},
		{&f.CrashAfter, ff.CrashAfterMs, "crash_after_ms"},
		{&f.CrashAfterDrain, ff.CrashAfterDrainMs, "crash_after_drain_ms"},
	} {
		var err error
		if *d.dst, err = seconds(d.ms/1e3, d.what); err != nil {
			return f, err
		}
	}
	return f, f.validate()
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
		DrainGeneration:  fc.DrainGeneration,
		LogAdminRequests: fc.LogAdminRequests,
		StatsMatcher:     fc.StatsMatcher,
		StatsInclusion:   fc.StatsInclusion,
		XDS:              fc.XDS,
	}
	var err error
	if fc.DrainTimeS != nil {
		if c.DrainTime, err = seconds(*fc.DrainTimeS, "drain_time_s"); err != nil {
			return Config{}, fmt.Errorf("envoysim config: %w", err)
		}
		if c.DrainTime == 0 {
			c.DrainTime = ZeroDrainTime // an explicit 0 is Envoy's --drain-time-s 0
		}
	}
	for _, d := range []struct {
		dst  *time.Duration
		v    float64
		unit float64
		what string
	}{
		{&c.ParentShutdownTime, fc.ParentShutdownTimeS, 1, "parent_shutdown_time_s"},
		{&c.StartupDelay, fc.StartupDelayMs, 1e-3, "startup_delay_ms"},
		{&c.StatsFlushInterval, fc.StatsFlushIntervalMs, 1e-3, "stats_flush_interval_ms"},
	} {
		if *d.dst, err = seconds(d.v*d.unit, d.what); err != nil {
			return Config{}, fmt.Errorf("envoysim config: %w", err)
		}
	}
	for _, fl := range fc.Listeners {
		l := ListenerConfig{
			Name: fl.Name, Address: fl.Address, Direction: fl.Direction, StatPrefix: fl.StatPrefix,
			Protocol: fl.Protocol, Upstream: fl.Upstream, UpstreamProtocol: fl.UpstreamProtocol,
			FilterStatPrefix: fl.FilterStatPrefix, DrainType: fl.DrainType, Transparent: fl.Transparent,
		}
		if l.DrainTimeout, err = seconds(fl.DrainTimeoutMs/1e3, "drain_timeout_ms"); err != nil {
			return Config{}, fmt.Errorf("envoysim config: listener %q: %w", fl.Name, err)
		}
		for i, fc := range fl.FilterChains {
			if fc.DestinationPort < 0 || fc.DestinationPort > math.MaxUint16 {
				return Config{}, fmt.Errorf("envoysim config: listener %q: filter chain %d: destination_port %d: want 1..65535", fl.Name, i, fc.DestinationPort)
			}
			l.FilterChains = append(l.FilterChains, FilterChain{
				DestinationPort: uint16(fc.DestinationPort), Upstream: fc.Upstream, UpstreamProtocol: fc.UpstreamProtocol,
			})
		}
		c.Listeners = append(c.Listeners, l)
	}
	if fc.Fault != nil {
		if c.Fault, err = fc.Fault.fault(); err != nil {
			return Config{}, fmt.Errorf("envoysim config: fault: %w", err)
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
