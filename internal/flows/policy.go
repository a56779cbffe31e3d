package flows

import (
	"time"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// DefaultProxyUID is Istio's convention: Envoy runs as 1337 and iptables
// exempts that uid from redirection.
const DefaultProxyUID = 1337

// HoldsDrain reports whether a flow in state s keeps a drain open
// (docs/design.md, "Who owns a socket"): it can still carry a request or a
// response. A closing socket (FIN_WAIT*, CLOSING, LAST_ACK, TIME_WAIT,
// CLOSE) has nothing left to deliver that the proxy could save. LISTEN is
// not a flow and holds nothing.
func HoldsDrain(s tcpstate.State) bool {
	switch s {
	case tcpstate.Established, tcpstate.SynSent, tcpstate.SynRecv, tcpstate.NewSynRecv, tcpstate.CloseWait:
		return true
	}
	return false
}

// Policy holds the attribution rules (docs/design.md, "Who owns a socket").
type Policy struct {
	// ProxyUID owns the proxy's sockets.
	ProxyUID uint32
	// ProxyPorts are local ports whose listeners and accepted sockets are
	// the proxy's whatever their uid (e.g. an Envoy not running as
	// ProxyUID).
	ProxyPorts []uint16
	// ProxyRemotePorts are remote ports that mark the proxy's connections:
	// a connection made to a loopback address on one of these ports is the
	// proxy's (Envoy's admin API: draind's own calls to it must not count
	// as the app's outbound flows, whatever uid draind runs under).
	ProxyRemotePorts []uint16
	// ControlPorts are the pod's control-plane ports: Envoy's admin API,
	// draind's status server, Envoy's status and metrics listeners. A
	// connection accepted on one of them, or made to one on loopback, is
	// control traffic (probes, scrapes, draind asking Envoy): counted apart,
	// never as the app's or the proxy's traffic. (Ports are matched on the
	// listening side only: the other side's port is ephemeral.)
	ControlPorts []uint16
	// IdleTimeout is the idle time after which a flow stops holding the
	// drain (keep-alive pools). 0 turns it off.
	IdleTimeout time.Duration
}

// DefaultPolicy is the policy with the defaults of docs/design.md.
func DefaultPolicy() Policy { return Policy{ProxyUID: DefaultProxyUID} }

// Flow is a socket with its attribution.
type Flow struct {
	sockdiag.Socket
	Owner     Owner     `json:"owner"`
	Direction Direction `json:"direction"`
	// Holds is true when the flow keeps the drain open: its state holds
	// (see HoldsDrain) and it is not idle past the idle timeout.
	Holds bool `json:"holds"`
	// IdleExpired is true when the state holds but the flow has been idle
	// past Policy.IdleTimeout.
	IdleExpired bool `json:"idle_expired,omitempty"`
	// Control marks control traffic (Policy.ControlPorts).
	Control bool `json:"control,omitempty"`
	// IdleMS is Socket.Idle in milliseconds, or -1 when the kernel sent
	// no tcp_info (TIME_WAIT, request sockets).
	IdleMS int64 `json:"idle_ms"`
}

// Summary counts a namespace's sockets by class. The flow counts include
// only flows whose state holds the drain (ESTABLISHED, SYN_SENT, SYN_RECV,
// CLOSE_WAIT); of those, the *_idle counts are idle past the idle timeout
// and so no longer hold it. Closing counts the rest (FIN_WAIT*, LAST_ACK,
// CLOSING, TIME_WAIT) for information.
type Summary struct {
	AppListeners   int `json:"app_listeners"`
	AppInbound     int `json:"app_inbound"`
	AppOutbound    int `json:"app_outbound"`
	AppIdle        int `json:"app_idle"`
	ProxyListeners int `json:"proxy_listeners"`
	ProxyFlows     int `json:"proxy_flows"`
	// ProxyInbound of the proxy's flows are its downstream (accepted)
	// connections; ProxyOutbound its upstream ones.
	ProxyInbound  int `json:"proxy_inbound"`
	ProxyOutbound int `json:"proxy_outbound"`
	ProxyIdle     int `json:"proxy_idle"`
	// Control counts control traffic (Policy.ControlPorts), whatever its
	// state: neither the app's nor the proxy's flows.
	Control int `json:"control"`
	Closing int `json:"closing"`
}

// SummaryKeys are the summary's JSON keys, in the order of Counts.
var SummaryKeys = [...]string{"app_listeners", "app_inbound", "app_outbound", "app_idle", "proxy_listeners",
	"proxy_flows", "proxy_inbound", "proxy_outbound", "proxy_idle", "control", "closing"}

// Counts are the summary's counts, in the order of SummaryKeys.
func (s *Summary) Counts() [len(SummaryKeys)]int {
	return [...]int{s.AppListeners, s.AppInbound, s.AppOutbound, s.AppIdle, s.ProxyListeners,
		s.ProxyFlows, s.ProxyInbound, s.ProxyOutbound, s.ProxyIdle, s.Control, s.Closing}
}

// AppHolding is the number of app flows that still hold the drain.
func (s Summary) AppHolding() int { return s.AppInbound + s.AppOutbound - s.AppIdle }

// Classifier attributes sockets under a Policy. It remembers which ports
// each owner listens on, so listeners must be observed (Observe or
// Classify over a full set) before the flows that use them.
type Classifier struct {
	p          Policy
	proxyPorts map[uint16]struct{}
	peerPorts  map[uint16]struct{}
	control    map[uint16]struct{}
	// listenPorts counts listeners per (owner, port): a port can have
	// several (IPv4 and IPv6, or SO_REUSEPORT).
	listenPorts map[listenKey]int
}

type listenKey struct {
	owner Owner
	port  uint16
}

// NewClassifier returns a Classifier for p.
func NewClassifier(p Policy) *Classifier {
	c := &Classifier{p: p, proxyPorts: map[uint16]struct{}{}, peerPorts: map[uint16]struct{}{}, control: map[uint16]struct{}{}, listenPorts: map[listenKey]int{}}
	for _, port := range p.ProxyPorts {
		c.proxyPorts[port] = struct{}{}
	}
	for _, port := range p.ControlPorts {
		c.control[port] = struct{}{}
	}
	for _, port := range p.ProxyRemotePorts {
		c.peerPorts[port] = struct{}{}
	}
	return c
}

// Policy returns the classifier's policy.
func (c *Classifier) Policy() Policy { return c.p }

// Reset forgets every listener.
func (c *Classifier) Reset() { clear(c.listenPorts) }

// AddListener records a listener; RemoveListener forgets one.
func (c *Classifier) AddListener(s *sockdiag.Socket) {
	c.listenPorts[listenKey{c.owner(s, true), s.Local.Port()}]++
}

// RemoveListener forgets a listener recorded by AddListener.
func (c *Classifier) RemoveListener(s *sockdiag.Socket) {
	k := listenKey{c.owner(s, true), s.Local.Port()}
	if c.listenPorts[k] <= 1 {
		delete(c.listenPorts, k)
		return
	}
	c.listenPorts[k]--
}

// Listens reports whether owner has a listener on port.
func (c *Classifier) Listens(owner Owner, port uint16) bool {
	return c.listenPorts[listenKey{owner, port}] > 0
}

// acceptedSide reports whether s is a listener or the accepted side of a
// connection: an event saw it accepted, or its local port is one somebody
// listens on (the kernel never picks a port a listener holds as an
// ephemeral one). The port rules look at the local port of such a socket
// and at the remote port of the others. The other port of each is
// ephemeral, and can be any number (15000, 15090...) in a pod that widened
// net.ipv4.ip_local_port_range: an app's connection must not pass for
// control traffic or the proxy's because of its ephemeral port.
func (c *Classifier) acceptedSide(s *sockdiag.Socket, accepted bool) bool {
	if s.State == tcpstate.Listen || accepted {
		return true
	}
	port := s.Local.Port()
	return c.listenPorts[listenKey{OwnerApp, port}] > 0 || c.listenPorts[listenKey{OwnerProxy, port}] > 0
}

// owner applies the ownership rules to one socket (acceptedSide: see
// Classifier.acceptedSide).
func (c *Classifier) owner(s *sockdiag.Socket, acceptedSide bool) Owner {
	if acceptedSide {
		if _, ok := c.proxyPorts[s.Local.Port()]; ok {
			return OwnerProxy
		}
	} else if _, ok := c.peerPorts[s.Remote.Port()]; ok && s.Remote.Addr().IsLoopback() {
		return OwnerProxy
	}
	if s.Inode == 0 && s.UID == 0 && s.State != tcpstate.Listen {
		// Request sockets (SYN_RECV) and TIME_WAIT sockets carry neither
		// uid nor inode: they belong to whoever listens on the port.
		port := s.Local.Port()
		if c.listenPorts[listenKey{OwnerProxy, port}] > 0 {
			return OwnerProxy
		}
		if c.listenPorts[listenKey{OwnerApp, port}] > 0 {
			return OwnerApp
		}
	}
	if s.UID == c.p.ProxyUID {
		return OwnerProxy
	}
	return OwnerApp
}

// Flow attributes one socket, at now (for idle checks the socket's own
// tcp_info times are used; now is not needed).
func (c *Classifier) Flow(s *sockdiag.Socket) Flow { return c.flow(s, false) }

// flow attributes one socket; accepted is set when the caller knows it was
// accepted from a listener (the eBPF events saw its passive open).
//
// A flow is inbound when it was accepted: when its local port is one its
// owner listens on, when an event saw it accepted, or, for the proxy, when
// it is transparent (TPROXY: Envoy's accepted socket keeps the original
// destination — the app's port — as its local address, and inherits
// IP_TRANSPARENT from its listener). A transparent proxy socket whose peer
// is one of the app's listeners is the other kind: Envoy's connection to
// the app from the client's address (original_src), an outbound flow.
func (c *Classifier) flow(s *sockdiag.Socket, accepted bool) Flow {
	f := Flow{Socket: *s, IdleMS: -1}
	c.classify(s, accepted).to(&f)
	if s.HasInfo {
		f.IdleMS = Idle(s, f.Direction).Milliseconds()
	}
	return f
}

// class is an attribution: what classify decides of a socket.
type class struct {
	owner                       Owner
	dir                         Direction
	holds, idleExpired, control bool
}

// to stores c into f.
func (c class) to(f *Flow) {
	f.Owner, f.Direction, f.Holds, f.IdleExpired, f.Control = c.owner, c.dir, c.holds, c.idleExpired, c.control
}

func classOf(f *Flow) class {
	return class{owner: f.Owner, dir: f.Direction, holds: f.Holds, idleExpired: f.IdleExpired, control: f.Control}
}

// classify is flow without the copy: the attribution alone.
func (c *Classifier) classify(s *sockdiag.Socket, accepted bool) (k class) {
	side := c.acceptedSide(s, accepted)
	k.owner = c.owner(s, side)
	switch {
	case s.State == tcpstate.Listen:
		k.dir = DirListen
	case accepted || c.Listens(k.owner, s.Local.Port()),
		k.owner == OwnerProxy && s.Transparent && !c.Listens(OwnerApp, s.Remote.Port()):
		k.dir = DirInbound
	default:
		k.dir = DirOutbound
	}
	if s.State != tcpstate.Listen {
		if side {
			_, k.control = c.control[s.Local.Port()]
		} else {
			_, peer := c.control[s.Remote.Port()]
			k.control = peer && s.Remote.Addr().IsLoopback()
		}
	}
	if HoldsDrain(s.State) && s.State != tcpstate.Listen {
		k.holds = true
		if c.p.IdleTimeout > 0 && s.HasInfo && Idle(s, k.dir) > c.p.IdleTimeout {
			k.holds, k.idleExpired = false, true
		}
	}
	return k
}

// Count adds one attributed flow to the summary.
func (s *Summary) Count(f *Flow) { s.add(1, classOf(f), f.State) }

// add counts (delta 1) or uncounts (-1) a flow of this class.
func (s *Summary) add(delta int, k class, state tcpstate.State) {
	owner, dir, idleExpired := k.owner, k.dir, k.idleExpired
	switch {
	case dir == DirListen && owner == OwnerApp:
		s.AppListeners += delta
	case dir == DirListen:
		s.ProxyListeners += delta
	case k.control:
		s.Control += delta
	case !HoldsDrain(state):
		s.Closing += delta
	default:
		in, out, idle := &s.AppInbound, &s.AppOutbound, &s.AppIdle
		if owner == OwnerProxy {
			s.ProxyFlows += delta
			in, out, idle = &s.ProxyInbound, &s.ProxyOutbound, &s.ProxyIdle
		}
		if dir == DirInbound {
			*in += delta
		} else {
			*out += delta
		}
		if idleExpired {
			*idle += delta
		}
	}
}

// Snapshot is one attributed view of a namespace.
type Snapshot struct {
	Taken     time.Time `json:"taken"`
	Namespace string    `json:"namespace"`
	Summary   Summary   `json:"summary"`
	Listeners []Flow    `json:"listeners"`
	Flows     []Flow    `json:"flows"`
}

// Classify attributes a full set of sockets (listeners and flows, in any
// order) into a snapshot, replacing the classifier's listener set.
func (c *Classifier) Classify(socks []sockdiag.Socket) Snapshot {
	c.Reset()
	for i := range socks {
		if socks[i].State == tcpstate.Listen {
			c.AddListener(&socks[i])
		}
	}
	var snap Snapshot
	for i := range socks {
		f := c.Flow(&socks[i])
		snap.Summary.Count(&f)
		if f.Direction == DirListen {
			snap.Listeners = append(snap.Listeners, f)
		} else {
			snap.Flows = append(snap.Flows, f)
		}
	}
	return snap
}

// Idle is how long a flow has been idle in the request/response sense
// (docs/design.md, "Idle means idle"), or 0 when the kernel gave no
// tcp_info. A flow is idle only after it finished an exchange:
//
//   - the server side (inbound: the accepted end) is busy while it owes a
//     response: it received data and never sent any, or the last data it
//     received is newer than the last it sent. Otherwise it has been idle
//     since its last send (the response).
//   - the client side (outbound) is busy while it awaits one: it sent data
//     and never received any, or the last data it sent is newer than the
//     last it received. Otherwise it has been idle since its last receive.
//
// A side with bytes its peer has not acknowledged (Socket.SendQueue) is
// busy either way: it is still delivering, however long since it last
// sent (a peer that reads slowly closes its window, and nothing is sent).
//
// So a slow request (8 s in the backend, nothing on the wire) never looks
// idle, while a keep-alive connection parked after its response does. The
// kernel's times are in jiffies: a request and its connection's creation,
// or a response and the next request, can fall in the same one; the
// segment counts tell the first case apart.
func Idle(s *sockdiag.Socket, dir Direction) time.Duration {
	if !s.HasInfo || s.SendQueue > 0 {
		return 0
	}
	if dir == DirInbound {
		if s.DataSegsIn > 0 && s.DataSegsOut == 0 || s.LastDataRecv < s.LastDataSent {
			return 0 // a request arrived after the last response
		}
		return s.LastDataSent
	}
	if s.DataSegsOut > 0 && s.DataSegsIn == 0 || s.LastDataSent < s.LastDataRecv {
		return 0 // a request went out after the last response came in
	}
	return s.LastDataRecv
}
