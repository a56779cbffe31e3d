package envoy

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// activeFilter is the /stats filter of ActiveDownstream and
// DownstreamGauges. RE2 matches filters partially; the anchors make it
// exact: every listener-scoped downstream_cx_active gauge, per-worker ones
// included (they are left out of the sum).
const activeFilter = `^listener\..*downstream_cx_active$`

// ExcludeSet names listeners whose connections do not hold a drain: the
// status and metrics listeners (15021, 15090) and the like.
type ExcludeSet struct {
	// Ports are matched against the port of address-named listeners, in
	// every form: 0.0.0.0_15021, 127.0.0.1_15090, [__]_15021, [__1]_15090.
	Ports []uint16
	// Names are matched against the listener part of the stat name as it
	// is: a stat_prefix ("virtualInbound") or an address ("0.0.0.0_15021").
	Names []string
}

// DefaultExclude is Istio's: pilot-agent's status port 15020, Envoy's
// readiness listener 15021 and its Prometheus listener 15090.
func DefaultExclude() ExcludeSet { return ExcludeSet{Ports: []uint16{15020, 15021, 15090}} }

func (e ExcludeSet) excludes(l ListenerActive) bool {
	if l.Port != 0 && slices.Contains(e.Ports, l.Port) {
		return true
	}
	return slices.Contains(e.Names, l.Listener)
}

// ListenerActive is one listener's downstream_cx_active.
type ListenerActive struct {
	Stat     string         // the full stat name
	Listener string         // the listener part: "0.0.0.0_15006", "[__]_15006", "virtualOutbound"
	Addr     netip.AddrPort // the address parsed from Listener; invalid for a stat_prefix
	Port     uint16         // Addr's port; 0 for a stat_prefix
	Active   uint64
}

// ActiveConns is the sum of active downstream connections, and what it is
// made of, sorted by stat name.
type ActiveConns struct {
	// Total is the sum over Listeners.
	Total uint64
	// Gauges is how many listener gauges were summed (len(Listeners)).
	// Zero gauges is not zero connections: Envoy may expose no
	// downstream_cx_active gauge at all (Istio's default stats_matcher),
	// or, under usedonly, none for listeners that never took a
	// connection. [Client.DownstreamGauges] tells the two apart.
	Gauges int
	// Listeners are the gauges counted.
	Listeners []ListenerActive
	// Excluded are the gauges left out by the ExcludeSet.
	Excluded []ListenerActive
}

// ActiveDownstream returns Envoy's active downstream connections, from
// GET /stats?usedonly&filter=^listener\..*downstream_cx_active$: the sum of
// listener.<name>.downstream_cx_active over traffic listeners, leaving out
// the admin listener, per-worker duplicates (listener.<name>.worker_N...),
// Envoy-internal listeners and the client's ExcludeSet ([WithExclude]).
//
// An answer with no gauge is a total of 0 over 0 gauges, not an error: a
// listener that never took a connection has no gauge under usedonly, and a
// stats_matcher may drop them all (then even the admin listener's gauge,
// which counts this very request, is missing: the answer is empty).
func (c *Client) ActiveDownstream(ctx context.Context) (ActiveConns, error) {
	stats, err := c.stats(ctx, activeFilter, true)
	if err != nil {
		return ActiveConns{}, err
	}
	return sumActive(stats, c.Exclude()), nil
}

// DownstreamGauges tells whether Envoy exposes downstream_cx_active gauges
// for its traffic listeners at all. It asks GET /stats without usedonly
// (so that listeners that never took a connection show their gauge) and
// reports true when at least one gauge ActiveDownstream would count is
// there. False means ActiveDownstream can only ever say 0: a stats_matcher
// (Istio's default, without EXIT_ON_ZERO_ACTIVE_CONNECTIONS) drops the
// gauges, or no traffic listener exists.
func (c *Client) DownstreamGauges(ctx context.Context) (present bool, err error) {
	stats, err := c.stats(ctx, activeFilter, false)
	if err != nil {
		return false, err
	}
	return len(sumActive(stats, c.Exclude()).Listeners) > 0, nil
}

// totalFilter is ArrivalTotal's /stats filter: every listener-scoped
// downstream_cx_total counter.
const totalFilter = `^listener\..*downstream_cx_total$`

// ArrivalTotal returns the connections Envoy's traffic listeners that a
// connection from outside the pod can reach have accepted since it
// started: the sum of listener.<name>.downstream_cx_total over the
// listeners ActiveDownstream sums (without usedonly: a listener that never
// took one shows 0), less those bound to loopback (an outbound listener
// the app dials directly) and those outbound names (where interception
// sends the app's own calls: Istio's 15001, virtualOutbound). Counters is
// how many traffic listeners' counters exist, those left out included: 0
// means Envoy keeps none (a stats_matcher drops them), not that none came.
func (c *Client) ArrivalTotal(ctx context.Context, outbound ExcludeSet) (total uint64, counters int, err error) {
	stats, err := c.stats(ctx, totalFilter, false)
	if err != nil {
		return 0, 0, err
	}
	ac := sumListeners(stats, ".downstream_cx_total", c.Exclude())
	for _, l := range ac.Listeners {
		if l.Addr.IsValid() && l.Addr.Addr().IsLoopback() || outbound.excludes(l) {
			continue
		}
		total += l.Active
	}
	return total, len(ac.Listeners), nil
}

// IstioOutbound is Istio's outbound capture listener: the port its
// iptables rules send the app's calls to, and the listener's name.
func IstioOutbound() ExcludeSet {
	return ExcludeSet{Ports: []uint16{15001}, Names: []string{"virtualOutbound"}}
}

// sumActive adds up listener.<name>.downstream_cx_active gauges. It skips
// the admin listener (listener.admin.*), per-worker duplicates
// (listener.<name>.worker_N.*), Envoy-internal listeners (envoy_internal in
// the name) and every other stat, and moves excluded listeners to Excluded.
func sumActive(stats []stat, exclude ExcludeSet) ActiveConns {
	return sumListeners(stats, ".downstream_cx_active", exclude)
}

// sumListeners is sumActive for any listener stat ending in suffix.
func sumListeners(stats []stat, suffix string, exclude ExcludeSet) ActiveConns {
	const prefix = "listener."
	var ac ActiveConns
	for _, s := range stats {
		if !strings.HasPrefix(s.name, prefix) || !strings.HasSuffix(s.name, suffix) ||
			len(s.name) <= len(prefix)+len(suffix) {
			continue
		}
		name := s.name[len(prefix) : len(s.name)-len(suffix)]
		if name == "admin" || strings.HasPrefix(name, "admin.") ||
			strings.Contains(s.name, "envoy_internal") || perThread(name) {
			continue
		}
		l := ListenerActive{Stat: s.name, Listener: name, Active: s.value}
		if ap, ok := parseListenerAddr(name); ok {
			l.Addr, l.Port = ap, ap.Port()
		}
		if exclude.excludes(l) {
			ac.Excluded = append(ac.Excluded, l)
			continue
		}
		ac.Listeners = append(ac.Listeners, l)
		ac.Total += l.Active
	}
	byStat := func(a, b ListenerActive) int { return strings.Compare(a.Stat, b.Stat) }
	slices.SortFunc(ac.Listeners, byStat)
	slices.SortFunc(ac.Excluded, byStat)
	ac.Gauges = len(ac.Listeners)
	return ac
}

// perThread tells whether a listener part ends in a per-thread scope:
// "<addr>.worker_<N>" or "<addr>.main_thread".
func perThread(name string) bool {
	dot := strings.LastIndexByte(name, '.')
	if dot < 0 {
		return false
	}
	last := name[dot+1:]
	if last == "main_thread" {
		return true
	}
	n, ok := strings.CutPrefix(last, "worker_")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 32)
	return err == nil
}

// parseListenerAddr parses the address form of a listener's stat name, as
// Envoy writes it (':' replaced by '_'): "0.0.0.0_15001", "[__]_15001",
// "[__1]_15090", "[__ffff_10.0.0.1]_80". It reports false for anything else
// (a stat_prefix).
func parseListenerAddr(name string) (netip.AddrPort, bool) {
	us := strings.LastIndexByte(name, '_')
	if us <= 0 || us == len(name)-1 {
		return netip.AddrPort{}, false
	}
	host, portStr := name[:us], name[us+1:]
	for _, c := range portStr {
		if c < '0' || c > '9' {
			return netip.AddrPort{}, false
		}
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	var ip netip.Addr
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		ip, err = netip.ParseAddr(strings.ReplaceAll(host[1:len(host)-1], "_", ":"))
		if err != nil || !ip.Is6() {
			return netip.AddrPort{}, false
		}
	} else {
		ip, err = netip.ParseAddr(host)
		if err != nil || !ip.Is4() {
			return netip.AddrPort{}, false
		}
	}
	return netip.AddrPortFrom(ip, uint16(port)), true
}
