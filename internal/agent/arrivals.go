package agent

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/tcpstate"
)

// arrivalCount accumulates drain.ArrivalsSince: a count, the first and
// last times and the longest gap. Bounded: nothing per connection.
type arrivalCount struct {
	mu    sync.Mutex
	start time.Time
	s     drain.ArrivalsSince
}

func (c *arrivalCount) reset(start time.Time) {
	c.mu.Lock()
	c.start, c.s = start, drain.ArrivalsSince{}
	c.mu.Unlock()
}

// add records n arrivals at t from peers of kind k
// (drain.ArrivalsSince.AddFrom).
func (c *arrivalCount) add(t time.Time, n int64, k drain.PeerKind) {
	c.mu.Lock()
	c.s.AddFrom(c.start, t, n, k)
	c.mu.Unlock()
}

func (c *arrivalCount) since() drain.ArrivalsSince {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}

// arrivalFilter says which of the tracker's changes are a new connection
// reaching the pod from outside it, and from what kind of peer. A probe is
// told by its target, never by its source: on a bridge CNI the node's side
// of the pod's link (its gateway) is also where every connection the node
// forwards with masquerade comes from (a NodePort, a ClusterIP reached from
// the node, a hostNetwork pod), and on a routed CNI (a link-local gateway)
// the kubelet's probes come from the node's own address.
type arrivalFilter struct {
	// traffic reports whether an inbound flow is on one of the pod's
	// inbound ports: Envoy's downstream flows (traffic listeners), and
	// the app's own accepted flows (its ports, without interception).
	traffic func(*flows.Flow) bool
	// probePorts are the local ports the kubelet's probes target and no
	// traffic does: draind's status port, Envoy's admin and Istio's
	// status ports (PodPolicy.ControlPorts), and --probe-ports.
	probePorts map[uint16]bool
	peers      peerKinds
}

// peerKinds tells the kind of a traffic peer, for the counts by kind.
type peerKinds struct {
	// node are the node's addresses as the pod sees them: its default
	// gateways and the node's own address (HOST_IP), when known.
	node []netip.Addr
	// podNets are the prefixes of the pod's own links (a /32 or /128,
	// as on a routed CNI, holds no other pod).
	podNets []netip.Prefix
}

func (k peerKinds) of(a netip.Addr) drain.PeerKind {
	if slices.Contains(k.node, a) {
		return drain.PeerNode
	}
	for _, p := range k.podNets {
		if p.Contains(a) {
			return drain.PeerPod
		}
	}
	return drain.PeerOther
}

// arrival reports whether c is a new inbound flow from outside the pod
// (newly established, from a peer that is neither loopback nor the pod
// itself) on a traffic or probe port, and from what kind of peer:
// drain.PeerProbe for a probe port's, whatever its source.
func (f arrivalFilter) arrival(c *flows.Change) (drain.PeerKind, bool) {
	if c.NewState != tcpstate.Established || c.OldState == tcpstate.Established || c.Flow.Direction != flows.DirInbound {
		return 0, false
	}
	remote := c.Flow.Remote.Addr().Unmap()
	switch {
	case !remote.IsValid(), remote.IsLoopback(), remote == c.Flow.Local.Addr().Unmap():
		return 0, false
	case f.probePorts[c.Flow.Local.Port()]:
		return drain.PeerProbe, true
	case !f.traffic(&c.Flow):
		return 0, false
	}
	return f.peers.of(remote), true
}

// podNets are the prefixes of addrs (the pod's interfaces' addresses)
// that can hold another address: loopback and host routes left out.
func podNets(addrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range addrs {
		if p.Addr().IsLoopback() || p.Addr().IsLinkLocalUnicast() || p.Bits() == p.Addr().BitLen() {
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// defaultGateways reads the gateways of the default routes from
// /proc/net/route and /proc/net/ipv6_route (of the reader's network
// namespace): where the kubelet's probes come from on most CNIs (the
// node's end of the pod's link).
func defaultGateways(route4, route6 io.Reader) []netip.Addr {
	var out []netip.Addr
	if route4 != nil {
		sc := bufio.NewScanner(route4)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			// Iface Destination Gateway Flags ...: little-endian hex.
			if len(f) < 3 || f[1] != "00000000" {
				continue
			}
			b, err := hex.DecodeString(f[2])
			if err != nil || len(b) != 4 {
				continue
			}
			if a := netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}); !a.IsUnspecified() {
				out = append(out, a)
			}
		}
	}
	if route6 != nil {
		sc := bufio.NewScanner(route6)
		for sc.Scan() {
			// dst dst_len src src_len nexthop metric ref use flags iface
			f := strings.Fields(sc.Text())
			if len(f) < 5 || f[1] != "00" || strings.Trim(f[0], "0") != "" {
				continue
			}
			b, err := hex.DecodeString(f[4])
			if err != nil || len(b) != 16 {
				continue
			}
			if a := netip.AddrFrom16([16]byte(b)); !a.IsUnspecified() {
				out = append(out, a)
			}
		}
	}
	return out
}

// passiveOpens reads Tcp: PassiveOpens from /proc/net/snmp's text: the
// connections the namespace accepted (SYN_RECV to ESTABLISHED), ever.
func passiveOpens(snmp io.Reader) (uint64, error) {
	sc := bufio.NewScanner(snmp)
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		i := slices.Index(names, "PassiveOpens")
		if i < 0 || i >= len(f) {
			break
		}
		return strconv.ParseUint(f[i], 10, 64)
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading tcp counters: %w", err)
	}
	return 0, errors.New("no Tcp: PassiveOpens counter")
}
