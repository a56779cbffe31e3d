package flows

import (
	"net/netip"
	"testing"

	"github.com/draind/draind/internal/sockdiag"
)

// A pod under Istio's TPROXY interception, as sock_diag shows it
// (docs/interception.md): two client connections through Envoy's inbound
// listener to the app, one call of the app's through Envoy's outbound
// listener. Envoy's accepted inbound sockets keep the original destination
// (the app's port, 8080) as their local address: they are still Envoy's
// downstream (inbound) flows, told by IP_TRANSPARENT.
func TestClassifyTPROXY(t *testing.T) {
	ap := netip.MustParseAddrPort
	sock := func(state sockdiag.State, local, remote string, uid uint32, transparent bool) sockdiag.Socket {
		return sockdiag.Socket{Family: 2, State: state, Local: ap(local), Remote: ap(remote), UID: uid, Transparent: transparent, Inode: 1}
	}
	est, lis := sockdiag.Established, sockdiag.Listen
	socks := []sockdiag.Socket{
		sock(lis, "0.0.0.0:15006", "0.0.0.0:0", 1337, true),
		sock(lis, "0.0.0.0:15001", "0.0.0.0:0", 1337, true),
		sock(lis, "0.0.0.0:8080", "0.0.0.0:0", 1000, false),
		// Two clients through the inbound listener, on to the app.
		sock(est, "192.0.2.1:8080", "192.0.2.2:40001", 1337, true),
		sock(est, "192.0.2.1:8080", "192.0.2.2:40002", 1337, true),
		sock(est, "127.0.0.6:50001", "192.0.2.1:8080", 1337, false),
		sock(est, "127.0.0.6:50002", "192.0.2.1:8080", 1337, false),
		sock(est, "192.0.2.1:8080", "127.0.0.6:50001", 1000, false),
		sock(est, "192.0.2.1:8080", "127.0.0.6:50002", 1000, false),
		// The app's call out, through the outbound listener.
		sock(est, "192.0.2.1:40100", "192.0.2.2:9090", 1000, false),
		sock(est, "127.0.0.1:15001", "192.0.2.1:40100", 1337, true),
		sock(est, "192.0.2.1:40200", "192.0.2.2:9090", 1337, false),
	}
	snap := NewClassifier(DefaultPolicy()).Classify(socks)
	want := Summary{AppListeners: 1, AppInbound: 2, AppOutbound: 1, ProxyListeners: 2,
		ProxyFlows: 6, ProxyInbound: 3, ProxyOutbound: 3}
	if snap.Summary != want {
		t.Errorf("summary %+v\nwant    %+v", snap.Summary, want)
	}
	for _, f := range snap.Flows {
		if f.Owner == OwnerProxy && f.Transparent && f.Direction != DirInbound {
			t.Errorf("Envoy's accepted %s → %s is %s, want inbound", f.Local, f.Remote, f.Direction)
		}
	}

	// Envoy's connection to the app from the client's own address
	// (original_src): transparent too, but its peer is the app's listener.
	orig := sock(est, "192.0.2.2:40003", "192.0.2.1:8080", 1337, true)
	c := NewClassifier(DefaultPolicy())
	c.Classify(socks[:3])
	if f := c.Flow(&orig); f.Direction != DirOutbound {
		t.Errorf("original_src upstream to the app: %s, want outbound", f.Direction)
	}
}

// The pod's control plane — draind asking Envoy's admin API, a probe on
// draind's status port, a scrape of Envoy's metrics — is neither the app's
// traffic nor the proxy's.
func TestClassifyControlTraffic(t *testing.T) {
	ap := netip.MustParseAddrPort
	sock := func(state sockdiag.State, local, remote string, uid uint32) sockdiag.Socket {
		return sockdiag.Socket{Family: 2, State: state, Local: ap(local), Remote: ap(remote), UID: uid, Inode: 1}
	}
	est, lis := sockdiag.Established, sockdiag.Listen
	p := DefaultPolicy()
	p.ProxyPorts = []uint16{15020}
	p.ProxyRemotePorts = []uint16{15000, 15020}
	p.ControlPorts = []uint16{15020, 15021, 15090, 15000}
	socks := []sockdiag.Socket{
		sock(lis, "127.0.0.1:15000", "0.0.0.0:0", 1337),
		sock(lis, "0.0.0.0:15020", "0.0.0.0:0", 0),
		sock(lis, "0.0.0.0:8080", "0.0.0.0:0", 1000),
		sock(est, "127.0.0.1:38580", "127.0.0.1:15000", 0),    // draind → admin
		sock(est, "127.0.0.1:15000", "127.0.0.1:38580", 1337), // Envoy's side
		sock(est, "192.0.2.1:15020", "192.0.2.9:41000", 0),    // the kubelet's probe
		sock(est, "192.0.2.1:8080", "192.0.2.2:40001", 1000),  // traffic
	}
	got := NewClassifier(p).Classify(socks).Summary
	want := Summary{AppListeners: 1, ProxyListeners: 2, AppInbound: 1, Control: 3}
	if got != want {
		t.Errorf("summary %+v\nwant    %+v", got, want)
	}
}
