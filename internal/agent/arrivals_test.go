package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

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

func TestArrivalFilter(t *testing.T) {
	pod := netip.MustParseAddrPort("10.0.0.5:15006")
	client := netip.MustParseAddrPort("10.0.1.7:40000")
	f := arrivalFilter{
		traffic:      func(f *flows.Flow) bool { return f.Local.Port() == 15006 },
		probeSources: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
	}
	change := func(old, new tcpstate.State, dir flows.Direction, local, remote netip.AddrPort) *flows.Change {
		c := &flows.Change{OldState: old, NewState: new}
		c.Flow.Direction, c.Flow.Local, c.Flow.Remote = dir, local, remote
		return c
	}
	in, est, syn, closed := flows.DirInbound, tcpstate.Established, tcpstate.SynRecv, tcpstate.Close
	for _, tt := range []struct {
		name string
		c    *flows.Change
		want bool
	}{
		{"a client's passive open (eBPF)", change(syn, est, in, pod, client), true},
		{"a new flow in a snapshot (sock_diag)", change(closed, est, in, pod, client), true},
		{"v4-mapped client", change(syn, est, in, pod, netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.1.7"), 1)), true},
		{"closing, not new", change(est, tcpstate.CloseWait, in, pod, client), false},
		{"outbound", change(tcpstate.SynSent, est, flows.DirOutbound, pod, client), false},
		{"loopback", change(syn, est, in, pod, netip.MustParseAddrPort("127.0.0.6:5000")), false},
		{"the pod itself", change(syn, est, in, pod, netip.MustParseAddrPort("10.0.0.5:5000")), false},
		{"the kubelet's probe", change(syn, est, in, netip.MustParseAddrPort("10.0.0.5:15006"), netip.MustParseAddrPort("10.0.0.1:5000")), false},
		{"not a traffic port", change(syn, est, in, netip.MustParseAddrPort("10.0.0.5:15020"), client), false},
	} {
		if got := f.arrival(tt.c); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestArrivalCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var c arrivalCount
	c.reset(t0)
	c.add(t0.Add(100*time.Millisecond), 1)
	c.add(t0.Add(150*time.Millisecond), 0) // nothing
	c.add(t0.Add(400*time.Millisecond), 3) // a counter's step
	c.add(t0.Add(300*time.Millisecond), 1) // stamped before the last: no negative gap
	s := c.since()
	if s.Count != 5 || !s.First.Equal(t0.Add(100*time.Millisecond)) || !s.Last.Equal(t0.Add(400*time.Millisecond)) || s.MaxGap != 300*time.Millisecond {
		t.Fatalf("%+v", s)
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
