package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/testenv/testutil"
)

// rootedRole is a container as the node view meets one: a process in
// mount and PID namespaces of its own whose root is dir (chroot), its
// working directory that root's "/", until stdin closes.
func rootedRole(dir string) int {
	if err := unix.Chroot(dir); err != nil {
		fmt.Fprintln(os.Stderr, "rooted: chroot:", err)
		return 1
	}
	if err := unix.Chdir("/"); err != nil {
		fmt.Fprintln(os.Stderr, "rooted: chdir:", err)
		return 1
	}
	os.Stdout.WriteString("rooted\n")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// tenantPod is a pod of the fake runtime: its sandbox and its one
// container, a process (rootedRole) in a network namespace of its own
// whose argv, as the runtime reports it, is Istio's template's.
type tenantPod struct {
	name string
	root string // the container's root, as this process sees it
	ns   *testutil.NetNS
	pid  int
}

// startTenantPod makes a pod whose container's root is built by fill
// (given the root's path, as this process sees it).
func startTenantPod(t *testing.T, name string, fill func(root string)) *tenantPod {
	t.Helper()
	p := &tenantPod{name: name, root: t.TempDir(), ns: testutil.NewNetNS(t)}
	must(t, os.MkdirAll(filepath.Join(p.root, "etc/istio/pod"), 0o755))
	fill(p.root)
	cmd := exec.Command(testutil.SelfCopy(t), "__rooted", p.root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	p.ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "rooted\n" {
		t.Fatalf("pod %s: container: %q, %v", name, line, err)
	}
	p.pid = cmd.Process.Pid
	return p
}

// serveState serves GET /debug/state with phase inside the pod, on addr.
func (p *tenantPod) serveState(t *testing.T, addr, phase string) {
	t.Helper()
	ln := p.ns.Listen(t, "tcp4", addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(agent.PodState{Version: agent.PodStateVersion, Phase: phase})
	})}
	go srv.Serve(ln) // ends with Close
	t.Cleanup(func() { srv.Close() })
}

// tenantRuntime is a CRI runtime that lists the pods given.
type tenantRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	pods []*tenantPod
}

func (f *tenantRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeVersion: "1"}, nil
}

func (f *tenantRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	var items []*runtimeapi.PodSandbox
	for _, p := range f.pods {
		items = append(items, &runtimeapi.PodSandbox{Id: p.name, Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "tenant", Name: p.name},
			State: runtimeapi.PodSandboxState_SANDBOX_READY})
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func (f *tenantRuntime) pod(id string) *tenantPod {
	for _, p := range f.pods {
		if p.name == id {
			return p
		}
	}
	return nil
}

func (f *tenantRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: r.GetPodSandboxId()},
		Info: map[string]string{"info": fmt.Sprintf(`{"pid":%d}`, f.pod(r.GetPodSandboxId()).pid)}}, nil
}

func (f *tenantRuntime) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	id := r.GetFilter().GetPodSandboxId()
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: id, PodSandboxId: id,
		Metadata: &runtimeapi.ContainerMetadata{Name: "istio-proxy"}, State: runtimeapi.ContainerState_CONTAINER_RUNNING}}}, nil
}

func (f *tenantRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	info := fmt.Sprintf(`{"pid":%d,"runtimeSpec":{"process":{"args":["/usr/local/bin/draind","run","--","/usr/local/bin/pilot-agent","proxy","sidecar"],"env":["PROXY_CONFIG={}"]}}}`,
		f.pod(r.GetContainerId()).pid)
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: r.GetContainerId()}, Info: map[string]string{"info": info}}, nil
}

// serveRuntime serves the pods on a CRI socket and returns its path.
func serveRuntime(t *testing.T, pods ...*tenantPod) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, &tenantRuntime{pods: pods})
	go srv.Serve(ln) // ends with Stop
	t.Cleanup(srv.Stop)
	return sock
}

// nodeViewRun is one `draind pods` as its own process: its output, exit
// code, wall time and peak RSS. hangAfter is a hang detector, not a
// measure: a run still going then is killed and fails the test.
type nodeViewRun struct {
	out    []byte
	code   int
	took   time.Duration
	maxRSS int64 // bytes
}

func startNodeView(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(testutil.SelfCopy(t), append([]string{"__draind", "pods"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

func waitNodeView(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer, since time.Time, hangAfter time.Duration) nodeViewRun {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangAfter):
		cmd.Process.Kill()
		<-done
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		t.Fatalf("draind pods still running after %s (peak RSS %d MB): killed", hangAfter, ru.Maxrss>>10)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return nodeViewRun{out: out.Bytes(), code: cmd.ProcessState.ExitCode(), took: time.Since(since), maxRSS: ru.Maxrss << 10}
}

// TestNodeViewTenantFiles is `draind pods` against pods whose Istio
// annotations file (read by the node view, as root, to place draind's
// status port beside pilot-agent) is what a hostile tenant makes it: a
// FIFO nobody writes, a link to /dev/urandom (a device in the
// container, as every container has), a 100 MB file, and a link out of
// the container to a file of the node. The view returns within its
// --timeout, each of the first three marked with why, none costing
// memory; the link out of the container is resolved inside it (the
// node's file would move the port to 15023). A pod with the kubelet's
// own layout (..data links) is read as it was.
func TestNodeViewTenantFiles(t *testing.T) {
	testutil.RequireRoot(t)
	nodeFile := filepath.Join(t.TempDir(), "annotations")
	must(t, os.WriteFile(nodeFile, []byte("status.sidecar.istio.io/port=\"15022\"\n"), 0o644))
	annos := func(root string) string { return filepath.Join(root, "etc/istio/pod/annotations") }
	fifo := startTenantPod(t, "fifo", func(root string) { must(t, unix.Mkfifo(annos(root), 0o644)) })
	urandom := startTenantPod(t, "urandom", func(root string) {
		must(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		must(t, unix.Mknod(filepath.Join(root, "dev/urandom"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 9))))
		must(t, os.Symlink("/dev/urandom", annos(root)))
	})
	big := startTenantPod(t, "big", func(root string) {
		must(t, os.WriteFile(annos(root), nil, 0o644))
		must(t, os.Truncate(annos(root), 100<<20))
	})
	escape := startTenantPod(t, "escape", func(root string) { must(t, os.Symlink(nodeFile, annos(root))) })
	escape.serveState(t, "127.0.0.1:15022", "ready")
	escape.serveState(t, "127.0.0.1:15023", "escaped")
	downward := startTenantPod(t, "downward", func(root string) {
		dir := filepath.Join(root, "etc/istio/pod")
		must(t, os.Mkdir(filepath.Join(dir, "..2026_01_01"), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "..2026_01_01/annotations"), []byte("status.sidecar.istio.io/port=\"15022\"\n"), 0o644))
		must(t, os.Symlink("..2026_01_01", filepath.Join(dir, "..data")))
		must(t, os.Symlink("..data/annotations", annos(root)))
	})
	downward.serveState(t, "127.0.0.1:15023", "ready")
	sock := serveRuntime(t, fifo, urandom, big, escape, downward)

	t0 := time.Now()
	cmd, out := startNodeView(t, "-o", "json", "--timeout", "1s", "--cri-endpoint", "unix://"+sock)
	run := waitNodeView(t, cmd, out, t0, 20*time.Second)
	t.Logf("draind pods: exit %d in %s, peak RSS %.1f MB", run.code, run.took.Round(time.Millisecond), float64(run.maxRSS)/(1<<20))
	if run.code != 0 {
		t.Fatalf("exit %d: %s", run.code, run.out)
	}
	var v nodeView
	if err := json.Unmarshal(run.out, &v); err != nil {
		t.Fatalf("%v: %s", err, run.out)
	}
	rows := map[string]podRow{}
	for _, r := range v.Pods {
		rows[r.Name] = r
	}
	for name, want := range map[string]string{"fifo": "not a regular file (a FIFO)", "urandom": "not a regular file (a character device)", "big": "larger than the limit"} {
		if r := rows[name]; !strings.Contains(r.Error, want) || r.Draind == nil || r.Draind.Container != "istio-proxy" {
			t.Errorf("%s: %+v (draind %+v), want marked: %s", name, r, r.Draind, want)
		}
	}
	if r := rows["escape"]; r.Draind == nil || r.Draind.StatusAddr != "127.0.0.1:15022" || r.State == nil || r.State.Phase != "ready" {
		t.Errorf("escape: %+v (draind %+v, state %+v), want the link resolved inside the container: none there, 127.0.0.1:15022 ready", r, r.Draind, r.State)
	}
	if r := rows["downward"]; r.Draind == nil || r.Draind.StatusAddr != "127.0.0.1:15023" || r.State == nil || r.State.Phase != "ready" {
		t.Errorf("downward: %+v (draind %+v, state %+v), want its annotation read: 127.0.0.1:15023 ready", r, r.Draind, r.State)
	}
	if run.maxRSS > 64<<20 && !raceEnabled {
		t.Errorf("peak RSS %d MB, want under 64 MB", run.maxRSS>>20)
	}
}

// TestNodeViewSignal: a SIGTERM while a probe is stuck (a draind that
// accepts and never answers, within a 60 s --timeout; a FIFO for an
// annotations file) ends `draind pods -w` at once, exit 0.
func TestNodeViewSignal(t *testing.T) {
	testutil.RequireRoot(t)
	fifo := startTenantPod(t, "fifo", func(root string) {
		must(t, unix.Mkfifo(filepath.Join(root, "etc/istio/pod/annotations"), 0o644))
	})
	stuck := startTenantPod(t, "stuck", func(string) {})
	ln := stuck.ns.Listen(t, "tcp4", "127.0.0.1:15022")
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // held open, never answered
		}
	}()
	sock := serveRuntime(t, fifo, stuck)
	cmd, out := startNodeView(t, "-w", "1s", "--timeout", "60s", "--cri-endpoint", "unix://"+sock)
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the stuck pod's draind was never called")
	}
	t0 := time.Now()
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	run := waitNodeView(t, cmd, out, t0, 20*time.Second)
	t.Logf("draind pods -w: exit %d %s after SIGTERM, the stuck probe's timeout 60s", run.code, run.took.Round(time.Millisecond))
	if run.code != 0 {
		t.Errorf("exit %d: %s", run.code, run.out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startKubelet starts a process named kubelet (argv[0]) naming sock as
// its runtime's endpoint: in this process's namespaces, or (tenant) in
// PID and mount namespaces of its own, as a container's process is.
func startKubelet(t *testing.T, tenant bool, sock string) int {
	t.Helper()
	cmd := exec.Command(testutil.SelfCopy(t))
	cmd.Args = []string{filepath.Join(t.TempDir(), "kubelet"), "__rooted", "/", "--container-runtime-endpoint=unix://" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if tenant {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "rooted\n" {
		t.Fatalf("kubelet: %q, %v", line, err)
	}
	return cmd.Process.Pid
}

// otherKubelets are the processes named kubelet but those given.
func otherKubelets(ours ...int) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		argv0, _, _ := bytes.Cut(b, []byte{0})
		if err != nil || filepath.Base(string(argv0)) != "kubelet" {
			continue
		}
		if pid, _ := strconv.Atoi(e.Name()); !slices.Contains(ours, pid) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestNodeViewTenantKubelet: a tenant's process named kubelet, in PID
// and mount namespaces of its own and started first (the lowest PID, the
// one chosen before), naming a runtime the tenant serves, is not
// believed: `draind pods` asks the node's kubelet's runtime, and its
// header names that kubelet and the one it did not trust.
func TestNodeViewTenantKubelet(t *testing.T) {
	testutil.RequireRoot(t)
	planted := startTenantPod(t, "planted", func(string) {})
	tenantSock := serveRuntime(t, planted)
	tenant := startKubelet(t, true, tenantSock)
	nodeSock := serveRuntime(t)
	node := startKubelet(t, false, nodeSock)
	if others := otherKubelets(tenant, node); len(others) > 0 {
		t.Skipf("other processes named kubelet run on this machine (pids %s): the view would refuse to choose", strings.Join(others, ", "))
	}
	for _, format := range []string{"table", "json"} {
		cmd, out := startNodeView(t, "-o", format, "--timeout", "1s")
		run := waitNodeView(t, cmd, out, time.Now(), 20*time.Second)
		if run.code != 0 {
			t.Fatalf("-o %s: exit %d: %s", format, run.code, run.out)
		}
		t.Logf("-o %s:\n%s", format, run.out)
		if format == "json" {
			var v nodeView
			if err := json.Unmarshal(run.out, &v); err != nil {
				t.Fatal(err)
			}
			if v.CRI.KubeletPID != node || v.CRI.Socket != nodeSock || len(v.Pods) != 0 {
				t.Errorf("cri %+v, %d pods; want kubelet %d's socket %s, no pod", v.CRI, len(v.Pods), node, nodeSock)
			}
			continue
		}
		header, _, _ := strings.Cut(string(run.out), "\n")
		if !strings.Contains(header, fmt.Sprintf("kubelet pid %d (", node)) || !strings.Contains(header, fmt.Sprintf("kubelet pid %d not trusted: another PID namespace", tenant)) ||
			strings.Contains(string(run.out), "planted") {
			t.Errorf("the header does not name kubelet %d as the one chosen and %d as not trusted, or the tenant's pod is listed:\n%s", node, tenant, run.out)
		}
	}
}
