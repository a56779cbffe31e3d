package sockdiag

import "github.com/draind/draind/internal/tcpstate"

// StateMask is the kernel-side state filter of an inet_diag_req_v2: bit N
// selects state N. A dump walks only the hash buckets for what it asks.
type StateMask uint32

// Mask builds a StateMask from states.
func Mask(states ...tcpstate.State) StateMask {
	var m StateMask
	for _, s := range states {
		m |= 1 << s
	}
	return m
}

// AllStates selects every TCP state.
const AllStates StateMask = 0xfff << 1

// ListenMask selects listeners only: a cheap dump that does not walk
// established sockets.
var ListenMask = Mask(tcpstate.Listen)

// Has reports whether s is in the mask.
func (m StateMask) Has(s tcpstate.State) bool { return m&(1<<s) != 0 }
