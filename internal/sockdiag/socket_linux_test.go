package sockdiag

import (
	"errors"
	"os"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// socketPair returns a datagramSocket and the other end of a
// SOCK_SEQPACKET pair (datagrams, as netlink) to write its input to.
func socketPair(t *testing.T, bufSize int) (*datagramSocket, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	s, err := newDatagramSocket(os.NewFile(uintptr(fds[0]), "sock_diag"))
	if err != nil {
		t.Fatal(err)
	}
	s.buf = s.buf[:bufSize]
	peer := os.NewFile(uintptr(fds[1]), "kernel")
	t.Cleanup(func() { s.Close(); peer.Close() })
	return s, peer
}

func marshal(t *testing.T, msgs ...netlink.Message) []byte {
	t.Helper()
	var out []byte
	for _, m := range msgs {
		m.Header.Length = uint32(nlmsgHeaderLen + (len(m.Data)+3)&^3)
		m.Data = append(m.Data, make([]byte, (4-len(m.Data)%4)%4)...)
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

// The socket frames each datagram into messages that alias its buffer, and
// says so when a datagram is cut or malformed rather than yield a part.
func TestDatagramSocketFraming(t *testing.T) {
	a := netlink.Message{Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Multi, Sequence: 7}, Data: []byte("first message")}
	b := netlink.Message{Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi, Sequence: 7}, Data: make([]byte, 4)}
	good := marshal(t, a, b)
	tests := []struct {
		name     string
		dgram    []byte
		bufSize  int
		wantMsgs int
		wantErr  error
	}{
		{"two messages", good, bufferSize, 2, nil},
		{"cut message", good[:len(good)-2], bufferSize, 1, ErrShortMessage},
		{"length under a header", append(marshal(t, a), 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), bufferSize, 1, ErrShortMessage},
		{"datagram larger than the buffer", good, 20, 0, errTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, peer := socketPair(t, tt.bufSize)
			if _, err := peer.Write(tt.dgram); err != nil {
				t.Fatal(err)
			}
			var got []netlink.Message
			var err error
			for m, e := range s.ReceiveIter() {
				if e != nil {
					err = e
					break
				}
				got = append(got, m)
			}
			if !errors.Is(err, tt.wantErr) || len(got) != tt.wantMsgs {
				t.Fatalf("%d messages, error %v; want %d, %v", len(got), err, tt.wantMsgs, tt.wantErr)
			}
			if len(got) > 0 && (got[0].Header != netlink.Header{Length: got[0].Header.Length, Type: a.Header.Type, Flags: a.Header.Flags, Sequence: 7} || string(got[0].Data[:13]) != "first message") {
				t.Fatalf("first message %+v %q", got[0].Header, got[0].Data)
			}
		})
	}
}

// Over the socket, netlink.Conn reads a multi-part dump spread over
// several datagrams to its NLMSG_DONE.
func TestDatagramSocketUnderConn(t *testing.T) {
	s, peer := socketPair(t, bufferSize)
	k := newFakeKernel(t)
	c := newConn(netlink.NewConn(s, 1), "socket pair")
	go func() {
		buf := make([]byte, 4096)
		for _, p := range [][][]byte{k.v4, k.v6} {
			n, err := peer.Read(buf)
			if err != nil {
				return
			}
			var req netlink.Message
			if err := req.UnmarshalBinary(buf[:n]); err != nil {
				return
			}
			for _, m := range dump(p, false) {
				m.Header.Sequence = req.Header.Sequence
				if _, err := peer.Write(marshal(t, m)); err != nil {
					return
				}
			}
		}
	}()
	socks, err := c.Sockets(AllStates)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != len(k.v4)+len(k.v6) {
		t.Fatalf("%d sockets, want %d", len(socks), len(k.v4)+len(k.v6))
	}
}
