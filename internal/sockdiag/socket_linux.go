package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"os"
	"syscall"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
)

// errTruncated means a datagram did not fit the receive buffer.
var errTruncated = errors.New("netlink datagram truncated")

// datagramSocket is the netlink.Socket under a Conn: a NETLINK_SOCK_DIAG
// socket that reads every datagram into one reused buffer. The Messages it
// yields alias that buffer and are valid until the next read, which is all
// a dump decoded in place needs. (mdlayher/netlink's own socket copies
// each datagram into fresh memory so that its Messages can be kept: for a
// dump of 20k sockets that is 2 MiB of garbage, and twice ss's page
// faults.) The protocol itself (sequence numbers, multi-part dumps,
// NLMSG_DONE and NLMSG_ERROR) stays mdlayher/netlink's, in netlink.Conn.
type datagramSocket struct {
	f   *os.File
	rc  syscall.RawConn
	buf []byte

	// The RawConn's read callback and what it reports, kept so that a
	// read allocates no closure.
	readFn func(fd uintptr) bool
	n      int
	err    error
}

//nolint:staticcheck // netlink.Socket is deprecated as a test seam; here it is the reason above, and netlink.NewConn takes it
var _ netlink.Socket = (*datagramSocket)(nil)

// dialSocket opens and binds a non-blocking NETLINK_SOCK_DIAG socket in ns
// (nil: the caller's), and returns it with the port id the kernel gave it.
func dialSocket(ns *namespace.Net) (*datagramSocket, uint32, error) {
	fd, err := socketIn(ns)
	if err != nil {
		return nil, 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("bind: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("getsockname: %w", err)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("getsockname: %T, want a netlink address", sa)
	}
	s, err := newDatagramSocket(os.NewFile(uintptr(fd), "sock_diag"))
	if err != nil {
		return nil, 0, err
	}
	return s, nl.Pid, nil
}

// newDatagramSocket wraps f, a non-blocking datagram socket (netlink, or in
// tests one end of a socket pair); it closes f on error.
func newDatagramSocket(f *os.File) (*datagramSocket, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &datagramSocket{f: f, rc: rc, buf: make([]byte, bufferSize)}
	s.readFn = s.readOnce
	return s, nil
}

// socketIn opens a non-blocking NETLINK_SOCK_DIAG socket in ns
// (namespace.Net.Do: entering another namespace takes CAP_SYS_ADMIN; a pod
// looking at itself needs no capability at all).
func socketIn(ns *namespace.Net) (int, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_SOCK_DIAG)
		return err
	})
	if err != nil && fd >= 0 {
		unix.Close(fd) // made, but the thread could not go back
		fd = -1
	}
	return fd, err
}

func (s *datagramSocket) Close() error { return s.f.Close() }

// Send writes one message to the kernel (port 0).
func (s *datagramSocket) Send(m netlink.Message) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = s.f.Write(b)
	return err
}

// SendMessages writes messages as one datagram.
func (s *datagramSocket) SendMessages(msgs []netlink.Message) error {
	var out []byte
	for _, m := range msgs {
		b, err := m.MarshalBinary()
		if err != nil {
			return err
		}
		out = append(out, b...)
	}
	_, err := s.f.Write(out)
	return err
}

// Receive reads one datagram and returns copies of its messages.
func (s *datagramSocket) Receive() ([]netlink.Message, error) {
	var msgs []netlink.Message
	for m, err := range s.ReceiveIter() {
		if err != nil {
			return nil, err
		}
		m.Data = append([]byte(nil), m.Data...)
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// ReceiveIter reads one datagram into the socket's buffer and yields its
// messages, which alias the buffer: valid until the next read.
func (s *datagramSocket) ReceiveIter() iter.Seq2[netlink.Message, error] {
	return s.receive
}

func (s *datagramSocket) receive(yield func(netlink.Message, error) bool) {
	n, err := s.read()
	if err != nil {
		yield(netlink.Message{}, err)
		return
	}
	b := s.buf[:n]
	for len(b) >= nlmsgHeaderLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		al := (l + nlmsgAlignTo - 1) &^ (nlmsgAlignTo - 1)
		if l < nlmsgHeaderLen || al > len(b) {
			yield(netlink.Message{}, fmt.Errorf("%w: netlink message length %d with %d bytes left", ErrShortMessage, l, len(b)))
			return
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:al]); err != nil {
			yield(netlink.Message{}, err)
			return
		}
		if !yield(m, nil) {
			return
		}
		b = b[al:]
	}
}

// Netlink framing (linux/netlink.h).
const (
	nlmsgHeaderLen = 16
	nlmsgAlignTo   = 4
)

// read receives one datagram into s.buf. MSG_TRUNC makes the kernel report
// a datagram's full length, so a too-small buffer is an error, not a
// silently cut message.
func (s *datagramSocket) read() (int, error) {
	s.err = nil
	if err := s.rc.Read(s.readFn); err != nil {
		return 0, err
	}
	if s.err != nil {
		return 0, os.NewSyscallError("recvfrom", s.err)
	}
	if s.n > len(s.buf) {
		return 0, fmt.Errorf("%w: %d bytes into %d", errTruncated, s.n, len(s.buf))
	}
	return s.n, nil
}

func (s *datagramSocket) readOnce(fd uintptr) bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&s.buf[0])), uintptr(len(s.buf)), unix.MSG_TRUNC, 0, 0)
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.n, s.err = int(n), nil
		default:
			s.n, s.err = 0, errno
		}
		return true
	}
}
