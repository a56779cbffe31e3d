package probes

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testenv/testutil"
)

// loadProcsForStats loads the procs object as OpenProcs does, with the
// verifier's statistics requested.
func loadProcsForStats(tb testing.TB, level ebpf.LogLevel) (*procsLoaded, time.Duration) {
	tb.Helper()
	spec, err := loadProcs()
	if err != nil {
		tb.Fatal(err)
	}
	if err := setProcsConstants(spec, 1, namespace.InitialPIDInode, MaxProcWalk); err != nil {
		tb.Fatal(err)
	}
	var objs procsLoaded
	t0 := time.Now()
	err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: level}})
	d := time.Since(t0)
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	return &objs, d
}

var verifierStatsRe = regexp.MustCompile(`processed (\d+) insns.*|verification time (\d+) usec`)

// TestReportProcsVerifierStats is a report, not a check: it loads the
// procs object and logs, per program, what the verifier did (instructions
// processed, verification time) for the kernel matrix (run with -v). It
// fails only if the object does not load.
func TestReportProcsVerifierStats(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	raiseMemlock()
	objs, d := loadProcsForStats(t, ebpf.LogLevelStats)
	defer objs.procsPrograms.Close()
	defer objs.procsMaps.Close()
	for name, p := range map[string]*ebpf.Program{
		"procs_iter": objs.ProcsIter,
		"procs_fork": objs.ProcsFork,
		"procs_exec": objs.ProcsExec,
		"procs_exit": objs.ProcsExit,
	} {
		stats := verifierStatsRe.FindAllString(p.VerifierLog, -1)
		t.Logf("%s: %s", name, strings.Join(stats, "; "))
	}
	t.Logf("load and verify (stats log): %v", d)
}

// BenchmarkProcsLoad is the cost of loading and verifying the procs object
// (no attach), the part of OpenProcs that grows with the programs.
func BenchmarkProcsLoad(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireBTF(b)
	raiseMemlock()
	for b.Loop() {
		objs, _ := loadProcsForStats(b, 0)
		objs.procsPrograms.Close()
		objs.procsMaps.Close()
	}
}

// BenchmarkProcsSnapshot is one snapshot (task iterator and walk) with
// 2000 more processes on the node than it had, in another namespace.
func BenchmarkProcsSnapshot(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireBTF(b)
	ns := testutil.NewNetNS(b)
	crowd := exec.Command("sh", "-c", "for i in $(seq 2000); do sleep 1000 & done; echo ready; wait")
	crowd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := crowd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := crowd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Kill(-crowd.Process.Pid, unix.SIGKILL); crowd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	// cap=1: the iterator alone (it visits every thread of the test's
	// PID namespace), as a base for the walk's cost.
	for _, walkCap := range []int{MaxProcWalk, 1} {
		b.Run(fmt.Sprintf("cap=%d", walkCap), func(b *testing.B) {
			p, err := OpenProcs(ns.Inode, ProcOptions{WalkCap: walkCap})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			var visited int
			for b.Loop() {
				snap, err := p.Snapshot()
				if err != nil {
					b.Fatal(err)
				}
				visited = snap.Walk.Visited
			}
			b.ReportMetric(float64(visited), "walked")
		})
	}
}
