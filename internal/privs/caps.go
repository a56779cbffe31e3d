package privs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"strings"
)

// Cap is one Linux capability, by its number (linux/capability.h).
type Cap uint8

// The capabilities draind names in its code; every other one is known by
// name too (ParseCap, String). The numbers are linux/capability.h's,
// written out because x/sys/unix defines CAP_* on Linux only and this file
// builds everywhere (caps_linux_test.go checks them against unix's).
const (
	CapKill, CapSetGID, CapSetUID, CapSetPCap Cap = 5, 6, 7, 8
	CapNetAdmin, CapSysPtrace, CapSysAdmin    Cap = 12, 19, 21
	CapPerfmon, CapBPF                        Cap = 38, 39
)

// capNames are the kernel's names without CAP_, as Kubernetes writes them
// in securityContext.capabilities, indexed by number.
var capNames = [...]string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// String is the capability's name as Kubernetes writes it ("NET_ADMIN"),
// or its number for one this table does not know.
func (c Cap) String() string {
	if int(c) < len(capNames) {
		return capNames[c]
	}
	return strconv.Itoa(int(c))
}

// ParseCap reads a capability name: NET_ADMIN, CAP_NET_ADMIN, cap_net_admin.
func ParseCap(name string) (Cap, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	n = strings.TrimPrefix(n, "CAP_")
	for i, known := range capNames {
		if n == known {
			return Cap(i), nil
		}
	}
	return 0, fmt.Errorf("%q is not a capability (names as in securityContext.capabilities: NET_ADMIN, NET_BIND_SERVICE...)", name)
}

// Set is a set of capabilities, bit N for capability N: the kernel's own
// layout (/proc/PID/status prints it in hex).
type Set uint64

// SetOf is the set of caps.
func SetOf(caps ...Cap) Set {
	var s Set
	for _, c := range caps {
		s |= 1 << (c & 63)
	}
	return s
}

// ParseSet reads a comma-separated list of capability names (ParseCap);
// "" is the empty set.
func ParseSet(list string) (Set, error) {
	var s Set
	for f := range strings.SplitSeq(list, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		c, err := ParseCap(f)
		if err != nil {
			return 0, err
		}
		s |= SetOf(c)
	}
	return s, nil
}

// Has reports whether c is in s.
func (s Set) Has(c Cap) bool { return c < 64 && s&(1<<c) != 0 }

// Caps lists the capabilities of s in number order.
func (s Set) Caps() []Cap {
	out := make([]Cap, 0, bits.OnesCount64(uint64(s)))
	for v := uint64(s); v != 0; v &= v - 1 {
		out = append(out, Cap(bits.TrailingZeros64(v)))
	}
	return out
}

// Numbers lists the capabilities of s as SysProcAttr.AmbientCaps wants them.
func (s Set) Numbers() []uintptr {
	var out []uintptr
	for _, c := range s.Caps() {
		out = append(out, uintptr(c))
	}
	return out
}

// String is the names of s, comma-separated in number order ("KILL,BPF"),
// or "none".
func (s Set) String() string {
	if s == 0 {
		return "none"
	}
	names := make([]string, 0, bits.OnesCount64(uint64(s)))
	for _, c := range s.Caps() {
		names = append(names, c.String())
	}
	return strings.Join(names, ",")
}

// Hex is the set as /proc/PID/status prints it (16 hex digits).
func (s Set) Hex() string { return fmt.Sprintf("%016x", uint64(s)) }

// Sets are one thread's capability sets, and its no_new_privs flag: what
// /proc/PID/status says in its CapInh, CapPrm, CapEff, CapBnd, CapAmb and
// NoNewPrivs lines.
type Sets struct {
	Effective   Set  `json:"effective"`
	Permitted   Set  `json:"permitted"`
	Inheritable Set  `json:"inheritable"`
	Ambient     Set  `json:"ambient"`
	Bounding    Set  `json:"bounding"`
	NoNewPrivs  bool `json:"no_new_privs"`
}

// MarshalText makes a Set read as its names in JSON and logs.
func (s Set) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (s *Set) UnmarshalText(b []byte) error {
	if string(b) == "none" {
		*s = 0
		return nil
	}
	v, err := ParseSet(string(b))
	*s = v
	return err
}

// StatusLines are the sets as /proc/PID/status prints them, one per line.
func (s Sets) StatusLines() string {
	nnp := 0
	if s.NoNewPrivs {
		nnp = 1
	}
	return fmt.Sprintf("CapInh:\t%s\nCapPrm:\t%s\nCapEff:\t%s\nCapBnd:\t%s\nCapAmb:\t%s\nNoNewPrivs:\t%d\n",
		s.Inheritable.Hex(), s.Permitted.Hex(), s.Effective.Hex(), s.Bounding.Hex(), s.Ambient.Hex(), nnp)
}

// errNoCapLines is returned by ReadStatus for a text without the Cap lines.
var errNoCapLines = errors.New("no CapEff line")

// ReadStatus reads the sets from a /proc/PID/status (or
// /proc/PID/task/TID/status) text.
func ReadStatus(r io.Reader) (Sets, error) {
	var s Sets
	sc := bufio.NewScanner(r)
	seen := false
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		var dst *Set
		switch key {
		case "CapInh":
			dst = &s.Inheritable
		case "CapPrm":
			dst = &s.Permitted
		case "CapEff":
			dst = &s.Effective
			seen = true
		case "CapBnd":
			dst = &s.Bounding
		case "CapAmb":
			dst = &s.Ambient
		case "NoNewPrivs":
			s.NoNewPrivs = val == "1"
			continue
		default:
			continue
		}
		v, err := strconv.ParseUint(val, 16, 64)
		if err != nil {
			return Sets{}, fmt.Errorf("status %s: %q is not a hex capability set", key, val)
		}
		*dst = Set(v)
	}
	if err := sc.Err(); err != nil {
		return Sets{}, fmt.Errorf("read status: %w", err)
	}
	if !seen {
		return Sets{}, errNoCapLines
	}
	return s, nil
}
