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
//	footprint standin  (internal) that proxy, for both agents alike
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
		return errors.New("usage: footprint rss|conns|startup [flags]")
	}
	if args[0] == "standin" {
		return standin()
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
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var ns []int
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("--flows: %q: %w", f, err)
		}
		ns = append(ns, n)
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
	}
	return fmt.Errorf("unknown measurement %q", args[0])
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func mib(kb int64) string { return strconv.FormatFloat(float64(kb)/1024, 'f', 1, 64) + " MB" }

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}
