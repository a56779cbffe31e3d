package cri

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Errors callers branch on (errors.Is).
var (
	// ErrPodNotFound means no sandbox of that namespace and name in this
	// node's runtime: the pod does not exist, or runs on another node.
	ErrPodNotFound = errors.New("not on this node")
	// ErrPodNotReady means the pod's sandboxes on this node are all
	// stopped.
	ErrPodNotReady = errors.New("its sandbox on this node is not ready")
	// ErrNoRuntime means no socket at the endpoint, or nothing answers
	// there.
	ErrNoRuntime = errors.New("no container runtime")
)

// maxMessage bounds one answer: the kubelet's own limit (16 MiB), where
// gRPC's default (4 MiB) is too small for a full node's listing.
const maxMessage = 16 << 20

// Client is a connection to a runtime's CRI socket. Its methods may be
// called from several goroutines.
type Client struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
	// Runtime is the runtime's name and version ("containerd 1.6.20").
	Runtime string
}

// Dial connects to the CRI socket at path (a file path, or a unix://
// address) and asks the runtime its version, within ctx: a socket that
// is missing or silent is an error wrapping [ErrNoRuntime].
func Dial(ctx context.Context, path string) (*Client, error) {
	path = strings.TrimPrefix(path, "unix://")
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoRuntime, err)
	} else if st.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("%w: %s is not a socket", ErrNoRuntime, path)
	}
	conn, err := grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("cri client for %s: %w", path, err)
	}
	c := &Client{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %s does not answer: %w", ErrNoRuntime, path, err)
	}
	c.Runtime = v.GetRuntimeName() + " " + v.GetRuntimeVersion()
	return c, nil
}

// Close closes the connection. It is safe to call twice.
func (c *Client) Close() error {
	if c == nil || c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// Pod is one pod's sandbox on this node, as its runtime describes it.
type Pod struct {
	// SandboxID is the runtime's id of the pod's sandbox.
	SandboxID string    `json:"sandbox_id"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       string    `json:"uid"`
	Created   time.Time `json:"created"`
	Ready     bool      `json:"ready"`
	// IP is the pod's address ("" for hostNetwork pods).
	IP string `json:"ip,omitempty"`
	// HostNetwork reports whether the pod runs in the node's network
	// namespace.
	HostNetwork bool `json:"host_network,omitempty"`
	// PID is the sandbox process's PID on the node (0: the runtime did
	// not say); its /proc/PID/ns/net is the pod's network namespace.
	PID int `json:"pid,omitempty"`
	// NetNSPath is the pod's network namespace as the runtime names it:
	// a path on the node ("" : not said, or hostNetwork).
	NetNSPath string `json:"netns_path,omitempty"`
	// StatusErr is why the ready sandbox's status could not be read (IP,
	// PID and NetNSPath then unknown): one pod's, never the listing's.
	StatusErr error `json:"-"`
}

// String is namespace/name.
func (p *Pod) String() string { return p.Namespace + "/" + p.Name }

// Container is one running container of a pod.
type Container struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Attempt uint32 `json:"attempt"`
	// PID is its first process's PID on the node (0: not said).
	PID int `json:"pid,omitempty"`
	// Args and Env are its first process's argv (the image's entrypoint
	// included) and environment (KEY=VALUE), from the runtime spec.
	Args []string `json:"args,omitempty"`
	Env  []string `json:"-"`
}

// Pods lists the pods with a ready sandbox, sorted by namespace and name.
// A sandbox whose status cannot be read is listed with [Pod.StatusErr]
// set: one wedged sandbox leaves the others' view whole.
func (c *Client) Pods(ctx context.Context) ([]Pod, error) {
	return c.pods(ctx, &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}})
}

// FindPod is pod namespace/name's ready sandbox (the newest if several).
// Errors wrap [ErrPodNotFound] or [ErrPodNotReady].
func (c *Client) FindPod(ctx context.Context, namespace, name string) (*Pod, error) {
	pods, err := c.pods(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{
		"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name}})
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, ErrPodNotFound
	}
	slices.SortFunc(pods, func(a, b Pod) int { return b.Created.Compare(a.Created) })
	for i := range pods {
		if pods[i].Ready {
			if err := pods[i].StatusErr; err != nil {
				return nil, err
			}
			return &pods[i], nil
		}
	}
	return nil, ErrPodNotReady
}

func (c *Client) pods(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]Pod, error) {
	resp, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var out []Pod
	for _, sb := range resp.GetItems() {
		p := Pod{SandboxID: sb.GetId(), Namespace: sb.GetMetadata().GetNamespace(), Name: sb.GetMetadata().GetName(),
			UID: sb.GetMetadata().GetUid(), Created: time.Unix(0, sb.GetCreatedAt()), Ready: sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY}
		if p.Ready {
			st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.GetId(), Verbose: true})
			if isGone(err) {
				continue // removed since the listing
			}
			if err != nil {
				p.StatusErr = fmt.Errorf("pod %s: sandbox status: %w", p.String(), err)
				out = append(out, p)
				continue
			}
			p.IP = st.GetStatus().GetNetwork().GetIp()
			p.HostNetwork = st.GetStatus().GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
			info := parseInfo(st.GetInfo())
			p.PID, p.NetNSPath = info.PID, info.netNS()
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Pod) int { return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) })
	return out, nil
}

// Containers lists pod's running containers, sorted by name.
func (c *Client) Containers(ctx context.Context, pod *Pod) ([]Container, error) {
	resp, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: pod.SandboxID,
		State:        &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return nil, fmt.Errorf("pod %s: list containers: %w", pod.String(), err)
	}
	var out []Container
	for _, ct := range resp.GetContainers() {
		st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.GetId(), Verbose: true})
		if isGone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pod %s: container %s: status: %w", pod.String(), ct.GetMetadata().GetName(), err)
		}
		info := parseInfo(st.GetInfo())
		out = append(out, Container{ID: ct.GetId(), Name: ct.GetMetadata().GetName(), Attempt: ct.GetMetadata().GetAttempt(),
			PID: info.PID, Args: info.args(), Env: info.env()})
	}
	slices.SortFunc(out, func(a, b Container) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// isGone reports whether the sandbox or container was removed between two
// calls.
func isGone(err error) bool {
	return status.Code(err) == codes.NotFound
}

// verboseInfo is the part of a runtime's verbose status ("info": JSON)
// read here: containerd's and CRI-O's both carry the process's pid and
// the OCI runtime spec.
type verboseInfo struct {
	PID  int `json:"pid"`
	Spec *struct {
		Process *struct {
			Args []string `json:"args"`
			Env  []string `json:"env"`
		} `json:"process"`
		Linux *struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

// parseInfo reads a verbose status's "info"; what is missing or
// malformed stays zero (the runtime's extras are no contract).
func parseInfo(m map[string]string) verboseInfo {
	var v verboseInfo
	json.Unmarshal([]byte(m["info"]), &v)
	return v
}

func (v verboseInfo) args() []string {
	if v.Spec == nil || v.Spec.Process == nil {
		return nil
	}
	return v.Spec.Process.Args
}

func (v verboseInfo) env() []string {
	if v.Spec == nil || v.Spec.Process == nil {
		return nil
	}
	return v.Spec.Process.Env
}

func (v verboseInfo) netNS() string {
	if v.Spec == nil || v.Spec.Linux == nil {
		return ""
	}
	for _, ns := range v.Spec.Linux.Namespaces {
		if ns.Type == "network" {
			return ns.Path
		}
	}
	return ""
}
