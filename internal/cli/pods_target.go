package cli

// Pod targeting: the pod --pod names, found through the CRI, and in a pod
// the container that runs `draind run` and where its status server is.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/cri"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/rootfs"
)

// criTimeout bounds a node command's calls to the runtime (the pod's
// lookup, the node's listing).
const criTimeout = 5 * time.Second

// criFlags is --cri-endpoint, with crictl's variable as an alias.
type criFlags struct {
	endpoint string
	fs       *flagSet
}

func (c *criFlags) register(fs *flagSet) {
	c.fs = fs
	fs.StringVar(&c.endpoint, "cri-endpoint", "", "the container runtime's CRI socket (unix:///PATH); unset: the node's kubelet's, else "+strings.Join(cri.DefaultEndpoints, " or "))
	fs.alias("cri-endpoint", envAlias{name: "CONTAINER_RUNTIME_ENDPOINT"})
}

// dial finds the endpoint and connects. Its errors are usage errors (exit
// 2), one line naming the endpoint and why it was chosen.
func (c *criFlags) dial(ctx context.Context, cmd string) (*cri.Client, cri.Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, criTimeout)
	defer cancel()
	ep, err := cri.Locate(ctx, c.endpoint, c.fs.sourceOf("cri-endpoint"))
	if err != nil {
		return nil, ep, usageErr("%s: %v", cmd, err)
	}
	client, err := cri.Dial(ctx, ep.Socket)
	if err != nil {
		return nil, ep, usageErr("%s: cri endpoint %s (%s): %v", cmd, ep.Address, ep.Why, err)
	}
	return client, ep, nil
}

// podTarget is the pod --pod named, as conns and watch looked into it.
type podTarget struct {
	Pod cri.Pod `json:"pod"`
	// Container is --container; PID the process whose network namespace
	// was entered (the sandbox's, or that container's).
	Container string       `json:"container,omitempty"`
	PID       int          `json:"pid,omitempty"`
	CRI       cri.Endpoint `json:"cri"`
	Runtime   string       `json:"runtime"`
}

// label names the target in the output's header and summary (raw: a
// table prints it through printable).
func (t *podTarget) label() string {
	via := "pid " + strconv.Itoa(t.PID)
	if t.Container != "" {
		via = "container " + t.Container + ", " + via
	}
	if t.PID == 0 {
		via = "netns " + t.Pod.NetNSPath
	}
	return fmt.Sprintf("pod %s (%s)", t.Pod.String(), via)
}

// criLine says where the pod was found: the runtime, its endpoint and why.
func (t *podTarget) criLine() string {
	return fmt.Sprintf("found through %s at %s (%s)", cell(t.Runtime, headerWidth), cell(t.CRI.Address, headerWidth), cell(t.CRI.Why, whyWidth))
}

// jsonMembers are the target as more members of a JSON object
// (",\"target\":{...}").
func (t *podTarget) jsonMembers() []byte {
	b, err := json.Marshal(t)
	if err != nil {
		return nil
	}
	return append([]byte(`,"target":`), b...)
}

// registerPod adds --pod, --container and --cri-endpoint (conns, watch).
func (n *nsFlags) registerPod(fs *flagSet) {
	fs.StringVar(&n.pod, "pod", "", "look into this pod's network namespace: NAMESPACE/NAME, found through the node's CRI socket")
	fs.StringVar(&n.container, "container", "", "with --pod: enter through this container's process (default: the pod's sandbox)")
	n.cri.register(fs)
}

// validatePod checks --pod against the other targets.
func (n *nsFlags) validatePod(cmd string) error {
	if n.pod == "" {
		if n.container != "" {
			return usageErr("%s: --container needs --pod", cmd)
		}
		return nil
	}
	if n.netns != "" || n.pid != 0 {
		return usageErr("%s: --pod is exclusive with --pid and --netns", cmd)
	}
	if _, _, ok := splitPod(n.pod); !ok {
		return usageErr("%s: --pod %q: want NAMESPACE/NAME", cmd, n.pod)
	}
	return nil
}

func splitPod(s string) (ns, name string, ok bool) {
	ns, name, ok = strings.Cut(s, "/")
	return ns, name, ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

// openTarget opens the namespace --pod names, through the CRI (n.target
// records it), or the one --pid or --netns name. An unknown pod, a pod of
// another node and a missing CRI socket are usage errors (exit 2).
func (n *nsFlags) openTarget(ctx context.Context, cmd string) (*namespace.Net, error) {
	if n.pod == "" {
		return n.open()
	}
	client, ep, err := n.cri.dial(ctx, cmd)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, criTimeout)
	defer cancel()
	podNS, name, _ := splitPod(n.pod)
	pod, err := client.FindPod(ctx, podNS, name)
	if errors.Is(err, cri.ErrPodNotFound) || errors.Is(err, cri.ErrPodNotReady) {
		return nil, usageErr("%s: pod %s: %v (%s at %s: %s)", cmd, n.pod, err, client.Runtime, ep.Address, ep.Why)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: pod %s: %w", cmd, n.pod, err)
	}
	t := &podTarget{Pod: *pod, PID: pod.PID, CRI: ep, Runtime: client.Runtime, Container: n.container}
	if n.container != "" {
		cs, err := client.Containers(ctx, pod)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd, err)
		}
		i := slices.IndexFunc(cs, func(c cri.Container) bool { return c.Name == n.container })
		if i < 0 || cs[i].PID == 0 {
			names := make([]string, len(cs))
			for j, c := range cs {
				names[j] = c.Name
			}
			return nil, usageErr("%s: pod %s has no running container %q (running: %s)", cmd, n.pod, n.container, strings.Join(names, ", "))
		}
		t.PID = cs[i].PID
	}
	ns, err := openPodNetNS(ep, &t.Pod, t.PID)
	if err != nil {
		return nil, fmt.Errorf("%s: pod %s: %w", cmd, n.pod, err)
	}
	n.target = t
	return ns, nil
}

// label names what conns and watch look into.
func (n *nsFlags) label(ns *namespace.Net) string {
	if n.target != nil {
		return n.target.label()
	}
	return ns.Name()
}

// openPodNetNS opens a pod's network namespace: through a process of the
// pod (its PID on the node, which this process sees with hostPID), else
// through the path the runtime names, under the node's root as reached
// from here.
func openPodNetNS(ep cri.Endpoint, pod *cri.Pod, pid int) (*namespace.Net, error) {
	if pid > 0 {
		ns, err := namespace.ByPID(pid)
		if err == nil || pod.NetNSPath == "" {
			return ns, err
		}
	}
	if pod.NetNSPath == "" {
		return nil, errors.New("the runtime names no process and no network namespace of it")
	}
	return namespace.Open(ep.HostRoot + pod.NetNSPath)
}

// findDraind is the pod's container that runs `draind run`, and where
// its status server is; nil when none does. The address can depend on
// a file in the container (Istio's annotations): read inside its root,
// within ctx; what cannot be read is an error, with the container named.
func findDraind(ctx context.Context, cs []cri.Container) (*draindRef, error) {
	for _, c := range cs {
		annotations := func() ([]byte, error) { return nil, nil }
		if c.PID > 0 {
			annotations = func() ([]byte, error) { return containerAnnotations(ctx, c.PID) }
		}
		addr, from, ok, err := draindStatusAddr(c.Args, c.Env, annotations)
		if !ok {
			continue
		}
		ref := &draindRef{Container: c.Name, StatusAddr: addr, From: from}
		if err != nil {
			ref.StatusAddr, ref.From = "", ""
		}
		return ref, err
	}
	return nil, nil
}

// containerAnnotations reads Istio's annotations file where pilot-agent
// reads it, relative to its working directory, inside its container's
// root (/proc/PID/root): links in the container resolve there, never in
// this process's root.
func containerAnnotations(ctx context.Context, pid int) ([]byte, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	cwd, err := rootfs.Cwd(proc)
	if err != nil {
		return nil, err
	}
	return istio.ReadAnnotationsFile(ctx, proc+"/root", filepath.Join(cwd, istio.PodAnnotations))
}

// draindStatusAddr says whether a container's argv runs `draind run`
// (draind as argv[0], or after an init wrapper), and the address to dial
// in the pod for its status server: where that draind listens
// (istio.StatusAddrOf, from its argv and environment, and under
// pilot-agent Istio's settings from its environment and the annotations
// file annotations reads, as run reads them), an address on every
// interface dialled on loopback, which /debug/state requires. An
// annotations file that cannot be read or parsed is an error (ok still
// true): run would have refused it.
func draindStatusAddr(args, env []string, annotations func() ([]byte, error)) (addr, from string, ok bool, err error) {
	in, lookup, ok := istio.RunArgs(args, env)
	if !ok {
		return "", "", false, nil
	}
	if in.NeedsSettings() {
		if in.Settings, err = istio.ReadFrom(lookup, istio.PodAnnotations, annotations); err != nil {
			return "", "", true, err
		}
	}
	a := istio.StatusAddrOf(in)
	return loopbackAddr(a.Addr), a.From, true, nil
}

// loopbackAddr is where a status server listening at addr is dialled
// from inside its pod: loopback for an unspecified host (or none).
func loopbackAddr(addr string) string {
	host, port, err := agent.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	ip, perr := netip.ParseAddr(host)
	switch {
	case host == "" || perr == nil && ip.IsUnspecified() && ip.Is4():
		host = "127.0.0.1"
	case perr == nil && ip.IsUnspecified():
		host = "::1"
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
