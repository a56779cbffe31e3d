package kubelet_test

import (
	"os"
	"strconv"
	"time"
)

// timeScaleVar stretches the few wall-clock bounds of these tests on a
// node that runs everything several times slower than hardware: make
// e2e-kubelet-vm sets it to 5 (qemu's software emulation, where draind's
// start-up took 2.7 to 6.4 s instead of 0.3 s and a runc exec about a second).
// Unset, or anything but a number above 1, means 1.
const timeScaleVar = "DRAIND_E2E_TIME_SCALE"

// scaled is d stretched by timeScaleVar: only for how long the test waits
// for something the node does (the app's head start before its calls,
// "at once", a readiness poll's answer), never for what draind decides.
func scaled(d time.Duration) time.Duration {
	f, err := strconv.ParseFloat(os.Getenv(timeScaleVar), 64)
	if err != nil || f <= 1 {
		return d
	}
	return time.Duration(float64(d) * f)
}

// stopFollowsWithin bounds, in these tests, the time from what ends a
// drain (the app's exit) to draind's /quitquitquit and to the proxy
// container's exit, as the pod harness's constant of the same name
// (e2e/). It is no latency target: tools/bench/exit.sh measures that. It
// only tells a stop that followed its cause from one that waited for
// something else (the deadline, a poll), far above what a busy node adds.
const stopFollowsWithin = 2 * time.Second
