package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/sockdiag"
)

// nsFlags are the namespace-targeting and attribution flags shared by
// conns, watch and prestop.
type nsFlags struct {
	netns       string
	pid         int
	proxyUID    uint
	proxyPorts  portList
	idleTimeout time.Duration
	// The pod's control plane (with a target: conns, watch, prestop).
	adminAddr, statusAddr string
	exclude               portList
	// caps is what parse's raiseFileCaps did, for the command to report.
	caps capsRaise
	// --pod and --container (conns, watch: registerPod), and the pod
	// openTarget found.
	pod, container string
	cri            criFlags
	target         *podTarget
}

func (n *nsFlags) register(fs *flagSet, withTarget bool) {
	if withTarget {
		fs.StringVar(&n.netns, "netns", "", "network namespace file to look into (e.g. /run/netns/NAME)")
		fs.IntVar(&n.pid, "pid", 0, "look into the network namespace of this process")
		// draind run's own: its status server and Envoy's admin API are the
		// pod's control plane, not traffic (the same settings and variables
		// as run's).
		fs.StringVar(&n.adminAddr, "admin-addr", agent.DefaultAdminAddr, "Envoy's admin API in the pod (its flows are control traffic)")
		fs.StringVar(&n.statusAddr, "status-addr", agent.DefaultStatusAddr, "draind run's status server in the pod (its flows are control traffic)")
	}
	n.exclude = portList(envoy.DefaultExclude().Ports)
	fs.Var(&n.exclude, "exclude-ports", "Envoy listener ports that carry no traffic (status, metrics)")
	fs.UintVar(&n.proxyUID, "proxy-uid", flows.DefaultProxyUID, "uid whose sockets are the proxy's")
	fs.Var(&n.proxyPorts, "proxy-ports", "extra ports whose sockets are the proxy's (comma-separated)")
	fs.durationVar(&n.idleTimeout, "idle-timeout", 0, "a flow idle longer than this stops holding the drain (0: off)")
}

// parse parses a command's flags and variables, makes the image's file
// capabilities effective, and checks the namespace flags.
func (n *nsFlags) parse(fs *flagSet, args []string) error {
	if err := fs.parse(args); err != nil {
		return err
	}
	n.caps = raiseFileCaps()
	return n.validate(fs.Name())
}

// helped turns the help request a parse reports into success.
func helped(err error) error {
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

// trackerFlag is --tracker: how sockets are followed.
func trackerFlag(fs *flagSet) *oneOf[flows.TrackerMode] {
	t := newOneOf(flows.ModeAuto, flows.TrackerModes)
	fs.Var(t, "tracker", "how sockets are followed: "+t.choices())
	return t
}

func (n *nsFlags) validate(cmd string) error {
	if n.netns != "" && n.pid != 0 {
		return usageErr("%s: --netns and --pid are exclusive", cmd)
	}
	if err := n.validatePod(cmd); err != nil {
		return err
	}
	if n.proxyUID > 1<<32-1 {
		return usageErr("%s: --proxy-uid %d is not a uid", cmd, n.proxyUID)
	}
	if n.idleTimeout < 0 {
		return usageErr("%s: --idle-timeout must not be negative", cmd)
	}
	for _, a := range []struct{ flag, v string }{{"admin-addr", n.adminAddr}, {"status-addr", n.statusAddr}} {
		if _, _, err := agent.SplitHostPort(a.v); a.v != "" && err != nil {
			return usageErr("%s: --%s %q: %v", cmd, a.flag, a.v, err)
		}
	}
	return nil
}

func (n *nsFlags) open() (*namespace.Net, error) {
	switch {
	case n.netns != "":
		return namespace.Open(n.netns)
	case n.pid != 0:
		return namespace.ByPID(n.pid)
	}
	return namespace.Current()
}

// policy is the pod's attribution policy these flags describe
// (validate checked the addresses).
func (n *nsFlags) policy() flows.Policy {
	p := agent.PodPolicy{ProxyUID: uint32(n.proxyUID), ProxyPorts: n.proxyPorts, ExcludePorts: n.exclude, IdleTimeout: n.idleTimeout}
	p.SetAddrs(n.adminAddr, n.statusAddr)
	return p.Flows()
}

func runConns(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("conns", "conns [--netns PATH | --pid PID | --pod NAMESPACE/NAME [--container NAME]] [--proxy-uid N] [-o table|json]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	nf.registerPod(fs)
	out := newOneOf(outputTable, outputFormats)
	fs.Var(out, "o", "output format: table (sorted by owner and address) or json (streamed in the kernel's order as it is read, summary last)")
	withProcs := fs.Bool("procs", false, "also list the app's processes in the namespace (eBPF task iterator, else /proc)")
	withIdle := fs.Bool("idle", true, "read each flow's idle time (tcp_info; most of the cost of a large dump)")
	if err := nf.parse(fs, args); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageErr("conns: unexpected argument %q", fs.Arg(0))
	}
	nf.caps.warn(stderr, "conns")
	ns, err := nf.openTarget(ctx, "conns")
	if err != nil {
		return err
	}
	defer ns.Close()
	d, err := sockdiag.Dial(ns)
	if err != nil {
		return err
	}
	defer d.Close()
	d.SetInfo(*withIdle || nf.idleTimeout > 0)
	if out.val == outputJSON {
		var extra []byte
		if nf.target != nil {
			extra = nf.target.jsonMembers()
		}
		if *withProcs {
			extra = append(extra, procsJSON(ns, uint32(nf.proxyUID))...)
		}
		return streamJSON(stdout, d, nf.label(ns), nf.policy(), extra)
	}
	if nf.target != nil {
		fmt.Fprintf(stdout, "%s: %s\n", printable(nf.target.label()), nf.target.criLine())
	}
	if err := writeTable(stdout, d, nf.label(ns), nf.policy()); err != nil || !*withProcs {
		return err
	}
	procs, source, err := appProcesses(ns, uint32(nf.proxyUID))
	if err != nil {
		_, err = fmt.Fprintf(stdout, "app processes: not visible (%s)\n", printable(err.Error()))
		return err
	}
	return writeProcs(stdout, procs, source)
}

// eachFlow reads the namespace's sockets, attributed and counted: the
// listeners first (a LISTEN-only dump, which the kernel answers from its
// listening hash alone; the flows' directions depend on them), then the
// rest in a second dump, each handed to listener or flow as it is decoded.
// A listener opened between the two dumps is missed, as it would be by a
// single dump that had already walked the listening hash (the kernel
// walks it first).
func eachFlow(d *sockdiag.Conn, p flows.Policy, listener, flow func(*flows.Flow)) (flows.Summary, error) {
	var sum flows.Summary
	socks, err := d.Sockets(sockdiag.ListenMask)
	if err != nil {
		return sum, err
	}
	cls := flows.NewClassifier(p)
	for i := range socks {
		cls.AddListener(&socks[i])
	}
	for i := range socks {
		f := cls.Flow(&socks[i])
		sum.Count(&f)
		listener(&f)
	}
	// One Flow for the whole dump: handed to flow by pointer, a Flow per
	// socket would be a heap allocation per socket.
	var f flows.Flow
	err = d.Each(sockdiag.AllStates&^sockdiag.ListenMask, func(s *sockdiag.Socket) {
		f = cls.Flow(s)
		sum.Count(&f)
		flow(&f)
	})
	return sum, err
}

// streamJSON writes the namespace's sockets as JSON while the kernel's
// dump is read: one buffer, whatever the number of sockets. Its output
// cannot be taken back: if the kernel interrupted the dump (sockets may
// be missing or repeated), the JSON is complete and an error says so.
func streamJSON(w io.Writer, d *sockdiag.Conn, namespace string, p flows.Policy, extra []byte) error {
	j := NewJSONWriter(w, time.Now(), namespace)
	sum, err := eachFlow(d, p, j.Listener, j.Flow)
	if err != nil && !errors.Is(err, sockdiag.ErrDumpInterrupted) {
		return err
	}
	if werr := j.End(&sum, extra); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("%w: sockets may be missing or repeated in this output; run again", err)
	}
	return nil
}

// writeTable writes the namespace's sockets as a sorted table. It must
// hold them all to sort them, packed (TableWriter), and reads the dump
// again when the kernel interrupted it.
func writeTable(w io.Writer, d *sockdiag.Conn, namespace string, p flows.Policy) error {
	var t TableWriter
	for range 5 {
		t.Reset()
		sum, err := eachFlow(d, p, t.Add, t.Add)
		if errors.Is(err, sockdiag.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return err
		}
		return t.End(w, namespace, &sum)
	}
	return fmt.Errorf("%w five times in a row", sockdiag.ErrDumpInterrupted)
}

// procsJSON is the app's processes as more members of conns' JSON object.
func procsJSON(ns *namespace.Net, proxyUID uint32) []byte {
	procs, source, err := appProcesses(ns, proxyUID)
	v := struct {
		AppProcesses []appprocs.Process `json:"app_processes"`
		ProcSource   string             `json:"app_process_source"`
	}{procs, source}
	if err != nil {
		v.ProcSource = "unavailable: " + err.Error()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	b[0] = ',' // {"app_processes":...} → ,"app_processes":...
	return b[:len(b)-1]
}

// appProcesses lists the app's processes in ns once (draind and the proxy
// uid excluded, and the pause process by its rule).
func appProcesses(ns *namespace.Net, proxyUID uint32) ([]appprocs.Process, string, error) {
	src, reason, err := appprocs.Open(ns.Inode(), appprocs.Rules{ProxyUID: proxyUID}, appprocs.ModeAuto)
	if err != nil {
		return nil, "", err
	}
	defer src.Close()
	return src.Processes(), src.Kind().String() + ": " + reason, nil
}

func writeProcs(w io.Writer, procs []appprocs.Process, source string) error {
	fmt.Fprintf(w, "\napp processes (%s): %d\n", printable(source), len(procs))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tPPID\tUID\tCOMM")
	for _, p := range procs {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", p.PID, p.PPID, p.UID, cell(p.Comm, commWidth))
	}
	return tw.Flush()
}
