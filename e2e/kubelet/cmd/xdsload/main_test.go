package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The bootstrap is the one Istio's proxyless templates write, for the
// flags given; an xds target without the pod's identity is refused.
func TestBootstrap(t *testing.T) {
	pod := node{podIP: "10.88.0.7", podName: "load-0", namespace: "bench", clusterDomain: "cluster.local", clusterID: "Kubernetes"}
	for _, c := range []struct {
		name    string
		server  string
		node    func(n node) node
		want    string // the JSON, compact
		wantErr string
	}{{
		name:   "istiod plaintext",
		server: "10.0.0.2:15010",
		node:   func(n node) node { return n },
		want: `{"xds_servers":[{"server_uri":"10.0.0.2:15010","channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],` +
			`"node":{"id":"sidecar~10.88.0.7~load-0.bench~bench.svc.cluster.local",` +
			`"metadata":{"CLUSTER_ID":"Kubernetes","GENERATOR":"grpc","INSTANCE_IPS":"10.88.0.7","NAMESPACE":"bench"}}}`,
	}, {
		name:   "by name, another domain, a version",
		server: "dns:///istiod.istio-system.svc:15010",
		node: func(n node) node {
			n.clusterDomain, n.clusterID, n.istioVersion = "example.org", "east", "1.29.0"
			return n
		},
		want: `{"xds_servers":[{"server_uri":"dns:///istiod.istio-system.svc:15010","channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],` +
			`"node":{"id":"sidecar~10.88.0.7~load-0.bench~bench.svc.example.org",` +
			`"metadata":{"CLUSTER_ID":"east","GENERATOR":"grpc","INSTANCE_IPS":"10.88.0.7","ISTIO_VERSION":"1.29.0","NAMESPACE":"bench"}}}`,
	}, {
		name:    "no server",
		node:    func(n node) node { return n },
		wantErr: "--xds-server",
	}, {
		name:    "no pod name",
		server:  "10.0.0.2:15010",
		node:    func(n node) node { n.podName = ""; return n },
		wantErr: "--pod-name",
	}, {
		name:    "not an IP",
		server:  "10.0.0.2:15010",
		node:    func(n node) node { n.podIP = "load-0"; return n },
		wantErr: "not an IP",
	}} {
		t.Run(c.name, func(t *testing.T) {
			got, err := bootstrapJSON(c.server, c.node(pod))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("bootstrap\n got %s\nwant %s", got, c.want)
			}
		})
	}
	// --print-bootstrap prints it, from the flags.
	var out bytes.Buffer
	err := run(context.Background(), []string{"--print-bootstrap", "--xds-server", "10.0.0.2:15010",
		"--pod-ip", "10.88.0.7", "--pod-name", "load-0", "--namespace", "bench"}, &out)
	if err != nil || !strings.Contains(out.String(), `"id":"sidecar~10.88.0.7~load-0.bench~bench.svc.cluster.local"`) {
		t.Errorf("--print-bootstrap: %v %s", err, out.String())
	}
}

// healthServer serves the gRPC health service (SERVING) on a local port.
func healthServer(t *testing.T) (*grpc.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthgrpc.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln) // ends with Stop
	t.Cleanup(srv.Stop)
	return srv, ln.Addr().String()
}

// parseOutput reads the client's output as the rollout bench does: each
// line but the last is a call (a failure, or with --log-ok a success),
// the last the summary.
func parseOutput(t *testing.T, out string) ([]outcome, summary) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("no summary: %v\n%s", err, out)
	}
	var calls []outcome
	for _, l := range lines[:len(lines)-1] {
		var o outcome
		if err := json.Unmarshal([]byte(l), &o); err != nil || o.T == 0 {
			t.Fatalf("line %q: not a call (%v)", l, err)
		}
		calls = append(calls, o)
	}
	return calls, sum
}

// Through passthrough, the client's calls succeed, name the server, and
// fail (each on a line of its own) once the server has stopped.
func TestPassthroughCalls(t *testing.T) {
	srv, addr := healthServer(t)
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"--target", "passthrough:///" + addr,
			"--qps", "50", "--duration", "2s", "--timeout", "1s", "--warmup", "5s"}, &out)
	}()
	time.Sleep(time.Second)
	srv.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fails, sum := parseOutput(t, out.String())
	b, _ := json.Marshal(sum)
	t.Logf("summary %s", b)
	if sum.OK == 0 || sum.Failed == 0 || sum.Sent != sum.OK+sum.Failed || len(fails) != sum.Failed {
		t.Errorf("sent %d, ok %d, failed %d, %d failure lines: want both outcomes, each failure a line",
			sum.Sent, sum.OK, sum.Failed, len(fails))
	}
	if p := sum.Peers[addr]; p == nil || p.OK == 0 || p.First == 0 || p.Last < p.First || len(p.Conns) == 0 {
		t.Errorf("peers %v: want %s with its calls and connections", sum.Peers, addr)
	}
	for _, f := range fails {
		// The calls in flight at the stop may be reset; the later ones
		// find no listener.
		if f.Class != "refused" && f.Class != "reset" {
			t.Errorf("failure %+v: want refused or reset", f)
		}
	}
	if last := fails[len(fails)-1]; last.Class != "refused" || last.Reached != reachedPick || last.Peer != "" {
		t.Errorf("last failure %+v: want refused at the pick, no peer", last)
	}
}

// ads is an xDS management server for one Service, "web.bench.svc.cluster.local:80",
// whose one endpoint is backend: the resources istiod's grpc generator
// gives for it, reduced to what gRPC reads. It keeps the first node
// that connects.
type ads struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	backend *net.TCPAddr

	mu    sync.Mutex
	node  *corepb.Node
	names map[string][]string // the resource names asked for, by type
}

const (
	testListener = "web.bench.svc.cluster.local:80"
	testRoute    = "web.bench.svc.cluster.local:80"
	testCluster  = "outbound|80||web.bench.svc.cluster.local"
)

func (a *ads) resources(typeURL string) ([]*anypb.Any, error) {
	var m proto.Message
	switch typeURL {
	case "type.googleapis.com/envoy.config.listener.v3.Listener":
		router, err := anypb.New(&routerpb.Router{})
		if err != nil {
			return nil, err
		}
		hcm, err := anypb.New(&hcmpb.HttpConnectionManager{
			RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{Rds: &hcmpb.Rds{
				ConfigSource:    &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}},
				RouteConfigName: testRoute,
			}},
			HttpFilters: []*hcmpb.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router}}},
		})
		if err != nil {
			return nil, err
		}
		m = &listenerpb.Listener{Name: testListener, ApiListener: &listenerpb.ApiListener{ApiListener: hcm}}
	case "type.googleapis.com/envoy.config.route.v3.RouteConfiguration":
		m = &routepb.RouteConfiguration{Name: testRoute, VirtualHosts: []*routepb.VirtualHost{{
			Name:    "web",
			Domains: []string{"*"},
			Routes: []*routepb.Route{{
				Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routepb.Route_Route{Route: &routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: testCluster}}},
			}},
		}}}
	case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
		m = &clusterpb.Cluster{
			Name:                 testCluster,
			ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
			EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{
				EdsConfig:   &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}},
				ServiceName: testCluster,
			},
			LbPolicy: clusterpb.Cluster_ROUND_ROBIN,
		}
	case "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment":
		m = &endpointpb.ClusterLoadAssignment{ClusterName: testCluster, Endpoints: []*endpointpb.LocalityLbEndpoints{{
			Locality:            &corepb.Locality{},
			LoadBalancingWeight: wrapperspb.UInt32(1), // gRPC skips a locality without a weight
			LbEndpoints: []*endpointpb.LbEndpoint{{
				HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
					Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
						Address:       a.backend.IP.String(),
						PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(a.backend.Port)},
					}}},
				}},
				HealthStatus: corepb.HealthStatus_HEALTHY,
			}},
		}}}
	default:
		return nil, fmt.Errorf("type %s: none", typeURL)
	}
	r, err := anypb.New(m)
	if err != nil {
		return nil, err
	}
	return []*anypb.Any{r}, nil
}

// StreamAggregatedResources answers each type's first request with its
// resource (version 1), and takes the rest as ACKs.
func (a *ads) StreamAggregatedResources(s discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	sent := map[string]bool{}
	for {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		a.mu.Lock()
		if a.node == nil && req.GetNode() != nil {
			a.node = req.GetNode()
		}
		if a.names[req.GetTypeUrl()] == nil {
			a.names[req.GetTypeUrl()] = req.GetResourceNames()
		}
		a.mu.Unlock()
		if sent[req.GetTypeUrl()] {
			continue
		}
		res, err := a.resources(req.GetTypeUrl())
		if err != nil {
			return err
		}
		sent[req.GetTypeUrl()] = true
		if err := s.Send(&discoverypb.DiscoveryResponse{VersionInfo: "1", Nonce: "1", TypeUrl: req.GetTypeUrl(), Resources: res}); err != nil {
			return err
		}
	}
}

// Through an xds target, the client sends istiod the node of its
// bootstrap, asks for the Service's listener, and calls the endpoint the
// management server gave.
func TestXDSCalls(t *testing.T) {
	_, backend := healthServer(t)
	baddr, err := net.ResolveTCPAddr("tcp", backend)
	if err != nil {
		t.Fatal(err)
	}
	mgmt := &ads{backend: baddr, names: map[string][]string{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xdsSrv := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(xdsSrv, mgmt)
	go xdsSrv.Serve(ln) // ends with Stop
	defer xdsSrv.Stop()

	var out bytes.Buffer
	err = run(context.Background(), []string{"--target", "xds:///" + testListener, "--xds-server", ln.Addr().String(),
		"--pod-ip", "127.0.0.1", "--pod-name", "load-0", "--namespace", "bench",
		"--qps", "20", "--duration", "1s", "--timeout", "1s", "--warmup", "10s", "--log-ok"}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	calls, sum := parseOutput(t, out.String())
	if sum.Sent == 0 || sum.Failed != 0 || len(calls) != sum.OK {
		t.Errorf("summary %+v with %d lines: want every call ok, each a line (--log-ok)", sum, len(calls))
	}
	for _, c := range calls {
		if c.Class != "ok" || c.Peer != backend || c.Reached != reachedHeaders {
			t.Errorf("call %+v: want ok from %s", c, backend)
		}
	}
	if p := sum.Peers[backend]; p == nil || p.OK != sum.OK {
		t.Errorf("peers %v: want every call to %s", sum.Peers, backend)
	}

	mgmt.mu.Lock()
	defer mgmt.mu.Unlock()
	if got, want := mgmt.node.GetId(), "sidecar~127.0.0.1~load-0.bench~bench.svc.cluster.local"; got != want {
		t.Errorf("node id %q, want %q", got, want)
	}
	meta := mgmt.node.GetMetadata().GetFields()
	if meta["GENERATOR"].GetStringValue() != "grpc" || meta["NAMESPACE"].GetStringValue() != "bench" {
		t.Errorf("node metadata %v: want GENERATOR grpc, NAMESPACE bench", meta)
	}
	if got := mgmt.names["type.googleapis.com/envoy.config.listener.v3.Listener"]; len(got) != 1 || got[0] != testListener {
		t.Errorf("listeners asked for: %v, want [%s]", got, testListener)
	}
}
