//go:build !linux

package envoysim

import (
	"errors"
	"net"
	"net/netip"
)

// boundSocket, off Linux, listens at once: connections before LIVE wait in
// the backlog instead of being refused.
type boundSocket struct {
	ln   net.Listener
	addr netip.AddrPort
}

func bindSocket(ap netip.AddrPort, transparent bool) (*boundSocket, error) {
	if transparent {
		return nil, errors.New("transparent listeners need Linux")
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, err
	}
	actual := ap
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		actual = netip.AddrPortFrom(ap.Addr(), uint16(ta.Port))
	}
	return &boundSocket{ln: ln, addr: actual}, nil
}

func (b *boundSocket) listen() (net.Listener, error) {
	ln := b.ln
	b.ln = nil
	return ln, nil
}

func (b *boundSocket) close() {
	if b.ln != nil {
		b.ln.Close()
		b.ln = nil
	}
}

// originalDst is the accepted socket's local address off Linux.
func originalDst(c net.Conn) netip.AddrPort {
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
