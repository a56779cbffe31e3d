package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/proxy"
	"go.uber.org/zap"
)

// Config is everything `draind run` is told.
type Config struct {
	// AdminAddr is Envoy's admin API (host:port).
	AdminAddr string
	// StatusAddr is where draind serves /healthz/ready and the rest.
	StatusAddr string
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
