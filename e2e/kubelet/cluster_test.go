package kubelet_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/cluster"
	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testapp"
)

// requireCluster skips a test that needs the cluster when make
// e2e-cluster did not ask for one, and fails it when it is broken.
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	if theCluster == nil {
		t.Skipf("needs the cluster: run `sudo make e2e-cluster` (%s=1)", clusterEnableVar)
	}
	return theCluster
}

// requireIstiod is requireCluster for a test of istiod's webhook.
func requireIstiod(t *testing.T) {
	t.Helper()
	if requireCluster(t).Istiod == "" {
		t.Fatal("the cluster has no istiod: DRAIND_CLUSTER_ISTIOD and DRAIND_ISTIOCTL are unset (sudo make e2e-cluster sets them)")
	}
}

func kubectl(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	return kubectlWithin(t, 3*time.Minute, stdin, args...)
}

// kubectlWithin is kubectl for a command that may take up to d.
func kubectlWithin(t *testing.T, d time.Duration, stdin []byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, err := theCluster.KubectlCmd(ctx, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// testNamespace makes a namespace for one test (labels: key=value pairs)
// and deletes it at the end, without waiting.
func testNamespace(t *testing.T, name string, labels ...string) string {
	t.Helper()
	kubectl(t, nil, "create", "namespace", name)
	if len(labels) > 0 {
		kubectl(t, nil, append([]string{"label", "namespace", name}, labels...)...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := theCluster.KubectlCmd(context.Background(), nil, "-n", name, "get", "events", "--sort-by=.lastTimestamp")
			t.Logf("events in %s:\n%s", name, out)
		}
		theCluster.KubectlCmd(context.Background(), nil, "delete", "namespace", name, "--wait=false")
	})
	return name
}

// localImages puts the cluster's images where deploy/ has example names:
// what a user does to a manifest before applying it.
func localImages(manifest string) []byte {
	return []byte(strings.NewReplacer(
		"registry.example.com/istio/proxyv2-draind:1.31.1", images.ProxyV2,
		"registry.example.com/draind:1.0", images.Draind,
		"registry.example.com/web:1.0", images.TestApp,
		"registry.example.com/report:1.0", images.TestApp,
	).Replace(manifest))
}

func readRepo(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Acceptance 1: a Ready node, istiod's webhook registered.
func TestClusterReady(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	nodes := kubectl(t, nil, "get", "nodes")
	t.Logf("kubectl get nodes:\n%s", nodes)
	if !strings.Contains(nodes, theCluster.Config.Node.NodeName) || !strings.Contains(nodes, " Ready ") {
		t.Errorf("node %s not Ready:\n%s", theCluster.Config.Node.NodeName, nodes)
	}
	hooks := kubectl(t, nil, "get", "mutatingwebhookconfigurations")
	t.Logf("kubectl get mutatingwebhookconfigurations:\n%s", hooks)
	if !strings.Contains(hooks, "istio-sidecar-injector") {
		t.Errorf("istiod's webhook is not registered:\n%s", hooks)
	}
}

// podsOf lists the pods of a namespace with a label selector.
func podsOf(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	l, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func waitPodsReady(t *testing.T, ns, selector string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	// The Deployment's pods exist only once the controller made them.
	end := time.Now().Add(timeout)
	for len(podsOf(t, ns, selector)) == 0 {
		if time.Now().After(end) {
			t.Fatalf("no pod %s in %s after %s", selector, ns, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := theCluster.KubectlCmd(ctx, nil, "-n", ns, "wait", "--for=condition=Ready", "pod", "-l", selector, "--timeout", timeout.String()); err != nil {
		out, _ := theCluster.KubectlCmd(context.Background(), nil, "-n", ns, "get", "pods", "-o", "wide")
		desc, _ := theCluster.KubectlCmd(context.Background(), nil, "-n", ns, "describe", "pods", "-l", selector)
		t.Fatalf("%v\n%s\n%s", err, out, desc)
	}
}

// Acceptance 2: the Istio adoption steps of docs/kubernetes.md, as a user
// runs them against the cluster: a namespace labelled for injection, then
// either a plain Deployment (draind above pilot-agent by the injection
// templates: the values file's defaultTemplates) or deploy/istio's per-pod
// override. The pod istiod's webhook wrote runs draind above pilot-agent,
// behind istio-init's interception, and matches what `istioctl
// kube-inject` writes from the same injector configuration.
func TestClusterIstioAdoption(t *testing.T) {
	requireIstiod(t)
	t.Parallel()
	for _, tc := range []struct {
		name, manifest, selector, container string
		// kubeInjectAnnotation: istioctl kube-inject starts from the
		// template [sidecar] whatever defaultTemplates say; the webhook's
		// default is told to it by the annotation.
		kubeInjectTemplates string
	}{
		{"template", plainWeb, "app=web", "istio-proxy", clusterDefaultTemplates},
		// The override under the default templates: draind's over it,
		// the app's hook added.
		{"override", readRepo(t, "deploy/istio/sidecar.yaml"), "app=web", "istio-proxy", clusterDefaultTemplates},
		// Istio's stock sidecar, one annotation away: pilot-agent alone.
		{"stock", strings.Replace(plainWeb, "      labels: {app: web}\n", "      labels: {app: web}\n      annotations: {inject.istio.io/templates: sidecar}\n", 1), "app=web", "istio-proxy", "sidecar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testNamespace(t, "adopt-"+tc.name, "istio-injection=enabled")
			manifest := localImages(tc.manifest)
			kubectl(t, manifest, "-n", ns, "apply", "-f", "-")
			waitPodsReady(t, ns, tc.selector, 3*time.Minute)
			pod := podsOf(t, ns, tc.selector)[0]

			proxy := containerNamed(&pod.Spec, tc.container)
			if proxy == nil {
				t.Fatalf("pod %s has no %s container: %v", pod.Name, tc.container, containerNames(pod.Spec))
			}
			stock := tc.name == "stock"
			want := []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/pilot-agent"}
			if stock {
				want = nil // the image's entrypoint: pilot-agent
			}
			if !slices.Equal(proxy.Command, want) {
				t.Errorf("%s command = %q, want %q", tc.container, proxy.Command, want)
			}
			if slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "istio-init" }) < 0 {
				t.Errorf("no istio-init: %v", containerNames(pod.Spec))
			}
			for _, s := range pod.Status.InitContainerStatuses {
				if s.Name == "istio-init" && (s.State.Terminated == nil || s.State.Terminated.ExitCode != 0) {
					t.Errorf("istio-init did not exit 0: %+v", s.State)
				}
			}
			// Istio's interception in effect in the pod's network
			// namespace: inbound redirected to Envoy's 15006.
			rules := podIptables(t, pod)
			if !strings.Contains(rules, "ISTIO_INBOUND") || !strings.Contains(rules, "--to-ports 15006") {
				t.Errorf("no Istio inbound interception in the pod's network namespace:\n%s", rules)
			}
			// A request through the pod's IP reaches the app through Envoy.
			out := kubectl(t, nil, "-n", ns, "get", "pod", pod.Name, "-o", "jsonpath={.status.podIP}")
			if body, err := httpGet(fmt.Sprintf("http://%s:8080/", out)); err != nil || !strings.Contains(body, "app ok") {
				t.Errorf("GET the app through its pod IP: %q, %v", body, err)
			}
			logs := kubectl(t, nil, "-n", ns, "logs", pod.Name, "-c", tc.container)
			if r := findLog(parsePlainJSONLog(logs), logevent.ProxyIsPilotAgent); (r == nil) != stock {
				t.Errorf("draind above pilot-agent: %t, want %t; the log:\n%s", r != nil, !stock, logs)
			}

			// istioctl kube-inject, from the injector configuration istiod
			// serves (its ConfigMaps as the values file rendered them).
			native := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == tc.container }) >= 0
			t.Logf("istiod injected %s as a native sidecar: %t", tc.container, native)
			injected := kubeInject(t, manifest, tc.kubeInjectTemplates, native)
			compareInjection(t, pod.Spec, injected)
		})
	}
}

// clusterDefaultTemplates are istiod's default templates in the cluster
// (testdata/cluster/istio-values.yaml), as an annotation gives them.
const clusterDefaultTemplates = "sidecar,draind,draind-ebpf,draind-app-prestop"

// plainWeb is the Deployment a user applies to an injection-labelled
// namespace: the test app alone; the webhook adds the sidecar.
const plainWeb = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: app
        image: registry.example.com/web:1.0
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /readyz, port: 8080}
          periodSeconds: 2
`

func containerNames(spec corev1.PodSpec) []string {
	var n []string
	for _, c := range spec.InitContainers {
		n = append(n, "init:"+c.Name)
	}
	for _, c := range spec.Containers {
		n = append(n, c.Name)
	}
	return n
}

// podIptables is iptables-save in the pod's network namespace, entered
// through its sandbox's process.
func podIptables(t *testing.T, pod corev1.Pod) string {
	t.Helper()
	pid := podPID(t, pod)
	out, err := exec.Command("nsenter", "-t", fmt.Sprint(pid), "-n", "iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save in pod %s: %v: %s", pod.Name, err, out)
	}
	return string(out)
}

// podPID is the PID of one of the pod's running containers' processes,
// from containerd through the CRI.
func podPID(t *testing.T, pod corev1.Pod) int {
	t.Helper()
	rt := theCluster.Node.Runtime
	cs, err := rt.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Containers) == 0 {
		t.Fatalf("no running container of pod %s", pod.Name)
	}
	return criContainerPID(t, rt, cs.Containers[0].Id)
}

// kubeInject runs istioctl kube-inject on manifest with the injector's
// configuration read from the cluster.
func kubeInject(t *testing.T, manifest []byte, templates string, native bool) corev1.PodSpec {
	t.Helper()
	dir := t.TempDir()
	cfgJSON := kubectl(t, nil, "-n", "istio-system", "get", "configmap", "istio-sidecar-injector", "-o", "json")
	meshJSON := kubectl(t, nil, "-n", "istio-system", "get", "configmap", "istio", "-o", "json")
	var inj, mesh corev1.ConfigMap
	if err := json.Unmarshal([]byte(cfgJSON), &inj); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(meshJSON), &mesh); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"config.yaml": inj.Data["config"], "values.json": inj.Data["values"], "mesh.yaml": mesh.Data["mesh"]}
	for n, s := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var d appsv1.Deployment
	for _, doc := range docSep.Split(string(manifest), -1) {
		var dd appsv1.Deployment
		if yaml.Unmarshal([]byte(doc), &dd) == nil && dd.Kind == "Deployment" {
			d = dd
			break
		}
	}
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	if templates != "" {
		d.Spec.Template.Annotations["inject.istio.io/templates"] = templates
	}
	d.Spec.Template.Annotations["sidecar.istio.io/nativeSidecar"] = strconv.FormatBool(native)
	in, _ := yaml.Marshal(d)
	if err := os.WriteFile(filepath.Join(dir, "in.yaml"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(theCluster.Istioctl, "kube-inject", "-r", "default", "-f", filepath.Join(dir, "in.yaml"),
		"--injectConfigFile", filepath.Join(dir, "config.yaml"), "--meshConfigFile", filepath.Join(dir, "mesh.yaml"),
		"--valuesFile", filepath.Join(dir, "values.json")).Output()
	if err != nil {
		t.Fatalf("istioctl kube-inject: %v", err)
	}
	var injected appsv1.Deployment
	if err := yaml.Unmarshal(out, &injected); err != nil {
		t.Fatalf("istioctl kube-inject output: %v\n%s", err, out)
	}
	return injected.Spec.Template.Spec
}

// compareInjection compares what makes the sidecar: for each container,
// init or not, its name, image, command, args, env names, readiness and
// startup probes and capabilities. Values the API server defaults, or that
// only a live pod has, are left out.
func compareInjection(t *testing.T, webhook, kubeInject corev1.PodSpec) {
	t.Helper()
	describe := func(spec corev1.PodSpec) []string {
		var out []string
		add := func(kind string, cs []corev1.Container) {
			for _, c := range cs {
				var env []string
				for _, e := range c.Env {
					env = append(env, e.Name)
				}
				sort.Strings(env)
				probe := func(p *corev1.Probe) string {
					if p == nil || p.HTTPGet == nil {
						return "-"
					}
					return fmt.Sprintf("%s:%s", p.HTTPGet.Path, p.HTTPGet.Port.String())
				}
				var caps string
				if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil {
					caps = fmt.Sprintf("add=%v drop=%v", sc.Capabilities.Add, sc.Capabilities.Drop)
				}
				preStop := "-"
				if l := c.Lifecycle; l != nil && l.PreStop != nil {
					switch h := l.PreStop; {
					case h.HTTPGet != nil:
						preStop = fmt.Sprintf("%s:%s", h.HTTPGet.Path, h.HTTPGet.Port.String())
					case h.Exec != nil:
						preStop = fmt.Sprintf("exec %q", h.Exec.Command)
					case h.Sleep != nil:
						preStop = fmt.Sprintf("sleep %d", h.Sleep.Seconds)
					}
				}
				out = append(out, fmt.Sprintf("%s %s image=%s command=%q args=%q env=%v readiness=%s startup=%s caps=%s preStop=%s",
					kind, c.Name, c.Image, c.Command, c.Args, env, probe(c.ReadinessProbe), probe(c.StartupProbe), caps, preStop))
			}
		}
		add("init", spec.InitContainers)
		add("container", spec.Containers)
		return out
	}
	w, k := describe(webhook), describe(kubeInject)
	if !slices.Equal(w, k) {
		t.Errorf("the pod istiod's webhook wrote differs from istioctl kube-inject's:\nwebhook:\n  %s\nkube-inject:\n  %s", strings.Join(w, "\n  "), strings.Join(k, "\n  "))
	} else {
		t.Logf("webhook and istioctl kube-inject agree on %d containers", len(w))
	}
}

// followLog streams a container's log (`kubectl logs -f`) into the
// buffer it returns, until the container exits or ctx ends; the channel
// then gets kubectl's end, and the buffer may be read.
func followLog(t *testing.T, ctx context.Context, ns, pod, container string) (*bytes.Buffer, <-chan error) {
	t.Helper()
	var logs bytes.Buffer
	done := make(chan error, 1)
	lc := exec.CommandContext(ctx, theCluster.Kubectl(), "--kubeconfig", theCluster.KubeConfig(), "-n", ns, "logs", "-f", pod, "-c", container)
	lc.Stdout = &logs
	if err := lc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- lc.Wait() }()
	return &logs, done
}

// answer is a request's end: the body, the error (a status other than
// 200 is one), and when it came.
type answer struct {
	body string
	err  error
	at   time.Time
}

// getInFlight sends GET url (testapp's /slow), one connection, within
// timeout, and returns once the app says the request waits in its handler
// (testapp.InFlight): it is then in flight through the pod's proxy, not
// hoped to be. Its answer comes on the channel; the test's end cancels
// it.
func getInFlight(t *testing.T, url string, timeout time.Duration) <-chan answer {
	t.Helper()
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	reply, err := testapp.InFlight(t.Context(), hc, url, timeout)
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan answer, 1)
	go func() {
		r := <-reply
		if r.Err == nil && r.Code != http.StatusOK {
			r.Err = fmt.Errorf("status %d", r.Code)
		}
		answered <- answer{r.Body, r.Err, r.At}
	}()
	return answered
}

// parsePlainJSONLog reads `kubectl logs` output: one JSON object a line.
func parsePlainJSONLog(s string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// httpGet makes one request with a fresh connection.
func httpGet(url string) (string, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %s", resp.Status)
	}
	return string(b), err
}
