package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// soakFigures are what a leak would grow, measured between lifecycles.
type soakFigures struct {
	lifecycles  int
	fds         int // the test process's open files (namespace handles included)
	goroutines  int // the test process's
	netns       int // network namespaces any process of the machine holds (a namespace file or an fd)
	descendants int // processes descended from the test process: none between pods
	bpf         bpfObjects
	draindLeft  int // BPF objects of the soak's dead draind processes still loaded
}

// measureSoak reads the figures once goroutines of the last pod (its
// connection readers, its process watchers) have had a moment to end.
func measureSoak(t *testing.T, n int, held []bpfObjects) soakFigures {
	t.Helper()
	g := runtime.NumGoroutine()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
		if ng := runtime.NumGoroutine(); ng >= g {
			break
		} else {
			g = ng
		}
	}
	f := soakFigures{lifecycles: n, fds: fdCount(os.Getpid()), goroutines: runtime.NumGoroutine(), netns: netnsCount(),
		descendants: len(descendants(os.Getpid())), bpf: bpfLive(t)}
	all := bpfObjects{}
	for _, h := range held {
		for k, ids := range h {
			all[k] = append(all[k], ids...)
		}
	}
	f.draindLeft = bpfLeft(t, all).count()
	return f
}

// netnsCount counts the network namespaces held by processes (as their
// namespace or through an open file) or by a namespace file mount.
func netnsCount() int {
	seen := map[string]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if l, err := os.Readlink(p + "/ns/net"); err == nil {
			seen[l] = true
		}
		fds, _ := os.ReadDir(p + "/fd")
		for _, fd := range fds {
			if l, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "net:[") {
				seen[l] = true
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 3 && strings.HasPrefix(f[3], "net:[") {
				seen[f[3]] = true
			}
		}
	}
	return len(seen)
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parent := map[int]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		b, err := os.ReadFile(p + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		me, _ := strconv.Atoi(filepath.Base(p))
		pp, _ := strconv.Atoi(f[1])
		parent[me] = pp
	}
	var out []int
	for me := range parent {
		for p := parent[me]; p > 1; p = parent[p] {
			if p == pid {
				out = append(out, me)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

func (f soakFigures) String() string {
	return fmt.Sprintf("after %d lifecycles: %d fds, %d goroutines, %d network namespaces on the machine, %d processes below the test, BPF on the machine %s (%d of draind's still loaded)",
		f.lifecycles, f.fds, f.goroutines, f.netns, f.descendants, f.bpf, f.draindLeft)
}

// TestReliabilitySoak runs 300 pod lifecycles in a row (10 in the short
// run): a pod starts, takes traffic, gets SIGTERM and ends. Nothing leaks:
// the test process's files and goroutines, processes, network namespaces,
// and BPF objects (every draind's are unloaded). Figures every 100
// lifecycles (every 5 in the short run).
func TestReliabilitySoak(t *testing.T) {
	requireBpftool(t)
	n, every := pick(10, 300), pick(5, 100)
	var held []bpfObjects
	var attempted, failed, codes int
	var stops []time.Duration
	lifecycle := func(t *testing.T) {
		p := newPod(t)
		p.startApp("--on-term", "graceful", "--outbound-count", "2", "--outbound-pause", "20ms")
		p.startDraind([]string{"--min-drain", "100ms", "--tracker", "ebpf", "--app-procs", "ebpf"})
		held = append(held, bpfHeld(p.draind.Pid()))
		proxy := p.watchProxy()
		for range 10 {
			attempted++
			resp, err := p.client.Get("http://" + podIP + ":15006/")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != 200 {
				failed++
				t.Errorf("request: %v", err)
			}
		}
		p.client.CloseIdleConnections()
		p.terminate()
		code, _ := p.waitExit(20 * time.Second)
		if !proxy.waitGone(5*time.Second) || !p.app.wait(10*time.Second) {
			t.Fatal("the proxy or the app outlived draind")
		}
		stops = append(stops, proxy.at.Sub(p.drainedAt))
		ok, fail, _ := p.appResults()
		attempted += ok + fail
		failed += fail
		if code != 0 {
			codes++
			t.Errorf("exit %d; log:\n%s", code, p.draindLog.String())
		}
	}
	t.Run("warm-up", lifecycle) // what is made once (the binary's copy, the pause binary) is not a leak
	base := measureSoak(t, 0, held)
	t.Logf("baseline %s", base)
	rows := []soakFigures{base}
	start := time.Now()
	for i := 1; i <= n; i++ {
		if !t.Run(fmt.Sprintf("lifecycle-%03d", i), lifecycle) {
			t.FailNow()
		}
		if i%every == 0 {
			f := measureSoak(t, i, held)
			t.Logf("%s (%s per lifecycle)", f, time.Since(start)/time.Duration(i))
			rows = append(rows, f)
		}
	}
	took := time.Since(start)
	last := rows[len(rows)-1]
	slices.Sort(stops)
	per := func(get func(soakFigures) int) string {
		var parts []string
		for _, r := range rows[1:] {
			parts = append(parts, fmt.Sprintf("%+d", get(r)-get(base)))
		}
		return strings.Join(parts, "/")
	}
	leakFDs, leakG := last.fds-base.fds, last.goroutines-base.goroutines
	leaks := leakFDs > 0 || leakG > 5 || last.descendants > 0 || last.draindLeft > 0
	record(t, outcome{name: fmt.Sprintf("soak: %d pod lifecycles", n),
		injected:  fmt.Sprintf("start, 10 requests + 2 calls out, SIGTERM, exit; %d in a row in %s", n, secs(took)),
		attempted: fmt.Sprint(attempted), failed: fmt.Sprint(failed),
		stopped: fmt.Sprintf("median %s, max %s", secs(stops[len(stops)/2]), secs(stops[len(stops)-1])),
		exit:    0,
		limit: fmt.Sprintf("%s: growth per %d lifecycles: fds %s, goroutines %s, processes left %d, draind's BPF objects left %d; machine-wide (other tests share it) netns %s, BPF objects %s",
			yesNo(!leaks && codes == 0), every, per(func(f soakFigures) int { return f.fds }), per(func(f soakFigures) int { return f.goroutines }),
			last.descendants, last.draindLeft, per(func(f soakFigures) int { return f.netns }), per(func(f soakFigures) int { return f.bpf.count() }))})
	if leaks || codes > 0 || failed > 0 {
		t.Errorf("leak or failure: baseline %s; last %s; %d non-zero exits, %d failed requests", base, last, codes, failed)
	}
}
