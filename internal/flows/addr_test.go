package flows

import (
	"net/netip"
	"testing"
)

// The codec round-trips every kind, and orders packed addresses as
// netip.AddrPort.Compare orders them.
func TestPackedAddr(t *testing.T) {
	aps := []netip.AddrPort{
		{},
		netip.MustParseAddrPort("0.0.0.0:0"),
		netip.MustParseAddrPort("10.0.0.1:80"),
		netip.MustParseAddrPort("10.0.0.1:8080"),
		netip.MustParseAddrPort("127.0.0.1:80"),
		netip.MustParseAddrPort("[::]:80"),
		netip.MustParseAddrPort("[::1]:80"),
		netip.MustParseAddrPort("[::ffff:10.0.0.1]:80"),
		netip.MustParseAddrPort("[fe80::1]:443"),
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	for _, a := range aps {
		var pa [16]byte
		for i := range pa {
			pa[i] = 0xff // what a reused slot held
		}
		ka := PackAddr(&pa, a)
		if got := UnpackAddr(&pa, ka, a.Port()); got != a && (a.Addr().IsValid() || got.Addr().IsValid()) {
			t.Errorf("%v: unpacked %v", a, got)
		}
		for _, b := range aps {
			var pb [16]byte
			kb := PackAddr(&pb, b)
			if got, want := sign(ComparePacked(ka, &pa, a.Port(), kb, &pb, b.Port())), sign(a.Compare(b)); got != want {
				t.Errorf("compare %v %v: %d, want %d", a, b, got, want)
			}
		}
	}
}
