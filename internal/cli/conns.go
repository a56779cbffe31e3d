package cli

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/draind/draind/internal/conntrack"
)

// nsFlags are the namespace-targeting and attribution flags shared by
// conns, watch and prestop.
type nsFlags struct {
	netns       string
	pid         int
	proxyUID    uint
	proxyPorts  portList
	idleTimeout time.Duration
}

func (n *nsFlags) register(fs *flagSet, withTarget bool) {
	if withTarget {
		fs.StringVar(&n.netns, "netns", "", "network namespace file to look into (e.g. /run/netns/NAME)")
		fs.IntVar(&n.pid, "pid", 0, "look into the network namespace of this process")
	}
	fs.UintVar(&n.proxyUID, "proxy-uid", conntrack.DefaultProxyUID, "uid whose sockets are the proxy's")
	fs.Var(&n.proxyPorts, "proxy-ports", "extra ports whose sockets are the proxy's (comma-separated)")
	fs.durationVar(&n.idleTimeout, "idle-timeout", 0, "a flow idle longer than this stops holding the drain (0: off)")
}

func (n *nsFlags) validate(cmd string) error {
	if n.netns != "" && n.pid != 0 {
		return usageErr("%s: --netns and --pid are exclusive", cmd)
	}
	if n.proxyUID > 1<<32-1 {
		return usageErr("%s: --proxy-uid %d is not a uid", cmd, n.proxyUID)
	}
	if n.idleTimeout < 0 {
		return usageErr("%s: --idle-timeout must not be negative", cmd)
	}
	return nil
}

func (n *nsFlags) open() (*conntrack.NetNS, error) {
	switch {
	case n.netns != "":
		return conntrack.OpenNetNS(n.netns)
	case n.pid != 0:
		return conntrack.OpenNetNSByPID(n.pid)
	}
	return conntrack.CurrentNetNS()
}

func (n *nsFlags) policy() conntrack.Policy {
	return conntrack.Policy{ProxyUID: uint32(n.proxyUID), ProxyPorts: n.proxyPorts, IdleTimeout: n.idleTimeout}
}

func runConns(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("conns", "conns [--netns PATH | --pid PID] [--proxy-uid N] [-o table|json]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	out := &oneOf{val: "table", words: []string{"table", "json"}}
	fs.Var(out, "o", "output format: table|json")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if err := nf.validate("conns"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("conns: unexpected argument %q", fs.Arg(0))
	}
	ns, err := nf.open()
	if err != nil {
		return err
	}
	defer ns.Close()
	d, err := conntrack.DialDiag(ns)
	if err != nil {
		return err
	}
	defer d.Close()
	socks, err := d.Sockets(conntrack.AllStates)
	if err != nil {
		return err
	}
	snap := conntrack.NewClassifier(nf.policy()).Classify(socks)
	snap.Taken = time.Now()
	snap.Namespace = ns.Name()
	if out.val == "json" {
		_, err := stdout.Write(conntrack.AppendJSON(make([]byte, 0, 256*(len(socks)+1)), &snap))
		return err
	}
	return conntrack.WriteTable(stdout, &snap)
}
