package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// Inventory is the machine's state in every respect the cluster changes:
// the list of what it makes, which Down must leave as it found it.
type Inventory struct {
	Processes []string          // the cluster's running processes (Config.ours): daemons, shims, pods' processes
	Mounts    []string          // mount points
	Links     []string          // network interfaces
	NetNS     []string          // named network namespaces (/run/netns)
	Rules     []string          // iptables and ip6tables rules and chains, by table, counters left out
	Paths     []string          // the files and directories of cluster's places that exist
	Sysctls   map[string]string // the sysctls it sets or its components set
	Cgroups   []string          // cgroup directories under its cgroup root, in every hierarchy
}

// places are the paths the cluster or its components write: its own
// directories, and where a kubelet, containerd or CNI writes by default.
func (c Config) places() []string {
	return append([]string{c.StateDir, c.DataDir, c.restoreRecord(), "/var/log/pods", "/etc/kubernetes",
		"/etc/cni/net.d", "/var/lib/containerd", "/run/netns", "/var/run/netns"}, defaultPaths...)
}

// ours describes the process at /proc/PID when it is the cluster's: its
// arguments name the cluster's directories (every daemon and shim of it
// does), or it runs in the kubelet's cgroup tree (a pod's process).
func (c Config) ours(proc string) string {
	cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline"))
	if err != nil {
		return ""
	}
	desc := string(bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '}))
	for _, m := range []string{c.StateDir + "/", c.DataDir + "/"} {
		if strings.Contains(desc, m) {
			return desc
		}
	}
	cg, _ := os.ReadFile(filepath.Join(proc, "cgroup"))
	if strings.Contains(string(cg), c.Node.CgroupRoot+"/") {
		return "in " + c.Node.CgroupRoot + ": " + desc
	}
	return ""
}

// Snapshot reads the inventory now.
func (c Config) Snapshot() Inventory {
	inv := Inventory{Sysctls: map[string]string{}}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		if what := c.ours(filepath.Join("/proc", p.Name())); what != "" {
			inv.Processes = append(inv.Processes, what)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 {
				inv.Mounts = append(inv.Mounts, node.UnescapeMount(f[4]))
			}
		}
	}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		inv.Links = append(inv.Links, i.Name)
	}
	for _, d := range []string{"/run/netns", "/var/run/netns"} {
		es, _ := os.ReadDir(d)
		for _, e := range es {
			inv.NetNS = append(inv.NetNS, filepath.Join(d, e.Name()))
		}
	}
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		if out, err := exec.Command(bin).Output(); err == nil {
			inv.Rules = append(inv.Rules, iptablesRules(bin, out)...)
		}
	}
	for _, p := range c.places() {
		filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err == nil {
				inv.Paths = append(inv.Paths, path)
			}
			return nil
		})
	}
	for k := range sysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			inv.Sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range append(hier, "/sys/fs/cgroup") {
		filepath.WalkDir(filepath.Join(h, c.Node.CgroupRoot), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				inv.Cgroups = append(inv.Cgroups, path)
			}
			return nil
		})
	}
	return inv
}

// Leftovers lists what now is in the inventory and was not in before,
// and the sysctls whose value changed: what Down failed to remove.
func (now Inventory) Leftovers(before Inventory) []string {
	var out []string
	diff := func(kind string, a, b []string) {
		for _, x := range a {
			if !slices.Contains(b, x) {
				out = append(out, kind+" "+x)
			}
		}
	}
	diff("process", now.Processes, before.Processes)
	diff("mount", now.Mounts, before.Mounts)
	diff("link", now.Links, before.Links)
	diff("netns", now.NetNS, before.NetNS)
	diff("iptables", now.Rules, before.Rules)
	diff("path", now.Paths, before.Paths)
	diff("cgroup", now.Cgroups, before.Cgroups)
	for k, v := range before.Sysctls {
		if now.Sysctls[k] != v {
			out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", k, now.Sysctls[k], v))
		}
	}
	return out
}

// daemonPIDs is the PID Up recorded for each daemon, by name: the control
// plane's in StateDir, the node's (containerd, the kubelet) in its own.
func (c Config) daemonPIDs() map[string]string {
	out := map[string]string{}
	for _, name := range daemonNames {
		for _, dir := range []string{c.StateDir, c.Node.StateDir} {
			if b, err := os.ReadFile(filepath.Join(dir, name+".pid")); err == nil {
				out[name] = strings.TrimSpace(string(b))
			}
		}
	}
	return out
}

// RSS is each running component's resident memory in bytes, by name,
// read from the PIDs Up recorded.
func (c Config) RSS() map[string]int64 {
	out := map[string]int64{}
	for name, pid := range c.daemonPIDs() {
		st, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				out[name] = kb << 10
			}
		}
	}
	return out
}

// iptablesRules lists what iptables-save printed that someone made: each
// rule, each chain of one's own, and a built-in chain only where its
// policy is not ACCEPT. A built-in chain at ACCEPT is the table's own: the
// kernel makes the table, with them, the first time anything reads it,
// and no Down can take it back (the cluster's first iptables-save on a
// machine just booted would read as leaving the tables behind).
func iptablesRules(bin string, out []byte) []string {
	var rules []string
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			switch {
			case len(f) < 2:
			case f[1] == "-":
				rules = append(rules, fmt.Sprintf("%s %s chain %s", bin, table, f[0]))
			case f[1] != "ACCEPT":
				rules = append(rules, fmt.Sprintf("%s %s chain %s policy %s", bin, table, f[0], f[1]))
			}
		case strings.HasPrefix(line, "-A "):
			rules = append(rules, fmt.Sprintf("%s %s %s", bin, table, line))
		}
	}
	return rules
}
