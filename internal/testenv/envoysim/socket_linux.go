//go:build linux

package envoysim

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// boundSocket is a TCP socket bound to its address but not yet listening,
// as Envoy's listen sockets are between listener creation and the start of
// the workers: the port is taken (and known, for port 0) while connections
// to it are still refused.
type boundSocket struct {
	fd   int
	addr netip.AddrPort
}

// bindSocket binds a TCP socket; transparent sets IP_TRANSPARENT (or
// IPV6_TRANSPARENT) first, as Envoy's transparent listener option does for
// TPROXY: the socket then accepts connections to any address iptables
// hands it, keeping their original destination as the local address.
func bindSocket(ap netip.AddrPort, transparent bool) (*boundSocket, error) {
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
	if transparent {
		level, opt, name := unix.SOL_IP, unix.IP_TRANSPARENT, "IP_TRANSPARENT"
		if family == syscall.AF_INET6 {
			level, opt, name = unix.SOL_IPV6, unix.IPV6_TRANSPARENT, "IPV6_TRANSPARENT"
		}
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			return fail("setsockopt "+name+" (needs CAP_NET_ADMIN)", err)
		}
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

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// originalDst is a connection's original destination, as Envoy's
// original_dst listener filter reads it: SO_ORIGINAL_DST (the address
// before an iptables REDIRECT or DNAT, from conntrack), else the accepted
// socket's local address (TPROXY keeps the original destination there).
func originalDst(c net.Conn) netip.AddrPort {
	local := netip.AddrPort{}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		local = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return local
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return local
	}
	dst := local
	rc.Control(func(fd uintptr) {
		if local.Addr().Is4() {
			mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
			if err != nil {
				return
			}
			// A struct sockaddr_in: family, port (big-endian), address.
			b := mreq.Multiaddr
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
			return
		}
		info, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst)
		if err != nil {
			return
		}
		var port [2]byte // sin6_port is in network order in memory
		binary.NativeEndian.PutUint16(port[:], info.Addr.Port)
		dst = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), binary.BigEndian.Uint16(port[:]))
	})
	return dst
}
