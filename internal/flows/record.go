package flows

import (
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

// A FlowTable keeps each socket as a record: 48 bytes, no pointers (the
// garbage collector never scans the table), stored in fixed chunks that
// never move (growing the table copies nothing). Two open-addressing
// indexes of uint32 positions find records by key and by kernel address.
// What most sockets do not need lives in side chunks, allocated only for a
// chunk of records that has one socket needing it: tcp_info (idle times,
// for a tracker with an idle timeout) and IPv6 addresses (an IPv4 one fits
// in the record). A pod has a handful of cgroups: a record holds its
// socket's as an index into the table's list.
//
// Per socket: 48 bytes of record, 16 of tcp_info and 32 of IPv6
// addresses when present, and 4-byte index slots at a load between 3/8
// and 3/4 (5–11 bytes per index).

// record is one socket of a FlowTable.
type record struct {
	cookie uint64
	// skaddr is the kernel address of the sock, when an event told it.
	skaddr uint64
	// local4 and remote4 hold IPv4 addresses; IPv6 ones are in the
	// chunk's side array (flags say which kind each is).
	local4, remote4 [4]byte
	lport, rport    uint16
	uid, inode      uint32
	// firstLo and firstHi are when the table first saw the socket: µs
	// since its epoch, 48 bits (8.9 years).
	firstLo uint32
	firstHi uint16
	// cgroup is the socket's cgroup id as 1 + its index in the table's
	// cgroup list; 0: none (or past the list's 65,535 entries).
	cgroup uint16
	state  tcpstate.State
	// prevState is the state before the Replace in progress.
	prevState tcpstate.State
	flags     recFlags
}

// maxFirst is the largest first-seen time a record holds.
const maxFirst = time.Duration(1<<48-1) * time.Microsecond

// setFirst records when the table first saw the socket (since its epoch).
func (r *record) setFirst(d time.Duration) {
	us := uint64(min(max(d, 0), maxFirst) / time.Microsecond)
	r.firstLo, r.firstHi = uint32(us), uint16(us>>32)
}

// first is when the table first saw the socket (since its epoch), to the
// microsecond below.
func (r *record) first() time.Duration {
	return time.Duration(uint64(r.firstLo)|uint64(r.firstHi)<<32) * time.Microsecond
}

// recFlags packs a record's small fields.
type recFlags uint16

const (
	flLocalKind  recFlags = 3 << 0 // addrKind of local
	flRemoteKind recFlags = 3 << 2 // addrKind of remote
	flFamily     recFlags = 3 << 4 // familyKind
	flHasInfo    recFlags = 1 << 6
	flTransp     recFlags = 1 << 7
	flAccepted   recFlags = 1 << 8  // an event saw its passive open
	flProxy      recFlags = 1 << 9  // Owner == OwnerProxy
	flInbound    recFlags = 1 << 10 // DirInbound (DirListen is told by the state)
	flControl    recFlags = 1 << 11 // control traffic (Policy.ControlPorts)
	flHolds      recFlags = 1 << 12
	flIdleExp    recFlags = 1 << 13
	flOld        recFlags = 1 << 14 // Replace: the record was there before it began
	flSeen       recFlags = 1 << 15 // Replace: the current dump showed the socket

	// flClass are the flags classification sets.
	flClass = flProxy | flInbound | flHolds | flIdleExp | flControl
)

// Family kinds (2 bits): the table holds AF_INET and AF_INET6 sockets; any
// other family reads back as 0.
const (
	famNone uint8 = iota
	famInet
	famInet6
)

const (
	afInet  = 2
	afInet6 = 10
)

func familyKind(f uint8) recFlags {
	switch f {
	case afInet:
		return recFlags(famInet) << 4
	case afInet6:
		return recFlags(famInet6) << 4
	}
	return 0
}

func (f recFlags) family() uint8 {
	switch uint8(f&flFamily) >> 4 {
	case famInet:
		return afInet
	case famInet6:
		return afInet6
	}
	return 0
}

func (r *record) set(f recFlags, on bool) {
	if on {
		r.flags |= f
	} else {
		r.flags &^= f
	}
}

func (r *record) owner() Owner {
	if r.flags&flProxy != 0 {
		return OwnerProxy
	}
	return OwnerApp
}

// direction is DirListen for a listener (the classifier says so of every
// LISTEN socket, and of no other), else inbound or outbound.
func (r *record) direction() Direction {
	switch {
	case r.state == tcpstate.Listen:
		return DirListen
	case r.flags&flInbound != 0:
		return DirInbound
	}
	return DirOutbound
}

// setClass stores a classification.
func (r *record) setClass(k class) {
	r.flags &^= flClass
	r.set(flInbound, k.dir == DirInbound)
	r.set(flProxy, k.owner == OwnerProxy)
	r.set(flHolds, k.holds)
	r.set(flIdleExp, k.idleExpired)
	r.set(flControl, k.control)
}

// class is the classification the record holds.
func (r *record) class() class {
	return class{owner: r.owner(), dir: r.direction(), holds: r.flags&flHolds != 0,
		idleExpired: r.flags&flIdleExp != 0, control: r.flags&flControl != 0}
}

// tcpInfo is what a record keeps of tcp_info: the kernel's u32s.
type tcpInfo struct {
	lastSentMS, lastRecvMS uint32
	segsIn, segsOut        uint32
}

// packInfo keeps no queue size: a socket with bytes still to deliver is
// kept as having sent just now, which Idle reads as busy, as it reads the
// queue itself.
func packInfo(s *sockdiag.Socket) tcpInfo {
	in := tcpInfo{
		lastSentMS: uint32(s.LastDataSent / time.Millisecond), lastRecvMS: uint32(s.LastDataRecv / time.Millisecond),
		segsIn: s.DataSegsIn, segsOut: s.DataSegsOut,
	}
	if s.SendQueue > 0 {
		in.lastSentMS = 0
	}
	return in
}

// chunkBits sizes the record chunks: 512 records, 40 KiB.
const (
	chunkBits = 9
	chunkLen  = 1 << chunkBits
	chunkMask = chunkLen - 1
)

// v6Pair holds a record's addresses when one is IPv6: local, remote.
type v6Pair [2][16]byte

// records is a growable array of records in fixed chunks, with tcp_info
// and IPv6 side chunks allocated on first use.
type records struct {
	chunks []*[chunkLen]record
	infos  []*[chunkLen]tcpInfo
	v6s    []*[chunkLen]v6Pair
	n      int
}

func (rs *records) at(i int) *record { return &rs.chunks[i>>chunkBits][i&chunkMask] }

// info returns the tcp_info slot of record i, allocating its chunk if
// alloc; nil when there is none.
func (rs *records) info(i int, alloc bool) *tcpInfo { return sideSlot(rs.infos, i, alloc) }

// v6 returns the IPv6 slot of record i, allocating its chunk if alloc;
// nil when there is none.
func (rs *records) v6(i int, alloc bool) *v6Pair { return sideSlot(rs.v6s, i, alloc) }

// sideSlot returns record i's slot in a side chunk list.
func sideSlot[T any](chunks []*[chunkLen]T, i int, alloc bool) *T {
	c := i >> chunkBits
	if chunks[c] == nil {
		if !alloc {
			return nil
		}
		chunks[c] = new([chunkLen]T)
	}
	return &chunks[c][i&chunkMask]
}

// hasV6 reports whether a record keeps an address in the IPv6 side chunk.
func (r *record) hasV6() bool {
	return uint8(r.flags&flLocalKind) == Addr6 || uint8(r.flags&flRemoteKind)>>2 == Addr6
}

// push appends a zero record and returns its position.
func (rs *records) push() int {
	i := rs.n
	if i>>chunkBits == len(rs.chunks) {
		rs.chunks = append(rs.chunks, new([chunkLen]record))
		rs.infos = append(rs.infos, nil)
		rs.v6s = append(rs.v6s, nil)
	}
	rs.n++
	*rs.at(i) = record{}
	return i
}

// move copies record from over record to (with its tcp_info).
func (rs *records) move(to, from int) {
	*rs.at(to) = *rs.at(from)
	if rs.at(from).flags&flHasInfo != 0 {
		*rs.info(to, true) = *rs.info(from, false)
	}
	if rs.at(from).hasV6() {
		*rs.v6(to, true) = *rs.v6(from, false)
	}
}

// pop drops the last record, and frees chunks past one spare.
func (rs *records) pop() {
	rs.n--
	for keep := rs.n>>chunkBits + 2; len(rs.chunks) > keep; {
		last := len(rs.chunks) - 1
		rs.chunks[last], rs.infos[last], rs.v6s[last] = nil, nil, nil
		rs.chunks, rs.infos, rs.v6s = rs.chunks[:last], rs.infos[:last], rs.v6s[:last]
	}
}

// index is an open-addressing hash index (linear probing, deletion by
// backward shift) from a key to a record position. It stores positions
// only: keys are read from the records, through the owner's functions.
type index struct {
	slots []uint32 // position + 1; 0: empty
	n     int
	shift uint8 // 64 - log2(len(slots))
}

const minIndexBits = 4

func newIndex() index {
	return index{slots: make([]uint32, 1<<minIndexBits), shift: 64 - minIndexBits}
}

// home is the first slot to probe for a hash (Fibonacci hashing: the top
// bits of the hash times the golden ratio).
func (x *index) home(h uint64) int { return int((h * 0x9E3779B97F4A7C15) >> x.shift) }

func (x *index) next(i int) int { return (i + 1) & (len(x.slots) - 1) }

// insertAt fills the empty slot a failed lookup ended on.
func (x *index) insertAt(slot, pos int) {
	x.slots[slot] = uint32(pos) + 1
	x.n++
}

// deleteAt empties a slot and shifts back the entries probed past it.
// hashOf gives the hash of the record at a position.
func (x *index) deleteAt(slot int, hashOf func(pos int) uint64) {
	x.n--
	hole := slot
	for j := x.next(slot); x.slots[j] != 0; j = x.next(j) {
		h := x.home(hashOf(int(x.slots[j] - 1)))
		// The entry at j may fill the hole unless its home lies
		// cyclically in (hole, j].
		if (j > hole && (h <= hole || h > j)) || (j < hole && h <= hole && h > j) {
			x.slots[hole] = x.slots[j]
			hole = j
		}
	}
	x.slots[hole] = 0
}

// grow doubles the index when an insert took its load past 3/4; shrink
// halves it when a delete took it under 1/8. hashOf gives the hash of the
// record at a position.
func (x *index) grow(hashOf func(pos int) uint64) {
	if bits := 64 - int(x.shift); x.n*4 > len(x.slots)*3 {
		x.rehash(bits+1, hashOf)
	}
}

func (x *index) shrink(hashOf func(pos int) uint64) {
	if bits := 64 - int(x.shift); x.n*8 < len(x.slots) && bits > minIndexBits {
		x.rehash(bits-1, hashOf)
	}
}

func (x *index) rehash(bits int, hashOf func(pos int) uint64) {
	old := x.slots
	x.slots, x.shift = make([]uint32, 1<<bits), uint8(64-bits)
	for _, v := range old {
		if v != 0 {
			x.slots[x.free(hashOf(int(v-1)))] = v
		}
	}
}

// free returns the first empty slot on the probe path of a hash.
func (x *index) free(h uint64) int {
	i := x.home(h)
	for x.slots[i] != 0 {
		i = x.next(i)
	}
	return i
}

// reset empties the index, sized for n entries.
func (x *index) reset(n int) {
	bits := minIndexBits
	for 1<<bits*3 < n*4 {
		bits++
	}
	if len(x.slots) != 1<<bits {
		x.slots = make([]uint32, 1<<bits)
	} else {
		clear(x.slots)
	}
	x.n, x.shift = 0, uint8(64-bits)
}

// mix64 is a 64-bit finaliser (splitmix64's): every input bit moves every
// output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// tupleHash hashes a 5-tuple key under a per-table seed (peers choose
// their ports and addresses: a fixed hash could be aimed at).
func tupleHash(seed uint64, local, remote *[16]byte, lport, rport uint16, kinds recFlags) uint64 {
	h := seed
	for _, a := range [2]*[16]byte{local, remote} {
		h = mix64(h ^ binary.LittleEndian.Uint64(a[0:8]))
		h = mix64(h ^ binary.LittleEndian.Uint64(a[8:16]))
	}
	return mix64(h ^ uint64(lport)<<32 ^ uint64(rport)<<16 ^ uint64(kinds))
}

func newSeed() uint64 { return rand.Uint64() }
