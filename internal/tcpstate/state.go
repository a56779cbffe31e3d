// Package tcpstate names TCP socket states as the kernel numbers them
// (include/net/tcp_states.h), so values from sock_diag (internal/sockdiag)
// and from the inet_sock_set_state tracepoint (internal/probes) need no
// translation. Which states keep a drain open is drain policy and lives in
// internal/flows.
package tcpstate

import "fmt"

// State is a TCP socket state.
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

var names = [...]string{
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

// String is the kernel's name of the state (ESTABLISHED, TIME_WAIT), or
// STATE(n) for a number the kernel does not define.
func (s State) String() string {
	if int(s) < len(names) && names[s] != "" {
		return names[s]
	}
	return fmt.Sprintf("STATE(%d)", uint8(s))
}

// MarshalText makes states read as their names in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
