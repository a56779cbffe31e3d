package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
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
	// StatusAddrSource, AdminAddrSource and ProxySource name the
	// setting that gave each ("": the flag, or no flag or variable).
	AdminAddrSet, StatusAddrSet bool
	StatusAddrSource            string
	AdminAddrSource             string
	ProxySource                 string
	// ProxyKind is what the proxy command is: istio.ProxyEnvoy,
	// istio.ProxyPilotAgent (Istio's agent, which runs Envoy), or
	// istio.ProxyAuto (pilot-agent when the command's file name is
	// pilot-agent).
	ProxyKind istio.ProxyKind
	// DeadlineSource names the setting that gave Drain.Deadline when
	// DeadlineSet (--drain-deadline, or the variable that set it).
	DeadlineSource string
	// GracePeriod is the pod's terminationGracePeriodSeconds as its
	// manifest or injection template states it (--grace-period; 0: not
	// given), and GracePeriodSource the setting that gave it. Unless the
	// deadline is given, it is derived from it (drain.DeadlineForGrace).
	// A grace period shortened at deletion (kubectl delete
	// --grace-period) is not seen: only the API tells it.
	GracePeriod       time.Duration
	GracePeriodSource string
	// LookupEnv reads Istio's variables (nil: os.LookupEnv);
	// IstioAnnotations is the pod's downward-API annotations file (""
	// : istio.PodAnnotations).
	LookupEnv        func(string) (string, bool)
	IstioAnnotations string
	// ProxyUID owns the proxy's sockets and processes (--proxy-uid).
	ProxyUID uint32
	// ProxyPorts are extra local ports whose sockets are the proxy's.
	ProxyPorts []uint16
	// AppPorts, when set, must be listened on by the app for readiness.
	AppPorts []uint16
	// ProbePorts are the app's ports that only the kubelet's probes reach
	// (--probe-ports): their connections are never counted as traffic by
	// the out-of-rotation rule. The status server's and the control ports
	// are probe ports without being listed.
	ProbePorts []uint16
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
	// Tracker is how sockets are followed; AppProcs how the app's
	// processes are (off: the socket approximation).
	Tracker  flows.TrackerMode
	AppProcs appprocs.Mode
	// RingSize is the eBPF ring buffer of TCP state events, in bytes (0:
	// the default). A debugging knob: a tiny ring forces losses and resyncs.
	RingSize int
	// ProcRingSize is the same for the app's process events.
	ProcRingSize int
	// CgroupRoot is a cgroup v2 mount of the node's hierarchy
	// (--cgroup-root): draind finds the pod's cgroup there and, while it
	// drains, follows the pod's sockets from a program on that cgroup
	// rather than the node-wide tracepoint ("": the tracepoint).
	CgroupRoot string
	// HostNetwork says whether the pod shares the node's network
	// namespace (auto: told by the kernel where it can be).
	HostNetwork HostNetwork
	// Events says whether draind posts Kubernetes Events on its pod at
	// the drain's start and end (--events): auto when in a cluster whose
	// API server lets the pod's service account, off never ("": auto).
	Events EventsMode
	// CloseIdleKeepalives says whether, as the min-drain ends, to close
	// Envoy's downstream keep-alives idle since before its drain began
	// (drain.Untold; --close-idle-keepalives, on by default: a client sees
	// the FIN before its next request and dials again, where without it
	// that request meets an app that stopped accepting; docs/benchmarks.md,
	// make bench-keepalive).
	CloseIdleKeepalives bool
	// DrainBeginWait is how long the app's out-of-rotation wait waits for a
	// drain that has not begun (--drain-begin-wait;
	// drain.DefaultDrainBeginWait).
	DrainBeginWait time.Duration
	// ServiceAccountDir holds the service account's token, ca.crt and
	// namespace ("": kubeevents.ServiceAccountDir, where the kubelet
	// mounts them).
	ServiceAccountDir string
	// Command is the proxy's argv.
	Command []string
	Proxy   proxy.Options
	Logger  *zap.Logger
}

// HostNetwork is --host-network.
type HostNetwork string

// --host-network's values.
const (
	HostNetworkAuto  HostNetwork = "auto"
	HostNetworkTrue  HostNetwork = "true"
	HostNetworkFalse HostNetwork = "false"
)

// HostNetworks are the values --host-network accepts, validation checks
// and errors name.
var HostNetworks = []HostNetwork{HostNetworkAuto, HostNetworkTrue, HostNetworkFalse}

// EventsMode is --events.
type EventsMode string

// --events' values.
const (
	EventsAuto EventsMode = "auto"
	EventsOff  EventsMode = "off"
)

// EventsModes are the values --events accepts, validation checks and
// errors name.
var EventsModes = []EventsMode{EventsAuto, EventsOff}

// Defaults. The proxy's uid is flows.DefaultProxyUID, the listeners that
// carry no traffic envoy.DefaultExclude's ports.
const (
	DefaultAdminAddr  = "127.0.0.1:15000"
	DefaultStatusAddr = istio.DefaultStatusAddr
)

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		AdminAddr:    DefaultAdminAddr,
		StatusAddr:   DefaultStatusAddr,
		ProxyKind:    istio.ProxyAuto,
		ProxyUID:     flows.DefaultProxyUID,
		ExcludePorts: envoy.DefaultExclude().Ports,
		Drain:        drain.DefaultConfig(),
		Tracker:      flows.ModeAuto,
		AppProcs:     appprocs.ModeAuto,
		HostNetwork:  HostNetworkAuto,
		Events:       EventsAuto,

		DrainBeginWait:      drain.DefaultDrainBeginWait,
		CloseIdleKeepalives: true,
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
	if _, _, err := SplitHostPort(c.AdminAddr); err != nil {
		return configErr("--admin-addr %q: %v", c.AdminAddr, err)
	}
	if _, _, err := SplitHostPort(c.StatusAddr); err != nil {
		return configErr("--status-addr %q: %v", c.StatusAddr, err)
	}
	if err := c.Drain.Validate(); err != nil {
		return err
	}
	if c.DrainBeginWait <= 0 {
		return configErr("--drain-begin-wait %s: must be positive (how long the app's out-of-rotation wait waits for the drain to begin)", c.DrainBeginWait)
	}
	if err := mustBeOneOf("--proxy", c.ProxyKind, istio.ProxyKinds); err != nil {
		return err
	}
	if err := mustBeOneOf("--tracker", c.Tracker, flows.TrackerModes); err != nil {
		return err
	}
	if err := mustBeOneOf("--app-procs", c.AppProcs, appprocs.Modes); err != nil {
		return err
	}
	if err := mustBeOneOf("--host-network", c.HostNetwork, HostNetworks); err != nil {
		return err
	}
	if c.Events != "" {
		if err := mustBeOneOf("--events", c.Events, EventsModes); err != nil {
			return err
		}
	}
	if c.CgroupRoot != "" && c.Tracker == flows.ModeSockDiag {
		return configErr("--cgroup-root %s: scopes the eBPF tracker to the pod's cgroup, and --tracker %s polls instead", c.CgroupRoot, c.Tracker)
	}
	if err := ringSizeOK("--debug-ring-size", c.RingSize); err != nil {
		return err
	}
	if err := ringSizeOK("--debug-proc-ring-size", c.ProcRingSize); err != nil {
		return err
	}
	if len(c.Command) == 0 {
		return configErr("no proxy command: draind run [flags] -- COMMAND [ARGS...]")
	}
	return nil
}

// ringSizeOK refuses at start a ring buffer size the kernel would refuse
// when the probe loads (a BPF ring buffer is a power of two and a multiple
// of the page size), where draind would fall back to sockets at run time
// instead. 0 is the default.
func ringSizeOK(flag string, n int) error {
	page := os.Getpagesize()
	if n == 0 || n > 0 && n&(n-1) == 0 && n%page == 0 {
		return nil
	}
	return configErr("%s %d: must be 0 (the default) or a power of two of at least the page size (%d bytes)", flag, n, page)
}

// mustBeOneOf is a configuration error naming flag when v is not in its list.
func mustBeOneOf[T ~string](flag string, v T, list []T) error {
	if slices.Contains(list, v) {
		return nil
	}
	return configErr("%s %q: must be one of %s", flag, v, flows.Words(list, "|"))
}

// SplitHostPort returns an address's host and port: the one reading of
// --admin-addr and --status-addr, for run and for the commands that look
// into a pod. Its errors do not repeat the address (the caller quotes it):
// they stay one line.
func SplitHostPort(addr string) (string, uint16, error) {
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

// istioResolved is what applyIstio decided, for the log.
type istioResolved struct {
	settings istio.Settings
	// deadlineFrom names the setting that decided the drain deadline;
	// statusFrom and adminFrom those that decided StatusAddr and
	// AdminAddr (Sources).
	deadlineFrom, statusFrom, adminFrom string
	// warnings are one line each.
	warnings []string
	// exitOnZero is true when EXIT_ON_ZERO_ACTIVE_CONNECTIONS was set.
	exitOnZero bool
}

// pilotAgent says the proxy command is pilot-agent (after applyIstio).
func (c *Config) pilotAgent() bool { return c.ProxyKind == istio.ProxyPilotAgent }

// lookupEnv reads a variable through LookupEnv (os.LookupEnv when nil).
func (c *Config) lookupEnv(key string) (string, bool) {
	if c.LookupEnv != nil {
		return c.LookupEnv(key)
	}
	return os.LookupEnv(key)
}

// resolveIstio is applyIstio on the environment and the annotations file
// c names (LookupEnv, IstioAnnotations), the file read here.
func (c *Config) resolveIstio() (istioResolved, error) {
	return c.applyIstio(c.lookupEnv, ReadAnnotations(c.IstioAnnotations))
}

// applyIstio applies Istio's settings (README.md, "Istio"), read from
// the environment lookup and the pod's annotations ann: it tells the
// proxy kind, takes the drain deadline from ProxyConfig
// terminationDrainDuration when no draind setting gave one and it is
// longer (a pod sized for a long drain; a shorter one never cuts draind's
// default), and, under pilot-agent, leaves pilot-agent its status port and
// Envoy's admin port as ProxyConfig says, signals pilot-agent alone, and
// puts draind's status server where no Istio port is. It reads no file and
// no variable of its own. Errors are configuration errors.
func (c *Config) applyIstio(lookup func(string) (string, bool), ann Annotations) (istioResolved, error) {
	var r istioResolved
	c.ProxyKind = c.ProxyKind.Of(c.Command)
	var err error
	if r.settings, err = istio.ReadFrom(lookup, ann.Path, ann.read); err != nil {
		return r, configErr("%v", err)
	}
	ist := r.settings
	switch {
	case c.DeadlineSet:
		r.deadlineFrom = c.DeadlineSource
		if c.DeadlineSource == istio.TerminationDrainEnv {
			r.warnings = append(r.warnings, istio.TerminationDrainEnv+" is deprecated (Istio removed it in 1.10): set ProxyConfig terminationDrainDuration (proxy.istio.io/config) or DRAIND_DRAIN_DEADLINE")
		}
	case c.GracePeriod > 0:
		c.Drain.Deadline, c.DeadlineSet = drain.DeadlineForGrace(c.GracePeriod), true
		r.deadlineFrom = fmt.Sprintf("the pod's grace period %s (%s) less %s", c.GracePeriod, c.GracePeriodSource, drain.GraceMargin)
		if ist.TerminationDrainFrom != "" {
			r.deadlineFrom += fmt.Sprintf("; terminationDrainDuration %s (%s) is not used: the grace period bounds the drain", ist.TerminationDrain, ist.TerminationDrainFrom)
		}
		if c.Drain.GateDeadline() <= 0 {
			return r, configErr("--grace-period %s leaves no time to drain: the deadline it allows (%s, the grace period less %s) must be longer than the stop steps' %s",
				c.GracePeriod, c.Drain.Deadline, drain.GraceMargin, c.Drain.StopReserve())
		}
	case ist.TerminationDrainFrom != "" && ist.TerminationDrain > c.Drain.Deadline:
		c.Drain.Deadline, c.DeadlineSet = ist.TerminationDrain, true
		r.deadlineFrom = "terminationDrainDuration (" + ist.TerminationDrainFrom + ")"
	case ist.TerminationDrainFrom != "":
		r.deadlineFrom = fmt.Sprintf("default: terminationDrainDuration %s (%s) is not longer, and never shortens the drain", ist.TerminationDrain, ist.TerminationDrainFrom)
	default:
		r.deadlineFrom = fromDefault
	}
	c.Drain.Grace = c.GracePeriod
	if v, ok := lookup(istio.ExitOnZeroEnv); ok {
		r.exitOnZero, _ = strconv.ParseBool(v) // as Istio reads it; a bad value is Istio's to refuse
	}
	status := istio.StatusAddrOf(c.statusInput(ist))
	c.StatusAddr, r.statusFrom = status.Addr, status.From
	r.adminFrom = fromDefault
	if c.AdminAddrSet {
		r.adminFrom = cmp.Or(c.AdminAddrSource, fromAdminAddrGiven)
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
		r.adminFrom = fromIstioAdminPort
	}
	if _, p, err := SplitHostPort(c.StatusAddr); c.StatusAddrSet && err == nil && p == ist.StatusPort {
		return r, configErr("--status-addr %s: port %d is pilot-agent's status port (ProxyConfig statusPort%s): it serves Istio's readiness and the app probes Istio rewrote; leave --status-addr unset (draind then takes %d) or pick another",
			c.StatusAddr, p, fromSuffix(ist.StatusPortFrom), ist.FreePort())
	}
	if !slices.Contains(c.ExcludePorts, ist.StatusPort) {
		c.ExcludePorts = append(slices.Clone(c.ExcludePorts), ist.StatusPort)
	}
	return r, nil
}

// statusInput is what decides draind's status address
// (istio.StatusAddrOf), with Istio's settings ist.
func (c *Config) statusInput(ist istio.Settings) istio.StatusInput {
	in := istio.StatusInput{PilotAgent: c.pilotAgent(), Settings: ist}
	if c.StatusAddrSet {
		in.Given, in.GivenBy = c.StatusAddr, c.StatusAddrSource
	}
	return in
}

func fromSuffix(from string) string {
	if from == "" {
		return ", default"
	}
	return ", from " + from
}
