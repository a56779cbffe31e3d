package probes

import (
	"time"

	"golang.org/x/sys/unix"
)

// KtimeNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns: the one
// reading of it, so that a snapshot's time compares with the probes' event
// times.
func KtimeNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}
