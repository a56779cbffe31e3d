package agent

import (
	"cmp"
	"context"
	"net/netip"
	"strings"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/logevent"
)

// `draind run`'s configuration is resolved in one step, before anything
// is wired: [Resolve] takes the flags and their variables as internal/cli
// parsed them (a [Config]), the environment and the pod's annotations, and
// applies Istio's settings, the grace period and drain.Config.Reconcile.
// Run then wires what it returned.

// Resolved is `draind run`'s configuration once every setting is applied:
// all that Run wires, and what decided it, for the start-up lines.
type Resolved struct {
	// Config is the configuration the run uses: the proxy kind told, the
	// drain deadline and the ports as Istio's settings and the grace period
	// decide them, the deadlines reconciled.
	Config Config
	// Istio is Istio's settings as read (PROXY_CONFIG, the pod's
	// annotations); under pilot-agent its StatusPort is pilot-agent's.
	Istio istio.Settings
	// NodeIP is NodeIPEnv's address (zero: unset or not an address).
	NodeIP netip.Addr
	// ExitOnZero says Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS is true.
	ExitOnZero bool
	// Sources says which setting decided each value more than one can.
	Sources Sources

	// The start-up's warnings, one line each: Reconcile's, Istio's
	// settings', and the deadline against the grace period.
	reconciled    string
	istioWarnings []string
	graceWarning  string
}

// Sources names, for each value of a [Resolved] that more than one
// setting can give, the one that decided it: a flag ("--drain-deadline"),
// a variable ("DRAIND_GRACE_PERIOD", "TERMINATION_DRAIN_DURATION_SECONDS"),
// one of Istio's settings ("terminationDrainDuration (PROXY_CONFIG)"),
// "default", or what derived it (the grace period, the proxy command).
type Sources struct {
	// Deadline decided the drain deadline before Reconcile (the start-up
	// line's decided_by); Reconciled says when Reconcile then moved it.
	Deadline string
	// GracePeriod gave --grace-period ("unset": none).
	GracePeriod string
	// StatusAddr and AdminAddr placed draind's status server and Envoy's
	// admin API.
	StatusAddr, AdminAddr string
	// Proxy told the proxy kind.
	Proxy string
	// Reconciled names the values drain.Config.Reconcile changed to fit
	// the deadline (ReconciledDeadline and the others); none: it kept them.
	Reconciled []string
}

// Sources' words for what gave a value that no flag or variable named.
const (
	fromDefault        = "default"
	fromUnset          = "unset"
	fromAdminAddrGiven = "--admin-addr or DRAIND_ADMIN_ADDR"
	fromIstioAdminPort = "proxyAdminPort (Istio's ProxyConfig)"
	fromProxyGiven     = "--proxy or DRAIND_PROXY"
	fromProxyCommand   = "auto: the proxy command's name"
)

// The values Reconcile can change, as Sources.Reconciled names them.
const (
	ReconciledDeadline = "drain_deadline"
	ReconciledMinDrain = "min_drain"
	ReconciledCeiling  = "min_drain_ceiling"
	ReconciledFloor    = "min_drain_floor"
)

// NodeIPEnv is the node's address as the downward API gives it
// (status.hostIP): Istio's injected proxy has it, and so do deploy/'s
// manifests. The out-of-rotation rule counts connections from it as the
// node's.
const NodeIPEnv = "HOST_IP"

// Annotations is the pod's downward-API annotations file as read
// ([ReadAnnotations]): where Istio's per-pod settings are.
type Annotations struct {
	// Path names the file in errors.
	Path string
	// Data is its content (nil: no file); Err why it could not be read.
	Data []byte
	Err  error
}

// ReadAnnotations reads the annotations file at path ("":
// istio.PodAnnotations) as istio.Read does.
func ReadAnnotations(path string) Annotations {
	path = cmp.Or(path, istio.PodAnnotations)
	b, err := istio.ReadAnnotationsFile(context.Background(), "", path)
	return Annotations{Path: path, Data: b, Err: err}
}

func (a Annotations) read() ([]byte, error) { return a.Data, a.Err }

// Resolve is `draind run`'s configuration resolved: cfg as the flags and
// their variables gave it (and Validate accepted), then Istio's settings
// from env and ann, the grace period, and drain.Config.Reconcile. It is a
// pure function: env is the only environment it reads (nil: none), and
// the result's Config.LookupEnv is env. Errors are *ConfigError.
func Resolve(cfg Config, env func(string) (string, bool), ann Annotations) (Resolved, error) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	cfg.LookupEnv = env
	proxyFrom := fromProxyCommand
	if cfg.ProxyKind != istio.ProxyAuto {
		proxyFrom = cmp.Or(cfg.ProxySource, fromProxyGiven)
	}
	ist, err := cfg.applyIstio(env, ann)
	if err != nil {
		return Resolved{}, err
	}
	r := Resolved{Istio: ist.settings, ExitOnZero: ist.exitOnZero, istioWarnings: ist.warnings}
	r.Sources = Sources{Deadline: ist.deadlineFrom, GracePeriod: fromUnset, StatusAddr: ist.statusFrom, AdminAddr: ist.adminFrom, Proxy: proxyFrom}
	if cfg.GracePeriod > 0 {
		r.Sources.GracePeriod = cmp.Or(cfg.GracePeriodSource, "--grace-period")
	}
	// A change Reconcile makes without a word (the default ceiling cut to
	// a short deadline) applies too: the drain's start line then shows the
	// ceiling the gate deadline allows.
	if d, warn := cfg.Drain.Reconcile(cfg.DeadlineSet); d != cfg.Drain {
		for _, c := range []struct {
			name    string
			changed bool
		}{
			{ReconciledDeadline, d.Deadline != cfg.Drain.Deadline},
			{ReconciledMinDrain, d.MinDrain != cfg.Drain.MinDrain},
			{ReconciledCeiling, d.RotationCeiling != cfg.Drain.RotationCeiling},
			{ReconciledFloor, d.RotationFloor != cfg.Drain.RotationFloor},
		} {
			if c.changed {
				r.Sources.Reconciled = append(r.Sources.Reconciled, c.name)
			}
		}
		cfg.Drain, r.reconciled = d, warn
	}
	r.graceWarning = cfg.Drain.GraceWarning(cfg.GracePeriod)
	v, _ := env(NodeIPEnv)
	r.NodeIP, _ = netip.ParseAddr(strings.TrimSpace(v))
	r.Config = cfg
	return r, nil
}

// log says what the resolution decided: the warnings, the drain deadline
// with what decided each value (the start-up line), Istio's
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS, and under pilot-agent the ports.
func (r *Resolved) log(log *zap.Logger) {
	cfg := &r.Config
	if r.reconciled != "" {
		log.Warn("deadlines reconciled", logevent.DeadlinesReconciled.Field(), zap.String("detail", r.reconciled))
	}
	for _, w := range r.istioWarnings {
		log.Warn("Istio setting", logevent.IstioSetting.Field(), zap.String("detail", w))
	}
	src := r.Sources
	log.Info("drain deadline", logevent.DeadlineDecided.Field(), zap.Duration("deadline", cfg.Drain.Deadline), zap.String("decided_by", src.Deadline),
		zap.Strings("reconciled", src.Reconciled), zap.Duration("grace_period", cfg.GracePeriod), zap.String("grace_period_from", src.GracePeriod),
		zap.String("status_addr", cfg.StatusAddr), zap.String("status_addr_from", src.StatusAddr),
		zap.String("admin_addr", cfg.AdminAddr), zap.String("admin_addr_from", src.AdminAddr),
		zap.String("proxy", string(cfg.ProxyKind)), zap.String("proxy_from", src.Proxy))
	if r.ExitOnZero {
		// draind always waits for the drained connections and the app's work.
		log.Info("EXIT_ON_ZERO_ACTIVE_CONNECTIONS is subsumed", logevent.ExitOnZeroSubsumed.Field(), zap.String("env", istio.ExitOnZeroEnv), zap.Duration("min_drain", cfg.Drain.MinDrain), zap.Duration("deadline", cfg.Drain.Deadline))
	}
	if cfg.pilotAgent() {
		// It keeps its status port; draind signals its PID alone and
		// stops Envoy through Envoy's admin API.
		log.Info("proxy is pilot-agent", logevent.ProxyIsPilotAgent.Field(),
			zap.Uint16("pilot_agent_status_port", r.Istio.StatusPort), zap.String("status_port_from", cmp.Or(r.Istio.StatusPortFrom, fromDefault)),
			zap.String("status_addr", cfg.StatusAddr), zap.String("admin_addr", cfg.AdminAddr))
	}
	if r.graceWarning != "" {
		log.Warn("drain deadline past the grace period", logevent.GraceWarning.Field(), zap.String("detail", r.graceWarning))
	}
}
