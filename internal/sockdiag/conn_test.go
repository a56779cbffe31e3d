//go:build linux

package sockdiag

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// nlMsg is one netlink message as the fake kernel sends it.
type nlMsg struct {
	typ, flags uint16
	seq        uint32 // 0: the request's
	data       []byte
}

// fakeKernel answers sock_diag dump requests at the message level, from the
// captured fixture, over a SOCK_SEQPACKET socket pair (datagrams, as
// netlink): each request is checked, and its answer is chosen by the test
// (by family and by how many dumps came before). Answers are packed into
// datagrams of up to batch bytes, as the kernel fills its dump skbs.
type fakeKernel struct {
	t      *testing.T
	v4, v6 [][]byte // inet_diag_msg payloads per family
	batch  int
	answer func(k *fakeKernel, family uint8, dump int, req []byte) []nlMsg
	// raw, when set, is sent as is (sequence numbers patched) instead of
	// an answer: datagrams per family, encoded once.
	raw     map[uint8][][]byte
	mu      sync.Mutex
	dumps   int // requests seen
	lastReq []byte
}

func newFakeKernel(t *testing.T) *fakeKernel {
	k := &fakeKernel{t: t, batch: 32 << 10}
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
func dump(payloads [][]byte, intr bool) []nlMsg {
	msgs := make([]nlMsg, 0, len(payloads)+1)
	for _, p := range payloads {
		msgs = append(msgs, nlMsg{typ: sockDiagByFamily, data: p})
	}
	// The kernel ends a dump with NLMSG_DONE carrying a zero errno.
	msgs = append(msgs, nlMsg{typ: nlmsgDone, data: make([]byte, 4)})
	for i := range msgs {
		msgs[i].flags |= 0x2 // NLM_F_MULTI
		if intr {
			msgs[i].flags |= nlmFDumpIntr
		}
	}
	return msgs
}

// errorAnswer is the kernel's NLMSG_ERROR for a request: the negative
// errno, then the request's own header and payload.
func errorAnswer(errno unix.Errno, req []byte) []nlMsg {
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	return []nlMsg{{typ: nlmsgError, data: append(data, req...)}}
}

func (m nlMsg) appendTo(b []byte, seq uint32) []byte {
	if m.seq != 0 {
		seq = m.seq
	}
	l := nlmsgHdrLen + len(m.data)
	b = binary.NativeEndian.AppendUint32(b, uint32(l))
	b = binary.NativeEndian.AppendUint16(b, m.typ)
	b = binary.NativeEndian.AppendUint16(b, m.flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, m.data...)
	for len(b)%nlmsgAlignTo != 0 {
		b = append(b, 0)
	}
	return b
}

// conn starts the fake and returns a Conn speaking to it; both end with
// the test.
func (k *fakeKernel) conn() *Conn {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		k.t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		k.t.Fatal(err)
	}
	kernel := os.NewFile(uintptr(fds[1]), "fake kernel")
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.serve(kernel)
	}()
	c, err := newConn(os.NewFile(uintptr(fds[0]), "fake sock_diag"), "fake netns")
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() {
		c.Close()
		kernel.Close()
		<-done
	})
	return c
}

// serve answers requests until the other end closes.
func (k *fakeKernel) serve(f *os.File) {
	buf := make([]byte, 1<<16)
	for {
		n, err := f.Read(buf)
		if err != nil || n == 0 {
			return
		}
		req := append([]byte(nil), buf[:n]...)
		if n != requestMsgLen || binary.NativeEndian.Uint16(req[4:6]) != sockDiagByFamily ||
			binary.NativeEndian.Uint16(req[6:8]) != nlmFRequest|nlmFDump {
			k.t.Errorf("unexpected request % x", req)
			return
		}
		seq := binary.NativeEndian.Uint32(req[8:12])
		family := req[nlmsgHdrLen]
		k.mu.Lock()
		k.lastReq = req[nlmsgHdrLen:]
		dumpN := k.dumps
		k.dumps++
		answer := k.answer
		k.mu.Unlock()
		if dgrams := k.raw[family]; dgrams != nil {
			for _, dg := range dgrams {
				for b := dg; len(b) >= nlmsgHdrLen; b = b[binary.NativeEndian.Uint32(b[0:4]):] {
					binary.NativeEndian.PutUint32(b[8:12], seq)
				}
				if _, err := f.Write(dg); err != nil {
					return
				}
			}
			continue
		}
		var msgs []nlMsg
		switch {
		case answer != nil:
			msgs = answer(k, family, dumpN, req)
		case family == afInet:
			msgs = dump(k.v4, false)
		default:
			msgs = dump(k.v6, false)
		}
		for _, dg := range k.encode(msgs, seq) {
			if _, err := f.Write(dg); err != nil {
				return
			}
		}
	}
}

// encode packs messages into datagrams of up to k.batch bytes.
func (k *fakeKernel) encode(msgs []nlMsg, seq uint32) [][]byte {
	var out [][]byte
	var dgram []byte
	for i, m := range msgs {
		dgram = m.appendTo(dgram, seq)
		if i == len(msgs)-1 || len(dgram)+nlmsgHdrLen+len(msgs[i+1].data) > k.batch {
			out = append(out, dgram)
			dgram = nil
		}
	}
	return out
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

// A dump of any size allocates nothing per socket: the messages are
// decoded in place into one reused Socket.
func TestConnEachAllocations(t *testing.T) {
	k := newFakeKernel(t)
	many := func(p [][]byte) [][]byte {
		var out [][]byte
		for len(out) < 5000 {
			out = append(out, p...)
		}
		return out
	}
	v4, v6 := many(k.v4), many(k.v6)
	k.raw = map[uint8][][]byte{afInet: k.encode(dump(v4, false), 0), afInet6: k.encode(dump(v6, false), 0)}
	c := k.conn()
	n := 0
	count := func(*Socket) { n++ }
	allocs := testing.AllocsPerRun(5, func() {
		if err := c.Each(AllStates, count); err != nil {
			t.Fatal(err)
		}
	})
	if want := 6 * (len(v4) + len(v6)); n != want {
		t.Fatalf("visited %d sockets, want %d", n, want)
	}
	t.Logf("%.1f allocations per dump of %d sockets", allocs, len(v4)+len(v6))
	if allocs > 4 {
		t.Fatalf("a dump of %d sockets made %.0f allocations, want at most 4", len(v4)+len(v6), allocs)
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
			k.answer = func(k *fakeKernel, family uint8, n int, _ []byte) []nlMsg {
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
	k.answer = func(k *fakeKernel, family uint8, n int, _ []byte) []nlMsg {
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

// Messages of another sequence number (what an abandoned dump left in the
// socket) are not taken for this dump's.
func TestConnSkipsStaleMessages(t *testing.T) {
	k := newFakeKernel(t)
	k.answer = func(k *fakeKernel, family uint8, _ int, _ []byte) []nlMsg {
		p := k.v4
		if family == afInet6 {
			p = k.v6
		}
		stale := []nlMsg{{typ: sockDiagByFamily, flags: 0x2, seq: 9999, data: p[0]}, {typ: nlmsgDone, flags: 0x2, seq: 9999, data: make([]byte, 4)}}
		return append(stale, dump(p, false)...)
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
			k.answer = func(k *fakeKernel, family uint8, _ int, req []byte) []nlMsg {
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
	k.answer = func(k *fakeKernel, _ uint8, _ int, _ []byte) []nlMsg {
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
