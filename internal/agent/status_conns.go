package agent

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// connLimits is the status server's listener: at most max connections
// served at once, and at most perSource of them from any one address, so
// that a neighbour holding connections (idle keep-alives, out-of-rotation
// waits) cannot take the slots the kubelet's probes and preStop calls
// need (issue 43). A connection past its address's share is answered 429
// at once and closed: it never takes a served slot. Past max, the next
// connection waits in the kernel's accept queue, not in draind's memory.
type connLimits struct {
	net.Listener
	slots     chan struct{} // one per served connection
	perSource int
	done      chan struct{} // closed by Close

	mu       sync.Mutex
	bySource map[netip.Addr]int
	// refusing are the over-share connections being closed gently
	// (answered, then read until the client hangs up or refuseLinger):
	// at most cap(refuseSlots), the others are closed at once.
	refusing    map[net.Conn]bool
	refuseSlots chan struct{}
	refusers    sync.WaitGroup
	closeOnce   sync.Once
}

// refuseLinger bounds how long a refused connection is read, for its
// request and after its answer, so that the client reads the 429 rather
// than a reset: as long as a served one has for its header.
const refuseLinger = StatusReadHeaderTimeout

// maxRefusing bounds the refused connections lingering at once (about
// 10 KB each: a goroutine and a buffer). A flood of 10,000 callers from
// one address in one process on 2 CPUs writes its requests slowly
// (TestRotationWaitAbuse): the refusals past these are answered before
// their request, which a Go client may take for an unsolicited answer.
const maxRefusing = 256

// tooManyFromSource is the answer to a connection past its address's
// share. It is written before the request is read (a server may answer
// early), so it never waits for a client that sends nothing.
var tooManyFromSource = func() []byte {
	const body = "too many connections from one address\n"
	return []byte("HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func newConnLimits(ln net.Listener, max, perSource int) *connLimits {
	return &connLimits{
		Listener: ln, slots: make(chan struct{}, max), perSource: perSource, done: make(chan struct{}),
		bySource: map[netip.Addr]int{}, refusing: map[net.Conn]bool{}, refuseSlots: make(chan struct{}, maxRefusing),
	}
}

// sourceOf is a connection's peer address, IPv4-mapped IPv6 unmapped (a
// dual-stack listener sees IPv4 peers so).
func sourceOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	return ap.Addr().Unmap()
}

// Accept takes a served slot first (as netutil.LimitListener does), then
// a connection; one past its source's share gives the slot back, is
// refused and the next is taken.
func (l *connLimits) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		src := sourceOf(c)
		l.mu.Lock()
		n := l.bySource[src]
		if n >= l.perSource {
			l.mu.Unlock()
			<-l.slots
			l.refuse(c)
			continue
		}
		l.bySource[src] = n + 1
		l.mu.Unlock()
		return &limitedConn{Conn: c, l: l, src: src}, nil
	}
}

// release gives back a served connection's slot and share.
func (l *connLimits) release(src netip.Addr) {
	l.mu.Lock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
	l.mu.Unlock()
	<-l.slots
}

// refuse answers c 429 and closes it. With a refusing slot free it does
// so on a goroutine Close waits for, as a server should: it reads the
// request first (an answer before it confuses a client: Go's reads it as
// unsolicited), then waits for the client to hang up, all within
// refuseLinger (closing a socket whose request was not read sends a
// reset, which can beat the answer to the client). Without one it
// answers and closes at once, the request unread: the accept loop never
// waits on a refused client. That write cannot block long (a few bytes
// into a new connection's empty send buffer; bounded anyway).
func (l *connLimits) refuse(c net.Conn) {
	select {
	case l.refuseSlots <- struct{}{}:
	default:
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		c.Write(tooManyFromSource)
		c.Close()
		return
	}
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		<-l.refuseSlots
		c.Close()
		return
	default:
	}
	l.refusing[c] = true
	l.refusers.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.refusers.Done()
		c.SetDeadline(time.Now().Add(refuseLinger))
		readRequestHeader(c)
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		c.Write(tooManyFromSource)
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		var buf [512]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				break
			}
		}
		l.mu.Lock()
		delete(l.refusing, c)
		l.mu.Unlock()
		c.Close()
		<-l.refuseSlots
	}()
}

// readRequestHeader reads until the end of a request's header, at most
// the status server's header limit, or an error (the deadline).
func readRequestHeader(c net.Conn) {
	var got []byte
	buf := make([]byte, 1024)
	for len(got) < defaultStatusLimits.MaxHeaderBytes {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if bytes.Contains(got, []byte("\r\n\r\n")) || err != nil {
			return
		}
	}
}

// Close stops accepting and ends the refusals under way.
func (l *connLimits) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() {
		l.mu.Lock()
		close(l.done)
		for c := range l.refusing {
			c.SetReadDeadline(time.Now())
		}
		l.mu.Unlock()
		l.refusers.Wait()
	})
	return err
}

// limitedConn gives its slot back when closed (once: net/http may close
// twice).
type limitedConn struct {
	net.Conn
	l    *connLimits
	src  netip.Addr
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src) })
	return err
}
