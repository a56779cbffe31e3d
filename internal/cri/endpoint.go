package cri

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
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
	// this process's own, /proc/PID/root (the kubelet's), or /host.
	HostRoot string `json:"host_root,omitempty"`
	// Why says who named it.
	Why string `json:"why"`
}

// Locate picks the CRI endpoint: given (by givenBy, e.g. "--cri-endpoint")
// when not empty, else the kubelet's, else the first default whose socket
// exists (else the first default, which Dial then reports missing). Only
// a given address that is not a unix socket is an error.
func Locate(given, givenBy string) (Endpoint, error) {
	return locator{proc: "/proc"}.locate(given, givenBy)
}

// locator reads a /proc (a test's stand-in tree).
type locator struct{ proc string }

func (l locator) locate(given, givenBy string) (Endpoint, error) {
	if given != "" {
		path, err := socketPath(given)
		if err != nil {
			return Endpoint{}, fmt.Errorf("cri endpoint %q (%s): %w", given, givenBy, err)
		}
		return Endpoint{Address: given, Socket: path, Why: givenBy}, nil
	}
	kubelets := l.kubelets()
	var notes []string
	for _, k := range kubelets {
		ep, err := l.fromKubelet(k)
		if err != nil {
			notes = append(notes, err.Error())
			continue
		}
		if len(kubelets) > 1 {
			ep.Why += fmt.Sprintf(" (one of %d kubelets)", len(kubelets))
			if !exists(ep.Socket) {
				notes = append(notes, fmt.Sprintf("kubelet pid %d: no socket at %s", k.pid, ep.Socket))
				continue
			}
		}
		return ep, nil
	}
	if len(kubelets) == 0 {
		notes = append(notes, "no kubelet in "+l.proc)
	}
	for _, root := range []string{"", DebugHostRoot} {
		for _, addr := range DefaultEndpoints {
			path, _ := socketPath(addr)
			if exists(root + path) {
				why := "default"
				if root != "" {
					why = "default, under " + root + " (kubectl debug's mount of the node)"
				}
				return Endpoint{Address: addr, Socket: root + path, HostRoot: root, Why: why + ": " + strings.Join(notes, "; ")}, nil
			}
		}
	}
	path, _ := socketPath(DefaultEndpoints[0])
	return Endpoint{Address: DefaultEndpoints[0], Socket: path, Why: "default, though none exists: " + strings.Join(notes, "; ")}, nil
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

// kubelet is a kubelet process's PID and argv.
type kubelet struct {
	pid  int
	args []string
}

// kubelets are the processes whose argv[0] is a kubelet, by PID.
func (l locator) kubelets() []kubelet {
	ents, _ := os.ReadDir(l.proc)
	var out []kubelet
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
		if filepath.Base(args[0]) == "kubelet" {
			out = append(out, kubelet{pid, args[1:]})
		}
	}
	slices.SortFunc(out, func(a, b kubelet) int { return a.pid - b.pid })
	return out
}

// fromKubelet is the endpoint kubelet k uses: its flag, else its config
// file's field, else the kubelet's default; its paths are reached under
// its root when that is not this process's.
func (l locator) fromKubelet(k kubelet) (Endpoint, error) {
	procDir := filepath.Join(l.proc, strconv.Itoa(k.pid))
	root, rootNote := l.rootOf(procDir)
	why := fmt.Sprintf("kubelet pid %d", k.pid)
	addr := FlagValue(k.args, "container-runtime-endpoint")
	switch cfg := FlagValue(k.args, "config"); {
	case addr != "":
		why += " --container-runtime-endpoint"
	case cfg != "":
		// A relative path is the kubelet's working directory's.
		path := cfg
		if !filepath.IsAbs(path) {
			path = filepath.Join(procDir, "cwd", path)
		} else {
			path = root + path
		}
		b, err := os.ReadFile(path)
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
	if root != "" {
		why += ", reached through " + root
	}
	return Endpoint{Address: addr, Socket: root + path, HostRoot: root, Why: why + rootNote}, nil
}

// rootOf is where a process's root is reached from here: "" when it is
// this process's own (or cannot be read: a note says so), else its
// /proc/PID/root.
func (l locator) rootOf(procDir string) (string, string) {
	var own, its unix.Stat_t
	theirs := filepath.Join(procDir, "root")
	if err := unix.Stat(theirs, &its); err != nil {
		return "", fmt.Sprintf(" (its root unreadable: %v: its paths taken as ours)", err)
	}
	if err := unix.Stat(filepath.Join(l.proc, "self", "root"), &own); err == nil && own.Dev == its.Dev && own.Ino == its.Ino {
		return "", ""
	}
	return theirs, ""
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
