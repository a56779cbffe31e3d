package envoysim_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// protoServer is an upstream that answers "<name> <request protocol>" and a
// grpc-status trailer. With h2c it speaks HTTP/2 cleartext with prior
// knowledge only, as a gRPC server: an HTTP/1.1 request fails there.
func protoServer(t *testing.T, name string, h2c bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	srv := &http.Server{Protocols: p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Grpc-Status")
		io.WriteString(w, name+" "+r.Proto)
		w.Header().Set("Grpc-Status", "0")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// freePort is a port nothing listens on now, for a listener whose port
// must be known before it starts.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// A filter chain matched on the destination port sends that port's
// connections to its own upstream over its own protocol (h2c to a
// gRPC-like server); other connections use the listener's upstream over
// HTTP/1.1. The original destination of a direct connection is the
// accepted socket's local address (as TPROXY keeps it), so the chain's
// port is the port of listener "grpc"; listener "web" has the same chains
// and a port none of them lists. Stats stay the listener's.
func TestFilterChainDestinationPort(t *testing.T) {
	grpc := protoServer(t, "grpc", true)
	web := protoServer(t, "web", false)
	port := freePort(t)
	chains := []envoysim.FilterChain{
		{DestinationPort: port, Upstream: grpc, UpstreamProtocol: "h2c"},
		{DestinationPort: 1, Upstream: "127.0.0.1:1"}, // never matched
	}
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "grpc", Address: "127.0.0.1:" + strconv.Itoa(int(port)), Protocol: "http", Upstream: web, FilterChains: chains},
		{Name: "web", Address: "127.0.0.1:0", Protocol: "http", Upstream: web, FilterChains: chains},
	}})
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	for _, tc := range []struct {
		listener string
		want     string
	}{
		{"grpc", "grpc HTTP/2.0"},
		{"web", "web HTTP/1.1"},
	} {
		// HTTP/2 downstream (a gRPC client), then HTTP/1.1: the upstream
		// protocol is the chain's whatever the downstream's.
		resp, err := hc.Get("http://" + sim.ListenerAddr(tc.listener) + "/svc/Method")
		if err != nil {
			t.Fatalf("%s: %v", tc.listener, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != tc.want || resp.Trailer.Get("Grpc-Status") != "0" {
			t.Errorf("%s over h2c: %d %q trailer %v, want %q", tc.listener, resp.StatusCode, b, resp.Trailer, tc.want)
		}
		h1 := dialHTTP(t, sim.ListenerAddr(tc.listener))
		if resp, body := h1.get("/"); resp.StatusCode != 200 || body != tc.want {
			t.Errorf("%s over HTTP/1.1: %d %q, want %q", tc.listener, resp.StatusCode, body, tc.want)
		}
	}
	grpcScope := "127.0.0.1_" + strconv.Itoa(int(port))
	for name, want := range map[string]uint64{
		"listener." + grpcScope + ".downstream_cx_total": 2,
		"http.grpc.downstream_rq_2xx":                    2,
		"http.web.downstream_rq_2xx":                     2,
		"cluster.grpc.upstream_cx_connect_fail":          0,
		"cluster.web.upstream_cx_connect_fail":           0,
	} {
		if v, _ := sim.Stat(name); v != want {
			t.Errorf("%s = %d, want %d", name, v, want)
		}
	}
}

func TestFilterChainConfig(t *testing.T) {
	cfg, err := envoysim.ParseConfig([]byte(`{"listeners": [
    {"name": "virtualInbound", "address": "0.0.0.0:15006", "protocol": "http", "upstream": "127.0.0.1:original_dst_port",
     "filter_chains": [{"destination_port": 9090, "upstream": "127.0.0.1:9090", "upstream_protocol": "h2c"},
                       {"destination_port": 8080, "upstream": "127.0.0.1:8080"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []envoysim.FilterChain{
		{DestinationPort: 9090, Upstream: "127.0.0.1:9090", UpstreamProtocol: "h2c"},
		{DestinationPort: 8080, Upstream: "127.0.0.1:8080"},
	}
	if got := cfg.Listeners[0].FilterChains; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("%+v", got)
	}
	for _, tc := range []struct{ chains, want string }{
		{`[{"destination_port": 70000, "upstream": "127.0.0.1:1"}]`, "destination_port 70000: want 1..65535"},
		{`[{"destination_port": -1, "upstream": "127.0.0.1:1"}]`, "destination_port -1"},
		{`[{"port": 1, "upstream": "127.0.0.1:1"}]`, "unknown field"},
	} {
		_, err := envoysim.ParseConfig([]byte(`{"listeners": [{"name": "a", "address": "127.0.0.1:0", "upstream": "127.0.0.1:1", "filter_chains": ` + tc.chains + `}]}`))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.chains, err, tc.want)
		}
	}
	for _, tc := range []struct {
		chains []envoysim.FilterChain
		want   string
	}{
		{[]envoysim.FilterChain{{Upstream: "127.0.0.1:1"}}, `listener "a": filter chain 0: destination port 0`},
		{[]envoysim.FilterChain{{DestinationPort: 8080, Upstream: "127.0.0.1:1"}, {DestinationPort: 8080, Upstream: "127.0.0.1:2"}},
			"filter chains 0 and 1: both match destination port 8080"},
		{[]envoysim.FilterChain{{DestinationPort: 9090, Upstream: "127.0.0.1:1", UpstreamProtocol: "grpc"}},
			`filter chain 0 (port 9090): upstream protocol "grpc": want http1 or h2c`},
		{[]envoysim.FilterChain{{DestinationPort: 9090}}, "filter chain 0 (port 9090): no upstream"},
		{[]envoysim.FilterChain{{DestinationPort: 9090, Upstream: "localhost:original_dst_port"}}, `filter chain 0 (port 9090): upstream "localhost:original_dst_port"`},
	} {
		s, err := envoysim.Start(envoysim.Config{Listeners: []envoysim.ListenerConfig{
			{Name: "a", Address: "127.0.0.1:0", Protocol: "http", Upstream: "127.0.0.1:1", FilterChains: tc.chains},
		}})
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.chains, err, tc.want)
		}
	}
}
