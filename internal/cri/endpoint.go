package cri

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/rootfs"
)

// DefaultEndpoints are the runtimes' usual sockets, in the order tried
// when neither a setting nor a kubelet names one: containerd's (also the
// kubelet's own default, KubeletConfiguration containerRuntimeEndpoint),
// then CRI-O's.
var DefaultEndpoints = []string{"unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock"}

// DebugHostRoot is where `kubectl debug node/NAME` mounts the node's root
// in its pod: the defaults are also looked for there.
const DebugHostRoot = "/host"

// Endpoint is the CRI socket to dial, and why that one.
type Endpoint struct {
	// Address is the endpoint as it was named (unix:///run/containerd/containerd.sock).
	Address string `json:"address"`
	// Socket is the path this process dials: Address's path, under
	// HostRoot.
	Socket string `json:"socket"`
	// HostRoot is where the node's root is seen from here: "" when it is
	// this process's own, /proc/1/root (the node's init's), or /host.
	HostRoot string `json:"host_root,omitempty"`
	// KubeletPID is the kubelet that named it (0: none did).
	KubeletPID int `json:"kubelet_pid,omitempty"`
	// Why says who named it.
	Why string `json:"why"`
}

// kubeletConfigLimit bounds the kubelet's --config file (a
// KubeletConfiguration is a few KiB).
const kubeletConfigLimit = 1 << 20

// Locate picks the CRI endpoint: given (by givenBy, e.g. "--cri-endpoint")
// when not empty, else the node's kubelet's, else the first default whose
// socket exists (else the first default, which Dial then reports
// missing). A given address that is not a unix socket is an error, and so
// is more than one kubelet in the node's namespaces.
//
// The node's kubelet is a process named kubelet (argv[0]) in the PID
// namespace, mount namespace and root of /proc's PID 1: with hostPID
// (deploy/node-debug.yaml) that is the node's init, so a tenant's
// process named kubelet, in a container's namespaces, never counts.
// Where PID 1 cannot be read, kthreadd's (the kernel's initial
// namespaces), else this process's, stand for it (the Why says so). Its paths are read and its socket is dialled
// under the node's root (PID 1's), never under the kubelet's own, and
// its --config is read inside that root, bounded (internal/rootfs),
// within ctx.
func Locate(ctx context.Context, given, givenBy string) (Endpoint, error) {
	return locator{proc: "/proc"}.locate(ctx, given, givenBy)
}

// locator reads a /proc (a test's stand-in tree).
type locator struct{ proc string }

func (l locator) locate(ctx context.Context, given, givenBy string) (Endpoint, error) {
	if given != "" {
		path, err := socketPath(given)
		if err != nil {
			return Endpoint{}, fmt.Errorf("cri endpoint %q (%s): %w", given, givenBy, err)
		}
		return Endpoint{Address: given, Socket: path, Why: givenBy}, nil
	}
	node := l.node()
	kubelets, notes := l.kubelets(node)
	if node.note != "" {
		notes = append([]string{node.note}, notes...)
	}
	switch len(kubelets) {
	case 0:
		notes = append(notes, "no kubelet in "+node.name)
	case 1:
		ep, err := l.fromKubelet(ctx, kubelets[0], node)
		if err == nil {
			ep.Why += notesOf(notes)
			return ep, nil
		}
		notes = append(notes, err.Error())
	default:
		pids := make([]string, len(kubelets))
		for i, k := range kubelets {
			pids[i] = strconv.Itoa(k.pid)
		}
		return Endpoint{}, fmt.Errorf("%d kubelets in %s (pids %s): name the runtime's socket (--cri-endpoint)",
			len(kubelets), node.name, strings.Join(pids, ", "))
	}
	for _, root := range slices.Compact([]string{"", node.root, DebugHostRoot}) {
		for _, addr := range DefaultEndpoints {
			path, _ := socketPath(addr)
			if exists(root + path) {
				why := "default"
				if root != "" {
					why = "default, under " + root
				}
				if root == DebugHostRoot {
					why += " (kubectl debug's mount of the node)"
				}
				return Endpoint{Address: addr, Socket: root + path, HostRoot: root, Why: why + ": " + strings.Join(notes, "; ")}, nil
			}
		}
	}
	path, _ := socketPath(DefaultEndpoints[0])
	return Endpoint{Address: DefaultEndpoints[0], Socket: path, Why: "default, though none exists: " + strings.Join(notes, "; ")}, nil
}

func notesOf(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return "; " + strings.Join(notes, "; ")
}

// socketPath is a CRI address's socket path: unix:///path, or a path.
func socketPath(addr string) (string, error) {
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		if scheme != "unix" {
			return "", fmt.Errorf("a %s endpoint: only unix sockets are supported", scheme)
		}
		addr = rest
	}
	if !filepath.IsAbs(addr) {
		return "", errors.New("not an absolute socket path")
	}
	return filepath.Clean(addr), nil
}

// fileID is what a namespace link or a root leads to.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{st.Dev, st.Ino}, nil
}

// nodeRef is the node's PID and mount namespaces and root, as a
// kubelet must share them.
type nodeRef struct {
	pid, mnt, rootID fileID
	// root is where the node's root is reached from here: "" when it
	// is this process's own, else PID 1's /proc/1/root.
	root string
	// name says whose they are, for the Why; note why not PID 1's.
	name, note string
}

// unwrapPath is a path error's cause, without the path.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// node is PID 1's namespaces and root, else (unreadable) kthreadd's,
// else this process's.
func (l locator) node() nodeRef {
	self, err := l.refOf("self")
	if err != nil {
		// Not even our own: no kubelet can be told from a tenant's.
		return nodeRef{name: "no namespace readable (" + err.Error() + ")"}
	}
	init, err := l.refOf("1")
	if err == nil {
		init.name = "PID 1's namespaces"
		if init.rootID != self.rootID {
			init.root = filepath.Join(l.proc, "1", "root")
		}
		return init
	}
	// PID 1 may refuse a reader (non-dumpable, an LSM); kthreadd, the
	// kernel's own thread, has no memory to guard and lives in the
	// kernel's initial namespaces, which are the node's where PID 1's
	// are (a node that is not itself a container).
	if comm, cerr := os.ReadFile(filepath.Join(l.proc, "2", "comm")); cerr == nil && strings.TrimSpace(string(comm)) == "kthreadd" {
		if kt, kerr := l.refOf("2"); kerr == nil {
			kt.name = "the kernel's initial namespaces (kthreadd's)"
			kt.note = fmt.Sprintf("PID 1's namespaces unreadable (%v): kthreadd's stand for the node's", unwrapPath(err))
			if kt.rootID != self.rootID {
				kt.root = filepath.Join(l.proc, "2", "root")
			}
			return kt
		}
	}
	self.name = "this process's namespaces"
	self.note = fmt.Sprintf("PID 1's namespaces unreadable (%v): this process's stand for the node's", unwrapPath(err))
	return self
}

func (l locator) refOf(pid string) (nodeRef, error) {
	var r nodeRef
	var err error
	dir := filepath.Join(l.proc, pid)
	if r.pid, err = statID(filepath.Join(dir, "ns", "pid")); err != nil {
		return r, err
	}
	if r.mnt, err = statID(filepath.Join(dir, "ns", "mnt")); err != nil {
		return r, err
	}
	r.rootID, err = statID(filepath.Join(dir, "root"))
	return r, err
}

// kubelet is a kubelet process's PID and argv.
type kubelet struct {
	pid   int
	args  []string
	argv0 string
}

// kubelets are the processes whose argv[0] is a kubelet and that share
// node's namespaces and root, by PID; notes name the others.
func (l locator) kubelets(node nodeRef) ([]kubelet, []string) {
	ents, _ := os.ReadDir(l.proc)
	var out []kubelet
	var notes []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.proc, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if filepath.Base(args[0]) != "kubelet" {
			continue
		}
		if why := l.foreign(pid, node); why != "" {
			notes = append(notes, fmt.Sprintf("kubelet pid %d not trusted: %s", pid, why))
			continue
		}
		out = append(out, kubelet{pid: pid, args: args[1:], argv0: args[0]})
	}
	slices.SortFunc(out, func(a, b kubelet) int { return a.pid - b.pid })
	slices.Sort(notes)
	return out, notes
}

// foreign says why process pid is not in node's namespaces and root
// ("" : it is).
func (l locator) foreign(pid int, node nodeRef) string {
	if node.pid == (fileID{}) {
		return "its namespaces cannot be compared"
	}
	k, err := l.refOf(strconv.Itoa(pid))
	switch {
	case err != nil:
		return fmt.Sprintf("its namespaces unreadable (%v)", unwrapPath(err))
	case k.pid != node.pid:
		return "another PID namespace"
	case k.mnt != node.mnt:
		return "another mount namespace"
	case k.rootID != node.rootID:
		return "another root"
	}
	return ""
}

// fromKubelet is the endpoint kubelet k uses: its flag, else its config
// file's field, else the kubelet's default; its paths are reached under
// the node's root.
func (l locator) fromKubelet(ctx context.Context, k kubelet, node nodeRef) (Endpoint, error) {
	procDir := filepath.Join(l.proc, strconv.Itoa(k.pid))
	why := fmt.Sprintf("kubelet pid %d (%s, in %s)", k.pid, k.argv0, node.name)
	addr := FlagValue(k.args, "container-runtime-endpoint")
	switch cfg := FlagValue(k.args, "config"); {
	case addr != "":
		why += " --container-runtime-endpoint"
	case cfg != "":
		path := cfg
		if !filepath.IsAbs(path) {
			// A relative path is the kubelet's working directory's.
			cwd, err := rootfs.Cwd(procDir)
			if err != nil {
				return Endpoint{}, fmt.Errorf("kubelet pid %d: its --config %s: its working directory: %w", k.pid, cfg, err)
			}
			path = filepath.Join(cwd, path)
		}
		root := node.root
		if root == "" {
			root = "/"
		}
		b, err := rootfs.ReadFile(ctx, root, path, kubeletConfigLimit)
		if err != nil {
			return Endpoint{}, fmt.Errorf("kubelet pid %d: its --config: %w", k.pid, err)
		}
		var c struct {
			Endpoint string `yaml:"containerRuntimeEndpoint"`
		}
		if err := yaml.Unmarshal(b, &c); err != nil {
			return Endpoint{}, fmt.Errorf("kubelet pid %d: its --config %s: %w", k.pid, cfg, err)
		}
		addr, why = c.Endpoint, why+" --config "+cfg+" containerRuntimeEndpoint"
		if addr == "" {
			addr, why = DefaultEndpoints[0], why+" unset: the kubelet's default"
		}
	default:
		addr, why = DefaultEndpoints[0], why+" names none: the kubelet's default"
	}
	path, err := socketPath(addr)
	if err != nil {
		return Endpoint{}, fmt.Errorf("kubelet pid %d: endpoint %q: %w", k.pid, addr, err)
	}
	if node.root != "" {
		why += ", reached through " + node.root
	}
	return Endpoint{Address: addr, Socket: node.root + path, HostRoot: node.root, KubeletPID: k.pid, Why: why}, nil
}

// FlagValue is the value of flag name in a process's args (argv without
// argv[0]: --name=V, --name V, and the single-dash forms, up to "--"), the
// last one winning as for Go's flag package and the kubelet's; "" when
// not given. It reads the kubelet's argv here, and draind's in a
// container for `draind pods`.
func FlagValue(args []string, name string) string {
	v := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		trimmed := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if trimmed == a {
			continue
		}
		switch {
		case trimmed == name && i+1 < len(args):
			v = args[i+1]
			i++
		case strings.HasPrefix(trimmed, name+"="):
			v = trimmed[len(name)+1:]
		}
	}
	return v
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
