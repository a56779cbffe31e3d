package agent

import (
	"testing"

	"github.com/draind/draind/internal/probes"
)

func TestWaitStatus(t *testing.T) {
	for _, tc := range []struct {
		code, status int
		exit, signal int
		coreDumped   bool
	}{
		{probes.CLDExited, 0, 0, 0, false},
		{probes.CLDExited, 3, 3, 0, false},
		{probes.CLDKilled, 9, -1, 9, false},
		{probes.CLDDumped, 11, -1, 11, true},
	} {
		s := waitStatus(tc.code, tc.status)
		if s.ExitCode() != tc.exit || s.Signal() != tc.signal || s.CoreDumped() != tc.coreDumped {
			t.Errorf("waitStatus(%d, %d) = %v: exit %d signal %d core %t", tc.code, tc.status, s, s.ExitCode(), s.Signal(), s.CoreDumped())
		}
	}
}
