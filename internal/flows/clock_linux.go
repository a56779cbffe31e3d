package flows

import (
	"time"

	"golang.org/x/sys/unix"
)

// ktimeNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns, so
// snapshot times compare with event times.
func ktimeNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}
