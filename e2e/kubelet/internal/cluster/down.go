package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// sysctls Up sets, and those the kubelet and kube-proxy set on their own
// (the kubelet's kernel tunables, kube-proxy's route_localnet): Up records
// each one's value before anything starts, Down writes it back.
var sysctls = map[string]string{
	"net/ipv4/ip_forward":                 "1", // Service traffic from one pod to another is routed through the node
	"net/bridge/bridge-nf-call-iptables":  "1", // and a pod's reply bridged to another must meet kube-proxy's conntrack
	"net/bridge/bridge-nf-call-ip6tables": "",
	"net/ipv4/conf/all/route_localnet":    "",
	"vm/overcommit_memory":                "",
	"vm/panic_on_oom":                     "",
	"kernel/panic":                        "",
	"kernel/panic_on_oops":                "",
	"kernel/keys/root_maxkeys":            "",
	"kernel/keys/root_maxbytes":           "",
}

// defaultPaths are written by the components wherever they run, whatever
// their configuration: the kubelet's device-plugin socket and serving
// certificate (/var/lib/kubelet), its links to the containers' logs
// (/var/log/containers), the CNI plugins' result cache
// (/var/lib/cni), containerd's shim sockets (/run/containerd). Up records
// those that do not exist yet; Down removes them.
var defaultPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/run/containerd", containerLogLinks}

// restoreRecord is where Up writes how to put the machine back: beside
// the state directory, not in it (a sweep of the state directory keeps
// it), written once before the first change and removed once restored.
func (c Config) restoreRecord() string { return c.StateDir + ".restore" }

// recordAndSet writes the restore record (the sysctls' values, the default
// paths that are absent), then sets the sysctls Up needs.
func recordAndSet(cfg Config) error {
	if _, err := os.Stat(cfg.restoreRecord()); errors.Is(err, os.ErrNotExist) {
		var rec strings.Builder
		for k := range sysctls {
			if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
				fmt.Fprintf(&rec, "sysctl %s=%s\n", k, strings.TrimSpace(string(b)))
			}
		}
		for _, p := range defaultPaths {
			if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(&rec, "absent %s\n", p)
			}
		}
		if err := os.WriteFile(cfg.restoreRecord(), []byte(rec.String()), 0o644); err != nil {
			return err
		}
	}
	for k, v := range sysctls {
		if v == "" {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", k, v, err)
		}
	}
	return nil
}

// restore puts back what the record says, then removes the record.
func restore(cfg Config) error {
	b, err := os.ReadFile(cfg.restoreRecord())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		kind, arg, _ := strings.Cut(line, " ")
		switch kind {
		case "sysctl":
			k, v, _ := strings.Cut(arg, "=")
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
			}
		case "absent":
			errs = append(errs, os.RemoveAll(arg))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(cfg.restoreRecord())
}

// Down removes everything Up made, in any process, also after an
// interrupted Up: the recorded daemons (istiod and CoreDNS first, etcd
// last), the pods' sandboxes through containerd while it still runs,
// then package node's sweep (runc containers, shims, mounts, the bridge,
// cgroups, directories), kube-proxy's and the kubelet's iptables chains,
// and the sysctls. Safe to run when nothing is there.
func Down(cfg Config) error {
	var errs []error
	n, d := cfg.Node, cfg.daemons()
	stop := func(c node.Config, name string, grace time.Duration) {
		errs = append(errs, node.StopRecorded(c, name, grace))
	}
	stop(d, "pilot-discovery", 10*time.Second)
	stop(d, "coredns", 5*time.Second)
	stop(d, "kube-proxy", 5*time.Second)
	// The kubelet first, so that it restarts nothing; then the sandboxes
	// through containerd (CNI DEL), then containerd.
	stop(n, "kubelet", 10*time.Second)
	errs = append(errs, node.RemoveAllSandboxes(n))
	stop(n, "containerd", 10*time.Second)
	stop(d, "kube-scheduler", 5*time.Second)
	stop(d, "kube-controller-manager", 5*time.Second)
	// kube-apiserver takes more than 9 s to stop on SIGTERM (its shutdown
	// delay and request drain); 15 s, then SIGKILL.
	stop(d, "kube-apiserver", 15*time.Second)
	stop(d, "etcd", 10*time.Second)
	errs = append(errs, cfg.killStray())
	errs = append(errs, removeLinksInto(containerLogLinks, n.DataDir+"/"))
	errs = append(errs, node.Sweep(n))
	errs = append(errs, os.RemoveAll(cfg.StateDir), os.RemoveAll(cfg.DataDir))
	errs = append(errs, removeKubeChains())
	errs = append(errs, restore(cfg))
	return errors.Join(errs...)
}

// kubeChainPrefix names every chain kube-proxy and the kubelet make.
const kubeChainPrefix = "KUBE-"

// removeKubeChains deletes, in each table of iptables and ip6tables, the
// rules that jump to a KUBE- chain, then those chains: what kube-proxy
// (iptables mode) and the kubelet (its canary and hint chains) add to the
// node's tables. `kube-proxy --cleanup` does the same for its own; the
// kubelet has no such command.
func removeKubeChains() error {
	var errs []error
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin + "-save"); err != nil {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			errs = append(errs, removeKubeChainsIn(bin, table))
		}
	}
	return errors.Join(errs...)
}

func removeKubeChainsIn(bin, table string) error {
	out, err := exec.Command(bin+"-save", "-t", table).Output()
	if err != nil {
		return nil // table absent on this kernel
	}
	var chains, rules []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"+kubeChainPrefix):
			chains = append(chains, strings.Fields(line[1:])[0])
		case strings.HasPrefix(line, "-A ") && !strings.HasPrefix(line, "-A "+kubeChainPrefix) && strings.Contains(line, "-j "+kubeChainPrefix):
			rules = append(rules, line)
		}
	}
	var errs []error
	for _, r := range rules {
		args := append([]string{"-t", table, "-D"}, splitRule(strings.TrimPrefix(r, "-A "))...)
		if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, b))
		}
	}
	for _, c := range chains {
		exec.Command(bin, "-t", table, "-F", c).Run()
	}
	slices.Reverse(chains)
	for _, c := range chains {
		if b, err := exec.Command(bin, "-t", table, "-X", c).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", bin, table, c, err, b))
		}
	}
	return errors.Join(errs...)
}

// splitRule splits an iptables-save rule into arguments, keeping quoted
// comments whole.
func splitRule(s string) []string {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			inQuote, have = !inQuote, true
		case ch == ' ' && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}

// killStray SIGKILLs the cluster's processes that are still there (ours:
// a daemon whose PID file an interrupted run lost, a pod's process whose
// shim is gone), and waits for them to go.
func (c Config) killStray() error {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if c.ours(filepath.Join("/proc", p.Name())) != "" {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	var left []string
	for _, pid := range pids {
		if node.WaitFor(context.Background(), 2*time.Second, func() error {
			if !node.ProcessGone(pid) {
				return errors.New("still there")
			}
			return nil
		}) != nil {
			left = append(left, strconv.Itoa(pid))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("processes still there after SIGKILL: %s", strings.Join(left, ", "))
	}
	return nil
}

// containerLogLinks is where a kubelet links each container's log, always
// (kubelet's kuberuntime.ContainerLogsDir), whatever its podLogsDir.
const containerLogLinks = "/var/log/containers"

// removeLinksInto removes the symbolic links in dir that point under target.
func removeLinksInto(dir, target string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		if to, err := os.Readlink(p); err == nil && strings.HasPrefix(to, target) {
			errs = append(errs, os.Remove(p))
		}
	}
	return errors.Join(errs...)
}
