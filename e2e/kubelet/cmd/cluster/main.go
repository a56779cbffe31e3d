// Command cluster starts and stops make cluster's single-node Kubernetes
// cluster (package cluster): `cluster up` returns once the node is Ready,
// the cluster's DNS answers and istiod's webhook answers, leaving every
// component running, and prints the KUBECONFIG to use; `cluster down`
// removes all of it. hack/cluster.sh builds what it runs and calls it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/cluster"
	"github.com/draind/draind/e2e/kubelet/internal/images"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: cluster up|down [flags]")}
	}
	cfg := cluster.DefaultConfig()
	fs := flag.NewFlagSet("cluster "+args[0], flag.ContinueOnError)
	fs.StringVar(&cfg.K8sDir, "k8s-dir", "", "directory of kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet and kubectl (hack/build-k8s.sh)")
	fs.StringVar(&cfg.Etcd, "etcd", "", "etcd binary (hack/build-etcd.sh)")
	fs.StringVar(&cfg.CoreDNS, "coredns", "", "coredns binary, the cluster's DNS (hack/build-coredns.sh)")
	fs.StringVar(&cfg.Istiod, "istiod", "", "pilot-discovery binary (tools/peers/pilot-agent.sh pilot-discovery); empty: no istiod")
	fs.StringVar(&cfg.Istioctl, "istioctl", "", "istioctl binary, to render Istio's charts")
	pilotAgent := fs.String("pilot-agent", "", "pilot-agent binary, for the proxyv2 image")
	var values listFlag
	fs.Var(&values, "istio-values", "IstioOperator file for `istioctl manifest generate -f` (repeatable, in order)")
	fs.DurationVar(&cfg.ProxySyncPeriod, "proxy-sync-period", cfg.ProxySyncPeriod, "kube-proxy's --iptables-min-sync-period")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{err}
	}
	cfg.IstioValues = values
	switch args[0] {
	case "down":
		return cluster.Down(cfg)
	case "up":
	default:
		return usageError{fmt.Errorf("unknown command %q: up or down", args[0])}
	}
	for name, v := range map[string]string{"--k8s-dir": cfg.K8sDir, "--etcd": cfg.Etcd, "--coredns": cfg.CoreDNS} {
		if v == "" {
			return usageError{fmt.Errorf("%s is required", name)}
		}
	}
	if cfg.Istiod != "" && (cfg.Istioctl == "" || *pilotAgent == "") {
		return usageError{errors.New("--istiod needs --istioctl and --pilot-agent")}
	}
	cfg.Node.Kubelet = filepath.Join(cfg.K8sDir, "kubelet")
	cfg.Node.Logf = func(format string, a ...any) { fmt.Fprintf(stdout, "cluster: "+format+"\n", a...) }

	t0 := time.Now()
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	imgDir, err := os.MkdirTemp("", "draind-cluster-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(imgDir)
	if cfg.Images, err = images.Build(ctx, images.Sources{RepoRoot: filepath.Join(wd, "../.."), KubeletDir: wd, PilotAgent: *pilotAgent}, imgDir); err != nil {
		return err
	}
	cfg.Node.Logf("phase %-24s %s", "images", time.Since(t0).Round(time.Millisecond))
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cluster: up in %s; node %s at %s; cluster DNS at %s; images %s, %s, %s\n",
		time.Since(t0).Round(time.Millisecond), c.Config.Node.NodeName, c.NodeIP, c.DNSServiceIP(), images.Draind, images.ProxyV2, images.TestApp)
	var total int64
	var parts []string
	rss := c.RSS()
	for _, name := range slices.Sorted(maps.Keys(rss)) {
		total += rss[name]
		parts = append(parts, fmt.Sprintf("%s %d", name, rss[name]>>20))
	}
	fmt.Fprintf(stdout, "cluster: RSS %d MiB (%s MiB)\n", total>>20, strings.Join(parts, ", "))
	fmt.Fprintf(stdout, "export KUBECONFIG=%s\n", cfg.KubeConfig())
	return nil
}
