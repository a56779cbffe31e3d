package kubelet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/testutil"
)

// Issue 41, acceptance 3: every way a connection reaches a pod counts for
// the out-of-rotation rule, on the cluster's bridge CNI. A pod of
// deploy/classic-sidecar.yaml (2 replicas, the app's preStop on draind's
// wait) is deleted while three clients open a new connection every 100 ms:
//
//	node           the node itself through the ClusterIP
//	nodeport       an outside client through a NodePort under
//	               externalTrafficPolicy Cluster (masqueraded by the node)
//	nodeport-local the same under Local (the client's address kept)
//
// The outside client is a network namespace of its own routed through the
// node, standing for a load balancer. None of their connections fails, and
// the deleted pod's out_of_rotation line counts the node's and the
// outside's.
func TestClusterRotationNodeClients(t *testing.T) {
	c := requireCluster(t)
	t.Parallel()
	ns := testNamespace(t, "peers")
	kubectl(t, envoySidecarConfigMap(t), "-n", ns, "apply", "-f", "-")
	kubectl(t, []byte(`apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 15006}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np}
spec:
  type: NodePort
  externalTrafficPolicy: Cluster
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 15006}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np-local}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 15006}]
`), "-n", ns, "apply", "-f", "-")
	kubectl(t, localImages(readRepo(t, "deploy/classic-sidecar.yaml")), "-n", ns, "apply", "-f", "-")
	waitPodsReady(t, ns, "app=web", 2*time.Minute)
	kubectl(t, nil, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")

	clusterIP := strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	nodePort := func(svc string) string {
		return strings.TrimSpace(kubectl(t, nil, "-n", ns, "get", "service", svc, "-o", "jsonpath={.spec.ports[0].nodePort}"))
	}
	outside := outsideHost(t)
	paths := []*pathClients{
		{name: "node", url: "http://" + clusterIP + "/", dial: (&net.Dialer{}).DialContext},
		{name: "nodeport", url: "http://" + net.JoinHostPort(c.NodeIP, nodePort("web-np")) + "/", dial: outside.Dialer()},
		{name: "nodeport-local", url: "http://" + net.JoinHostPort(c.NodeIP, nodePort("web-np-local")) + "/", dial: outside.Dialer()},
	}
	for _, p := range paths {
		waitUntil(t, time.Minute, p.name+" reaches the pods", func() bool { return p.once() == nil })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := podsOf(t, ns, "app=web")[0]
	logs, logsDone := followLog(t, ctx, ns, pod.Name, "envoy")
	for _, p := range paths {
		p.start(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the rate before the deletion
	if err := kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-logsDone:
	case <-ctx.Done():
		t.Fatal("draind's container did not exit within 2 min of the deletion")
	}
	time.Sleep(time.Second) // the clients on, past the pod's end
	for _, p := range paths {
		p.halt()
		t.Logf("%s: %d ok, %d failed (first: %v)", p.name, p.ok.Load(), p.failed.Load(), p.firstErr)
		if p.failed.Load() != 0 || p.ok.Load() == 0 {
			t.Errorf("%s: %d connections failed (first: %v), %d ok", p.name, p.failed.Load(), p.firstErr, p.ok.Load())
		}
	}
	out := findLog(parsePlainJSONLog(logs.String()), logevent.OutOfRotation)
	if out == nil {
		t.Fatalf("no out_of_rotation line in draind's log:\n%s", logs.String())
	}
	t.Logf("out of rotation %v (%v): %v connections, %v from the node, %v from pods, %v other, %v probes left out", out["took"], out["why"],
		out["connections"], out["from_node"], out["from_pods"], out["from_other"], out["probes_left_out"])
	if n, _ := out["from_node"].(float64); n == 0 {
		t.Errorf("the node's connections not counted: %v", out)
	}
	if n, _ := out["from_other"].(float64); n == 0 {
		t.Errorf("the outside client's connections (externalTrafficPolicy Local) not counted: %v", out)
	}
	if out["why"] == "ceiling" {
		t.Errorf("out of rotation at the ceiling: %v", out)
	}
}

// pathClients opens a new connection every period to url and sends one
// request on it, each in its own goroutine.
type pathClients struct {
	name     string
	url      string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	ok       atomic.Int64
	failed   atomic.Int64
	mu       sync.Mutex
	firstErr error
	stop     chan struct{}
	wg       sync.WaitGroup
}

// once sends one request on a new connection.
func (p *pathClients) once() error {
	hc := &http.Client{Transport: &http.Transport{DialContext: p.dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := hc.Get(p.url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

func (p *pathClients) start(period time.Duration) {
	p.stop = make(chan struct{})
	p.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tk.C:
			}
			p.wg.Go(func() {
				if err := p.once(); err != nil {
					p.failed.Add(1)
					p.mu.Lock()
					if p.firstErr == nil {
						p.firstErr = err
					}
					p.mu.Unlock()
					return
				}
				p.ok.Add(1)
			})
		}
	})
}

// halt stops opening connections and waits for those in flight.
func (p *pathClients) halt() {
	close(p.stop)
	p.wg.Wait()
}

// outsideAddr is the outside host's address.
var outsideAddr = netip.MustParseAddr("198.51.100.2")

// outsideHost is a network namespace routed through the node, as a load
// balancer or a client on the node's network reaches it: a veth to the
// node, its default route there. Removed at the test's end.
func outsideHost(t *testing.T) *testutil.NetNS {
	t.Helper()
	const (
		nodeSide = "198.51.100.1/30"
		nodeLink = "drd-out0"
	)
	outsideSide := outsideAddr.String() + "/30"
	outside := testutil.NewNetNS(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nodeLink}, PeerName: "eth0", PeerNamespace: netlink.NsFd(outside.Handle)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("outside host: veth: %v", err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("outside host: %s: %v", what, err)
		}
	}
	addr := func(cidr string) *netlink.Addr {
		a, err := netlink.ParseAddr(cidr)
		must(cidr, err)
		return a
	}
	l, err := netlink.LinkByName(nodeLink)
	must("node side", err)
	must("node address", netlink.AddrAdd(l, addr(nodeSide)))
	must("node side up", netlink.LinkSetUp(l))
	h, err := netlink.NewHandleAt(outside.Handle)
	must("netlink", err)
	defer h.Close()
	o, err := h.LinkByName("eth0")
	must("outside side", err)
	must("outside address", h.AddrAdd(o, addr(outsideSide)))
	must("outside up", h.LinkSetUp(o))
	lo, err := h.LinkByName("lo")
	must("loopback", err)
	must("loopback up", h.LinkSetUp(lo))
	gw, _, _ := net.ParseCIDR(nodeSide)
	must("default route", h.RouteAdd(&netlink.Route{LinkIndex: o.Attrs().Index, Gw: gw}))
	return outside
}
