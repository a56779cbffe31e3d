//go:build linux

package sockdiag

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// fakeKernel answers sock_diag dump requests at the message level, from the
// captured fixture: each request is checked, and its answer is chosen by
// the test (by family and by how many dumps came before).
type fakeKernel struct {
	t       *testing.T
	v4, v6  [][]byte // inet_diag_msg payloads per family
	dumps   int      // requests seen
	answer  func(k *fakeKernel, family uint8, dump int, reqs []netlink.Message) ([]netlink.Message, error)
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

// dump turns payloads into a multi-part answer, flagged as the kernel flags
// an interrupted one when intr is set.
func dump(payloads [][]byte, intr bool) ([]netlink.Message, error) {
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
	return msgs, nil
}

// errorAnswer is the kernel's NLMSG_ERROR for a request: the negative
// errno, then the request's own header and payload.
func errorAnswer(errno unix.Errno, req netlink.Message) ([]netlink.Message, error) {
	hdr, err := req.MarshalBinary()
	if err != nil {
		return nil, err
	}
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: append(data, hdr...)}}, nil
}

func (k *fakeKernel) conn() *Conn {
	nl := nltest.Dial(func(reqs []netlink.Message) ([]netlink.Message, error) {
		if len(reqs) != 1 || reqs[0].Header.Type != sockDiagByFamily || reqs[0].Header.Flags != netlink.Request|netlink.Dump {
			k.t.Errorf("unexpected request %+v", reqs)
			return nil, errors.New("bad request")
		}
		k.lastReq = reqs[0].Data
		family := reqs[0].Data[0]
		n := k.dumps
		k.dumps++
		if k.answer != nil {
			return k.answer(k, family, n, reqs)
		}
		if family == afInet {
			return dump(k.v4, false)
		}
		return dump(k.v6, false)
	})
	return newConn(nl, "fake netns")
}

func TestConnEach(t *testing.T) {
	k := newFakeKernel(t)
	c := k.conn()
	defer c.Close()
	var fams []uint8
	if err := c.Each(AllStates, func(s *Socket) { fams = append(fams, s.Family) }); err != nil {
		t.Fatal(err)
	}
	if len(fams) != len(k.v4)+len(k.v6) || fams[0] != afInet || fams[len(fams)-1] != afInet6 {
		t.Fatalf("visited families %v, want %d IPv4 then %d IPv6", fams, len(k.v4), len(k.v6))
	}
	// The request asks the kernel for the mask and for tcp_info.
	if got := StateMask(binary.NativeEndian.Uint32(k.lastReq[4:8])); got != AllStates || k.lastReq[1] != ipprotoTCP || k.lastReq[2] == 0 {
		t.Errorf("request mask %#x proto %d ext %#x", got, k.lastReq[1], k.lastReq[2])
	}
	c.SetInfo(false)
	if _, err := c.Sockets(ListenMask); err != nil {
		t.Fatal(err)
	}
	if got := StateMask(binary.NativeEndian.Uint32(k.lastReq[4:8])); got != ListenMask || k.lastReq[2] != 0 {
		t.Errorf("without info: request mask %#x ext %#x", got, k.lastReq[2])
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
			k.answer = func(k *fakeKernel, family uint8, n int, _ []netlink.Message) ([]netlink.Message, error) {
				p := k.v4
				if family == afInet6 {
					p = k.v6
				}
				return dump(p, n < tt.interrupted)
			}
			c := k.conn()
			defer c.Close()
			socks, err := c.Sockets(AllStates)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if k.dumps != tt.wantDumps {
				t.Errorf("%d dump requests, want %d", k.dumps, tt.wantDumps)
			}
			if err == nil && len(socks) != len(k.v4)+len(k.v6) {
				t.Errorf("%d sockets after the retry, want %d (no duplicates from the interrupted attempt)", len(socks), len(k.v4)+len(k.v6))
			}
		})
	}
	// Each itself does not retry: it reads the dump to its end and says so.
	k := newFakeKernel(t)
	k.answer = func(k *fakeKernel, family uint8, n int, _ []netlink.Message) ([]netlink.Message, error) {
		return dump(k.v4, family == afInet)
	}
	c := k.conn()
	defer c.Close()
	if err := c.Each(AllStates, func(*Socket) {}); !errors.Is(err, ErrDumpInterrupted) || k.dumps != 2 {
		t.Fatalf("Each: %v after %d dumps, want ErrDumpInterrupted after 2", err, k.dumps)
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
			k.answer = func(k *fakeKernel, family uint8, _ int, reqs []netlink.Message) ([]netlink.Message, error) {
				if family == tt.enoentFamily {
					return errorAnswer(unix.ENOENT, reqs[0])
				}
				return dump(k.v4, false)
			}
			orig := ipv6Disabled
			ipv6Disabled = func() bool { return tt.ipv6Off }
			defer func() { ipv6Disabled = orig }()
			c := k.conn()
			defer c.Close()
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
	k.answer = func(k *fakeKernel, _ uint8, _ int, _ []netlink.Message) ([]netlink.Message, error) {
		return dump([][]byte{k.v4[0][:40]}, false)
	}
	c := k.conn()
	if _, err := c.Sockets(AllStates); !errors.Is(err, ErrShortMessage) {
		t.Fatalf("truncated message: %v, want ErrShortMessage", err)
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
