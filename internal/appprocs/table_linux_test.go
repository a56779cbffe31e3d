package appprocs

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/draind/draind/internal/probes"
)

// TestTableMerge feeds a table snapshots and events as the eBPF backend
// decodes them (no kernel): what a complete or an incomplete snapshot does
// to what events taught, and the exits it records.
func TestTableMerge(t *testing.T) {
	// The shim (pid 50, outside the namespace) started the app's main
	// process 100, which forked 101.
	main := Process{PID: 100, PPID: 50, UID: 1000, Comm: "app", StartTime: 1000}
	kid := Process{PID: 101, PPID: 100, UID: 1000, Comm: "kid", StartTime: 1100}
	other := Process{PID: 200, PPID: 50, UID: 1000, Comm: "other", StartTime: 2000}
	reused := Process{PID: 200, PPID: 50, UID: 1000, Comm: "reused", StartTime: 3000}
	extra := Process{PID: 201, PPID: 50, UID: 1000, Comm: "extra", StartTime: 2100}
	// gone ran and exited between two looks: only its exit event tells.
	gone := Process{PID: 300, PPID: 50, UID: 1000, Comm: "gone", StartTime: 2200}
	snap := func(ps ...Process) map[int]Process {
		m := make(map[int]Process)
		for _, p := range ps {
			m[p.PID] = p
		}
		return m
	}
	event := func(kind probes.ProcEventKind, p Process, ppid int, status ExitStatus) *probes.ProcEvent {
		task := probes.ProcTask{PID: p.PID, PPID: ppid, UID: p.UID, Comm: p.Comm, StartTime: p.StartTime}
		return &probes.ProcEvent{Kind: kind, Task: task, Status: uint32(status)}
	}
	// exits renders AppExits as "PID:status:outside" ("?" for inferred).
	exits := func(tr *table) string {
		var out []string
		for _, e := range tr.Exits() {
			st := "?"
			if e.Known {
				st = e.Status.String()
			}
			out = append(out, fmt.Sprintf("%d:%s:%v", e.PID, st, e.ParentOutside))
		}
		return strings.Join(out, ",")
	}

	tr := newTable(Rules{ProxyUID: istioUID, NoPauseRule: true})
	steps := []struct {
		name    string
		do      func()
		app     []int
		exits   string
		changed bool
	}{
		{"complete snapshot", func() { tr.installLocked(snap(main, kid), nil, true) },
			[]int{100, 101}, "", true},
		{"exit event", func() { applyEvent(tr, event(probes.ProcExit, kid, 100, 5<<8)) },
			[]int{100}, "101:exit 5:false", true},
		{"complete snapshot without main: inferred exit", func() { tr.installLocked(snap(), nil, true) },
			[]int{}, "101:exit 5:false,100:?:true", true},
		{"main's exit event, read after: its status", func() { applyEvent(tr, event(probes.ProcExit, main, 50, 7<<8)) },
			[]int{}, "101:exit 5:false,100:exit 7:true", true},
		{"fork event", func() { applyEvent(tr, event(probes.ProcFork, other, 50, 0)) },
			[]int{200}, "101:exit 5:false,100:exit 7:true", true},
		{"incomplete snapshot: nothing forgotten", func() { tr.installLocked(snap(extra), nil, false) },
			[]int{200, 201}, "101:exit 5:false,100:exit 7:true", true},
		{"incomplete snapshot: a reused pid ends the old process", func() { tr.installLocked(snap(reused), nil, false) },
			[]int{200, 201}, "101:exit 5:false,100:exit 7:true,200:?:true", true},
		{"exit event of a process whose exit is recorded: nothing", func() { applyEvent(tr, event(probes.ProcExit, kid, 100, 0)) },
			[]int{200, 201}, "101:exit 5:false,100:exit 7:true,200:?:true", false},
		{"exit event of a process never seen: recorded with its status", func() { applyEvent(tr, event(probes.ProcExit, gone, 50, 3<<8)) },
			[]int{200, 201}, "101:exit 5:false,100:exit 7:true,200:?:true,300:exit 3:true", true},
		{"the same exit event again: nothing", func() { applyEvent(tr, event(probes.ProcExit, gone, 50, 3<<8)) },
			[]int{200, 201}, "101:exit 5:false,100:exit 7:true,200:?:true,300:exit 3:true", false},
	}
	for _, st := range steps {
		tr.mu.Lock()
		st.do()
		changed := tr.recomputeLocked()
		tr.mu.Unlock()
		if got := appPIDs(tr); !slices.Equal(got, st.app) {
			t.Errorf("%s: app %v, want %v", st.name, got, st.app)
		}
		if got := exits(tr); got != st.exits {
			t.Errorf("%s: exits %q, want %q", st.name, got, st.exits)
		}
		if changed != st.changed {
			t.Errorf("%s: changed %v, want %v", st.name, changed, st.changed)
		}
	}
	if p := tr.procs[200]; p.Comm != "reused" {
		t.Errorf("pid 200 is %+v, want the reused one", p)
	}
}

// TestTableExitAlone: a process the table never had is known by its exit
// event alone, with its status: a Job's app that ran between two looks
// leaves its main exit. The exit of a process of draind's container (a
// hook) never counts, and neither does a process taken for the app for a
// moment (exec'd into the proxy's container: it enters the pod's network
// namespace before its mount namespace).
func TestTableExitAlone(t *testing.T) {
	const selfMnt, appMnt, hostMnt = 7, 8, 9
	proxy := Process{PID: 20, PPID: 10, UID: istioUID, Comm: "envoy", StartTime: 200, MountNS: selfMnt}
	hook := Process{PID: 30, PPID: 5, UID: 0, Comm: "sh", StartTime: 300, MountNS: selfMnt}
	app := Process{PID: 40, PPID: 5, UID: 1000, Comm: "job", StartTime: 400, MountNS: appMnt}
	entering := Process{PID: 50, PPID: 5, UID: 0, Comm: "nsenter", StartTime: 500, MountNS: hostMnt}
	exit := func(p Process, status ExitStatus) *probes.ProcEvent {
		return &probes.ProcEvent{Kind: probes.ProcExit, Status: uint32(status),
			Task: probes.ProcTask{PID: p.PID, PPID: p.PPID, UID: p.UID, Comm: p.Comm, StartTime: p.StartTime, MountNS: p.MountNS}}
	}
	for _, tc := range []struct {
		name string
		do   func(tr *table)
		main string // the app's last main exit, "" for none
	}{
		{"nothing", func(tr *table) {}, ""},
		{"a hook of the proxy's container exits", func(tr *table) { applyEvent(tr, exit(hook, 0)) }, ""},
		{"the app's exit event alone", func(tr *table) { applyEvent(tr, exit(app, 0)) }, "exit 0"},
		{"the app's exit event alone, a failure", func(tr *table) { applyEvent(tr, exit(app, 2<<8)) }, "exit 2"},
		{"a process entering the proxy's container", func(tr *table) {
			applyEvent(tr, &probes.ProcEvent{Kind: probes.ProcFork, Task: probes.ProcTask{PID: 50, PPID: 5, StartTime: 500, MountNS: hostMnt}})
			tr.recomputeLocked()
			applyEvent(tr, &probes.ProcEvent{Kind: probes.ProcExec, Task: probes.ProcTask{PID: 50, PPID: 5, Comm: "sh", StartTime: 500, MountNS: selfMnt}})
			tr.recomputeLocked()
			entering.MountNS = selfMnt
			applyEvent(tr, exit(entering, 0))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTable(Rules{ProxyUID: istioUID, SelfPIDs: []int{10}, SelfMountNS: selfMnt, NoPauseRule: true})
			tr.mu.Lock()
			tr.installLocked(map[int]Process{20: proxy}, nil, true)
			tr.recomputeLocked()
			tc.do(tr)
			tr.recomputeLocked()
			tr.mu.Unlock()
			main := ""
			for _, e := range tr.Exits() {
				if e.ParentOutside && e.Known {
					main = e.Status.String()
				}
			}
			if main != tc.main {
				t.Errorf("main exit %q, want %q (exits %+v)", main, tc.main, tr.Exits())
			}
		})
	}
}

// TestExitRetention: the last ExitHistory exits are kept, and the last
// MainExitHistory main processes' whatever came after them.
func TestExitRetention(t *testing.T) {
	tr := newTable(Rules{})
	const mains, others = 100, 300
	for i := range mains + others {
		tr.exitSeq++
		tr.exits = append(tr.exits, Exit{Seq: tr.exitSeq, ParentOutside: i < mains})
		tr.trimExitsLocked()
	}
	got := tr.Exits()
	if len(got) != ExitHistory+MainExitHistory {
		t.Fatalf("%d exits kept, want %d", len(got), ExitHistory+MainExitHistory)
	}
	if first, last := got[0].Seq, got[len(got)-1].Seq; first != mains-MainExitHistory+1 || last != mains+others {
		t.Errorf("kept seq %d..%d, want %d..%d", first, last, mains-MainExitHistory+1, mains+others)
	}
	if !slices.IsSortedFunc(got, func(a, b Exit) int { return int(a.Seq - b.Seq) }) {
		t.Error("exits out of order")
	}
}
