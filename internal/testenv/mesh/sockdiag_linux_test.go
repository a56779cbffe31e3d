package mesh_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// A raw NETLINK_SOCK_DIAG dump, decoded here from the bytes (not through
// the product's parser): these tests establish what the kernel sends.
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	inetDiagMsgLen   = 72 // struct inet_diag_msg
	attrSockopt      = 22 // INET_DIAG_SOCKOPT: struct inet_diag_sockopt, 2 bytes
	// Byte 0 of struct inet_diag_sockopt holds the bitfields recverr,
	// is_icsk, freebind, hdrincl, mc_loop, transparent, mc_all, nodefrag
	// from bit 0 up (little-endian bitfield order).
	sockoptFreebind    = 1 << 2
	sockoptTransparent = 1 << 5
)

var tcpStates = map[uint8]string{
	1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
	7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
}

// diagSock is one TCP socket as sock_diag reports it.
type diagSock struct {
	State   string
	Local   netip.AddrPort
	Remote  netip.AddrPort
	UID     uint32
	Inode   uint32
	Cookie  uint64
	Attrs   []uint16 // attribute types sent without asking (idiag_ext = 0)
	Sockopt []byte   // INET_DIAG_SOCKOPT payload, nil when absent
}

// HasSockopt reports whether the kernel sent INET_DIAG_SOCKOPT.
func (s diagSock) HasSockopt() bool { return s.Sockopt != nil }

// Transparent is the transparent bit of INET_DIAG_SOCKOPT.
func (s diagSock) Transparent() bool {
	return len(s.Sockopt) > 0 && s.Sockopt[0]&sockoptTransparent != 0
}

func (s diagSock) sockoptString() string {
	if s.Sockopt == nil {
		return "absent"
	}
	return fmt.Sprintf("%02x %02x (transparent=%t)", s.Sockopt[0], s.Sockopt[1], s.Transparent())
}

func (s diagSock) String() string {
	return fmt.Sprintf("%-11s %-21s %-21s uid=%-4d inode=%-8d sockopt=%s attrs=%v",
		s.State, s.Local, s.Remote, s.UID, s.Inode, s.sockoptString(), s.Attrs)
}

// dumpTCP4 dumps every IPv4 TCP socket of ns with no extension asked for.
func dumpTCP4(ns *testutil.NetNS) ([]diagSock, error) {
	conn, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: int(ns.Handle)})
	if err != nil {
		return nil, fmt.Errorf("dial sock_diag: %w", err)
	}
	defer conn.Close()
	// struct inet_diag_req_v2: family, protocol, ext, pad, states, sockid.
	req := make([]byte, 56)
	req[0], req[1] = unix.AF_INET, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:8], 0xffffffff) // every state
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return nil, fmt.Errorf("sock_diag dump: %w", err)
	}
	socks := make([]diagSock, 0, len(msgs))
	for _, m := range msgs {
		s, err := parseDiagMsg(m.Data)
		if err != nil {
			return nil, err
		}
		socks = append(socks, s)
	}
	return socks, nil
}

func parseDiagMsg(b []byte) (diagSock, error) {
	if len(b) < inetDiagMsgLen {
		return diagSock{}, fmt.Errorf("inet_diag_msg of %d bytes", len(b))
	}
	var s diagSock
	s.State = tcpStates[b[1]]
	// struct inet_diag_sockid at 4: sport, dport (big endian), src[4], dst[4], if, cookie[2].
	s.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), binary.BigEndian.Uint16(b[4:6]))
	s.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), binary.BigEndian.Uint16(b[6:8]))
	s.Cookie = uint64(binary.NativeEndian.Uint32(b[44:48])) | uint64(binary.NativeEndian.Uint32(b[48:52]))<<32
	s.UID = binary.NativeEndian.Uint32(b[64:68])
	s.Inode = binary.NativeEndian.Uint32(b[68:72])
	ad, err := netlink.NewAttributeDecoder(b[inetDiagMsgLen:])
	if err != nil {
		return s, fmt.Errorf("attributes: %w", err)
	}
	for ad.Next() {
		s.Attrs = append(s.Attrs, ad.Type())
		if ad.Type() == attrSockopt {
			s.Sockopt = append([]byte{}, ad.Bytes()...)
		}
	}
	if err := ad.Err(); err != nil {
		return s, fmt.Errorf("attributes: %w", err)
	}
	return s, nil
}

// find returns the socket with these addresses (remote zero for LISTEN).
func find(socks []diagSock, local, remote string) (diagSock, bool) {
	l, r := netip.MustParseAddrPort(local), netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if remote != "" {
		r = netip.MustParseAddrPort(remote)
	}
	for _, s := range socks {
		if s.Local == l && s.Remote == r {
			return s, true
		}
	}
	return diagSock{}, false
}

// formatSocks renders sockets one a line, sorted, for logs.
func formatSocks(socks []diagSock) string {
	lines := make([]string, len(socks))
	for i, s := range socks {
		lines[i] = "  " + s.String()
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
