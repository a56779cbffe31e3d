package flows

import (
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

func TestIdle(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name       string
		dir        Direction
		sent, recv time.Duration // time since the last send / receive
		in, out    uint32        // data segments received, sent
		want       time.Duration
	}{
		{"server: the request came in the jiffy the connection was made", DirInbound, 2000 * ms, 2000 * ms, 1, 0, 0},
		{"client: the request went out in the jiffy the connection was made", DirOutbound, 2000 * ms, 2000 * ms, 0, 1, 0},
		{"server: answered in the same jiffy", DirInbound, 500 * ms, 500 * ms, 1, 1, 500 * ms},
		{"server: an unused connection", DirInbound, 500 * ms, 500 * ms, 0, 0, 500 * ms},
		{"server: request in flight (received 8 s ago, answered nothing since)", DirInbound, 9000 * ms, 8000 * ms, 3, 2, 0},
		{"server: keep-alive after its response", DirInbound, 3000 * ms, 3005 * ms, 3, 3, 3000 * ms},
		{"server: streaming a response", DirInbound, 10 * ms, 60000 * ms, 1, 50, 10 * ms},
		{"client: awaiting a response", DirOutbound, 8000 * ms, 9000 * ms, 2, 3, 0},
		{"client: pooled after its response", DirOutbound, 3005 * ms, 3000 * ms, 3, 3, 3000 * ms},
		{"client: receiving a stream", DirOutbound, 60000 * ms, 10 * ms, 50, 1, 10 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sockdiag.Socket{State: tcpstate.Established, HasInfo: true, LastDataSent: tt.sent, LastDataRecv: tt.recv, DataSegsIn: tt.in, DataSegsOut: tt.out}
			if got := Idle(&s, tt.dir); got != tt.want {
				t.Fatalf("Idle = %s, want %s", got, tt.want)
			}
		})
	}
	// A response the client reads slowly: nothing sent for 5 s (its window
	// is closed), bytes still queued.
	stalled := sockdiag.Socket{State: tcpstate.Established, HasInfo: true, LastDataSent: 5 * time.Second, LastDataRecv: 6 * time.Second, DataSegsIn: 1, DataSegsOut: 40, SendQueue: 1 << 20}
	if got := Idle(&stalled, DirInbound); got != 0 {
		t.Errorf("a stalled response: %s, want 0 (busy)", got)
	}
	stalled.Local, stalled.Remote = netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:40000")
	tab := NewFlowTable(Policy{}, true)
	tab.Replace([]sockdiag.Socket{stalled}, time.Now())
	if fl := tab.Flows(time.Now(), nil); len(fl) != 1 || fl[0].IdleMS != 0 {
		t.Errorf("a stalled response, through the table: %+v, want one flow idle 0 ms", fl)
	}
	if got := Idle(&sockdiag.Socket{LastDataSent: time.Hour, LastDataRecv: time.Hour}, DirInbound); got != 0 {
		t.Errorf("without tcp_info: %s, want 0", got)
	}
}
