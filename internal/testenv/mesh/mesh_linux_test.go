package mesh_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/mesh"
	"github.com/draind/draind/internal/testenv/testutil"
)

const (
	podIP    = "192.0.2.1"
	remoteIP = "192.0.2.2"
	appPort  = "8080"
)

func TestBuildScriptPinsIstioVersion(t *testing.T) {
	b, err := os.ReadFile("../../../tools/peers/pilot-agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ISTIO_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil || string(m[1]) != mesh.IstioVersion {
		t.Fatalf("tools/peers/pilot-agent.sh builds %q, mesh.IstioVersion is %q: keep them equal", m, mesh.IstioVersion)
	}
}

func TestSidecarArgs(t *testing.T) {
	// The istio-init arguments of Istio's injector golden file
	// pkg/kube/inject/testdata/inject/hello-tproxy.yaml.injected.
	want := []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "TPROXY", "-i", "*", "-x", "", "-b", "*",
		"-d", "15090,15021,15020", "--log_output_level=default:info"}
	if got := mesh.SidecarArgs(mesh.TProxy); !slices.Equal(got, want) {
		t.Fatalf("SidecarArgs(TProxy) = %q, want %q", got, want)
	}
}

// pod is a pod namespace linked to a remote one, with the remote service
// (192.0.2.2:9090, in this process), the app (uid 1000: 0.0.0.0:8080) and
// an Envoy-like proxy (uid 1337 with CAP_NET_ADMIN: 15006, 15001, and the
// excluded 15020 and 15021) under Istio's interception.
type pod struct {
	ns, remote *testutil.NetNS
	service    *node // in the remote namespace
	app, proxy *process
	ic         *mesh.Interception
}

func newPod(t *testing.T, mode mesh.Mode) *pod {
	testutil.RequireRoot(t)
	mesh.PilotAgent(t) // skip before building anything when it is absent
	mesh.RequireIptables(t)
	p := &pod{ns: testutil.NewNetNS(t), remote: testutil.NewNetNS(t), service: newNode()}
	testutil.Link(t, p.ns, p.remote, podIP+"/24", remoteIP+"/24")
	t.Cleanup(p.service.close)
	var err error
	p.remote.Do(t, func() { _, err = p.service.listen("remote", remoteIP+":9090", "echo", false) })
	if err != nil {
		t.Fatal(err)
	}
	p.app = startNode(t, p.ns, appSysProcAttr())
	p.app.listen("app", "0.0.0.0:"+appPort, "echo", false)
	p.proxy = startNode(t, p.ns, mesh.ProxySysProcAttr())
	// Istio makes both virtual listeners transparent in TPROXY mode.
	transparent := mode == mesh.TProxy
	p.proxy.listen("inbound", fmt.Sprintf("0.0.0.0:%d", mesh.InboundCapturePort), "proxy", transparent)
	p.proxy.listen("outbound", fmt.Sprintf("0.0.0.0:%d", mesh.OutboundCapturePort), "proxy", transparent)
	p.proxy.listen("status", fmt.Sprintf("0.0.0.0:%d", mesh.StatusPort), "echo", false)
	p.proxy.listen("health", fmt.Sprintf("0.0.0.0:%d", mesh.HealthPort), "echo", false)
	p.ic = mesh.Intercept(t, p.ns, mode)
	return p
}

// clientDial dials addr from the remote namespace.
func (p *pod) clientDial(t *testing.T, addr string) dialed {
	t.Helper()
	var d *dialed
	var err error
	p.remote.Do(t, func() { d, err = p.service.dial(addr) })
	if err != nil {
		// What the rules did (packet counters) and what sockets exist.
		var counters []byte
		p.ns.Do(t, func() { counters, _ = exec.Command("iptables-nft-save", "-c").CombinedOutput() })
		socks, _ := dumpTCP4(p.ns)
		t.Logf("rules with counters:\n%s\nsockets:\n%s", counters, formatSocks(socks))
		t.Fatalf("client dial %s: %v\nproxy accepted: %+v\napp accepted: %+v", addr, err, p.proxy.accepted(), p.app.accepted())
	}
	return *d
}

func acceptedFrom(recs []accepted, remote string) (accepted, bool) {
	for _, a := range recs {
		if a.Remote == remote {
			return a, true
		}
	}
	return accepted{}, false
}

// labelled is a socket the test expects in the pod's namespace.
type labelled struct {
	label         string
	local, remote string
	uid           uint32
	transparent   *bool // from getsockopt in the owning process, when known
}

func TestInterception(t *testing.T) {
	for _, mode := range []mesh.Mode{mesh.Redirect, mesh.TProxy} {
		t.Run(string(mode), func(t *testing.T) { testInterception(t, mode) })
	}
}

func testInterception(t *testing.T, mode mesh.Mode) {
	p := newPod(t, mode)
	t.Logf("istio-iptables %q installed:\n%s", p.ic.Args(), p.ic.Rules(t))
	var want []labelled
	listener := func(label, addr string, uid uint32) {
		want = append(want, labelled{label: label, local: addr, uid: uid})
	}
	listener("app listener", "0.0.0.0:8080", appUID)
	listener("proxy listener 15006", "0.0.0.0:15006", mesh.ProxyUID)
	listener("proxy listener 15001", "0.0.0.0:15001", mesh.ProxyUID)

	// (a) inbound: a client dials the app's port and lands on the proxy.
	client := p.clientDial(t, podIP+":"+appPort)
	if client.Reply != "app hello" {
		t.Fatalf("(a) client to %s:%s got %q, want the app's answer through the proxy", podIP, appPort, client.Reply)
	}
	in, ok := acceptedFrom(p.proxy.accepted(), client.Local)
	if !ok || in.Listener != "inbound" {
		t.Fatalf("(a) the proxy's 15006 listener did not accept the client's %s: %+v", client.Local, p.proxy.accepted())
	}
	wantLocal := map[mesh.Mode]string{mesh.Redirect: podIP + ":15006", mesh.TProxy: podIP + ":" + appPort}[mode]
	if in.Local != wantLocal || in.OrigDst != podIP+":"+appPort {
		t.Errorf("(a) proxy's accepted inbound socket: local %s, SO_ORIGINAL_DST %q (%s); want local %s, original destination %s:%s",
			in.Local, in.OrigDst, in.OrigDstErr, wantLocal, podIP, appPort)
	}
	if _, direct := acceptedFrom(p.app.accepted(), client.Local); direct {
		t.Errorf("(a) the app accepted the client's connection directly: not intercepted")
	}
	appIn, ok := acceptedFrom(p.app.accepted(), in.Upstream)
	if !ok {
		t.Fatalf("(a) the app has no connection from the proxy's upstream %s (%s): %+v", in.Upstream, in.UpstreamErr, p.app.accepted())
	}
	t.Logf("(a) client %s -> %s:%s: proxy accepted %s<-%s (SO_ORIGINAL_DST %s%s, IP_TRANSPARENT %t), upstream %s->%s, app accepted %s<-%s",
		client.Local, podIP, appPort, in.Local, in.Remote, in.OrigDst, in.OrigDstErr, in.Transparent, in.Upstream, in.UpstreamTo, appIn.Local, appIn.Remote)
	want = append(want,
		labelled{"(a) proxy: accepted inbound (downstream)", in.Local, in.Remote, mesh.ProxyUID, &in.Transparent},
		labelled{"(a) proxy: upstream to the app", in.Upstream, in.UpstreamTo, mesh.ProxyUID, nil},
		labelled{"(a) app: accepted from the proxy", appIn.Local, appIn.Remote, appUID, &appIn.Transparent})

	// (b) outbound: the app dials a remote service and lands on the proxy.
	out := p.app.dial(remoteIP + ":9090")
	if out.Reply != "remote hello" {
		t.Fatalf("(b) app to %s:9090 got %q", remoteIP, out.Reply)
	}
	ob, ok := acceptedFrom(p.proxy.accepted(), out.Local)
	if !ok || ob.Listener != "outbound" {
		t.Fatalf("(b) the proxy's 15001 listener did not accept the app's %s: %+v", out.Local, p.proxy.accepted())
	}
	if ob.OrigDst != remoteIP+":9090" || !strings.HasSuffix(ob.Local, ":15001") {
		t.Errorf("(b) proxy's accepted outbound socket: local %s, SO_ORIGINAL_DST %q (%s); want port 15001, %s:9090", ob.Local, ob.OrigDst, ob.OrigDstErr, remoteIP)
	}
	svcIn, ok := acceptedFrom(p.service.accepted(), ob.Upstream)
	if !ok {
		t.Fatalf("(b) the remote service has no connection from the proxy's upstream %s (%s)", ob.Upstream, ob.UpstreamErr)
	}
	if _, direct := acceptedFrom(p.service.accepted(), out.Local); direct {
		t.Errorf("(b) the remote service accepted the app's connection directly: not intercepted")
	}
	t.Logf("(b) app %s -> %s: proxy accepted %s<-%s (SO_ORIGINAL_DST %s, IP_TRANSPARENT %t), upstream %s->%s, service saw %s",
		out.Local, out.Remote, ob.Local, ob.Remote, ob.OrigDst, ob.Transparent, ob.Upstream, ob.UpstreamTo, svcIn.Remote)
	want = append(want,
		labelled{"(b) app: outbound connect", out.Local, out.Remote, appUID, nil},
		labelled{"(b) proxy: accepted outbound (downstream)", ob.Local, ob.Remote, mesh.ProxyUID, &ob.Transparent},
		labelled{"(b) proxy: upstream to the service", ob.Upstream, ob.UpstreamTo, mesh.ProxyUID, nil})

	// (c) the proxy's own connections are not intercepted.
	before := len(p.proxy.accepted())
	direct := p.proxy.dial(remoteIP + ":9090")
	if _, ok := acceptedFrom(p.service.accepted(), direct.Local); !ok || direct.Reply != "remote hello" {
		t.Errorf("(c) proxy's own dial to %s:9090 (from %s, reply %q) did not reach the service directly", remoteIP, direct.Local, direct.Reply)
	}
	loop := p.proxy.dial("127.0.0.1:" + appPort)
	appDirect, ok := acceptedFrom(p.app.accepted(), loop.Local)
	if !ok || loop.Reply != "app hello" {
		t.Errorf("(c) proxy's own dial to 127.0.0.1:%s (from %s, reply %q) did not reach the app directly", appPort, loop.Local, loop.Reply)
	}
	if n := len(p.proxy.accepted()); n != before {
		t.Errorf("(c) the proxy's own connections came back to its listeners: %+v", p.proxy.accepted()[before:])
	}
	want = append(want,
		labelled{"(c) proxy: own connect to the service", direct.Local, direct.Remote, mesh.ProxyUID, nil},
		labelled{"(c) proxy: own connect to 127.0.0.1:8080", loop.Local, loop.Remote, mesh.ProxyUID, nil},
		labelled{"(c) app: accepted from the proxy's own connect", appDirect.Local, appDirect.Remote, appUID, nil})

	// (d) excluded inbound ports reach their listeners directly.
	for _, port := range []struct {
		n    int
		name string
	}{{mesh.StatusPort, "status"}, {mesh.HealthPort, "health"}} {
		c := p.clientDial(t, fmt.Sprintf("%s:%d", podIP, port.n))
		a, ok := acceptedFrom(p.proxy.accepted(), c.Local)
		if c.Reply != port.name+" hello" || !ok || a.Listener != port.name || a.Local != fmt.Sprintf("%s:%d", podIP, port.n) {
			t.Errorf("(d) client to excluded port %d: reply %q, accepted %+v: want the %s listener directly", port.n, c.Reply, a, port.name)
		}
	}

	checkSockDiag(t, p, want)
}

// checkSockDiag dumps the pod's TCP sockets and checks the kernel's view of
// each expected one: owner, and IP_TRANSPARENT as INET_DIAG_SOCKOPT shows it
// against what getsockopt said in the owning process.
func checkSockDiag(t *testing.T, p *pod, want []labelled) {
	socks, err := dumpTCP4(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%-48s %-11s %-21s %-21s %-5s %-8s %s\n", "socket", "state", "local", "remote", "uid", "inode", "INET_DIAG_SOCKOPT")
	for _, w := range want {
		s, ok := find(socks, w.local, w.remote)
		if !ok {
			t.Errorf("sock_diag: no socket %s (%s -> %s)", w.label, w.local, w.remote)
			continue
		}
		fmt.Fprintf(&table, "%-48s %-11s %-21s %-21s %-5d %-8d %s\n", w.label, s.State, s.Local, s.Remote, s.UID, s.Inode, s.sockoptString())
		if s.UID != w.uid {
			t.Errorf("sock_diag: %s: uid %d, want %d", w.label, s.UID, w.uid)
		}
		if w.transparent != nil && s.HasSockopt() && s.Transparent() != *w.transparent {
			t.Errorf("sock_diag: %s: INET_DIAG_SOCKOPT transparent=%t, getsockopt(IP_TRANSPARENT) in its process said %t",
				w.label, s.Transparent(), *w.transparent)
		}
	}
	t.Logf("kernel %s, mode %s: sock_diag (idiag_ext=0):\n%s", kernelRelease(), p.ic.Mode(), table.String())
	t.Logf("every TCP socket of the pod namespace:\n%s", formatSocks(socks))
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestTransparentSockopt establishes, without iptables, what
// INET_DIAG_SOCKOPT says about IP_TRANSPARENT and IP_FREEBIND, and whether
// an accepted socket inherits IP_TRANSPARENT from its listener. It runs on
// every kernel of the VM matrix.
func TestTransparentSockopt(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	proxy := startNode(t, ns, mesh.ProxySysProcAttr())
	proxy.listen("transparent", "0.0.0.0:15006", "echo", true)
	proxy.listen("plain", "0.0.0.0:15007", "echo", false)

	// Client sockets made here as root, each with one option set.
	dialWith := func(opt int, port string) net.Conn {
		var c net.Conn
		var err error
		ns.Do(t, func() {
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if opt != 0 {
					rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, opt, 1) })
				}
				return serr
			}}
			c, err = d.Dial("tcp4", "127.0.0.1:"+port)
		})
		if err != nil {
			t.Fatalf("dial %s: %v", port, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	toTransparent := dialWith(0, "15006")
	toPlain := dialWith(0, "15007")
	freebind := dialWith(unix.IP_FREEBIND, "15007")
	transparent := dialWith(unix.IP_TRANSPARENT, "15007")
	for _, c := range []net.Conn{toTransparent, toPlain, freebind, transparent} {
		c.Write([]byte("hello\n"))
		buf := make([]byte, 64)
		if _, err := c.Read(buf); err != nil { // the proxy has recorded the accept
			t.Fatal(err)
		}
	}
	accepts := proxy.accepted()
	// One more client with IP_TRANSPARENT that closes first: its socket
	// lingers in TIME_WAIT.
	closed := dialWith(unix.IP_TRANSPARENT, "15007")
	closed.Write([]byte("hello\n"))
	closed.Read(make([]byte, 64))
	closed.Close()
	timeWait := func() (diagSock, bool) {
		socks, err := dumpTCP4(ns)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := find(socks, closed.LocalAddr().String(), closed.RemoteAddr().String())
		return s, ok && s.State == "TIME_WAIT"
	}
	deadline := time.Now().Add(5 * time.Second)
	tw, ok := timeWait()
	for ; !ok && time.Now().Before(deadline); tw, ok = timeWait() {
		time.Sleep(10 * time.Millisecond)
	}
	if !ok {
		t.Fatalf("the closed client socket %s never reached TIME_WAIT: %v", closed.LocalAddr(), tw)
	}
	t.Logf("TIME_WAIT of a client with IP_TRANSPARENT: uid=%d inode=%d sockopt=%s attrs=%v", tw.UID, tw.Inode, tw.sockoptString(), tw.Attrs)
	if tw.HasSockopt() {
		t.Errorf("TIME_WAIT socket carries INET_DIAG_SOCKOPT %x: the kernel now sends it for minisockets too", tw.Sockopt)
	}
	socks, err := dumpTCP4(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s: every TCP socket:\n%s", kernelRelease(), formatSocks(socks))
	l, _ := find(socks, "0.0.0.0:15006", "")
	if !l.HasSockopt() {
		// The attribute is missing on this kernel: say so, there is nothing to decode.
		t.Logf("kernel %s sends no INET_DIAG_SOCKOPT (attributes sent unasked: %v)", kernelRelease(), l.Attrs)
		return
	}
	check := func(label string, local, remote string, wantTransparent, wantFreebind bool) {
		t.Helper()
		s, ok := find(socks, local, remote)
		if !ok {
			t.Errorf("%s: no socket %s -> %s", label, local, remote)
			return
		}
		gotFreebind := s.Sockopt[0]&sockoptFreebind != 0
		if s.Transparent() != wantTransparent || gotFreebind != wantFreebind {
			t.Errorf("%s: sockopt %s, want transparent=%t freebind=%t", label, s.sockoptString(), wantTransparent, wantFreebind)
		}
		t.Logf("%-40s uid=%-4d sockopt=%s", label, s.UID, s.sockoptString())
	}
	check("transparent listener", "0.0.0.0:15006", "", true, false)
	check("plain listener", "0.0.0.0:15007", "", false, false)
	check("client with IP_FREEBIND", freebind.LocalAddr().String(), freebind.RemoteAddr().String(), false, true)
	check("client with IP_TRANSPARENT", transparent.LocalAddr().String(), transparent.RemoteAddr().String(), true, false)
	a, _ := acceptedFrom(accepts, toTransparent.LocalAddr().String())
	check("accepted by the transparent listener", a.Local, a.Remote, a.Transparent, false)
	t.Logf("accepted socket of a transparent listener: getsockopt(IP_TRANSPARENT)=%t (inherited: %t)", a.Transparent, a.Transparent)
	b, _ := acceptedFrom(accepts, toPlain.LocalAddr().String())
	check("accepted by the plain listener", b.Local, b.Remote, false, false)
}

// TestRemove checks that removal leaves the namespace as it was, including
// the TPROXY policy routing --cleanup-only leaves (and duplicates).
func TestRemove(t *testing.T) {
	for _, mode := range []mesh.Mode{mesh.Redirect, mesh.TProxy} {
		t.Run(string(mode), func(t *testing.T) {
			testutil.RequireRoot(t)
			mesh.PilotAgent(t)
			mesh.RequireIptables(t)
			ns, peer := testutil.NewNetNS(t), testutil.NewNetNS(t)
			testutil.Link(t, ns, peer, podIP+"/24", remoteIP+"/24")
			ic := mesh.Intercept(t, ns, mode, mesh.ExcludeInboundPorts(9901), mesh.ExcludeOutboundPorts(5432))
			installed := ic.Rules(t)
			for _, want := range []string{"--dport 9901 -j RETURN", "--dport 5432 -j RETURN"} {
				if !strings.Contains(installed, want) {
					t.Errorf("options: no %q in the rules:\n%s", want, installed)
				}
			}
			if hasRule := strings.Contains(installed, "fwmark 0x539 lookup 133"); hasRule != (mode == mesh.TProxy) {
				t.Errorf("policy routing present=%t in %s mode:\n%s", hasRule, mode, installed)
			}
			ic.Remove(t)
			ic.Remove(t) // safe twice
			if left := ic.Rules(t); strings.Contains(left, "ISTIO") || strings.Contains(left, "ip r") {
				t.Errorf("left after Remove:\n%s", left)
			}
		})
	}
}
