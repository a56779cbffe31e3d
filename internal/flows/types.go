package flows

import (
	"net/netip"
)

// Owner says whose a socket is.
type Owner uint8

const (
	OwnerApp Owner = iota
	OwnerProxy
)

func (o Owner) String() string {
	if o == OwnerProxy {
		return "proxy"
	}
	return "app"
}

// MarshalText makes owners read as names in JSON.
func (o Owner) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Direction classifies a socket relative to its owner's listeners.
type Direction uint8

const (
	DirListen Direction = iota
	DirInbound
	DirOutbound
)

func (d Direction) String() string {
	switch d {
	case DirListen:
		return "listen"
	case DirInbound:
		return "inbound"
	default:
		return "outbound"
	}
}

// MarshalText makes directions read as names in JSON.
func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
