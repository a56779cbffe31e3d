package appprocs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/testutil"
)

// A dormant eBPF source given the pod's cgroups (WithPodCgroup) attaches
// no program at Start: it follows the app through the populated state of
// the pod's containers' cgroups. The app's process is in the snapshot;
// its exit empties its container, which is an event; a container made
// after Start is watched (IN_CREATE) and its process and exit are seen.
// The periodic resync is pushed out of the test's reach, so every change
// seen came from a cgroup event.
func TestCgroupEventsSource(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	root := testutil.Cgroup2Root(t)
	pod := testutil.NewCgroup(t, root, fmt.Sprintf("draind-test-pod-%d", os.Getpid()))
	own := testutil.NewCgroup(t, pod.Path, "own")
	appCg := testutil.NewCgroup(t, pod.Path, "app")
	ns := testutil.NewNetNS(t)
	parkThread(t, ns)
	app := spawnInCgroup(t, ns, appCg, nil, "sleep", "infinity")
	// A process of draind's own container (its mount namespace): never
	// the app, and its cgroup is not watched.
	spawnInCgroup(t, ns, own, []string{procsSameMntEnv + "=1"}, "sleep", "infinity")

	src, _, err := Open(ns.Inode, Rules{ProxyUID: istioUID, NoPauseRule: true}, ModeEBPF, WithDormant(), WithPodCgroup(pod.Path, own.Path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	e := src.(*ebpfSource)
	e.resyncPeriod = time.Hour
	if err := src.Start(); err != nil {
		t.Fatal(err)
	}
	via, why := src.Following()
	t.Logf("following: %s (%s)", via, why)
	if via != ViaCgroupEvents {
		t.Fatalf("following %s (%s), want %s", via, why, ViaCgroupEvents)
	}
	if e.probe.Attached() {
		t.Error("fork, exec and exit attached while following the pod's cgroups")
	}
	if l := tracingLinks(t); len(l) != 0 {
		t.Errorf("tracing links held: %v, want none", l)
	}
	runSource(t, src)
	if n := src.Count(); n != 1 {
		t.Fatalf("started: %d app processes, want 1 (%d)\n%s", n, app.pid, dumpProcs(src))
	}
	waitApp(t, src, []int{app.pid}, "started")

	snaps := e.snaps.Load()
	signalProc(t, app, unix.SIGKILL)
	waitApp(t, src, nil, "the app's container emptied")
	t.Logf("snapshots on the exit: %d", e.snaps.Load()-snaps)

	later := testutil.NewCgroup(t, pod.Path, "later")
	second := spawnInCgroup(t, ns, later, nil, "sleep", "infinity")
	waitApp(t, src, []int{second.pid}, "a container started after Start")
	signalProc(t, second, unix.SIGKILL)
	waitApp(t, src, nil, "the later container emptied")
	var exits []int
	for _, ex := range src.Exits() {
		exits = append(exits, ex.PID)
		if ex.Known {
			t.Errorf("exit of %d known (%s): inferred from a snapshot, it has no status", ex.PID, ex.Status)
		}
	}
	if want := sortedPIDs(app, second); !slices.Equal(exits, want) {
		t.Errorf("exits %v, want %v", exits, want)
	}
}

// Where the pod's cgroups cannot be watched, Start attaches fork, exec and
// exit as without WithPodCgroup, and Following says why.
func TestCgroupEventsFallback(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	ns := testutil.NewNetNS(t)
	notCgroup := t.TempDir()
	src, _, err := Open(ns.Inode, Rules{ProxyUID: istioUID, NoPauseRule: true}, ModeEBPF, WithDormant(), WithPodCgroup(notCgroup, filepath.Join(notCgroup, "own")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if err := src.Start(); err != nil {
		t.Fatal(err)
	}
	via, why := src.Following()
	t.Logf("following: %s (%s)", via, why)
	if via != ViaSchedTracepoints || !strings.Contains(why, notCgroup) {
		t.Errorf("following %s (%s), want %s saying why %s is not watched", via, why, ViaSchedTracepoints, notCgroup)
	}
	if !src.(*ebpfSource).probe.Attached() {
		t.Error("fork, exec and exit not attached")
	}
	runSource(t, src)
	app, _ := spawnDetached(t, ns, -1, "sleep", "infinity")
	waitApp(t, src, []int{app.pid}, "started")
}

// spawnInCgroup starts argv as spawnDetached does (env to the detach
// helper), then moves it into cgroup cg (its cgroup.procs), as a runtime
// moves a container's first process: it arrives there the app's, out of
// the test's process tree.
func spawnInCgroup(t *testing.T, ns *testutil.NetNS, cg testutil.Cgroup, env []string, argv ...string) *testProc {
	t.Helper()
	p, _ := spawnDetachedEnv(t, ns, -1, env, argv...)
	if err := os.WriteFile(filepath.Join(cg.Path, "cgroup.procs"), []byte(strconv.Itoa(p.pid)), 0); err != nil {
		t.Fatalf("move %d into %s: %v", p.pid, cg.Path, err)
	}
	return p
}

// tracingLinks lists the raw_tracepoint and tracing links this process
// holds (its /proc/self/fdinfo): the programs that run for events of the
// whole node.
func tracingLinks(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ent := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", ent.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "link_type:"); ok {
				if v = strings.TrimSpace(v); v == "raw_tracepoint" || v == "tracing" {
					out = append(out, ent.Name()+":"+v)
				}
			}
		}
	}
	return out
}
