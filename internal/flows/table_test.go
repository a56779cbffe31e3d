package flows

import (
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/sockdiag"
	"golang.org/x/sys/unix"
)

// TestFlowTableEvents replays event sequences the probe delivers, with and
// without socket cookies (kernels before 5.12 key by 5-tuple and skaddr).
func TestFlowTableEvents(t *testing.T) {
	ap := netip.MustParseAddrPort
	peer := ap("127.0.0.1:7000")
	ev := func(sk, cookie uint64, from, to sockdiag.State, local string) probes.TCPEvent {
		return probes.TCPEvent{SkAddr: sk, Cookie: cookie, OldState: from, NewState: to, Family: unix.AF_INET, Local: ap(local), Remote: peer}
	}
	listen := probes.TCPEvent{SkAddr: 1, Cookie: 1, OldState: sockdiag.Close, NewState: sockdiag.Listen, Family: unix.AF_INET, Local: peer, Remote: ap("0.0.0.0:0")}
	// Two concurrent connects to one peer: both SYN_SENT events carry
	// local port 0.
	connects := []probes.TCPEvent{
		listen,
		ev(10, 100, sockdiag.Close, sockdiag.SynSent, "127.0.0.1:0"),
		ev(11, 101, sockdiag.Close, sockdiag.SynSent, "127.0.0.1:0"),
		ev(10, 100, sockdiag.SynSent, sockdiag.Established, "127.0.0.1:40000"),
		ev(11, 101, sockdiag.SynSent, sockdiag.Established, "127.0.0.1:40001"),
	}
	closes := []probes.TCPEvent{
		ev(10, 100, sockdiag.Established, sockdiag.FinWait1, "127.0.0.1:40000"),
		ev(10, 100, sockdiag.FinWait1, sockdiag.FinWait2, "127.0.0.1:40000"),
		ev(10, 100, sockdiag.FinWait2, sockdiag.Close, "127.0.0.1:40000"),
		ev(11, 101, sockdiag.Established, sockdiag.CloseWait, "127.0.0.1:40001"),
	}
	// The kernel skipped a closing socket's last changes; a new socket at
	// its address shows it gone.
	reuse := []probes.TCPEvent{
		ev(12, 102, sockdiag.Close, sockdiag.SynSent, "127.0.0.1:0"),
		ev(12, 102, sockdiag.SynSent, sockdiag.Established, "127.0.0.1:40002"),
		ev(12, 102, sockdiag.Established, sockdiag.FinWait1, "127.0.0.1:40002"),
		ev(12, 103, sockdiag.Close, sockdiag.SynSent, "127.0.0.1:0"), // same sk, new socket
		ev(12, 103, sockdiag.SynSent, sockdiag.Established, "127.0.0.1:40003"),
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
		l.OldState, l.NewState = sockdiag.Listen, sockdiag.Close
		if !useCookie {
			l.Cookie = 0
		}
		tab.Apply(&l, time.Now())
		if got := tab.Summary().AppListeners; got != 0 {
			t.Fatalf("cookie=%v: listener still counted", useCookie)
		}
	}
}
