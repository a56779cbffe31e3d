package flows

import (
	"bytes"
	"net/netip"
)

// The packed address codec: an address in 16 bytes and a 2-bit kind, with
// no pointer, for tables that hold many sockets (FlowTable's records, the
// rows of draind conns' table). Zones are not kept (the kernel reports
// none).

// Address kinds: an address is invalid, IPv4 (in the first 4 bytes) or
// IPv6. Their order is netip's (AddrPort.Compare).
const (
	AddrNone uint8 = iota
	Addr4
	Addr6
)

// PackAddr stores ap's address in a and returns its kind.
func PackAddr(a *[16]byte, ap netip.AddrPort) uint8 {
	addr := ap.Addr()
	switch {
	case addr.Is4():
		*a = [16]byte{}
		b := addr.As4()
		copy(a[:4], b[:])
		return Addr4
	case addr.IsValid():
		*a = addr.As16()
		return Addr6
	}
	*a = [16]byte{}
	return AddrNone
}

// UnpackAddr is the address PackAddr packed, with port.
func UnpackAddr(a *[16]byte, kind uint8, port uint16) netip.AddrPort {
	switch kind {
	case Addr4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(a[:4])), port)
	case Addr6:
		return netip.AddrPortFrom(netip.AddrFrom16(*a), port)
	}
	return netip.AddrPortFrom(netip.Addr{}, port)
}

// ComparePacked orders packed addresses and their ports as
// netip.AddrPort.Compare orders them unpacked: invalid, then IPv4, then
// IPv6, then by bytes, then by port.
func ComparePacked(ka uint8, a *[16]byte, pa uint16, kb uint8, b *[16]byte, pb uint16) int {
	if ka != kb {
		return int(ka) - int(kb)
	}
	n := 16
	if ka == Addr4 {
		n = 4
	}
	if c := bytes.Compare(a[:n], b[:n]); c != 0 {
		return c
	}
	return int(pa) - int(pb)
}
