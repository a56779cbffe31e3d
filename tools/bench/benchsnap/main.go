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
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/nsrun"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func main() {
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
	childN := fs.Int("child", 0, "internal: run as a connection-holding child")
	childPort := fs.Int("port", 0, "internal: the child's listener port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *childN > 0 {
		return runChild(*childN, *childPort)
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
	env, err := newBenchNS(n)
	if err != nil {
		return err
	}
	defer env.close()
	ns, err := namespace.ByPID(env.anchor.Process.Pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	d, err := sockdiag.Dial(ns)
	if err != nil {
		return err
	}
	defer d.Close()
	// The last handshakes may still be settling when the children report.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := 0
		err := d.Each(sockdiag.Mask(sockdiag.Established), func(*sockdiag.Socket) { got++ })
		if err == nil && got >= 2*n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace has %d established sockets, want %d (%v)", got, 2*n, err)
		}
	}
	pid := strconv.Itoa(env.anchor.Process.Pid)
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
		{"`draind conns -o json` (process; with idle times, like ss -i)", env.command(draindBin, "conns", "--pid", pid, "-o", "json")},
		{"`draind conns -o json --idle=false` (process; same facts as ss -tan)", env.command(draindBin, "conns", "--pid", pid, "-o", "json", "--idle=false")},
		{"`ss -tan` (process)", env.command("ss", "-tan")},
		{"`ss -tani` (process)", env.command("ss", "-tani")},
		{"`ss -tlnp` (process)", env.command("ss", "-tlnp")},
		{"`netstat -plunt` (process)", env.command("netstat", "-plunt")},
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

// benchNS is a namespace holding n connections, with a process (anchor)
// living in it so that commands and /proc can address it by pid.
type benchNS struct {
	handle   netns.NsHandle
	anchor   *exec.Cmd
	children []child
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func newBenchNS(n int) (*benchNS, error) {
	b := &benchNS{}
	errc := make(chan error, 1)
	go func() {
		// This thread switches namespace and never switches back: it is
		// left locked so the runtime retires it when the goroutine ends.
		runtime.LockOSThread()
		h, err := netns.New()
		if err != nil {
			errc <- fmt.Errorf("create netns: %w", err)
			return
		}
		b.handle = h
		errc <- b.fill(n)
	}()
	if err := <-errc; err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// perChild bounds the connections one child holds: both ends are fds in
// it, and the machine's hard RLIMIT_NOFILE may be as low as 20000.
const perChild = 9000

// fill runs on the locked thread inside the namespace: children started
// here are born in it.
func (b *benchNS) fill(n int) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65000"), 0)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for i := 0; n > 0; i++ {
		k := min(n, perChild)
		n -= k
		cmd := exec.Command(self, "-child", strconv.Itoa(k), "-port", strconv.Itoa(65001+i))
		// No Pdeathsig: it fires when the forking thread ends, and this
		// one is retired with its namespace. Children exit when their
		// stdin closes, which our exit does too.
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start child: %w", err)
		}
		b.children = append(b.children, child{cmd, in})
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			return fmt.Errorf("child %d: %q %v", i, line, err)
		}
	}
	b.anchor = b.children[0].cmd
	return nil
}

// runChild holds k connections to its own listener until stdin closes.
func runChild(k, port int) error {
	rlim := unix.Rlimit{Cur: 20000, Max: 20000}
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rlim)
	rlim.Cur = rlim.Max
	unix.Setrlimit(unix.RLIMIT_NOFILE, &rlim)
	ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	var held []net.Conn
	done := make(chan error, 1)
	go func() {
		for range k {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			held = append(held, c)
		}
		done <- nil
	}()
	var dialed []net.Conn
	for i := range k {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		dialed = append(dialed, c)
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// command returns a measurement running name in the namespace (it is
// started from a thread inside it, so the child is born there).
func (b *benchNS) command(name string, args ...string) func() error {
	return func() error {
		return nsrun.Do(b.handle, func() error {
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

func (b *benchNS) close() {
	for _, c := range b.children {
		c.stdin.Close()
		c.cmd.Wait()
	}
	if b.handle != 0 {
		b.handle.Close()
	}
}
