package node

import (
	"fmt"
	"path/filepath"
)

// Config places a private node: containerd on its own socket and root,
// a standalone kubelet on non-default ports, a CNI bridge on a test
// range, and every file under two directories of its own.
type Config struct {
	Kubelet    string // kubelet binary
	StateDir   string // sockets, manifests, CNI conf, pod scratch dirs: /run/draind-e2e
	DataDir    string // containerd's root, the kubelet's root and pod logs: /var/lib/draind-e2e
	NodeName   string // static pods are named NAME-NodeName
	Bridge     string // the CNI bridge
	Subnet     string // pod addresses (198.18.0.0/24, RFC 2544's benchmarking range)
	Gateway    string // the bridge's address on the host
	PauseImage string // the sandbox image (imported before the first pod)
	CgroupRoot string // the kubelet's cgroup root, removed at teardown
	LogDir     string // where Close leaves the daemons' logs
	PortBase   int    // kubelet ports: PortBase+250 (API), +255 (read-only), +248 (healthz)
	Logf       func(format string, args ...any)
	// Detach leaves the daemons running when this process exits (make
	// cluster: a cluster that outlives the command that started it, and
	// that make cluster-down stops); otherwise they die with it.
	Detach bool
	// API, when set, registers the kubelet as a node of that API server
	// (make cluster) instead of running it standalone.
	API *APIAccess
}

// APIAccess is what a kubelet needs to join a cluster.
type APIAccess struct {
	KubeConfig   string // the kubelet's client credentials (system:node:NodeName)
	ClientCAFile string // the CA of the clients it serves (the API server's)
	NodeIP       string // the node's address: the kubelet serves there
	ClusterDNS   string // the cluster DNS Service's ClusterIP: its pods' nameserver ("": none)
}

// DefaultConfig is what make e2e-kubelet uses.
func DefaultConfig(kubelet string) Config {
	return Config{
		Kubelet:    kubelet,
		StateDir:   "/run/draind-e2e",
		DataDir:    "/var/lib/draind-e2e",
		NodeName:   "draind-e2e",
		Bridge:     "draindk0",
		Subnet:     "198.18.0.0/24",
		Gateway:    "198.18.0.1",
		PauseImage: "docker.io/draind/e2e-pause:dev",
		CgroupRoot: "/draind-e2e",
		LogDir:     "/tmp/draind-e2e-logs",
		PortBase:   11000,
		Logf:       func(string, ...any) {},
	}
}

func (c Config) socket() string         { return filepath.Join(c.StateDir, "containerd.sock") }
func (c Config) manifestDir() string    { return filepath.Join(c.StateDir, "manifests") }
func (c Config) cniConfDir() string     { return filepath.Join(c.StateDir, "cni", "net.d") }
func (c Config) containerdRoot() string { return filepath.Join(c.DataDir, "containerd") }
func (c Config) kubeletRoot() string    { return filepath.Join(c.DataDir, "kubelet") }
func (c Config) podLogsDir() string     { return filepath.Join(c.DataDir, "pod-logs") }
func (c Config) runcRoot() string       { return filepath.Join(c.StateDir, "runc") }

// ReadOnlyURL is the kubelet's unauthenticated endpoint (/pods, /metrics/probes).
func (c Config) ReadOnlyURL() string { return fmt.Sprintf("http://127.0.0.1:%d", c.PortBase+255) }

func (c Config) healthzURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/healthz", c.PortBase+248)
}

// containerdConfig is containerd 1.6's config (version 2): the CRI plugin
// with runc under the cgroupfs driver (cgroup v1 here, v2 in make
// e2e-kubelet-vm: runc picks the hierarchy it finds), the
// local pause image, and CNI from a private conf dir.
func (c Config) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[debug]
  level = "debug"

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # The sandbox's oom_score_adj is -998 unless restricted to containerd's
  # own: root here lacks CAP_SYS_RESOURCE and may not lower it.
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not /var/run/netns: the
  # sweep finds and unmounts them after an interrupted run.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
    max_conf_num = 1
`, c.containerdRoot(), filepath.Join(c.StateDir, "containerd"), c.socket(), c.socket()+".ttrpc",
		filepath.Join(c.containerdRoot(), "opt"), c.PauseImage, c.cniConfDir(), c.runcRoot())
}

// cniConfig is a bridge with host-local IPAM; the host is the gateway, so
// the tests reach pods (and pods the host's upstream) without NAT. In a
// cluster the pods also get a default route through it: a Service's
// ClusterIP is no address of the bridge's subnet, and kube-proxy's DNAT
// happens as the node routes it.
func (c Config) cniConfig() string {
	routes := ""
	if c.API != nil {
		routes = `
        "routes": [{"dst": "0.0.0.0/0"}],`
	}
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "draind-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[1]q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[2]q, "gateway": %[3]q}]],%[5]s
        "dataDir": %[4]q
      }
    }
  ]
}
`, c.Bridge, c.Subnet, c.Gateway, filepath.Join(c.StateDir, "cni", "ipam"), routes)
}

// kubeletConfig is a standalone kubelet: static pods from a directory, no
// API server, anonymous access on loopback, cgroupfs (on cgroup v1, or the
// unified hierarchy of make e2e-kubelet-vm), no
// swap check, no image GC or disk eviction that could remove the
// imported images. With API set, the same kubelet joins make cluster.
func (c Config) kubeletConfig() string {
	// Standalone: anonymous access on loopback, every request allowed.
	access := `address: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}`
	if a := c.API; a != nil {
		// make cluster's kubelet, registered with the API server, which it
		// authenticates (x509 from ClientCAFile, bearer tokens by
		// TokenReview) and asks to authorize (SubjectAccessReview), on the
		// node's address; its status every 4 s (the default 10 s slows
		// Ready). Its ClusterFirst pods ask ClusterDNS, searching their
		// namespace's Services.
		dns := ""
		if a.ClusterDNS != "" {
			dns = fmt.Sprintf("\nclusterDNS: [%q]", a.ClusterDNS)
		}
		access = fmt.Sprintf(`address: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
clusterDomain: cluster.local%s
nodeStatusUpdateFrequency: 4s`, a.NodeIP, a.ClientCAFile, dns)
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %[1]q
fileCheckFrequency: 1s
syncFrequency: 10s
%[8]s
port: %[2]d
readOnlyPort: %[3]d
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
cgroupDriver: cgroupfs
cgroupRoot: %[5]q
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[6]s
podLogsDir: %[7]q
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
localStorageCapacityIsolation: false
oomScoreAdj: 0
enforceNodeAllocatable: []
`, c.manifestDir(), c.PortBase+250, c.PortBase+255, c.PortBase+248, c.CgroupRoot, c.socket(), c.podLogsDir(), access)
}
