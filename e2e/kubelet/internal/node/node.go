// Package node runs a private Kubernetes node on this machine for the e2e
// tests: containerd (CRI plugin) on its own socket and root, and a
// standalone kubelet running static pods from a manifest directory. It
// builds nothing: the kubelet binary and the image archives come from the
// caller. Close tears everything down; Sweep removes what an interrupted
// run left (by the paths and ids this package owns, never by name).
package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Node is a running containerd + kubelet pair.
type Node struct {
	cfg        Config
	containerd *exec.Cmd
	kubelet    *exec.Cmd
	conn       *grpc.ClientConn
	// Runtime and Images are CRI clients on containerd's socket.
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	// Phases records how long each start-up step took.
	Phases []Phase
}

// Phase is a timed step.
type Phase struct {
	Name string
	Took time.Duration
}

func (n *Node) phase(name string, start time.Time) {
	n.Phases = append(n.Phases, Phase{name, time.Since(start)})
	n.cfg.Logf("phase %-24s %s", name, time.Since(start).Round(time.Millisecond))
}

// Start sweeps what a previous run left, writes the configs, and starts
// containerd; call StartKubelet after importing the images.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	n := &Node{cfg: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	t0 := time.Now()
	if err := Sweep(cfg); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	n.phase("sweep", t0)
	for _, d := range []string{cfg.StateDir, cfg.manifestDir(), cfg.cniConfDir(), cfg.containerdRoot(), cfg.kubeletRoot(), cfg.podLogsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		filepath.Join(cfg.StateDir, "containerd.toml"):        cfg.containerdConfig(),
		filepath.Join(cfg.cniConfDir(), "10-draind.conflist"): cfg.cniConfig(),
		filepath.Join(cfg.StateDir, "kubelet.yaml"):           cfg.kubeletConfig(),
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return nil, err
		}
	}
	t0 = time.Now()
	n.containerd, err = StartDaemon(cfg, "containerd", "containerd", "--config", filepath.Join(cfg.StateDir, "containerd.toml"))
	if err != nil {
		return nil, err
	}
	if n.conn, err = grpc.NewClient("unix://"+cfg.socket(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	n.Runtime = runtimeapi.NewRuntimeServiceClient(n.conn)
	n.Images = runtimeapi.NewImageServiceClient(n.conn)
	if err := WaitFor(ctx, 30*time.Second, func() error {
		if n.containerd.ProcessState != nil {
			return errDead
		}
		st, err := n.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
		if err != nil {
			return err
		}
		for _, c := range st.GetStatus().GetConditions() {
			if c.Type == runtimeapi.RuntimeReady && !c.Status {
				return fmt.Errorf("runtime not ready: %s", c.Message)
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("containerd: %w (log: %s)", err, Tail(filepath.Join(cfg.StateDir, "containerd.log")))
	}
	n.phase("containerd start", t0)
	return n, nil
}

var errDead = errors.New("process exited")

// Import loads image archives into containerd's k8s.io namespace.
func (n *Node) Import(ctx context.Context, archives ...string) error {
	t0 := time.Now()
	for _, a := range archives {
		out, err := exec.CommandContext(ctx, "ctr", "--address", n.cfg.socket(), "-n", "k8s.io", "images", "import", "--no-unpack=false", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w: %s", a, err, out)
		}
	}
	n.phase("image import", t0)
	return nil
}

// StartKubelet starts the standalone kubelet and waits for its healthz.
func (n *Node) StartKubelet(ctx context.Context) (err error) {
	t0 := time.Now()
	if err := makeCgroupRoot(n.cfg.CgroupRoot); err != nil {
		return err
	}
	if _, err := defaultLink(); err != nil {
		return err
	}
	args := []string{
		"--config", filepath.Join(n.cfg.StateDir, "kubelet.yaml"),
		"--root-dir", n.cfg.kubeletRoot(),
		"--hostname-override", n.cfg.NodeName,
		"--v", "3", // 3: every probe result is logged
	}
	if a := n.cfg.API; a != nil {
		// Its serving certificate in its own root, not /var/lib/kubelet/pki.
		args = append(args, "--kubeconfig", a.KubeConfig, "--node-ip", a.NodeIP, "--cert-dir", filepath.Join(n.cfg.kubeletRoot(), "pki"))
	}
	n.kubelet, err = StartDaemon(n.cfg, "kubelet", n.cfg.Kubelet, args...)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: time.Second}
	if err := WaitFor(ctx, 60*time.Second, func() error {
		if n.kubelet.ProcessState != nil {
			return errDead
		}
		resp, err := hc.Get(n.cfg.healthzURL())
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("healthz %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("kubelet: %w (log: %s)", err, Tail(filepath.Join(n.cfg.StateDir, "kubelet.log")))
	}
	n.phase("kubelet start", t0)
	return nil
}

// Config returns the node's configuration.
func (n *Node) Config() Config { return n.cfg }

// Close removes every pod, stops the kubelet, removes every sandbox
// through the CRI (CNI DEL: veths and addresses go), stops containerd and
// sweeps. Safe twice.
func (n *Node) Close() error {
	var errs []error
	if n.kubelet != nil {
		entries, _ := os.ReadDir(n.cfg.manifestDir())
		for _, e := range entries {
			os.Remove(filepath.Join(n.cfg.manifestDir(), e.Name()))
		}
		if len(entries) > 0 && n.Runtime != nil {
			// Let the kubelet terminate them as it would, within their grace.
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			errs = append(errs, WaitFor(ctx, 45*time.Second, func() error {
				cs, err := n.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
				if err != nil {
					return err
				}
				if len(cs.Containers) > 0 {
					return fmt.Errorf("%d containers still running", len(cs.Containers))
				}
				return nil
			}))
			cancel()
		}
		errs = append(errs, stopDaemon(n.kubelet, 10*time.Second))
		n.kubelet = nil
	}
	if n.Runtime != nil && n.containerd != nil && n.containerd.ProcessState == nil {
		errs = append(errs, removeAllSandboxes(n.Runtime))
	}
	if n.conn != nil {
		n.conn.Close()
		n.conn = nil
	}
	if n.containerd != nil {
		errs = append(errs, stopDaemon(n.containerd, 10*time.Second))
		n.containerd = nil
	}
	errs = append(errs, n.keepLogs())
	errs = append(errs, Sweep(n.cfg))
	return errors.Join(errs...)
}

// keepLogs copies the daemons' logs to LogDir before the sweep removes them.
func (n *Node) keepLogs() error {
	if n.cfg.LogDir == "" {
		return nil
	}
	if err := os.MkdirAll(n.cfg.LogDir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"containerd.log", "kubelet.log"} {
		if b, err := os.ReadFile(filepath.Join(n.cfg.StateDir, name)); err == nil {
			os.WriteFile(filepath.Join(n.cfg.LogDir, name), b, 0o644)
		}
	}
	return nil
}

// RemoveAllSandboxes removes every container and sandbox of a containerd
// this package started, through its CRI socket (CNI DEL: the veths and
// addresses go), when it still runs: make cluster-down, in a process other
// than the one that started it.
func RemoveAllSandboxes(cfg Config) error {
	if _, err := os.Stat(cfg.socket()); err != nil {
		return nil
	}
	conn, err := grpc.NewClient("unix://"+cfg.socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = rt.Version(ctx, &runtimeapi.VersionRequest{})
	cancel()
	if err != nil {
		return nil // not running: Sweep does the rest
	}
	return removeAllSandboxes(rt)
}

func removeAllSandboxes(rt runtimeapi.RuntimeServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var errs []error
	if cs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err == nil {
		for _, c := range cs.Containers {
			if err := removeContainer(ctx, rt, c.Id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	for _, sb := range sbs.Items {
		// The kubelet has stopped most: a second stop would run CNI DEL on
		// a network namespace that is gone.
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
				errs = append(errs, fmt.Errorf("stop sandbox %s: %w", sb.Id, err))
			}
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox %s: %w", sb.Id, err))
		}
	}
	return errors.Join(errs...)
}

// removeContainer stops (SIGKILL) and removes container id. On a busy
// node containerd's stop may give up waiting for the exit before it
// comes, and the removal is then refused ("container is still running,
// to stop first": seen in CI): both are tried again, for 20 s at most.
func removeContainer(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) error {
	var stopErr, rmErr error
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		_, stopErr = rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0})
		if _, rmErr = rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); rmErr == nil {
			return nil
		}
		if time.Now().After(end) || ctx.Err() != nil {
			if stopErr != nil {
				return fmt.Errorf("remove container %s: %w (its stop: %w)", id, rmErr, stopErr)
			}
			return fmt.Errorf("remove container %s: %w", id, rmErr)
		}
	}
}

// StartDaemon starts bin as the daemon name: its output in
// StateDir/NAME.log, its PID in StateDir/NAME.pid (which Sweep and
// StopRecorded read). The daemon dies with this process unless cfg.Detach.
func StartDaemon(cfg Config, name, bin string, args ...string) (*exec.Cmd, error) {
	return startDaemon(cfg, "", nil, name, bin, args...)
}

// StartDaemonIn is StartDaemon in the working directory dir with the
// environment env (nil: this process's).
func StartDaemonIn(cfg Config, dir string, env []string, name, bin string, args ...string) error {
	_, err := startDaemon(cfg, dir, env, name, bin, args...)
	return err
}

func startDaemon(cfg Config, dir string, env []string, name, bin string, args ...string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(filepath.Join(cfg.StateDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir, cmd.Env = dir, env
	// Its own process group, and gone with us if the test binary dies; a
	// detached one its own session, so that make's end does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if cfg.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go cmd.Wait() // sets ProcessState; stopDaemon waits on it
	writePID(cfg, name, cmd.Process.Pid)
	return cmd, nil
}

func stopDaemon(cmd *exec.Cmd, grace time.Duration) error {
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	end := time.Now().Add(grace)
	for time.Now().Before(end) {
		if syscall.Kill(cmd.Process.Pid, 0) != nil || ProcessGone(cmd.Process.Pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Kill()
	return fmt.Errorf("%s did not stop within %s: killed", filepath.Base(cmd.Path), grace)
}

// ProcessGone reports a PID that is gone or a zombie.
func ProcessGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i > 0 && len(s) > i+2 {
		return s[i+2] == 'Z'
	}
	return false
}

func writePID(cfg Config, name string, pid int) {
	os.WriteFile(filepath.Join(cfg.StateDir, name+".pid"), []byte(fmt.Sprint(pid)), 0o644)
}

// WaitFor calls f every 100 ms until it returns nil or an error wrapping
// errDead (a daemon that exited), for at most d, and returns its last error.
func WaitFor(ctx context.Context, d time.Duration, f func() error) error {
	end := time.Now().Add(d)
	for {
		err := f()
		if err == nil || errors.Is(err, errDead) {
			return err
		}
		if time.Now().After(end) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Tail returns the last lines of a log, for error messages.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// cgroupMount is where the node's cgroups are.
const cgroupMount = "/sys/fs/cgroup"

// UnifiedOnly reports a node on the cgroup v2 unified hierarchy alone
// (cgroup2 mounted at /sys/fs/cgroup, as on systemd's unified mode), not
// the v1 hierarchies under a tmpfs there.
func UnifiedOnly() bool {
	const cgroup2SuperMagic = 0x63677270
	var st syscall.Statfs_t
	return syscall.Statfs(cgroupMount, &st) == nil && st.Type == cgroup2SuperMagic
}

// v2Controllers are the controllers the kubelet's cgroupfs driver uses on
// the unified hierarchy; they must be enabled down to the cgroup root.
var v2Controllers = []string{"cpuset", "cpu", "io", "memory", "hugetlb", "pids"}

// makeCgroupRoot creates the kubelet's cgroup root. On cgroup v1, in every
// hierarchy (the kubelet checks they all exist); cpuset's needs its
// parent's cpus and mems before a task can join it or its children. On
// cgroup v2, once, with the controllers enabled from the top down to it
// (a controller a cgroup's parent does not delegate is absent from it).
func makeCgroupRoot(root string) error {
	if UnifiedOnly() {
		return makeCgroupRootV2(root)
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		if filepath.Base(h) == "unified" {
			continue
		}
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup root %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

func makeCgroupRootV2(root string) error {
	dir := cgroupMount
	for _, elem := range strings.Split(strings.Trim(root, "/"), "/") {
		available, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
		var enable []string
		for _, c := range v2Controllers {
			if slices.Contains(strings.Fields(string(available)), c) {
				enable = append(enable, "+"+c)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("cgroup root: enable %v in %s: %w", enable, dir, err)
		}
		dir = filepath.Join(dir, elem)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup root: %w", err)
		}
	}
	return nil
}

// nodeAddressLink gives a machine without a default route (the qemu VM of
// make e2e-kubelet-vm has no network) the address the kubelet takes for
// the node's: without one it cannot fill status.hostIP, and Istio's
// injected istio-proxy (env HOST_IP from status.hostIP) fails with
// CreateContainerConfigError "host IP unknown". A machine with a default
// route is left as it is.
const (
	nodeAddressLink = "draind-e2e-node"
	nodeAddress     = "198.19.255.1/32"
)

// defaultLink is the interface of the IPv4 default route; a machine with
// none is given one first (nodeAddressLink).
func defaultLink() (string, error) {
	// The IPv4 table only: /proc/net/ipv6_route lists a reject route to ::/0
	// on lo even where there is no IPv6 route (the kernel's null entry).
	link := func() string {
		b, _ := os.ReadFile("/proc/net/route")
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] == "00000000" {
				return f[0] // Iface Destination ...: 00000000 is the default
			}
		}
		return ""
	}
	if l := link(); l != "" {
		return l, nil
	}
	for _, args := range [][]string{
		{"link", "add", nodeAddressLink, "type", "dummy"},
		{"addr", "add", nodeAddress, "dev", nodeAddressLink},
		{"link", "set", nodeAddressLink, "up"},
		{"route", "add", "default", "dev", nodeAddressLink},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("node address (no default route): ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nodeAddressLink, nil
}

// Address is the node's address as the kubelet takes it: the IPv4 address
// of the default route's interface (nodeAddressLink's on a machine with no
// default route).
func Address() (string, error) {
	name, err := defaultLink()
	if err != nil {
		return "", err
	}
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("node address: %w", err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return "", fmt.Errorf("node address: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", fmt.Errorf("node address: no IPv4 address on %s, the default route's interface", name)
}
