// Package images builds, offline, the images make cluster preloads into
// containerd: draind's own, draind above pilot-agent (Istio's proxyv2
// layout), the test app and the pause image. Their names are defined here
// once; docs/kubernetes.md lists them for people who apply their own
// manifests to the cluster.
package images

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/draind/draind/e2e/kubelet/internal/ociimage"
	"github.com/draind/draind/internal/testenv/envoysim"
)

// The images' names: imported into containerd's k8s.io namespace, never
// pulled (imagePullPolicy: Never or IfNotPresent).
const (
	// Draind is draind with the root Dockerfile's file capabilities
	// (FileCaps) and envoysim as /usr/local/bin/envoy: the entrypoint
	// image of deploy/classic-sidecar.yaml and deploy/native-sidecar.yaml.
	Draind = "docker.io/draind/draind:dev"
	// ProxyV2 is laid out as Istio's proxyv2 with draind added
	// (deploy/istio/Dockerfile.proxyv2): pilot-agent as its entrypoint,
	// envoysim as /usr/local/bin/envoy, and the iptables binaries that
	// istio-init's `pilot-agent istio-iptables` runs.
	ProxyV2 = "docker.io/draind/proxyv2-draind:dev"
	// TestApp serves HTTP on :8080 when run with no arguments
	// (e2e/kubelet/cmd/testapp).
	TestApp = "docker.io/draind/testapp:dev"
	// LoadClient sends requests at a fixed rate with no retries
	// (e2e/kubelet/cmd/loadclient): the client pod of the rollout
	// measurements. It also holds /usr/local/bin/xdsload
	// (e2e/kubelet/cmd/xdsload), the mesh's client through istiod (issue
	// 45), run with that command.
	LoadClient = "docker.io/draind/loadclient:dev"
	// Pause is the sandbox image.
	Pause = "docker.io/draind/e2e-pause:dev"
)

// FileCaps are the root Dockerfile's DRAIND_FILE_CAPS: permitted only, no
// effective bit (draind raises them itself).
const FileCaps = "cap_bpf,cap_perfmon,cap_net_admin+p"

// Version is what `draind version` prints in these images.
const Version = "e2e-kubelet"

// GoBuild builds a static binary: pkg from the module in dir.
func GoBuild(ctx context.Context, dir, pkg, out string) error {
	// grpcnotrace: as the Makefile's PRODUCT_TAGS builds draind.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", "-X github.com/draind/draind/internal/cli.Version="+Version, "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// Sources says where the binaries come from.
type Sources struct {
	RepoRoot   string // the draind module
	KubeletDir string // the e2e/kubelet module (testapp, pause)
	PilotAgent string // Istio's pilot-agent (tools/peers/pilot-agent.sh); "": no ProxyV2 image
}

// Build builds the binaries into dir and writes one OCI archive per image
// there; it returns the archives' paths.
func Build(ctx context.Context, src Sources, dir string) ([]string, error) {
	bin := func(n string) string { return filepath.Join(dir, n) }
	for _, b := range []struct{ dir, pkg, out string }{
		{src.RepoRoot, "./cmd/draind", bin("draind")},
		{src.RepoRoot, "./internal/testenv/envoysim/cmd/envoysim", bin("envoysim")},
		{src.KubeletDir, "./cmd/testapp", bin("testapp")},
		{src.KubeletDir, "./cmd/pause", bin("pause")},
		{src.KubeletDir, "./cmd/loadclient", bin("loadclient")},
		{src.KubeletDir, "./cmd/xdsload", bin("xdsload")},
	} {
		if err := GoBuild(ctx, b.dir, b.pkg, b.out); err != nil {
			return nil, err
		}
	}
	specs := []ociimage.Spec{
		{
			Ref: Draind,
			Files: []ociimage.File{
				{Src: bin("draind"), Dst: "/usr/local/bin/draind", Caps: FileCaps},
				{Src: bin("envoysim"), Dst: "/usr/local/bin/envoy"},
				// envoysim's config (JSON, which is YAML) where the root
				// Dockerfile's CMD has Envoy read its own.
				{Data: EnvoysimConfig(), Dst: "/etc/envoy/envoy.yaml", Mode: 0o644},
			},
			Dirs: []string{"/tmp"},
			// The root Dockerfile's ENTRYPOINT and CMD.
			Entrypoint: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoy"},
			Cmd:        []string{"-c", "/etc/envoy/envoy.yaml", "--drain-time-s", "45", "--drain-strategy", "immediate", "--disable-hot-restart"},
			User:       "1337",
		},
		{Ref: TestApp, Files: []ociimage.File{{Src: bin("testapp"), Dst: "/usr/local/bin/testapp"}}, Dirs: []string{"/tmp"}, Entrypoint: []string{"/usr/local/bin/testapp"}, User: "1000"},
		{Ref: LoadClient, Files: []ociimage.File{{Src: bin("loadclient"), Dst: "/usr/local/bin/loadclient"}, {Src: bin("xdsload"), Dst: "/usr/local/bin/xdsload"}}, Entrypoint: []string{"/usr/local/bin/loadclient"}, User: "1000"},
		{Ref: Pause, Files: []ociimage.File{{Src: bin("pause"), Dst: "/pause"}}, Entrypoint: []string{"/pause"}, User: "65535"},
	}
	// Without pilot-agent (a cluster without istiod), no ProxyV2.
	if src.PilotAgent != "" {
		proxy, err := proxyV2(src.PilotAgent, bin)
		if err != nil {
			return nil, err
		}
		specs = append(specs, proxy)
	}
	var archives []string
	for i, s := range specs {
		out := filepath.Join(dir, fmt.Sprintf("cluster-image-%d.tar", i))
		if err := ociimage.WriteArchive(out, s, runtime.GOARCH); err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Ref, err)
		}
		archives = append(archives, out)
	}
	return archives, nil
}

// EnvoysimConfig is envoysim's configuration for a sidecar in front of the
// app on :8080: what the ConfigMap envoy-sidecar of deploy/ holds in the
// cluster, in place of deploy/envoy-config.yaml's Envoy configuration.
// It is an Envoy-shaped sidecar: inbound on 15006 to the app, outbound on
// 15001 (e2e/kubelet/testdata has the same for its pods), and inbound on
// [GRPCInboundPort] to the app's gRPC port over HTTP/2.
func EnvoysimConfig() []byte { return EnvoysimConfigOutbound(app) }

// app is the test app's address in its pod.
const app = "127.0.0.1:8080"

// GRPCPort is the test app's gRPC port (testapp --grpc-port) in the
// cluster's pods, and the port of the Services that carry gRPC: an
// injected pod's inbound proxy sends connections to it over HTTP/2, as
// Istio's inbound filter chain for a gRPC Service port does.
const GRPCPort = 9090

// GRPCInboundPort is the deploy/ sidecar's gRPC inbound listener: without
// istio-init's redirect a Service targets the proxy's port itself, so the
// gRPC port has a listener of its own (15006 sends HTTP/1.1 to :8080).
const GRPCInboundPort = 15007

// EnvoysimConfigOutbound is EnvoysimConfig with the outbound listener's
// calls sent to upstream (host:port): a Service the app calls out to.
func EnvoysimConfigOutbound(upstream string) []byte {
	b, _ := json.Marshal(map[string]any{
		"admin_address": "127.0.0.1:15000",
		"listeners": []map[string]any{
			{"name": "virtualInbound", "address": "0.0.0.0:15006", "direction": "inbound", "protocol": "http", "upstream": app},
			{"name": "virtualOutbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": upstream},
			{"name": "inboundGRPC", "address": fmt.Sprintf("0.0.0.0:%d", GRPCInboundPort), "direction": "inbound", "protocol": "http",
				"upstream": fmt.Sprintf("127.0.0.1:%d", GRPCPort), "upstream_protocol": "h2c"},
		},
	})
	return b
}

// proxyV2 is ProxyV2Spec with Debian's iptables (nft backend) and the
// shared libraries and extensions it loads added, for istio-init.
func proxyV2(pilotAgent string, bin func(string) string) (ociimage.Spec, error) {
	tmpl := []byte(proxyV2Bootstrap)
	spec := ProxyV2Spec(ProxyV2, pilotAgent, bin("draind"), bin("envoysim"), tmpl)
	ipt, err := iptablesFiles()
	if err != nil {
		return ociimage.Spec{}, fmt.Errorf("image %s: %w", ProxyV2, err)
	}
	spec.Files = append(spec.Files, ipt...)
	sh, err := shellFiles()
	if err != nil {
		return ociimage.Spec{}, fmt.Errorf("image %s: %w", ProxyV2, err)
	}
	spec.Files = append(spec.Files, sh...)
	spec.Dirs = append(spec.Dirs, "/run/xtables")
	spec.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return spec, nil
}

// proxyV2Bootstrap is envoysim's config as the image's bootstrap template:
// pilot-agent renders it as it renders Envoy's, so the stats matcher is the
// one Istio's bootstrap gives Envoy (envoysim.IstioStatsTemplate): no
// listener counter exists unless the mesh or the pod asks for it, as on a
// real Istio pod.
//
// The listeners: inbound to the app (HTTP/1.1 to :8080, and HTTP/2 to the
// app's gRPC port for a connection to [GRPCPort], as Istio's per-port
// inbound filter chains), outbound where the app sent its calls
// (istio-init's REDIRECT, then the original destination, as Envoy's
// PassthroughCluster: the pod's calls out are what the drain must keep
// working), and Envoy's readiness listener to pilot-agent.
var proxyV2Bootstrap = `{
  "admin_address": "127.0.0.1:15000",
  "xds": true,
  ` + envoysim.IstioStatsTemplate + `,
  "listeners": [
    {"name": "virtualInbound", "address": "0.0.0.0:15006", "direction": "inbound", "protocol": "http", "upstream": "` + app + `",
     "filter_chains": [{"destination_port": ` + strconv.Itoa(GRPCPort) + `, "upstream": "127.0.0.1:` + strconv.Itoa(GRPCPort) + `", "upstream_protocol": "h2c"}]},
    {"name": "virtualOutbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": "original_dst"},
    {"name": "0.0.0.0_15021", "address": "0.0.0.0:15021", "protocol": "http", "upstream": "127.0.0.1:15020"}
  ]
}
`

// ProxyV2Spec is Istio's proxyv2 image's layout with draind added (what
// deploy/istio/Dockerfile.proxyv2 makes): pilot-agent as the entrypoint,
// envoysim as /usr/local/bin/envoy, Envoy's bootstrap template (envoysim's
// config, which pilot-agent renders unchanged), draind with FileCaps, the
// directories Istio's injected volumes mount on, uid 1337.
func ProxyV2Spec(ref, pilotAgent, draind, envoysim string, bootstrap []byte) ociimage.Spec {
	return ociimage.Spec{
		Ref: ref,
		Files: []ociimage.File{
			{Src: draind, Dst: "/usr/local/bin/draind", Caps: FileCaps},
			{Src: pilotAgent, Dst: "/usr/local/bin/pilot-agent"},
			{Src: envoysim, Dst: "/usr/local/bin/envoy"},
			{Data: bootstrap, Dst: "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json", Mode: 0o644},
		},
		Dirs:       []string{"/tmp", "/etc/istio/proxy", "/etc/istio/pod", "/var/lib/istio/data", "/var/run/secrets/istio", "/var/run/secrets/tokens"},
		Entrypoint: []string{"/usr/local/bin/pilot-agent"}, // proxyv2's
		User:       "1337",
	}
}

// The shell and netstat of the preStop loop the usual recipe gives the
// proxy (README.md, "Why"), as Istio's proxyv2 images (Ubuntu-based) carry
// them: Debian's dash as /bin/sh, net-tools' netstat, busybox for the
// tools the loop pipes through. Not busybox's sh: it runs its own netstat
// applet, which has no -p.
const (
	dash    = "/bin/dash"
	busybox = "/bin/busybox"
	netstat = "/bin/netstat"
)

var busyboxLinks = []string{"grep", "wc", "sleep", "xargs", "cat"}

// shellFiles are /bin/sh, the tools the loop pipes through, and netstat
// with the libraries they load.
func shellFiles() ([]ociimage.File, error) {
	for _, b := range []string{dash, busybox, netstat} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("the recipe's preStop loop needs %s: %w (apt-get install dash busybox-static net-tools)", b, err)
		}
	}
	libs, err := sharedLibs(dash, netstat)
	if err != nil {
		return nil, err
	}
	files := []ociimage.File{{Src: dash, Dst: "/bin/sh"}, {Src: netstat, Dst: "/bin/netstat"}}
	for _, l := range busyboxLinks {
		files = append(files, ociimage.File{Src: busybox, Dst: "/bin/" + l})
	}
	for _, f := range libs {
		files = append(files, ociimage.File{Src: f, Dst: f})
	}
	return files, nil
}

// iptablesMulti is Debian's iptables (nft backend): one binary, named by
// the links istio-iptables looks for.
const iptablesMulti = "/usr/sbin/xtables-nft-multi"

var iptablesLinks = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore"}

func iptablesFiles() ([]ociimage.File, error) {
	if _, err := os.Stat(iptablesMulti); err != nil {
		return nil, fmt.Errorf("istio-init needs iptables: %w (apt-get install iptables)", err)
	}
	exts, _ := filepath.Glob("/usr/lib/*-linux-gnu/xtables/*.so")
	libs, err := sharedLibs(append([]string{iptablesMulti}, exts...)...)
	if err != nil {
		return nil, err
	}
	var files []ociimage.File
	for _, l := range iptablesLinks {
		files = append(files, ociimage.File{Src: iptablesMulti, Dst: "/usr/sbin/" + l})
	}
	for _, f := range append(exts, libs...) {
		files = append(files, ociimage.File{Src: f, Dst: f})
	}
	for _, f := range []string{"/etc/protocols", "/etc/ethertypes"} {
		if _, err := os.Stat(f); err == nil {
			files = append(files, ociimage.File{Src: f, Dst: f, Mode: 0o644})
		}
	}
	return files, nil
}

// sharedLibs lists the libraries the binaries load (ldd), the loader among
// them, each once, by their resolved paths.
func sharedLibs(bins ...string) ([]string, error) {
	seen := map[string]bool{}
	var libs []string
	for _, b := range bins {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", b, err)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			f := strings.Fields(line)
			var p string
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				p = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				p = f[0]
			}
			if p == "" || seen[p] {
				continue
			}
			seen[p] = true
			libs = append(libs, p)
		}
	}
	return libs, nil
}
