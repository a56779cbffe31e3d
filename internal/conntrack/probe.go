package conntrack

// ProbeUnavailableError says why eBPF tracking cannot run here. Callers fall
// back to sock_diag polling and log Reason once.
//
// Reason is one line, one of:
//
//	"no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"
//	"kernel has no BTF"
//	"kernel too old (needs 5.5 for tp_btf)"
//	"kernel too old (needs 5.8 for the BPF ring buffer)"
//	"verifier: <the verifier's last relevant lines>"
//	"eBPF is not supported on this OS"
//
// Err is the underlying error, for the log at debug level.
type ProbeUnavailableError struct {
	Reason string
	Err    error
}

func (e *ProbeUnavailableError) Error() string {
	if e.Err == nil {
		return "ebpf probe unavailable: " + e.Reason
	}
	return "ebpf probe unavailable: " + e.Reason + ": " + e.Err.Error()
}

func (e *ProbeUnavailableError) Unwrap() error { return e.Err }

// ProbeOptions tunes OpenProbe. The zero value is valid.
type ProbeOptions struct {
	// RingSize is the ring buffer size in bytes: a power of two and a
	// multiple of the page size. 0 means DefaultRingSize.
	RingSize int
}

// DefaultRingSize holds about 100k events (72 bytes + an 8-byte ring
// header each): a burst of that many state changes is absorbed while the
// reader is descheduled.
const DefaultRingSize = 8 << 20
