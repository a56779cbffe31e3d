package flows

import (
	"errors"
	"fmt"
	"strings"
)

// TrackerMode is how the tracker follows a namespace's sockets (--tracker).
type TrackerMode string

// Tracker modes. ModeAuto tries eBPF and falls back to polling; a running
// tracker is in ModeEBPF or ModeSockDiag.
const (
	ModeAuto     TrackerMode = "auto"
	ModeEBPF     TrackerMode = "ebpf"
	ModeSockDiag TrackerMode = "sockdiag"
)

func (m TrackerMode) String() string { return string(m) }

// TrackerModes are the modes a tracker can be asked for: what --tracker
// accepts, validation checks and errors name.
var TrackerModes = []TrackerMode{ModeAuto, ModeEBPF, ModeSockDiag}

// RunningModes are the modes a tracker runs in (Tracker.Mode; a metric's
// labels).
var RunningModes = []TrackerMode{ModeEBPF, ModeSockDiag}

// Words joins modes (or any such words) with sep, for flags' help and
// errors.
func Words[T ~string](ws []T, sep string) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = string(w)
	}
	return strings.Join(s, sep)
}

// ErrTrackerMode is returned for an unknown mode.
var ErrTrackerMode = errors.New("tracker mode must be " + Words(TrackerModes, ", "))

// errTrackerMode is the error for a mode not in TrackerModes.
func errTrackerMode(m TrackerMode) error {
	return fmt.Errorf("%w, not %q", ErrTrackerMode, m)
}
