package conntrack

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// State is a TCP socket state, numbered as the kernel numbers them
// (include/net/tcp_states.h), so values from sock_diag and from the
// inet_sock_set_state tracepoint need no translation.
type State uint8

// TCP states.
const (
	Established State = 1
	SynSent     State = 2
	SynRecv     State = 3
	FinWait1    State = 4
	FinWait2    State = 5
	TimeWait    State = 6
	Close       State = 7
	CloseWait   State = 8
	LastAck     State = 9
	Listen      State = 10
	Closing     State = 11
	NewSynRecv  State = 12
)

var stateNames = [...]string{
	Established: "ESTABLISHED",
	SynSent:     "SYN_SENT",
	SynRecv:     "SYN_RECV",
	FinWait1:    "FIN_WAIT1",
	FinWait2:    "FIN_WAIT2",
	TimeWait:    "TIME_WAIT",
	Close:       "CLOSE",
	CloseWait:   "CLOSE_WAIT",
	LastAck:     "LAST_ACK",
	Listen:      "LISTEN",
	Closing:     "CLOSING",
	NewSynRecv:  "NEW_SYN_RECV",
}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("STATE(%d)", uint8(s))
}

// MarshalText makes states read as their names in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ParseState is the inverse of String.
func ParseState(name string) (State, error) {
	for i, n := range stateNames {
		if n != "" && strings.EqualFold(n, name) {
			return State(i), nil
		}
	}
	return 0, fmt.Errorf("unknown tcp state %q", name)
}

// HoldsDrain reports whether a flow in this state keeps the drain open
// (DESIGN.md, "Who owns a socket"): the flow can still carry a request or a
// response. A closing socket (FIN_WAIT*, CLOSING, LAST_ACK, TIME_WAIT, CLOSE)
// has nothing left to deliver that the proxy could save.
func (s State) HoldsDrain() bool {
	switch s {
	case Established, SynSent, SynRecv, NewSynRecv, CloseWait:
		return true
	}
	return false
}

// StateMask is the kernel-side state filter of an inet_diag_req_v2: bit N
// selects state N. A dump walks only the hash buckets for what it asks.
type StateMask uint32

// Mask builds a StateMask from states.
func Mask(states ...State) StateMask {
	var m StateMask
	for _, s := range states {
		m |= 1 << s
	}
	return m
}

// Common masks.
const (
	AllStates StateMask = 0xfff << 1
)

var (
	// ListenMask selects listeners only: a cheap dump that does not walk
	// established sockets.
	ListenMask = Mask(Listen)
	// FlowMask selects every state but LISTEN.
	FlowMask = AllStates &^ Mask(Listen)
	// HoldingMask selects the states that hold the drain.
	HoldingMask = Mask(Established, SynSent, SynRecv, NewSynRecv, CloseWait)
)

// Has reports whether s is in the mask.
func (m StateMask) Has(s State) bool { return m&(1<<s) != 0 }

// Socket is one TCP socket as the kernel reports it.
type Socket struct {
	Family uint8          `json:"family"` // unix.AF_INET or unix.AF_INET6
	State  State          `json:"state"`
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	UID    uint32         `json:"uid"`
	Inode  uint32         `json:"inode"`
	// Cookie is the kernel's socket cookie (sock_diag idiag_cookie; the same
	// value bpf_get_socket_cookie returns). It is the table's key.
	Cookie uint64 `json:"cookie"`
	// CgroupID is the socket's cgroup v2 id, when the kernel sends it
	// (INET_DIAG_CGROUP_ID, full sockets, 5.8+); 0 otherwise.
	CgroupID uint64 `json:"cgroup_id,omitempty"`
	// HasInfo is set when tcp_info came with the socket (not for
	// TIME_WAIT and request sockets); the two durations below are only
	// meaningful then.
	HasInfo bool `json:"-"`
	// Time since the last data was sent / received on the flow.
	LastDataSent time.Duration `json:"-"`
	LastDataRecv time.Duration `json:"-"`
}

// Idle is how long the flow has carried no data in either direction, or 0
// when the kernel gave no tcp_info.
func (s *Socket) Idle() time.Duration {
	if !s.HasInfo {
		return 0
	}
	return min(s.LastDataSent, s.LastDataRecv)
}

// FiveTuple is the key used where no socket cookie is available (a tracing
// program on a kernel before 5.12).
type FiveTuple struct {
	Local, Remote netip.AddrPort
}

// Owner says whose a socket is.
type Owner uint8

const (
	OwnerApp Owner = iota
	OwnerProxy
)

func (o Owner) String() string {
	if o == OwnerProxy {
		return "proxy"
	}
	return "app"
}

// MarshalText makes owners read as names in JSON.
func (o Owner) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Direction classifies a socket relative to its owner's listeners.
type Direction uint8

const (
	DirListen Direction = iota
	DirInbound
	DirOutbound
)

func (d Direction) String() string {
	switch d {
	case DirListen:
		return "listen"
	case DirInbound:
		return "inbound"
	default:
		return "outbound"
	}
}

// MarshalText makes directions read as names in JSON.
func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Event is one TCP state change seen by the eBPF probe on
// inet_sock_set_state, already filtered to the target namespace and to TCP.
type Event struct {
	// Time is the kernel's monotonic clock (bpf_ktime_get_ns) at the change.
	Time time.Duration
	// Cookie is the socket cookie, or 0 on kernels whose tracing programs
	// cannot read it (before 5.12); then SkAddr and the 5-tuple are the key.
	Cookie uint64
	// SkAddr is the kernel address of the struct sock: unique while the
	// socket lives, a fallback key on old kernels.
	SkAddr   uint64
	OldState State
	NewState State
	Family   uint8
	Local    netip.AddrPort
	Remote   netip.AddrPort
	UID      uint32
}
