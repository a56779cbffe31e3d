package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/testenv/mesh"
)

// Issue 22: Istio's own injector, offline. `istioctl kube-inject` (built
// from the module proxy at the pilot-agent peer's Istio version:
// tools/peers/istioctl.sh) injects the manifests of deploy/istio with the
// injector configuration `istioctl manifest generate` renders from Istio's
// charts; the test checks that the injected
// pods run draind above pilot-agent with Istio's args, env and the rest
// intact. The injected pods are kept in e2e/kubelet/testdata/istio, where
// the kubelet suite runs them (go test -run TestIstioKubeInject
// -update-istio rewrites them).

var updateIstio = flag.Bool("update-istio", false, "rewrite e2e/kubelet/testdata/istio from istioctl kube-inject")

// istioctl finds the istioctl binary: $DRAIND_ISTIOCTL, else
// tools/peers/istioctl.sh's cache path next to pilot-agent's.
func istioctl(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DRAIND_ISTIOCTL"); p != "" {
		return p
	}
	p := filepath.Join(filepath.Dir(mesh.CachedPilotAgent()), "istioctl-"+mesh.IstioVersion)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("istioctl %s not built (%s): bash tools/peers/istioctl.sh", mesh.IstioVersion, p)
		}
		t.Skipf("istioctl %s not built (looked for %s, or set DRAIND_ISTIOCTL): build it with `bash tools/peers/istioctl.sh`", mesh.IstioVersion, p)
	}
	return p
}

// injectorInputs runs `istioctl manifest generate` (with an IstioOperator
// file when given) and writes the injector's inputs into dir: the
// istio-sidecar-injector ConfigMap's config and values, and the istio
// ConfigMap's mesh. It returns kube-inject's flags for them.
func injectorInputs(t *testing.T, ctl, dir, operator string) []string {
	t.Helper()
	args := []string{"manifest", "generate"}
	if operator != "" {
		args = append(args, "-f", operator)
	}
	out, err := exec.Command(ctl, args...).Output()
	if err != nil {
		t.Fatalf("istioctl %s: %v", strings.Join(args, " "), err)
	}
	files := map[string]string{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc struct {
			Kind     string                `yaml:"kind"`
			Metadata struct{ Name string } `yaml:"metadata"`
			Data     map[string]string     `yaml:"data"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind != "ConfigMap" {
			continue
		}
		switch doc.Metadata.Name {
		case "istio-sidecar-injector":
			files["inject-config.yaml"], files["inject-values.json"] = doc.Data["config"], doc.Data["values"]
		case "istio":
			files["mesh.yaml"] = doc.Data["mesh"]
		}
	}
	for name, body := range files {
		if body == "" {
			t.Fatalf("istioctl manifest generate: no %s", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(files) != 3 {
		t.Fatalf("istioctl manifest generate: found %d of the 3 injector inputs", len(files))
	}
	return []string{"--injectConfigFile", filepath.Join(dir, "inject-config.yaml"), "--meshConfigFile", filepath.Join(dir, "mesh.yaml"), "--valuesFile", filepath.Join(dir, "inject-values.json")}
}

// kubeInject injects a manifest. -r default: without a revision istioctl
// waits for a cluster to tell it the default one.
func kubeInject(t *testing.T, ctl, manifest string, inputs []string) []byte {
	t.Helper()
	cmd := exec.Command(ctl, append([]string{"kube-inject", "-r", "default", "-f", manifest}, inputs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("istioctl kube-inject -f %s: %v: %s", manifest, err, stderr.String())
	}
	return out
}

// k8sObj is a decoded manifest, navigated by path.
type k8sObj map[string]any

func (o k8sObj) get(path ...any) any {
	var cur any = map[string]any(o)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := cur.(map[string]any)
			cur = m[k]
		case int:
			l, _ := cur.([]any)
			if k >= len(l) {
				return nil
			}
			cur = l[k]
		}
	}
	return cur
}

func (o k8sObj) str(path ...any) string {
	if v := o.get(path...); v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

func (o k8sObj) strs(path ...any) []string {
	l, _ := o.get(path...).([]any)
	out := make([]string, len(l))
	for i, v := range l {
		out[i] = fmt.Sprint(v)
	}
	return out
}

// container finds a container of the pod template by name, in
// containers or initContainers, and says which.
func (o k8sObj) container(name string) (k8sObj, string) {
	for _, list := range []string{"containers", "initContainers"} {
		l, _ := o.get("spec", "template", "spec", list).([]any)
		for _, c := range l {
			if m, _ := c.(map[string]any); m["name"] == name {
				return k8sObj(m), list
			}
		}
	}
	return nil, ""
}

func decodeAll(t *testing.T, b []byte) map[string]k8sObj {
	t.Helper()
	out := map[string]k8sObj{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			break
		}
		if m == nil {
			continue
		}
		o := k8sObj(m)
		out[o.str("metadata", "name")] = o
	}
	return out
}

// injectedWant is what one Deployment of deploy/istio must look like once
// injected.
type injectedWant struct {
	native, ebpf bool
}

// inboundTotalRegexp is the statsInclusionRegexps the `draind` template
// gives a pod, and the per-pod overrides state: the inbound listener's
// accepted connections, which Istio's bootstrap stats_matcher drops, for
// the rate before the drain.
const inboundTotalRegexp = `listener\..*_15006\.downstream_cx_total`

func TestIstioKubeInject(t *testing.T) {
	ctl := istioctl(t)
	root, _ := filepath.Abs("..")
	dir := t.TempDir()
	plain := injectorInputs(t, ctl, dir, "")
	tdir := filepath.Join(dir, "templated")
	os.Mkdir(tdir, 0o755)
	templated := injectorInputs(t, ctl, tdir, filepath.Join(root, "deploy/istio/injection-template.yaml"))
	for _, tc := range []struct {
		manifest string
		inputs   []string
		want     map[string]injectedWant
		stats    string // the pod's sidecar.istio.io/statsInclusionRegexps
	}{
		{"sidecar.yaml", plain, map[string]injectedWant{"web": {ebpf: true}, "web-nocaps": {}}, inboundTotalRegexp},
		{"native.yaml", plain, map[string]injectedWant{"web-native": {native: true, ebpf: true}, "web-native-nocaps": {native: true}}, inboundTotalRegexp},
		{"templated-app.yaml", templated, map[string]injectedWant{"web-templated": {ebpf: true}, "web-templated-native": {native: true}}, inboundTotalRegexp},
	} {
		t.Run(tc.manifest, func(t *testing.T) {
			out := kubeInject(t, ctl, filepath.Join(root, "deploy/istio", tc.manifest), tc.inputs)
			objs := decodeAll(t, out)
			for name, want := range tc.want {
				d, ok := objs[name]
				if !ok {
					t.Fatalf("no %s in the injected output", name)
				}
				checkInjected(t, name, d, want)
				if got := d.str("spec", "template", "metadata", "annotations", "sidecar.istio.io/statsInclusionRegexps"); got != tc.stats {
					t.Errorf("%s: statsInclusionRegexps %q, want %q", name, got, tc.stats)
				}
			}
			golden := filepath.Join(root, "e2e/kubelet/testdata/istio", strings.TrimSuffix(tc.manifest, ".yaml")+"-injected.yaml")
			if *updateIstio {
				os.MkdirAll(filepath.Dir(golden), 0o755)
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if b, err := os.ReadFile(golden); err != nil || !bytes.Equal(b, out) {
				t.Errorf("%s differs from istioctl kube-inject's output (%v): go test ./e2e -run TestIstioKubeInject -update-istio", golden, err)
			}
		})
	}
}

func checkInjected(t *testing.T, name string, d k8sObj, want injectedWant) {
	t.Helper()
	c, list := d.container("istio-proxy")
	if c == nil {
		t.Fatalf("%s: no istio-proxy container", name)
	}
	cmd, args := c.strs("command"), c.strs("args")
	env := map[string]string{}
	envList, _ := c.get("env").([]any)
	for _, e := range envList {
		m := k8sObj(e.(map[string]any))
		env[m.str("name")] = m.str("value")
	}
	t.Logf("%s: istio-proxy in %s: command %q, args %q; %d variables (%s); readiness :%s%s; startup :%s%s; preStop %q; securityContext %v",
		name, list, cmd, args, len(env), strings.Join(slices.Sorted(func(yield func(string) bool) {
			for k := range env {
				if !yield(k) {
					return
				}
			}
		}), ","), c.str("readinessProbe", "httpGet", "port"), c.str("readinessProbe", "httpGet", "path"),
		c.str("startupProbe", "httpGet", "port"), c.str("startupProbe", "httpGet", "path"), c.strs("lifecycle", "preStop", "exec", "command"), c.get("securityContext"))

	// draind above pilot-agent, Istio's args after it.
	if !slices.Equal(cmd, []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/pilot-agent"}) {
		t.Errorf("%s: command %q", name, cmd)
	}
	if len(args) < 4 || args[0] != "proxy" || args[1] != "sidecar" || args[2] != "--domain" {
		t.Errorf("%s: args %q, want Istio's proxy sidecar --domain ...", name, args)
	}
	// Istio's env, whole: ProxyConfig, the pod's identity and the app
	// probe rewrites; no DRAIND_* setting.
	for _, k := range []string{"PROXY_CONFIG", "POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "SERVICE_ACCOUNT", "ISTIO_META_POD_PORTS",
		"ISTIO_META_APP_CONTAINERS", "ISTIO_KUBE_APP_PROBERS", "PILOT_CERT_PROVIDER", "CA_ADDR", "GOMEMLIMIT", "GOMAXPROCS"} {
		if _, ok := env[k]; !ok {
			t.Errorf("%s: Istio's %s is missing", name, k)
		}
	}
	// DRAIND_GRACE_PERIOD is the pod's own terminationGracePeriodSeconds,
	// copied by the template (or stated beside it by an override): the
	// drain deadline follows the pod, with nothing set by hand.
	if g, ok := env["DRAIND_GRACE_PERIOD"]; ok {
		if spec := d.str("spec", "template", "spec", "terminationGracePeriodSeconds"); g != spec {
			t.Errorf("%s: DRAIND_GRACE_PERIOD %q, the pod's terminationGracePeriodSeconds %q", name, g, spec)
		}
		delete(env, "DRAIND_GRACE_PERIOD")
	} else if d.get("spec", "template", "spec", "terminationGracePeriodSeconds") != nil {
		t.Errorf("%s: the pod states terminationGracePeriodSeconds and draind is not told it", name)
	}
	for k := range env {
		if strings.HasPrefix(k, "DRAIND_") {
			t.Errorf("%s: %s is set; the adoption needs none", name, k)
		}
	}
	if c.str("readinessProbe", "httpGet", "port") != draindStatusPort || c.str("startupProbe", "httpGet", "port") != "15021" {
		t.Errorf("%s: readiness on :%s, startup on :%s; want draind's %s and Istio's 15021", name, c.str("readinessProbe", "httpGet", "port"), c.str("startupProbe", "httpGet", "port"), draindStatusPort)
	}
	if want.native != (list == "initContainers") || want.native != (c.str("restartPolicy") == "Always") {
		t.Errorf("%s: istio-proxy in %s, restartPolicy %q; native %v", name, list, c.str("restartPolicy"), want.native)
	}
	preStop := c.strs("lifecycle", "preStop", "exec", "command")
	if want.native && !slices.Equal(preStop, []string{"/usr/local/bin/draind", "drain"}) || !want.native && len(preStop) != 0 {
		t.Errorf("%s: preStop %q (native %v)", name, preStop, want.native)
	}
	// Istio's securityContext, with BPF and PERFMON added for eBPF.
	sc := k8sObj(map[string]any{"sc": c.get("securityContext")})
	add, drop := sc.strs("sc", "capabilities", "add"), sc.strs("sc", "capabilities", "drop")
	if want.ebpf != slices.Equal(add, []string{"BPF", "PERFMON"}) || !want.ebpf && len(add) != 0 || !slices.Equal(drop, []string{"ALL"}) ||
		sc.str("sc", "runAsUser") != "1337" || sc.str("sc", "runAsNonRoot") != "true" || sc.str("sc", "allowPrivilegeEscalation") != "false" {
		t.Errorf("%s: securityContext %v (eBPF %v)", name, c.get("securityContext"), want.ebpf)
	}
	// The app's probe rewritten to pilot-agent's port; the kubelet's probes
	// of draind's port kept out of Envoy's capture.
	app, _ := d.container("app")
	if app.str("readinessProbe", "httpGet", "port") != istioStatusPort || app.str("readinessProbe", "httpGet", "path") != appProbePath {
		t.Errorf("%s: the app's readinessProbe %v, want Istio's rewrite to :%s%s", name, app.get("readinessProbe"), istioStatusPort, appProbePath)
	}
	init, _ := d.container("istio-init")
	iargs := init.strs("args")
	if i := slices.Index(iargs, "-d"); i < 0 || i+1 >= len(iargs) || !slices.Contains(strings.Split(iargs[i+1], ","), draindStatusPort) {
		t.Errorf("%s: istio-init %q does not exclude %s from inbound capture", name, iargs, draindStatusPort)
	}
}

// TestIstioAppHooks (issue 42): istioctl kube-inject with the draind
// templates writes each app container's preStop, the out-of-rotation wait
// on draind's port, where it has none; keeps one it has; touches no init
// container, and nothing under the pod's opt-out; and gives a Job's
// classic sidecar --exit-with-app from its restart policy (none to a
// native one, nor a hook to a Job's app).
func TestIstioAppHooks(t *testing.T) {
	ctl := istioctl(t)
	root, _ := filepath.Abs("..")
	dir := t.TempDir()
	inputs := injectorInputs(t, ctl, dir, filepath.Join(root, "deploy/istio/injection-template.yaml"))
	manifest := filepath.Join(root, "e2e/testdata/istio/app-hooks.yaml")
	out := kubeInject(t, ctl, manifest, inputs)
	objs := decodeAll(t, out)
	wait := map[string]any{"httpGet": map[string]any{"path": agent.RotationWaitPath, "port": draindStatusPort}}
	// preStop is the container's preStop as the kubelet will reach it:
	// Istio rewrites an httpGet hook to pilot-agent's port, which relays
	// it to the original target (ISTIO_KUBE_APP_PROBERS, no timeout of
	// its own), as it does the app's probes.
	preStop := func(name, container string) any {
		t.Helper()
		d, ok := objs[name]
		if !ok {
			t.Fatalf("no %s in the injected output", name)
		}
		c, _ := d.container(container)
		if c == nil {
			t.Fatalf("%s: no container %s", name, container)
		}
		h := k8sObj(map[string]any{"h": c.get("lifecycle", "preStop")})
		if h.str("h", "httpGet", "port") != istioStatusPort {
			return h["h"]
		}
		proxy, _ := d.container("istio-proxy")
		envList, _ := proxy.get("env").([]any)
		for _, e := range envList {
			if m := k8sObj(e.(map[string]any)); m.str("name") == "ISTIO_KUBE_APP_PROBERS" {
				var probers map[string]any
				if err := json.Unmarshal([]byte(m.str("value")), &probers); err != nil {
					t.Fatalf("%s: ISTIO_KUBE_APP_PROBERS: %v", name, err)
				}
				relayed, _ := probers[h.str("h", "httpGet", "path")].(map[string]any)
				return map[string]any{"httpGet": map[string]any{"path": k8sObj(relayed).str("httpGet", "path"), "port": k8sObj(relayed).str("httpGet", "port")}}
			}
		}
		t.Fatalf("%s: %s's preStop is rewritten to pilot-agent's port, and no ISTIO_KUBE_APP_PROBERS says where to", name, container)
		return nil
	}
	for _, tc := range []struct {
		name, container string
		want            any
	}{
		{"web-hooked", "app", wait},
		{"web-hooked", "cache", map[string]any{"exec": map[string]any{"command": []any{"/bin/sleep", "3"}}}},
		{"web-hooked", "migrate", nil},
		{"web-hooked", "istio-proxy", nil},
		{"web-optout", "app", nil},
		{"report-never", "report", nil},
	} {
		if got := preStop(tc.name, tc.container); !reflect.DeepEqual(normalize(got), normalize(tc.want)) {
			t.Errorf("%s: %s's preStop %v, want %v", tc.name, tc.container, got, tc.want)
		}
	}
	if postStart := objs["web-hooked"].get("spec", "template", "spec", "containers"); !strings.Contains(fmt.Sprint(postStart), "postStart") {
		t.Errorf("web-hooked: the app's postStart went with the merge: %v", postStart)
	}
	for name, want := range map[string]string{"report-never": "any", "report-onfailure": "success", "report-native": "", "web-hooked": ""} {
		c, _ := objs[name].container("istio-proxy")
		got := ""
		envList, _ := c.get("env").([]any)
		for _, e := range envList {
			if m := k8sObj(e.(map[string]any)); m.str("name") == "DRAIND_EXIT_WITH_APP" {
				got = m.str("value")
			}
		}
		if got != want {
			t.Errorf("%s: DRAIND_EXIT_WITH_APP %q, want %q", name, got, want)
		}
	}
	golden := filepath.Join(root, "e2e/testdata/istio/app-hooks-injected.yaml")
	if *updateIstio {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(golden); err != nil || !bytes.Equal(b, out) {
		t.Errorf("%s differs from istioctl kube-inject's output (%v): go test ./e2e -run TestIstioAppHooks -update-istio", golden, err)
	}
}

// normalize is v with its numbers as strings, for comparing decoded YAML.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = normalize(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = normalize(e)
		}
		return l
	case nil:
		return nil
	}
	return fmt.Sprint(v)
}

// helmVersion is tools/peers/helm.sh's HELM_VERSION: keep them in step.
const helmVersion = "v3.19.5"

// helmBin finds the helm binary: $DRAIND_HELM, else tools/peers/helm.sh's
// cache path next to pilot-agent's.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DRAIND_HELM"); p != "" {
		return p
	}
	p := filepath.Join(filepath.Dir(mesh.CachedPilotAgent()), "helm-"+helmVersion)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("helm %s not built (%s): bash tools/peers/helm.sh", helmVersion, p)
		}
		t.Skipf("helm %s not built (looked for %s, or set DRAIND_HELM): build it with `bash tools/peers/helm.sh`", helmVersion, p)
	}
	return p
}

// TestIstioHelmValues (issue 42): deploy/istio/injection-template.yaml's
// values, given to Istio's own istiod chart (at pilot-agent's Istio
// version) through Helm as `helm install istiod` would, make the injector
// configuration istioctl makes from the same file, in all draind relies
// on: its templates, the default templates, and the proxy's image and
// excluded inbound ports.
func TestIstioHelmValues(t *testing.T) {
	ctl, helm := istioctl(t), helmBin(t)
	root, _ := filepath.Abs("..")
	operator := filepath.Join(root, "deploy/istio/injection-template.yaml")
	dir := t.TempDir()
	injectorInputs(t, ctl, dir, operator)
	viaIstioctl := readInjector(t, filepath.Join(dir, "inject-config.yaml"), filepath.Join(dir, "inject-values.json"))

	// The chart, from the module pilot-agent is built from.
	cmd := exec.Command("go", "mod", "download", "-json", "istio.io/istio@"+mesh.IstioVersion)
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download istio.io/istio@%s: %v", mesh.IstioVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(b, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, b)
	}
	chart := filepath.Join(mod.Dir, "manifests/charts/istio-control/istio-discovery")

	// The IstioOperator's values are the chart's values.
	src, err := os.ReadFile(operator)
	if err != nil {
		t.Fatal(err)
	}
	var op struct {
		Spec struct {
			Values map[string]any `yaml:"values"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(src, &op); err != nil {
		t.Fatal(err)
	}
	vb, _ := yaml.Marshal(op.Spec.Values)
	values := filepath.Join(dir, "helm-values.yaml")
	if err := os.WriteFile(values, vb, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", "istiod", chart, "-n", "istio-system", "-f", values).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var viaHelm injector
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var cm struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if yaml.Unmarshal(doc, &cm) == nil && cm.Kind == "ConfigMap" && cm.Metadata.Name == "istio-sidecar-injector" {
			cfg, vals := filepath.Join(dir, "helm-config.yaml"), filepath.Join(dir, "helm-values.json")
			os.WriteFile(cfg, []byte(cm.Data["config"]), 0o644)
			os.WriteFile(vals, []byte(cm.Data["values"]), 0o644)
			viaHelm = readInjector(t, cfg, vals)
		}
	}
	if viaHelm.Templates == nil {
		t.Fatalf("helm template made no istio-sidecar-injector ConfigMap:\n%s", out)
	}
	for _, name := range []string{"draind", "draind-ebpf", "draind-app-prestop"} {
		if viaHelm.Templates[name] == "" || viaHelm.Templates[name] != viaIstioctl.Templates[name] {
			t.Errorf("template %s: Helm's\n%s\nistioctl's\n%s", name, viaHelm.Templates[name], viaIstioctl.Templates[name])
		}
	}
	if !slices.Equal(viaHelm.DefaultTemplates, viaIstioctl.DefaultTemplates) || viaHelm.ProxyImage != viaIstioctl.ProxyImage ||
		viaHelm.ExcludeInbound != viaIstioctl.ExcludeInbound || viaHelm.ProxyImage == "" {
		t.Errorf("Helm's injector %+v, istioctl's %+v", viaHelm.summary(), viaIstioctl.summary())
	}
	t.Logf("Helm and istioctl agree: %+v", viaHelm.summary())
}

// injector is what draind relies on in the istio-sidecar-injector
// ConfigMap: its config's templates and default templates, its values'
// proxy image and excluded inbound ports.
type injector struct {
	Templates        map[string]string `yaml:"templates"`
	DefaultTemplates []string          `yaml:"defaultTemplates"`
	ProxyImage       string
	ExcludeInbound   string
}

func (i injector) summary() string {
	return fmt.Sprintf("defaultTemplates %v, templates %d, proxy image %s, excludeInboundPorts %q", i.DefaultTemplates, len(i.Templates), i.ProxyImage, i.ExcludeInbound)
}

func readInjector(t *testing.T, config, values string) injector {
	t.Helper()
	var inj injector
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &inj); err != nil {
		t.Fatalf("%s: %v", config, err)
	}
	b, err = os.ReadFile(values)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Global struct {
			Proxy struct {
				Image               string `json:"image"`
				ExcludeInboundPorts string `json:"excludeInboundPorts"`
			} `json:"proxy"`
		} `json:"global"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", values, err)
	}
	inj.ProxyImage, inj.ExcludeInbound = v.Global.Proxy.Image, v.Global.Proxy.ExcludeInboundPorts
	return inj
}
