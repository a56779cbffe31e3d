package envoy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ActiveFilter is the /stats filter ActiveDownstream sends. RE2 matches
// filters partially; the anchors make it exact: every listener-scoped
// downstream_cx_active gauge, per-worker ones included (SumActive drops them).
const ActiveFilter = `^listener\..*downstream_cx_active$`

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
	Total     uint64
	Listeners []ListenerActive // counted
	Excluded  []ListenerActive // left out by the ExcludeSet
}

// ActiveDownstream returns Envoy's active downstream connections, from
// /stats?usedonly&filter=ActiveFilter, summed by [SumActive].
//
// A listener that never took a connection has no gauge under usedonly, so
// no listener gauge at all is a total of 0. An empty answer is an error
// ([ErrMalformed]): the admin listener's gauge counts this very request's
// connection, so a healthy Envoy always returns at least that line.
func (c *Client) ActiveDownstream(ctx context.Context, exclude ExcludeSet) (ActiveConns, error) {
	stats, err := c.Stats(ctx, StatsQuery{UsedOnly: true, Filter: ActiveFilter})
	if err != nil {
		return ActiveConns{}, err
	}
	if len(stats) == 0 {
		return ActiveConns{}, fmt.Errorf("envoy admin: GET /stats: %w: empty answer, not even the admin listener's gauge", ErrMalformed)
	}
	return SumActive(stats, exclude), nil
}

// SumActive adds up listener.<name>.downstream_cx_active gauges. It skips
// the admin listener (listener.admin.*), per-worker duplicates
// (listener.<name>.worker_N.*), Envoy-internal listeners (envoy_internal in
// the name) and every other stat, and moves excluded listeners to Excluded.
func SumActive(stats []Stat, exclude ExcludeSet) ActiveConns {
	const prefix, suffix = "listener.", ".downstream_cx_active"
	var ac ActiveConns
	for _, s := range stats {
		if !strings.HasPrefix(s.Name, prefix) || !strings.HasSuffix(s.Name, suffix) ||
			len(s.Name) <= len(prefix)+len(suffix) {
			continue
		}
		name := s.Name[len(prefix) : len(s.Name)-len(suffix)]
		if name == "admin" || strings.HasPrefix(name, "admin.") ||
			strings.Contains(s.Name, "envoy_internal") || perThread(name) {
			continue
		}
		l := ListenerActive{Stat: s.Name, Listener: name, Active: s.Value}
		if ap, ok := ParseListenerAddr(name); ok {
			l.Addr, l.Port = ap, ap.Port()
		}
		if exclude.excludes(l) {
			ac.Excluded = append(ac.Excluded, l)
			continue
		}
		ac.Total += s.Value
		ac.Listeners = append(ac.Listeners, l)
	}
	byStat := func(a, b ListenerActive) int { return strings.Compare(a.Stat, b.Stat) }
	slices.SortStableFunc(ac.Listeners, byStat)
	slices.SortStableFunc(ac.Excluded, byStat)
	return ac
}

// perThread tells a per-thread scope: <name>.worker_N or <name>.main_thread.
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

// ParseListenerAddr parses the address form of a listener's stat name, as
// Envoy writes it (':' replaced by '_'): "0.0.0.0_15001", "[__]_15001",
// "[__1]_15090", "[__ffff_10.0.0.1]_80". It reports false for anything else
// (a stat_prefix).
func ParseListenerAddr(name string) (netip.AddrPort, bool) {
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
