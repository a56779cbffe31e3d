package kubelet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/cluster"
)

// upgradeWeb is a stock mesh's Deployment as a careful team runs it before
// draind: the app keeps serving 5 s after its SIGTERM (agnhost's
// --delay-shutdown), which a mesh without draind needs to lose nothing at
// a pod's end (kube-proxy still sends for a sync after the deletion). It
// has no preStop: under draind's values the template writes one. Its
// Service sends to the app's port, which Istio's interception hands to
// the sidecar.
const upgradeWeb = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
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
        args: [--delay-shutdown, 5s]
        readinessProbe:
          httpGet: {path: /readyz, port: 8080}
          periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// TestClusterIstioUpgrade (issue 42, acceptance 4): the upgrade path of
// docs/kubernetes.md, "Istio", under a load of new connections from the
// node through the ClusterIP: a mesh running Istio's stock injector, then
// draind's values installed over it and a rollout restart (the pods come
// back with draind above pilot-agent, the app's hook from the template), then the
// values removed and a rollout restart again (the pods come back stock).
// Not one connection fails. Installing the values is what `istioctl
// install -f` and `helm upgrade` do to a running istiod: they replace the
// istio-sidecar-injector ConfigMap, which istiod watches. It changes what
// every namespace's pods get, so this test runs alone (not in parallel),
// and puts the cluster's injector back at its end.
func TestClusterIstioUpgrade(t *testing.T) {
	c := requireCluster(t)
	requireIstiod(t)
	if os.Getenv("DRAIND_E2E_CLUSTER_SHORT") == "1" {
		t.Skip("make e2e-cluster-short leaves out the two rollouts under load (CI's time): make e2e-cluster runs them")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	withDraind := injectorConfigMap(t, ctx, c.Istioctl, c.IstioValues...)
	// The stock mesh: the cluster's own values (its images, no cloud)
	// without draind's file, Istio's sidecar template alone.
	stockValues := filepath.Join(t.TempDir(), "stock.yaml")
	if err := os.WriteFile(stockValues, []byte("apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  values:\n    sidecarInjectorWebhook:\n      defaultTemplates: [sidecar]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, v := range c.IstioValues {
		if !strings.HasSuffix(v, "deploy/istio/injection-template.yaml") {
			own = append(own, v)
		}
	}
	stock := injectorConfigMap(t, ctx, c.Istioctl, append(own, stockValues)...)

	ns := testNamespace(t, "upgrade", "istio-injection=enabled")
	probe := localImages(fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: %s}\nspec:\n  containers:\n  - {name: app, image: registry.example.com/web:1.0}\n", ns))
	install := func(cm []byte, draind bool) {
		t.Helper()
		kubectl(t, cm, "apply", "--server-side", "--force-conflicts", "-f", "-")
		// istiod reloads the ConfigMap on its own watch: a server-side
		// dry run goes through the webhook and shows when it has.
		waitUntil(t, time.Minute, fmt.Sprintf("istiod injecting draind: %t", draind), func() bool {
			out, err := c.KubectlCmd(ctx, probe, "create", "--dry-run=server", "-o", "yaml", "-f", "-")
			return err == nil && strings.Contains(string(out), "/usr/local/bin/draind") == draind
		})
	}
	t.Cleanup(func() {
		// The cluster's injector back, for the tests after this one.
		if _, err := c.KubectlCmd(context.Background(), withDraind, "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
			t.Errorf("put draind's injector back: %v", err)
		}
	})
	install(stock, false)

	kubectl(t, localImages(upgradeWeb), "-n", ns, "apply", "-f", "-")
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
	clusterIP := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	load := &pathClients{name: "node", url: "http://" + clusterIP + "/", dial: (&net.Dialer{}).DialContext}
	waitServiceRules(t, clusterIP)
	waitUntil(t, time.Minute, "the node reaches the pods", func() bool { return load.once() == nil })
	wantPods(t, ns, false)
	load.start(50 * time.Millisecond) // 20 new connections a second
	defer func() {
		if load.stop != nil {
			load.halt()
		}
	}()

	steps := []struct {
		name   string
		cm     []byte
		draind bool
	}{
		{"install draind's values over the running mesh", withDraind, true},
		{"back out: the stock values again", stock, false},
	}
	for _, s := range steps {
		t0 := time.Now()
		install(s.cm, s.draind)
		t.Logf("%s: restart at %s", s.name, time.Now().Format("15:04:05.000"))
		kubectl(t, nil, "-n", ns, "rollout", "restart", "deployment/web")
		kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
		// The old pods' ends, under load, before the next step.
		waitUntil(t, 2*time.Minute, "the old pods gone", func() bool { return len(podsOf(t, ns, "app=web")) == 3 })
		wantPods(t, ns, s.draind)
		t.Logf("%s: %s; %d ok, %d failed so far", s.name, fmtDur(time.Since(t0)), load.ok.Load(), load.failed.Load())
	}
	time.Sleep(2 * time.Second) // the clients on, past the last pod's end
	load.halt()
	load.stop = nil
	t.Logf("new connections through the ClusterIP: %d ok, %d failed (first: %v)", load.ok.Load(), load.failed.Load(), load.firstErr)
	if load.failed.Load() != 0 || load.ok.Load() == 0 {
		t.Errorf("%d connections failed (first: %v), %d ok:\n%s", load.failed.Load(), load.firstErr, load.ok.Load(), strings.Join(load.failures, "\n"))
		out, _ := c.KubectlCmd(context.Background(), nil, "-n", ns, "get", "events", "--sort-by=.lastTimestamp", "-o",
			"custom-columns=FIRST:.firstTimestamp,LAST:.lastTimestamp,REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message")
		t.Logf("events:\n%s", out)
	}
}

// injectorConfigMap renders Istio's charts with values and returns the
// istio-sidecar-injector ConfigMap they make, as YAML to apply.
func injectorConfigMap(t *testing.T, ctx context.Context, istioctl string, values ...string) []byte {
	t.Helper()
	r, err := cluster.Render(ctx, istioctl, values...)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.Objects {
		md, _ := o["metadata"].(map[string]any)
		if o["kind"] == "ConfigMap" && md["name"] == "istio-sidecar-injector" {
			b, err := yaml.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no istio-sidecar-injector ConfigMap rendered from %v", values)
	return nil
}

// wantPods checks the Deployment's pods: draind above pilot-agent with
// the app's out-of-rotation hook from the template, or Istio's stock
// sidecar with the app as written.
func wantPods(t *testing.T, ns string, draind bool) {
	t.Helper()
	for _, p := range podsOf(t, ns, "app=web") {
		if p.DeletionTimestamp != nil {
			continue
		}
		proxy := containerNamed(&p.Spec, "istio-proxy")
		if proxy == nil {
			t.Errorf("pod %s: no istio-proxy: %v", p.Name, containerNames(p.Spec))
			continue
		}
		if got := slices.Contains(proxy.Command, "/usr/local/bin/draind"); got != draind {
			t.Errorf("pod %s: draind in istio-proxy's command %q: %t, want %t", p.Name, proxy.Command, got, draind)
		}
		app := containerNamed(&p.Spec, "app")
		if app == nil {
			t.Errorf("pod %s: no app container", p.Name)
			continue
		}
		hooked := app.Lifecycle != nil && app.Lifecycle.PreStop != nil && app.Lifecycle.PreStop.HTTPGet != nil &&
			app.Lifecycle.PreStop.HTTPGet.Path == "/app-lifecycle/app/prestopz"
		if hooked != draind {
			t.Errorf("pod %s: the app's preStop %+v; want draind's wait: %t", p.Name, app.Lifecycle, draind)
		}
	}
}
