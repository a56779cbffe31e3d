package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/tools/bench/benchns"
)

// rssTable runs draind with each number of flows in its namespace and
// prints its memory.
func rssTable(ctx context.Context, w io.Writer, p proxySetup, sizes []int, settle time.Duration, before bool) error {
	fmt.Fprintf(w, "| connections (sockets) | tracked | VmRSS | RssAnon | RssFile | VmHWM | Go heap in use | Go heap / socket | RssAnon / socket | live heap at the last GC (gctrace) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	var base *memory
	for _, n := range sizes {
		m, err := rssRound(ctx, p, n, settle, before)
		if err != nil {
			return fmt.Errorf("%d flows: %w", n, err)
		}
		if base == nil {
			base = m
		}
		perHeap, perAnon := "-", "-"
		if n > 0 {
			perAnon = strconv.FormatInt((m.anonKB-base.anonKB)*1024/int64(2*n), 10) + " B"
			if m.heapInuse >= 0 && base.heapInuse >= 0 {
				perHeap = strconv.FormatInt((m.heapInuse-base.heapInuse)/int64(2*n), 10) + " B"
			}
		}
		heap := "n/a (no Go collector in /metrics)"
		if m.heapInuse >= 0 {
			heap = mib(m.heapInuse / 1024)
		}
		fmt.Fprintf(w, "| %d (%d) | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, 2*n, m.tracked,
			mib(m.rssKB), mib(m.anonKB), mib(m.fileKB), mib(m.hwmKB), heap, perHeap, perAnon, m.lastGC)
	}
	return nil
}

type memory struct {
	tracked                      int
	rssKB, anonKB, fileKB, hwmKB int64
	heapInuse                    int64 // bytes; -1: not in /metrics
	// lastGC is the last "gc N ... A->B->C MB" line's live heap (C),
	// with GODEBUG=gctrace=1 in draind's environment; "-" otherwise.
	lastGC string
}

func rssRound(ctx context.Context, p proxySetup, n int, settle time.Duration, before bool) (*memory, error) {
	ns, err := benchns.New()
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if before {
		if err := ns.Fill(n); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "footprint")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	cmd, err := draindCommand(p, dir)
	if err != nil {
		return nil, err
	}
	a, err := startAgent(ns, cmd)
	if err != nil {
		return nil, err
	}
	defer a.stop()
	c, err := newNSClient(ns)
	if err != nil {
		return nil, err
	}
	defer c.close()
	if _, err := c.waitReady(a, 30*time.Second); err != nil {
		return nil, err
	}
	// /metrics answers once the trackers are open (readiness may come
	// before).
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if code, _, err := c.get("http://" + statusAddr + "/metrics"); err == nil && code == 200 {
			break
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("/metrics not answering 10 s after ready:\n%s", a.output())
		}
	}
	if !before {
		if err := ns.Fill(n); err != nil {
			return nil, err
		}
	}
	m := &memory{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		metrics, err := scrape(c)
		if err != nil {
			return nil, err
		}
		m.tracked = int(metrics[`draind_tracked_flows{class="app_inbound"}`] + metrics[`draind_tracked_flows{class="app_outbound"}`])
		if m.tracked >= 2*n {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("draind tracks %d app flows, want %d", m.tracked, 2*n)
		}
	}
	time.Sleep(settle)
	metrics, err := scrape(c)
	if err != nil {
		return nil, err
	}
	m.heapInuse = -1
	if v, ok := metrics["go_memstats_heap_inuse_bytes"]; ok {
		m.heapInuse = int64(v)
	}
	st, err := procStatus(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	m.rssKB, m.anonKB, m.fileKB, m.hwmKB = st["VmRSS"], st["RssAnon"], st["RssFile"], st["VmHWM"]
	m.lastGC = "-"
	a.mu.Lock()
	for _, l := range a.lines {
		if f := strings.Fields(l.text); len(f) > 10 && f[0] == "gc" {
			for i, x := range f {
				if strings.Count(x, "->") == 2 && i+1 < len(f) {
					m.lastGC = x[strings.LastIndex(x, ">")+1:] + " " + strings.TrimSuffix(f[i+1], ",") + " (gc " + f[1] + ")"
				}
			}
		}
	}
	a.mu.Unlock()
	return m, nil
}

// scrape reads draind's /metrics into name{labels} → value.
func scrape(c *nsClient) (map[string]float64, error) {
	code, body, err := c.get("http://" + statusAddr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics: status %d", code)
	}
	out := map[string]float64{}
	for l := range strings.SplitSeq(body, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out, nil
}

// procStatus reads the kB fields of /proc/PID/status.
func procStatus(pid int) (map[string]int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if fields := strings.Fields(v); ok && len(fields) == 2 && fields[1] == "kB" {
			out[k], _ = strconv.ParseInt(fields[0], 10, 64)
		}
	}
	return out, sc.Err()
}
