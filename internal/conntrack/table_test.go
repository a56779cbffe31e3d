package conntrack

import (
	"net/netip"
	"testing"
	"time"
)

// TestFlowTableEvents replays event sequences the probe delivers, with and
// without socket cookies (kernels before 5.12 key by 5-tuple and skaddr).
func TestFlowTableEvents(t *testing.T) {
	ap := netip.MustParseAddrPort
	peer := ap("127.0.0.1:7000")
	ev := func(sk, cookie uint64, from, to State, local string) Event {
		return Event{SkAddr: sk, Cookie: cookie, OldState: from, NewState: to, Family: afInet, Local: ap(local), Remote: peer}
	}
	listen := Event{SkAddr: 1, Cookie: 1, OldState: Close, NewState: Listen, Family: afInet, Local: peer, Remote: ap("0.0.0.0:0")}
	// Two concurrent connects to one peer: both SYN_SENT events carry
	// local port 0.
	connects := []Event{
		listen,
		ev(10, 100, Close, SynSent, "127.0.0.1:0"),
		ev(11, 101, Close, SynSent, "127.0.0.1:0"),
		ev(10, 100, SynSent, Established, "127.0.0.1:40000"),
		ev(11, 101, SynSent, Established, "127.0.0.1:40001"),
	}
	closes := []Event{
		ev(10, 100, Established, FinWait1, "127.0.0.1:40000"),
		ev(10, 100, FinWait1, FinWait2, "127.0.0.1:40000"),
		ev(10, 100, FinWait2, Close, "127.0.0.1:40000"),
		ev(11, 101, Established, CloseWait, "127.0.0.1:40001"),
	}
	// The kernel skipped a closing socket's last changes; a new socket at
	// its address shows it gone.
	reuse := []Event{
		ev(12, 102, Close, SynSent, "127.0.0.1:0"),
		ev(12, 102, SynSent, Established, "127.0.0.1:40002"),
		ev(12, 102, Established, FinWait1, "127.0.0.1:40002"),
		ev(12, 103, Close, SynSent, "127.0.0.1:0"), // same sk, new socket
		ev(12, 103, SynSent, Established, "127.0.0.1:40003"),
	}
	for _, useCookie := range []bool{true, false} {
		tab := NewFlowTable(DefaultPolicy(), useCookie)
		apply := func(evs []Event) {
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
		l.OldState, l.NewState = Listen, Close
		if !useCookie {
			l.Cookie = 0
		}
		tab.Apply(&l, time.Now())
		if got := tab.Summary().AppListeners; got != 0 {
			t.Fatalf("cookie=%v: listener still counted", useCookie)
		}
	}
}
