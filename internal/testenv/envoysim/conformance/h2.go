package conformance

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// HTTP/2 frame types (RFC 9113 §6).
const (
	FrameData         = 0x0
	FrameHeaders      = 0x1
	FrameRSTStream    = 0x3
	FrameSettings     = 0x4
	FramePing         = 0x6
	FrameGoAway       = 0x7
	FrameWindowUpdate = 0x8

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
)

// MaxStreamID is 2^31-1: the last-stream-id of a shutdown notice, the
// first GOAWAY of a graceful drain.
const MaxStreamID = 1<<31 - 1

// ErrQuiet is Next's error when no frame came in time.
var ErrQuiet = errors.New("no frame")

// Frame is one HTTP/2 frame as it came off the wire.
type Frame struct {
	Type    uint8
	Flags   uint8
	Stream  uint32
	Payload []byte
}

// GoAway decodes a GOAWAY frame's last-stream-id and error code.
func (f Frame) GoAway() (lastStream, code uint32, ok bool) {
	if f.Type != FrameGoAway || len(f.Payload) < 8 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(f.Payload) & MaxStreamID, binary.BigEndian.Uint32(f.Payload[4:]), true
}

// EndStream tells whether a DATA or HEADERS frame ends its stream.
func (f Frame) EndStream() bool {
	return (f.Type == FrameData || f.Type == FrameHeaders) && f.Flags&flagEndStream != 0
}

// Status200 tells whether a HEADERS frame starts with :status 200 in its
// static-table form (0x88), as Go's and Envoy's encoders write it.
func (f Frame) Status200() bool {
	p := f.Payload
	for len(p) > 0 && p[0]&0xe0 == 0x20 { // dynamic table size updates first
		p = p[1:]
	}
	return f.Type == FrameHeaders && len(p) > 0 && p[0] == 0x88
}

func (f Frame) String() string {
	if last, code, ok := f.GoAway(); ok {
		return fmt.Sprintf("GOAWAY(last=%d, code=%d)", last, code)
	}
	return fmt.Sprintf("frame(type=%d, flags=%#x, stream=%d, %d bytes)", f.Type, f.Flags, f.Stream, len(f.Payload))
}

// H2Conn is a bare HTTP/2 cleartext client connection (prior knowledge,
// as gRPC clients use) that shows each frame the server sends, so that a
// test sees GOAWAY frames and their order. It acknowledges SETTINGS and
// PING by itself and opens a large receive window, so it never has to
// send WINDOW_UPDATE.
type H2Conn struct {
	c      net.Conn
	frames chan Frame
	done   chan struct{}
	err    error // why the read side ended, once done is closed

	wmu  sync.Mutex
	next uint32 // next stream id
}

// DialH2 connects and sends the client preface.
func DialH2(ctx context.Context, addr string) (*H2Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	h := &H2Conn{c: c, frames: make(chan Frame, 256), done: make(chan struct{}), next: 1}
	var b []byte
	b = append(b, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	// SETTINGS: INITIAL_WINDOW_SIZE 2^30; then a connection WINDOW_UPDATE.
	b = appendFrame(b, FrameSettings, 0, 0, []byte{0, 4, 0x40, 0, 0, 0})
	b = appendFrame(b, FrameWindowUpdate, 0, 0, []byte{0x3f, 0xff, 0, 0})
	if _, err := c.Write(b); err != nil {
		c.Close()
		return nil, err
	}
	go h.read()
	return h, nil
}

func appendFrame(b []byte, typ, flags uint8, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream&MaxStreamID)
	return append(b, payload...)
}

func (h *H2Conn) write(b []byte) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	_, err := h.c.Write(b)
	return err
}

func (h *H2Conn) read() {
	defer close(h.done)
	defer close(h.frames)
	r := bufio.NewReader(h.c)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			h.err = err
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		f := Frame{Type: hdr[3], Flags: hdr[4], Stream: binary.BigEndian.Uint32(hdr[5:]) & MaxStreamID, Payload: make([]byte, n)}
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			h.err = err
			return
		}
		switch {
		case f.Type == FrameSettings && f.Flags&flagAck == 0:
			h.write(appendFrame(nil, FrameSettings, flagAck, 0, nil))
			continue
		case f.Type == FramePing && f.Flags&flagAck == 0:
			h.write(appendFrame(nil, FramePing, flagAck, 0, f.Payload))
			continue
		case f.Type == FrameSettings, f.Type == FramePing, f.Type == FrameWindowUpdate:
			continue
		}
		h.frames <- f
	}
}

// hpackLiteral appends a header field as a literal without indexing, with
// a new name and no Huffman coding (RFC 7541 §6.2.2).
func hpackLiteral(b []byte, name, value string) []byte {
	b = append(b, 0)
	for _, s := range []string{name, value} {
		b = hpackInt(b, 7, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// hpackInt appends an integer with an n-bit prefix (RFC 7541 §5.1); the
// prefix's high bits are 0 (no Huffman).
func hpackInt(b []byte, n uint, v uint64) []byte {
	max := uint64(1)<<n - 1
	if v < max {
		return append(b, byte(v))
	}
	b = append(b, byte(max))
	for v -= max; v >= 128; v >>= 7 {
		b = append(b, byte(v&0x7f|0x80))
	}
	return append(b, byte(v))
}

// Get sends a GET for path on a new stream and returns its id.
func (h *H2Conn) Get(authority, path string) (uint32, error) {
	h.wmu.Lock()
	id := h.next
	h.next += 2
	h.wmu.Unlock()
	var block []byte
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", authority}, {":path", path}} {
		block = hpackLiteral(block, f[0], f[1])
	}
	return id, h.write(appendFrame(nil, FrameHeaders, flagEndStream|flagEndHeaders, id, block))
}

// Next returns the next frame (SETTINGS, PING and WINDOW_UPDATE aside), or
// ErrQuiet if none came within d, or the read error (io.EOF for a FIN,
// ECONNRESET for a RST) once the server closed the connection.
func (h *H2Conn) Next(d time.Duration) (Frame, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case f, ok := <-h.frames:
		if !ok {
			return Frame{}, h.err
		}
		return f, nil
	case <-t.C:
		return Frame{}, ErrQuiet
	}
}

// Close closes the connection.
func (h *H2Conn) Close() error { return h.c.Close() }
