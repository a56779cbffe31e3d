package appprocs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// The test binary doubles as the helper processes of these tests: it is
// re-run with -test.run=^TestProcsHelper$ and procsHelperEnv set to a mode.
const (
	procsHelperEnv  = "DRAIND_PROCS_HELPER"
	procsArgsEnv    = "DRAIND_PROCS_ARGS"     // detach: the command, \x1f-separated
	procsUIDEnv     = "DRAIND_PROCS_UID"      // detach: run the command as this uid
	procsSameMntEnv = "DRAIND_PROCS_SAME_MNT" // detach: stay in the test's mount namespace
	procsArgSep     = "\x1f"
	procsSelfMarker = "@" // detach: "@MODE" runs this binary as helper MODE
	procsWait       = 15 * time.Second
)

// procsHelperCmd runs this test binary as helper mode.
func procsHelperCmd(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcsHelper$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), procsHelperEnv+"="+mode,
		// A -race binary otherwise sleeps 1 s at exit.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// TestProcsHelper is the helper side of the process tracker tests:
//
//	detach   start DRAIND_PROCS_ARGS in a new session and mount namespace
//	         (a container of its own), print "pid N", exit: the command is
//	         orphaned, as a pod's processes are to draind
//	tree     start "sleep infinity" and a threads helper, print
//	         "tree SLEEP THREADS", reap them, live until killed
//	threads  start 4 more OS threads, print "threads N", live until killed
//	churn    keep creating and ending threads (one a millisecond), print
//	         "churn" once 20 have ended, live until killed
//	caps     open an eBPF tracker on its own namespace, print the outcome
//	blind    in a new PID namespace, open a /proc poller on a fresh procfs
//	pidns1   pid 1 of new PID and network namespaces: run pidns, wait
//	pidns    its child: track two processes with rules in this PID
//	         namespace's numbering, print the outcome
func TestProcsHelper(t *testing.T) {
	mode := os.Getenv(procsHelperEnv)
	if mode == "" {
		t.Skip("helper process for the process tracker tests")
	}
	switch mode {
	case "detach":
		argv := strings.Split(os.Getenv(procsArgsEnv), procsArgSep)
		var cmd *exec.Cmd
		if m, ok := strings.CutPrefix(argv[0], procsSelfMarker); ok {
			cmd = procsHelperCmd(m)
			cmd.Stdout = os.Stdout // the helper's line goes to the test
		} else {
			cmd = exec.Command(argv[0], argv[1:]...)
			cmd.Env = os.Environ()
		}
		// A container of its own: a new session, and a mount namespace of
		// its own, as a runtime gives every container (see Classify's
		// container rule: one sharing the test's would be draind's).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: unix.CLONE_NEWNS}
		if os.Getenv(procsSameMntEnv) != "" {
			cmd.SysProcAttr.Cloneflags = 0 // exec'd into draind's container
		}
		if u := os.Getenv(procsUIDEnv); u != "" {
			uid, _ := strconv.Atoi(u)
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
		}
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			return
		}
		fmt.Println("pid", cmd.Process.Pid)
	case "tree":
		sleep := exec.Command("sleep", "infinity")
		if err := sleep.Start(); err != nil {
			fmt.Println("error", err)
			return
		}
		th := procsHelperCmd("threads")
		out, _ := th.StdoutPipe()
		if err := th.Start(); err != nil {
			fmt.Println("error", err)
			return
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "threads ") {
		}
		fmt.Println("tree", sleep.Process.Pid, th.Process.Pid)
		go sleep.Wait()
		go th.Wait()
		procsHelperLive()
	case "threads":
		for range 4 {
			go func() {
				runtime.LockOSThread() // this goroutine's thread is its own
				procsHelperLive()
			}()
		}
		for {
			ents, _ := os.ReadDir("/proc/self/task")
			if len(ents) >= 5 {
				fmt.Println("threads", len(ents))
				break
			}
			time.Sleep(time.Millisecond)
		}
		procsHelperLive()
	case "churn":
		for i := 0; ; i++ {
			go func() {
				// Returning while locked ends the goroutine's thread.
				runtime.LockOSThread()
			}()
			if i == 20 {
				fmt.Println("churn")
			}
			time.Sleep(time.Millisecond)
		}
	case "caps":
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
			fmt.Println("error", err)
			return
		}
		tr, _, err := Open(st.Ino, Rules{ProxyUID: istioUID}, ModeEBPF)
		var ue *UnavailableError
		switch {
		case err == nil:
			fmt.Println("ok", tr.Kind())
			tr.Close()
		case errors.As(err, &ue):
			fmt.Println("unavailable", ue.Reason)
		default:
			fmt.Println("error", err)
		}
	case "blind":
		// A new PID and mount namespace (Cloneflags): a procfs mounted
		// here shows this process alone, as a container's /proc does when
		// the pod does not share its PID namespace.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Println("error", err)
			return
		}
		dir, err := os.MkdirTemp("", "draind-proc-")
		if err != nil {
			fmt.Println("error", err)
			return
		}
		defer os.Remove(dir)
		if err := unix.Mount("proc", dir, "proc", 0, ""); err != nil {
			fmt.Println("error", err)
			return
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
			fmt.Println("error", err)
			return
		}
		tr, _, err := Open(st.Ino, Rules{ProxyUID: istioUID}, ModeProc, WithProcRoot(dir))
		var ue *UnavailableError
		switch {
		case err == nil:
			fmt.Println("ok", tr.Count())
			tr.Close()
		case errors.As(err, &ue):
			fmt.Println("unavailable", ue.Reason)
		default:
			fmt.Println("error", err)
		}
	case "pidns1":
		// The namespace's init (pause, in a pod sharing its PID
		// namespace): orphans are reparented to it, not to draind.
		cmd := procsHelperCmd("pidns")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("error", err)
		}
	case "pidns":
		fmt.Println(procsPidNSHelper())
	default:
		if !procsPodHelper(mode) {
			t.Fatalf("unknown helper mode %q", mode)
		}
	}
}

// procsPidNSHelper runs as a child of pid 1 of a new PID namespace, in a new network
// namespace: draind in a pod, whose pids are not the kernel's. Two sleeps
// are started out of its tree (through the detach helper); rules name the
// second (ProxyPIDs), the helper itself (SelfPIDs) and pid 1 (PausePIDs) by
// their pids here.
func procsPidNSHelper() string {
	start := func() (int, error) {
		cmd := procsHelperCmd("detach")
		cmd.Env = append(cmd.Env, procsArgsEnv+"=sleep"+procsArgSep+"infinity")
		out, err := cmd.Output()
		for l := range strings.SplitSeq(string(out), "\n") {
			if n, ok := strings.CutPrefix(l, "pid "); ok {
				return strconv.Atoi(n)
			}
		}
		if err != nil {
			return 0, fmt.Errorf("detach: %w: %s", err, out)
		}
		return 0, fmt.Errorf("detach: no pid in its output: %s", out)
	}
	app, err := start()
	if err != nil {
		return "error " + err.Error()
	}
	proxy, err := start()
	if err != nil {
		return "error " + err.Error()
	}
	defer unix.Kill(app, unix.SIGKILL)
	defer unix.Kill(proxy, unix.SIGKILL)
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return "error " + err.Error()
	}
	rules := Rules{SelfPIDs: []int{os.Getpid()}, ProxyUID: istioUID, ProxyPIDs: []int{proxy}, PausePIDs: []int{1}}
	tr, _, err := Open(st.Ino, rules, ModeEBPF)
	if err != nil {
		return "error " + err.Error()
	}
	defer tr.Close()
	all, classes := tableOf(tr).classified()
	n := map[Class]int{}
	for _, c := range classes {
		n[c]++
	}
	return fmt.Sprintf("ok procs=%d app=%d proxy=%d self=%d pause=%d",
		len(all), n[ClassApp], n[ClassProxy], n[ClassSelf], n[ClassPause])
}

// procsHelperLive blocks until the process is killed (or the helper's
// -test.timeout ends it).
func procsHelperLive() {
	for {
		time.Sleep(time.Hour)
	}
}

// testProc is a process started for a test, killed at its end.
type testProc struct {
	pid   int
	pidfd int
}

// kill sends SIGKILL through the pidfd: never to a reused pid.
func (p *testProc) kill(t *testing.T) {
	t.Helper()
	if err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		t.Fatalf("kill %d: %v", p.pid, err)
	}
}

// trackPID holds a pidfd on pid, and kills it at the end of the test with
// its process group when it leads one (a detached process leads its
// session: its children, orphaned by its death, would live on).
func trackPID(t *testing.T, pid int) *testProc {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	p := &testProc{pid: pid, pidfd: fd}
	t.Cleanup(func() {
		// Alive (the signal 0 through the pidfd), so pid is not reused, and
		// a group with its number is its own.
		if unix.PidfdSendSignal(fd, 0, nil, 0) == nil {
			if pg, err := unix.Getpgid(pid); err == nil && pg == pid {
				unix.Kill(-pid, unix.SIGKILL)
			}
		}
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	})
	return p
}

// spawnDetached starts argv in ns through the detach helper, so that it is
// not a descendant of the test process (draind), under uid when uid >= 0.
// argv[0] "@MODE" runs a helper mode; its "MODE ..." line is returned.
func spawnDetached(t *testing.T, ns *testutil.NetNS, uid int, argv ...string) (*testProc, []string) {
	t.Helper()
	return spawnDetachedEnv(t, ns, uid, nil, argv...)
}

// spawnInSelfContainer starts argv as spawnDetached does, but in the test
// process's mount namespace: a process the runtime exec'd into draind's
// container (a hook, `kubectl exec`), its parent outside the namespace.
func spawnInSelfContainer(t *testing.T, ns *testutil.NetNS, argv ...string) (*testProc, []string) {
	t.Helper()
	return spawnDetachedEnv(t, ns, -1, []string{procsSameMntEnv + "=1"}, argv...)
}

func spawnDetachedEnv(t *testing.T, ns *testutil.NetNS, uid int, env []string, argv ...string) (*testProc, []string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := procsHelperCmd("detach")
	cmd.Env = append(cmd.Env, env...)
	cmd.Env = append(cmd.Env, procsArgsEnv+"="+strings.Join(argv, procsArgSep))
	if uid >= 0 {
		cmd.Env = append(cmd.Env, procsUIDEnv+"="+strconv.Itoa(uid))
	}
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	var startErr error
	ns.Do(t, func() { startErr = cmd.Start() }) // born in ns
	w.Close()
	if startErr != nil {
		t.Fatalf("start detach helper: %v", startErr)
	}
	defer cmd.Wait()
	r.SetReadDeadline(time.Now().Add(procsWait))
	sc := bufio.NewScanner(r)
	var p *testProc
	var line []string
	wantLine := ""
	if m, ok := strings.CutPrefix(argv[0], procsSelfMarker); ok {
		wantLine = m
	}
	// The two lines come from two processes, in either order.
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "pid":
			pid, _ := strconv.Atoi(f[1])
			p = trackPID(t, pid)
		case len(f) > 0 && f[0] == "error":
			t.Fatalf("detach %v: %s", argv, sc.Text())
		case wantLine != "" && len(f) > 0 && f[0] == wantLine:
			line = f
		}
		if p != nil && (wantLine == "" || line != nil) {
			return p, line
		}
	}
	t.Fatalf("detach %v: no pid (%v)", argv, sc.Err())
	return nil, nil
}

// startChild starts argv in ns as a child of the test process.
func startChild(t *testing.T, ns *testutil.NetNS, argv ...string) *testProc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var err error
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return &testProc{pid: cmd.Process.Pid, pidfd: -1}
}

// parkThread keeps one thread of the test process in ns until the test
// ends: the process then has a thread in the namespace (draind looking into
// it), which the eBPF tracker sees.
func parkThread(t *testing.T, ns *testutil.NetNS) {
	stop, parked, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		ns.Do(t, func() { close(parked); <-stop })
	}()
	<-parked
	t.Cleanup(func() { close(stop); <-done })
}

func appPIDs(tr interface{ Processes() []Process }) []int { return pids(tr.Processes()) }

func sortedPIDs(ps ...*testProc) []int {
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.pid)
	}
	slices.Sort(out)
	return out
}

// waitApp waits, woken by Changed, until the app's pids are want.
func waitApp(t *testing.T, tr Source, want []int, what string) {
	t.Helper()
	deadline := time.After(procsWait)
	for {
		if got := appPIDs(tr); slices.Equal(got, want) {
			return
		}
		select {
		case <-tr.Changed():
		case <-deadline:
			t.Fatalf("%s: app = %v, want %v (err %v)\n%s", what, appPIDs(tr), want, tr.Err(), dumpProcs(tr))
		}
	}
}

func dumpProcs(tr Source) string {
	all, classes := tableOf(tr).classified()
	var b strings.Builder
	for i, p := range all {
		fmt.Fprintf(&b, "  %d ppid=%d uid=%d %q start=%d %s\n", p.PID, p.PPID, p.UID, p.Comm, p.StartTime, classes[i])
	}
	return b.String()
}

func drainChanged(tr Source) {
	select {
	case <-tr.Changed():
	default:
	}
}

func classOf(tr Source, pid int) (Class, bool) {
	all, classes := tableOf(tr).classified()
	for i, p := range all {
		if p.PID == pid {
			return classes[i], true
		}
	}
	return 0, false
}

// tableOf is the table behind a source (tests look inside).
func tableOf(src Source) *table {
	switch s := src.(type) {
	case *ebpfSource:
		return s.table
	case *procSource:
		return s.table
	}
	panic(fmt.Sprintf("source %T", src))
}

// runSource runs src until the end of the test, as draind does: Run in a
// goroutine the test owns, stopped before Close. stop ends Run early and
// returns its error.
func runSource(tb testing.TB, src Source) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	stop = sync.OnceValue(func() error { cancel(); return <-done })
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("Run: %v", err)
		}
		if err := src.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return stop
}

// startSource opens a source with the backend mode asks for and runs it
// until the end of the test (see runSource).
func startSource(tb testing.TB, inode uint64, rules Rules, mode Mode, opts ...Option) (Source, func() error) {
	tb.Helper()
	src, _, err := Open(inode, rules, mode, opts...)
	if err != nil {
		// Root (with BTF for eBPF): the backend must work. A skip would
		// hide a broken program.
		tb.Fatalf("Open %s: %v", mode, err)
	}
	return src, runSource(tb, src)
}

type procsOpener func(t *testing.T, inode uint64, rules Rules) (Source, func() error)

func startEBPF(t *testing.T, inode uint64, rules Rules) (Source, func() error) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	return startSource(t, inode, rules, ModeEBPF)
}

func startProc(t *testing.T, inode uint64, rules Rules) (Source, func() error) {
	t.Helper()
	testutil.RequireRoot(t)
	return startSource(t, inode, rules, ModeProc, WithPollPeriod(50*time.Millisecond))
}

func TestAppProcsEBPF(t *testing.T) { testAppProcs(t, startEBPF) }
func TestAppProcsProc(t *testing.T) { testAppProcs(t, startProc) }

// testAppProcs is the behaviour both backends must have.
func testAppProcs(t *testing.T, start procsOpener) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	other := testutil.NewNetNS(t)

	// The pod before the tracker starts: pause first (the pause rule picks
	// the oldest, by name "sleep" here), the proxy (uid 1337, with a
	// child), a second proxy by pid (root, with a root child), a child of
	// draind (the test process), the same uid in another namespace, and
	// one app process with threads.
	pause, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
	time.Sleep(50 * time.Millisecond) // /proc start times count 10 ms ticks
	spawnDetached(t, ns, istioUID, "sh", "-c", "sleep infinity & wait")
	proxyB, _ := spawnDetached(t, ns, -1, "sh", "-c", "sleep infinity & wait")
	selfChild := startChild(t, ns, "sleep", "infinity")
	spawnDetached(t, other, -1, "sleep", "infinity")
	early, line := spawnDetached(t, ns, -1, "@threads")
	if n, _ := strconv.Atoi(line[1]); n < 5 {
		t.Fatalf("threads helper has %s threads", line[1])
	}
	parkThread(t, ns)

	rules := Rules{ProxyUID: istioUID, ProxyPIDs: []int{proxyB.pid}, PauseComm: "sleep"}
	tr, stop := start(t, ns.Inode, rules)
	if tr.Err() != nil {
		t.Fatal(tr.Err())
	}
	// The snapshot: the threaded process counts once; everything else is
	// excluded.
	waitApp(t, tr, []int{early.pid}, "snapshot")
	for _, c := range []struct {
		p    *testProc
		want Class
	}{{pause, ClassPause}, {proxyB, ClassProxy}, {selfChild, ClassSelf}} {
		if got, ok := classOf(tr, c.p.pid); !ok || got != c.want {
			t.Errorf("pid %d: class %v (seen %v), want %v\n%s", c.p.pid, got, ok, c.want, dumpProcs(tr))
		}
	}
	if tr.Kind() == ModeEBPF {
		// The parked thread puts the test process in the namespace: seen,
		// and draind's own.
		if got, ok := classOf(tr, os.Getpid()); !ok || got != ClassSelf {
			t.Errorf("test process: class %v (seen %v), want self\n%s", got, ok, dumpProcs(tr))
		}
	}

	// The app grows after the snapshot: a parent, a child and a threaded
	// child.
	// A process whose threads keep ending: a thread's exit is not the
	// process's.
	churner, _ := spawnDetached(t, ns, -1, "@churn")
	parent, line := spawnDetached(t, ns, -1, "@tree")
	sleepPID, _ := strconv.Atoi(line[1])
	threadsPID, _ := strconv.Atoi(line[2])
	child, threaded := trackPID(t, sleepPID), trackPID(t, threadsPID)
	app := sortedPIDs(early, churner, parent, child, threaded)
	waitApp(t, tr, app, "after fork")
	if got := tr.Count(); got != 5 {
		t.Errorf("Count = %d, want 5", got)
	}

	// Exits, one at a time: each is seen in the first notification after
	// it, the last one brings the count to zero.
	order := []*testProc{child, threaded, parent, churner, early}
	for i, p := range order {
		drainChanged(tr)
		app = slices.DeleteFunc(app, func(pid int) bool { return pid == p.pid })
		p.kill(t)
		select {
		case <-tr.Changed():
		case <-time.After(procsWait):
			t.Fatalf("exit %d of %d (pid %d): no notification; app = %v", i+1, len(order), p.pid, appPIDs(tr))
		}
		if got := appPIDs(tr); !slices.Equal(got, app) {
			t.Fatalf("exit %d of %d (pid %d): app = %v after one notification, want %v\n%s", i+1, len(order), p.pid, got, app, dumpProcs(tr))
		}
	}
	if got := tr.Count(); got != 0 {
		t.Fatalf("Count = %d after the last exit", got)
	}
	if tr.Lost() != 0 || tr.Err() != nil {
		t.Errorf("lost %d, err %v", tr.Lost(), tr.Err())
	}
	// Pause, proxies and draind's own are still there, still excluded.
	if got, ok := classOf(tr, pause.pid); !ok || got != ClassPause {
		t.Errorf("pause: class %v (seen %v)", got, ok)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestProcTrackerResync: events dropped for a full ring buffer are counted
// and followed by a snapshot that puts the set right.
func TestProcTrackerResync(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	ns := testutil.NewNetNS(t)
	tr, _ := startSource(t, ns.Inode, Rules{ProxyUID: istioUID}, ModeEBPF, WithRingSize(os.Getpagesize()))
	eb, tb := tr.(*ebpfSource), tableOf(tr)
	snaps := eb.snaps.Load()

	// Stall the reader (it needs the lock to apply an event) while a
	// burst of short-lived processes overflows a one-page ring, then start
	// one that stays.
	tb.mu.Lock()
	burst := exec.Command("sh", "-c", "i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done")
	var err error
	ns.Do(t, func() { err = burst.Start() })
	if err != nil {
		tb.mu.Unlock()
		t.Fatal(err)
	}
	deadline := time.Now().Add(procsWait)
	for tr.Lost() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stayer, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
	tb.mu.Unlock()

	if tr.Lost() == 0 {
		t.Fatal("no event lost with a one-page ring and the reader stalled")
	}
	// The burst's sh is the test's child (draind's): only the stayer is
	// the app.
	waitApp(t, tr, []int{stayer.pid}, "after resync")
	// Catch up: once the exit of a process started after the burst is
	// applied, so is everything before it in the ring, and any snapshot
	// a loss called for.
	if err := burst.Wait(); err != nil {
		t.Fatalf("burst: %v", err)
	}
	sentinel, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
	waitApp(t, tr, sortedPIDs(stayer, sentinel), "sentinel")
	sentinel.kill(t)
	waitApp(t, tr, []int{stayer.pid}, "sentinel gone")
	if eb.snaps.Load() == snaps {
		t.Error("events were lost but no snapshot was taken")
	}
	// The stayer's events were all lost (the ring was full): only the
	// snapshot found it. And no process whose exit was lost is left.
	all, _ := tb.classified()
	for _, p := range all {
		if err := unix.Kill(p.PID, 0); err == unix.ESRCH {
			t.Errorf("pid %d (%s) is gone but still tracked", p.PID, p.Comm)
		}
	}
	t.Logf("lost %d events, %d snapshots", tr.Lost(), eb.snaps.Load()-snaps)
}

func TestOpen(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	ns := testutil.NewNetNS(t)
	spawnDetached(t, ns, -1, "sleep", "infinity")
	for _, c := range []struct {
		mode   Mode
		source Mode
	}{{ModeAuto, ModeEBPF}, {ModeEBPF, ModeEBPF}, {ModeProc, ModeProc}} {
		tr, reason, err := Open(ns.Inode, Rules{ProxyUID: istioUID}, c.mode)
		if err != nil {
			t.Fatalf("%s: %v", c.mode, err)
		}
		if tr.Kind() != c.source || !strings.HasPrefix(reason, string(c.source)+":") {
			t.Errorf("%s: source %q, reason %q; want %s", c.mode, tr.Kind(), reason, c.source)
		}
		if tr.Count() != 1 {
			t.Errorf("%s: count %d, want 1", c.mode, tr.Count())
		}
		t.Logf("%s: %s", c.mode, reason)
		tr.Close()
	}
	if _, _, err := Open(ns.Inode, Rules{}, "bogus"); err == nil {
		t.Error("bogus mode: no error")
	}
	if _, _, err := Open(0, Rules{}, ModeEBPF); err == nil {
		t.Error("inode 0: no error")
	}
}

// procsHelperBinary copies the test binary where any uid can run it (go
// test's build directory is private to root).
func procsHelperBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "draind-procs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "helper")
	if err := os.WriteFile(path, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestProcTrackerCapabilities: without CAP_BPF+CAP_PERFMON the eBPF backend
// says so with a UnavailableError, and auto mode would fall back.
func TestProcTrackerCapabilities(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	bin := procsHelperBinary(t)
	run := func(caps ...uintptr) string {
		cmd := exec.Command(bin, "-test.run=^TestProcsHelper$")
		cmd.Env = append(os.Environ(), procsHelperEnv+"=caps")
		cmd.Dir = filepath.Dir(bin)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: caps,
		}
		out, err := cmd.CombinedOutput()
		for l := range strings.SplitSeq(string(out), "\n") {
			if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "unavailable ") || strings.HasPrefix(l, "error ") {
				return l
			}
		}
		t.Fatalf("helper: %v\n%s", err, out)
		return ""
	}
	if got := run(unix.CAP_BPF, unix.CAP_PERFMON); got != "ok ebpf" {
		t.Errorf("uid 65534 with CAP_BPF+CAP_PERFMON: %q", got)
	}
	if got, want := run(), "unavailable no CAP_BPF/CAP_PERFMON (or CAP_SYS_ADMIN)"; got != want {
		t.Errorf("uid 65534 without capabilities: %q, want %q", got, want)
	}
}

// TestProcPollerBlind: a /proc that shows none of the namespace's processes
// but draind's own (no shared PID namespace) is refused, not taken for an
// app that is done.
func TestProcPollerBlind(t *testing.T) {
	testutil.RequireRoot(t)
	cmd := procsHelperCmd("blind")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	for l := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(l, "unavailable /proc: shows none") {
			return
		}
	}
	t.Fatalf("blind /proc poller: want unavailable, got (%v):\n%s", err, out)
}

// TestProcTrackerPidNS: draind in its own PID namespace (a pod without
// shareProcessNamespace) names processes by its own pids; the eBPF tracker,
// which sees the kernel's, maps them (the iterator and the events carry
// each process's pid in the loader's PID namespace).
func TestProcTrackerPidNS(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	cmd := procsHelperCmd("pidns1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	for l := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "error ") {
			// Without the mapping the proxy's pid (a small number here)
			// would name some other process of the host, and it would be
			// the app's.
			if want := "ok procs=4 app=1 proxy=1 self=1 pause=1"; l != want {
				t.Fatalf("got %q, want %q", l, want)
			}
			return
		}
	}
	t.Fatalf("pidns helper (%v):\n%s", err, out)
}

// TestAppProcExitLatency measures process exit -> Changed with the app count
// down by one, over 50 exits per backend. A measurement (logged), bounded
// only loosely.
func TestAppProcExitLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	for _, b := range []struct {
		name string
		open procsOpener
	}{{"ebpf", startEBPF}, {"proc", startProc}} {
		t.Run(b.name, func(t *testing.T) {
			testutil.RequireRoot(t)
			ns := testutil.NewNetNS(t)
			const n = 50
			var procs []*testProc
			for range n {
				p, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
				procs = append(procs, p)
			}
			tr, _ := b.open(t, ns.Inode, Rules{ProxyUID: istioUID, NoPauseRule: true})
			waitApp(t, tr, sortedPIDs(procs...), "start")
			lat := make([]time.Duration, 0, n)
			for i, p := range procs {
				drainChanged(tr)
				t0 := time.Now()
				p.kill(t)
				for tr.Count() != n-i-1 {
					select {
					case <-tr.Changed():
					case <-time.After(procsWait):
						t.Fatalf("exit %d: count %d", i, tr.Count())
					}
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
			t.Logf("%s: kill -> notification over %d exits: p50 %v, p99 %v, max %v", b.name, n, p50, p99, lat[len(lat)-1])
			if p99 > 5*time.Second {
				t.Errorf("p99 %v", p99)
			}
		})
	}
}

// TestContainerRule: processes the runtime exec'd into draind's container (a
// postStart hook, `kubectl exec`: root, their parent outside the namespace,
// draind's mount namespace) are draind's while they live and when they exit
// 0, on both backends; the app, in a container of its own, is the app, and
// its exit is the one Exits reports.
func TestContainerRule(t *testing.T) {
	testutil.RequireRoot(t)
	for _, b := range []struct {
		name  string
		start procsOpener
	}{{"ebpf", startEBPF}, {"proc", startProc}} {
		t.Run(b.name, func(t *testing.T) {
			ns := testutil.NewNetNS(t)
			parkThread(t, ns) // draind is in the pod
			tr, _ := b.start(t, ns.Inode, Rules{ProxyUID: istioUID, NoPauseRule: true})
			if tr.Err() != nil {
				t.Fatal(tr.Err())
			}
			hook, _ := spawnInSelfContainer(t, ns, "sh", "-c", "sleep 0.3; exit 0")
			app, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
			waitApp(t, tr, []int{app.pid}, "app started, hook running")
			if c, ok := classOf(tr, hook.pid); ok && c != ClassSelf {
				t.Errorf("hook: class %v, want self\n%s", c, dumpProcs(tr))
			}
			// The hook ends 0: no exit of the app's.
			deadline := time.Now().Add(procsWait)
			for {
				if _, ok := classOf(tr, hook.pid); !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("hook still tracked\n%s", dumpProcs(tr))
				}
				select {
				case <-tr.Changed():
				case <-time.After(50 * time.Millisecond):
				}
			}
			signalProc(t, app, unix.SIGKILL)
			waitApp(t, tr, nil, "app killed")
			var exits []int
			for _, e := range tr.Exits() {
				exits = append(exits, e.PID)
			}
			if !slices.Equal(exits, []int{app.pid}) {
				t.Errorf("exits %v, want only the app's %d", exits, app.pid)
			}
		})
	}
}

// A dormant source follows nothing while the pod serves (eBPF: fork, exec
// and exit not attached; /proc: no polling), and answers Count from a
// snapshot taken when asked. Start attaches, then snapshots: the app
// started while it slept is there, and from then on exits come as events
// (eBPF: with their status).
func TestDormantSource(t *testing.T) {
	testutil.RequireRoot(t)
	for _, mode := range []Mode{ModeEBPF, ModeProc} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == ModeEBPF {
				testutil.RequireBTF(t)
			}
			ns := testutil.NewNetNS(t)
			parkThread(t, ns)
			src, _, err := Open(ns.Inode, Rules{ProxyUID: istioUID, NoPauseRule: true}, mode, WithDormant(), WithPollPeriod(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			if src.Live() {
				t.Fatal("a dormant source is live")
			}
			if e, ok := src.(*ebpfSource); ok && e.probe.Attached() {
				t.Fatal("a dormant eBPF source has its programs attached")
			}
			if err := src.Run(context.Background()); err == nil {
				t.Fatal("Run before Start returned nil")
			}
			app, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
			if got := appPIDs(src); !slices.Equal(got, []int{app.pid}) {
				t.Fatalf("dormant, asked: app %v, want [%d]", got, app.pid)
			}
			if err := src.Start(); err != nil {
				t.Fatal(err)
			}
			if !src.Live() {
				t.Fatal("started source not live")
			}
			runSource(t, src)
			second, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
			waitApp(t, src, sortedPIDs(app, second), "second app process")
			signalProc(t, second, unix.SIGKILL)
			waitApp(t, src, []int{app.pid}, "second killed")
		})
	}
}

// firstMountID tells a process that has left its namespaces (here a
// zombie; a process still exiting has the same state between
// exit_task_namespaces and exit_notify, while /proc/PID/stat shows it
// running) from one whose mountinfo is readable, so the /proc backend
// never classifies an exiting hook as the app's for want of its container.
func TestFirstMountIDExiting(t *testing.T) {
	if id, exiting := firstMountID("/proc/self"); id == 0 || exiting {
		t.Fatalf("self: id %d exiting %v; want an id", id, exiting)
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	dir := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(procsWait)
	for {
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		if _, rest, _ := strings.Cut(string(stat), ") "); strings.HasPrefix(rest, "Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never a zombie: %s", dir, stat)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if id, exiting := firstMountID(dir); !exiting {
		t.Errorf("zombie: id %d, exiting false", id)
	}
	if _, exiting := firstMountID("/proc/0"); !exiting {
		t.Error("no such process: exiting false")
	}
}
