package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/tools/bench/benchns"
)

// footprint node: what a node full of idle draind pods costs its
// neighbours (issue 21; docs/benchmarks.md, "Node density"). Pods are
// added rung by rung (each its own network namespace, `draind run` with
// envoysim, no traffic); at each rung a workload in yet another namespace
// measures the loopback TCP connect+close rate and the fork+exec rate,
// reported as ratios to the rung with no pod, measured first in the same
// run (and once more last, to show the machine's drift).

// nodeConfig is what `footprint node` measures.
type nodeConfig struct {
	p            proxySetup
	self         string        // this binary: the workloads (footprint nodeload)
	pods         []int         // the rungs of Ready pods in eBPF mode, ascending
	sockdiagPods []int         // the same in sock_diag mode (no eBPF at all)
	jobPods      []int         // the same as Jobs (--exit-with-app: the process programs attached while Ready)
	cgroupPods   []int         // the same in eBPF mode, each pod a cgroup of its own and draind told (--cgroup-root)
	draining     int           // pods draining at the top rung of both eBPF modes
	loadFor      time.Duration // each workload's run, repeat times, alternating
	repeat       int
	statsFor     time.Duration
	idleFor      time.Duration
	parallel     int           // pods starting at once
	settle       time.Duration // after pods start (or drain), before measuring
	maxOps       int
}

// The modes, as `draind run --tracker` spells them. In sock_diag mode the
// app's processes are followed through /proc (--app-procs proc): what a
// pod without CAP_BPF gets.
var nodeModes = map[string][]string{
	"ebpf":     {"--tracker", "ebpf"},
	"sockdiag": {"--tracker", "sockdiag", "--app-procs", "proc"},
	// A Job's draind follows the app's processes while Ready: their
	// completion is its trigger.
	"job": {"--tracker", "ebpf", "--app-procs", "ebpf", "--exit-with-app", "success"},
	// eBPF mode in a pod whose cgroup draind can see (nodecgroup.go): at
	// the trigger it tracks TCP from the pod's cgroup, not the node's
	// hook. startPods adds cgroupRootFlag.
	podCgroupMode: {"--tracker", "ebpf"},
}

// podCgroupMode is the pod-cgroup pods' mode; its rows say "ebpf, pod
// cgroup".
const podCgroupMode = "ebpf, pod cgroup"

// Log fields of `draind run` the benchmark reads (JSON log lines).
const (
	// trackingLiveField is the hook for the lead's change (issue 21): the
	// time from the drain trigger to tracking live (attached, snapshot
	// and walk done), a zap.Duration ("12.3ms") on whichever line says
	// so. trackingLiveMsField, a number of milliseconds, is read too.
	trackingLiveField   = "tracking_live"
	trackingLiveMsField = "tracking_live_ms"
)

// userHZ is the unit of /proc/PID/stat's utime and stime: USER_HZ, 100 on
// every Linux architecture (the ABI fixes it).
const userHZ = 100

type nodePod struct {
	ns       *benchns.NS
	agent    *agentProc
	cgroup   *podCgroup // pod-cgroup mode only
	draining bool
	sigAt    time.Duration // when SIGTERM was sent, since the agent's start
}

// nodeBench is one run: its pods, the workload's namespace, its rows.
type nodeBench struct {
	cfg    nodeConfig
	dir    string
	load   *benchns.NS
	cg     *cgroupRoot // with pod-cgroup rungs only
	pods   []*nodePod
	rows   []nodeRow
	drains []drainTimes // one per mode with draining pods
}

// drainTimes is, per draining pod of a mode, SIGTERM → the "phase:
// draining" line on its stderr; trackingLive the hook's value (-1: not
// logged).
type drainTimes struct {
	mode                    string
	drainSeen, trackingLive []time.Duration
}

type nodeRow struct {
	label               string
	load                string // the 1-minute load average as the rung began
	pods, draining      int
	tcp, fork           load
	idleCores, loadCore float64 // draind's CPU, all pods together
	mapBytes            float64 // BPF map memory per pod
	progsPerPod         float64
	bigMaps             string // the largest maps of one pod
	rssMedKB, rssMaxKB  int64
	progs               []progStat
	// Of the draining pods: the scope of their TCP tracking ("tcp
	// tracking" line; "" when not logged), the reasons given for "node",
	// and the BPF links they hold by type, each with how many pods.
	scopes, reasons, links map[string]int
}

// load is a workload's run: operations per second of wall time, and per
// second of its own CPU time (user+system, its children's included: the
// eBPF programs run on its CPU time). Other engineers' work on a shared
// machine steals wall time; the CPU time is much less affected.
type load struct{ wall, cpu float64 }

type progStat struct {
	name       string
	instances  int
	runs, nsec uint64
}

func nodeTable(ctx context.Context, w io.Writer, cfg nodeConfig) (err error) {
	// Interrupted, the deferred clean-up still runs (tools/bench/node.sh
	// runs this in a PID namespace of its own as well: killed, the kernel
	// ends every process, and so every network namespace, it made).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "footprint-node")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	b := &nodeBench{cfg: cfg, dir: dir}
	if b.load, err = benchns.New(); err != nil {
		return fmt.Errorf("workload namespace: %w", err)
	}
	defer b.load.Close()
	// No TIME_WAIT in the workload's namespace: the closes stay the same
	// from the first run to the last. (With TIME_WAIT the first runs fill
	// the table and the later ones, past its limit, skip it: they were up
	// to 1.5× faster, whatever the pods.)
	if err := b.load.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_max_tw_buckets", []byte("0"), 0)
	}); err != nil {
		return fmt.Errorf("workload namespace: %w", err)
	}
	if len(cfg.cgroupPods) > 0 {
		// Before the first pod: each draind's mount namespace is a copy
		// of ours, made at its start, and so shows the mount.
		if b.cg, err = openCgroupRoot(os.TempDir()); err != nil {
			return fmt.Errorf("%s pods: %w", podCgroupMode, err)
		}
		defer func() { err = errors.Join(err, b.cg.close()) }()
	}
	defer func() { err = errors.Join(err, b.stopPods()) }()
	startLoad := loadavg()
	started := time.Now()
	// A warm-up, not counted: /bin/true and this binary in the page
	// cache, the workload namespace's first sockets.
	for _, kind := range []string{loadTCP, loadFork} {
		if _, err := b.runLoad(ctx, kind, b.cfg.statsFor); err != nil {
			return err
		}
	}
	if err := b.step(ctx, "no draind"); err != nil {
		return err
	}
	for _, mode := range []string{"ebpf", podCgroupMode, "job", "sockdiag"} {
		rungs := cfg.pods
		switch mode {
		case "sockdiag":
			rungs = cfg.sockdiagPods
		case "job":
			rungs = cfg.jobPods
		case podCgroupMode:
			rungs = cfg.cgroupPods
		}
		for _, n := range rungs {
			if err := b.startPods(ctx, mode, n-len(b.pods)); err != nil {
				return fmt.Errorf("%s, %d pods: %w", mode, n, err)
			}
			if err := sleepCtx(ctx, cfg.settle); err != nil {
				return err
			}
			if err := b.step(ctx, fmt.Sprintf("%d Ready (%s)", n, mode)); err != nil {
				return err
			}
		}
		if (mode == "ebpf" || mode == podCgroupMode) && cfg.draining > 0 && len(b.pods) > 0 {
			k := min(cfg.draining, len(b.pods))
			b.drains = append(b.drains, drainTimes{mode: mode})
			if err := b.drain(ctx, k); err != nil {
				return err
			}
			if err := sleepCtx(ctx, cfg.settle); err != nil {
				return err
			}
			if err := b.step(ctx, fmt.Sprintf("%d Ready + %d draining (%s)", len(b.pods)-k, k, mode)); err != nil {
				return err
			}
			for _, p := range b.pods[:k] { // logged by now, if at all
				d := &b.drains[len(b.drains)-1]
				d.trackingLive = append(d.trackingLive, p.trackingLive())
			}
		}
		if err := b.stopPods(); err != nil {
			return err
		}
	}
	if err := b.step(ctx, "no draind, again (drift)"); err != nil {
		return err
	}
	b.print(w, startLoad, loadavg(), time.Since(started))
	return nil
}

// startPods adds n pods in mode, at most cfg.parallel starting at once,
// and returns once each is Ready and its tracker open.
func (b *nodeBench) startPods(ctx context.Context, mode string, n int) error {
	if n <= 0 {
		return nil
	}
	p := b.cfg.p
	p.args = append(append([]string{"--log-format", "json", "--drain-deadline", "10m"}, nodeModes[mode]...), p.args...)
	var cg *cgroupRoot
	if mode == podCgroupMode {
		cg = b.cg
		p.args = append([]string{cgroupRootFlag, cg.mount}, p.args...)
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, b.cfg.parallel)
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pod, err := b.startPod(ctx, p, cg)
			mu.Lock()
			defer mu.Unlock()
			if pod != nil {
				b.pods = append(b.pods, pod)
			}
			errs = append(errs, err)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startPod returns the pod even when it failed to become ready, so that
// stopPods ends it. With cg, the pod is a cgroup of its own under it:
// draind (and so its proxy) starts in its proxy container's, the
// namespace's other processes in its app container's.
func (b *nodeBench) startPod(ctx context.Context, p proxySetup, cg *cgroupRoot) (*nodePod, error) {
	var (
		pc  *podCgroup
		ns  *benchns.NS
		err error
	)
	if cg != nil {
		if pc, err = cg.newPod(); err != nil {
			return nil, err
		}
		ns, err = benchns.NewInCgroup(int(pc.app.Fd()))
	} else {
		ns, err = benchns.New()
	}
	if err != nil {
		return nil, errors.Join(err, closePodCgroup(pc))
	}
	// A directory each: draindCommand writes the proxy's config there,
	// and pods start side by side.
	dir, err := os.MkdirTemp(b.dir, "pod")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	var cmd *exec.Cmd
	if err == nil {
		cmd, err = draindCommand(p, dir)
	}
	if err != nil {
		ns.Close()
		return nil, errors.Join(err, closePodCgroup(pc))
	}
	if pc != nil {
		cmd.SysProcAttr = pc.proxyAttr()
	}
	a, err := startAgent(ns, cmd)
	if err != nil {
		ns.Close()
		return nil, errors.Join(err, closePodCgroup(pc))
	}
	pod := &nodePod{ns: ns, agent: a, cgroup: pc}
	if pc != nil {
		if err := errors.Join(pc.checkIn(a.cmd.Process.Pid, "proxy"), pc.checkIn(ns.Pid(), "app")); err != nil {
			return pod, err
		}
	}
	// "pod shape" follows the tracker's opening; readiness may come first.
	if err := waitLine(ctx, a, `"msg":"pod shape"`, 0, 90*time.Second); err != nil {
		return pod, err
	}
	c, err := newNSClient(ns)
	if err != nil {
		return pod, err
	}
	defer c.close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, _, err := c.get("http://" + statusAddr + "/healthz/ready")
		if err == nil && code == 200 {
			return pod, nil
		}
		select {
		case <-a.done:
			return pod, fmt.Errorf("draind exited before ready:\n%s", a.output())
		default:
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("status %d", code)
			}
			return pod, fmt.Errorf("not ready after 30 s (last: %w):\n%s", err, a.output())
		}
	}
}

// waitLine waits for a line containing s that arrived after `after`.
func waitLine(ctx context.Context, a *agentProc, s string, after, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if a.lineAfter(s, after) >= 0 {
			return nil
		}
		select {
		case <-a.done:
			return fmt.Errorf("draind exited waiting for %s:\n%s", s, a.output())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after %s:\n%s", s, timeout, a.output())
		}
	}
}

// lineAfter is when the first line containing s at or after `after`
// arrived (-1: none).
func (a *agentProc) lineAfter(s string, after time.Duration) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.lines {
		if l.at >= after && strings.Contains(l.text, s) {
			return l.at
		}
	}
	return -1
}

// stopPods ends every pod and removes the pod cgroups.
func (b *nodeBench) stopPods() error {
	var errs []error
	for _, p := range b.pods {
		p.agent.stop()
		p.ns.Close()
		errs = append(errs, closePodCgroup(p.cgroup))
	}
	b.pods = nil
	return errors.Join(errs...)
}

func closePodCgroup(c *podCgroup) error {
	if c == nil {
		return nil
	}
	return c.close()
}

// drain puts k Ready pods into drain, each held open by an in-flight
// request: a connection of the pod's own (both ends in the pod, an app's
// listener) that stays open. SIGTERM one pod at a time.
func (b *nodeBench) drain(ctx context.Context, k int) error {
	for _, p := range b.pods[:k] {
		if err := p.ns.Fill(1); err != nil {
			return fmt.Errorf("in-flight request: %w", err)
		}
		if err := waitTracked(p, 2, 10*time.Second); err != nil {
			return err
		}
		if p.cgroup != nil {
			if err := waitPodSockets(p, 5*time.Second); err != nil {
				return err
			}
		}
		p.sigAt = time.Since(p.agent.start)
		if err := p.agent.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return err
		}
		p.draining = true
		if err := waitLine(ctx, p.agent, `"phase":"draining"`, p.sigAt, 10*time.Second); err != nil {
			return err
		}
		d := &b.drains[len(b.drains)-1]
		d.drainSeen = append(d.drainSeen, p.agent.lineAfter(`"phase":"draining"`, p.sigAt)-p.sigAt)
	}
	return nil
}

// waitTracked waits until the pod's draind counts n app flows.
func waitTracked(p *nodePod, n int, timeout time.Duration) error {
	c, err := newNSClient(p.ns)
	if err != nil {
		return err
	}
	defer c.close()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		m, err := scrape(c)
		if err != nil {
			return err
		}
		got := int(m[`draind_tracked_flows{class="app_inbound"}`] + m[`draind_tracked_flows{class="app_outbound"}`])
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("draind tracks %d app flows after %s, want %d", got, timeout, n)
		}
	}
}

// waitPodSockets waits until every socket of the pod's namespace is the
// pod's own (podCgroup.waitOwnSockets).
func waitPodSockets(p *nodePod, timeout time.Duration) error {
	d, err := p.ns.DialSockDiag()
	if err != nil {
		return err
	}
	defer d.Close()
	d.SetInfo(false)
	return p.cgroup.waitOwnSockets(d, timeout)
}

// trackingLive reads the hook's field from the pod's lines after its
// SIGTERM (-1: not logged).
func (p *nodePod) trackingLive() time.Duration {
	p.agent.mu.Lock()
	defer p.agent.mu.Unlock()
	for _, l := range p.agent.lines {
		if l.at < p.sigAt || !strings.Contains(l.text, trackingLiveField) {
			continue
		}
		var fields map[string]any
		if json.Unmarshal([]byte(l.text), &fields) != nil {
			continue
		}
		if s, ok := fields[trackingLiveField].(string); ok {
			if d, err := time.ParseDuration(s); err == nil {
				return d
			}
		}
		if ms, ok := fields[trackingLiveMsField].(float64); ok {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	return -1
}

// step measures one rung: draind's CPU while nothing runs, the workloads
// (eBPF statistics off), the workloads again with the statistics on, the
// pods' memory.
func (b *nodeBench) step(ctx context.Context, label string) error {
	r := nodeRow{label: label, pods: len(b.pods)}
	for _, p := range b.pods {
		if p.draining {
			r.draining++
		}
	}
	if r.draining > 0 {
		r.scopes, r.reasons, r.links = map[string]int{}, map[string]int{}, map[string]int{}
	}
	fmt.Fprintf(os.Stderr, "footprint node: %s (load %s)\n", label, loadavg())
	r.load = strings.Fields(loadavg())[0]
	pids := b.draindPids()
	t0, err := cpuTicks(pids)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, b.cfg.idleFor); err != nil {
		return err
	}
	t1, err := cpuTicks(pids)
	if err != nil {
		return err
	}
	r.idleCores = float64(t1-t0) / userHZ / b.cfg.idleFor.Seconds()
	began := time.Now()
	// The best of the repeats: the others' work on the machine only ever
	// slows a run down.
	for range b.cfg.repeat {
		for _, l := range []struct {
			kind string
			best *load
		}{{loadTCP, &r.tcp}, {loadFork, &r.fork}} {
			got, err := b.runLoad(ctx, l.kind, b.cfg.loadFor)
			if err != nil {
				return err
			}
			l.best.wall, l.best.cpu = max(l.best.wall, got.wall), max(l.best.cpu, got.cpu)
		}
	}
	t2, err := cpuTicks(pids)
	if err != nil {
		return err
	}
	r.loadCore = float64(t2-t1) / userHZ / time.Since(began).Seconds()
	if len(pids) > 0 {
		if err := b.measureBPF(ctx, &r, pids); err != nil {
			return err
		}
		var rss []int64
		for _, pid := range pids {
			st, err := procStatus(pid)
			if err != nil {
				return err
			}
			rss = append(rss, st["VmRSS"])
		}
		slices.Sort(rss)
		r.rssMedKB, r.rssMaxKB = rss[len(rss)/2], rss[len(rss)-1]
		for _, p := range b.pods {
			if !p.draining {
				continue
			}
			scope, reason := p.tcpScope()
			r.scopes[scope]++
			if scope != "" && scope != podScopeCgroup {
				if reason == "" {
					reason = "(none given)" // draind without --cgroup-root
				}
				r.reasons[reason]++
			}
			links, err := linkTypes(p.agent.cmd.Process.Pid)
			if err != nil {
				return err
			}
			for t, n := range links {
				r.links[t] += n
			}
		}
	}
	// Every pod must still be as it was: alive, the draining ones still
	// held (not stopping).
	for _, p := range b.pods {
		select {
		case <-p.agent.done:
			return fmt.Errorf("%s: a draind exited:\n%s", label, p.agent.output())
		default:
		}
		if p.draining && p.agent.lineAfter(`"phase":"stopping"`, p.sigAt) >= 0 {
			return fmt.Errorf("%s: a draining pod stopped its proxy while its request was in flight:\n%s", label, p.agent.output())
		}
	}
	b.rows = append(b.rows, r)
	// A line as it comes, should a later rung fail.
	fmt.Fprintf(os.Stderr, "footprint node: %s: tcp %.0f/s (%.0f/CPU-s), fork %.0f/s (%.0f/CPU-s), draind idle %.3f cores\n",
		label, r.tcp.wall, r.tcp.cpu, r.fork.wall, r.fork.cpu, r.idleCores)
	return nil
}

func (b *nodeBench) draindPids() []int {
	var pids []int
	for _, p := range b.pods {
		pids = append(pids, p.agent.cmd.Process.Pid)
	}
	return pids
}

// runLoad runs a workload in the workload's namespace and returns its
// rate (operations per second).
func (b *nodeBench) runLoad(ctx context.Context, kind string, d time.Duration) (load, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.self, "nodeload", kind, "--for", d.String(), "--max", strconv.Itoa(b.cfg.maxOps))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := b.load.Do(cmd.Start); err != nil {
		return load{}, err
	}
	if err := cmd.Wait(); err != nil {
		return load{}, fmt.Errorf("%s workload: %w: %s", kind, err, out.String())
	}
	var ops, nsec float64
	if _, err := fmt.Sscan(out.String(), &ops, &nsec); err != nil || nsec <= 0 {
		return load{}, fmt.Errorf("%s workload: output %q", kind, out.String())
	}
	// wait4's usage is the child's and its waited-for children's.
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return load{wall: ops / (nsec / 1e9), cpu: ops / cpu.Seconds()}, nil
}

// cpuTicks sums utime+stime (all threads) of the processes.
func cpuTicks(pids []int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, err
		}
		// Fields after the command (which may hold spaces), from state
		// (field 3): utime and stime are fields 14 and 15.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		s, err2 := strconv.ParseInt(f[12], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, err
		}
		sum += u + s
	}
	return sum, nil
}

// bpfObject is what bpftool -j says of a program or a map.
type bpfObject struct {
	ID       uint32   `json:"id"`
	Name     string   `json:"name"`
	RunNS    uint64   `json:"run_time_ns"`
	RunCnt   uint64   `json:"run_cnt"`
	MapIDs   []uint32 `json:"map_ids"`
	Memlock  int64    `json:"bytes_memlock"`
	ByteSize int64    `json:"bytes"`
}

func bpftool(what string) (map[uint32]bpfObject, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bpftool", "-j", what, "show").Output()
	if err != nil {
		return nil, fmt.Errorf("bpftool %s show: %w", what, err)
	}
	var objs []bpfObject
	if err := json.Unmarshal(out, &objs); err != nil {
		return nil, fmt.Errorf("bpftool %s show: %w", what, err)
	}
	m := make(map[uint32]bpfObject, len(objs))
	for _, o := range objs {
		m[o.ID] = o
	}
	return m, nil
}

// bpfFDs returns the programs (held as program or link file descriptors)
// and maps of a process, by ID, from /proc/PID/fd and fdinfo.
func bpfFDs(pid int) (progs, maps map[uint32]bool, err error) {
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return nil, nil, err
	}
	progs, maps = map[uint32]bool{}, map[uint32]bool{}
	for _, e := range ents {
		target, err := os.Readlink(dir + "/fd/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		var key string
		var set map[uint32]bool
		switch target {
		case "anon_inode:bpf-prog", "anon_inode:bpf_link":
			key, set = "prog_id:", progs
		case "anon_inode:bpf-map":
			key, set = "map_id:", maps
		default:
			continue
		}
		info, err := os.ReadFile(dir + "/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for l := range strings.SplitSeq(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, key); ok {
				if id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
					set[uint32(id)] = true
				}
			}
		}
	}
	return progs, maps, nil
}

// measureBPF fills the row's map memory and program counts (from the
// pods' file descriptors and the programs' maps) and the per-program cost
// over a run of both workloads with the kernel's run-time statistics on
// (BPF_ENABLE_STATS: what kernel.bpf_stats_enabled=1 turns on, held by a
// file descriptor, so nobody else's setting is touched).
func (b *nodeBench) measureBPF(ctx context.Context, r *nodeRow, pids []int) error {
	progs0, err := bpftool("prog")
	if err != nil {
		return err
	}
	maps, err := bpftool("map")
	if err != nil {
		return err
	}
	ownProg := map[uint32]bool{}
	var mapTotal int64
	progTotal := 0
	for i, pid := range pids {
		progs, mapIDs, err := bpfFDs(pid)
		if err != nil {
			return err
		}
		for id := range progs {
			ownProg[id] = true
			for _, m := range progs0[id].MapIDs {
				mapIDs[m] = true
			}
		}
		progTotal += len(progs)
		var sizes []bpfObject
		for id := range mapIDs {
			mapTotal += maps[id].Memlock
			sizes = append(sizes, maps[id])
		}
		if i == 0 {
			sort.Slice(sizes, func(i, j int) bool { return sizes[i].Memlock > sizes[j].Memlock })
			var big []string
			for _, m := range sizes[:min(3, len(sizes))] {
				big = append(big, fmt.Sprintf("%s %s", m.Name, mibBytes(float64(m.Memlock))))
			}
			r.bigMaps = strings.Join(big, ", ")
		}
	}
	r.mapBytes = float64(mapTotal) / float64(len(pids))
	r.progsPerPod = float64(progTotal) / float64(len(pids))

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	before, err := bpftool("prog")
	if err != nil {
		return err
	}
	if _, err := b.runLoad(ctx, loadTCP, b.cfg.statsFor); err != nil {
		return err
	}
	if _, err := b.runLoad(ctx, loadFork, b.cfg.statsFor); err != nil {
		return err
	}
	after, err := bpftool("prog")
	if err != nil {
		return err
	}
	byName := map[string]*progStat{}
	for id := range ownProg {
		a, ok := after[id]
		if !ok {
			continue
		}
		s := byName[a.Name]
		if s == nil {
			s = &progStat{name: a.Name}
			byName[a.Name] = s
		}
		s.instances++
		s.runs += a.RunCnt - before[id].RunCnt
		s.nsec += a.RunNS - before[id].RunNS
	}
	for _, s := range byName {
		r.progs = append(r.progs, *s)
	}
	sort.Slice(r.progs, func(i, j int) bool { return r.progs[i].name < r.progs[j].name })
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func mibBytes(b float64) string { return strconv.FormatFloat(b/(1<<20), 'f', 2, 64) + " MiB" }

// loadavg is /proc/loadavg's three averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func (b *nodeBench) print(w io.Writer, loadStart, loadEnd string, took time.Duration) {
	var uts unix.Utsname
	unix.Uname(&uts)
	fmt.Fprintf(w, "kernel %s, %d CPUs, %s; load average %s at the start, %s at the end; %s in all\n\n",
		unix.ByteSliceToString(uts.Release[:]), cpus(), time.Now().UTC().Format("2006-01-02 15:04 UTC"), loadStart, loadEnd, took.Round(time.Second))
	// The baseline is the better of the two rungs without draind, the
	// first and the last: the others' work on the machine only slows.
	first, last := b.rows[0], b.rows[len(b.rows)-1]
	base := nodeRow{tcp: load{max(first.tcp.wall, last.tcp.wall), max(first.tcp.cpu, last.tcp.cpu)},
		fork: load{max(first.fork.wall, last.fork.wall), max(first.fork.cpu, last.fork.cpu)}}
	fmt.Fprintf(w, "Ratios are to the better of the two rungs without draind (first and last); each rate is the best of %d runs of %s.\n\n", b.cfg.repeat, b.cfg.loadFor)
	fmt.Fprintf(w, "| pods | TCP connect+close /s | ratio | per CPU-s ratio | fork+exec /s | ratio | per CPU-s ratio | draind CPU idle (%s, all pods) | draind CPU under the workload | BPF map memory / pod | programs / pod | draind VmRSS median (max) | load |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", b.cfg.idleFor)
	for _, r := range b.rows {
		mem, progs, rss := "-", "-", "-"
		if r.pods > 0 {
			mem = mibBytes(r.mapBytes)
			progs = strconv.FormatFloat(r.progsPerPod, 'f', 1, 64)
			rss = fmt.Sprintf("%s (%s)", mib(r.rssMedKB), mib(r.rssMaxKB))
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2f× | %.2f× | %.0f | %.2f× | %.2f× | %.3f cores | %.3f cores | %s | %s | %s | %s |\n", r.label,
			r.tcp.wall, r.tcp.wall/base.tcp.wall, r.tcp.cpu/base.tcp.cpu, r.fork.wall, r.fork.wall/base.fork.wall, r.fork.cpu/base.fork.cpu,
			r.idleCores, r.loadCore, mem, progs, rss, r.load)
	}
	fmt.Fprintf(w, "\nLargest maps of one pod:")
	for _, r := range b.rows {
		if r.bigMaps != "" {
			fmt.Fprintf(w, " %s: %s;", r.label, r.bigMaps)
		}
	}
	fmt.Fprintf(w, "\n\nPer program, both workloads again for %s each with BPF run-time statistics on (all pods' instances of a program together):\n\n", b.cfg.statsFor)
	fmt.Fprintf(w, "| pods | program | instances | runs | runs / instance | ns / run |\n|---|---|---|---|---|---|\n")
	for _, r := range b.rows {
		for _, s := range r.progs {
			per := "-"
			if s.runs > 0 {
				per = strconv.FormatFloat(float64(s.nsec)/float64(s.runs), 'f', 0, 64)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s |\n", r.label, s.name, s.instances, s.runs, s.runs/uint64(s.instances), per)
		}
	}
	for _, d := range b.drains {
		if len(d.drainSeen) == 0 {
			continue
		}
		live := d.trackingLive
		fmt.Fprintf(w, "\nDrain trigger (%s), %d pods one after another (SIGTERM with the others on the node):\n\n", d.mode, len(d.drainSeen))
		fmt.Fprintf(w, "| measure | p50 | p99 | max |\n|---|---|---|---|\n")
		fmt.Fprintf(w, "| SIGTERM → `\"phase\":\"draining\"` on draind's stderr | %s |\n", quantiles(d.drainSeen))
		if len(live) == 0 || slices.Contains(live, -1) {
			fmt.Fprintf(w, "| SIGTERM → tracking live (`%s` log field) | not logged by this draind | | |\n", trackingLiveField)
		} else {
			fmt.Fprintf(w, "| SIGTERM → tracking live (`%s` log field) | %s |\n", trackingLiveField, quantiles(live))
		}
	}
	b.printDraining(w)
}

// printDraining says, per row with draining pods, where they track TCP
// (the scope of their "tcp tracking" line) and the BPF links they hold.
func (b *nodeBench) printDraining(w io.Writer) {
	header := false
	for _, r := range b.rows {
		if r.draining == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(w, "\nThe draining pods: the scope of their TCP tracking (`%s` line, `%s` field) and the BPF links they hold, all together, by the kernel's link type (a tp_btf program's is raw_tracepoint, a sock_ops program's cgroup):\n\n", tcpTrackingMsg, tcpScopeField)
			fmt.Fprintf(w, "| pods | %s | node | not logged | reasons (node) | links |\n|---|---|---|---|---|---|\n", podScopeCgroup)
			header = true
		}
		other := 0
		for scope, n := range r.scopes {
			if scope != "" && scope != podScopeCgroup {
				other += n
			}
		}
		// A reason is draind's text: no table cell ends in it.
		reasons := strings.ReplaceAll(countList(r.reasons), "|", `\|`)
		fmt.Fprintf(w, "| %s | %d | %d | %d | %s | %s |\n", r.label, r.scopes[podScopeCgroup], other, r.scopes[""], reasons, countList(r.links))
	}
}

// countList is "k1 ×n1; k2 ×n2" in key order ("-": none).
func countList(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return strings.Join(out, "; ")
}

// quantiles is "p50 | p99 | max" (nearest rank).
func quantiles(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("%s | %s | %s", ms(at(0.5)), ms(at(0.99)), ms(s[len(s)-1]))
}

func cpus() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return 0
	}
	return set.Count()
}
