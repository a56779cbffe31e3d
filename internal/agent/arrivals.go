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

// add records n arrivals at t (drain.ArrivalsSince.Add).
func (c *arrivalCount) add(t time.Time, n int64) {
	c.mu.Lock()
	c.s.Add(c.start, t, n)
	c.mu.Unlock()
}

func (c *arrivalCount) since() drain.ArrivalsSince {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}

// arrivalFilter says which of the tracker's changes are a new connection
// reaching the pod from outside it.
type arrivalFilter struct {
	// traffic reports whether an inbound flow is on one of the pod's
	// inbound ports: Envoy's downstream flows (traffic listeners), and
	// the app's own accepted flows (its ports, without interception).
	traffic func(*flows.Flow) bool
	// probeSources are the addresses the kubelet's probes come from: the
	// pod's default gateways (the node's side of the pod's link).
	probeSources []netip.Addr
}

// arrival reports whether c is one: an inbound flow newly established on
// a traffic port, from a peer that is neither loopback, nor the pod
// itself, nor a probe source.
func (f arrivalFilter) arrival(c *flows.Change) bool {
	if c.NewState != tcpstate.Established || c.OldState == tcpstate.Established || c.Flow.Direction != flows.DirInbound {
		return false
	}
	remote := c.Flow.Remote.Addr().Unmap()
	switch {
	case !remote.IsValid(), remote.IsLoopback(), remote == c.Flow.Local.Addr().Unmap(), slices.Contains(f.probeSources, remote):
		return false
	}
	return f.traffic(&c.Flow)
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
