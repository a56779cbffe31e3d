// Command xdsload is the mesh load client of the rollout measurements
// (issue 45): it calls a Service as a pod of the mesh does, through
// gRPC-Go's own xDS resolver and balancer, which learn the Service's
// endpoints from istiod, pool a connection to each and leave an endpoint
// when istiod pushes its removal. It is the proxyless client Istio serves
// with its grpc generator: no Envoy beside it, and no kube-proxy on the
// path (its calls go to the pods' addresses).
//
//	xdsload --target xds:///web.NS.svc.cluster.local:80 --xds-server ISTIOD:15010 --qps 25 --duration 60s
//	xdsload --target passthrough:///10.0.0.9:9090 --qps 25   # one address, no xDS
//
// # Calls
//
// Each call is a unary grpc.health.v1.Health/Check (--service names the
// checked service, empty: the server's), sent on a fixed schedule of
// --qps, each with its own --timeout, for --duration or until SIGTERM (or
// a request to /stop on --stop-addr, as loadclient's). A call never waits
// for a ready connection (it fails at once when the balancer has none),
// and is not retried: the channel has retries disabled, so no retry
// policy, Istio's routes' included, applies. gRPC's transparent retry
// stays, as in every gRPC client: a call the server never saw (its
// stream refused by a GOAWAY or a REFUSED_STREAM) is sent again once;
// the summary counts them. Before the first call the client waits up to
// --warmup for the channel to be ready (istiod's answer and a first
// connection), so the load's start does not count as failures.
//
// # Bootstrap
//
// For an xds:/// target the client writes the xDS bootstrap that Istio's
// own proxyless templates give a gRPC app talking to istiod directly
// (istio.io/istio/manifests/charts/istio-control/istio-discovery/files/grpc-simple.yaml;
// pilot-agent's grpc-agent template writes the same shape through
// istio.io/istio/pkg/istio-agent/grpcxds/grpc_bootstrap.go):
//
//	{"xds_servers": [{"server_uri": "--xds-server", "channel_creds": [{"type": "insecure"}],
//	                  "server_features": ["xds_v3"]}],
//	 "node": {"id": "sidecar~POD_IP~POD_NAME.NAMESPACE~NAMESPACE.svc.cluster.local",
//	          "metadata": {"GENERATOR": "grpc", "NAMESPACE": ..., "INSTANCE_IPS": POD_IP,
//	                       "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": (with --istio-version)}}}
//
// GENERATOR=grpc makes istiod answer with its grpc generator. The node
// id's parts are what istiod parses (the IP, the pod, the DNS domain);
// the metadata are those pilot-agent sends that istiod reads for such a
// client. istiod's plaintext port 15010 asks for no credentials. The pod's
// address, name and namespace default to $INSTANCE_IP, $POD_NAME and
// $POD_NAMESPACE (the downward API, as Istio's templates set them).
// --print-bootstrap prints it and exits.
//
// The bootstrap reaches gRPC as the channel's own resolver
// (xds.NewXDSResolverWithConfigForTesting: an xDS client built from it as
// the default one is), not through GRPC_XDS_BOOTSTRAP: gRPC reads that
// variable at package init, before a process can point it at a file it
// wrote.
//
// mTLS is out of scope: the calls are plaintext HTTP/2, as the server
// pods' inbound proxy (envoysim) has no SDS to hold a workload
// certificate, and istiod's grpc generator gives a proxyless client TLS
// only when a DestinationRule asks for ISTIO_MUTUAL.
//
// # Output
//
// The output is loadclient's, so the rollout bench reads it with the same
// parser (parseLoad in e2e/kubelet/cluster_rollout_test.go): each failed
// call is a JSON line on stdout,
//
//	{"t": UNIXNANO, "class": refused|reset|timeout|status|other, "err": ...,
//	 "local": "IP:PORT", "reached": pick|connected|sent|headers, "peer": "IP:PORT"}
//
// with the call's start (t), the client's end of its connection (local)
// and the endpoint the balancer picked (peer, from grpc.Peer), once the
// call had a connection. reached is the call's last step: pick (no
// connection: the balancer had no ready endpoint), connected (its stream
// opened on one), sent (its request written), headers (an answer came:
// a failure then is the server's or its proxy's status, class status, as
// a health answer other than SERVING is). The last line is the summary,
// {"sent", "ok", "failed", "by_class", "transparent_retries", "peers"},
// where peers has, for each endpoint, the calls it got (sent, ok, failed),
// the start of the first and the last (first, last: UNIXNANO): the
// client's last call to a deleted pod, and the connections they went over
// (conns: the client's end, with its first call's start). --log-ok also
// prints a line for each call that succeeded, {"t", "class": "ok",
// "local", "reached", "peer"}; loadclient's parser would count it as a
// failure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"

	"github.com/draind/draind/e2e/kubelet/internal/loadline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsload:", err)
		os.Exit(2)
	}
}

// node is the client as istiod knows it: the node of the bootstrap.
type node struct {
	podIP, podName, namespace string
	clusterDomain             string // the node id's DNS domain is NAMESPACE.svc.DOMAIN
	clusterID                 string
	istioVersion              string // "": not sent (istiod then assumes its own)
}

type bootstrap struct {
	XDSServers []xdsServer   `json:"xds_servers"`
	Node       bootstrapNode `json:"node"`
}

type xdsServer struct {
	ServerURI      string        `json:"server_uri"`
	ChannelCreds   []channelCred `json:"channel_creds"`
	ServerFeatures []string      `json:"server_features"`
}

type channelCred struct {
	Type string `json:"type"`
}

type bootstrapNode struct {
	ID       string            `json:"id"`
	Metadata map[string]string `json:"metadata"`
}

// bootstrapJSON is the xDS bootstrap for a client of istiod's plaintext
// xDS at server (see the package doc for its source in Istio).
func bootstrapJSON(server string, n node) ([]byte, error) {
	if server == "" || n.podIP == "" || n.podName == "" || n.namespace == "" {
		return nil, errors.New("an xds target needs --xds-server, --pod-ip, --pod-name and --namespace (from the pod: $INSTANCE_IP, $POD_NAME, $POD_NAMESPACE)")
	}
	if net.ParseIP(n.podIP) == nil {
		return nil, fmt.Errorf("--pod-ip %q: not an IP address", n.podIP)
	}
	meta := map[string]string{
		"GENERATOR":    "grpc",
		"NAMESPACE":    n.namespace,
		"INSTANCE_IPS": n.podIP,
		"CLUSTER_ID":   n.clusterID,
	}
	if n.istioVersion != "" {
		meta["ISTIO_VERSION"] = n.istioVersion
	}
	b := bootstrap{
		XDSServers: []xdsServer{{
			ServerURI:      server,
			ChannelCreds:   []channelCred{{Type: "insecure"}},
			ServerFeatures: []string{"xds_v3"},
		}},
		Node: bootstrapNode{
			ID:       fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.%s", n.podIP, n.podName, n.namespace, n.namespace, n.clusterDomain),
			Metadata: meta,
		},
	}
	return json.Marshal(b)
}

// summary is loadline's, with the retries and each endpoint's calls.
type summary struct {
	loadline.Summary
	// TransparentRetries are the calls gRPC sent again because the server
	// never saw the first attempt (see the package doc).
	TransparentRetries int                   `json:"transparent_retries"`
	Peers              map[string]*peerCalls `json:"peers"`
}

// peerCalls are the calls that went to one endpoint.
type peerCalls struct {
	Sent   int   `json:"sent"`
	OK     int   `json:"ok"`
	Failed int   `json:"failed"`
	First  int64 `json:"first"`
	Last   int64 `json:"last"`
	// Conns are the connections the calls went over, each by the
	// client's end, with its first call's start: a connection to a pod
	// opened after its deletion is one the pod's drain sees arrive.
	Conns map[string]int64 `json:"conns"`
}

// outcome is a call's line, with the endpoint.
type outcome = loadline.Call

// A call's steps, as far as it reached them (the names of loadclient's,
// but a gRPC call dials nothing: its first step is the balancer's pick).
const (
	reachedPick      = "pick"
	reachedConnected = "connected"
	reachedSent      = "sent"
	reachedHeaders   = "headers"
)

// callTrace is what the stats handler saw of one call; it reaches the
// handler through the call's context.
type callTrace struct {
	mu      sync.Mutex
	reached string
	retries int
}

func (c *callTrace) set(reached string, retry bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reached = reached
	if retry {
		c.retries++
	}
}

func (c *callTrace) get() (reached string, retries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reached, c.retries
}

type traceKey struct{}

// tracer is the channel's stats handler: it records each call's steps in
// its callTrace (an attempt starts again at pick).
type tracer struct{}

func (tracer) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (tracer) HandleRPC(ctx context.Context, s stats.RPCStats) {
	tr, _ := ctx.Value(traceKey{}).(*callTrace)
	if tr == nil {
		return
	}
	switch s := s.(type) {
	case *stats.Begin:
		tr.set(reachedPick, s.IsTransparentRetryAttempt)
	case *stats.OutHeader:
		tr.set(reachedConnected, false)
	case *stats.OutPayload:
		tr.set(reachedSent, false)
	case *stats.InHeader, *stats.InTrailer:
		// A trailers-only answer (a status and no message) has no header
		// of its own.
		tr.set(reachedHeaders, false)
	}
}

func (tracer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (tracer) HandleConn(context.Context, stats.ConnStats) {}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("xdsload", flag.ContinueOnError)
	target := fs.String("target", "", "xds:///NAME.NAMESPACE.svc.cluster.local:PORT (through istiod), or passthrough:///HOST:PORT (one address, no xDS)")
	xdsServer := fs.String("xds-server", "", "istiod's plaintext xDS, HOST:PORT (port 15010); xds targets only")
	var n node
	fs.StringVar(&n.podIP, "pod-ip", os.Getenv("INSTANCE_IP"), "this pod's IP, for the node id")
	fs.StringVar(&n.podName, "pod-name", os.Getenv("POD_NAME"), "this pod's name, for the node id")
	fs.StringVar(&n.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace, for the node id and metadata")
	fs.StringVar(&n.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain")
	fs.StringVar(&n.clusterID, "cluster-id", "Kubernetes", "the node's CLUSTER_ID metadata (istiod's default cluster name)")
	fs.StringVar(&n.istioVersion, "istio-version", "", "the node's ISTIO_VERSION metadata (empty: not sent)")
	printBootstrap := fs.Bool("print-bootstrap", false, "print the xDS bootstrap and exit")
	service := fs.String("service", "", "the health service to check (empty: the server's overall health)")
	qps := fs.Float64("qps", 25, "calls a second, sent on a fixed schedule (a call every 1/qps)")
	duration := fs.Duration("duration", time.Minute, "how long to send")
	timeout := fs.Duration("timeout", 5*time.Second, "a call's timeout")
	warmup := fs.Duration("warmup", 30*time.Second, "wait this long at most for a ready channel before the first call (0: no wait)")
	logOK := fs.Bool("log-ok", false, "also print a line for every call that succeeded")
	stopAddr := fs.String("stop-addr", "", "serve /stop here: a request ends the run, with its summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	isXDS := strings.HasPrefix(*target, "xds:")
	var boot []byte
	if isXDS || *printBootstrap {
		var err error
		if boot, err = bootstrapJSON(*xdsServer, n); err != nil {
			return err
		}
	}
	if *printBootstrap {
		_, err := fmt.Fprintf(stdout, "%s\n", boot)
		return err
	}
	if *target == "" || *qps <= 0 {
		return errors.New("--target and a positive --qps are required")
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if *stopAddr != "" {
		closeStop, err := loadline.ServeStop(*stopAddr, stop)
		if err != nil {
			return err
		}
		defer closeStop()
	}

	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(),
		grpc.WithStatsHandler(tracer{}),
	}
	if isXDS {
		rb, err := xds.NewXDSResolverWithConfigForTesting(boot)
		if err != nil {
			return fmt.Errorf("xds resolver: %w", err)
		}
		opts = append(opts, grpc.WithResolvers(rb))
	}
	cc, err := grpc.NewClient(*target, opts...)
	if err != nil {
		return fmt.Errorf("channel to %s: %w", *target, err)
	}
	defer cc.Close()

	sum := summary{Summary: loadline.Summary{ByClass: map[string]int{}}, Peers: map[string]*peerCalls{}}
	enc := json.NewEncoder(stdout)
	if err := waitReady(ctx, cc, *warmup); err != nil {
		if ctx.Err() != nil {
			return enc.Encode(sum) // ended before the load began
		}
		return err
	}

	health := healthpb.NewHealthClient(cc)
	var mu sync.Mutex
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / *qps))
	defer tick.Stop()
	end := time.After(*duration)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-tick.C:
		}
		wg.Go(func() {
			start := time.Now()
			// Not the run's ctx: a call in flight at the end completes.
			o, retries := call(context.Background(), health, *service, *timeout)
			o.T = start.UnixNano()
			mu.Lock()
			defer mu.Unlock()
			sum.Sent++
			sum.TransparentRetries += retries
			if o.Peer != "" {
				p := sum.Peers[o.Peer]
				if p == nil {
					p = &peerCalls{First: o.T, Conns: map[string]int64{}}
					sum.Peers[o.Peer] = p
				}
				p.Sent++
				p.Last = max(p.Last, o.T)
				if first, ok := p.Conns[o.Local]; o.Local != "" && (!ok || o.T < first) {
					p.Conns[o.Local] = o.T
				}
				if o.Class == "ok" {
					p.OK++
				} else {
					p.Failed++
				}
			}
			if o.Class == "ok" {
				sum.OK++
				if *logOK {
					enc.Encode(o)
				}
				return
			}
			sum.Failed++
			sum.ByClass[o.Class]++
			enc.Encode(o)
		})
	}
	wg.Wait()
	return enc.Encode(sum)
}

// waitReady waits up to d for the channel to be ready: for an xds target,
// istiod has answered and a connection to an endpoint is up.
func waitReady(ctx context.Context, cc *grpc.ClientConn, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("channel not ready after %s: %s", d, s)
		}
	}
	return nil
}

// call makes one Check and returns its outcome (without its time) and
// the transparent retries it took.
func call(ctx context.Context, health healthpb.HealthClient, service string, timeout time.Duration) (outcome, int) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &callTrace{}
	var p peer.Peer
	resp, err := health.Check(context.WithValue(ctx, traceKey{}, tr), &healthpb.HealthCheckRequest{Service: service},
		grpc.Peer(&p), grpc.WaitForReady(false))
	reached, retries := tr.get()
	o := outcome{Class: "ok", Reached: reached}
	if p.Addr != nil {
		o.Peer = p.Addr.String()
	}
	if p.LocalAddr != nil {
		o.Local = p.LocalAddr.String()
	}
	switch {
	case err != nil:
		o.Class, o.Err = classify(err, reached), err.Error()
	case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		o.Class, o.Err = "status", "health "+resp.GetStatus().String()
	}
	return o, retries
}

// classify names a failed call's cause with loadclient's classes. gRPC
// keeps only the text of a transport's error, so its causes are read
// from the status's message.
func classify(err error, reached string) string {
	st := status.Convert(err)
	msg := st.Message()
	switch {
	case st.Code() == codes.DeadlineExceeded:
		return "timeout"
	case reached == reachedHeaders:
		// The server, or its proxy, answered with this status.
		return "status"
	case strings.Contains(msg, "connection refused"):
		return "refused"
	case st.Code() == codes.Unavailable && containsAny(msg, "connection reset", "EOF", "GOAWAY", "closing", "broken pipe", "RST_STREAM", "stream terminated"):
		return "reset"
	}
	return "other"
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
