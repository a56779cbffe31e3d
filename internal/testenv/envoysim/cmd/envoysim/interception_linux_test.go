package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/testutil"
)

// Interception as Istio sets it up (docs/peers.md): envoysim runs as
// the proxy uid 1337 in a pod's network namespace; iptables sends traffic
// to its listeners with TPROXY (the inbound listener is IP_TRANSPARENT,
// which needs CAP_NET_ADMIN, given as an ambient capability) or REDIRECT;
// the listener's upstream is the connection's original destination.

const (
	podIP       = "198.51.100.1" // TEST-NET-2
	remoteIP    = "198.51.100.2"
	capNetAdmin = 12
)

// interceptionPod is a pod namespace linked to a remote one, with an app
// that answers "app <its local address>" on 0.0.0.0:8080 in the pod and a
// remote service that answers "remote <its local address>" on
// remoteIP:9000.
type interceptionPod struct {
	pod, remote *testutil.NetNS
}

func newInterceptionPod(t *testing.T) *interceptionPod {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables not installed")
	}
	ip := &interceptionPod{pod: testutil.NewNetNS(t), remote: testutil.NewNetNS(t)}
	testutil.Link(t, ip.pod, ip.remote, podIP+"/24", remoteIP+"/24")
	serveAddr(t, ip.pod.Listen(t, "tcp4", "0.0.0.0:8080"), "app")
	serveAddr(t, ip.remote.Listen(t, "tcp4", remoteIP+":9000"), "remote")
	return ip
}

// serveAddr answers each connection with "<name> <local address>\n".
func serveAddr(t *testing.T, ln net.Listener, name string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.LocalAddr())
			c.Close()
		}
	}()
}

// run runs a command inside the pod namespace.
func (ip *interceptionPod) run(t *testing.T, name string, args ...string) {
	t.Helper()
	var out []byte
	var err error
	ip.pod.Do(t, func() { out, err = exec.Command(name, args...).CombinedOutput() })
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// start runs envoysim in the pod as uid 1337 with CAP_NET_ADMIN.
func (ip *interceptionPod) start(t *testing.T, listeners string) *proc {
	t.Helper()
	p := launch(t, launchOpts{
		cred:   &syscall.Credential{Uid: 1337, Gid: 1337},
		caps:   []uintptr{capNetAdmin},
		config: `{"listeners":[` + listeners + `]}`,
		start:  func(f func()) error { ip.pod.Do(t, f); return nil },
		dial:   ip.pod.Dialer(),
	})
	if p.addr == "" {
		t.Fatalf("envoysim exited at start: %v\n%s", p.err, p.stderr)
	}
	if code, body := p.get(t, "/ready"); code != 200 {
		t.Fatalf("not ready: %d %q", code, body)
	}
	return p
}

// ask connects with dial and returns the first line answered.
func ask(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read from %s: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

// TPROXY inbound: the transparent listener on 15006 accepts the remote
// client's connection to podIP:8080 with that address as its local one,
// and proxies it to the original destination, or to localhost at its port.
func TestProgramTPROXYInbound(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		upstream string
		want     string
	}{
		{"original_dst", "app " + podIP + ":8080"},
		{"127.0.0.1:original_dst_port", "app 127.0.0.1:8080"},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			ip := newInterceptionPod(t)
			// Istio's TPROXY rules, narrowed to the pod's interface so that
			// the proxy's own connection to the app is left alone.
			ip.run(t, "iptables", "-t", "mangle", "-A", "PREROUTING", "-i", "veth-a", "-p", "tcp", "--dport", "8080",
				"-j", "TPROXY", "--on-port", "15006", "--on-ip", "0.0.0.0", "--tproxy-mark", "0x539/0xffffffff")
			ip.run(t, "ip", "rule", "add", "fwmark", "0x539", "lookup", "133")
			ip.run(t, "ip", "route", "add", "local", "default", "dev", "lo", "table", "133")
			p := ip.start(t, fmt.Sprintf(`{"name":"virtualInbound","address":"0.0.0.0:15006","direction":"inbound","transparent":true,"upstream":%q}`, tc.upstream))
			if got := ask(t, ip.remote.Dialer(), podIP+":8080"); got != tc.want {
				t.Errorf("through the proxy: %q, want %q", got, tc.want)
			}
			if _, body := p.get(t, "/stats?filter=%5Elistener%5C.0%5C.0%5C.0%5C.0_15006%5C.downstream_cx_total%24"); body != "listener.0.0.0.0_15006.downstream_cx_total: 1\n" {
				t.Errorf("the proxy did not count it: %q", body)
			}
		})
	}
}

// REDIRECT: inbound (PREROUTING) and outbound (OUTPUT, uid 1337 excluded,
// as Istio's rules): the listener learns the original destination with
// SO_ORIGINAL_DST.
func TestProgramREDIRECT(t *testing.T) {
	testutil.RequireRoot(t)
	ip := newInterceptionPod(t)
	ip.run(t, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "veth-a", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006")
	ip.run(t, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", remoteIP, "--dport", "9000",
		"-m", "owner", "!", "--uid-owner", "1337", "-j", "REDIRECT", "--to-ports", "15001")
	p := ip.start(t, `{"name":"virtualInbound","address":"0.0.0.0:15006","direction":"inbound","upstream":"original_dst"},
		{"name":"virtualOutbound","address":"0.0.0.0:15001","direction":"outbound","upstream":"original_dst"}`)
	if got, want := ask(t, ip.remote.Dialer(), podIP+":8080"), "app "+podIP+":8080"; got != want {
		t.Errorf("inbound: %q, want %q", got, want)
	}
	if got, want := ask(t, ip.pod.Dialer(), remoteIP+":9000"), "remote "+remoteIP+":9000"; got != want {
		t.Errorf("outbound: %q, want %q", got, want)
	}
	for _, l := range []string{"0.0.0.0_15006", "0.0.0.0_15001"} {
		if _, body := p.get(t, "/stats?filter=%5Elistener%5C."+strings.ReplaceAll(l, ".", "%5C.")+"%5C.downstream_cx_total%24"); body != "listener."+l+".downstream_cx_total: 1\n" {
			t.Errorf("listener %s: %q", l, body)
		}
	}
}

// serveProto serves HTTP on ln, answering "<name> <request protocol>":
// HTTP/1.1 only, or, with h2c, HTTP/2 cleartext with prior knowledge only,
// as a gRPC server.
func serveProto(t *testing.T, ln net.Listener, name string, h2c bool) {
	p := new(http.Protocols)
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	srv := &http.Server{Protocols: p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.Proto)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// Filter chains by destination port behind REDIRECT, as Istio's
// virtualInbound: one listener gets the pod's ports 8081 (an HTTP/1.1 app)
// and 9090 (a gRPC-like h2c app); SO_ORIGINAL_DST picks the chain, so
// 9090's requests go upstream over h2c and 8081's over the listener's
// HTTP/1.1, whatever the client speaks.
func TestProgramREDIRECTFilterChains(t *testing.T) {
	testutil.RequireRoot(t)
	ip := newInterceptionPod(t)
	serveProto(t, ip.pod.Listen(t, "tcp4", "0.0.0.0:8081"), "web", false)
	serveProto(t, ip.pod.Listen(t, "tcp4", "0.0.0.0:9090"), "grpc", true)
	for _, port := range []string{"8081", "9090"} {
		ip.run(t, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "veth-a", "-p", "tcp", "--dport", port, "-j", "REDIRECT", "--to-ports", "15006")
	}
	ip.start(t, `{"name":"virtualInbound","address":"0.0.0.0:15006","direction":"inbound","protocol":"http",
		"upstream":"127.0.0.1:original_dst_port",
		"filter_chains":[{"destination_port":9090,"upstream":"127.0.0.1:9090","upstream_protocol":"h2c"}]}`)
	h1 := &http.Client{Transport: &http.Transport{DialContext: ip.remote.Dialer()}, Timeout: 10 * time.Second}
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{DialContext: ip.remote.Dialer(), Protocols: p}, Timeout: 10 * time.Second}
	for _, tc := range []struct {
		client *http.Client
		port   string
		want   string
	}{
		{h1, "8081", "web HTTP/1.1"},
		{h2, "8081", "web HTTP/1.1"},
		{h1, "9090", "grpc HTTP/2.0"},
		{h2, "9090", "grpc HTTP/2.0"},
	} {
		resp, err := tc.client.Get("http://" + podIP + ":" + tc.port + "/")
		if err != nil {
			t.Fatalf("port %s: %v", tc.port, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != tc.want {
			t.Errorf("port %s, client %s: %d %q, want %q", tc.port, resp.Proto, resp.StatusCode, b, tc.want)
		}
	}
	h1.CloseIdleConnections()
	h2.CloseIdleConnections()
}
