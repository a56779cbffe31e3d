package flows

import "net/netip"

// A FlowTable's indexes: records are found by their key (cookie or
// 5-tuple) and by their kernel socket address, in open-addressed tables
// over the records' positions.

// key is what finds a record: its cookie, or without cookies its 5-tuple.
type key struct {
	cookie        uint64
	local, remote [16]byte
	lport, rport  uint16
	kinds         recFlags // the address kinds, as in record.flags
}

func (t *FlowTable) keyOf(cookie uint64, local, remote netip.AddrPort) key {
	if t.useCookie {
		return key{cookie: cookie}
	}
	k := key{lport: local.Port(), rport: remote.Port()}
	k.kinds = recFlags(PackAddr(&k.local, local)) | recFlags(PackAddr(&k.remote, remote))<<2
	return k
}

func (t *FlowTable) hashKey(k *key) uint64 {
	if t.useCookie {
		return k.cookie
	}
	return tupleHash(t.seed, &k.local, &k.remote, k.lport, k.rport, k.kinds)
}

func (t *FlowTable) hashRecKey(pos int) uint64 {
	r := t.recs.at(pos)
	if t.useCookie {
		return r.cookie
	}
	local, remote := t.addrBytes(pos)
	return tupleHash(t.seed, &local, &remote, r.lport, r.rport, r.flags&(flLocalKind|flRemoteKind))
}

// addrBytes returns record pos's addresses as a key holds them: an IPv4
// one in the first 4 bytes.
func (t *FlowTable) addrBytes(pos int) (local, remote [16]byte) {
	r := t.recs.at(pos)
	if r.hasV6() {
		v6 := t.recs.v6(pos, false)
		local, remote = v6[0], v6[1]
	}
	if uint8(r.flags&flLocalKind) == Addr4 {
		local = [16]byte{}
		copy(local[:], r.local4[:])
	}
	if uint8(r.flags&flRemoteKind)>>2 == Addr4 {
		remote = [16]byte{}
		copy(remote[:], r.remote4[:])
	}
	return local, remote
}

// setTuple stores record pos's addresses and their kinds.
func (t *FlowTable) setTuple(pos int, local, remote netip.AddrPort) {
	var l, rm [16]byte
	lk, rk := PackAddr(&l, local), PackAddr(&rm, remote)
	r := t.recs.at(pos)
	r.lport, r.rport = local.Port(), remote.Port()
	r.flags = r.flags&^(flLocalKind|flRemoteKind) | recFlags(lk) | recFlags(rk)<<2
	r.local4, r.remote4 = [4]byte(l[:4]), [4]byte(rm[:4])
	if r.hasV6() {
		*t.recs.v6(pos, true) = v6Pair{l, rm}
	}
}

func (t *FlowTable) localAddr(pos int) netip.AddrPort {
	r := t.recs.at(pos)
	local, _ := t.addrBytes(pos)
	return UnpackAddr(&local, uint8(r.flags&flLocalKind), r.lport)
}

func (t *FlowTable) remoteAddr(pos int) netip.AddrPort {
	r := t.recs.at(pos)
	_, remote := t.addrBytes(pos)
	return UnpackAddr(&remote, uint8(r.flags&flRemoteKind)>>2, r.rport)
}

func (t *FlowTable) hashRecSk(pos int) uint64 { return t.recs.at(pos).skaddr }

func (t *FlowTable) matches(pos int, k *key) bool {
	r := t.recs.at(pos)
	if t.useCookie {
		return r.cookie == k.cookie
	}
	if r.lport != k.lport || r.rport != k.rport || r.flags&(flLocalKind|flRemoteKind) != k.kinds {
		return false
	}
	local, remote := t.addrBytes(pos)
	return local == k.local && remote == k.remote
}

// findKey returns the record holding k (-1: none) and the slot that holds
// it, or where to insert it.
func (t *FlowTable) findKey(k *key) (slot, pos int) {
	x := &t.byKey
	for i := x.home(t.hashKey(k)); ; i = x.next(i) {
		v := x.slots[i]
		if v == 0 {
			return i, -1
		}
		if t.matches(int(v-1), k) {
			return i, int(v - 1)
		}
	}
}

// findSk returns the record bySk names for a kernel address (-1: none) and
// its slot, or where to insert one.
func (t *FlowTable) findSk(sk uint64) (slot, pos int) {
	x := &t.bySk
	for i := x.home(sk); ; i = x.next(i) {
		v := x.slots[i]
		if v == 0 {
			return i, -1
		}
		if t.recs.at(int(v-1)).skaddr == sk {
			return i, int(v - 1)
		}
	}
}

// slotOf returns the slot of x holding pos, whose hash is h.
func slotOf(x *index, h uint64, pos int) int {
	for i := x.home(h); ; i = x.next(i) {
		switch x.slots[i] {
		case uint32(pos) + 1:
			return i
		case 0:
			panic("flows: record missing from its index")
		}
	}
}

// indexKey adds record pos (its key fields set) to byKey.
func (t *FlowTable) indexKey(pos int) {
	t.byKey.insertAt(t.byKey.free(t.hashRecKey(pos)), pos)
	t.byKey.grow(t.hashKeyFn)
}

func (t *FlowTable) unindexKey(pos int) {
	t.byKey.deleteAt(slotOf(&t.byKey, t.hashRecKey(pos), pos), t.hashKeyFn)
}

// setSk makes bySk name record pos (whose skaddr is sk) for sk.
func (t *FlowTable) setSk(pos int, sk uint64) {
	slot, j := t.findSk(sk)
	if j >= 0 {
		t.bySk.slots[slot] = uint32(pos) + 1
		return
	}
	t.bySk.insertAt(slot, pos)
	t.bySk.grow(t.hashSkFn)
}

// deleteSk forgets whichever record bySk names for sk.
func (t *FlowTable) deleteSk(sk uint64) {
	if slot, j := t.findSk(sk); j >= 0 {
		t.bySk.deleteAt(slot, t.hashSkFn)
	}
}

// dropSk forgets record pos's kernel address, if bySk names it for it.
func (t *FlowTable) dropSk(pos int) {
	if sk := t.recs.at(pos).skaddr; sk != 0 {
		if slot, j := t.findSk(sk); j == pos {
			t.bySk.deleteAt(slot, t.hashSkFn)
		}
	}
}
