// Command footprint measures what draind costs a pod, in one run on one
// machine (docs/benchmarks.md, "Footprint"; tools/bench/footprint.sh):
//
//	footprint rss      draind run's memory with N established flows in its
//	                   pod namespace (VmRSS, RssAnon, RssFile, Go heap)
//	footprint conns    `draind conns` against ss as whole processes: wall,
//	                   user and system time, page faults, max RSS
//	footprint startup  exec of `draind run` (or Istio's pilot-agent) to the
//	                   first 200 from /healthz/ready, with a proxy that is
//	                   LIVE at once, and the timeline of draind's log lines
//	footprint node     a node full of idle draind pods: the other
//	                   namespaces' loopback TCP connect+close and fork+exec
//	                   rates as ratios to no draind, draind's CPU, BPF map
//	                   memory and per-program cost (issue 21)
//	footprint standin  (internal) that proxy, for both agents alike
//	footprint nodeload (internal) node's workloads
//
// Each prints a Markdown table. Run as root: it creates network namespaces.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/tools/bench/benchns"
)

func main() {
	benchns.ChildMain()
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "footprint:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: footprint rss|conns|startup|node [flags]")
	}
	switch args[0] {
	case "standin":
		return standin()
	case "nodeload":
		return nodeLoad(args[1:])
	}
	if os.Geteuid() != 0 {
		return errors.New("run as root (it creates network namespaces)")
	}
	fs := flag.NewFlagSet("footprint "+args[0], flag.ContinueOnError)
	draind := fs.String("draind", "bin/draind", "draind binary")
	envoysim := fs.String("envoysim", "bin/envoysim", "envoysim binary (the proxy draind runs)")
	sizes := fs.String("flows", "0,1000,10000,100000", "established connections per round (comma-separated)")
	runs := fs.Int("runs", 5, "runs per measurement")
	settle := fs.Duration("settle", 3*time.Second, "rss: wait this long once draind sees every flow")
	before := fs.Bool("before", false, "rss: open the flows before draind starts (its first snapshot reads them) rather than after (events)")
	var env listFlag
	fs.Var(&env, "env", "rss, startup: VAR=value in draind's environment (repeatable; e.g. GOGC=50)")
	var extra listFlag
	fs.Var(&extra, "arg", "rss, startup: an extra argument of draind run (repeatable)")
	pilot := fs.String("pilot-agent", "", "startup: Istio's pilot-agent binary, measured the same way (empty: skip)")
	podRungs := fs.String("pods", "10,40,110", "node: Ready pods in eBPF mode, rung by rung (comma-separated, ascending)")
	sockdiagRungs := fs.String("sockdiag-pods", "110", "node: the same in sock_diag mode (empty: none)")
	jobRungs := fs.String("job-pods", "110", "node: the same as Jobs, --exit-with-app (empty: none)")
	cgroupRungs := fs.String("pod-cgroup-pods", "110", "node: the same in eBPF mode, each pod a cgroup v2 of its own (proxy and app containers) and draind run --cgroup-root (empty: none)")
	draining := fs.Int("draining", 10, "node: pods put into drain at the top rung of --pods and of --pod-cgroup-pods (0: none)")
	loadFor := fs.Duration("load-for", 2*time.Second, "node: each workload's run")
	repeat := fs.Int("repeat", 3, "node: runs of each workload per rung, alternating (the best counts)")
	statsFor := fs.Duration("stats-for", 2*time.Second, "node: each workload's run with BPF run-time statistics on")
	idleFor := fs.Duration("idle-for", 10*time.Second, "node: draind's idle CPU is measured over this")
	parallel := fs.Int("parallel", 4, "node: pods starting at once")
	nodeSettle := fs.Duration("node-settle", 5*time.Second, "node: wait this long after pods start or drain, before measuring")
	maxOps := fs.Int("max-ops", 5_000_000, "node: bound on each workload's operations")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	ns, err := intList("flows", *sizes)
	if err != nil {
		return err
	}
	for _, path := range []*string{draind, envoysim, pilot} {
		if *path != "" {
			abs, err := filepath.Abs(*path)
			if err != nil {
				return err
			}
			*path = abs
		}
	}
	p := proxySetup{draind: *draind, envoysim: *envoysim, env: env, args: extra}
	switch args[0] {
	case "rss":
		return rssTable(ctx, stdout, p, ns, *settle, *before)
	case "conns":
		return connsTable(stdout, *draind, ns, *runs)
	case "startup":
		return startupTable(ctx, stdout, p, *pilot, *runs)
	case "node":
		cfg := nodeConfig{p: p, draining: *draining, loadFor: *loadFor, statsFor: *statsFor, idleFor: *idleFor, parallel: *parallel, repeat: *repeat, maxOps: *maxOps, settle: *nodeSettle}
		if cfg.pods, err = podList("pods", *podRungs); err != nil {
			return err
		}
		if cfg.sockdiagPods, err = podList("sockdiag-pods", *sockdiagRungs); err != nil {
			return err
		}
		if cfg.jobPods, err = podList("job-pods", *jobRungs); err != nil {
			return err
		}
		if cfg.cgroupPods, err = podList("pod-cgroup-pods", *cgroupRungs); err != nil {
			return err
		}
		for _, d := range []struct {
			name string
			d    time.Duration
		}{{"load-for", *loadFor}, {"stats-for", *statsFor}, {"idle-for", *idleFor}, {"node-settle", *nodeSettle}} {
			if d.d <= 0 || d.d > 2*time.Minute {
				return fmt.Errorf("--%s %s: want a duration in (0, 2m]", d.name, d.d)
			}
		}
		if *parallel < 1 || *repeat < 1 || *repeat > 20 || *draining < 0 || *maxOps < 1 {
			return errors.New("--parallel and --max-ops must be positive, --repeat in [1, 20], --draining not negative")
		}
		if cfg.self, err = os.Executable(); err != nil {
			return err
		}
		return nodeTable(ctx, stdout, cfg)
	}
	return fmt.Errorf("unknown measurement %q", args[0])
}

// intList parses a comma-separated list of counts (empty: none).
func intList(flagName, v string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(f) == "" && v == "" {
			break
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--%s: %q is not a count", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// podList is intList, ascending and at most 500 pods.
func podList(flagName, v string) ([]int, error) {
	ns, err := intList(flagName, v)
	if err != nil {
		return nil, err
	}
	if !slices.IsSorted(ns) || (len(ns) > 0 && (ns[0] < 1 || ns[len(ns)-1] > 500)) {
		return nil, fmt.Errorf("--%s %s: want ascending counts in [1, 500]", flagName, v)
	}
	return ns, nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func mib(kb int64) string { return strconv.FormatFloat(float64(kb)/1024, 'f', 1, 64) + " MB" }

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}
