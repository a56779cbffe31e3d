// Command benchsnap measures, in one run on one machine, what it costs to
// learn a namespace's TCP state: draind's listener check and full snapshot
// (in process and as `draind conns -o json`), against `ss -tan`,
// `ss -tlnp`, `netstat -plunt` and a parse of /proc/net/tcp{,6}. It builds
// a network namespace holding N established loopback connections for each
// N asked, and prints a Markdown table. Run as root: tools/bench/snapshot.sh.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/tools/bench/benchns"
)

func main() {
	benchns.ChildMain()
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchsnap:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("benchsnap", flag.ContinueOnError)
	sizes := fs.String("flows", "1000,10000,100000", "established connections per round (comma-separated)")
	draind := fs.String("draind", "bin/draind", "draind binary for the whole-process row")
	budget := fs.Duration("budget", 2*time.Second, "time spent on each measurement (at least 3 runs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("run as root (it creates a network namespace)")
	}
	fmt.Fprintf(stdout, "| connections (sockets) | method | median | p90 | runs |\n|---|---|---|---|---|\n")
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("--flows: %q: %w", f, err)
		}
		if err := round(ctx, stdout, n, *draind, *budget); err != nil {
			return err
		}
	}
	return nil
}

// round builds a namespace with n connections and measures every method.
func round(ctx context.Context, stdout io.Writer, n int, draindBin string, budget time.Duration) error {
	env, err := benchns.New()
	if err != nil {
		return err
	}
	defer env.Close()
	if err := env.Fill(n); err != nil {
		return err
	}
	d, err := env.DialSockDiag()
	if err != nil {
		return err
	}
	defer d.Close()
	pid := strconv.Itoa(env.Pid())
	cls := flows.NewClassifier(flows.DefaultPolicy())
	methods := []struct {
		name string
		fn   func() error
	}{
		{"draind listener check (in process)", func() error { _, err := d.Sockets(sockdiag.ListenMask); return err }},
		{"draind full snapshot + attribution (in process)", func() error {
			s, err := d.Sockets(sockdiag.AllStates)
			if err == nil {
				cls.Classify(s)
			}
			return err
		}},
		{"/proc/net/tcp{,6} parse (in process)", func() error { return parseProcNet("/proc/" + pid + "/net/") }},
		{"`draind conns -o json` (process; with idle times, like ss -i)", command(env, draindBin, "conns", "--pid", pid, "-o", "json")},
		{"`draind conns -o json --idle=false` (process; same facts as ss -tan)", command(env, draindBin, "conns", "--pid", pid, "-o", "json", "--idle=false")},
		{"`ss -tan` (process)", command(env, "ss", "-tan")},
		{"`ss -tani` (process)", command(env, "ss", "-tani")},
		{"`ss -tlnp` (process)", command(env, "ss", "-tlnp")},
		{"`netstat -plunt` (process)", command(env, "netstat", "-plunt")},
	}
	for _, m := range methods {
		samples, err := measure(ctx, m.fn, budget)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		slices.Sort(samples)
		fmt.Fprintf(stdout, "| %d (%d) | %s | %s | %s | %d |\n", n, 2*n, m.name,
			fmtDur(samples[len(samples)/2]), fmtDur(samples[len(samples)*9/10]), len(samples))
	}
	return nil
}

func fmtDur(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64) + " ms"
}

func measure(ctx context.Context, fn func() error, budget time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	start := time.Now()
	for len(out) < 3 || (time.Since(start) < budget && len(out) < 200) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// parseProcNet reads and parses every line of tcp and tcp6, as a
// /proc-based tool would.
func parseProcNet(dir string) error {
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(dir + f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			if _, err := strconv.ParseUint(fields[3], 16, 8); err != nil {
				fh.Close()
				return fmt.Errorf("%s: bad state %q", f, fields[3])
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	return nil
}

// command returns a measurement running name in the namespace (it is
// started from a thread inside it, so the child is born there).
func command(env *benchns.NS, name string, args ...string) func() error {
	return func() error {
		return env.Do(func() error {
			cmd := exec.Command(name, args...)
			cmd.Stdout = io.Discard
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s %v: %w: %s", name, args, err, stderr.String())
			}
			return nil
		})
	}
}
