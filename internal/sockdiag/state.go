package sockdiag

import (
	"fmt"
	"strings"
)

// State is a TCP socket state, numbered as the kernel numbers them
// (include/net/tcp_states.h).
type State uint8

// TCP states.
const (
	Established State = iota + 1
	SynSent
	SynRecv
	FinWait1
	FinWait2
	TimeWait
	Close
	CloseWait
	LastAck
	Listen
	Closing
	NewSynRecv
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

// HoldsDrain reports whether a flow in this state keeps a drain open
// (docs/design.md, "Who owns a socket"): it can still carry a request or a
// response. A closing socket (FIN_WAIT*, CLOSING, LAST_ACK, TIME_WAIT,
// CLOSE) has nothing left to deliver that the proxy could save. LISTEN is
// not a flow and holds nothing.
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

// AllStates selects every TCP state.
const AllStates StateMask = 0xfff << 1

var (
	// ListenMask selects listeners only: a cheap dump that does not walk
	// established sockets.
	ListenMask = Mask(Listen)
	// HoldingMask selects the states that hold a drain.
	HoldingMask = Mask(Established, SynSent, SynRecv, NewSynRecv, CloseWait)
)

// Has reports whether s is in the mask.
func (m StateMask) Has(s State) bool { return m&(1<<s) != 0 }
