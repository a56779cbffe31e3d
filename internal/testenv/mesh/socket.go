//go:build linux

package mesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenTransparent listens on addr (e.g. "0.0.0.0:15006") with
// IP_TRANSPARENT set before bind, as Envoy does for a listener with
// `transparent: true` (Istio sets it on virtualInbound and virtualOutbound in
// TPROXY mode). The TPROXY target only delivers to such a socket. Needs
// CAP_NET_ADMIN (or CAP_NET_RAW) in the namespace's user namespace.
//
// The socket's owner (sock_diag's uid) is the fsuid of the calling thread,
// and an accepted socket's owner is the fsuid of the thread that accepts it:
// to measure the proxy's sockets, listen and accept in a process that runs
// as the proxy's uid (ProxySysProcAttr).
func ListenTransparent(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return setsockoptInt(c, unix.SOL_IP, unix.IP_TRANSPARENT, 1)
	}}
	ln, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("transparent listen %s: %w", addr, err)
	}
	return ln, nil
}

// OriginalDst is the destination a NATed (REDIRECT) connection was sent to,
// from conntrack (getsockopt SO_ORIGINAL_DST), as Envoy's original_dst
// listener filter reads it. On a TPROXY-delivered socket conntrack has no
// NAT and it returns the local address; on a socket without a conntrack
// entry it fails (ENOENT) and Envoy falls back to the local address.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var addr netip.AddrPort
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// SO_ORIGINAL_DST returns a struct sockaddr_in; x/sys/unix reads
		// it through the IPv6 multicast request type of the same size.
		var mreq *unix.IPv6Mreq
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if serr != nil {
			return
		}
		raw := mreq.Multiaddr // sockaddr_in: family, port (big endian), addr
		addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte(raw[4:8])), binary.BigEndian.Uint16(raw[2:4]))
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", serr)
	}
	return addr, nil
}

// Transparent reports whether the socket has IP_TRANSPARENT set
// (getsockopt), e.g. whether an accepted socket inherited it.
func Transparent(c syscall.Conn) (bool, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT) }); err != nil {
		return false, err
	}
	if serr != nil {
		return false, fmt.Errorf("getsockopt IP_TRANSPARENT: %w", serr)
	}
	return v != 0, nil
}

// ProxySysProcAttr runs a process as Istio's proxy container does in
// TPROXY mode: uid and gid ProxyUID, with CAP_NET_ADMIN kept as an ambient
// capability (for IP_TRANSPARENT and SO_MARK), killed with its parent. In
// REDIRECT mode Istio's proxy needs no capability; the extra one changes
// nothing the kernel reports about its sockets.
func ProxySysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: ProxyUID, Gid: ProxyGID},
		AmbientCaps: []uintptr{unix.CAP_NET_ADMIN},
		Pdeathsig:   syscall.SIGKILL,
	}
}

func setsockoptInt(c syscall.RawConn, level, opt, value int) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, value) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt(%d, %d): %w", level, opt, serr)
	}
	return nil
}
