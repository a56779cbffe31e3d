// Package fcap encodes and decodes file capabilities: the
// security.capability extended attribute (struct vfs_cap_data, revision 2)
// that setcap(8) writes and execve(2) reads.
package fcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// XattrName is the extended attribute holding a file's capabilities; in a
// layer tar it travels as the PAX record "SCHILY.xattr." + XattrName.
const XattrName = "security.capability"

// PAXRecord is the key of the xattr in a PAX tar header.
const PAXRecord = "SCHILY.xattr." + XattrName

const (
	revision2     = 0x02000000 // VFS_CAP_REVISION_2: two 32-bit words
	flagEffective = 0x000001   // VFS_CAP_FLAGS_EFFECTIVE
	encodedLen    = 4 + 2*8    // magic_etc, then {permitted, inheritable} × 2
)

// Capability numbers (linux/capability.h) of the ones draind's images use.
var byName = map[string]uint{
	"net_admin":    12,
	"sys_ptrace":   19,
	"sys_admin":    21,
	"sys_resource": 24,
	"perfmon":      38,
	"bpf":          39,
}

// Set is a file capability set: the permitted capabilities, and whether
// the effective bit is on (execve then raises them all into the effective
// set — and fails with EPERM when the bounding set lacks one of them).
type Set struct {
	Permitted []uint
	Effective bool
}

// Parse reads setcap's text form for the permitted set: "cap_bpf,cap_perfmon+ep"
// (effective bit on) or "cap_bpf,cap_perfmon+p" (permitted only).
func Parse(s string) (Set, error) {
	names, flags, ok := strings.Cut(s, "+")
	if !ok || (flags != "p" && flags != "ep" && flags != "pe") {
		return Set{}, fmt.Errorf("capabilities %q: want NAME[,NAME...]+p or +ep", s)
	}
	var set Set
	set.Effective = strings.Contains(flags, "e")
	for n := range strings.SplitSeq(names, ",") {
		n = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(n)), "cap_")
		c, ok := byName[n]
		if !ok {
			return Set{}, fmt.Errorf("capabilities %q: unknown capability %q", s, n)
		}
		set.Permitted = append(set.Permitted, c)
	}
	slices.Sort(set.Permitted)
	return set, nil
}

// Encode returns the xattr value (little-endian vfs_cap_data, revision 2).
func (s Set) Encode() []byte {
	b := make([]byte, encodedLen)
	magic := uint32(revision2)
	if s.Effective {
		magic |= flagEffective
	}
	binary.LittleEndian.PutUint32(b[0:], magic)
	for _, c := range s.Permitted {
		word := 4 + 8*(c/32) // permitted word of data[c/32]
		binary.LittleEndian.PutUint32(b[word:], binary.LittleEndian.Uint32(b[word:])|1<<(c%32))
	}
	return b
}

// Decode parses an xattr value of revision 2 (or 3, whose root uid is ignored).
func Decode(b []byte) (Set, error) {
	if len(b) < encodedLen {
		return Set{}, errors.New("security.capability: too short")
	}
	magic := binary.LittleEndian.Uint32(b)
	if rev := magic & 0xff000000; rev != revision2 && rev != 0x03000000 {
		return Set{}, fmt.Errorf("security.capability: revision %#x not supported", rev)
	}
	s := Set{Effective: magic&flagEffective != 0}
	for i := range uint(2) {
		w := binary.LittleEndian.Uint32(b[4+8*i:])
		for bit := range uint(32) {
			if w&(1<<bit) != 0 {
				s.Permitted = append(s.Permitted, 32*i+bit)
			}
		}
	}
	return s, nil
}

// String is setcap's text form.
func (s Set) String() string {
	var names []string
	for _, c := range s.Permitted {
		name := fmt.Sprintf("%d", c)
		for n, v := range byName {
			if v == c {
				name = n
			}
		}
		names = append(names, "cap_"+name)
	}
	if s.Effective {
		return strings.Join(names, ",") + "+ep"
	}
	return strings.Join(names, ",") + "+p"
}
