package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// The daemons' CPU weight, as on a real node. systemd runs the kubelet
// and containerd (whose shims and runc follow it) in system.slice, a
// sibling of kubepods.slice: under contention the pods, all together, get
// kubepods' weight (cpu.shares 2048 on 2 CPUs, the kubelet's) against the
// daemons' 1024. Started from this process, the daemons sat in the root
// cgroup, where each of their busy threads weighed as much as every pod
// together: 40 drains at once, which keep the kubelet, containerd and
// kube-apiserver busy, then starved the pods (a pod's connections
// unanswered for seconds; docs/benchmarks.md, "A rollout under load in a
// real cluster").
const (
	// systemCgroup is the daemons' cgroup under the node's cgroup root.
	systemCgroup = "system"
	// systemShares is systemd's default for system.slice.
	systemShares = 1024
)

// placeDaemons moves each recorded daemon into CgroupRoot/system in the
// cgroup v1 cpu hierarchy; the processes they start afterwards follow.
// The node's sweep removes the cgroup with the rest of the root. On the
// unified hierarchy alone it does nothing: the daemons stay where they
// started.
func (c Config) placeDaemons() error {
	if node.UnifiedOnly() {
		return nil
	}
	dir := filepath.Join("/sys/fs/cgroup/cpu", c.Node.CgroupRoot, systemCgroup)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("the daemons' cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.Itoa(systemShares)), 0o644); err != nil {
		return fmt.Errorf("the daemons' cgroup: %w", err)
	}
	for name, pid := range c.daemonPIDs() {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0o644); err != nil {
			return fmt.Errorf("move %s into %s: %w", name, dir, err)
		}
	}
	return nil
}
