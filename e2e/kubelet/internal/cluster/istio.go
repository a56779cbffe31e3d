package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// istiodNamespace is where Istio's charts put istiod.
const istiodNamespace = "istio-system"

// Rendered is what `istioctl manifest generate` made of the values files:
// every object of Istio's charts, as the cluster applies them.
type Rendered struct {
	Objects []map[string]any
	// Istiod is the chart's istiod Deployment: its container's args and
	// env are how the process runs. It is not applied.
	Istiod map[string]any
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// Render runs `istioctl manifest generate -f FILE...`: Istio's own charts,
// rendered offline from inside the istioctl binary.
func Render(ctx context.Context, istioctl string, values ...string) (*Rendered, error) {
	args := []string{"manifest", "generate"}
	for _, v := range values {
		args = append(args, "-f", v)
	}
	cmd := exec.CommandContext(ctx, istioctl, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("istioctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	r := &Rendered{}
	for _, doc := range docSep.Split(string(out), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, fmt.Errorf("istioctl manifest generate: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		kind, _ := obj["kind"].(string)
		name, _ := nested(obj, "metadata", "name").(string)
		switch {
		case kind == "Deployment" && name == "istiod":
			r.Istiod = obj
		case (kind == "HorizontalPodAutoscaler" || kind == "PodDisruptionBudget") && name == "istiod":
			// istiod's pods' scaling and disruption: there are none.
		default:
			r.Objects = append(r.Objects, obj)
		}
	}
	if r.Istiod == nil {
		return nil, errors.New("istioctl manifest generate: no istiod Deployment")
	}
	return r, nil
}

func nested(o map[string]any, path ...string) any {
	var v any = o
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// startIstiod renders Istio's charts, applies them with istiod's Service
// pointing at this node (istiod runs here as a process, not as a pod),
// starts pilot-discovery as the chart's Deployment would run it, and waits
// until istiod is ready and has patched its webhook's caBundle.
func (c *Cluster) startIstiod(ctx context.Context) error {
	r, err := Render(ctx, c.Istioctl, c.IstioValues...)
	if err != nil {
		return err
	}
	if _, err := c.KubectlCmd(ctx, nil, "create", "namespace", istiodNamespace); err != nil {
		return err
	}
	var docs []string
	for _, o := range r.Objects {
		if o["kind"] == "Service" && nested(o, "metadata", "name") == "istiod" {
			// No pod behind it: its endpoints are this node (below).
			delete(o["spec"].(map[string]any), "selector")
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		docs = append(docs, string(b))
	}
	docs = append(docs, c.istiodEndpoints())
	if _, err := c.KubectlCmd(ctx, []byte(strings.Join(docs, "---\n")), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		return err
	}

	args, env, err := istiodProcess(r.Istiod)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Config.StateDir, "istiod")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args = append(args,
		"--kubeconfig", c.KubeConfig(),
		"--httpAddr", fmt.Sprintf("127.0.0.1:%d", istiodHTTPPort),
		"--httpsAddr", fmt.Sprintf(":%d", istiodWebhookPort),
		"--ctrlz_port", "0")
	env = append(env,
		"KUBECONFIG="+c.KubeConfig(),
		"POD_NAME=istiod-"+c.Config.Node.NodeName,
		"POD_NAMESPACE="+istiodNamespace,
		"SERVICE_ACCOUNT=istiod",
		// No cloud metadata server to ask: this node is on no cloud.
		"CLOUD_PLATFORM=none",
		"PATH=/usr/bin:/bin")
	if err := node.StartDaemonIn(c.Config.daemons(), dir, env, "pilot-discovery", c.Istiod, args...); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "pilot-discovery", c.Config.daemons(), &http.Client{Timeout: 2 * time.Second}, fmt.Sprintf("http://127.0.0.1:%d/ready", istiodHTTPPort), 120*time.Second); err != nil {
		return err
	}
	// istiod patches the caBundle of the webhooks labelled with its
	// revision; until then the API server cannot call it.
	err = node.WaitFor(ctx, 60*time.Second, func() error {
		var hook struct {
			Webhooks []struct {
				ClientConfig struct {
					CABundle string `json:"caBundle"`
				} `json:"clientConfig"`
			}
		}
		if err := c.getJSON(ctx, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/istio-sidecar-injector", &hook); err != nil {
			return err
		}
		if len(hook.Webhooks) == 0 || hook.Webhooks[0].ClientConfig.CABundle == "" {
			return errors.New("caBundle empty")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("webhook istio-sidecar-injector: no caBundle after 60 s: %w (log: %s)", err, node.Tail(filepath.Join(c.Config.StateDir, "pilot-discovery.log")))
	}
	return nil
}

// istiodEndpoints is the EndpointSlice of the Service istiod: this node's
// address on the ports the chart's Service targets.
func (c *Cluster) istiodEndpoints() string {
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: istiod-node
  namespace: %s
  labels:
    kubernetes.io/service-name: istiod
    endpointslice.kubernetes.io/managed-by: draind-cluster
addressType: IPv4
endpoints:
- addresses: [%q]
  conditions: {ready: true}
ports:
- {name: grpc-xds, port: 15010, protocol: TCP}
- {name: https-dns, port: 15012, protocol: TCP}
- {name: https-webhook, port: %d, protocol: TCP}
- {name: http-monitoring, port: 15014, protocol: TCP}
`, istiodNamespace, c.NodeIP, istiodWebhookPort)
}

// istiodProcess is the discovery container of the chart's Deployment as a
// process: its args, and its env with the values it sets (those it takes
// from the pod through the downward API are set by the caller; the
// resource-derived GOMAXPROCS and GOMEMLIMIT are left out).
func istiodProcess(dep map[string]any) (args, env []string, err error) {
	cs, _ := nested(dep, "spec", "template", "spec", "containers").([]any)
	for _, ci := range cs {
		c, _ := ci.(map[string]any)
		if c["name"] != "discovery" {
			continue
		}
		for _, a := range asSlice(c["args"]) {
			args = append(args, fmt.Sprint(a))
		}
		for _, ei := range asSlice(c["env"]) {
			e, _ := ei.(map[string]any)
			// KUBECONFIG is the chart's path of a remote cluster's
			// secret: the caller gives the administrator's.
			if v, ok := e["value"]; ok && e["name"] != "KUBECONFIG" {
				env = append(env, fmt.Sprintf("%s=%v", e["name"], v))
			}
		}
		return args, env, nil
	}
	return nil, nil, errors.New("istiod Deployment: no container discovery")
}

func asSlice(v any) []any { s, _ := v.([]any); return s }
