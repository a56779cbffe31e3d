package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// Config is everything `draind run` is told. Defaults are DESIGN.md's.
type Config struct {
	// AdminAddr is Envoy's admin API (host:port).
	AdminAddr string
	// StatusAddr is where draind serves /healthz/ready and the rest.
	StatusAddr string
	ProxyUID   uint32
	// ProxyPorts are extra local ports whose sockets are the proxy's.
	ProxyPorts []uint16
	// AppPorts, when set, must be listened on by the app for readiness.
	AppPorts []uint16
	// ExcludePorts are Envoy listeners that do not carry traffic (status,
	// metrics): their connections never hold the drain.
	ExcludePorts []uint16
	MinDrain     time.Duration
	Settle       time.Duration
	IdleTimeout  time.Duration
	// AppExit is AppExitWait or AppExitFlows.
	AppExit       string
	DrainDeadline time.Duration
	StopTimeout   time.Duration
	// Gateway drains all listeners and has no app to wait for.
	Gateway bool
	// Tracker is auto, ebpf or sockdiag; AppProcs is auto, ebpf, proc or
	// off (the socket approximation).
	Tracker  string
	AppProcs string
	// Command is the proxy's argv.
	Command []string
	Proxy   ProxyOptions
	Logger  *zap.Logger
}

// Defaults.
const (
	DefaultAdminAddr     = "127.0.0.1:15000"
	DefaultStatusAddr    = ":15020"
	DefaultMinDrain      = 5 * time.Second
	DefaultDrainDeadline = 25 * time.Second
	DefaultStopTimeout   = 2 * time.Second
)

// DefaultExcludePorts are Istio's status (15020, 15021) and Prometheus
// (15090) listeners.
var DefaultExcludePorts = []uint16{15020, 15021, 15090}

// DefaultConfig returns DESIGN.md's defaults.
func DefaultConfig() Config {
	return Config{
		AdminAddr:     DefaultAdminAddr,
		StatusAddr:    DefaultStatusAddr,
		ProxyUID:      1337,
		ExcludePorts:  DefaultExcludePorts,
		MinDrain:      DefaultMinDrain,
		AppExit:       AppExitWait,
		DrainDeadline: DefaultDrainDeadline,
		StopTimeout:   DefaultStopTimeout,
		Tracker:       "auto",
		AppProcs:      "auto",
	}
}

// ConfigError is a configuration problem found at start: one line naming
// the setting. The command line maps it to exit code 2.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func configErr(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// Validate checks the settings against each other.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := splitPort(c.AdminAddr); err != nil {
		errs = append(errs, configErr("--admin-addr %q: %v", c.AdminAddr, err))
	}
	if _, _, err := splitPort(c.StatusAddr); err != nil {
		errs = append(errs, configErr("--status-addr %q: %v", c.StatusAddr, err))
	}
	if c.DrainDeadline <= 0 {
		errs = append(errs, configErr("--drain-deadline must be positive"))
	}
	if c.DrainDeadline > 0 && c.DrainDeadline < c.MinDrain {
		errs = append(errs, configErr("--drain-deadline %s is shorter than --min-drain %s: the deadline would cut the endpoint propagation wait", c.DrainDeadline, c.MinDrain))
	}
	if c.StopTimeout <= 0 {
		errs = append(errs, configErr("--stop-timeout must be positive"))
	}
	switch c.AppExit {
	case AppExitWait, AppExitFlows:
	default:
		errs = append(errs, configErr("--app-exit %q: must be wait or flows", c.AppExit))
	}
	switch c.Tracker {
	case "auto", "ebpf", "sockdiag":
	default:
		errs = append(errs, configErr("--tracker %q: must be auto, ebpf or sockdiag", c.Tracker))
	}
	switch c.AppProcs {
	case "auto", "ebpf", "proc", "off":
	default:
		errs = append(errs, configErr("--app-procs %q: must be auto, ebpf, proc or off", c.AppProcs))
	}
	if len(c.Command) == 0 {
		errs = append(errs, configErr("no proxy command: draind run [flags] -- COMMAND [ARGS...]"))
	}
	if len(errs) > 0 {
		return errs[0] // one clear line: the first problem
	}
	return nil
}

// splitPort returns an address's host and port.
func splitPort(addr string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, errors.New("port is not a number 0-65535")
	}
	return host, uint16(n), nil
}
