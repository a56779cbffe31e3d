package probes

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestUnavailableError(t *testing.T) {
	cause := fs.ErrPermission
	err := error(&UnavailableError{Reason: "no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)", Err: cause})
	if !errors.Is(err, fs.ErrPermission) {
		t.Error("UnavailableError does not unwrap to its cause")
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Reason == "" {
		t.Error("errors.As failed")
	}
	if s := err.Error(); !strings.Contains(s, ue.Reason) || strings.Contains(s, "\n") {
		t.Errorf("Error() = %q: want the reason, on one line", s)
	}
	if s := (&UnavailableError{Reason: "kernel has no BTF"}).Error(); s != "unavailable: kernel has no BTF" {
		t.Errorf("Error() without cause = %q", s)
	}
}
