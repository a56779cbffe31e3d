package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// A pod full of draind costs its neighbours nothing while it serves: from
// the end of start-up to the drain trigger no program of draind's is
// attached to a kernel hook (it holds its loaded objects, and its maps
// within 1 MiB), nothing polls, and readiness (--app-ports) and /metrics
// read the kernel when asked. At the trigger the views go live: the
// programs attach, then the snapshots, and the drain goes as before.
func TestNothingAttachedWhileReady(t *testing.T) {
	for _, tc := range []struct {
		tracker, procs string
		sharePID       bool
		// tracing links while draining: tcpstate's two, procs' three.
		draining int
	}{
		{"ebpf", "ebpf", false, 5},
		{"sockdiag", "proc", true, 0},
	} {
		t.Run(tc.tracker+"+"+tc.procs, func(t *testing.T) {
			p := newPod(t)
			p.sharePID = tc.sharePID
			p.startApp("--on-term", "graceful", "--outbound-count", "4", "--outbound-pause", "250ms")
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", tc.tracker, "--app-procs", tc.procs, "--app-ports", "8080"})
			p.wantSources(tc.tracker, tc.procs)
			pid := p.draind.Pid()
			ready := bpfFDs(t, pid)
			t.Logf("Ready: %s", ready)
			if ready.tracing != 0 {
				t.Errorf("Ready: %d tracing links attached, want none: %s", ready.tracing, ready)
			}
			if ready.memlock > 1<<20 {
				t.Errorf("Ready: BPF maps hold %d bytes, want at most 1 MiB: %s", ready.memlock, ready)
			}
			// Readiness and /metrics answer from the kernel while dormant.
			if got := p.metric(`draind_tracked_flows{class="app_listeners"}`); got != 1 {
				t.Errorf("app_listeners %v while Ready, want 1 (read on demand)", got)
			}
			if got := p.readyStatus(); got != 200 {
				t.Errorf("readiness %d while Ready, want 200", got)
			}
			p.terminate()
			rec := p.waitLog(10*time.Second, logevent.TrackingLive, nil)
			t.Logf("drain trigger → tracking live: %v ms", rec["tracking_live_ms"])
			if tc.draining > 0 {
				// The programs are attached while the app still shuts down.
				if d := bpfFDs(t, pid); d.tracing != tc.draining && p.draind.wait(0) == false {
					t.Errorf("draining: %d tracing links, want %d: %s", d.tracing, tc.draining, d)
				}
			}
			code, _ := p.waitExit(20 * time.Second)
			ok, fail, appExit := p.appResults()
			quit := p.phaseTime("stopping")
			t.Logf("%d calls ok, %d failed; quitquitquit %s after the app's exit; exit %d", ok, fail, quit.Sub(appExit), code)
			if ok != 4 || fail != 0 || code != 0 || appExit.IsZero() || quit.Before(appExit) {
				t.Errorf("%d ok %d failed, exit %d, quit %s app exit %s; log:\n%s", ok, fail, code, quit, appExit, p.draindLog.String())
			}
		})
	}
}

// bpfFDSet is what a process holds of BPF, from its /proc/PID/fdinfo.
type bpfFDSet struct {
	tracing, iter, progs, maps int
	memlock                    int64 // the maps', bytes
}

func (b bpfFDSet) String() string {
	return fmt.Sprintf("%d tracing links, %d iterator links, %d programs, %d maps (%d KiB)", b.tracing, b.iter, b.progs, b.maps, b.memlock>>10)
}

// bpfFDs reads what process pid holds: each BPF fd's fdinfo names its kind
// (link_type, prog_type, map_type) and a map's memlock.
func bpfFDs(t *testing.T, pid int) bpfFDSet {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var h bpfFDSet
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		info := map[string]string{}
		for l := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				info[k] = strings.TrimSpace(v)
			}
		}
		switch {
		case info["link_type"] == "tracing" || info["link_type"] == "raw_tracepoint":
			h.tracing++
		case info["link_type"] == "iter":
			h.iter++
		case info["prog_type"] != "":
			h.progs++
		case info["map_type"] != "":
			h.maps++
			n, _ := strconv.ParseInt(info["memlock"], 10, 64)
			h.memlock += n
		}
	}
	return h
}
