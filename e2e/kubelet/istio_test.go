package kubelet_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/e2e/kubelet/internal/node"
	"github.com/draind/draind/e2e/kubelet/internal/ociimage"
	"github.com/draind/draind/internal/logevent"
)

// Issue 22, acceptance 4: the pods Istio's own injector made from
// deploy/istio (`istioctl kube-inject`, kept in testdata/istio by
// go test ./e2e -run TestIstioKubeInject -update-istio) run under the
// kubelet: istio-proxy is draind above the real pilot-agent, with Istio's
// args, env, probes and securityContext as injected.
//
// What the test changes, and why (a node with no API server, no registry
// and no istiod):
// - images: local ones. istio-proxy's (imgIstioProxy) is laid out as
//   Istio's proxyv2: /usr/local/bin/pilot-agent (the real one, the peer
//   tools/peers/pilot-agent.sh builds), /usr/local/bin/envoy (envoysim) and
//   Envoy's bootstrap template at /var/lib/istio/envoy (envoysim's config:
//   pilot-agent renders it unchanged), plus draind with the root
//   Dockerfile's file capabilities;
// - istio-init is left out: it runs `pilot-agent istio-iptables`, which
//   needs the iptables binaries this static image does not have; the
//   clients and the app reach Envoy's 15006 and 15001 directly, as in the
//   other scenarios (the interception itself: e2e/mesh_linux_test.go);
// - the volumes an API server fills (the projected service-account token,
//   the istio-ca-root-cert and istio-ca-crl ConfigMaps) are emptyDirs,
//   and a hostPath /work is added for the app's results;
// - istio-proxy gets FILE_MOUNTED_CERTS=true and CLOUD_PLATFORM=none (no
//   CA, no cloud metadata server), appended to Istio's env, and the pod
//   the annotation proxy.istio.io/config with discoveryAddress
//   127.0.0.1:15012 and controlPlaneAuthPolicy NONE (no istiod, no root
//   certificate for it): pilot-agent, and draind, read it from the
//   downward-API file Istio mounts;
// - the app is the test app.

const imgIstioProxy = "docker.io/draind/e2e-istio-proxy:dev"

// pilotAgentBinary finds the pilot-agent peer: $DRAIND_PILOT_AGENT, else
// tools/peers/pilot-agent.sh's cache path (its ISTIO_VERSION read from the
// script, the one place it is written). "": not built.
func pilotAgentBinary() string {
	if p := os.Getenv("DRAIND_PILOT_AGENT"); p != "" {
		return p
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "tools/peers/pilot-agent.sh"))
	if err != nil {
		return ""
	}
	m := regexp.MustCompile(`(?m)^ISTIO_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	cache := os.Getenv("DRAIND_PEERS_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			base = filepath.Join(os.Getenv("HOME"), ".cache")
		}
		cache = filepath.Join(base, "draind-peers")
	}
	p := filepath.Join(cache, "pilot-agent-"+string(m[1]))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// istioProxyImage is the istio-proxy image, or nil when the pilot-agent
// peer is not built (TestIstioInjectedUnderLoad then says so). Its
// envoysim config: Istio's three listeners that matter here — inbound
// 15006 to the app, outbound 127.0.0.1:15001 to the host's upstream, and
// 15021 routing /healthz/ready to pilot-agent's 15020 (the startupProbe
// Istio injects goes there) — and the xDS update counters pilot-agent's
// readiness waits for.
func istioProxyImage(dir string) (*ociimage.Spec, error) {
	pa := pilotAgentBinary()
	if pa == "" {
		return nil, nil
	}
	gateway := node.DefaultConfig("").Gateway
	tmpl, _ := json.Marshal(map[string]any{
		"admin_address": "127.0.0.1:15000",
		"xds":           true,
		"listeners": []map[string]any{
			{"name": "virtualInbound", "address": fmt.Sprintf("0.0.0.0:%d", inboundPort), "direction": "inbound", "protocol": "http", "upstream": "127.0.0.1:8080"},
			{"name": "virtualOutbound", "address": "127.0.0.1:15001", "direction": "outbound", "protocol": "http", "upstream": fmt.Sprintf("%s:%d", gateway, upstreamPort)},
			{"name": "0.0.0.0_15021", "address": "0.0.0.0:15021", "protocol": "http", "upstream": "127.0.0.1:15020"},
		},
	})
	bin := func(n string) string { return filepath.Join(dir, n) }
	spec := images.ProxyV2Spec(imgIstioProxy, pa, bin("draind"), bin("envoysim"), tmpl)
	return &spec, nil
}

// injectedPod reads a Deployment from testdata/istio and makes the static
// pod the test runs (the changes are listed at the top of this file).
func injectedPod(t *testing.T, file, deployment string, p podParams) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/istio", file))
	if err != nil {
		t.Fatal(err)
	}
	var d *appsv1.Deployment
	for _, doc := range docSep.Split(string(b), -1) {
		var dd appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(doc), &dd); err == nil && dd.Name == deployment {
			d = &dd
		}
	}
	if d == nil {
		t.Fatalf("%s: no Deployment %s", file, deployment)
	}
	spec := d.Spec.Template.Spec
	spec.InitContainers = slices.DeleteFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "istio-init" })
	work := corev1.VolumeMount{Name: "work", MountPath: "/work"}
	never := corev1.PullNever
	adapt := func(c *corev1.Container) {
		switch c.Name {
		case "app":
			uid := int64(1000)
			c.Image, c.ImagePullPolicy, c.Args = imgApp, never, p.AppArgs
			c.SecurityContext = &corev1.SecurityContext{RunAsUser: &uid, RunAsGroup: &uid}
			c.VolumeMounts = append(c.VolumeMounts, work)
		case "istio-proxy":
			c.Image, c.ImagePullPolicy = imgIstioProxy, never
			c.Env = append(c.Env, corev1.EnvVar{Name: "FILE_MOUNTED_CERTS", Value: "true"}, corev1.EnvVar{Name: "CLOUD_PLATFORM", Value: "none"})
		}
	}
	for i := range spec.InitContainers {
		adapt(&spec.InitContainers[i])
	}
	for i := range spec.Containers {
		adapt(&spec.Containers[i])
	}
	for i, v := range spec.Volumes {
		if v.Projected != nil || v.ConfigMap != nil {
			spec.Volumes[i].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
		}
	}
	dirType := corev1.HostPathDirectory
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "work", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p.WorkDir, Type: &dirType}}})
	annotations := maps.Clone(d.Spec.Template.Annotations)
	annotations["proxy.istio.io/config"] = "discoveryAddress: 127.0.0.1:15012\ncontrolPlaneAuthPolicy: NONE\n"
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: "default", Labels: d.Spec.Template.Labels, Annotations: annotations},
		Spec:       spec,
	}
	out, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The pods `istioctl kube-inject` made from deploy/istio/sidecar.yaml and
// native.yaml (the eBPF securityContext), under the classic load
// scenario: short requests, two 7 s requests in flight, the app's 30
// calls out during its shutdown and 5 after its last request.
func TestIstioInjectedUnderLoad(t *testing.T) {
	n := requireNode(t)
	if pilotAgentBinary() == "" {
		t.Skip("the pilot-agent peer is not built: make peers (tools/peers/pilot-agent.sh)")
	}
	for _, tc := range []struct {
		file, deployment, name string
		native                 bool
	}{
		{"sidecar-injected.yaml", "web", "istio-classic", false},
		{"native-injected.yaml", "web-native", "istio-native", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := podParams{Name: tc.name, AppArgs: gracefulAppArgs(), ProxyContainer: "istio-proxy", StatusPort: 15022}
			p.WorkDir = filepath.Join(n.Config().StateDir, "pods", p.Name)
			if err := os.MkdirAll(p.WorkDir, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p.WorkDir, 0o777)
			pd := runPod(t, p, injectedPod(t, tc.file, tc.deployment, p))
			if c := pd.get(15020, "/app-health/app/readyz"); c != 200 {
				t.Errorf("the app's probe as Istio rewrote it (pilot-agent's :15020/app-health/app/readyz): %d, want 200", c)
			}
			o := terminateUnderLoad(t, pd)
			o.log(t, tc.name)
			o.checkProtected(t)
			logs := pd.draindLog(-1)
			stop := findLogWith(logs, logevent.Phase, "phase", "stopping")
			drain := findLogWith(logs, logevent.Phase, "phase", "draining")
			exited := findLogWith(logs, logevent.Phase, "phase", "exited")
			pa := findLog(logs, logevent.ProxyIsPilotAgent)
			var quit time.Time
			if ns, ok := stop["quit_sent_unix_ns"].(float64); ok {
				quit = time.Unix(0, int64(ns))
			}
			// The min-drain's end (auto, the default: out of rotation).
			minDrainEnd := logTime(findLogWith(logs, logevent.Phase, "phase", "gating"))
			// The app's exit on the clock draind's quit_sent_unix_ns is on:
			// its last line, written right before it exits (the CRI stamps
			// the exit a few ms after the kernel saw it, and draind too).
			appExit := appExitLine(t, pd)
			t.Logf("%s: draind: %v; drain %v (min-drain %v); Envoy told /quitquitquit %s after the app's exit (its last line; the CRI's exit: %s), %s after min-drain's end; exited %v, exit %v",
				tc.name, pa, drain["trigger"], drain["min_drain"], fmtDur(quit.Sub(appExit)), fmtDur(quit.Sub(o.appExit)), fmtDur(quit.Sub(minDrainEnd)), exited["why"], exited["exit_code"])
			report.add("scenario", tc.name+" quit after app", fmtDur(quit.Sub(appExit)))
			if pa == nil || fmt.Sprint(pa["status_addr"]) != ":15022" {
				t.Errorf("draind did not take pilot-agent's side: %v", pa)
			}
			// Soon after the app's exit; classic: after min-drain too.
			// Native: without waiting for the kubelet's SIGTERM to
			// istio-proxy (its turn comes 33-224 ms after the app's exit
			// here: docs/kubernetes.md), which finds draind gone, and the
			// container is not restarted.
			after, what := appExit, "the app's exit"
			if tc.native {
				t.Logf("%s: /quitquitquit %s after the app's exit; the kubelet's SIGTERM to istio-proxy %s after it (not waited for)", tc.name, fmtDur(quit.Sub(appExit)), fmtDur(o.draindTerm.Sub(appExit)))
				if n := len(pd.attempts("istio-proxy")); n != 1 {
					t.Errorf("istio-proxy ran %d times, want once: the kubelet must not restart a sidecar that ends during the pod's termination", n)
				}
			}
			// How soon is reported above and measured by
			// tools/bench/exit.sh; the bound only tells a stop that
			// followed the app from one that waited for something else.
			if d := quit.Sub(after); quit.IsZero() || after.IsZero() || d < 0 || d > stopFollowsWithin || quit.Before(appExit) || !tc.native && quit.Before(minDrainEnd) {
				t.Errorf("/quitquitquit %s after %s (%s after the app's exit, %s after min-drain's end): want 0-%s, after the app and min-drain",
					fmtDur(d), what, fmtDur(quit.Sub(appExit)), fmtDur(quit.Sub(minDrainEnd)), stopFollowsWithin)
			}
			want := "signal"
			if tc.native {
				want = "prestop-hook"
			}
			if o.trigger != want || fmt.Sprint(exited["exit_code"]) != "0" || strings.Contains(string(pd.container("istio-proxy").log), "Error listening on status port") {
				t.Errorf("trigger %q (want %s), draind exit %v, or pilot-agent could not listen on its status port", o.trigger, want, exited["exit_code"])
			}
		})
	}
}

// appExitLine is the time on the app's "exit UNIXNANO CODE" line.
func appExitLine(t *testing.T, pd *pod) time.Time {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(pd.dir, "app.result"))
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "exit" {
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return time.Unix(0, ns)
			}
		}
	}
	t.Errorf("no exit line in the app's results")
	return time.Time{}
}

// deploy/istio/Dockerfile.proxyv2, checked statically with BuildKit's
// parser (no builder here): its last stage is the proxyv2 given, it keeps
// proxyv2's entrypoint (istio-init runs the same image with
// `istio-iptables` args), and draind is copied with its extended
// attributes (the +p file capabilities the kubelet suite's images carry).
func TestIstioDockerfileProxyv2(t *testing.T) {
	stages := parseDockerfileAt(t, "deploy/istio/Dockerfile.proxyv2").stages
	if len(stages) == 0 {
		t.Fatal("no stages")
	}
	last := &stages[len(stages)-1]
	if last.BaseName != "${PROXYV2}" {
		t.Errorf("the final stage is FROM %s, want ${PROXYV2}", last.BaseName)
	}
	if n := len(commandsOf[*instructions.EntrypointCommand](last)) + len(commandsOf[*instructions.CmdCommand](last)) + len(commandsOf[*instructions.UserCommand](last)); n != 0 {
		t.Errorf("the final stage sets ENTRYPOINT, CMD or USER (%d): proxyv2's must stay (istio-init runs this image)", n)
	}
	runs := commandsOf[*instructions.RunCommand](last)
	if len(runs) != 1 || !slices.Contains(runs[0].CmdLine, "--preserve=mode,xattr") || !slices.Contains(runs[0].CmdLine, "/usr/local/bin/draind") {
		t.Errorf("want one RUN copying draind to /usr/local/bin/draind with --preserve=mode,xattr; got %d: %v", len(runs), runs)
	}
}
