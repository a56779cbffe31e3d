package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/draind/draind/e2e/kubelet/internal/cluster"
	"github.com/draind/draind/e2e/kubelet/internal/images"
)

// The cluster tests (cluster_test.go) run only under `make e2e-cluster`
// (DRAIND_E2E_CLUSTER=1, as root, the binaries hack/cluster.sh builds in
// the environment): TestMain starts a cluster as make cluster does, runs
// the tests, removes it, and fails the run if the removal left anything
// of the inventory (internal/cluster/inventory.go).
const clusterEnableVar = "DRAIND_E2E_CLUSTER"

var (
	theCluster *cluster.Cluster
	kube       *kubernetes.Clientset
	clusterErr error
)

// clusterLogDir keeps the components' logs of the last run.
const clusterLogDir = "/tmp/draind-e2e-cluster-logs"

func clusterConfig() (cluster.Config, error) {
	cfg := cluster.DefaultConfig()
	for _, v := range []struct {
		dst *string
		env string
	}{
		{&cfg.K8sDir, "DRAIND_CLUSTER_K8S_DIR"}, {&cfg.Etcd, "DRAIND_CLUSTER_ETCD"}, {&cfg.CoreDNS, "DRAIND_CLUSTER_COREDNS"},
	} {
		if *v.dst = os.Getenv(v.env); *v.dst == "" {
			return cfg, fmt.Errorf("%s is not set: run the cluster tests with `sudo make e2e-cluster`", v.env)
		}
	}
	// hack/cluster.sh sets both; without them (a developer's run) the
	// cluster has no istiod and the Istio tests fail saying so.
	cfg.Istiod, cfg.Istioctl = os.Getenv("DRAIND_CLUSTER_ISTIOD"), os.Getenv("DRAIND_ISTIOCTL")
	cfg.Node.Kubelet = filepath.Join(cfg.K8sDir, "kubelet")
	cfg.IstioValues = []string{filepath.Join(repoRoot, "deploy/istio/injection-template.yaml"), "testdata/cluster/istio-values.yaml"}
	cfg.Node.Logf = func(format string, args ...any) { fmt.Printf("e2e-cluster: "+format+"\n", args...) }
	if d := os.Getenv("DRAIND_CLUSTER_PROXY_SYNC"); d != "" {
		p, err := time.ParseDuration(d)
		if err != nil {
			return cfg, fmt.Errorf("DRAIND_CLUSTER_PROXY_SYNC: %w", err)
		}
		cfg.ProxySyncPeriod = p
	}
	return cfg, nil
}

// runWithCluster is TestMain's path under make e2e-cluster.
func runWithCluster(m interface{ Run() int }) int {
	if os.Geteuid() != 0 {
		clusterErr = fmt.Errorf("%s=1 needs root", clusterEnableVar)
		return m.Run()
	}
	cfg, err := clusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
		return 1
	}
	ctx := context.Background()
	var dir string
	if dir, err = os.MkdirTemp("", "draind-e2e-cluster-"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	t0 := time.Now()
	if cfg.Images, err = images.Build(ctx, images.Sources{RepoRoot: repoRoot, KubeletDir: mustAbs("."), PilotAgent: pilotAgentBinary()}, dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster: images:", err)
		return 1
	}
	report.add("phase", "cluster images", time.Since(t0).Round(time.Millisecond).String())
	before := cfg.Snapshot()
	t0 = time.Now()
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster: up:", err)
		keepClusterLogs(cfg)
		cluster.Down(cfg)
		return 1
	}
	report.add("phase", "cluster up (to istiod's webhook)", time.Since(t0).Round(time.Millisecond).String())
	var total int64
	for name, rss := range c.RSS() {
		total += rss
		report.add("rss", name, fmt.Sprintf("%d MiB", rss>>20))
	}
	report.add("rss", "cluster total (after up)", fmt.Sprintf("%d MiB", total>>20))
	theCluster = c
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.KubeConfig())
	if err == nil {
		// Not client-go's 5 requests a second: bench-rollout deletes 40
		// pods at once and streams their logs (they would go over 8 s).
		rc.QPS, rc.Burst = 200, 400
		kube, err = kubernetes.NewForConfig(rc)
	}
	if err != nil {
		clusterErr = err
	}
	code := m.Run()
	keepClusterLogs(cfg)
	t0 = time.Now()
	if err := cluster.Down(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster: down:", err)
		code = 1
	}
	report.add("phase", "cluster down", time.Since(t0).Round(time.Millisecond).String())
	// Acceptance: after cluster-down nothing the cluster made is left.
	if left := cfg.Snapshot().Leftovers(before); len(left) > 0 {
		fmt.Printf("--- FAIL: cluster down left %d things behind:\n  %s\n", len(left), strings.Join(left, "\n  "))
		code = 1
	} else {
		fmt.Println("--- PASS: cluster down left nothing (processes, mounts, links, netns, iptables, paths, sysctls, cgroups)")
	}
	for _, p := range c.Phases {
		report.add("phase", "cluster "+p.Name, p.Took.Round(time.Millisecond).String())
	}
	report.print(os.Stdout, nil)
	return code
}

// keepClusterLogs copies the components' logs where a failed run can be
// read (outside the cluster's own places: the test's output, not the
// cluster's).
func keepClusterLogs(cfg cluster.Config) {
	os.RemoveAll(clusterLogDir)
	os.MkdirAll(clusterLogDir, 0o755)
	logs, _ := filepath.Glob(filepath.Join(cfg.StateDir, "*.log"))
	nodeLogs, _ := filepath.Glob(filepath.Join(cfg.Node.StateDir, "*.log"))
	logs = append(logs, nodeLogs...)
	for _, l := range logs {
		exec.Command("cp", l, clusterLogDir).Run()
	}
}
