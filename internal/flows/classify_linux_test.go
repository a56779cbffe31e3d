package flows

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
	"github.com/draind/draind/internal/testenv/testutil"
)

// TestMain lets the test binary double as a helper process (a listener
// running under another uid).
func TestMain(m *testing.M) {
	testutil.RunHelper()
	code := m.Run()
	testutil.RemoveSelfCopy()
	os.Exit(code)
}

func dialNS(t testing.TB, ns *testutil.NetNS) *sockdiag.Conn {
	t.Helper()
	h, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	d, err := sockdiag.Dial(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func snapshot(t *testing.T, d *sockdiag.Conn, p Policy) Snapshot {
	t.Helper()
	socks, err := d.Sockets(sockdiag.AllStates)
	if err != nil {
		t.Fatal(err)
	}
	return NewClassifier(p).Classify(socks)
}

func TestSnapshotAttribution(t *testing.T) {
	ns := testutil.NewNetNS(t)
	const proxy = DefaultProxyUID
	app8080 := ns.ListenAs(t, 0, "0.0.0.0:8080")
	app8081 := ns.ListenAs(t, 0, "127.0.0.1:8081")
	ns.ListenAs(t, 0, "[::]:8082")
	app8083 := ns.ListenAs(t, 0, "[::1]:8083")
	px15001 := ns.ListenAs(t, proxy, "0.0.0.0:15001")
	px15006 := ns.ListenAs(t, proxy, "[::]:15006")

	// 1. proxy → app (inbound request for the app).
	ns.DialAs(t, proxy, "127.0.0.1:8080")
	testutil.Accept(t, app8080)
	// 2. app → proxy outbound listener.
	ns.DialAs(t, 0, "127.0.0.1:15001")
	testutil.AcceptAs(t, px15001, proxy)
	// 3. app → app over IPv6 loopback.
	ns.DialAs(t, 0, "[::1]:8083")
	testutil.Accept(t, app8083)
	// 4. CLOSE_WAIT: the proxy closes a flow the app keeps open.
	ns.DialAs(t, 0, "[::1]:15006")
	testutil.AcceptAs(t, px15006, proxy).Close()
	// 5. TIME_WAIT: the app's client closes first, then the server.
	c := ns.DialAs(t, 0, "127.0.0.1:8081")
	s := testutil.Accept(t, app8081)
	c.Close()
	time.Sleep(10 * time.Millisecond)
	s.Close()

	d := dialNS(t, ns)
	want := Summary{AppListeners: 4, AppInbound: 2, AppOutbound: 3, ProxyListeners: 2, ProxyFlows: 2, ProxyInbound: 1, ProxyOutbound: 1, Closing: 2}
	var snap Snapshot
	testutil.Eventually(t, "summary", func() error {
		snap = snapshot(t, d, DefaultPolicy())
		if snap.Summary != want {
			return fmt.Errorf("got %+v, want %+v", snap.Summary, want)
		}
		return nil
	})

	var states = map[tcpstate.State]int{}
	for _, f := range snap.Flows {
		states[f.State]++
		if f.State == tcpstate.CloseWait && (f.Owner != OwnerApp || f.Direction != DirOutbound || !f.Holds) {
			t.Errorf("CLOSE_WAIT flow: %+v, want app outbound holding", f)
		}
		if f.State == tcpstate.TimeWait && (f.Holds || f.HasInfo) {
			t.Errorf("TIME_WAIT flow holds or has tcp_info: %+v", f)
		}
		if f.State == tcpstate.Established && !f.HasInfo {
			t.Errorf("established flow without tcp_info: %+v", f)
		}
	}
	for _, st := range []tcpstate.State{tcpstate.CloseWait, tcpstate.TimeWait, tcpstate.FinWait2} {
		if states[st] != 1 {
			t.Errorf("%d flows in %s, want 1 (states: %v)", states[st], st, states)
		}
	}
	wantListeners := map[string]Owner{
		"0.0.0.0:8080": OwnerApp, "127.0.0.1:8081": OwnerApp, "[::]:8082": OwnerApp, "[::1]:8083": OwnerApp,
		"0.0.0.0:15001": OwnerProxy, "[::]:15006": OwnerProxy,
	}
	for _, l := range snap.Listeners {
		o, ok := wantListeners[l.Local.String()]
		if !ok || o != l.Owner {
			t.Errorf("listener %s owner %s: unexpected", l.Local, l.Owner)
		}
		if l.Cookie == 0 || l.Inode == 0 {
			t.Errorf("listener %s: cookie %d inode %d", l.Local, l.Cookie, l.Inode)
		}
	}
	if len(snap.Listeners) != len(wantListeners) {
		t.Errorf("%d listeners, want %d", len(snap.Listeners), len(wantListeners))
	}
}

func TestSnapshotOtherUIDProcess(t *testing.T) {
	ns := testutil.NewNetNS(t)
	// A real process running as the proxy uid, and one as another uid.
	proxyAddr := ns.StartHelper(t, DefaultProxyUID, "listen 127.0.0.1:15001")
	appAddr := ns.StartHelper(t, 1000, "listen [::1]:9000")
	ns.DialAs(t, 0, proxyAddr)
	ns.DialAs(t, 0, appAddr)

	d := dialNS(t, ns)
	// The test process's clients: app outbound (uid 0) and app outbound to
	// the uid-1000 app (app → app: the client side is outbound, the
	// accepted side inbound).
	want := Summary{AppListeners: 1, ProxyListeners: 1, ProxyFlows: 1, ProxyInbound: 1, AppOutbound: 2, AppInbound: 1}
	testutil.Eventually(t, "summary", func() error {
		got := snapshot(t, d, DefaultPolicy()).Summary
		if got != want {
			return fmt.Errorf("got %+v, want %+v", got, want)
		}
		return nil
	})
	// --proxy-ports makes the uid-1000 listener and its flow the proxy's.
	p := DefaultPolicy()
	p.ProxyPorts = []uint16{9000}
	got := snapshot(t, d, p).Summary
	want = Summary{ProxyListeners: 2, ProxyFlows: 2, ProxyInbound: 2, AppOutbound: 2}
	if got != want {
		t.Errorf("with proxy port 9000: got %+v, want %+v", got, want)
	}
}

// TestSnapshotIdle: a flow owing a response is never idle (docs/design.md,
// "Idle means idle"); once the exchange is done, both ends are idle since
// its last byte and stop holding past the idle timeout.
func TestSnapshotIdle(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:8080")
	c := ns.DialAs(t, 0, "127.0.0.1:8080")
	srv := testutil.Accept(t, ln)
	d := dialNS(t, ns)
	p := DefaultPolicy()
	p.IdleTimeout = 100 * time.Millisecond
	buf := make([]byte, 1)

	// A request sent, not answered: the server owes a response, the client
	// awaits it. Neither is idle however long it waits.
	c.Write([]byte("q"))
	srv.Read(buf)
	time.Sleep(300 * time.Millisecond)
	snap := snapshot(t, d, p)
	if got, want := snap.Summary, (Summary{AppListeners: 1, AppInbound: 1, AppOutbound: 1}); got != want {
		t.Errorf("request in flight: got %+v, want %+v", got, want)
	}
	// The response: the exchange is done, both ends idle from now on.
	srv.Write([]byte("r"))
	c.Read(buf)
	time.Sleep(300 * time.Millisecond)
	snap = snapshot(t, d, p)
	if got, want := snap.Summary, (Summary{AppListeners: 1, AppInbound: 1, AppOutbound: 1, AppIdle: 2}); got != want {
		t.Errorf("after the response: got %+v, want %+v", got, want)
	}
	if got := snap.Summary.AppHolding(); got != 0 {
		t.Errorf("AppHolding = %d, want 0", got)
	}
	for _, f := range snap.Flows {
		if f.IdleMS < 250 {
			t.Errorf("flow idle %d ms, want ≥ 250", f.IdleMS)
		}
	}
}
