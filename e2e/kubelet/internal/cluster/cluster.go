// Package cluster runs a single-node Kubernetes cluster on this machine,
// every component a plain process as kubernetes' local-up-cluster script
// runs them: etcd, kube-apiserver (TLS, RBAC, admission webhooks),
// kube-controller-manager, kube-scheduler, CoreDNS (the cluster's DNS,
// behind the Service kube-dns), the node (containerd and a kubelet
// registered with the API server: package node), kube-proxy in iptables
// mode, and istiod (pilot-discovery) with its sidecar-injection webhook
// registered from Istio's own rendered charts.
//
// # Lifetime
//
// Up starts it and returns once the node is Ready, the cluster's DNS
// answers through its Service and istiod's webhook answers; with
// Config.Node.Detach its processes outlive the caller (make cluster).
// Down stops what Up made, from the same Config in any process (make
// cluster-down): every process it recorded, its pods' sandboxes,
// mounts, network namespaces, the CNI bridge, the iptables chains of
// kube-proxy and the kubelet, the sysctls it changed (restored), its
// cgroups and its directories. Inventory lists what Down must leave gone,
// for the test that checks it.
//
// # Addresses
//
// Nothing here is reached from outside the machine: pods on 198.18.64.0/24,
// Services on 198.18.128.0/24 (RFC 2544's benchmarking range), the API
// server, CoreDNS and istiod on the node's own address.
package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// Config places the cluster. DefaultConfig fills it.
type Config struct {
	StateDir    string      // certificates, kubeconfigs, the components' logs and PIDs: /run/draind-cluster
	DataDir     string      // etcd's data: /var/lib/draind-cluster
	Node        node.Config // containerd and the kubelet (package node, in StateDir/node and DataDir/node); Detach and API set by Up
	K8sDir      string      // kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubectl (hack/build-k8s.sh)
	Etcd        string      // etcd (hack/build-etcd.sh)
	CoreDNS     string      // coredns (hack/build-coredns.sh): the cluster's DNS
	Istiod      string      // pilot-discovery ("": no istiod)
	Istioctl    string      // istioctl, to render Istio's charts (needed with Istiod)
	IstioValues []string    // IstioOperator files for `istioctl manifest generate -f`, in order
	Images      []string    // OCI archives imported into containerd before the kubelet starts
	ServiceCIDR string
	APIPort     int
	EtcdPort    int // client; +1 peer, +2 metrics
	// ProxySyncPeriod is kube-proxy's --iptables-min-sync-period: how soon
	// a removed endpoint leaves the rules (Kubernetes' default 1 s).
	ProxySyncPeriod time.Duration
}

// Ports of the other components, on loopback; none is a default port of
// its own, so that a cluster elsewhere on the machine does not collide.
const (
	controllerManagerPort = 12257
	schedulerPort         = 12259
	proxyHealthzPort      = 12256
	proxyMetricsPort      = 12249
	istiodHTTPPort        = 12080 // istiod's debug and /ready
	istiodWebhookPort     = 15017 // istiod's HTTPS: the injection webhook
)

// DefaultConfig is make cluster's: its own directories, bridge, node name
// and cgroup root, apart from make e2e-kubelet's node.
func DefaultConfig() Config {
	const state, data = "/run/draind-cluster", "/var/lib/draind-cluster"
	n := node.DefaultConfig("")
	n.StateDir = filepath.Join(state, "node")
	n.DataDir = filepath.Join(data, "node")
	n.NodeName = "draind-node"
	n.Bridge = "draindc0"
	n.Subnet = "198.18.64.0/24"
	n.Gateway = "198.18.64.1"
	n.CgroupRoot = "/draind-cluster"
	n.LogDir = "" // make cluster-down leaves nothing; the tests keep the logs of a failed run
	n.PortBase = 12000
	return Config{
		StateDir:        state,
		DataDir:         data,
		Node:            n,
		ServiceCIDR:     "198.18.128.0/24",
		APIPort:         16443,
		EtcdPort:        12379,
		ProxySyncPeriod: time.Second,
	}
}

func (c Config) pkiDir() string             { return filepath.Join(c.StateDir, "pki") }
func (c Config) kubeconfig(n string) string { return filepath.Join(c.StateDir, n+".kubeconfig") }

// daemons is where the control plane's processes keep their logs and
// PIDs (package node's StartDaemon): the cluster's StateDir, which the
// node's own sweep does not touch.
func (c Config) daemons() node.Config {
	d := c.Node
	d.StateDir, d.DataDir, d.Detach = c.StateDir, c.DataDir, true
	return d
}

// KubeConfig is the administrator's kubeconfig (system:masters).
func (c Config) KubeConfig() string { return c.kubeconfig("admin") }

// Kubectl is the kubectl built with the components.
func (c Config) Kubectl() string { return filepath.Join(c.K8sDir, "kubectl") }

func (c Config) bin(name string) string { return filepath.Join(c.K8sDir, name) }

// daemonNames are the processes Up starts, in order.
var daemonNames = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "coredns", "containerd", "kubelet", "kube-proxy", "pilot-discovery"}

// Cluster is a running cluster.
type Cluster struct {
	Config
	// NodeIP is the node's address: the API server's, the kubelet's,
	// CoreDNS's and istiod's (the endpoint of the Services kube-dns and
	// istiod).
	NodeIP string
	Node   *node.Node
	Phases []node.Phase
	admin  *http.Client // the administrator's, once the API server is up
}

func (c *Cluster) phase(name string, t0 time.Time) {
	d := time.Since(t0)
	c.Phases = append(c.Phases, node.Phase{Name: name, Took: d})
	c.Config.Node.Logf("phase %-24s %s", name, d.Round(time.Millisecond))
}

// Up starts the cluster. It first removes what an earlier cluster of the
// same Config left. On error everything it started is removed.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Node.Logf == nil {
		cfg.Node.Logf = func(string, ...any) {}
	}
	c := &Cluster{Config: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, Down(cfg))
		}
	}()
	t0 := time.Now()
	if err := Down(cfg); err != nil {
		return nil, fmt.Errorf("remove an earlier cluster: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, err
	}
	if c.NodeIP, err = node.Address(); err != nil {
		return nil, err
	}
	if err := recordAndSet(cfg); err != nil {
		return nil, err
	}
	apiIPs := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(c.NodeIP), firstServiceIP(cfg.ServiceCIDR)}
	apiNames := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	p, err := makePKI(cfg.pkiDir(), cfg.Node.NodeName, apiIPs, apiNames)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	server := fmt.Sprintf("https://%s:%d", c.NodeIP, cfg.APIPort)
	for _, id := range clientIdentities(cfg.Node.NodeName) {
		if err := p.kubeconfig(cfg.kubeconfig(id.file), server, id.file); err != nil {
			return nil, err
		}
	}
	c.phase("certificates", t0)

	if err := c.startControlPlane(ctx, p); err != nil {
		return nil, err
	}

	t0 = time.Now()
	if err := c.startDNS(ctx); err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	c.phase("CoreDNS", t0)

	t0 = time.Now()
	ncfg := cfg.Node
	ncfg.Detach = true
	ncfg.API = &node.APIAccess{KubeConfig: cfg.kubeconfig("kubelet"), ClientCAFile: p.path("ca.crt"), NodeIP: c.NodeIP, ClusterDNS: cfg.DNSServiceIP()}
	c.Config.Node = ncfg
	if c.Node, err = node.Start(ctx, ncfg); err != nil {
		return nil, err
	}
	if err := c.Node.Import(ctx, cfg.Images...); err != nil {
		return nil, err
	}
	if err := c.Node.StartKubelet(ctx); err != nil {
		return nil, err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return nil, err
	}
	c.phase("node Ready", t0)

	t0 = time.Now()
	if err := c.startKubeProxy(ctx); err != nil {
		return nil, err
	}
	c.phase("kube-proxy", t0)

	t0 = time.Now()
	if err := c.waitDNSService(ctx); err != nil {
		return nil, err
	}
	c.phase("DNS through kube-dns", t0)

	if cfg.Istiod != "" {
		t0 = time.Now()
		if err := c.startIstiod(ctx); err != nil {
			return nil, fmt.Errorf("istiod: %w", err)
		}
		c.phase("istiod and its webhook", t0)
	}
	if err := cfg.placeDaemons(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startControlPlane(ctx context.Context, p *pki) error {
	cfg := c.Config
	dcfg := cfg.daemons()
	t0 := time.Now()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", cfg.EtcdPort)
	if _, err := node.StartDaemon(dcfg, "etcd", cfg.Etcd,
		"--name", "draind",
		"--data-dir", filepath.Join(cfg.DataDir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", cfg.EtcdPort+1),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", cfg.EtcdPort+1),
		"--initial-cluster", fmt.Sprintf("draind=http://127.0.0.1:%d", cfg.EtcdPort+1),
		"--listen-metrics-urls", fmt.Sprintf("http://127.0.0.1:%d", cfg.EtcdPort+2),
		// A test cluster: losing its data at a power cut is fine, and
		// fsync on a shared disk slows every write.
		"--unsafe-no-fsync",
	); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "etcd", dcfg, http.DefaultClient, etcdURL+"/health", 30*time.Second); err != nil {
		return err
	}
	c.phase("etcd", t0)

	t0 = time.Now()
	if _, err := node.StartDaemon(dcfg, "kube-apiserver", cfg.bin("kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "0.0.0.0",
		"--secure-port", strconv.Itoa(cfg.APIPort),
		"--advertise-address", c.NodeIP,
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--service-account-key-file", p.path("sa.pub"),
		"--service-account-signing-key-file", p.path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
		"--service-cluster-ip-range", cfg.ServiceCIDR,
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types", "InternalIP",
		// Webhooks by their Service's endpoints, not its ClusterIP: the
		// API server does not wait for kube-proxy to reach istiod.
		"--enable-aggregator-routing=true",
		"--allow-privileged=true",
		"--profiling=false",
	); err != nil {
		return err
	}
	admin, err := c.AdminHTTP()
	if err != nil {
		return err
	}
	c.admin = admin
	if err := waitHTTP(ctx, "kube-apiserver", dcfg, admin, fmt.Sprintf("https://127.0.0.1:%d/readyz", cfg.APIPort), 90*time.Second); err != nil {
		return err
	}
	c.phase("kube-apiserver", t0)

	t0 = time.Now()
	cm := cfg.kubeconfig("controller-manager")
	if _, err := node.StartDaemon(dcfg, "kube-controller-manager", cfg.bin("kube-controller-manager"),
		"--kubeconfig", cm, "--authentication-kubeconfig", cm, "--authorization-kubeconfig", cm,
		"--use-service-account-credentials",
		"--controllers", "*",
		"--root-ca-file", p.path("ca.crt"),
		"--service-account-private-key-file", p.path("sa.key"),
		"--cluster-signing-cert-file", p.path("ca.crt"), "--cluster-signing-key-file", p.path("ca.key"),
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(controllerManagerPort),
		"--leader-elect=false",
	); err != nil {
		return err
	}
	sched := cfg.kubeconfig("scheduler")
	if _, err := node.StartDaemon(dcfg, "kube-scheduler", cfg.bin("kube-scheduler"),
		"--kubeconfig", sched, "--authentication-kubeconfig", sched, "--authorization-kubeconfig", sched,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedulerPort),
		"--leader-elect=false",
	); err != nil {
		return err
	}
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for name, port := range map[string]int{"kube-controller-manager": controllerManagerPort, "kube-scheduler": schedulerPort} {
		if err := waitHTTP(ctx, name, dcfg, insecure, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), 60*time.Second); err != nil {
			return err
		}
	}
	c.phase("controllers and scheduler", t0)
	return nil
}

// AdminHTTP is an HTTP client with the administrator's certificate.
func (c Config) AdminHTTP() (*http.Client, error) {
	p := &pki{dir: c.pkiDir()}
	cert, err := tls.LoadX509KeyPair(p.path("admin.crt"), p.path("admin.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}}}, nil
}

func (c *Cluster) startKubeProxy(ctx context.Context) error {
	cfg := c.Config
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %q
mode: iptables
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
clusterCIDR: %q
iptables: {minSyncPeriod: %s, syncPeriod: 30s}
# The node's conntrack settings are left as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
`, cfg.kubeconfig("kube-proxy"), cfg.Node.NodeName, proxyHealthzPort, proxyMetricsPort, cfg.Node.Subnet, cfg.ProxySyncPeriod)
	path := filepath.Join(cfg.StateDir, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	if _, err := node.StartDaemon(cfg.daemons(), "kube-proxy", cfg.bin("kube-proxy"), "--config", path, "--v", "2"); err != nil {
		return err
	}
	return waitHTTP(ctx, "kube-proxy", cfg.daemons(), &http.Client{Timeout: 2 * time.Second}, fmt.Sprintf("http://127.0.0.1:%d/healthz", proxyHealthzPort), 60*time.Second)
}

// KubectlCmd runs kubectl as the administrator and returns its standard
// output; stdin may be nil.
func (c Config) KubectlCmd(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Kubectl(), append([]string{"--kubeconfig", c.KubeConfig()}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	name := c.Config.Node.NodeName
	err := node.WaitFor(ctx, 120*time.Second, func() error {
		var n struct {
			Status struct {
				Conditions []struct{ Type, Status string }
			}
		}
		if err := c.getJSON(ctx, "/api/v1/nodes/"+name, &n); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready", name)
	})
	if err != nil {
		return fmt.Errorf("%w (kubelet log: %s)", err, node.Tail(filepath.Join(c.Config.Node.StateDir, "kubelet.log")))
	}
	return nil
}

// waitHTTP waits until url answers 200, at most d; on failure the error
// carries the end of the daemon name's log.
func waitHTTP(ctx context.Context, name string, cfg node.Config, hc *http.Client, url string, d time.Duration) error {
	err := node.WaitFor(ctx, d, func() error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s not healthy after %s: %w (log: %s)", name, d, err, node.Tail(filepath.Join(cfg.StateDir, name+".log")))
	}
	return nil
}

// getJSON decodes the API server's answer to GET path, as the administrator.
func (c *Cluster) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.APIPort, path), nil)
	if err != nil {
		return err
	}
	resp, err := c.admin.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// firstServiceIP is the Service kubernetes' ClusterIP.
func firstServiceIP(cidr string) net.IP { return serviceIP(cidr, 1) }
