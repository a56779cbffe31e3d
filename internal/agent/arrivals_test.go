package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/tcpstate"
)

func TestDefaultGateways(t *testing.T) {
	route4 := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
		"eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
		"eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	route6 := "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n" +
		"fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n"
	got := defaultGateways(strings.NewReader(route4), strings.NewReader(route6))
	want := []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fe80::1")}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("gateways %v, want %v", got, want)
	}
	if got := defaultGateways(nil, nil); len(got) != 0 {
		t.Fatalf("no tables: %v", got)
	}
}

// TestArrivalFilter: a connection counts by its target, from any peer but
// loopback and the pod itself; the kubelet's probes are known by the port
// they reach, whatever their source (the gateway on a bridge CNI, the
// node's address on a routed one).
func TestArrivalFilter(t *testing.T) {
	pod := netip.MustParseAddrPort("10.0.0.5:15006")
	gw := netip.MustParseAddr("10.0.0.1")
	linkLocalGW := netip.MustParseAddr("169.254.1.1")
	node := netip.MustParseAddr("192.168.1.10")
	f := arrivalFilter{
		traffic:    func(f *flows.Flow) bool { return f.Local.Port() == 15006 || f.Local.Port() == 8080 },
		probePorts: map[uint16]bool{15022: true, 15021: true, 8081: true},
		peers: peerKinds{
			node:    []netip.Addr{gw, linkLocalGW, node},
			podNets: podNets([]netip.Prefix{netip.MustParsePrefix("10.0.0.5/24"), netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("10.9.9.9/32")}),
		},
	}
	change := func(old, new tcpstate.State, dir flows.Direction, local, remote netip.AddrPort) *flows.Change {
		c := &flows.Change{OldState: old, NewState: new}
		c.Flow.Direction, c.Flow.Local, c.Flow.Remote = dir, local, remote
		return c
	}
	from := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 40000) }
	at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(pod.Addr(), port) }
	in, est, syn, closed := flows.DirInbound, tcpstate.Established, tcpstate.SynRecv, tcpstate.Close
	client := netip.MustParseAddrPort("10.0.0.7:40000")
	outside := netip.MustParseAddrPort("203.0.113.9:40000")
	const none drain.PeerKind = 0
	for _, tt := range []struct {
		name string
		c    *flows.Change
		want drain.PeerKind
	}{
		{"a pod on the bridge (eBPF)", change(syn, est, in, pod, client), drain.PeerPod},
		{"a new flow in a snapshot (sock_diag)", change(closed, est, in, pod, client), drain.PeerPod},
		{"v4-mapped client", change(syn, est, in, pod, netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.0.7"), 1)), drain.PeerPod},
		{"the node through a ClusterIP, masqueraded to the gateway", change(syn, est, in, pod, from(gw)), drain.PeerNode},
		{"a NodePort under externalTrafficPolicy Cluster: the gateway", change(syn, est, in, at(8080), from(gw)), drain.PeerNode},
		{"the node's own address (a routed CNI)", change(syn, est, in, pod, from(node)), drain.PeerNode},
		{"an outside client kept by externalTrafficPolicy Local", change(syn, est, in, pod, outside), drain.PeerOther},
		{"the kubelet's probe of draind, from the gateway", change(syn, est, in, at(15022), from(gw)), drain.PeerProbe},
		{"the kubelet's probe of draind, from the node (link-local gateway)", change(syn, est, in, at(15022), from(node)), drain.PeerProbe},
		{"the app's probe port (--probe-ports)", change(syn, est, in, at(8081), from(node)), drain.PeerProbe},
		{"Envoy's readiness listener", change(syn, est, in, at(15021), from(gw)), drain.PeerProbe},
		{"closing, not new", change(est, tcpstate.CloseWait, in, pod, client), none},
		{"outbound", change(tcpstate.SynSent, est, flows.DirOutbound, pod, client), none},
		{"loopback (Istio's inbound passthrough)", change(syn, est, in, pod, netip.MustParseAddrPort("127.0.0.6:5000")), none},
		{"the pod itself", change(syn, est, in, pod, netip.MustParseAddrPort("10.0.0.5:5000")), none},
		{"loopback to a probe port", change(syn, est, in, at(15022), netip.MustParseAddrPort("127.0.0.1:5000")), none},
		{"neither a traffic nor a probe port", change(syn, est, in, at(9999), client), none},
	} {
		got, ok := f.arrival(tt.c)
		if ok != (tt.want != none) || got != tt.want {
			t.Errorf("%s: %v %v, want %v", tt.name, got, ok, tt.want)
		}
	}
}

func TestPodNets(t *testing.T) {
	got := podNets([]netip.Prefix{
		netip.MustParsePrefix("10.0.0.5/24"),   // a bridge's pod
		netip.MustParsePrefix("10.1.2.3/32"),   // a routed CNI's pod: no neighbour
		netip.MustParsePrefix("127.0.0.1/8"),   // loopback
		netip.MustParsePrefix("fe80::1/64"),    // link-local
		netip.MustParsePrefix("fd00::5/64"),    // a dual-stack pod
		netip.MustParsePrefix("fd00:1::7/128"), // host route
	})
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	if !slices.Equal(got, want) {
		t.Fatalf("pod nets %v, want %v", got, want)
	}
}

func TestArrivalCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var c arrivalCount
	c.reset(t0)
	c.add(t0.Add(100*time.Millisecond), 1, drain.PeerPod)
	c.add(t0.Add(150*time.Millisecond), 0, drain.PeerPod)     // nothing
	c.add(t0.Add(400*time.Millisecond), 3, drain.PeerUnknown) // a counter's step
	c.add(t0.Add(300*time.Millisecond), 1, drain.PeerNode)    // stamped before the last: no negative gap
	c.add(t0.Add(900*time.Millisecond), 1, drain.PeerProbe)   // counted apart, not an arrival
	s := c.since()
	if s.Count != 5 || !s.First.Equal(t0.Add(100*time.Millisecond)) || !s.Last.Equal(t0.Add(400*time.Millisecond)) || s.MaxGap != 300*time.Millisecond {
		t.Fatalf("%+v", s)
	}
	if want := (drain.PeerCounts{Pod: 1, Node: 1, Unknown: 3, Probes: 1}); s.Peers != want {
		t.Fatalf("peers %+v, want %+v", s.Peers, want)
	}
}

func TestPassiveOpens(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n" +
		"Tcp: 1 200 120000 -1 23948 15637 1741 3422 0 915091 903820 1880 0 4399 0\n" +
		"Udp: InDatagrams\nUdp: 5\n"
	if n, err := passiveOpens(strings.NewReader(snmp)); err != nil || n != 15637 {
		t.Fatalf("got %d, %v", n, err)
	}
	for _, bad := range []string{"", "Tcp: RtoAlgorithm\nTcp: 1\n", "Tcp: PassiveOpens\nTcp: x\n"} {
		if n, err := passiveOpens(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: %d, want an error", bad, n)
		}
	}
}
