package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/nsrun"
	"github.com/draind/draind/internal/testenv/testutil"
)

// The fault and load suite (issue 16, docs/reliability.md): draind's
// promise — no request lost at termination, never past the grace period —
// under load and when things break. Every test is named TestReliability*;
// each runs a short version in the normal `go test ./e2e`, and the full
// one with DRAIND_RELIABILITY=full (`make reliability`), which also writes
// one table row per case to $DRAIND_RELIABILITY_OUT.

// reliabilityFull reports whether the full-size suite runs.
func reliabilityFull() bool { return os.Getenv("DRAIND_RELIABILITY") == "full" }

// pick chooses the short or the full figure.
func pick[T any](short, full T) T {
	if reliabilityFull() {
		return full
	}
	return short
}

// outcome is one row of the results table.
type outcome struct {
	name      string
	injected  string
	attempted string // requests/calls attempted ("–" when none)
	failed    string
	stopped   string // from the trigger to the proxy's stop
	exit      int
	limit     string // the limit, whether it was respected, and the figure
}

var recordMu sync.Mutex

// record logs o and, when DRAIND_RELIABILITY_OUT names a file, appends it
// as a Markdown table row (with the header first into an empty file).
func record(t testing.TB, o outcome) {
	t.Helper()
	t.Logf("RESULT %s | %s | attempted %s | failed %s | stopped %s | exit %d | %s", o.name, o.injected, o.attempted, o.failed, o.stopped, o.exit, o.limit)
	path := os.Getenv("DRAIND_RELIABILITY_OUT")
	if path == "" {
		return
	}
	recordMu.Lock()
	defer recordMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("results file: %v", err)
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		fmt.Fprintln(f, "| case | injected | requests/calls attempted | failed | trigger → proxy stopped | exit code | limit respected |")
		fmt.Fprintln(f, "|---|---|---|---|---|---|---|")
	}
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	fmt.Fprintf(f, "| %s | %s | %s | %s | %s | %d | %s |\n", cell(o.name), cell(o.injected), cell(o.attempted), cell(o.failed), cell(o.stopped), o.exit, cell(o.limit))
}

// secs renders a duration in seconds with millisecond precision.
func secs(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }

// ---- processes as the host sees them ----

// childPids lists pid's children (every thread's).
func childPids(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// waitChild waits for pid's only child to appear and returns it.
func waitChild(t testing.TB, pid int, what string) int {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if c := childPids(pid); len(c) == 1 {
			return c[0]
		}
	}
	t.Fatalf("no %s (child of %d) after 10 s", what, pid)
	return 0
}

// procWatch follows one process by a pidfd: exited is closed, and at set,
// the moment it exits (the pidfd turns readable).
type procWatch struct {
	pid    int
	fd     int
	exited chan struct{}
	at     time.Time
}

// watchPid follows pid. At the test's end a process still running is
// killed and reported: nothing of a pod may outlive it.
func watchPid(t testing.TB, pid int, what string) *procWatch {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd of %s (%d): %v", what, pid, err)
	}
	w := &procWatch{pid: pid, fd: fd, exited: make(chan struct{})}
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		w.at = time.Now()
		close(w.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			t.Errorf("%s (pid %d) still running when the test ended: killed", what, pid)
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			<-w.exited
		}
		unix.Close(fd)
	})
	return w
}

// waitGone waits for the exit, at most d.
func (w *procWatch) waitGone(d time.Duration) bool {
	select {
	case <-w.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// draindPid is draind's pid as the host sees it: PID 1 of the proxy's
// container, or the child of its init (draindUnderInit).
func (p *pod) draindPid() int {
	p.t.Helper()
	if !p.draindUnderInit {
		return p.draind.Pid()
	}
	return waitChild(p.t, p.draind.Pid(), "draind")
}

// watchProxy follows the proxy (envoysim): draind's child.
func (p *pod) watchProxy() *procWatch {
	p.t.Helper()
	return watchPid(p.t, waitChild(p.t, p.draindPid(), "proxy"), "the proxy")
}

// watchDraind returns a channel closed when draind's container ends, and
// when it did.
func (p *pod) watchDraind() (<-chan struct{}, *time.Time) {
	done := make(chan struct{})
	at := new(time.Time)
	go func() {
		<-p.draind.done
		*at = time.Now()
		close(done)
	}()
	return done, at
}

// awaitExit waits for draind's end, at most d after what happened, then
// for its proxy's, and returns draind's exit code.
func (p *pod) awaitExit(done <-chan struct{}, proxy *procWatch, d time.Duration, what string) int {
	p.t.Helper()
	select {
	case <-done:
	case <-time.After(d):
		p.t.Fatalf("draind still running %s after %s; log:\n%s", d, what, p.draindLog.String())
	}
	if !proxy.waitGone(5 * time.Second) {
		p.t.Fatalf("draind exited %d and the proxy runs on", p.draind.code)
	}
	return p.draind.code
}

// ---- BPF objects ----

// bpfObjects are BPF object ids by kind: prog, map, link.
type bpfObjects map[string][]int

func (b bpfObjects) count() int { return len(b["prog"]) + len(b["map"]) + len(b["link"]) }

func (b bpfObjects) String() string {
	return fmt.Sprintf("%d programs, %d maps, %d links", len(b["prog"]), len(b["map"]), len(b["link"]))
}

// bpfHeld lists the BPF objects pid holds open, from /proc/PID/fdinfo.
func bpfHeld(pid int) bpfObjects {
	out := bpfObjects{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		var kind, field string
		switch target {
		case "anon_inode:bpf-prog":
			kind, field = "prog", "prog_id:"
		case "anon_inode:bpf-map":
			kind, field = "map", "map_id:"
		case "anon_inode:bpf_link":
			kind, field = "link", "link_id:"
		default:
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field); ok {
				if id, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					out[kind] = append(out[kind], id)
				}
			}
		}
	}
	return out
}

// bpfLive lists every BPF object of the machine (bpftool), by kind.
func bpfLive(t testing.TB) bpfObjects {
	t.Helper()
	out := bpfObjects{}
	for _, kind := range []string{"prog", "map", "link"} {
		b, err := exec.Command("bpftool", "-j", kind, "show").Output()
		if err != nil {
			t.Fatalf("bpftool %s show: %v", kind, err)
		}
		var objs []struct {
			ID int `json:"id"`
		}
		if len(strings.TrimSpace(string(b))) > 0 {
			if err := json.Unmarshal(b, &objs); err != nil {
				t.Fatalf("bpftool %s show: %v: %s", kind, err, b)
			}
		}
		for _, o := range objs {
			out[kind] = append(out[kind], o.ID)
		}
	}
	return out
}

// bpfLeft lists the objects of held still alive.
func bpfLeft(t testing.TB, held bpfObjects) bpfObjects {
	t.Helper()
	live := bpfLive(t)
	left := bpfObjects{}
	for kind, ids := range held {
		for _, id := range ids {
			if slices.Contains(live[kind], id) {
				left[kind] = append(left[kind], id)
			}
		}
	}
	return left
}

// waitBPFGone waits until none of held is alive (the kernel frees a
// closed object's memory after an RCU grace period, its id at once) and
// returns how long that took, or fails after d.
func waitBPFGone(t testing.TB, held bpfObjects, since time.Time, d time.Duration) time.Duration {
	t.Helper()
	end := time.Now().Add(d)
	for {
		left := bpfLeft(t, held)
		if left.count() == 0 {
			return time.Since(since)
		}
		if time.Now().After(end) {
			t.Errorf("BPF objects of a dead draind still loaded %s later: %s %v", d, left, left)
			return time.Since(since)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireBpftool skips when bpftool is absent (CI installs it).
func requireBpftool(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t) // the pods need it, and bpftool lists BPF objects only for root
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Skip("bpftool not installed (Debian: apt-get install bpftool)")
	}
}

// ---- roles of the test binary used by this suite ----

// faultRoles are the processes this suite adds to the pod (TestMain runs
// them): __init, a container's small init with draind as its child; and
// __fetch, which prints what a GET of a URL answers, from inside the pod.
var faultRoles = map[string]func(args []string) int{
	"__init":  initRole,
	"__fetch": fetchRole,
}

// initRole is a container's init (as tini or dumb-init): it starts its
// arguments as a role of this binary, forwards SIGTERM and SIGINT to it,
// reaps every process, and stays when its child is gone, so a killed
// draind leaves the container (its PID namespace) alive: only draind's own
// means (the parent-death signal) can take the proxy with it.
func initRole(args []string) int {
	sigc := make(chan os.Signal, 16)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	proc, err := os.StartProcess(os.Args[0], append([]string{os.Args[0]}, args...),
		&os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	child := proc.Pid
	proc.Release() // reaped below, with everything else
	alive := true
	for sig := range sigc {
		if sig != syscall.SIGCHLD {
			if alive {
				syscall.Kill(child, sig.(syscall.Signal))
			}
			continue
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid == child {
				alive = false
				fmt.Fprintf(os.Stderr, "init: child %d ended: exit %d signal %d\n", pid, ws.ExitStatus(), ws.Signal())
			}
		}
	}
	return 0
}

// fetchRole prints the body of GET args[0].
func fetchRole(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "fetch: one URL")
		return 2
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fetch:", err)
		return 1
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil || resp.StatusCode != 200 {
		fmt.Fprintln(os.Stderr, "fetch:", resp.Status, err)
		return 1
	}
	return 0
}

// ---- the tracker's table against a fresh sock_diag snapshot ----

// snapshotJSON is what /debug/flows and `draind conns -o json` print.
type snapshotJSON struct {
	Summary   map[string]int `json:"summary"`
	Listeners []flowJSON     `json:"listeners"`
	Flows     []flowJSON     `json:"flows"`
}

type flowJSON struct {
	State  string `json:"state"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
	UID    uint32 `json:"uid"`
	Owner  string `json:"owner"`
}

// holdingStates hold the drain (docs/design.md, "when it holds").
var holdingStates = map[string]bool{"ESTABLISHED": true, "SYN_SENT": true, "SYN_RECV": true, "CLOSE_WAIT": true}

// inContainer runs a role in a container of its own in the pod and
// returns its output.
func (p *pod) inContainer(name, role string, args ...string) string {
	p.t.Helper()
	var out syncBuffer
	c := p.runContainer(name, -1, &out, role, args...)
	if !c.wait(30 * time.Second) {
		p.t.Fatalf("%s did not finish", name)
	}
	if c.code != 0 {
		p.t.Fatalf("%s: exit %d: %s", name, c.code, out.String())
	}
	return out.String()
}

// tableCheck is one comparison of draind's table with a fresh snapshot.
type tableCheck struct {
	listeners, holding int      // in the fresh snapshot
	diffs              []string // listeners or holding flows in one only
	closingTracker     int      // closing-state entries in the tracker's table
	closingFresh       int      // closing-state sockets in the snapshot (TIME_WAIT included)
	ownerDiffs         []string // same socket, another owner (draind knows its own ports; conns does not)
}

// compareTable fetches draind's table (GET /debug/flows, loopback only,
// from a container in the pod), then a fresh snapshot (`draind conns -o
// json` in another container), and compares listeners and the flows that
// hold the drain. Closing states are counted, not compared: the tracker
// leaves TIME_WAIT out by design. The fetch's own connection to the status
// port is left out of both.
func (p *pod) compareTable() tableCheck {
	p.t.Helper()
	var tracker, fresh snapshotJSON
	raw := p.inContainer("fetch", "__fetch", "http://127.0.0.1:15020/debug/flows")
	if err := json.Unmarshal([]byte(raw), &tracker); err != nil {
		p.t.Fatalf("/debug/flows: %v: %.300s", err, raw)
	}
	raw = p.inContainer("conns", "__draind", "conns", "-o", "json", "--idle=false")
	if err := json.Unmarshal([]byte(raw), &fresh); err != nil {
		p.t.Fatalf("conns -o json: %v: %.300s", err, raw)
	}
	statusPort := func(f flowJSON) bool {
		return f.State != "LISTEN" && (strings.HasSuffix(f.Local, ":15020") || strings.HasSuffix(f.Remote, ":15020"))
	}
	index := func(s snapshotJSON) (map[string]flowJSON, int) {
		m := map[string]flowJSON{}
		closing := 0
		for _, f := range append(append([]flowJSON{}, s.Listeners...), s.Flows...) {
			switch {
			case statusPort(f):
			case f.State == "LISTEN" || holdingStates[f.State]:
				m[f.State+" "+f.Local+" "+f.Remote] = f
			default:
				closing++
			}
		}
		return m, closing
	}
	tm, tc := index(tracker)
	fm, fc := index(fresh)
	c := tableCheck{closingTracker: tc, closingFresh: fc}
	for k, f := range fm {
		if f.State == "LISTEN" {
			c.listeners++
		} else {
			c.holding++
		}
		tf, ok := tm[k]
		switch {
		case !ok:
			c.diffs = append(c.diffs, "only in the fresh snapshot: "+k)
		case tf.Owner != f.Owner:
			c.ownerDiffs = append(c.ownerDiffs, fmt.Sprintf("%s: draind %s, conns %s", k, tf.Owner, f.Owner))
		}
	}
	for k := range tm {
		if _, ok := fm[k]; !ok {
			c.diffs = append(c.diffs, "only in draind's table: "+k)
		}
	}
	slices.Sort(c.diffs)
	slices.Sort(c.ownerDiffs)
	return c
}

// waitTableMatches compares until the table and the snapshot agree (the
// pod is quiet, but an exchange may be in flight between the two reads),
// at most tries times, and returns the last comparison and the attempts.
func (p *pod) waitTableMatches(tries int) (tableCheck, int) {
	p.t.Helper()
	var c tableCheck
	for i := 1; ; i++ {
		c = p.compareTable()
		if len(c.diffs) == 0 || i == tries {
			return c, i
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- traffic from inside the pod ----

// churn opens and closes n TCP connections to addr from inside the pod,
// on workers threads, as fast as the kernel takes them: with rst, each
// ends with a reset (SO_LINGER 0); otherwise every third one carries an
// HTTP request with Connection: close, every third resets, the rest just
// close. It returns how many could not be made.
func (p *pod) churn(n, workers int, addr string, rst bool) (failed int) {
	p.t.Helper()
	ap, err := parseAddrPort(addr)
	if err != nil {
		p.t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int, n) // filled up front: no feeder to outlive a failed worker
	for i := range n {
		next <- i
	}
	close(next)
	for range workers {
		wg.Go(func() {
			err := nsDo(p, func() {
				for i := range next {
					if err := oneConn(ap, rst || i%3 == 1, !rst && i%3 == 0); err != nil {
						mu.Lock()
						if failed++; failed <= 3 {
							p.t.Logf("churn connection %d: %v", i, err)
						}
						mu.Unlock()
					}
				}
			})
			if err != nil {
				p.t.Errorf("churn worker: %v", err)
			}
		})
	}
	wg.Wait()
	return failed
}

// oneConn makes one connection with plain syscalls (a blocking connect on
// loopback completes in the kernel at once) and ends it.
func oneConn(ap unix.SockaddrInet4, rst, request bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 5}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &ap); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if request {
		if _, err := unix.Write(fd, []byte("GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		r := bufio.NewReader(fdReader(fd))
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return fmt.Errorf("response: %w", err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
	}
	if rst {
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	}
	return nil
}

type fdReader int

func (f fdReader) Read(b []byte) (int, error) {
	n, err := unix.Read(int(f), b)
	if n == 0 && err == nil {
		return 0, io.EOF
	}
	if n < 0 {
		n = 0
	}
	return n, err
}

func parseAddrPort(s string) (unix.SockaddrInet4, error) {
	host, port, ok := strings.Cut(s, ":")
	var sa unix.SockaddrInet4
	if !ok {
		return sa, fmt.Errorf("address %q", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return sa, fmt.Errorf("address %q: %w", s, err)
	}
	sa.Port = n
	for i, b := range strings.Split(host, ".") {
		v, err := strconv.Atoi(b)
		if err != nil || i > 3 {
			return sa, fmt.Errorf("address %q", s)
		}
		sa.Addr[i] = byte(v)
	}
	return sa, nil
}

// nsDo runs fn on a thread inside the pod's network namespace: sockets it
// makes are the pod's.
func nsDo(p *pod, fn func()) error {
	return nsrun.Do(p.ns.Handle, func() error { fn(); return nil })
}

// ended reports, without waiting, whether the container has ended.
func (c *container) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
