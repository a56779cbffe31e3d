package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/kubeevents"
	"github.com/draind/draind/internal/privs"
	"github.com/draind/draind/internal/probes"
)

// istioAliases are Istio's variables honoured where they mean the same,
// with Istio's syntax (README.md, "Configuration"): flag name → variable.
// A flag beats its DRAIND_ twin, which beats Istio's variable.
var istioAliases = map[string]envAlias{
	// A Go duration ("5s"), as pilot-agent reads it (a ProxyConfig
	// proxyMetadata entry reaches the container as this variable).
	"min-drain": {name: "MINIMUM_DRAIN_DURATION"},
	// Whole seconds ("45"): Istio removed it in 1.10 for ProxyConfig
	// terminationDrainDuration (agent.Config.resolveIstio reads that from
	// PROXY_CONFIG); kept as a deprecated alias, with a warning.
	"drain-deadline": {name: istio.TerminationDrainEnv, convert: wholeSeconds},
}

// gracePeriodFlag is --grace-period: whole seconds, as a pod spec states
// terminationGracePeriodSeconds (and an injection template copies it), or
// a duration.
type gracePeriodFlag struct{ d *time.Duration }

func (f gracePeriodFlag) String() string {
	if f.d == nil || *f.d == 0 {
		return ""
	}
	return f.d.String()
}

func (f gracePeriodFlag) Set(v string) error {
	d, err := time.ParseDuration(v)
	if n, nerr := strconv.ParseUint(v, 10, 31); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	if err != nil {
		return fmt.Errorf("%q is neither whole seconds nor a duration (e.g. 60 or 60s)", v)
	}
	if d <= 0 {
		return fmt.Errorf("%q: a grace period must be positive", v)
	}
	*f.d = d
	return nil
}

// wholeSeconds reads an integer number of seconds.
func wholeSeconds(v string) (string, error) {
	n, err := strconv.ParseUint(v, 10, 31)
	if err != nil {
		return "", fmt.Errorf("%q is not a whole number of seconds", v)
	}
	return strconv.FormatUint(n, 10) + "s", nil
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, logFormat, err := runConfig(args, stdout)
	if err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	log, err := newLogger(logFormat, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	cfg.Logger = log
	res, err := agent.Run(ctx, cfg)
	if err != nil {
		var ce *agent.ConfigError
		if errors.As(err, &ce) {
			return usageErr("run: %v", err)
		}
		return fmt.Errorf("run: %w", err)
	}
	if res.ExitCode != 0 {
		return &exitError{code: res.ExitCode, err: errors.New(res.Reason)}
	}
	return nil
}

// runConfig reads `draind run`'s flags and variables (errHelp after -h).
func runConfig(args []string, stdout io.Writer) (agent.Config, logFormat, error) {
	cfg := agent.DefaultConfig()
	fs := newFlagSet("run", "run [flags] -- COMMAND [ARGS...]", stdout)
	for name, a := range istioAliases {
		fs.alias(name, a)
	}
	fs.StringVar(&cfg.AdminAddr, "admin-addr", cfg.AdminAddr, "Envoy's admin API address")
	fs.StringVar(&cfg.StatusAddr, "status-addr", cfg.StatusAddr, "address of draind's status server (/healthz/ready, /metrics); under pilot-agent: the first free port from 15022 Istio does not use")
	proxyKind := newOneOf(istio.ProxyAuto, istio.ProxyKinds)
	fs.Var(proxyKind, "proxy", "what the proxy command is: envoy, or Istio's pilot-agent (auto: pilot-agent when the command is named so)")
	var nf nsFlags
	nf.register(fs, false)
	appPorts := portList{}
	fs.Var(&appPorts, "app-ports", "ports the app must listen on before the pod is ready (comma-separated)")
	probePorts := portList{}
	fs.Var(&probePorts, "probe-ports", "the app's ports that only the kubelet's probes reach (comma-separated): never counted as traffic by --min-drain auto (draind's status port and the control ports never are)")
	var excludeNames nameList
	fs.Var(&excludeNames, "exclude-listeners", "Envoy listeners that carry no traffic, by name: a listener's name or its stat_prefix (comma-separated); mapped to their ports once Envoy is LIVE")
	d := &cfg.Drain
	fs.Var(minDrainFlag{&d.MinDrain, &d.MinDrainAuto}, "min-drain", "auto (the default): wait after draining starts until the pod is out of rotation, no new connection for a quiet window sized from its own rate; a duration: wait that long (endpoint propagation)")
	fs.durationVar(&d.RotationFloor, "min-drain-floor", d.RotationFloor, "with --min-drain auto: never out of rotation before this long after the trigger")
	fs.durationVar(&d.RotationCeiling, "min-drain-ceiling", d.RotationCeiling, "with --min-drain auto: always out of rotation this long after the trigger (bounded by --drain-deadline)")
	fs.durationVar(&d.Settle, "settle", 0, "the gate must stay open this long before the proxy is stopped")
	appExit := newOneOf(d.AppExit, drain.AppExits)
	fs.Var(appExit, "app-exit", "when the app is done: "+appExit.choices()+" (wait: for its processes, else its sockets; flows: for its flows)")
	fs.durationVar(&d.Deadline, "drain-deadline", d.Deadline, "the whole drain, stop steps included, ends this long after it began (unset: derived from --grace-period when given)")
	fs.Var(gracePeriodFlag{&cfg.GracePeriod}, "grace-period", fmt.Sprintf("the pod's terminationGracePeriodSeconds (whole seconds, as the pod spec has it, or a duration): the drain deadline is derived from it (less %s) unless --drain-deadline is given", drain.GraceMargin))
	fs.durationVar(&d.StopTimeout, "stop-timeout", d.StopTimeout, "time the proxy gets after /quitquitquit, then after SIGTERM, before SIGKILL")
	fs.BoolVar(&d.Gateway, "gateway", false, "drain every listener, and wait for no app")
	fs.durationVar(&cfg.DrainBeginWait, "drain-begin-wait", cfg.DrainBeginWait, "how long the app's out-of-rotation wait (its preStop) waits for a drain that has not begun: past it the pod is taken as not leaving rotation (the app alone restarted); a native sidecar's drain begins with its own preStop, an exec the runtime can start seconds late on a busy node")
	fs.BoolVar(&cfg.CloseIdleKeepalives, "close-idle-keepalives", cfg.CloseIdleKeepalives, "as the min-drain ends (the pod out of rotation), before the app's out-of-rotation wait returns: close (FIN) Envoy's downstream connections idle since before its drain began, whose clients no response told to go (their next request could reach an app that stopped accepting: a 503); =false leaves them to Envoy, which tells a client to go only with a response")
	tracker := trackerFlag(fs)
	exitWithApp := newOneOf(drain.ExitWithAppOff, drain.ExitWithApps)
	exitWithApp.alias = map[string]drain.ExitWithApp{"true": drain.ExitWithAppSuccess, "false": drain.ExitWithAppOff}
	fs.Var(exitWithApp, "exit-with-app", "end the proxy when the app's work is done (Jobs): off | success (its main process exited 0) | any (given alone or true: success)")
	fs.optionalValue("exit-with-app", string(drain.ExitWithAppSuccess))
	fs.durationVar(&d.AppRestartGrace, "app-restart-grace", d.AppRestartGrace, "with --exit-with-app: an app back within this long (a restarted container) keeps the proxy")
	fs.durationVar(&d.AppStartTimeout, "app-start-timeout", d.AppStartTimeout, "with --exit-with-app: with no app process seen for this long since draind began watching, the app is taken as done before draind watched (exit code unknown: exit 0); 0: wait for it without limit")
	hostNet := newOneOf(agent.HostNetworkAuto, agent.HostNetworks)
	fs.Var(hostNet, "host-network", "the pod shares the node's network namespace (hostNetwork): "+hostNet.choices())
	procs := newOneOf(appprocs.ModeAuto, appprocs.Modes)
	fs.Var(procs, "app-procs", "how the app's processes are followed: "+procs.choices()+" (off: by its sockets)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "a cgroup v2 mount of the node's /sys/fs/cgroup (a read-only hostPath): while draining, follow the pod's sockets from its own cgroup, which costs other pods nothing, rather than from the node-wide tracepoint (eBPF; needs CAP_NET_ADMIN at start)")
	events := newOneOf(agent.EventsAuto, agent.EventsModes)
	fs.Var(events, "events", "Kubernetes Events on draind's pod at the drain's start and end: "+events.choices()+" (auto: when in a cluster whose service account may create events; the pod from "+
		strings.Join([]string{kubeevents.PodNameEnv, kubeevents.PodNamespaceEnv, kubeevents.PodUIDEnv, kubeevents.NodeNameEnv}, ", ")+")")
	logFormat := logFormatFlag(fs)
	fs.IntVar(&cfg.RingSize, "debug-ring-size", 0, fmt.Sprintf("debugging: the eBPF ring buffer of TCP state events, in bytes (a power of two; 0: %d KiB)", probes.DefaultTCPRingSize>>10))
	fs.IntVar(&cfg.ProcRingSize, "debug-proc-ring-size", 0, "debugging: the eBPF ring buffer of the app's process events, in bytes (a power of two; 0: the default)")
	fs.Func("proxy-caps", "capabilities the proxy gets, and no other (ambient), e.g. NET_ADMIN for TPROXY; draind must hold them", func(v string) error { // privs
		var err error
		cfg.Proxy.Caps, err = privs.ParseSet(v)
		return err
	})
	runAs := fs.Int("run-proxy-as", -1, "start the proxy under this uid (and gid), when draind runs as root (-1: draind's own)")
	if err := fs.parse(args); err != nil {
		return cfg, "", err
	}
	if err := nf.validate("run"); err != nil {
		return cfg, "", err
	}
	if *runAs >= 0 {
		if os.Geteuid() != 0 {
			return cfg, "", usageErr("run: --run-proxy-as needs draind to run as root")
		}
		cfg.Proxy.Credential = &syscall.Credential{Uid: uint32(*runAs), Gid: uint32(*runAs)}
	}
	cfg.ProxyUID = uint32(nf.proxyUID)
	cfg.ProxyPorts = nf.proxyPorts
	d.IdleTimeout = nf.idleTimeout
	d.AppExit = appExit.val
	cfg.DeadlineSet = fs.isSet("drain-deadline")
	d.RotationCeilingSet = fs.isSet("min-drain-ceiling")
	cfg.DeadlineSource = fs.sourceOf("drain-deadline")
	cfg.GracePeriodSource = fs.sourceOf("grace-period")
	cfg.StatusAddrSet, cfg.AdminAddrSet = fs.isSet("status-addr"), fs.isSet("admin-addr")
	cfg.StatusAddrSource = fs.sourceOf("status-addr")
	cfg.AdminAddrSource, cfg.ProxySource = fs.sourceOf("admin-addr"), fs.sourceOf("proxy")
	cfg.ProxyKind = proxyKind.val
	cfg.AppPorts = appPorts
	cfg.ProbePorts = probePorts
	cfg.ExcludePorts = nf.exclude
	cfg.ExcludeListeners = excludeNames
	cfg.Tracker = tracker.val
	cfg.AppProcs = procs.val
	cfg.HostNetwork = hostNet.val
	cfg.Events = events.val
	d.ExitWithApp = exitWithApp.val
	cfg.Command = fs.Args()
	cfg.Proxy.ReapAll = os.Getpid() == 1
	return cfg, logFormat.val, nil
}

// nameList is a comma-separated list of listener names, as Envoy's stat
// names have them: no spaces, quotes or control characters.
type nameList []string

func (n *nameList) String() string { return strings.Join(*n, ",") }

func (n *nameList) Set(v string) error {
	*n = (*n)[:0]
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.ContainsFunc(f, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '"' }) {
			return fmt.Errorf("%q is not a listener name (no spaces, quotes or control characters)", f)
		}
		*n = append(*n, f)
	}
	return nil
}

// newLogger builds the zap logger: JSON lines by default, or console.
func newLogger(format logFormat, w io.Writer) (*zap.Logger, error) {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeDuration = zapcore.StringDurationEncoder
	var e zapcore.Encoder
	if format == logConsole {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		e = zapcore.NewConsoleEncoder(enc)
	} else {
		e = zapcore.NewJSONEncoder(enc)
	}
	return zap.New(zapcore.NewCore(e, zapcore.AddSync(w), zap.InfoLevel)), nil
}
