package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/proxy"
)

// Config is everything `draind run` is told.
type Config struct {
	// AdminAddr is Envoy's admin API (host:port).
	AdminAddr string
	// StatusAddr is where draind serves /healthz/ready and the rest.
	StatusAddr string
	// AdminAddrSet and StatusAddrSet say they were given (flag or
	// variable): Istio's settings then do not move them.
	AdminAddrSet, StatusAddrSet bool
	// ProxyKind is what the proxy command is: ProxyEnvoy, ProxyPilotAgent
	// (Istio's agent, which runs Envoy), or ProxyAuto (pilot-agent when the
	// command's file name is pilot-agent).
	ProxyKind string
	// DeadlineSource names the setting that gave Drain.Deadline when
	// DeadlineSet (--drain-deadline, or the variable that set it).
	DeadlineSource string
	// LookupEnv reads Istio's variables (nil: os.LookupEnv);
	// IstioAnnotations is the pod's downward-API annotations file (""
	// : IstioPodAnnotations).
	LookupEnv        func(string) (string, bool)
	IstioAnnotations string
	// ProxyUID owns the proxy's sockets and processes (--proxy-uid).
	ProxyUID uint32
	// ProxyPorts are extra local ports whose sockets are the proxy's.
	ProxyPorts []uint16
	// AppPorts, when set, must be listened on by the app for readiness.
	AppPorts []uint16
	// ExcludePorts are Envoy listeners that do not carry traffic (status,
	// metrics): their connections never hold the drain.
	ExcludePorts []uint16
	// ExcludeListeners names such listeners: a listener's name or its stat
	// scope (stat_prefix, or address as in stats). Mapped to ports once
	// Envoy is LIVE, so that both views leave them out.
	ExcludeListeners []string
	// Drain is the drain machine's part; DeadlineSet says whether the
	// deadline was given explicitly (drain.Config.Reconcile).
	Drain       drain.Config
	DeadlineSet bool
	// Tracker is auto, ebpf or sockdiag; AppProcs is auto, ebpf, proc or
	// off (the socket approximation).
	Tracker  string
	AppProcs string
	// RingSize is the eBPF ring buffer of TCP state events, in bytes (0:
	// the default). A debugging knob: a tiny ring forces losses and resyncs.
	RingSize int
	// ProcRingSize is the same for the app's process events.
	ProcRingSize int
	// HostNetwork is auto, true or false: whether the pod shares the node's
	// network namespace (auto: told by the kernel where it can be).
	HostNetwork string
	// Command is the proxy's argv.
	Command []string
	Proxy   proxy.Options
	Logger  *zap.Logger
}

// The proxy kinds (--proxy).
const (
	ProxyAuto       = "auto"
	ProxyEnvoy      = "envoy"
	ProxyPilotAgent = "pilot-agent"
)

// Defaults.
const (
	DefaultAdminAddr  = "127.0.0.1:15000"
	DefaultStatusAddr = ":15020"
	DefaultProxyUID   = 1337
)

// DefaultExcludePorts are Istio's status (15020, 15021) and Prometheus
// (15090) listeners.
var DefaultExcludePorts = []uint16{15020, 15021, 15090}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		AdminAddr:    DefaultAdminAddr,
		StatusAddr:   DefaultStatusAddr,
		ProxyKind:    ProxyAuto,
		ProxyUID:     DefaultProxyUID,
		ExcludePorts: DefaultExcludePorts,
		Drain:        drain.DefaultConfig(),
		Tracker:      "auto",
		AppProcs:     "auto",
		HostNetwork:  "auto",
	}
}

// ConfigError is a configuration problem found at start: one line naming
// the setting. The command line maps it to exit code 2.
type ConfigError = drain.ConfigError

func configErr(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// Validate checks the settings against each other; the first problem is
// returned, as one line.
func (c *Config) Validate() error {
	if _, _, err := splitPort(c.AdminAddr); err != nil {
		return configErr("--admin-addr %q: %v", c.AdminAddr, err)
	}
	if _, _, err := splitPort(c.StatusAddr); err != nil {
		return configErr("--status-addr %q: %v", c.StatusAddr, err)
	}
	if err := c.Drain.Validate(); err != nil {
		return err
	}
	switch c.ProxyKind {
	case ProxyAuto, ProxyEnvoy, ProxyPilotAgent:
	default:
		return configErr("--proxy %q: must be %s, %s or %s", c.ProxyKind, ProxyAuto, ProxyEnvoy, ProxyPilotAgent)
	}
	switch c.Tracker {
	case "auto", "ebpf", "sockdiag":
	default:
		return configErr("--tracker %q: must be auto, ebpf or sockdiag", c.Tracker)
	}
	switch c.AppProcs {
	case "auto", "ebpf", "proc", "off":
	default:
		return configErr("--app-procs %q: must be auto, ebpf, proc or off", c.AppProcs)
	}
	switch c.HostNetwork {
	case "auto", "true", "false":
	default:
		return configErr("--host-network %q: must be auto, true or false", c.HostNetwork)
	}
	if len(c.Command) == 0 {
		return configErr("no proxy command: draind run [flags] -- COMMAND [ARGS...]")
	}
	return nil
}

// splitPort returns an address's host and port. Its errors do not repeat
// the address (the caller quotes it): they stay one line.
func splitPort(addr string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return "", 0, errors.New(ae.Err)
		}
		return "", 0, err
	}
	if strings.ContainsFunc(host, unicode.IsControl) {
		return "", 0, errors.New("host has control characters")
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, errors.New("port is not a number 0-65535")
	}
	return host, uint16(n), nil
}

// istioResolved is what resolveIstio decided, for the log.
type istioResolved struct {
	settings IstioSettings
	// deadlineFrom names the setting that decided the drain deadline.
	deadlineFrom string
	// warnings are one line each.
	warnings []string
	// exitOnZero: EXIT_ON_ZERO_ACTIVE_CONNECTIONS was set.
	exitOnZero bool
}

// pilotAgent says the proxy command is pilot-agent (after resolveIstio).
func (c *Config) pilotAgent() bool { return c.ProxyKind == ProxyPilotAgent }

// resolveIstio applies Istio's settings (README.md, "Istio"): it tells
// the proxy kind, takes the drain deadline from ProxyConfig
// terminationDrainDuration when no draind setting gave one and it is
// longer (a pod sized for a long drain; a shorter one never cuts draind's
// default), and, under pilot-agent, leaves pilot-agent its status port and
// Envoy's admin port as ProxyConfig says, signals pilot-agent alone, and
// puts draind's status server where no Istio port is. Errors are
// configuration errors.
func (c *Config) resolveIstio() (istioResolved, error) {
	lookup := c.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	path := c.IstioAnnotations
	if path == "" {
		path = IstioPodAnnotations
	}
	var r istioResolved
	if c.ProxyKind == ProxyAuto || c.ProxyKind == "" {
		c.ProxyKind = ProxyEnvoy
		if IsPilotAgent(c.Command) {
			c.ProxyKind = ProxyPilotAgent
		}
	}
	var err error
	if r.settings, err = ReadIstio(lookup, path); err != nil {
		return r, err
	}
	ist := r.settings
	switch {
	case c.DeadlineSet:
		r.deadlineFrom = c.DeadlineSource
		if c.DeadlineSource == TerminationDrainEnv {
			r.warnings = append(r.warnings, TerminationDrainEnv+" is deprecated (Istio removed it in 1.10): set ProxyConfig terminationDrainDuration (proxy.istio.io/config) or DRAIND_DRAIN_DEADLINE")
		}
	case ist.TerminationDrainFrom != "" && ist.TerminationDrain > c.Drain.Deadline:
		c.Drain.Deadline, c.DeadlineSet = ist.TerminationDrain, true
		r.deadlineFrom = "terminationDrainDuration (" + ist.TerminationDrainFrom + ")"
	case ist.TerminationDrainFrom != "":
		r.deadlineFrom = fmt.Sprintf("default: terminationDrainDuration %s (%s) is not longer, and never shortens the drain", ist.TerminationDrain, ist.TerminationDrainFrom)
	default:
		r.deadlineFrom = "default"
	}
	if v, ok := lookup(ExitOnZeroEnv); ok {
		r.exitOnZero, _ = strconv.ParseBool(v) // as Istio reads it; a bad value is Istio's to refuse
	}
	if !c.pilotAgent() {
		return r, nil
	}
	c.Proxy.SignalPIDOnly = true
	// pilot-agent's exit code is its own, as without draind: 0 after its
	// /quitquitquit (Istio's Job recipe) is no failure.
	c.Drain.ProxyExitStands = true
	if !c.AdminAddrSet && ist.AdminPortSet {
		c.AdminAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ist.AdminPort)))
	}
	if !c.StatusAddrSet {
		c.StatusAddr = ":" + strconv.Itoa(int(pilotAgentStatusPort(ist.StatusPort, ist.AdminPort)))
	} else if _, p, err := splitPort(c.StatusAddr); err == nil && p == ist.StatusPort {
		return r, configErr("--status-addr %s: port %d is pilot-agent's status port (ProxyConfig statusPort%s): it serves Istio's readiness and the app probes Istio rewrote; leave --status-addr unset (draind then takes %d) or pick another",
			c.StatusAddr, p, fromSuffix(ist.StatusPortFrom), pilotAgentStatusPort(ist.StatusPort, ist.AdminPort))
	}
	if !slices.Contains(c.ExcludePorts, ist.StatusPort) {
		c.ExcludePorts = append(slices.Clone(c.ExcludePorts), ist.StatusPort)
	}
	return r, nil
}

func fromSuffix(from string) string {
	if from == "" {
		return ", default"
	}
	return ", from " + from
}
