package sockdiag

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/draind/draind/internal/tcpstate"
)

// readFixture splits a fixture file: each message is a little-endian u32
// length followed by that many bytes of inet_diag_msg and attributes, as
// the kernel sent them (captured by TestCaptureFixtures).
func readFixture(tb testing.TB, name string) [][]byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "sockdiag", name))
	if err != nil {
		tb.Fatal(err)
	}
	var msgs [][]byte
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		if 4+n > len(b) {
			tb.Fatalf("%s: truncated fixture", name)
		}
		msgs = append(msgs, b[4:4+n])
		b = b[4+n:]
	}
	return msgs
}

func TestParseFixtures(t *testing.T) {
	msgs := readFixture(t, "mixed.bin")
	if len(msgs) < 7 {
		t.Fatalf("fixture has %d messages", len(msgs))
	}
	seen := map[tcpstate.State]int{}
	var v4, v6 int
	for i, m := range msgs {
		var s Socket
		if err := ParseMessage(m, &s); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		seen[s.State]++
		if s.Local.Addr().Is4() {
			v4++
		} else {
			v6++
		}
		if s.State != tcpstate.TimeWait && s.Cookie == 0 {
			t.Errorf("message %d (%s): zero cookie", i, s.State)
		}
		if s.State == tcpstate.Established && !s.HasInfo {
			t.Errorf("message %d: established without tcp_info", i)
		}
	}
	for _, st := range []tcpstate.State{tcpstate.Listen, tcpstate.Established, tcpstate.TimeWait, tcpstate.CloseWait} {
		if seen[st] == 0 {
			t.Errorf("fixture has no %s socket (states %v)", st, seen)
		}
	}
	if v4 == 0 || v6 == 0 {
		t.Errorf("fixture has %d IPv4 and %d IPv6 sockets, want both", v4, v6)
	}
}

func TestParseMessage(t *testing.T) {
	base := func() []byte {
		b := make([]byte, msgLen)
		b[0], b[1] = afInet, byte(tcpstate.Established)
		binary.BigEndian.PutUint16(b[4:], 8080)
		binary.BigEndian.PutUint16(b[6:], 41000)
		copy(b[8:], []byte{127, 0, 0, 1})
		copy(b[24:], []byte{10, 0, 0, 2})
		binary.NativeEndian.PutUint32(b[44:], 0x1234)
		binary.NativeEndian.PutUint32(b[48:], 0x1)
		binary.NativeEndian.PutUint32(b[64:], 1337)
		binary.NativeEndian.PutUint32(b[68:], 99)
		return b
	}
	queued := base()
	binary.NativeEndian.PutUint32(queued[60:], 4096) // idiag_wqueue
	attr := func(typ uint16, payload []byte) []byte {
		a := make([]byte, 4, 4+len(payload)+3)
		binary.NativeEndian.PutUint16(a, uint16(4+len(payload)))
		binary.NativeEndian.PutUint16(a[2:], typ)
		a = append(a, payload...)
		for len(a)%4 != 0 {
			a = append(a, 0)
		}
		return a
	}
	info := make([]byte, 232)
	binary.NativeEndian.PutUint32(info[tcpiLastDataSent:], 1500)
	binary.NativeEndian.PutUint32(info[tcpiLastDataRecv:], 700)
	binary.NativeEndian.PutUint32(info[tcpiDataSegsIn:], 3)
	binary.NativeEndian.PutUint32(info[tcpiDataSegsOut:], 4)
	cg := binary.NativeEndian.AppendUint64(nil, 4242)

	tests := []struct {
		name    string
		msg     []byte
		want    Socket
		wantErr error
	}{
		{"bare v4", base(), Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234}, nil},
		{"with info and cgroup", append(append(base(), attr(attrInfo, info)...), attr(attrCgroupID, cg)...),
			Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234,
				CgroupID: 4242, HasInfo: true, LastDataSent: 1500 * time.Millisecond, LastDataRecv: 700 * time.Millisecond, DataSegsIn: 3, DataSegsOut: 4}, nil},
		{"send queue", queued, Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234, SendQueue: 4096}, nil},
		{"transparent", append(base(), attr(attrSockopt, []byte{0x72, 0})...), Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234, Transparent: true}, nil},
		{"not transparent", append(base(), attr(attrSockopt, []byte{0x52, 0})...), Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234}, nil},
		{"short tcp_info ignored", append(base(), attr(attrInfo, info[:40])...), Socket{Family: afInet, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.MustParseAddrPort("10.0.0.2:41000"), UID: 1337, Inode: 99, Cookie: 0x1_0000_1234}, nil},
		{"truncated", base()[:50], Socket{}, ErrShortMessage},
		{"bad attr length", append(base(), 0xff, 0x00, 0x02, 0x00), Socket{}, ErrShortMessage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Socket
			err := ParseMessage(tt.msg, &s)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err == nil && s != tt.want {
				t.Fatalf("got %+v\nwant %+v", s, tt.want)
			}
		})
	}
	// A v4-mapped address on an IPv6 socket reads as IPv4.
	b := base()
	b[0] = afInet6
	copy(b[8:24], netip.MustParseAddr("::ffff:127.0.0.1").AsSlice())
	var s Socket
	if err := ParseMessage(b, &s); err != nil || s.Local.String() != "127.0.0.1:8080" {
		t.Fatalf("mapped: %v %v", s.Local, err)
	}
}

func FuzzParseMessage(f *testing.F) {
	for _, name := range []string{"mixed.bin"} {
		for _, m := range readFixture(f, name) {
			f.Add(m)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Socket
		if err := ParseMessage(b, &s); err != nil {
			return
		}
		// What parses must be a socket the rest of draind can take.
		if s.Family != afInet && s.Family != afInet6 {
			t.Fatalf("parsed a socket of family %d", s.Family)
		}
		if s.HasInfo && (s.LastDataSent < 0 || s.LastDataRecv < 0) {
			t.Fatalf("negative idle times: %+v", s)
		}
	})
}
