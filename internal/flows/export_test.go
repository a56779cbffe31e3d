package flows

import "net/netip"

// What only the tests use.

// FiveTuple is the reference table's key where no socket cookie is
// available (a tracing program on a kernel before 5.12).
type FiveTuple struct {
	Local, Remote netip.AddrPort
}

// Uncount removes a flow counted by Count.
func (s *Summary) Uncount(f *Flow) { s.add(-1, classOf(f), f.State) }

// Len is the number of sockets in the table.
func (t *FlowTable) Len() int { return t.recs.n }
