package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/draind/draind/e2e/kubelet/internal/node"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/probes"
)

// hostCgroupMount is where the pod mounts the node's /sys/fs/cgroup for
// draind's --cgroup-root (docs/kubernetes.md, "Costing other pods nothing
// while draining").
const hostCgroupMount = "/host/cgroup"

// The classic sidecar under load with draind run --cgroup-root, as
// docs/kubernetes.md documents it (a read-only hostPath of /sys/fs/cgroup,
// NET_ADMIN added), under the real layout: the kubelet's pod cgroup, the
// runtime's container cgroups below it (the pause sandbox a sibling of
// draind's and the app's), each container in a cgroup namespace of its
// own. draind must find the kubelet's pod cgroup, follow the pod's sockets
// from it while draining (scope pod-cgroup on >= 6.12), and hold the proxy
// for the request in flight at the termination.
func TestPodCgroupUnderKubelet(t *testing.T) {
	requireNode(t)
	if !node.UnifiedOnly() {
		t.Skip("no cgroup v2: the kubelet runs cgroup v1 here (/sys/fs/cgroup is not a cgroup2 mount); `make e2e-kubelet-vm` runs it on cgroup v2")
	}
	const name = "podcgroup"
	sc := nonRootEBPF()
	sc.Capabilities.Add = append(sc.Capabilities.Add, "NET_ADMIN")
	pd := startPod(t, "classic.yaml", podParams{
		Name: name, AppArgs: gracefulAppArgs(), SecurityContext: sc, HostCgroup: hostCgroupMount,
		// Room for the long requests below: with 30 s, draind's gate
		// deadline (19.5 s) would come before they end when the kubelet
		// SIGTERMs soon after the removal.
		Grace:         60,
		DraindCommand: defaultDraindCommand("--cgroup-root", hostCgroupMount),
	})

	// Where the kubelet and the runtime put draind, seen from the node.
	uid := pd.sandboxUID(t)
	px := pd.container(pd.proxyName())
	if px == nil {
		t.Fatal("draind's container not seen")
	}
	pid := containerPID(t, pd, px.id)
	hostOwn := procCgroup(t, pid)
	hostPod := filepath.Dir(hostOwn)
	t.Logf("%s: pod uid %s; draind's cgroup on the node %s (%s cgroup namespace); the pod cgroup's children: %v",
		name, uid, hostOwn, cgroupNamespace(pid), childCgroups(hostPod))

	logs := pd.draindLog(-1)
	pc := findLog(logs, logevent.PodCgroup)
	if pc == nil {
		pd.dumpLogs()
		t.Fatalf("draind logged no %s line at start", logevent.PodCgroup)
	}
	podPath, ownPath := fmt.Sprint(pc["pod"]), fmt.Sprint(pc["own"])
	t.Logf("%s: draind's start: pod %s, own %s", name, podPath, ownPath)
	report.add("scenario", name+": pod cgroup", fmt.Sprintf("pod=%s own=%s", podPath, ownPath))
	// The kubelet names the pod's cgroup after its uid, with dashes
	// (cgroupfs) or underscores (systemd's slices).
	if !strings.Contains(podPath, "pod"+uid) && !strings.Contains(podPath, "pod"+strings.ReplaceAll(uid, "-", "_")) {
		t.Errorf("draind's pod cgroup %s does not name the pod (uid %s)", podPath, uid)
	}
	if want := filepath.Join(hostCgroupMount, hostPod); podPath != want {
		t.Errorf("draind's pod cgroup %s, want %s (the parent of its cgroup on the node, %s)", podPath, want, hostOwn)
	}
	if want := filepath.Join(hostCgroupMount, hostOwn); ownPath != want {
		t.Errorf("draind's own cgroup %s, want %s", ownPath, want)
	}

	// The requests must still be in flight when the kubelet gets to the
	// SIGTERM: under emulation it did so 3.7 to 8.1 s after the manifest's
	// removal, often past the other scenarios' 7 s requests (started 1.5 s
	// before).
	o := terminateUnderLoadFor(t, pd, 7*time.Second+scaled(3*time.Second))
	o.log(t, name)
	logs = pd.draindLog(-1)
	scope, reason := "", ""
	if r := findLog(logs, logevent.TCPTracking); r != nil {
		scope, reason = fmt.Sprint(r["scope"]), fmt.Sprint(r["reason"])
		t.Logf("%s: at the drain trigger: tcp tracking scope %s (%s)", name, scope, reason)
	}
	draining := logTime(findLogWith(logs, logevent.Phase, "phase", "draining"))
	stopping := logTime(findLogWith(logs, logevent.Phase, "phase", "stopping"))
	var lastEnd time.Time
	for _, e := range o.longEnds {
		if e.After(lastEnd) {
			lastEnd = e
		}
	}
	t.Logf("%s: from the removal: draind's drain trigger %s, the in-flight requests ended %s, draind asked the proxy to quit %s (%s after the last request ended), the proxy exited %s",
		name, o.rel(draining), o.rel(lastEnd), o.rel(stopping), fmtDur(stopping.Sub(lastEnd)), o.rel(o.proxyExit))
	report.add("scenario", name+": tracking", fmt.Sprintf("scope=%s reason=%q; drain trigger %s, last in-flight request ended %s, proxy asked to quit %s (%s after)",
		scope, reason, o.rel(draining), o.rel(lastEnd), o.rel(stopping), fmtDur(stopping.Sub(lastEnd))))

	o.checkProtected(t)
	if o.trigger != "signal" {
		t.Errorf("drain trigger %q, want signal", o.trigger)
	}
	if major, minor := kernelRelease(t); major > 6 || major == 6 && minor >= 12 {
		if scope != string(probes.ScopePodCgroup) {
			t.Errorf("tcp tracking scope %q (%s), want %s on %d.%d", scope, reason, probes.ScopePodCgroup, major, minor)
		}
	} else if scope == "" {
		t.Errorf("draind logged no %s line at the drain trigger", logevent.TCPTracking)
	}
	if len(o.longEnds) == 0 || draining.IsZero() || !lastEnd.After(draining) {
		t.Errorf("the requests (%d) ended at %s, draind's drain trigger at %s: want them in flight at the trigger", len(o.longEnds), o.rel(lastEnd), o.rel(draining))
	}
	if stopping.IsZero() || stopping.Before(lastEnd) {
		t.Errorf("draind asked the proxy to quit at %s, the in-flight requests (%d) ended at %s: want after", o.rel(stopping), len(o.longEnds), o.rel(lastEnd))
	}
}

// sandboxUID is the pod's uid as the kubelet gave it to the runtime.
func (pd *pod) sandboxUID(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sbs, err := pd.n.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.name": pd.full},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil || len(sbs.Items) == 0 {
		t.Fatalf("pod %s: no ready sandbox: %v", pd.full, err)
	}
	return sbs.Items[0].GetMetadata().GetUid()
}

// procCgroup is process pid's cgroup v2 path on the node (/proc/PID/cgroup,
// read from the node's cgroup namespace).
func procCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	t.Fatalf("/proc/%d/cgroup has no cgroup v2 line: %q", pid, b)
	return ""
}

// cgroupNamespace says whether process pid has a cgroup namespace of its
// own (where /proc/self/cgroup reads "0::/" and draind must search the
// mount for its pid) or the node's.
func cgroupNamespace(pid int) string {
	own, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", pid))
	node, err2 := os.Readlink("/proc/self/ns/cgroup")
	switch {
	case err1 != nil || err2 != nil:
		return "unknown"
	case own == node:
		return "the node's"
	}
	return "its own"
}

// childCgroups lists the cgroups below dir (a path on the node's
// hierarchy) with the pids each holds.
func childCgroups(dir string) []string {
	ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", dir))
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		procs, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", dir, e.Name(), "cgroup.procs"))
		out = append(out, fmt.Sprintf("%s (pids %s)", e.Name(), strings.Join(strings.Fields(string(procs)), ",")))
	}
	slices.Sort(out)
	return out
}

// kernelRelease is the running kernel's major and minor version.
func kernelRelease(t *testing.T) (major, minor int) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.SplitN(strings.TrimSpace(string(b)), ".", 3)
	if len(f) < 2 {
		t.Fatalf("kernel release %q", b)
	}
	major, _ = strconv.Atoi(f[0])
	minor, _ = strconv.Atoi(f[1])
	return major, minor
}
