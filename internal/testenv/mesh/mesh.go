//go:build linux

// Package mesh puts a test's pod network namespace under Istio's sidecar
// interception, with Istio's own rule generator (`pilot-agent
// istio-iptables`, built by tools/peers/pilot-agent.sh) and Debian's
// iptables (nft backend), and gives tests the proxy's side of it: a
// TPROXY-capable listener, the original destination of a redirected
// connection, and the process attributes Istio's proxy container runs
// with. It serves tests only.
//
// With Redirect (Istio's default), inbound connections to any pod port are
// NATed to 15006 and outbound ones to 15001: the proxy's accepted sockets
// show those local ports. With TProxy, inbound connections reach a
// transparent listener on 15006 unchanged: the accepted socket's local
// address is the original destination (the app's port); outbound is still
// NATed to 15001. Connections of the proxy's uid (1337) are never
// intercepted. docs/interception.md has the rules and the kernel's view.
//
// # Skips and failures
//
// A test is skipped when pilot-agent has not been built (the message gives
// the command that builds it) or iptables is not installed, except under
// CI=true, where either absence fails it. Once both are present, any
// failure to install or remove the rules fails the test.
package mesh

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// Mode is Istio's interceptionMode (istio-iptables -m).
type Mode string

const (
	// Redirect NATs inbound connections to 15006 and outbound ones to 15001
	// (iptables REDIRECT): Istio's default.
	Redirect Mode = "REDIRECT"
	// TProxy diverts inbound connections to a transparent listener on 15006
	// without rewriting them (iptables TPROXY in the mangle table, policy
	// routing on fwmark 0x539); outbound is NATed to 15001 as with Redirect.
	TProxy Mode = "TPROXY"
)

// Istio's sidecar defaults, as its injector passes them to istio-iptables
// (manifests/charts/istio-control/istio-discovery/files/injection-template.yaml
// and the values it is rendered with).
const (
	ProxyUID            = 1337  // -u: the proxy's uid; its traffic is never intercepted
	ProxyGID            = 1337  // istio-iptables' default -g
	OutboundCapturePort = 15001 // -p: Envoy's virtualOutbound listener
	InboundCapturePort  = 15006 // -z: Envoy's virtualInbound listener
	TunnelPort          = 15008 // HBONE; istio-iptables always excludes it
	StatusPort          = 15020 // pilot-agent's status port, excluded by the injector
	HealthPort          = 15021 // Envoy's readiness port, excluded by the injector
	PrometheusPort      = 15090 // Envoy's Prometheus port, excluded by the injector
	TProxyMark          = 1337  // 0x539: istio-iptables' default --tproxy-mark
	TProxyRouteTable    = 133   // istio-iptables' default route table for TPROXY
)

// SidecarArgs are the arguments Istio's injector gives istio-iptables in
// the istio-init container with default values, for mode (checked against
// the injector's golden files, hello.yaml.injected and
// hello-tproxy.yaml.injected).
func SidecarArgs(mode Mode) []string {
	return []string{
		"-p", strconv.Itoa(OutboundCapturePort),
		"-z", strconv.Itoa(InboundCapturePort),
		"-u", strconv.Itoa(ProxyUID),
		"-m", string(mode),
		"-i", "*",
		"-x", "",
		"-b", "*",
		"-d", fmt.Sprintf("%d,%d,%d", PrometheusPort, HealthPort, StatusPort),
		"--log_output_level=default:info",
	}
}

// Option changes the interception, as a pod annotation would.
type Option func(*config)

type config struct {
	excludeInbound  []int
	excludeOutbound []int
}

// ExcludeInboundPorts adds ports to -d, as the annotation
// traffic.sidecar.istio.io/excludeInboundPorts does.
func ExcludeInboundPorts(ports ...int) Option {
	return func(c *config) { c.excludeInbound = append(c.excludeInbound, ports...) }
}

// ExcludeOutboundPorts sets -o, as traffic.sidecar.istio.io/excludeOutboundPorts.
func ExcludeOutboundPorts(ports ...int) Option {
	return func(c *config) { c.excludeOutbound = append(c.excludeOutbound, ports...) }
}

func (c *config) args(mode Mode) []string {
	args := SidecarArgs(mode)
	if len(c.excludeInbound) > 0 {
		i := slices.Index(args, "-d") + 1
		args[i] += "," + joinPorts(c.excludeInbound)
	}
	if len(c.excludeOutbound) > 0 {
		args = append(args, "-o", joinPorts(c.excludeOutbound))
	}
	return args
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// toolPath is the PATH pilot-agent runs with: it looks iptables up there.
const toolPath = "/usr/sbin:/usr/bin:/sbin:/bin"

// Interception is Istio's interception installed in one namespace.
type Interception struct {
	ns      *testutil.NetNS
	mode    Mode
	bin     string
	args    []string
	removed bool
}

// Intercept runs `pilot-agent istio-iptables` with Istio's sidecar
// arguments for mode inside ns, which must have a non-loopback IPv4 address
// (testutil.Link gives it one). The rules are removed when the test ends,
// or earlier by Remove. It fails the test when the rules cannot be
// installed or were not installed through iptables' nft backend.
//
// pilot-agent runs with a bare environment: istio-iptables reads many
// variables (INBOUND_INTERCEPTION_MODE, ISTIO_META_DNS_CAPTURE, ...), and
// the injector sets none of them by default.
func Intercept(tb testing.TB, ns *testutil.NetNS, mode Mode, opts ...Option) *Interception {
	tb.Helper()
	testutil.RequireRoot(tb)
	if mode != Redirect && mode != TProxy {
		tb.Fatalf("mesh: unknown interception mode %q", mode)
	}
	var c config
	for _, o := range opts {
		o(&c)
	}
	ic := &Interception{ns: ns, mode: mode, bin: PilotAgent(tb), args: c.args(mode)}
	RequireIptables(tb)
	tb.Cleanup(func() { ic.Remove(tb) })
	if out, err := ic.run(tb, ic.args...); err != nil {
		tb.Fatalf("mesh: pilot-agent istio-iptables %s: %v\n%s", strings.Join(ic.args, " "), err, out)
	}
	// istio-iptables picks legacy iptables when the namespace already has
	// legacy tables; a fresh namespace has none, and Remove relies on nft.
	if rules := ic.iptablesSave(tb); !strings.Contains(rules, "ISTIO_") {
		tb.Fatalf("mesh: no ISTIO_ chain in iptables-nft-save after istio-iptables (legacy backend chosen?):\n%s", rules)
	}
	return ic
}

// Mode is the interception mode.
func (ic *Interception) Mode() Mode { return ic.mode }

// Args are the arguments istio-iptables was run with.
func (ic *Interception) Args() []string { return slices.Clone(ic.args) }

// Rules is the namespace's iptables-nft-save output followed by its
// fwmark policy routing rules and the routes of table 133 (the TPROXY
// part), one a line.
func (ic *Interception) Rules(tb testing.TB) string {
	tb.Helper()
	var b strings.Builder
	b.WriteString(ic.iptablesSave(tb))
	err := withPolicyRouting(ic.ns, func(_ *netlink.Handle, rules []netlink.Rule, routes []netlink.Route) error {
		for _, r := range rules {
			fmt.Fprintf(&b, "ip rule: %d: from all fwmark %#x lookup %d\n", r.Priority, r.Mark, r.Table)
		}
		for _, r := range routes {
			fmt.Fprintf(&b, "ip route table %d: type %d dst %v scope %v dev index %d\n", r.Table, r.Type, r.Dst, r.Scope, r.LinkIndex)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("mesh: %v", err)
	}
	return b.String()
}

// Remove deletes the interception: istio-iptables --cleanup-only with the
// same arguments, then the TPROXY policy routing, which --cleanup-only
// leaves in place (in TPROXY mode it even adds a second copy of the ip
// rule). It fails the test if anything of it is left. Safe to call twice;
// Intercept registers it as a cleanup.
func (ic *Interception) Remove(tb testing.TB) {
	tb.Helper()
	if ic.removed {
		return
	}
	ic.removed = true
	// --force-iptables-binary nft: istio-iptables' own probe of the legacy
	// backend left an empty legacy nat table in the namespace, so its
	// autodetection would now pick legacy and remove nothing.
	args := append(ic.Args(), "--cleanup-only", "--force-iptables-binary", "nft")
	if out, err := ic.run(tb, args...); err != nil {
		tb.Errorf("mesh: pilot-agent istio-iptables --cleanup-only: %v\n%s", err, out)
	}
	if err := withPolicyRouting(ic.ns, removeTProxyRouting); err != nil {
		tb.Errorf("mesh: %v", err)
	}
	if rules := ic.Rules(tb); strings.Contains(rules, "ISTIO_") || strings.Contains(rules, "ip r") {
		tb.Errorf("mesh: interception left behind after removal:\n%s", rules)
	}
}

// withPolicyRouting calls fn with a netlink handle in ns, the IPv4 ip rules
// that match a fwmark and the routes of table 133.
func withPolicyRouting(ns *testutil.NetNS, fn func(*netlink.Handle, []netlink.Rule, []netlink.Route) error) error {
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	all, err := h.RuleList(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("list ip rules: %w", err)
	}
	var rules []netlink.Rule
	for _, r := range all {
		if r.Mark != 0 {
			rules = append(rules, r)
		}
	}
	routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: TProxyRouteTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list routes of table %d: %w", TProxyRouteTable, err)
	}
	return fn(h, rules, routes)
}

// removeTProxyRouting deletes every ip rule fwmark TProxyMark → table 133
// and the routes of table 133.
func removeTProxyRouting(h *netlink.Handle, rules []netlink.Rule, routes []netlink.Route) error {
	var errs []error
	for _, r := range rules {
		if r.Mark == TProxyMark && r.Table == TProxyRouteTable {
			if err := h.RuleDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("delete ip rule fwmark %#x: %w", r.Mark, err))
			}
		}
	}
	for _, r := range routes {
		if err := h.RouteDel(&r); err != nil {
			errs = append(errs, fmt.Errorf("delete route %v table %d: %w", r.Dst, TProxyRouteTable, err))
		}
	}
	return errors.Join(errs...)
}

// run runs `pilot-agent istio-iptables ARGS` in the namespace.
func (ic *Interception) run(tb testing.TB, args ...string) ([]byte, error) {
	tb.Helper()
	cmd := exec.Command(ic.bin, append([]string{"istio-iptables"}, args...)...)
	cmd.Env = []string{"PATH=" + toolPath}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var err error
	ic.ns.Do(tb, func() { err = cmd.Run() }) // born in the namespace, as istio-init is
	return out.Bytes(), err
}

func (ic *Interception) iptablesSave(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command("iptables-nft-save")
	cmd.Env = []string{"PATH=" + toolPath}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	var err error
	ic.ns.Do(tb, func() { err = cmd.Run() })
	if err != nil {
		tb.Fatalf("mesh: iptables-nft-save: %v\n%s", err, stderr.Bytes())
	}
	return out.String()
}

// RequireIptables skips the test unless Debian's iptables (nft backend:
// iptables-nft, iptables-nft-save, iptables-nft-restore) is installed; under
// CI=true it fails instead.
func RequireIptables(tb testing.TB) {
	tb.Helper()
	for _, name := range []string{"iptables", "iptables-nft", "iptables-nft-save", "iptables-nft-restore"} {
		if !onToolPath(name) {
			absent(tb, fmt.Sprintf("%s not found in %s: apt-get install iptables", name, toolPath))
		}
	}
}

func onToolPath(name string) bool {
	for dir := range strings.SplitSeq(toolPath, ":") {
		if st, err := os.Stat(dir + "/" + name); err == nil && st.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

// absent skips the test for a missing tool, or fails it under CI=true,
// where the CI script is expected to have installed everything.
func absent(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("mesh: %s (CI=true: a missing test peer is a failure)", msg)
	}
	tb.Skip("mesh: " + msg)
}
