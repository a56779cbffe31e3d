package drain

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config is what the machine is told. Defaults are in DefaultConfig.
type Config struct {
	// MinDrain is the wait after the drain starts, for endpoint removal to
	// propagate (--min-drain); interruptible.
	MinDrain time.Duration
	// MinDrainAuto replaces MinDrain by the adaptive wait (--min-drain
	// auto, the default): until the pod is out of rotation
	// (OutOfRotation), never before RotationFloor, never after
	// RotationCeiling.
	MinDrainAuto                   bool
	RotationFloor, RotationCeiling time.Duration
	// RotationCeilingSet is true when the ceiling was chosen
	// (--min-drain-ceiling), so Reconcile says when the deadline cuts it;
	// the default ceiling is cut to a shorter deadline without a word.
	RotationCeilingSet bool
	// Settle is how long the gate must stay open before the proxy stops.
	Settle time.Duration
	// IdleTimeout is the idle time after which a flow stops holding the
	// drain (0: off).
	IdleTimeout time.Duration
	// AppExit is the --app-exit policy; Gateway drains every listener and
	// waits for no app.
	AppExit AppExit
	Gateway bool
	// Deadline bounds the whole drain, the stop steps included, counted
	// from the trigger (--drain-deadline); a native sidecar's late stop
	// alone runs past it, to Grace (late_stop.go).
	Deadline time.Duration
	// Grace is the pod's grace period when known (--grace-period; 0:
	// the one the deadline implies, Deadline + GraceMargin): a native
	// sidecar's app may run to its end (late_stop.go).
	Grace time.Duration
	// StopTimeout is what the proxy gets after /quitquitquit, then after
	// SIGTERM, before SIGKILL.
	StopTimeout time.Duration
	// Prestop makes the machine `draind prestop`: no admin API, no proxy;
	// it drains at once and ends when the app's flows are done (and, with
	// WaitListeners, its listeners), or at the deadline.
	Prestop       bool
	WaitListeners bool
	// ExitWithApp ends the proxy when the app's work is done (Jobs): its
	// last process gone and its main process's exit qualifying
	// (AppCompletion). After a failure (any) or an exit whose code draind
	// could not read (either mode), a restart within AppRestartGrace (or
	// --settle, when longer) keeps the proxy; an exit 0 ends it at once.
	ExitWithApp     ExitWithApp
	AppRestartGrace time.Duration
	// AppStartTimeout is how long ExitWithApp waits for a first app
	// process when it has seen none since draind began watching: an app
	// that ran and left before draind could watch it is done then (its
	// exit code unknown). 0: no limit.
	AppStartTimeout time.Duration
	// ProxyExitStands keeps the proxy's own exit code when it leaves on its
	// own, 0 included: for a supervisor that decides it (Istio's
	// pilot-agent exits 0 after its own /quitquitquit, which Istio's Job
	// recipe calls). Without it a proxy that leaves on its own with 0
	// makes draind exit 1.
	ProxyExitStands bool
}

// ExitWithApp is the --exit-with-app policy.
type ExitWithApp string

// --exit-with-app values.
const (
	ExitWithAppOff ExitWithApp = "off"
	// ExitWithAppSuccess ends the proxy only after the app's main process
	// exited 0: a container restarted for a failure (OnFailure) keeps it.
	ExitWithAppSuccess ExitWithApp = "success"
	// ExitWithAppAny ends it after any exit.
	ExitWithAppAny ExitWithApp = "any"
)

// WatchesApp reports whether the policy ends the proxy on the app's
// completion, which draind then watches for while Ready.
func (e ExitWithApp) WatchesApp() bool { return e == ExitWithAppSuccess || e == ExitWithAppAny }

// DefaultAppRestartGrace is how long the app may be gone after a failure
// before --exit-with-app any ends the proxy: a crashed container the
// kubelet restarts at once is back well within it.
const DefaultAppRestartGrace = time.Second

// DefaultAppStartTimeout is how long --exit-with-app waits for an app it
// has never seen. An app container started beside draind that finishes
// within draind's start-up (a tenth of a second to seconds) is never seen;
// one whose image is still being pulled is not seen yet either, and the
// proxy must not leave before it. Two minutes covers most pulls; a Job
// that gates its app on `draind wait` never needs it.
const DefaultAppStartTimeout = 2 * time.Minute

// restartGrace is the wait before the app's completion ends the proxy.
func (c Config) restartGrace() time.Duration {
	return max(c.AppRestartGrace, c.Settle, 0)
}

// Defaults.
const (
	// DefaultMinDrain is the usual recipe's fixed wait (pilot-agent's,
	// `preStop: sleep 5`): a Config's fixed min-drain unless set, and the
	// longest quiet window of the default, auto (QuietCap).
	DefaultMinDrain    = 5 * time.Second
	DefaultDeadline    = 25 * time.Second
	DefaultStopTimeout = 2 * time.Second
	// KillWait is what the kernel gets to reap the proxy after SIGKILL.
	KillWait = 500 * time.Millisecond
	// GracePeriod is Kubernetes' default terminationGracePeriodSeconds: a
	// deadline that does not fit inside it draws a warning at start.
	GracePeriod = 30 * time.Second
	// GraceMargin is what a deadline derived from the pod's grace period
	// leaves of it (DeadlineForGrace): the default deadline's room inside
	// the default grace period, for the kubelet's own delays (it signals
	// the container a moment after the grace period starts) and draind's
	// exit.
	GraceMargin = GracePeriod - DefaultDeadline
)

// DeadlineForGrace is the drain deadline a pod's grace period allows
// (--grace-period): the grace period less GraceMargin.
func DeadlineForGrace(grace time.Duration) time.Duration { return grace - GraceMargin }

// DefaultConfig returns the defaults: the worst case, stop steps included,
// ends 25 s after SIGTERM, inside the default 30 s grace period with room
// for the kubelet's own delays.
func DefaultConfig() Config {
	return Config{
		MinDrain:        DefaultMinDrain,
		MinDrainAuto:    true,
		RotationFloor:   DefaultRotationFloor,
		RotationCeiling: DefaultRotationCeiling,
		AppExit:         AppExitWait,
		Deadline:        DefaultDeadline,
		StopTimeout:     DefaultStopTimeout,
		ExitWithApp:     ExitWithAppOff,
		AppRestartGrace: DefaultAppRestartGrace,
		AppStartTimeout: DefaultAppStartTimeout,
	}
}

// quitTimeout bounds the POST /quitquitquit call.
func (c Config) quitTimeout() time.Duration { return min(time.Second, c.StopTimeout) }

// StopReserve is the part of the deadline kept for the stop steps: the
// quit call, the wait after it, the wait after SIGTERM, and the kernel's
// part after SIGKILL. Prestop stops nothing.
func (c Config) StopReserve() time.Duration {
	if c.Prestop {
		return 0
	}
	return c.quitTimeout() + 2*c.StopTimeout + KillWait
}

// GateDeadline is when, after the trigger, the machine stops waiting and
// starts stopping the proxy: the deadline less the stop reserve.
func (c Config) GateDeadline() time.Duration { return c.Deadline - c.StopReserve() }

// ConfigError is a setting that cannot work: one line naming it. Callers
// map it to a usage error (exit 2).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// Validate checks the settings against each other. It never changes them:
// see Reconcile for the ones that can be mended.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return &ConfigError{Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Deadline <= 0:
		return bad("--drain-deadline must be positive")
	case c.StopTimeout <= 0 && !c.Prestop:
		return bad("--stop-timeout must be positive")
	case c.MinDrain < 0 || c.Settle < 0 || c.IdleTimeout < 0 || c.AppStartTimeout < 0:
		return bad("durations must not be negative")
	case c.MinDrainAuto && c.RotationFloor < 0:
		return bad("--min-drain-floor must not be negative")
	case c.MinDrainAuto && c.RotationCeiling <= 0:
		return bad("--min-drain-ceiling must be positive")
	case c.MinDrainAuto && c.RotationFloor > c.RotationCeiling:
		return bad("--min-drain-floor %s is longer than --min-drain-ceiling %s", c.RotationFloor, c.RotationCeiling)
	case c.GateDeadline() <= 0:
		return bad("--drain-deadline %s leaves no time to drain: the stop steps alone take up to %s (quit call, 2 × --stop-timeout %s, %s after SIGKILL)",
			c.Deadline, c.StopReserve(), c.StopTimeout, KillWait)
	}
	if !slices.Contains(AppExits, c.AppExit) {
		return bad("--app-exit %q: must be %s", c.AppExit, oneOf(AppExits))
	}
	if c.ExitWithApp != "" && !slices.Contains(ExitWithApps, c.ExitWithApp) {
		return bad("--exit-with-app %q: must be %s", c.ExitWithApp, oneOf(ExitWithApps))
	}
	return nil
}

// oneOf names a list of words for an error: "a, b or c".
func oneOf[T ~string](ws []T) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = string(w)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Reconcile mends a min-drain that does not fit before the deadline, as an
// operator would expect (Istio accepts MINIMUM_DRAIN_DURATION=30s, so draind
// must not crash-loop on it): a deadline left at its default grows to fit
// the min-drain; a deadline set explicitly wins, and the min-drain is cut
// to fit. It returns the mended config and, when it changed anything, one
// line for a warning.
func (c Config) Reconcile(deadlineSet bool) (Config, string) {
	if c.MinDrainAuto {
		return c.reconcileCeiling(deadlineSet)
	}
	if c.MinDrain <= c.GateDeadline() {
		return c, ""
	}
	if !deadlineSet {
		old := c.Deadline
		c.Deadline = c.MinDrain + c.StopReserve()
		return c, fmt.Sprintf("--min-drain %s does not fit in the default --drain-deadline %s: the deadline is raised to %s (min-drain + %s of stop steps)",
			c.MinDrain, old, c.Deadline, c.StopReserve())
	}
	old := c.MinDrain
	c.MinDrain = c.GateDeadline()
	return c, fmt.Sprintf("--min-drain %s does not fit in --drain-deadline %s (less %s of stop steps): min-drain is cut to %s",
		old, c.Deadline, c.StopReserve(), c.MinDrain)
}

// reconcileCeiling is Reconcile for --min-drain auto: the ceiling is
// bounded by the deadline as a fixed min-drain is (the floor with it). The
// default ceiling never raises a deadline: a pod whose grace period is
// short gets a shorter ceiling, which the drain's start line shows.
func (c Config) reconcileCeiling(deadlineSet bool) (Config, string) {
	if c.RotationCeiling <= c.GateDeadline() {
		return c, ""
	}
	if !c.RotationCeilingSet {
		c.RotationCeiling = c.GateDeadline()
		c.RotationFloor = min(c.RotationFloor, c.RotationCeiling)
		return c, ""
	}
	if !deadlineSet {
		old := c.Deadline
		c.Deadline = c.RotationCeiling + c.StopReserve()
		return c, fmt.Sprintf("--min-drain-ceiling %s does not fit in the default --drain-deadline %s: the deadline is raised to %s (ceiling + %s of stop steps)",
			c.RotationCeiling, old, c.Deadline, c.StopReserve())
	}
	old := c.RotationCeiling
	c.RotationCeiling = c.GateDeadline()
	c.RotationFloor = min(c.RotationFloor, c.RotationCeiling)
	return c, fmt.Sprintf("--min-drain-ceiling %s does not fit in --drain-deadline %s (less %s of stop steps): the ceiling is cut to %s",
		old, c.Deadline, c.StopReserve(), c.RotationCeiling)
}

// GraceWarning is one line when the worst case does not fit inside the
// pod's grace period (grace; 0: unknown, Kubernetes' default), else "".
func (c Config) GraceWarning(grace time.Duration) string {
	if c.Prestop {
		return ""
	}
	if grace > 0 {
		if c.Deadline <= grace {
			return ""
		}
		return fmt.Sprintf("--drain-deadline %s is longer than the pod's grace period (%s, --grace-period): the kubelet kills the proxy mid-drain; leave --drain-deadline unset to derive it (%s)",
			c.Deadline, grace, DeadlineForGrace(grace))
	}
	if c.Deadline <= GracePeriod {
		return ""
	}
	return fmt.Sprintf("--drain-deadline %s is longer than Kubernetes' default grace period (%s): set the pod's terminationGracePeriodSeconds to at least %d, or the kubelet kills the proxy mid-drain",
		c.Deadline, GracePeriod, int((c.Deadline+time.Second-1)/time.Second)+2)
}
