package flows

import (
	"net/netip"
	"testing"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// A pod under Istio's TPROXY interception, as sock_diag shows it
// (docs/interception.md): two client connections through Envoy's inbound
// listener to the app, one call of the app's through Envoy's outbound
// listener. Envoy's accepted inbound sockets keep the original destination
// (the app's port, 8080) as their local address: they are still Envoy's
// downstream (inbound) flows, told by IP_TRANSPARENT.
func TestClassifyTPROXY(t *testing.T) {
	ap := netip.MustParseAddrPort
	sock := func(state tcpstate.State, local, remote string, uid uint32, transparent bool) sockdiag.Socket {
		return sockdiag.Socket{Family: 2, State: state, Local: ap(local), Remote: ap(remote), UID: uid, Transparent: transparent, Inode: 1}
	}
	est, lis := tcpstate.Established, tcpstate.Listen
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
	sock, est := controlSock, tcpstate.Established
	socks := append(controlListeners(),
		sock(est, "127.0.0.1:38580", "127.0.0.1:15000", 0),    // draind → admin
		sock(est, "127.0.0.1:15000", "127.0.0.1:38580", 1337), // Envoy's side
		sock(est, "192.0.2.1:15020", "192.0.2.9:41000", 0),    // the kubelet's probe
		sock(est, "192.0.2.1:8080", "192.0.2.2:40001", 1000),  // traffic
	)
	got := NewClassifier(controlPolicy(15020)).Classify(socks).Summary
	want := Summary{AppListeners: 1, ProxyListeners: 2, AppInbound: 1, Control: 3}
	if got != want {
		t.Errorf("summary %+v\nwant    %+v", got, want)
	}
}

// Port rules match the listening side only. In a pod that widened
// net.ipv4.ip_local_port_range (a safe sysctl in Kubernetes: "1024 65000"
// is common) the app's connections get ephemeral ports like 15000 or 15090;
// they stay the app's, and hold the drain. (Found by the 100k-flow
// footprint benchmark, whose namespace widens the range: 6 of 200,000 app
// sockets were counted as control traffic.)
func TestClassifyEphemeralPortsMatchNoPortRule(t *testing.T) {
	sock, est := controlSock, tcpstate.Established
	p, listeners := controlPolicy(15020, 15001), controlListeners()
	tests := []struct {
		name      string
		sock      sockdiag.Socket
		owner     Owner
		dir       Direction
		control   bool
		holdsFlow bool
	}{
		// An app client whose ephemeral port is a control port nobody
		// listens on (Envoy's metrics listener absent), and the app
		// server's side of it.
		{"app client from :15090", sock(est, "127.0.0.1:15090", "127.0.0.1:8080", 1000), OwnerApp, DirOutbound, false, true},
		{"app server, peer :15090", sock(est, "127.0.0.1:8080", "127.0.0.1:15090", 1000), OwnerApp, DirInbound, false, true},
		// An app client from :15021 to a remote service.
		{"app client from :15021", sock(est, "192.0.2.1:15021", "192.0.2.2:9090", 1000), OwnerApp, DirOutbound, false, true},
		// An app client whose ephemeral port is a proxy port (not bound:
		// a TPROXY pod has no listener on 15001).
		{"app client from :15001", sock(est, "192.0.2.1:15001", "192.0.2.2:9090", 1000), OwnerApp, DirOutbound, false, true},
		// The app's server socket whose peer's ephemeral port is the
		// admin port: the peer is a client, not Envoy's admin API.
		{"app server, peer :15000", sock(est, "127.0.0.1:8080", "127.0.0.1:15000", 1000), OwnerApp, DirInbound, false, true},
		// What the rules are for still holds.
		{"draind → admin", sock(est, "127.0.0.1:38580", "127.0.0.1:15000", 0), OwnerProxy, DirOutbound, true, true},
		{"admin's accepted side", sock(est, "127.0.0.1:15000", "127.0.0.1:38580", 1337), OwnerProxy, DirInbound, true, true},
		{"probe on the status port", sock(est, "192.0.2.1:15020", "192.0.2.9:41000", 0), OwnerProxy, DirInbound, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClassifier(p)
			c.Classify(listeners)
			f := c.Flow(&tt.sock)
			if f.Owner != tt.owner || f.Direction != tt.dir || f.Control != tt.control || f.Holds != tt.holdsFlow {
				t.Errorf("%s → %s: owner %s, %s, control %v, holds %v; want %s, %s, %v, %v",
					tt.sock.Local, tt.sock.Remote, f.Owner, f.Direction, f.Control, f.Holds, tt.owner, tt.dir, tt.control, tt.holdsFlow)
			}
		})
	}
}

// controlPolicy is the policy of a pod with draind's status port (15020) and
// Envoy's admin API (15000), the proxy's ports given.
func controlPolicy(proxyPorts ...uint16) Policy {
	p := DefaultPolicy()
	p.ProxyPorts = proxyPorts
	p.ProxyRemotePorts = []uint16{15000, 15020}
	p.ControlPorts = []uint16{15020, 15021, 15090, 15000}
	return p
}

// controlListeners are that pod's listeners: Envoy's admin, draind's
// status port, the app's 8080.
func controlListeners() []sockdiag.Socket {
	lis := tcpstate.Listen
	return []sockdiag.Socket{
		controlSock(lis, "127.0.0.1:15000", "0.0.0.0:0", 1337),
		controlSock(lis, "0.0.0.0:15020", "0.0.0.0:0", 0),
		controlSock(lis, "0.0.0.0:8080", "0.0.0.0:0", 1000),
	}
}

// controlSock is an IPv4 socket of that pod.
func controlSock(state tcpstate.State, local, remote string, uid uint32) sockdiag.Socket {
	ap := netip.MustParseAddrPort
	return sockdiag.Socket{Family: 2, State: state, Local: ap(local), Remote: ap(remote), UID: uid, Inode: 1}
}
