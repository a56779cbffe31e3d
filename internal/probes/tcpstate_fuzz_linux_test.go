package probes

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// encodeEvent writes ev as bpf/tcpstate.c's struct event (the inverse of
// decodeEvent, for the fuzz target).
func encodeEvent(ev *TCPEvent) []byte {
	b := make([]byte, eventSize)
	le := binary.LittleEndian
	le.PutUint64(b[evTs:], uint64(ev.Time))
	le.PutUint64(b[evCookie:], ev.Cookie)
	le.PutUint64(b[evSkaddr:], ev.SkAddr)
	le.PutUint32(b[evUID:], ev.UID)
	b[evOldState], b[evNewState] = byte(ev.OldState), byte(ev.NewState)
	le.PutUint16(b[evFamily:], uint16(ev.Family))
	le.PutUint16(b[evSport:], ev.Local.Port())
	le.PutUint16(b[evDport:], ev.Remote.Port())
	copy(b[evSaddr:evSaddr+16], ev.Local.Addr().AsSlice())
	copy(b[evDaddr:evDaddr+16], ev.Remote.Addr().AsSlice())
	return b
}

// FuzzDecodeTCPEvent: ring-buffer records come from a BPF program and the
// kernel, not from draind: any record either decodes or is refused (too
// short), never a panic; what decodes has addresses of its family and
// encodes back to a record that decodes the same.
func FuzzDecodeTCPEvent(f *testing.F) {
	v4 := TCPEvent{Time: time.Second, Cookie: 7, SkAddr: 0xffff888800001000, UID: 1337, OldState: 1, NewState: 4,
		Family: unix.AF_INET, Local: netip.MustParseAddrPort("10.0.0.1:15006"), Remote: netip.MustParseAddrPort("10.0.0.2:40000")}
	v6 := v4
	v6.Family = unix.AF_INET6
	v6.Local, v6.Remote = netip.MustParseAddrPort("[2001:db8::1]:8080"), netip.MustParseAddrPort("[::ffff:127.0.0.1]:1")
	for _, ev := range []TCPEvent{v4, v6} {
		f.Add(encodeEvent(&ev))
	}
	f.Add([]byte{})
	f.Add(make([]byte, eventSize-1))
	f.Add(make([]byte, eventSize+8))
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev TCPEvent
		if err := decodeEvent(b, &ev); err != nil {
			if len(b) >= eventSize {
				t.Fatalf("a %d-byte record refused: %v", len(b), err)
			}
			return
		}
		if len(b) < eventSize {
			t.Fatalf("a %d-byte record decoded", len(b))
		}
		is6 := ev.Family == unix.AF_INET6
		if ev.Local.Addr().Is6() != is6 || ev.Remote.Addr().Is6() != is6 {
			t.Fatalf("family %d with addresses %v %v", ev.Family, ev.Local, ev.Remote)
		}
		var again TCPEvent
		if err := decodeEvent(encodeEvent(&ev), &again); err != nil || again != ev {
			t.Fatalf("%+v encodes back to %+v (%v)", ev, again, err)
		}
	})
}
