package kubelet_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/internal/logevent"
)

// xdsShape is the rollout's load through the mesh's control plane (issue
// 45): a proxyless gRPC client (xdsload) that learns the web pods'
// endpoints from istiod's EDS, keeps a pooled HTTP/2 connection to each,
// and leaves a pod when istiod pushes its removal or the pod's proxy sends
// a GOAWAY. Its calls go to the pods' addresses, past kube-proxy.
const xdsShape = "xds-grpc"

// istiodXDS is istiod's plaintext xDS address for the clients in pods,
// by the name its Service has in every cluster.
const istiodXDS = "istiod.istio-system.svc:15010"

// grpcTargetPort is where the web Service's gRPC port goes in st's pods:
// the app's port, which istio-init redirects to the proxy, or, without
// istio-init, the deploy/ sidecar's gRPC listener.
func grpcTargetPort(st rolloutStrategy) int {
	if st.injected {
		return images.GRPCPort
	}
	return images.GRPCInboundPort
}

// xdsLoadPod is the xds-grpc shape's client pod, not injected, at the
// other shapes' rate and timeout. --warmup: the first call waits for
// istiod's answer and a first connection, so the load's start is no
// failure.
const xdsLoadPod = `apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {role: load, sidecar.istio.io/inject: "false"}
spec:
  restartPolicy: Never
  containers:
  - name: %[1]s
    image: ` + images.LoadClient + `
    command: [/usr/local/bin/xdsload]
    args: [--target, "xds:///web.%[2]s.svc.cluster.local:%[3]d", --xds-server, %[4]q, --qps, "%[5]v", --timeout, %[6]s,
           --duration, 30m, --warmup, 60s, --stop-addr, ":%[7]d"]
    resources: {requests: {cpu: %[8]s}}
    env:
    - name: INSTANCE_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
`

// startXDSLoad starts the xds-grpc client of event ev; it returns the
// pod's name.
func (r *rolloutNS) startXDSLoad(t *testing.T, ev string) string {
	t.Helper()
	name := "load-" + ev + "-" + xdsShape
	kubectl(t, fmt.Appendf(nil, xdsLoadPod, name, r.ns, images.GRPCPort, istiodXDS, rolloutQPS, loadTimeout, loadStopPort, standInCPU),
		"-n", r.ns, "apply", "-f", "-")
	return name
}

// sliceWatch follows the EndpointSlices of one Service: when each
// endpoint address was first seen not ready or gone (the EndpointSlice
// controller's change for a pod being deleted, which istiod watches).
type sliceWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   map[netip.Addr]bool
	out    map[netip.Addr]time.Time
}

func watchSlices(t *testing.T, ns, service string) *sliceWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	sw := &sliceWatch{cancel: cancel, done: make(chan struct{}), seen: map[netip.Addr]bool{}, out: map[netip.Addr]time.Time{}}
	go func() {
		defer close(sw.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*discoveryv1.EndpointSlice); ok {
				sw.see(s)
			}
		}
	}()
	t.Cleanup(sw.stop)
	return sw
}

// see notes the addresses of s that are not ready, and those followed
// that left it. An address that moves between the Service's slices is
// taken as gone late: with one slice a Service of 45 pods never splits.
func (sw *sliceWatch) see(s *discoveryv1.EndpointSlice) {
	now := time.Now()
	sw.mu.Lock()
	defer sw.mu.Unlock()
	here := map[netip.Addr]bool{}
	for _, e := range s.Endpoints {
		for _, a := range e.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				continue
			}
			here[ip] = true
			sw.seen[ip] = true
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				sw.mark(ip, now)
			}
		}
	}
	for ip := range sw.seen {
		if !here[ip] {
			sw.mark(ip, now)
		}
	}
}

func (sw *sliceWatch) mark(ip netip.Addr, at time.Time) {
	if _, ok := sw.out[ip]; !ok {
		sw.out[ip] = at
	}
}

// outAt is when ip was first seen out of its Service's endpoints.
func (sw *sliceWatch) outAt(ip netip.Addr) (time.Time, bool) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	at, ok := sw.out[ip]
	return at, ok
}

func (sw *sliceWatch) stop() {
	sw.cancel()
	<-sw.done
}

// convergenceBounds are the buckets of istiod's pilot_proxy_convergence_time
// (pilot/pkg/xds/monitoring.go in istio.io/istio): the time from the
// config change istiod took in (an EndpointSlice's, here) to a proxy's
// push done, recorded once per pushed proxy (pushConnection in
// pilot/pkg/xds/ads.go).
var convergenceBounds = []float64{.1, .5, 1, 3, 5, 10, 20, 30}

// istiodConvergence reads istiod's pilot_proxy_convergence_time histogram
// from its monitoring port: cumulative counts per bound, then +Inf.
func istiodConvergence() ([]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + net.JoinHostPort(theCluster.NodeIP, "15014") + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("istiod's metrics: %w", err)
	}
	defer resp.Body.Close()
	counts := make([]float64, len(convergenceBounds)+1)
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "pilot_proxy_convergence_time_bucket{") {
			continue
		}
		le, rest, ok := strings.Cut(strings.TrimPrefix(l, "pilot_proxy_convergence_time_bucket{"), "} ")
		_, le, ok2 := strings.Cut(le, `le="`)
		if !ok || !ok2 {
			continue
		}
		le = strings.TrimSuffix(le, `"`)
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		i := len(convergenceBounds)
		if le != "+Inf" {
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			if i = slices.Index(convergenceBounds, b); i < 0 {
				continue
			}
		}
		counts[i] += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("istiod's metrics: %w", err)
	}
	if !found {
		return nil, fmt.Errorf("istiod's metrics: no pilot_proxy_convergence_time")
	}
	return counts, nil
}

// convergenceSummary is an event's pushes from istiod's histogram read
// before and after it: their count, the median interpolated within its
// bucket as Prometheus's histogram_quantile does, and the slowest push's
// bucket bound.
func convergenceSummary(before, after []float64) string {
	if before == nil || after == nil {
		return "unknown"
	}
	d := make([]float64, len(after))
	for i := range after {
		d[i] = after[i] - before[i]
	}
	n := d[len(d)-1]
	if n <= 0 {
		return "0 pushes"
	}
	p50 := math.NaN()
	for i, c := range d {
		if c < n/2 {
			continue
		}
		if i == len(convergenceBounds) {
			p50 = math.Inf(1)
			break
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = convergenceBounds[i-1], d[i-1]
		}
		p50 = lo + (convergenceBounds[i]-lo)*(n/2-below)/(c-below)
		break
	}
	maxBound := "+Inf"
	for i, c := range d[:len(convergenceBounds)] {
		if c >= n {
			maxBound = strconv.FormatFloat(convergenceBounds[i], 'g', -1, 64) + "s"
			break
		}
	}
	return fmt.Sprintf("%.0f pushes p50 %.2fs max ≤%s", n, p50, maxBound)
}

// xdsFigures are the xds-grpc shape's figures of an event: for each old
// pod, its deletion to its endpoint's change in the EndpointSlice and to
// the client's last call to it (from the client's summary), istiod's
// pushes meanwhile, the pods the client still called after their proxy's
// drain was done (draind's phase stopping; the proxy's exit otherwise),
// the client's connections to a pod opened after its deletion (those the
// pod's drain sees arrive), and the new connections draind's
// out-of-rotation rule counted from every shape's clients.
func xdsFigures(st rolloutStrategy, pods []*podLife, sw *sliceWatch, peers map[string]xdsPeer, pushes string) string {
	var toSlice, toLast, sliceToLast []time.Duration
	var late []string
	var newConns int
	var conns, fromPods, fromNode, fromOther, rules int64
	port := strconv.Itoa(grpcTargetPort(st))
	for _, p := range pods {
		if p.deleting.IsZero() || !p.ip.IsValid() {
			continue
		}
		out, outOK := sw.outAt(p.ip)
		if outOK {
			toSlice = append(toSlice, out.Sub(p.deleting))
		}
		if pr, ok := peers[net.JoinHostPort(p.ip.String(), port)]; ok && pr.Last != 0 {
			for _, first := range pr.Conns {
				if first >= p.deleting.UnixNano() {
					newConns++
				}
			}
			last := time.Unix(0, pr.Last)
			toLast = append(toLast, last.Sub(p.deleting))
			if outOK {
				sliceToLast = append(sliceToLast, last.Sub(out))
			}
			done := p.proxyEnd
			if st.draind {
				done = p.stopping()
			}
			if !done.IsZero() && !last.Before(done) {
				late = append(late, fmt.Sprintf("%s +%s", p.name, fmtDur(last.Sub(done))))
			}
		}
		if !st.draind {
			continue
		}
		for _, r := range p.draindLog() {
			if r[logevent.Key] != string(logevent.OutOfRotation) {
				continue
			}
			num := func(k string) int64 { f, _ := r[k].(float64); return int64(f) }
			rules++
			conns += num("connections")
			fromPods += num("from_pods")
			fromNode += num("from_node")
			fromOther += num("from_other")
		}
	}
	s := fmt.Sprintf("xds-grpc: deletion to EndpointSlice %s; istiod %s; deletion to the client's last call %s (EndpointSlice to it %s); "+
		"called after the proxy's drain done %d %v; the client's new connections to a pod after its deletion %d",
		durQuantiles(toSlice), pushes, durQuantiles(toLast), durQuantiles(sliceToLast), len(late), late, newConns)
	if st.draind {
		s += fmt.Sprintf("; draind's rule, every shape's clients: %d new connections over %d pods (pods %d, node %d, other %d)",
			conns, rules, fromPods, fromNode, fromOther)
	}
	return s
}

// xdsPeer is one endpoint's calls in xdsload's summary, and the
// connections they went over (the client's end: its first call's start).
type xdsPeer struct {
	Sent, OK, Failed, First, Last int64
	Conns                         map[string]int64
}

// durQuantiles is "N p50 X max Y".
func durQuantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%d p50 %s max %s", len(s), fmtDur(s[(len(s)-1)/2]), fmtDur(s[len(s)-1]))
}
