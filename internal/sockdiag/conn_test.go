//go:build linux

package sockdiag

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// fakeKernel answers sock_diag dump requests at the message level through
// mdlayher/netlink's nltest, from the captured fixture: each request is
// checked, and its answer is chosen by the test (by family and by how many
// dumps came before). nltest hands a multi-part answer out in several
// reads, as the kernel does a dump too big for one datagram.
type fakeKernel struct {
	t      *testing.T
	v4, v6 [][]byte // inet_diag_msg payloads per family
	// answer, when set, builds the answer to the dump-th request (its
	// messages' sequence numbers are the request's unless set).
	answer  func(k *fakeKernel, family uint8, dump int, req netlink.Message) []netlink.Message
	mu      sync.Mutex
	dumps   int // requests seen
	lastReq []byte
}

func newFakeKernel(t *testing.T) *fakeKernel {
	k := &fakeKernel{t: t}
	for _, m := range readFixture(t, "mixed.bin") {
		if m[0] == afInet {
			k.v4 = append(k.v4, m)
		} else {
			k.v6 = append(k.v6, m)
		}
	}
	if len(k.v4) == 0 || len(k.v6) == 0 {
		t.Fatalf("fixture: %d IPv4 and %d IPv6 messages", len(k.v4), len(k.v6))
	}
	return k
}

// dump turns payloads into a multi-part answer ending with NLMSG_DONE,
// flagged as the kernel flags an interrupted one when intr is set.
func dump(payloads [][]byte, intr bool) []netlink.Message {
	msgs := make([]netlink.Message, 0, len(payloads)+1)
	for _, p := range payloads {
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: sockDiagByFamily}, Data: p})
	}
	// The kernel ends a dump with NLMSG_DONE carrying a zero errno.
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
	for i := range msgs {
		msgs[i].Header.Flags |= netlink.Multi
		if intr {
			msgs[i].Header.Flags |= netlink.DumpInterrupted
		}
	}
	return msgs
}

// errorAnswer is the kernel's NLMSG_ERROR for a request: the negative
// errno, then the request's own header and payload.
func errorAnswer(errno unix.Errno, req netlink.Message) []netlink.Message {
	hdr, err := req.MarshalBinary()
	if err != nil {
		panic(err)
	}
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: append(data, hdr...)}}
}

// conn returns a Conn speaking to the fake.
func (k *fakeKernel) conn() *Conn {
	nl := nltest.Dial(func(reqs []netlink.Message) ([]netlink.Message, error) {
		if len(reqs) != 1 || reqs[0].Header.Type != sockDiagByFamily || reqs[0].Header.Flags != netlink.Request|netlink.Dump ||
			len(reqs[0].Data) != reqV2Len {
			k.t.Errorf("unexpected request %+v", reqs)
			return nil, errors.New("bad request")
		}
		req := reqs[0]
		family := req.Data[0]
		k.mu.Lock()
		k.lastReq = append([]byte(nil), req.Data...)
		n := k.dumps
		k.dumps++
		answer := k.answer
		k.mu.Unlock()
		var msgs []netlink.Message
		switch {
		case answer != nil:
			msgs = answer(k, family, n, req)
		case family == afInet:
			msgs = dump(k.v4, false)
		default:
			msgs = dump(k.v6, false)
		}
		for i := range msgs {
			if msgs[i].Header.Sequence == 0 {
				msgs[i].Header.Sequence = req.Header.Sequence
			}
		}
		return msgs, nil
	})
	c := newConn(nl, "fake netns")
	k.t.Cleanup(func() { c.Close() })
	return c
}

func (k *fakeKernel) requests() (int, []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dumps, k.lastReq
}

func TestConnEach(t *testing.T) {
	k := newFakeKernel(t)
	c := k.conn()
	var fams []uint8
	if err := c.Each(AllStates, func(s *Socket) { fams = append(fams, s.Family) }); err != nil {
		t.Fatal(err)
	}
	if len(fams) != len(k.v4)+len(k.v6) || fams[0] != afInet || fams[len(fams)-1] != afInet6 {
		t.Fatalf("visited families %v, want %d IPv4 then %d IPv6", fams, len(k.v4), len(k.v6))
	}
	// The request asks the kernel for the mask and for tcp_info.
	_, req := k.requests()
	if got := StateMask(binary.NativeEndian.Uint32(req[4:8])); got != AllStates || req[1] != ipprotoTCP || req[2] == 0 {
		t.Errorf("request mask %#x proto %d ext %#x", got, req[1], req[2])
	}
	c.SetInfo(false)
	if _, err := c.Sockets(ListenMask); err != nil {
		t.Fatal(err)
	}
	_, req = k.requests()
	if got := StateMask(binary.NativeEndian.Uint32(req[4:8])); got != ListenMask || req[2] != 0 {
		t.Errorf("without info: request mask %#x ext %#x", got, req[2])
	}
}

func TestConnInterruptedDump(t *testing.T) {
	tests := []struct {
		name        string
		interrupted int // dumps (one per family) answered as interrupted
		wantErr     error
		wantDumps   int
	}{
		{"clean", 0, nil, 2},
		{"first attempt interrupted", 1, nil, 4},
		{"IPv6 half interrupted twice", 4, nil, 6},
		{"always interrupted", 1 << 30, ErrDumpInterrupted, 2 * retries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			k.answer = func(k *fakeKernel, family uint8, n int, _ netlink.Message) []netlink.Message {
				p := k.v4
				if family == afInet6 {
					p = k.v6
				}
				return dump(p, n < tt.interrupted)
			}
			c := k.conn()
			socks, err := c.Sockets(AllStates)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if dumps, _ := k.requests(); dumps != tt.wantDumps {
				t.Errorf("%d dump requests, want %d", dumps, tt.wantDumps)
			}
			if err == nil && len(socks) != len(k.v4)+len(k.v6) {
				t.Errorf("%d sockets after the retry, want %d (no duplicates from the interrupted attempt)", len(socks), len(k.v4)+len(k.v6))
			}
		})
	}
	// Each itself does not retry: it reads the dump to its end and says so.
	k := newFakeKernel(t)
	k.answer = func(k *fakeKernel, family uint8, n int, _ netlink.Message) []netlink.Message {
		return dump(k.v4, family == afInet)
	}
	c := k.conn()
	if err := c.Each(AllStates, func(*Socket) {}); !errors.Is(err, ErrDumpInterrupted) {
		t.Fatalf("Each: %v, want ErrDumpInterrupted", err)
	}
	if dumps, _ := k.requests(); dumps != 2 {
		t.Fatalf("Each: %d dumps, want 2", dumps)
	}
}

// Socket messages of another sequence number (what an abandoned dump left
// in the socket) are not taken for this dump's.
func TestConnSkipsStaleMessages(t *testing.T) {
	k := newFakeKernel(t)
	k.answer = func(k *fakeKernel, family uint8, _ int, _ netlink.Message) []netlink.Message {
		p := k.v4
		if family == afInet6 {
			p = k.v6
		}
		stale := netlink.Message{Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Multi, Sequence: 9999}, Data: p[0]}
		return append([]netlink.Message{stale}, dump(p, false)...)
	}
	c := k.conn()
	socks, err := c.Sockets(AllStates)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != len(k.v4)+len(k.v6) {
		t.Fatalf("%d sockets, want %d", len(socks), len(k.v4)+len(k.v6))
	}
}

func TestConnNoInetDiag(t *testing.T) {
	tests := []struct {
		name         string
		enoentFamily uint8
		ipv6Off      bool
		wantErr      error
	}{
		{"no tcp_diag", afInet, false, ErrNoInetDiag},
		{"no IPv6 handler, IPv6 on", afInet6, false, ErrNoInetDiag},
		{"IPv6 disabled", afInet6, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			k.answer = func(k *fakeKernel, family uint8, _ int, req netlink.Message) []netlink.Message {
				if family == tt.enoentFamily {
					return errorAnswer(unix.ENOENT, req)
				}
				return dump(k.v4, false)
			}
			orig := ipv6Disabled
			ipv6Disabled = func() bool { return tt.ipv6Off }
			defer func() { ipv6Disabled = orig }()
			c := k.conn()
			socks, err := c.Sockets(AllStates)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err == nil && len(socks) != len(k.v4) {
				t.Errorf("%d sockets, want the %d IPv4 ones", len(socks), len(k.v4))
			}
		})
	}
}

func TestConnMalformedAndClosed(t *testing.T) {
	k := newFakeKernel(t)
	k.answer = func(k *fakeKernel, _ uint8, _ int, _ netlink.Message) []netlink.Message {
		// A truncated message, then a good one: the dump is read to its
		// end (the next dump must not meet its leftovers).
		return dump([][]byte{k.v4[0][:40], k.v4[0]}, false)
	}
	c := k.conn()
	if _, err := c.Sockets(AllStates); !errors.Is(err, ErrShortMessage) {
		t.Fatalf("truncated message: %v, want ErrShortMessage", err)
	}
	k.mu.Lock()
	k.answer = nil
	k.mu.Unlock()
	if socks, err := c.Sockets(AllStates); err != nil || len(socks) != len(k.v4)+len(k.v6) {
		t.Fatalf("next dump: %d sockets, %v", len(socks), err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Sockets(AllStates); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("after Close: %v, want os.ErrClosed", err)
	}
}
