package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/draind/draind/internal/tcpstate"
)

// Socket is one TCP socket as the kernel reports it.
type Socket struct {
	Family uint8          `json:"family"` // unix.AF_INET or unix.AF_INET6
	State  tcpstate.State `json:"state"`
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	UID    uint32         `json:"uid"`
	Inode  uint32         `json:"inode"`
	// Cookie is the kernel's socket cookie (idiag_cookie; the value
	// bpf_get_socket_cookie returns for the same socket).
	Cookie uint64 `json:"cookie"`
	// CgroupID is the socket's cgroup v2 id, when the kernel sends it
	// (INET_DIAG_CGROUP_ID, full sockets, 5.8+); 0 otherwise.
	CgroupID uint64 `json:"cgroup_id,omitempty"`
	// HasInfo is set when tcp_info came with the socket (asked for, and
	// not a TIME_WAIT or request socket); the two durations below are only
	// meaningful then.
	HasInfo bool `json:"-"`
	// Time since data was last sent / received on the flow (in jiffies:
	// 1 to 10 ms apart).
	LastDataSent time.Duration `json:"-"`
	LastDataRecv time.Duration `json:"-"`
	// Data segments received / sent over the flow's life (Linux 4.6+;
	// 0 on older kernels).
	DataSegsIn, DataSegsOut uint32 `json:"-"`
	// SendQueue is idiag_wqueue: for a connected socket, the bytes written
	// and not yet acknowledged by the peer (sent or still queued). Non-zero
	// means the socket is still delivering what its owner wrote, however
	// long ago it last sent (a peer that reads slowly closes its window).
	SendQueue uint32 `json:"-"`
	// Transparent is IP_TRANSPARENT (INET_DIAG_SOCKOPT, sent unasked for
	// full sockets from 5.10): set on a TPROXY listener and inherited by
	// the sockets it accepts, whose local address is then the original
	// destination, not the listener's.
	Transparent bool `json:"transparent,omitempty"`
}

// inet_diag wire constants (linux/inet_diag.h, linux/sock_diag.h).
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY

	reqV2Len = 56 // struct inet_diag_req_v2
	msgLen   = 72 // struct inet_diag_msg

	attrInfo     = 2  // INET_DIAG_INFO: struct tcp_info
	attrCgroupID = 21 // INET_DIAG_CGROUP_ID: u64
	attrSockopt  = 22 // INET_DIAG_SOCKOPT: struct inet_diag_sockopt (bitfields)

	sockoptTransparent = 0x20 // byte 0, bit 5: transparent

	afInet     = 2
	afInet6    = 10
	ipprotoTCP = 6

	// tcp_info offsets (linux/tcp.h): u32 milliseconds.
	tcpiLastDataSent = 44
	tcpiLastDataRecv = 52
	tcpiDataSegsIn   = 152
	tcpiDataSegsOut  = 156
)

// ErrShortMessage is wrapped by decoding errors for truncated messages.
var ErrShortMessage = errors.New("short inet_diag message")

// putRequest writes into b (reqV2Len bytes) an inet_diag_req_v2 asking for
// every TCP socket of family in the states of mask, with tcp_info attached
// if info.
func putRequest(b []byte, family uint8, mask StateMask, info bool) {
	clear(b[:reqV2Len])
	b[0] = family
	b[1] = ipprotoTCP
	if info {
		b[2] = 1 << (attrInfo - 1) // idiag_ext: request INET_DIAG_INFO
	}
	binary.NativeEndian.PutUint32(b[4:8], uint32(mask))
	// id (48 bytes) stays zero: a dump matches every socket.
}

// ParseMessage decodes one inet_diag_msg and its attributes (the payload of
// a SOCK_DIAG_BY_FAMILY netlink message) into s. It never retains b.
func ParseMessage(b []byte, s *Socket) error {
	if len(b) < msgLen {
		return fmt.Errorf("%w: %d bytes, want at least %d", ErrShortMessage, len(b), msgLen)
	}
	*s = Socket{
		Family: b[0],
		State:  tcpstate.State(b[1]),
		UID:    binary.NativeEndian.Uint32(b[64:68]),
		Inode:  binary.NativeEndian.Uint32(b[68:72]),
		// b[56:60] is idiag_rqueue, unused.
		SendQueue: binary.NativeEndian.Uint32(b[60:64]),
		Cookie:    uint64(binary.NativeEndian.Uint32(b[44:48])) | uint64(binary.NativeEndian.Uint32(b[48:52]))<<32,
	}
	sport := binary.BigEndian.Uint16(b[4:6])
	dport := binary.BigEndian.Uint16(b[6:8])
	switch s.Family {
	case afInet:
		s.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), sport)
		s.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), dport)
	case afInet6:
		// IPv4 peers of a dual-stack socket arrive as ::ffff:a.b.c.d; unmap
		// so that the same flow reads the same from either family.
		s.Local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), sport)
		s.Remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[24:40])).Unmap(), dport)
	default:
		return fmt.Errorf("inet_diag message with unknown family %d", s.Family)
	}
	attrs := b[msgLen:]
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs[0:2]))
		typ := binary.NativeEndian.Uint16(attrs[2:4]) & 0x3fff // strip NLA_F_NESTED / NET_BYTEORDER
		if l < 4 || l > len(attrs) {
			return fmt.Errorf("%w: attribute length %d with %d bytes left", ErrShortMessage, l, len(attrs))
		}
		payload := attrs[4:l]
		switch typ {
		case attrInfo:
			// Older kernels send a shorter tcp_info; take the fields only
			// when they are there.
			if len(payload) >= tcpiLastDataRecv+4 {
				s.HasInfo = true
				s.LastDataSent = time.Duration(binary.NativeEndian.Uint32(payload[tcpiLastDataSent:])) * time.Millisecond
				s.LastDataRecv = time.Duration(binary.NativeEndian.Uint32(payload[tcpiLastDataRecv:])) * time.Millisecond
			}
			if len(payload) >= tcpiDataSegsOut+4 {
				s.DataSegsIn = binary.NativeEndian.Uint32(payload[tcpiDataSegsIn:])
				s.DataSegsOut = binary.NativeEndian.Uint32(payload[tcpiDataSegsOut:])
			}
		case attrCgroupID:
			if len(payload) >= 8 {
				s.CgroupID = binary.NativeEndian.Uint64(payload)
			}
		case attrSockopt:
			if len(payload) >= 1 {
				s.Transparent = payload[0]&sockoptTransparent != 0
			}
		}
		al := (l + 3) &^ 3
		if al > len(attrs) {
			break
		}
		attrs = attrs[al:]
	}
	return nil
}
