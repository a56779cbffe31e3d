package conntrack

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestProbeUnavailableError(t *testing.T) {
	cause := fs.ErrPermission
	err := error(&ProbeUnavailableError{Reason: "no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)", Err: cause})
	if !errors.Is(err, fs.ErrPermission) {
		t.Error("ProbeUnavailableError does not unwrap to its cause")
	}
	var pue *ProbeUnavailableError
	if !errors.As(err, &pue) || pue.Reason == "" {
		t.Error("errors.As failed")
	}
	if s := err.Error(); !strings.Contains(s, pue.Reason) || strings.Contains(s, "\n") {
		t.Errorf("Error() = %q: want the reason, on one line", s)
	}
	if s := (&ProbeUnavailableError{Reason: "kernel has no BTF"}).Error(); s != "ebpf probe unavailable: kernel has no BTF" {
		t.Errorf("Error() without cause = %q", s)
	}
}
