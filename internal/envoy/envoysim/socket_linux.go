//go:build linux

package envoysim

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// boundSocket is a TCP socket bound to its address but not yet listening,
// as Envoy's listen sockets are between listener creation and the start of
// the workers: the port is taken (and known, for port 0) while connections
// to it are still refused.
type boundSocket struct {
	fd   int
	addr netip.AddrPort
}

func bindSocket(ap netip.AddrPort) (*boundSocket, error) {
	family := syscall.AF_INET
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	fail := func(op string, err error) (*boundSocket, error) {
		syscall.Close(fd)
		return nil, fmt.Errorf("%s %v: %w", op, ap, err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return fail("setsockopt SO_REUSEADDR", err)
	}
	var sa syscall.Sockaddr
	if family == syscall.AF_INET6 {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1); err != nil {
			return fail("setsockopt IPV6_V6ONLY", err)
		}
		sa6 := &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
		if z := ap.Addr().Zone(); z != "" {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return fail("zone", err)
			}
			sa6.ZoneId = uint32(ifi.Index)
		}
		sa = sa6
	} else {
		sa = &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	actual := ap
	switch g := got.(type) {
	case *syscall.SockaddrInet4:
		actual = netip.AddrPortFrom(ap.Addr(), uint16(g.Port))
	case *syscall.SockaddrInet6:
		actual = netip.AddrPortFrom(ap.Addr(), uint16(g.Port))
	}
	return &boundSocket{fd: fd, addr: actual}, nil
}

// listen starts listening and hands the socket to the net package.
func (b *boundSocket) listen() (net.Listener, error) {
	if err := syscall.Listen(b.fd, syscall.SOMAXCONN); err != nil {
		b.close()
		return nil, fmt.Errorf("listen %v: %w", b.addr, err)
	}
	f := os.NewFile(uintptr(b.fd), "listener "+b.addr.String())
	b.fd = -1
	ln, err := net.FileListener(f) // dups the fd
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("listen %v: %w", b.addr, err)
	}
	return ln, nil
}

func (b *boundSocket) close() {
	if b.fd >= 0 {
		syscall.Close(b.fd)
		b.fd = -1
	}
}
