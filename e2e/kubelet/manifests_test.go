package kubelet_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// manifest is one decoded document of deploy/.
type manifest struct {
	file string
	obj  any
	pod  *corev1.PodTemplateSpec // the pod it runs, for workloads and pods
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// loadManifests strictly decodes every document of deploy/ into its
// k8s.io/api type: an unknown or misspelt field fails.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	err := filepath.WalkDir(filepath.Join(repoRoot, "deploy"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		for _, doc := range docSep.Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			out = append(out, decodeManifest(t, rel, []byte(doc)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func decodeManifest(t *testing.T, file string, doc []byte) manifest {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	m := manifest{file: file}
	strict := func(into any) {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Errorf("%s: %s/%s: %v", file, tm.APIVersion, tm.Kind, err)
		}
		m.obj = into
	}
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/ConfigMap":
		var cm corev1.ConfigMap
		strict(&cm)
		for k, v := range cm.Data {
			var any map[string]any
			if err := yaml.Unmarshal([]byte(v), &any); err != nil {
				t.Errorf("%s: ConfigMap key %s is not YAML: %v", file, k, err)
			}
		}
	case "v1/Pod":
		var p corev1.Pod
		strict(&p)
		m.pod = &corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	case "apps/v1/Deployment":
		var d appsv1.Deployment
		strict(&d)
		m.pod = &d.Spec.Template
	case "batch/v1/Job":
		var j batchv1.Job
		strict(&j)
		m.pod = &j.Spec.Template
	case "rbac.authorization.k8s.io/v1/Role":
		var r rbacv1.Role
		strict(&r)
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		var rb rbacv1.RoleBinding
		strict(&rb)
	case "install.istio.io/v1alpha1/IstioOperator":
		// Istio's install API (deploy/istio/injection-template.yaml):
		// checked by Istio itself, through istioctl, in
		// e2e/istio_inject_linux_test.go.
	default:
		t.Errorf("%s: kind %s/%s not expected in deploy/", file, tm.APIVersion, tm.Kind)
	}
	return m
}

func findManifest(t *testing.T, ms []manifest, file string) manifest {
	t.Helper()
	for _, m := range ms {
		if m.file == file && m.pod != nil {
			return m
		}
	}
	t.Fatalf("%s: no workload", file)
	return manifest{}
}

func containerNamed(spec *corev1.PodSpec, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

func hasCaps(sc *corev1.SecurityContext, caps ...corev1.Capability) bool {
	if sc == nil || sc.Capabilities == nil {
		return false
	}
	for _, c := range caps {
		if !slices.Contains(sc.Capabilities.Add, c) {
			return false
		}
	}
	return true
}

func execHook(h *corev1.LifecycleHandler) []string {
	if h == nil || h.Exec == nil {
		return nil
	}
	return h.Exec.Command
}

// draindSidecar checks the securityContext documented for eBPF mode as a
// non-root user: uid 1337, BPF and PERFMON in the bounding set, no
// privilege escalation; and, for a serving pod, draind's readiness probe.
func draindSidecar(t *testing.T, file string, c *corev1.Container, serving bool) {
	t.Helper()
	if c == nil {
		t.Fatalf("%s: no draind container", file)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1337 || !hasCaps(sc, "BPF", "PERFMON") ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: %s: want runAsUser 1337, allowPrivilegeEscalation false and capabilities.add [BPF, PERFMON] (eBPF mode)", file, c.Name)
	}
	if p := c.ReadinessProbe; serving && (p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz/ready" || p.HTTPGet.Port.IntValue() != 15020) {
		t.Errorf("%s: %s: want a readinessProbe on :15020/healthz/ready", file, c.Name)
	}
}

// Every manifest decodes strictly, and each says what its mode needs.
func TestDeployManifests(t *testing.T) {
	ms := loadManifests(t)
	if len(ms) == 0 {
		t.Fatal("no manifests in deploy/")
	}
	t.Run("classic", func(t *testing.T) {
		m := findManifest(t, ms, "deploy/classic-sidecar.yaml")
		draindSidecar(t, m.file, containerNamed(&m.pod.Spec, "envoy"), true)
		if m.pod.Spec.ShareProcessNamespace != nil && *m.pod.Spec.ShareProcessNamespace {
			t.Errorf("%s: shareProcessNamespace is not needed (draind follows the app's processes in any PID namespace)", m.file)
		}
	})
	t.Run("native", func(t *testing.T) {
		m := findManifest(t, ms, "deploy/native-sidecar.yaml")
		c := containerNamed(&m.pod.Spec, "envoy")
		if c == nil || !slices.ContainsFunc(m.pod.Spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == "envoy" }) ||
			c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Fatalf("%s: want an init container envoy with restartPolicy: Always", m.file)
		}
		draindSidecar(t, m.file, c, true)
		if hook := execHook(c.Lifecycle.PreStop); len(hook) != 2 || filepath.Base(hook[0]) != "draind" || hook[1] != "drain" {
			t.Errorf("%s: preStop %q, want [draind drain]", m.file, hook)
		}
	})
	t.Run("istio", func(t *testing.T) {
		m := findManifest(t, ms, "deploy/istio/istio-prestop.yaml")
		c := containerNamed(&m.pod.Spec, "istio-proxy")
		if c == nil || c.Lifecycle == nil {
			t.Fatalf("%s: want an istio-proxy container (Istio's injection override) with a lifecycle", m.file)
		}
		if hook := execHook(c.Lifecycle.PreStop); len(hook) < 2 || filepath.Base(hook[0]) != "draind" || hook[1] != "prestop" {
			t.Errorf("%s: preStop %q, want [draind prestop ...]", m.file, hook)
		}
		if m.pod.Labels["sidecar.istio.io/inject"] != "true" {
			t.Errorf("%s: want the sidecar.istio.io/inject label", m.file)
		}
	})
	t.Run("job", func(t *testing.T) {
		m := findManifest(t, ms, "deploy/job-exit-with-app.yaml")
		c := containerNamed(&m.pod.Spec, "envoy")
		if c == nil {
			t.Fatalf("%s: no envoy container", m.file)
		}
		draindSidecar(t, m.file, c, false)
		mode := ""
		for _, e := range c.Env {
			if e.Name == "DRAIND_EXIT_WITH_APP" {
				mode = e.Value
			}
		}
		// The mode that completes the pod under its restartPolicy
		// (TestJobExitWithApp measures both): Never needs any (a failed
		// task must end the proxy), OnFailure success (the restarted task
		// needs the proxy).
		want := map[corev1.RestartPolicy][]string{corev1.RestartPolicyNever: {"any"}, corev1.RestartPolicyOnFailure: {"success", "true"}}[m.pod.Spec.RestartPolicy]
		if want == nil {
			t.Fatalf("%s: a Job's pod needs restartPolicy Never or OnFailure, not %q", m.file, m.pod.Spec.RestartPolicy)
		}
		if !slices.Contains(want, mode) {
			t.Errorf("%s: DRAIND_EXIT_WITH_APP=%q under restartPolicy %s, want %v", m.file, mode, m.pod.Spec.RestartPolicy, want)
		}
	})
	t.Run("node-debug", func(t *testing.T) {
		m := findManifest(t, ms, "deploy/node-debug.yaml")
		c := containerNamed(&m.pod.Spec, "draind")
		if !m.pod.Spec.HostPID || c == nil {
			t.Fatalf("%s: want hostPID and a draind container", m.file)
		}
		if c.SecurityContext == nil || (!hasCaps(c.SecurityContext, "SYS_ADMIN", "SYS_PTRACE") && (c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged)) {
			t.Errorf("%s: want capabilities SYS_ADMIN and SYS_PTRACE (or privileged)", m.file)
		}
		// The node's view: pods by name through the CRI, no PID to find.
		if len(c.Command) < 2 || filepath.Base(c.Command[0]) != "draind" ||
			!slices.Contains([]string{"pods", "watch", "conns", "$(DRAIND_VIEW)"}, c.Command[1]) || slices.Contains(c.Command, "--pid") {
			t.Errorf("%s: command %q, want draind pods|watch|conns, no --pid", m.file, c.Command)
		}
	})
	t.Run("events", func(t *testing.T) {
		// The Role grants creating events and nothing else; the binding
		// points at it.
		var role *rbacv1.Role
		var binding *rbacv1.RoleBinding
		for _, m := range ms {
			if m.file != "deploy/events-rbac.yaml" {
				continue
			}
			switch o := m.obj.(type) {
			case *rbacv1.Role:
				role = o
			case *rbacv1.RoleBinding:
				binding = o
			}
		}
		if role == nil || binding == nil {
			t.Fatal("deploy/events-rbac.yaml: want a Role and a RoleBinding")
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}}
		if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, want[0].APIGroups) || !slices.Equal(role.Rules[0].Resources, want[0].Resources) ||
			!slices.Equal(role.Rules[0].Verbs, want[0].Verbs) || len(role.Rules[0].ResourceNames) != 0 || len(role.Rules[0].NonResourceURLs) != 0 {
			t.Errorf("deploy/events-rbac.yaml: Role rules %+v, want exactly %+v", role.Rules, want)
		}
		if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Kind != "ServiceAccount" {
			t.Errorf("deploy/events-rbac.yaml: RoleBinding %+v does not bind the Role to a service account", binding)
		}
		// Every draind container of deploy/ names its pod through the
		// downward API, the UID included (kubectl describe lists Events
		// by it).
		fields := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid", "NODE_NAME": "spec.nodeName"}
		for file, container := range map[string]string{"deploy/classic-sidecar.yaml": "envoy", "deploy/native-sidecar.yaml": "envoy", "deploy/job-exit-with-app.yaml": "envoy"} {
			m := findManifest(t, ms, file)
			c := containerNamed(&m.pod.Spec, container)
			for name, path := range fields {
				i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
				if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != path {
					t.Errorf("%s: %s: want %s from the downward API's %s", file, container, name, path)
				}
			}
		}
		// Those whose pod leaves rotation tell the node and the probe
		// ports (docs/design.md, "Out of rotation").
		for _, file := range []string{"deploy/classic-sidecar.yaml", "deploy/native-sidecar.yaml"} {
			c := containerNamed(&findManifest(t, ms, file).pod.Spec, "envoy")
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HOST_IP" })
			if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "status.hostIP" {
				t.Errorf("%s: envoy: want HOST_IP from the downward API's status.hostIP", file)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DRAIND_PROBE_PORTS" }) {
				t.Errorf("%s: envoy: want DRAIND_PROBE_PORTS, the app's probe-only ports", file)
			}
		}
	})
	// The images the manifests name are the root Dockerfile's: its
	// ENTRYPOINT is draind run -- envoy, so `args` are Envoy's.
	for _, m := range ms {
		if m.pod == nil {
			continue
		}
		for _, c := range append(slices.Clone(m.pod.Spec.InitContainers), m.pod.Spec.Containers...) {
			repo, _, _ := strings.Cut(c.Image, ":")
			if strings.HasSuffix(repo, "/draind") && len(c.Command) == 0 && (len(c.Args) == 0 || c.Args[0] != "-c") {
				t.Errorf("%s: %s: args %q are Envoy's (the image's entrypoint is draind run -- envoy)", m.file, c.Name, c.Args)
			}
		}
	}
}
