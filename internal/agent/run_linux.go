package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/btf"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/kubeevents"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/podcgroup"
	"github.com/draind/draind/internal/privs"
	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/proxy"
)

// Result is how a run ended (drain.Result: exit code and reason).
type Result = drain.Result

// agent is one `draind run`: the parts, built by Run, and what the status
// server and the metrics read.
type agent struct {
	cfg     Config
	log     *zap.Logger
	ns      *namespace.Net
	tracker *flows.Tracker
	procs   appprocs.Source // nil: not followed
	admin   adminView
	// probeAdmin answers readiness (no retries).
	probeAdmin adminView
	proxy      *proxy.Process
	machine    *drain.Machine
	metrics    *metrics
	// hostNet is true when the pod shares the node's network namespace.
	hostNet bool
	// cgroups holds the pod's cgroup and draind's own under --cgroup-root
	// (nil without it).
	cgroups *podcgroup.Found
	exits   *earlyExits // nil: not recording (openEarlyExits)
	// pilotAgent asks pilot-agent's readiness (nil: the proxy is Envoy).
	pilotAgent *istio.Readiness
	// early holds drain requests before the machine is built; the status
	// server reads the fields above only once it is attached.
	early earlyControls
}

// Run is `draind run`: it starts the proxy, serves the status endpoints and
// drains on SIGTERM/SIGINT or POST /drain, until the proxy is stopped.
// Cancelling ctx stops the proxy at once (no drain). Errors are start-up
// failures; a *ConfigError is the operator's to fix.
func Run(ctx context.Context, cfg Config) (Result, error) {
	begun := time.Now()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	// A binary that cannot drop its capabilities refuses first, as its
	// one line (raisePrivileges logs the opt-out).
	if _, err := capsUnsupported(privs.Supported(), cfg.lookupEnv); err != nil {
		return Result{}, err
	}
	r, err := Resolve(cfg, cfg.lookupEnv, ReadAnnotations(cfg.IstioAnnotations))
	if err != nil {
		return Result{}, err
	}
	return run(ctx, r, begun)
}

// run wires the parts of a resolved configuration and runs the drain
// machine (Run; begun: when Run began).
func run(ctx context.Context, r Resolved, begun time.Time) (res Result, err error) {
	cfg := r.Config
	log := cmp.Or(cfg.Logger, zap.NewNop())
	r.log(log)
	a := &agent{cfg: cfg, log: log}
	if os.Getenv("GOGC") == "" {
		// The heap is mostly the flow table, which makes no garbage once
		// built: a collection at 50 % growth instead of 100 % costs little
		// CPU and keeps a 100k-flow pod's RSS under 40 MB
		// (docs/benchmarks.md). GOGC in the environment wins.
		debug.SetGCPercent(defaultGCPercent)
	}

	// Signals first: a SIGTERM during start-up must drain, not kill us.
	// SIGHUP and SIGQUIT are caught too: by Go's default either ends
	// draind at once (PID 1: the container with it), without a drain
	// and, for SIGHUP, without a word (signalAction says what each does).
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, drainSignals...)
	signal.Notify(sigc, ignoredSignals...)
	defer signal.Stop(sigc)

	var closers []func() error
	defer func() {
		var errs []error
		for _, c := range slices.Backward(closers) {
			errs = append(errs, c())
		}
		if cerr := errors.Join(errs...); cerr != nil && err == nil {
			log.Warn("cleanup", logevent.CleanupFailed.Field(), zap.Error(cerr))
		}
	}()

	// privs: permitted capabilities made effective (file caps +p); a
	// binary that cannot drop them refuses to start, unless told.
	if err := a.raisePrivileges(); err != nil {
		return Result{}, err
	}
	// Under --exit-with-app, the app's exits from here on: an app that
	// ends before the process source is live still ends the proxy by its
	// own exit code. Closed once that source has taken what it holds
	// (openAppProcs), or at the end on an earlier return.
	a.exits = a.openEarlyExits()
	closers = append(closers, func() error { return a.exits.Close() })

	ln, err := net.Listen("tcp", cfg.StatusAddr)
	if err != nil {
		return Result{}, configErr("--status-addr %s: %v", cfg.StatusAddr, errors.Unwrap(err))
	}
	closers = append(closers, func() error { ln.Close(); return nil })
	_, statusPort, _ := SplitHostPort(ln.Addr().String())
	_, adminPort, _ := SplitHostPort(cfg.AdminAddr)

	if a.ns, err = namespace.Current(); err != nil {
		return Result{}, err
	}
	closers = append(closers, a.ns.Close)
	podCgroup, err := a.findPodCgroup()
	if err != nil {
		return Result{}, err
	}
	pod := PodPolicy{ProxyUID: cfg.ProxyUID, ProxyPorts: cfg.ProxyPorts, AdminPort: adminPort, StatusPort: statusPort,
		ExcludePorts: cfg.ExcludePorts, IdleTimeout: cfg.Drain.IdleTimeout}
	if cfg.pilotAgent() {
		// draind's readiness asks pilot-agent's over loopback.
		pod.ProxyLoopbackPorts = []uint16{r.Istio.StatusPort}
		a.pilotAgent = istio.NewReadiness(r.Istio.StatusPort)
		closers = append(closers, a.pilotAgent.Close)
	}
	client := envoy.New(cfg.AdminAddr, envoy.WithTimeout(time.Second), envoy.WithExclude(envoy.ExcludeSet{Ports: cfg.ExcludePorts, Names: cfg.ExcludeListeners}))
	closers = append(closers, func() error { client.CloseIdleConnections(); return nil })
	shared := &adminShared{log: log, inboundOnly: !cfg.Drain.Gateway}
	a.admin = adminView{c: client, sh: shared}
	// The probes' own client makes one attempt: a probe wants the answer
	// now (the kubelet asks again), not after the drain client's backoff
	// on an admin API that is not listening yet.
	probe := newProbeAdmin(cfg.AdminAddr)
	closers = append(closers, func() error { probe.CloseIdleConnections(); return nil })
	a.probeAdmin = adminView{c: probe, sh: shared}

	// The proxy first: its start-up (Envoy's takes long) overlaps with
	// draind's. Sockets it opens before the tracker's first snapshot are
	// in that snapshot.
	if err := a.limitProxyPrivileges(); err != nil { // privs: the proxy inherits only --proxy-caps
		return Result{}, err
	}
	if a.proxy, err = proxy.Start(cfg.Command, cfg.Proxy); err != nil {
		return Result{}, err
	}
	// From here on the proxy must not outlive us: the machine stops it,
	// and an error return, whichever, kills it here (an Envoy left behind
	// would hold the pod's ports with no draind to drain it).
	defer func() {
		if err != nil {
			a.proxy.Signal(syscall.SIGKILL)
			<-a.proxy.Exited()
		}
	}()
	log.Info("proxy started", logevent.ProxyStarted.Field(), zap.Int("pid", a.proxy.Pid()), zap.Strings("command", cfg.Command))

	// The status server and the signal forwarder start now, before the
	// eBPF objects load: readiness waits on Envoy, not on the verifier, and
	// a drain asked for meanwhile waits in a.early for the machine.
	// Owned goroutines: these two, then the tracker and the app process
	// source. All end before Run returns, before the closers run.
	status := newStatusServer(a, ln, cfg.DrainBeginWait)
	runCtx, cancelRun := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		status.shutdown()
		cancelRun()
		wg.Wait()
	}()
	wg.Go(func() {
		if err := status.serve(); err != nil {
			log.Error("status server", logevent.StatusServerFailed.Field(), zap.Error(err))
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case sig := <-sigc:
				if signalAction(sig) == "ignored" {
					log.Warn("signal ignored", logevent.SignalReceived.Field(), zap.Stringer("signal", sig), zap.String("action", "ignored"))
					continue
				}
				log.Info("signal", logevent.SignalReceived.Field(), zap.Stringer("signal", sig), zap.String("action", "drain"))
				a.early.trigger(drain.CauseSignal)
			}
		}
	})
	// The pod's Kubernetes Events: the access check runs on the
	// reporter's own goroutine, beside the start-up; the drain never
	// waits for the API server.
	events := a.startEvents()
	if events != nil {
		closers = append(closers, events.Close)
	}

	// The two eBPF objects load at once, decoding the kernel's BTF once
	// between them (the cache is dropped after: it holds the decoded BTF),
	// each on a thread of lower CPU priority: the verifier's work is most
	// of draind's start-up, and Envoy's start-up (what readiness waits on)
	// comes first on a pod's few CPUs.
	cache := btf.NewCache()
	var trErr error
	restoreProcs := moreProcs(2)
	var loads sync.WaitGroup
	loads.Go(func() {
		background()
		// Dormant: loaded and verified now, attached at the drain trigger
		// (docs/design.md, "Track only while draining").
		a.tracker, trErr = flows.OpenTracker(a.ns, flows.TrackerConfig{Mode: cfg.Tracker, Policy: pod.Flows(), Logger: log, RingSize: cfg.RingSize, BTFCache: cache, Dormant: true, PodCgroup: podCgroup})
	})
	loads.Go(func() {
		background()
		a.openAppProcs(cache)
	})
	loads.Wait()
	restoreProcs()
	if a.procs != nil {
		closers = append(closers, a.procs.Close)
	}
	if trErr != nil {
		return Result{}, fmt.Errorf("tracker: %w", trErr)
	}
	closers = append(closers, a.tracker.Close)
	mode, why := a.tracker.Mode()
	load, first := a.tracker.Opened()
	log.Info("tracker", logevent.Tracker.Field(), zap.Stringer("mode", mode), zap.String("reason", why), zap.Duration("probe_load", load), zap.Duration("first_snapshot", first))
	if why := a.exitWithAppRefused(); why != "" {
		return Result{}, configErr("--exit-with-app %s: %s", cfg.Drain.ExitWithApp, why)
	}
	log.Info("pod shape", logevent.PodShape.Field(), zap.Stringer("shape", cfg.Drain.StartShape()),
		zap.String("shape_means", cfg.Drain.StartShape().Describe()), zap.String("exit_with_app", string(cfg.Drain.ExitWithApp)))
	a.dropPrivileges() // privs: eBPF loaded, namespaces open, proxy started: keep only what the run still uses
	// Start-up's garbage (decoded BTF, the first snapshot's buffers) goes
	// back to the kernel now, not at some later collection: the idle RSS.
	debug.FreeOSMemory()

	nonTraffic := portSet(pod.ControlPorts())
	var appOnly map[uint16]bool
	if a.hostNet {
		// The node's listeners and flows are not the app's: only its
		// --app-ports are (none: the app part is done at once).
		appOnly = portSet(cfg.AppPorts)
	}
	fv := newFlowView(a.tracker, nonTraffic, appOnly, cfg.Drain.IdleTimeout)
	fv.portFlows = a.hostNet
	shared.flows = fv
	defer fv.Close()
	tracking := &liveViews{a: a, ctx: runCtx, wg: &wg}
	parts := drain.Parts{Flows: fv, Admin: a.admin, Proxy: a.proxy, Log: log, Begun: begun, Tracking: tracking}
	if cfg.Drain.MinDrainAuto {
		ac := arrivalsConfig{probePorts: portSet(append(pod.ControlPorts(), cfg.ProbePorts...)), nodeIP: r.NodeIP}
		if cfg.pilotAgent() {
			ac.outbound = envoy.IstioOutbound()
		}
		arr := newArrivals(a.tracker, fv, client, ac, log)
		shared.arrivals = arr
		parts.Arrivals = arr
		defer arr.End()
	}
	if a.procs != nil {
		parts.Apps = appView{a.procs}
	}
	if cfg.CloseIdleKeepalives {
		// pilot-agent starts Envoy with --drain-strategy immediate.
		parts.Untold = untoldCloser{fv: fv, proxy: a.proxy, gradual: !cfg.pilotAgent() && !envoy.DrainTellsAtOnce(cfg.Command[1:])}
	}
	if events != nil {
		parts.Reporter = events
	}
	a.machine = drain.New(cfg.Drain, parts)
	a.metrics = newMetrics(a)
	// What follows while Ready: the app's processes under --exit-with-app
	// (its completion is a trigger); nothing else until the trigger.
	if a.procs != nil && a.procs.Live() {
		tracking.run("app process source", a.procs.Run)
	}
	a.early.attach(a.machine, promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	res = a.machine.Run(ctx)
	if events != nil {
		a.flushEvents(events)
	}
	return res, nil
}

// drainSignals start the drain: SIGTERM (the kubelet's), SIGINT (a
// terminal's), and SIGQUIT, the stop signal an image or a pod may name
// instead of SIGTERM (nginx's graceful quit; the runtime sends the
// image's STOPSIGNAL). ignoredSignals are logged and change nothing:
// SIGHUP asks a daemon to reload, and draind has nothing to reload; a
// terminal hanging up must not stop the pod's proxy either.
var (
	drainSignals   = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT}
	ignoredSignals = []os.Signal{syscall.SIGHUP}
)

// signalAction is what draind does on sig: "drain" or "ignored".
func signalAction(sig os.Signal) string {
	if slices.Contains(ignoredSignals, sig) {
		return "ignored"
	}
	return "drain"
}

// startEvents starts the reporter of the pod's Kubernetes Events (nil:
// none), saying once why not when it cannot post: not in a cluster, no
// service account token, or its files unreadable. A denied or
// unreachable API server is the reporter's to say, once it has asked.
func (a *agent) startEvents() *kubeevents.Reporter {
	if a.cfg.Events == EventsOff {
		a.log.Info("kubernetes events off", logevent.KubeEvents.Field(), zap.Bool("enabled", false), zap.String("why", "--events off"))
		return nil
	}
	ic, err := kubeevents.LoadInCluster(a.cfg.LookupEnv, a.cfg.ServiceAccountDir)
	if err != nil {
		a.log.Warn("no Kubernetes Events", logevent.KubeEventsUnavailable.Field(), zap.String("why", kubeevents.WhyUnavailable(err)), zap.Error(err))
		return nil
	}
	r := kubeevents.Start(kubeevents.Config{API: ic, Pod: kubeevents.PodFromEnv(a.cfg.LookupEnv), Log: a.log})
	p := r.Pod()
	a.log.Info("kubernetes events on the pod: the drain's start and end", logevent.KubeEvents.Field(), zap.Bool("enabled", true),
		zap.String("api_server", ic.Server), zap.String("pod", p.Name), zap.String("namespace", p.Namespace), zap.String("uid", p.UID), zap.String("node", p.Node))
	if p.UID == "" {
		// kubectl describe pod lists a pod's Events by its UID.
		a.log.Warn("POD_UID unset: describe pod will not show the Events", logevent.KubeEvents.Field(), zap.String("env", kubeevents.PodUIDEnv))
	}
	return r
}

// flushEvents gives the drain's last Event a short wait once the proxy
// has stopped: at most kubeevents.EndWait, and never past the drain's
// end (drain.Config.End: a native sidecar's late stop ends after the
// deadline). What is still queued after it is said by the reporter's
// Close (the cleanup line).
func (a *agent) flushEvents(r *kubeevents.Reporter) {
	wait := kubeevents.EndWait
	if st := a.machine.State(); st.Cause != drain.CauseNone {
		wait = min(wait, time.Until(st.Triggered.Add(a.cfg.Drain.End(st))))
	}
	t0 := time.Now()
	all := r.Flush(wait)
	a.log.Info("kubernetes events at exit", logevent.KubeEvents.Field(), zap.Bool("all_posted", all), zap.Duration("waited", time.Since(t0)),
		zap.Int64("posted", r.Posted()), zap.Int64("failed", r.Failed()), zap.Int64("dropped", r.Dropped()))
}

// defaultGCPercent is draind run's GOGC unless the environment sets one.
const defaultGCPercent = 50

// backgroundNice is the nice value of the threads loading the eBPF
// objects: under contention they get about a tenth of what Envoy's
// threads get (CFS weights 110 and 1024), and all of an idle CPU.
const backgroundNice = 10

// background lowers the calling goroutine's thread to backgroundNice for
// the rest of the goroutine's life. The goroutine keeps the thread and
// never unlocks it, so that the thread ends with the goroutine: no other
// goroutine ever runs at that priority (raising it back would need
// CAP_SYS_NICE). Best effort: a failure leaves the priority as it was.
func background() {
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), backgroundNice)
}

// moreProcs adds n to GOMAXPROCS until the returned func is called. The
// loads are CPU-bound in Go (decoding the kernel's BTF) before they are in
// the kernel: with GOMAXPROCS at the pod's CPUs they would hold every P,
// and the status server could not answer a probe until they are done.
// With more Ps than CPUs the kernel's scheduler decides, and it runs the
// loaders last (background). The default comes back after: from the
// environment's GOMAXPROCS when set, else the runtime's (CPUs and cgroup
// limit, kept up to date).
func moreProcs(n int) (restore func()) {
	prev := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(prev + n)
	return func() {
		if os.Getenv("GOMAXPROCS") != "" {
			runtime.GOMAXPROCS(prev)
			return
		}
		runtime.SetDefaultGOMAXPROCS()
	}
}

func portSet(ports []uint16) map[uint16]bool {
	m := make(map[uint16]bool, len(ports))
	for _, p := range ports {
		m[p] = true
	}
	return m
}

// openAppProcs picks the app-liveness source (docs/design.md, "When is the
// app done?") and tells a hostNetwork pod, logging which and why.
func (a *agent) openAppProcs(cache *btf.Cache) {
	start := time.Now()
	if a.cfg.AppProcs == appprocs.ModeOff || a.cfg.Drain.Gateway {
		a.hostNet = a.cfg.HostNetwork == HostNetworkTrue
		a.log.Info("app liveness", logevent.AppLiveness.Field(), zap.String("source", "sockets"), zap.String("reason", "process tracking off"))
		return
	}
	rules := appprocs.Rules{SelfPIDs: []int{os.Getpid()}, ProxyUID: a.cfg.ProxyUID, ProxyPIDs: []int{a.proxy.Pid()}}
	opts := []appprocs.Option{appprocs.WithBTFCache(cache)}
	if a.exits != nil {
		opts = append(opts, appprocs.WithEarlyExits(a.exits))
	}
	if !a.watchesAppWhileReady() {
		opts = append(opts, appprocs.WithDormant())
		if a.cgroups != nil {
			// Followed through the pod's cgroups, not node-wide programs.
			opts = append(opts, appprocs.WithPodCgroup(a.cgroups.Pod.Path, a.cgroups.Own.Path))
		}
	}
	if a.cfg.ProcRingSize > 0 {
		opts = append(opts, appprocs.WithRingSize(a.cfg.ProcRingSize))
	}
	src, reason, err := appprocs.Open(a.ns.Inode(), rules, a.cfg.AppProcs, opts...)
	// The source took the early exits at its Open: the recorder's program
	// need not run for every signal of the node any longer.
	if cerr := a.exits.Close(); cerr != nil {
		a.log.Warn("early exits", logevent.EarlyExits.Field(), zap.Error(cerr))
	}
	var host hostNetVerdict
	if err == nil {
		host = detectHostNet(a.cfg.HostNetwork, a.ns, src)
	} else {
		host = detectHostNet(a.cfg.HostNetwork, a.ns, nil)
	}
	a.hostNet = host.host
	a.log.Info("network namespace", logevent.NetworkNamespace.Field(), zap.Bool("host_network", host.host), zap.String("how", host.how))
	switch {
	case err != nil:
		why := err.Error()
		var ue *appprocs.UnavailableError
		if errors.As(err, &ue) {
			why = ue.Reason // the cause in one line; the loader's own hints mislead (MEMLOCK for a missing capability)
		}
		a.log.Info("app liveness", logevent.AppLiveness.Field(), zap.String("source", "sockets"), zap.String("reason", why))
		return
	case host.host:
		// Every process of the node shares this namespace: none of them
		// tells whether the app is done.
		src.Close()
		a.log.Info("app liveness", logevent.AppLiveness.Field(), zap.String("source", "sockets"), zap.String("reason", "hostNetwork: the namespace's processes and listeners are the node's; the app is its --app-ports"))
		return
	case src.Kind() == appprocs.ModeProc && a.cfg.AppProcs == appprocs.ModeAuto && src.Count() == 0:
		// /proc shows only our own PID namespace: with no app process in
		// view, the app is most likely in another container, not absent.
		src.Close()
		a.log.Info("app liveness", logevent.AppLiveness.Field(), zap.String("source", "sockets"), zap.String("reason", reason+"; no app process visible in /proc (no shared PID namespace)"))
		return
	}
	a.procs = src
	for _, c := range src.Containers() {
		// What the container rule leaves out of the app (an init wrapper,
		// hooks, exec sessions): said once, so that a surprise shows.
		procs := make([]string, len(c.Processes))
		for i, p := range c.Processes {
			procs[i] = fmt.Sprintf("%d %s uid %d", p.PID, p.Comm, p.UID)
		}
		a.log.Info("own container: its processes are never the app", logevent.OwnContainer.Field(), zap.Stringer("whose", c.Class), zap.Uint64("mnt_ns", c.MountNS), zap.Strings("processes", procs))
	}
	cov := src.Coverage()
	a.log.Info("app liveness", logevent.AppLiveness.Field(), zap.Stringer("source", src.Kind()), zap.String("reason", reason), zap.Int("app_processes", src.Count()),
		zap.Bool("complete", cov.Complete), zap.String("coverage", cov.Reason), zap.Duration("took", time.Since(start)))
}

// findPodCgroup finds the pod's cgroup under --cgroup-root (nil without
// it): the cgroup the drain's TCP program attaches to.
func (a *agent) findPodCgroup() (*probes.PodCgroup, error) {
	if a.cfg.CgroupRoot == "" {
		return nil, nil
	}
	f, err := podcgroup.Find(a.cfg.CgroupRoot, os.Getpid())
	if err != nil {
		return nil, configErr("--cgroup-root %s: %v", a.cfg.CgroupRoot, err)
	}
	a.log.Info("pod cgroup", logevent.PodCgroup.Field(), zap.String("pod", f.Pod.Path), zap.String("own", f.Own.Path))
	a.cgroups = &f
	return &probes.PodCgroup{Path: f.Pod.Path, ID: f.Pod.ID}, nil
}

// watchesAppWhileReady reports whether the app is watched while ready:
// --exit-with-app ends the drain-free life of the pod on the app's
// completion, which only a live process source sees.
func (a *agent) watchesAppWhileReady() bool {
	return a.cfg.Drain.ExitWithApp.WatchesApp()
}

// liveViews is drain.Tracking: at the drain trigger it makes the flow
// tracker and the app's process source live (each attaches, then takes
// its snapshot and walk), at once, and runs them until Run's end.
type liveViews struct {
	a   *agent
	ctx context.Context
	wg  *sync.WaitGroup // agent.Run's: waited for before it returns
}

func (v *liveViews) Start() error {
	a := v.a
	var trErr, prErr error
	var starts sync.WaitGroup
	a.tracker.MeasureIdle() // for Envoy's parked connections once the app is gone (drain.EnvoyDrained)
	starts.Go(func() { trErr = a.tracker.Start() })
	if a.procs != nil && !a.procs.Live() {
		starts.Go(func() {
			if prErr = a.procs.Start(); prErr == nil {
				via, why := a.procs.Following()
				a.log.Info("app tracking", logevent.AppTracking.Field(), zap.String("via", string(via)), zap.String("reason", why))
				v.run("app process source", a.procs.Run)
			}
		})
	}
	starts.Wait()
	if trErr == nil {
		v.run("tracker", a.tracker.Run)
	}
	return errors.Join(trErr, prErr)
}

// run runs part until agent.Run's end, logging how it stopped.
func (v *liveViews) run(part string, run func(context.Context) error) {
	v.wg.Go(func() {
		if err := run(v.ctx); err != nil {
			v.a.log.Error("live view stopped", logevent.LiveViewStopped.Field(), zap.String("part", part), zap.Error(err))
		}
	})
}

// exitWithAppRefused says why --exit-with-app cannot work here ("": it
// can): it needs the app's processes, and their exit codes for success.
func (a *agent) exitWithAppRefused() string {
	switch mode := a.cfg.Drain.ExitWithApp; {
	case mode == "" || mode == drain.ExitWithAppOff:
		return ""
	case a.procs == nil:
		return "the app's processes cannot be followed here (no eBPF, no shared PID namespace, or hostNetwork): draind could not tell the app's work is done"
	case mode == drain.ExitWithAppSuccess && a.procs.Kind() != appprocs.ModeEBPF:
		return "success needs the app's exit codes, which only the eBPF process tracker reads (/proc does not): use any, or grant CAP_BPF and CAP_PERFMON"
	}
	return ""
}

type hostNetVerdict struct {
	host bool
	how  string
}

// detectHostNet tells whether ns is the host's network namespace (a
// hostNetwork pod): --host-network when set; else the host's namespace
// inode as the eBPF process walk read it from the kernel (whatever PID
// namespace draind is in); else, from the host's PID namespace only,
// /proc/1's. In a container without eBPF nothing can tell: the flag is the
// way, and the answer is "no".
func detectHostNet(flag HostNetwork, ns *namespace.Net, src appprocs.Source) hostNetVerdict {
	switch flag {
	case HostNetworkTrue:
		return hostNetVerdict{true, "--host-network"}
	case HostNetworkFalse:
		return hostNetVerdict{false, "--host-network"}
	}
	if src != nil {
		if ino, ok := src.HostNetNS(); ok {
			return hostNetVerdict{ino == ns.Inode(), "the kernel's initial network namespace (eBPF)"}
		}
	}
	var net unix.Stat_t
	if _, initial, err := namespace.SelfPID(); err == nil && initial {
		if unix.Stat("/proc/1/ns/net", &net) == nil {
			return hostNetVerdict{net.Ino == ns.Inode(), "/proc/1/ns/net (host PID namespace)"}
		}
	}
	return hostNetVerdict{false, "cannot tell without eBPF from a container's PID namespace: set --host-network true for a hostNetwork pod"}
}

// readiness reports whether draind is ready: the proxy LIVE with workers
// started, nothing asked to drain, and the app listening on --app-ports.
// Before the machine exists (the eBPF objects still loading) only
// --app-ports waits for it (the tracker is what reads the app's listeners),
// and --exit-with-app (the app's process source, live from then on, is what
// sees a Job's app run).
func (a *agent) readiness(ctx context.Context) (bool, string) {
	m, _ := a.early.machine()
	if m != nil {
		if p := m.Phase(); p != drain.Ready && p != drain.Starting {
			return false, p.String()
		}
	}
	if a.early.asked() { // the machine may not have taken it up yet
		return false, "draining"
	}
	if ok, why := a.probeAdmin.Live(ctx); !ok {
		return false, why
	}
	if a.pilotAgent != nil {
		if ok, why := a.pilotAgent.Ready(ctx); !ok {
			return false, why
		}
	}
	if m == nil && a.watchesAppWhileReady() {
		// A Job's app gated on readiness (`draind wait` as postStart)
		// must start only once its processes are watched: else it may
		// run and leave before draind sees it, exit code unknown.
		return false, "starting: the app's process source is not open yet (--exit-with-app)"
	}
	if len(a.cfg.AppPorts) == 0 {
		return true, ""
	}
	if m == nil {
		return false, "starting: the tracker is not open yet (--app-ports)"
	}
	// While Ready, one LISTEN dump the kernel filters to these ports.
	missing, err := a.tracker.Listening(flows.OwnerApp, a.cfg.AppPorts)
	switch {
	case err != nil:
		return false, "app listeners: " + err.Error()
	case len(missing) > 0:
		return false, fmt.Sprintf("app not listening on port %d", missing[0])
	}
	return true, ""
}
