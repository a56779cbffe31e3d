package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/draind/draind/internal/namespace"
	"golang.org/x/sys/unix"
)

// ErrNoInetDiag means the kernel answered that it has no inet_diag handler
// for TCP (the inet_diag / tcp_diag modules are neither built in nor
// loadable).
var ErrNoInetDiag = errors.New("kernel has no inet_diag for tcp (load the inet_diag and tcp_diag modules)")

// ErrDumpInterrupted means the kernel interrupted a dump (NLM_F_DUMP_INTR)
// while the socket tables changed under it: what was read may miss or
// repeat sockets. [Conn.Each] returns it after reading the dump to its end;
// [Conn.Sockets] retries, and returns it when every retry was interrupted.
var ErrDumpInterrupted = errors.New("sock_diag dump interrupted")

// bufferSize is the receive buffer for one dump batch. A buffer larger
// than the kernel's 32 KiB cap lets it fill every dump skb (it sizes them
// from the largest recvmsg seen): few system calls, and never a truncated
// datagram.
const bufferSize = 64 << 10

// retries bounds the retries of an interrupted dump in Sockets.
const retries = 5

// Netlink framing (linux/netlink.h).
const (
	nlmsgHdrLen   = 16
	nlmsgNoop     = 1
	nlmsgError    = 2
	nlmsgDone     = 3
	nlmFRequest   = 0x1
	nlmFDump      = 0x300 // NLM_F_ROOT | NLM_F_MATCH
	nlmFDumpIntr  = 0x10
	nlmsgAlignTo  = 4
	requestMsgLen = nlmsgHdrLen + reqV2Len
)

// Conn is a NETLINK_SOCK_DIAG socket in one network namespace. Its methods
// are safe for concurrent use; dumps are serialised.
//
// It speaks netlink itself rather than through a general library: every
// dump reads into one buffer and decodes each inet_diag_msg in place into
// one reused Socket, so a dump of any size allocates nothing.
type Conn struct {
	mu     sync.Mutex
	f      *os.File // nil after Close
	rc     syscall.RawConn
	name   string
	noInfo bool
	seq    uint32
	req    [requestMsgLen]byte
	rbuf   []byte
	buf    []Socket

	// The callbacks and their state, built once so that a dump allocates
	// no closure: the RawConn's read and write, the decoder, the visitor.
	readFn, writeFn func(fd uintptr) bool
	n               int
	ioErr           error
	decodeFn        func(payload []byte)
	appendFn        func(*Socket)
	visit           func(*Socket)
	decodeErr       error
	sock            Socket
}

// Dial opens a sock_diag socket in ns (nil: the caller's namespace).
func Dial(ns *namespace.Net) (*Conn, error) {
	name := "current netns"
	if ns != nil {
		name = ns.Name()
	}
	fd, err := socketIn(ns)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket in %s: %w", name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind sock_diag socket in %s: %w", name, err)
	}
	return newConn(os.NewFile(uintptr(fd), "sock_diag"), name)
}

// socketIn opens a non-blocking NETLINK_SOCK_DIAG socket in ns. Entering a
// namespace takes CAP_SYS_ADMIN, even our own: the socket is opened
// directly when the target is where this thread already is (a pod looking
// at itself needs no capability at all); otherwise on a thread of its own
// that switches there and back.
func socketIn(ns *namespace.Net) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_SOCK_DIAG)
	}
	runtime.LockOSThread()
	if ns == nil || ns.HoldsThread() {
		defer runtime.UnlockOSThread()
		return open()
	}
	runtime.UnlockOSThread()
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// A thread that cannot go back to its own namespace stays locked:
		// the runtime retires it when this goroutine ends.
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("open own netns: %w", err)}
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(ns.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("enter netns: %w", err)}
			return
		}
		fd, err := open()
		if rerr := unix.Setns(self, unix.CLONE_NEWNET); rerr != nil {
			if err == nil {
				unix.Close(fd)
			}
			done <- result{-1, fmt.Errorf("return to own netns: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

// newConn wraps f, a non-blocking socket speaking sock_diag (a netlink
// socket, or in tests one end of a socket pair).
func newConn(f *os.File, name string) (*Conn, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("sock_diag socket in %s: %w", name, err)
	}
	d := &Conn{f: f, rc: rc, name: name, rbuf: make([]byte, bufferSize)}
	d.readFn, d.writeFn, d.decodeFn, d.appendFn = d.readOnce, d.writeOnce, d.decode, d.appendSocket
	return d, nil
}

// SetInfo says whether dumps ask for tcp_info (on by default). It is what
// gives idle times, and most of a dump's cost: the kernel locks and reads
// each socket for it (a 20k-socket dump: ~65 ms with it, ~20 ms without).
func (d *Conn) SetInfo(on bool) {
	d.mu.Lock()
	d.noInfo = !on
	d.mu.Unlock()
}

// Close closes the socket. It is safe to call twice.
func (d *Conn) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

// Each calls fn for every TCP socket (IPv4, then IPv6) whose state is in
// mask. The Socket passed to fn is reused: copy what you keep. When the
// kernel interrupted the dump, Each reads it to its end, then returns an
// error wrapping ErrDumpInterrupted: fn may have seen a socket twice or
// missed one, and the caller starts again. Each allocates nothing per
// socket.
func (d *Conn) Each(mask StateMask, fn func(*Socket)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.each(mask, fn)
}

func (d *Conn) each(mask StateMask, fn func(*Socket)) error {
	d.visit, d.decodeErr = fn, nil
	err := d.dump(mask, d.decodeFn)
	d.visit = nil
	if d.decodeErr != nil {
		return fmt.Errorf("sock_diag dump in %s: %w", d.name, d.decodeErr)
	}
	return err
}

// decode decodes one message into the reused Socket and visits it. After a
// decoding error it decodes no more (the dump is still read to its end).
func (d *Conn) decode(payload []byte) {
	if d.decodeErr != nil {
		return
	}
	if d.decodeErr = ParseMessage(payload, &d.sock); d.decodeErr == nil {
		d.visit(&d.sock)
	}
}

// Sockets returns every TCP socket whose state is in mask, retrying an
// interrupted dump. The returned slice is reused by the next call: copy
// what you keep.
func (d *Conn) Sockets(mask StateMask) ([]Socket, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var err error
	for range retries {
		d.buf = d.buf[:0]
		err = d.each(mask, d.appendFn)
		if !errors.Is(err, ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return d.buf, nil
}

func (d *Conn) appendSocket(s *Socket) { d.buf = append(d.buf, *s) }

// dump runs one dump per family and hands fn the payload of every
// SOCK_DIAG_BY_FAMILY message (valid only during the call).
func (d *Conn) dump(mask StateMask, fn func(payload []byte)) error {
	if d.f == nil {
		return fmt.Errorf("sock_diag in %s: %w", d.name, os.ErrClosed)
	}
	interrupted := false
	for _, family := range [2]uint8{afInet, afInet6} {
		intr, err := d.dumpFamily(family, mask, fn)
		if err != nil {
			return err
		}
		interrupted = interrupted || intr
	}
	if interrupted {
		return fmt.Errorf("sock_diag in %s: %w", d.name, ErrDumpInterrupted)
	}
	return nil
}

func (d *Conn) dumpFamily(family uint8, mask StateMask, fn func([]byte)) (interrupted bool, err error) {
	d.seq++
	d.encodeRequest(family, mask)
	if err := d.write(); err != nil {
		return false, fmt.Errorf("sock_diag request in %s: %w", d.name, err)
	}
	for {
		n, err := d.read()
		if err != nil {
			return interrupted, fmt.Errorf("sock_diag dump in %s: %w", d.name, err)
		}
		done, intr, err := d.parseBatch(d.rbuf[:n], fn)
		interrupted = interrupted || intr
		switch {
		case errors.Is(err, unix.ENOENT):
			// The kernel has no handler for this family/protocol.
			if family == afInet6 && ipv6Disabled() {
				return interrupted, nil
			}
			return interrupted, fmt.Errorf("sock_diag in %s: %w", d.name, ErrNoInetDiag)
		case err != nil:
			return interrupted, fmt.Errorf("sock_diag dump in %s: %w", d.name, err)
		case done:
			return interrupted, nil
		}
	}
}

// encodeRequest writes the netlink header and an inet_diag_req_v2 asking
// for every TCP socket of family in the states of mask into d.req.
func (d *Conn) encodeRequest(family uint8, mask StateMask) {
	b := d.req[:]
	clear(b)
	binary.NativeEndian.PutUint32(b[0:4], requestMsgLen)
	binary.NativeEndian.PutUint16(b[4:6], sockDiagByFamily)
	binary.NativeEndian.PutUint16(b[6:8], nlmFRequest|nlmFDump)
	binary.NativeEndian.PutUint32(b[8:12], d.seq)
	putRequest(b[nlmsgHdrLen:], family, mask, !d.noInfo)
}

// parseBatch walks the netlink messages of one datagram. done is set by
// the message that ends the dump (NLMSG_DONE, or an NLMSG_ERROR: the
// kernel refused the request); err carries a refusal's errno. Messages of
// another sequence (what an earlier, abandoned dump left) are skipped, as
// are those the kernel flagged interrupted: the dump is read to its end.
func (d *Conn) parseBatch(b []byte, fn func([]byte)) (done, interrupted bool, err error) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return true, interrupted, fmt.Errorf("%w: netlink message length %d with %d bytes left", ErrShortMessage, l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		flags := binary.NativeEndian.Uint16(b[6:8])
		seq := binary.NativeEndian.Uint32(b[8:12])
		payload := b[nlmsgHdrLen:l]
		b = b[min(len(b), (l+nlmsgAlignTo-1)&^(nlmsgAlignTo-1)):]
		if seq != d.seq {
			continue
		}
		switch typ {
		case nlmsgDone, nlmsgError:
			if len(payload) >= 4 {
				if errno := int32(binary.NativeEndian.Uint32(payload[0:4])); errno < 0 {
					return true, interrupted, unix.Errno(-errno)
				}
			}
			if typ == nlmsgDone {
				return true, interrupted || flags&nlmFDumpIntr != 0, nil
			}
			// An acknowledgement (errno 0): no dump follows it.
			return true, interrupted, nil
		case sockDiagByFamily:
			if flags&nlmFDumpIntr != 0 {
				interrupted = true
				continue
			}
			fn(payload)
		}
	}
	return false, interrupted, nil
}

func (d *Conn) write() error {
	d.ioErr = nil
	if err := d.rc.Write(d.writeFn); err != nil {
		return err
	}
	return d.ioErr
}

func (d *Conn) writeOnce(fd uintptr) bool {
	for {
		_, d.ioErr = unix.Write(int(fd), d.req[:])
		if d.ioErr != unix.EINTR {
			return d.ioErr != unix.EAGAIN
		}
	}
}

// read receives one datagram into d.rbuf. MSG_TRUNC makes the kernel
// report a datagram's full length, so a too-small buffer is an error, not
// a silently cut message.
func (d *Conn) read() (int, error) {
	d.ioErr = nil
	if err := d.rc.Read(d.readFn); err != nil {
		return 0, err
	}
	if d.ioErr != nil {
		return 0, d.ioErr
	}
	if d.n > len(d.rbuf) {
		return 0, fmt.Errorf("netlink datagram of %d bytes truncated to %d", d.n, len(d.rbuf))
	}
	return d.n, nil
}

func (d *Conn) readOnce(fd uintptr) bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&d.rbuf[0])), uintptr(len(d.rbuf)), unix.MSG_TRUNC, 0, 0)
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			d.n, d.ioErr = int(n), nil
		default:
			d.n, d.ioErr = 0, errno
		}
		return true
	}
}

// ipv6Disabled reports whether the kernel runs without IPv6 (ipv6.disable=1),
// in which case it has no inet6 diag handler to answer with.
var ipv6Disabled = func() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return errors.Is(err, os.ErrNotExist)
}
