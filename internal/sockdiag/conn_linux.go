package sockdiag

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
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

// bufferSize is the receive buffer for one datagram. A buffer larger than
// the kernel's 32 KiB cap lets it fill every dump skb (it sizes them from
// the largest recvmsg seen): few system calls, and never a truncated
// datagram.
const bufferSize = 64 << 10

// retries bounds the retries of an interrupted dump in Sockets.
const retries = 5

// Conn is a NETLINK_SOCK_DIAG socket in one network namespace. Its methods
// are safe for concurrent use; dumps are serialised. mdlayher/netlink's
// Conn speaks the protocol, over a datagramSocket that reads into one
// reused buffer.
type Conn struct {
	mu     sync.Mutex
	c      *netlink.Conn // nil after Close
	name   string
	noInfo bool
	req    [reqV2Len]byte
	filter []byte // inet_diag bytecode for the dump under way (EachLocalPort)
	reqBuf []byte // the request with its filter, reused
	buf    []Socket
	sock   Socket
}

// Dial opens a sock_diag socket in ns (nil: the caller's namespace).
func Dial(ns *namespace.Net) (*Conn, error) {
	name := "current netns"
	if ns != nil {
		name = ns.Name()
	}
	sock, pid, err := dialSocket(ns)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket in %s: %w", name, err)
	}
	return newConn(netlink.NewConn(sock, pid), name), nil
}

// newConn wraps c, a netlink connection speaking sock_diag (over a
// datagramSocket, or in tests nltest's).
func newConn(c *netlink.Conn, name string) *Conn { return &Conn{c: c, name: name} }

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
	if d.c == nil {
		return nil
	}
	err := d.c.Close()
	d.c = nil
	return err
}

// Each calls fn for every TCP socket (IPv4, then IPv6) whose state is in
// mask. The Socket passed to fn is reused: copy what you keep. When the
// kernel interrupted the dump, Each reads it to its end, then returns an
// error wrapping ErrDumpInterrupted: fn may have seen a socket twice or
// missed one, and the caller starts again. Each decodes every message in
// place from the socket's buffer: it allocates a few small objects per
// datagram, never per socket, and never a copy of the dump.
func (d *Conn) Each(mask StateMask, fn func(*Socket)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.each(mask, fn)
}

// EachLocalPort is Each for the sockets whose local port is one of ports
// only: the kernel filters the dump (inet_diag bytecode), so a question
// about a few listeners costs the namespace's other sockets nothing but a
// comparison in the kernel. No ports: no socket.
func (d *Conn) EachLocalPort(mask StateMask, ports []uint16, fn func(*Socket)) error {
	if len(ports) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.filter = localPortFilter(ports)
	defer func() { d.filter = nil }()
	return d.each(mask, fn)
}

func (d *Conn) each(mask StateMask, fn func(*Socket)) error {
	var decodeErr error
	err := d.dump(mask, func(payload []byte) bool {
		if decodeErr = ParseMessage(payload, &d.sock); decodeErr != nil {
			return false
		}
		fn(&d.sock)
		return true
	})
	if decodeErr != nil {
		return fmt.Errorf("sock_diag dump in %s: %w", d.name, decodeErr)
	}
	return err
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
		err = d.each(mask, d.appendSocket)
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
// SOCK_DIAG_BY_FAMILY message (valid only during the call). When fn
// returns false it is called no more, and the dump is still read to its
// end: the next one must not meet its leftovers.
func (d *Conn) dump(mask StateMask, fn func(payload []byte) bool) error {
	if d.c == nil {
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

func (d *Conn) dumpFamily(family uint8, mask StateMask, fn func([]byte) bool) (interrupted bool, err error) {
	putRequest(d.req[:], family, mask, !d.noInfo)
	data := d.req[:]
	if d.filter != nil {
		d.reqBuf = putBytecodeAttr(append(d.reqBuf[:0], d.req[:]...), d.filter)
		data = d.reqBuf
	}
	sent, err := d.c.Send(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   data,
	})
	if err != nil {
		return false, fmt.Errorf("sock_diag request in %s: %w", d.name, err)
	}
	// The iterator reads the dump to its end even when the loop stops
	// early; NLMSG_DONE ends it, NLMSG_ERROR comes as an error.
	visiting := true
	for m, err := range d.c.ReceiveIter() {
		switch {
		case errors.Is(err, unix.ENOENT):
			// The kernel has no handler for this family/protocol.
			if family == afInet6 && ipv6Disabled() {
				return interrupted, nil
			}
			return interrupted, fmt.Errorf("sock_diag in %s: %w", d.name, ErrNoInetDiag)
		case err != nil:
			return interrupted, fmt.Errorf("sock_diag dump in %s: %w", d.name, err)
		case m.Header.Sequence != sent.Header.Sequence || m.Header.Type != sockDiagByFamily:
			// Not this dump's (what an abandoned one left), or not a socket.
			continue
		case m.Header.Flags&netlink.DumpInterrupted != 0:
			interrupted = true // keep reading to drain the dump
			continue
		}
		if visiting {
			visiting = fn(m.Data)
		}
	}
	return interrupted, nil
}

// ipv6Disabled reports whether the kernel runs without IPv6 (ipv6.disable=1),
// in which case it has no inet6 diag handler to answer with.
var ipv6Disabled = func() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return errors.Is(err, os.ErrNotExist)
}
