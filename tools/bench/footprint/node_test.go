package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/tools/bench/benchns"
)

// The workloads run for real (loopback sockets, fork+exec of /bin/true)
// and stop at their bound, whichever comes first.
func TestNodeLoad(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{loadTCP, loadFork} {
		t.Run(kind, func(t *testing.T) {
			for _, c := range []struct {
				args    []string
				wantOps string
			}{
				{[]string{"--for", "200ms", "--max", "50"}, "50"},      // the count bound
				{[]string{"--for", "100ms", "--max", "100000000"}, ""}, // the time bound
			} {
				var out bytes.Buffer
				cmd := exec.Command(self, append([]string{"nodeload", kind}, c.args...)...)
				cmd.Stdout, cmd.Stderr = &out, &out
				start := time.Now()
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v: %v: %s", c.args, err, out.String())
				}
				f := strings.Fields(out.String())
				if len(f) != 2 || (c.wantOps != "" && f[0] != c.wantOps) || f[0] == "0" {
					t.Errorf("%v: output %q, want %s operations", c.args, out.String(), c.wantOps)
				}
				if took := time.Since(start); took > 30*time.Second {
					t.Errorf("%v: took %s", c.args, took)
				}
			}
		})
	}
}

func TestNodeFlags(t *testing.T) {
	if err := nodeLoad([]string{"tcp", "--for", "1h"}); err == nil || !strings.Contains(err.Error(), "--for 1h0m0s") {
		t.Errorf("nodeload --for 1h: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("footprint node checks for root before its flags")
	}
	for _, c := range []struct{ args, want string }{
		{"--pods 40,10", "--pods 40,10: want ascending"},
		{"--pods 0", "--pods 0: want ascending"},
		{"--sockdiag-pods x", `--sockdiag-pods: "x" is not a count`},
		{"--pod-cgroup-pods 110,10", "--pod-cgroup-pods 110,10: want ascending"},
		{"--load-for 0s", "--load-for 0s"},
		{"--repeat 0", "--repeat in [1, 20]"},
	} {
		err := run(t.Context(), append([]string{"node"}, strings.Fields(c.args)...), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.args, err, c.want)
		}
	}
}

// The hook for drain trigger → tracking live: the field on a JSON line
// after the SIGTERM, as a zap duration or a number of milliseconds.
func TestTrackingLiveField(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
	}{
		{`{"msg":"tracking","tracking_live":"12.5ms"}`, 12500 * time.Microsecond},
		{`{"msg":"tracking","tracking_live_ms":3.25}`, 3250 * time.Microsecond},
		{`{"msg":"phase","phase":"draining"}`, -1},
	} {
		p := &nodePod{agent: &agentProc{lines: []line{
			{at: time.Second, text: `{"msg":"tracking","tracking_live":"99ms"}`}, // before the trigger
			{at: 3 * time.Second, text: c.line},
		}}, sigAt: 2 * time.Second}
		if got := p.trackingLive(); got != c.want {
			t.Errorf("%s: %v, want %v", c.line, got, c.want)
		}
	}
}

// The pod-cgroup pods' set-up, on a real cgroup v2 hierarchy: the one
// mounted here (if any) and one mounted by the benchmark itself; a
// process started into the proxy container with a mount namespace of its
// own (as draind is) sees the mount at the same path and its own cgroup
// in it; the namespace's processes, and so their sockets, are the app
// container's; a socket made from outside is seen; everything is gone
// after close, a process left in the pod's cgroup included.
func TestPodCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: cgroups and network namespaces")
	}
	if fs, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(fs), "\tcgroup2\n") {
		t.Skip("no cgroup2 in this kernel")
	}
	t.Run("own mount", func(t *testing.T) {
		r := &cgroupRoot{}
		if err := r.mountOwn(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		if err := r.makeBase(); err != nil {
			t.Fatal(errors.Join(err, r.close()))
		}
		testPodCgroup(t, r)
	})
	t.Run("found or own", func(t *testing.T) {
		r, err := openCgroupRoot(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		testPodCgroup(t, r)
	})
}

func testPodCgroup(t *testing.T, r *cgroupRoot) {
	mount, own, base := r.mount, r.ownMount, r.base
	closed := false
	defer func() {
		if !closed {
			r.close()
		}
	}()
	pc, err := r.newPod()
	if err != nil {
		t.Fatal(err)
	}
	podDir := pc.dir
	defer pc.close()
	ns, err := benchns.NewInCgroup(int(pc.app.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := pc.checkIn(ns.Pid(), "app"); err != nil {
		t.Error(err)
	}
	if err := pc.checkIn(os.Getpid(), "proxy"); err == nil {
		t.Error("checkIn: the test process is not in the pod")
	}

	// As startPod starts draind: its own mount namespace (startAgent),
	// born in the proxy container.
	cmd := exec.Command("/bin/sh", "-c", `grep '^0::' /proc/self/cgroup; test -f "$1$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs" && echo visible; exec sleep 60`, "sh", mount)
	cmd.SysProcAttr = pc.proxyAttr()
	a, err := startAgent(ns, cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer a.stop()
	if err := waitLine(t.Context(), a, "visible", 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if a.firstLine("0::"+pc.rel+"/proxy") < 0 {
		t.Errorf("the process's cgroup, want %s/proxy:\n%s", pc.rel, a.output())
	}
	if err := pc.checkIn(a.cmd.Process.Pid, "proxy"); err != nil {
		t.Error(err)
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", a.cmd.Process.Pid))
	if err := errors.Join(err1, err2); err != nil || self == its {
		t.Errorf("the process's mount namespace %s, ours %s (%v): want one of its own", its, self, err)
	}

	// The in-flight request of a draining pod: both ends the app's.
	if err := ns.Fill(1); err != nil {
		t.Fatal(err)
	}
	d, err := ns.DialSockDiag()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := pc.waitOwnSockets(d, 5*time.Second); err != nil {
		t.Error(err)
	}
	// A listener of the test process's (outside the pod) is seen.
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	err = pc.waitOwnSockets(d, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("a listener outside the pod's cgroup: %v, want it named", err)
	}
	ln.Close()
	if err := pc.waitOwnSockets(d, 5*time.Second); err != nil {
		t.Error(err)
	}

	// close ends what is left in the pod's cgroup (the shell, the
	// namespace's processes) and removes it.
	if err := pc.close(); err != nil {
		t.Fatal(err)
	}
	if err := pc.close(); err != nil {
		t.Errorf("close twice: %v", err)
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Error("the proxy container's process is still running after close")
	}
	if _, err := os.Stat(podDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod cgroup after close: %v", err)
	}
	ns.Close()
	closed = true
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); err != nil {
		t.Errorf("close twice: %v", err)
	}
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the benchmark's cgroup after close: %v", err)
	}
	found, err := findCgroup2()
	if err != nil {
		t.Fatal(err)
	}
	if own && found == mount {
		t.Errorf("%s still mounted after close", mount)
	}
	if !own && found != mount {
		t.Errorf("found %q, used %q", found, mount)
	}
}

// The scope of draind's TCP tracking, from its line after the trigger.
func TestTCPScope(t *testing.T) {
	for _, c := range []struct {
		line, scope, reason string
	}{
		{`{"msg":"tcp tracking","scope":"pod-cgroup"}`, "pod-cgroup", ""},
		{`{"msg":"tcp tracking","scope":"node","reason":"socket 10.0.0.1:80 outside the pod's cgroup"}`, "node", "socket 10.0.0.1:80 outside the pod's cgroup"},
		{`{"msg":"tcp tracking"}`, "(no scope field)", ""},
		{`{"msg":"phase","phase":"draining"}`, "", ""},
	} {
		p := &nodePod{agent: &agentProc{lines: []line{
			{at: time.Second, text: `{"msg":"tcp tracking","scope":"before"}`}, // before the trigger
			{at: 3 * time.Second, text: c.line},
		}}, sigAt: 2 * time.Second}
		if scope, reason := p.tcpScope(); scope != c.scope || reason != c.reason {
			t.Errorf("%s: %q %q, want %q %q", c.line, scope, reason, c.scope, c.reason)
		}
	}
	if n, err := linkTypes(os.Getpid()); err != nil || len(n) != 0 {
		t.Errorf("the test's BPF links: %v, %v", n, err)
	}
}

// The draining pods' table: a count per scope, draind's reasons as one
// cell each however they are spelled.
func TestPrintDraining(t *testing.T) {
	b := &nodeBench{rows: []nodeRow{
		{label: "110 Ready (ebpf)"},
		{label: "100 Ready + 10 draining (ebpf, pod cgroup)", draining: 10,
			scopes:  map[string]int{podScopeCgroup: 7, "node": 2, "": 1},
			reasons: map[string]int{"kernel 6.6 | before 6.12": 2},
			links:   map[string]int{"cgroup": 7, "raw_tracepoint": 4}},
	}}
	var out bytes.Buffer
	b.printDraining(&out)
	want := "| 100 Ready + 10 draining (ebpf, pod cgroup) | 7 | 2 | 1 | kernel 6.6 \\| before 6.12 ×2 | cgroup ×7; raw_tracepoint ×4 |\n"
	if !strings.HasSuffix(out.String(), want) || strings.Contains(out.String(), "110 Ready (ebpf)") {
		t.Errorf("got\n%s\nwant it to end with\n%s", out.String(), want)
	}
}
