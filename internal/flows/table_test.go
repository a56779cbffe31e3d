package flows

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// TestFlowTableEvents replays event sequences the probe delivers, with and
// without socket cookies (kernels before 5.12 key by 5-tuple and skaddr).
func TestFlowTableEvents(t *testing.T) {
	ap := netip.MustParseAddrPort
	peer := ap("127.0.0.1:7000")
	ev := func(sk, cookie uint64, from, to tcpstate.State, local string) probes.TCPEvent {
		return probes.TCPEvent{SkAddr: sk, Cookie: cookie, OldState: from, NewState: to, Family: unix.AF_INET, Local: ap(local), Remote: peer}
	}
	listen := probes.TCPEvent{SkAddr: 1, Cookie: 1, OldState: tcpstate.Close, NewState: tcpstate.Listen, Family: unix.AF_INET, Local: peer, Remote: ap("0.0.0.0:0")}
	// Two concurrent connects to one peer: both SYN_SENT events carry
	// local port 0.
	connects := []probes.TCPEvent{
		listen,
		ev(10, 100, tcpstate.Close, tcpstate.SynSent, "127.0.0.1:0"),
		ev(11, 101, tcpstate.Close, tcpstate.SynSent, "127.0.0.1:0"),
		ev(10, 100, tcpstate.SynSent, tcpstate.Established, "127.0.0.1:40000"),
		ev(11, 101, tcpstate.SynSent, tcpstate.Established, "127.0.0.1:40001"),
	}
	closes := []probes.TCPEvent{
		ev(10, 100, tcpstate.Established, tcpstate.FinWait1, "127.0.0.1:40000"),
		ev(10, 100, tcpstate.FinWait1, tcpstate.FinWait2, "127.0.0.1:40000"),
		ev(10, 100, tcpstate.FinWait2, tcpstate.Close, "127.0.0.1:40000"),
		ev(11, 101, tcpstate.Established, tcpstate.CloseWait, "127.0.0.1:40001"),
	}
	// The kernel skipped a closing socket's last changes; a new socket at
	// its address shows it gone.
	reuse := []probes.TCPEvent{
		ev(12, 102, tcpstate.Close, tcpstate.SynSent, "127.0.0.1:0"),
		ev(12, 102, tcpstate.SynSent, tcpstate.Established, "127.0.0.1:40002"),
		ev(12, 102, tcpstate.Established, tcpstate.FinWait1, "127.0.0.1:40002"),
		ev(12, 103, tcpstate.Close, tcpstate.SynSent, "127.0.0.1:0"), // same sk, new socket
		ev(12, 103, tcpstate.SynSent, tcpstate.Established, "127.0.0.1:40003"),
	}
	for _, useCookie := range []bool{true, false} {
		tab := NewFlowTable(DefaultPolicy(), useCookie)
		apply := func(evs []probes.TCPEvent) {
			for i := range evs {
				e := evs[i]
				if !useCookie {
					e.Cookie = 0
				}
				tab.Apply(&e, time.Now())
			}
		}
		apply(connects)
		if got, want := tab.Summary(), (Summary{AppListeners: 1, AppOutbound: 2}); got != want || tab.Len() != 3 {
			t.Fatalf("cookie=%v after connects: %+v (%d entries), want %+v", useCookie, got, tab.Len(), want)
		}
		apply(closes)
		if got, want := tab.Summary(), (Summary{AppListeners: 1, AppOutbound: 1}); got != want || tab.Len() != 2 {
			t.Fatalf("cookie=%v after closes: %+v (%d entries), want %+v", useCookie, got, tab.Len(), want)
		}
		apply(reuse)
		if got, want := tab.Summary(), (Summary{AppListeners: 1, AppOutbound: 2}); got != want || tab.Len() != 3 {
			t.Fatalf("cookie=%v after reuse: %+v (%d entries), want %+v", useCookie, got, tab.Len(), want)
		}
		// The listener going re-classifies nothing here but must leave.
		l := listen
		l.OldState, l.NewState = tcpstate.Listen, tcpstate.Close
		if !useCookie {
			l.Cookie = 0
		}
		tab.Apply(&l, time.Now())
		if got := tab.Summary().AppListeners; got != 0 {
			t.Fatalf("cookie=%v: listener still counted", useCookie)
		}
	}
}

// Without cookies, a new listener on the address of one whose close the
// kernel did not report takes over its record (same key); the old kernel
// address then names nothing. A later socket born at that old address is a
// new flow: the live listener stays. (The map-based table kept the old
// address pointing at the listener's key, and turned the listener into the
// new flow.)
func TestFlowTableTupleReuse(t *testing.T) {
	ap := netip.MustParseAddrPort
	any4 := ap("0.0.0.0:0")
	tab := NewFlowTable(DefaultPolicy(), false)
	evs := []probes.TCPEvent{
		{SkAddr: 1, OldState: tcpstate.Close, NewState: tcpstate.Listen, Family: unix.AF_INET, Local: ap("0.0.0.0:8080"), Remote: any4},
		// The first listener's LISTEN→CLOSE is lost; a second one binds
		// the same address.
		{SkAddr: 2, OldState: tcpstate.Close, NewState: tcpstate.Listen, Family: unix.AF_INET, Local: ap("0.0.0.0:8080"), Remote: any4},
		// A connect at the first listener's old address; its
		// CLOSE→SYN_SENT is lost.
		{SkAddr: 1, OldState: tcpstate.SynSent, NewState: tcpstate.Established, Family: unix.AF_INET, Local: ap("10.0.0.2:40000"), Remote: ap("10.0.0.3:443")},
	}
	for i := range evs {
		tab.Apply(&evs[i], time.Now())
	}
	if got, want := tab.Summary(), (Summary{AppListeners: 1, AppOutbound: 1}); got != want || tab.Len() != 2 {
		t.Fatalf("summary %+v (%d entries), want %+v (2)", got, tab.Len(), want)
	}
}

// A resync whose dump the kernel interrupted starts its dump again: what
// the abandoned attempt added and the retry did not show leaves without a
// change; a resync that fails removes nothing.
func TestFlowTableReplaceRetried(t *testing.T) {
	ap := netip.MustParseAddrPort
	sock := func(cookie uint64, state tcpstate.State, local, remote string) sockdiag.Socket {
		return sockdiag.Socket{Family: unix.AF_INET, State: state, Local: ap(local), Remote: ap(remote), Cookie: cookie, Inode: uint32(cookie)}
	}
	l := sock(1, tcpstate.Listen, "0.0.0.0:8080", "0.0.0.0:0")
	a := sock(2, tcpstate.Established, "10.0.0.2:8080", "10.0.0.3:5000")
	b := sock(3, tcpstate.Established, "10.0.0.2:8080", "10.0.0.3:5001")
	c := sock(4, tcpstate.Established, "10.0.0.2:40000", "10.0.0.3:443")
	now := time.Now()
	tab := NewFlowTable(DefaultPolicy(), true)
	tab.Replace([]sockdiag.Socket{l, a}, now)

	tab.beginReplace()
	for _, s := range []sockdiag.Socket{l, b} { // interrupted
		tab.replaceSocket(&s)
	}
	tab.beginReplace()
	for _, s := range []sockdiag.Socket{l, c} {
		tab.replaceSocket(&s)
	}
	var changes []string
	tab.endReplace(now, true, func(c *Change) {
		changes = append(changes, fmt.Sprintf("%d %s→%s", c.Flow.Cookie, c.OldState, c.NewState))
	})
	slices.Sort(changes)
	if want := []string{"2 ESTABLISHED→CLOSE", "4 CLOSE→ESTABLISHED"}; !slices.Equal(changes, want) {
		t.Fatalf("changes %q, want %q", changes, want)
	}
	if got, want := tab.Summary(), (Summary{AppListeners: 1, AppOutbound: 1}); got != want {
		t.Fatalf("summary %+v, want %+v", got, want)
	}

	// A failed dump that showed only b: b joins, nothing leaves.
	tab.beginReplace()
	tab.replaceSocket(&b)
	tab.endReplace(now, false, nil)
	if got, want := tab.Summary(), (Summary{AppListeners: 1, AppInbound: 1, AppOutbound: 1}); got != want || tab.Len() != 3 {
		t.Fatalf("after a failed dump: %+v (%d entries), want %+v (3)", got, tab.Len(), want)
	}
}

// fillTable makes a table of n established sockets (and a listener) from
// a snapshot.
func fillTable(tb testing.TB, n int, useCookie bool) (*FlowTable, []sockdiag.Socket) {
	tb.Helper()
	socks := make([]sockdiag.Socket, 0, n+1)
	socks = append(socks, sockdiag.Socket{Family: unix.AF_INET, State: tcpstate.Listen, Local: netip.MustParseAddrPort("0.0.0.0:8080"),
		Remote: netip.MustParseAddrPort("0.0.0.0:0"), Cookie: 1, Inode: 1})
	for i := range n {
		local := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 16), byte(i >> 8)}), 8080)
		remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), uint16(1024+i%60000))
		socks = append(socks, sockdiag.Socket{Family: unix.AF_INET, State: tcpstate.Established, Local: local, Remote: remote,
			Cookie: uint64(100 + i), Inode: uint32(100 + i), UID: 1000, CgroupID: 5})
	}
	tab := NewFlowTable(DefaultPolicy(), useCookie)
	tab.Replace(socks, time.Now())
	if tab.Len() != n+1 {
		tb.Fatalf("table has %d entries, want %d", tab.Len(), n+1)
	}
	return tab, socks
}

// Once grown, the table allocates nothing per socket: not for events, not
// for a resync of the same sockets, not to walk it.
func TestFlowTableAllocations(t *testing.T) {
	for _, useCookie := range []bool{true, false} {
		tab, socks := fillTable(t, 5000, useCookie)
		now := time.Now()
		evs := make([]probes.TCPEvent, 0, 2*len(socks))
		for i := 1; i < len(socks); i++ {
			s := &socks[i]
			e := probes.TCPEvent{SkAddr: uint64(i) * 64, Cookie: s.Cookie, Family: s.Family, Local: s.Local, Remote: s.Remote, UID: s.UID}
			if !useCookie {
				e.Cookie = 0
			}
			e.OldState, e.NewState = tcpstate.Established, tcpstate.CloseWait
			evs = append(evs, e)
			e.OldState, e.NewState = tcpstate.CloseWait, tcpstate.Established
			evs = append(evs, e)
		}
		tab.Replace(socks, now) // the events' kernel addresses enter the index once
		for i := range evs {
			tab.Apply(&evs[i], now)
		}
		if a := testing.AllocsPerRun(3, func() {
			for i := range evs {
				tab.Apply(&evs[i], now)
			}
		}); a > 0 {
			t.Errorf("cookie=%v: %d events made %.0f allocations", useCookie, len(evs), a)
		}
		if a := testing.AllocsPerRun(3, func() {
			tab.beginReplace()
			for i := range socks {
				tab.replaceSocket(&socks[i])
			}
			tab.endReplace(now, true, nil)
		}); a > 0 {
			t.Errorf("cookie=%v: a resync of %d sockets made %.0f allocations", useCookie, len(socks), a)
		}
		n := 0
		count := func(*TrackedFlow) bool { n++; return true }
		if a := testing.AllocsPerRun(3, func() { tab.Each(now, count) }); a > 0 {
			t.Errorf("cookie=%v: Each made %.0f allocations", useCookie, a)
		}
	}
}

// TestFlowTableBytesPerSocket checks the table's Go heap per socket at
// 100k sockets (docs/benchmarks.md: target 150 bytes): filled from a
// snapshot, with tcp_info (an idle timeout), and from events (whose kernel
// addresses the table indexes too), IPv4 and IPv6.
func TestFlowTableBytesPerSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 100k-socket tables")
	}
	const n = 100000
	measure := func(name string, fill func() *FlowTable) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tab := fill()
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := float64(after.HeapAlloc-before.HeapAlloc) / float64(tab.Len())
		t.Logf("%s: %d sockets, %.1f bytes of Go heap each (record %d bytes)", name, tab.Len(), per, unsafe.Sizeof(record{}))
		if per > 150 {
			t.Errorf("%s: %.1f bytes per socket, want at most 150", name, per)
		}
		runtime.KeepAlive(tab)
	}
	measure("snapshot", func() *FlowTable { tab, _ := fillTable(t, n, true); return tab })
	measure("snapshot with tcp_info", func() *FlowTable {
		tab, socks := fillTable(t, n, true)
		for i := range socks {
			socks[i].HasInfo, socks[i].LastDataSent = true, time.Second
		}
		tab.Replace(socks, time.Now())
		return tab
	})
	measure("events", func() *FlowTable {
		tab := NewFlowTable(DefaultPolicy(), true)
		for i := range n {
			ev := probes.TCPEvent{SkAddr: uint64(i+1) * 64, Cookie: uint64(i + 1), OldState: tcpstate.SynSent, NewState: tcpstate.Established,
				Family: unix.AF_INET, Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 2}), uint16(1024+i%60000)),
				Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 443)}
			tab.Apply(&ev, time.Now())
		}
		return tab
	})
	measure("events, IPv6", func() *FlowTable {
		tab := NewFlowTable(DefaultPolicy(), true)
		for i := range n {
			ev := probes.TCPEvent{SkAddr: uint64(i+1) * 64, Cookie: uint64(i + 1), OldState: tcpstate.SynSent, NewState: tcpstate.Established,
				Family: unix.AF_INET6, Local: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 15: 2}), uint16(1024+i%60000)),
				Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 1, 14: byte(i >> 8), 15: byte(i)}), 443)}
			tab.Apply(&ev, time.Now())
		}
		return tab
	})
}

// A record keeps its first-seen time to the microsecond below, in 48 bits.
func TestRecordFirstSeen(t *testing.T) {
	for _, tc := range []struct{ in, want time.Duration }{
		{0, 0},
		{1500 * time.Nanosecond, time.Microsecond},
		{90 * 24 * time.Hour, 90 * 24 * time.Hour},
		{maxFirst, maxFirst},
		{maxFirst + time.Hour, maxFirst},
		{-time.Second, 0},
	} {
		var r record
		r.setFirst(tc.in)
		if got := r.first(); got != tc.want {
			t.Errorf("setFirst(%v): first() = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// Cgroup ids are kept once per table; past 65,535 distinct ids a socket's
// reads back as none rather than as another's.
func TestFlowTableCgroupIndex(t *testing.T) {
	tab := NewFlowTable(Policy{}, true)
	if got := tab.cgroupIndex(0); got != 0 {
		t.Fatalf("cgroup 0: index %d, want 0", got)
	}
	a, b := tab.cgroupIndex(7), tab.cgroupIndex(1344)
	if a == 0 || b == 0 || a == b || tab.cgroupIndex(7) != a {
		t.Fatalf("indexes %d %d (again %d)", a, b, tab.cgroupIndex(7))
	}
	if got := tab.cgroupOf(&record{cgroup: b}); got != 1344 {
		t.Fatalf("cgroupOf = %d, want 1344", got)
	}
	for id := uint64(10_000); len(tab.cgroups) < 1<<16-1; id++ {
		tab.cgroupIndex(id)
	}
	if got := tab.cgroupIndex(1 << 40); got != 0 {
		t.Fatalf("past the list: index %d, want 0", got)
	}
	if got := tab.cgroupIndex(1344); got != b {
		t.Fatalf("a known id past the list's end: index %d, want %d", got, b)
	}
}
