package mesh_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/mesh"
	"github.com/draind/draind/internal/testenv/testutil"
)

// The test binary doubles as the pod's processes: the proxy (uid 1337 with
// CAP_NET_ADMIN) and the app (uid 1000). A process's sockets belong to the
// uid of the thread that creates or accepts them, so each role is a real
// process started under its uid, never a setfsuid thread of the test.
const nodeEnv = "DRAIND_MESH_NODE"

func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) != "" {
		n := newNode()
		n.serve(os.Stdin, os.Stdout)
		n.close()
		os.Exit(0)
	}
	code := m.Run()
	testutil.RemoveSelfCopy()
	os.Exit(code)
}

// accepted is what a node's listener saw of one accepted connection.
type accepted struct {
	Listener    string `json:"listener"`
	Local       string `json:"local"`
	Remote      string `json:"remote"`
	OrigDst     string `json:"orig_dst,omitempty"`     // SO_ORIGINAL_DST
	OrigDstErr  string `json:"orig_dst_err,omitempty"` // why SO_ORIGINAL_DST failed
	Transparent bool   `json:"transparent"`            // getsockopt(IP_TRANSPARENT) on the accepted socket
	Upstream    string `json:"upstream,omitempty"`     // proxies: the upstream socket's local address
	UpstreamTo  string `json:"upstream_to,omitempty"`
	UpstreamErr string `json:"upstream_err,omitempty"`
}

// dialed is the result of a node's dial.
type dialed struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
	Reply  string `json:"reply"`
}

type reply struct {
	Err      string     `json:"err,omitempty"`
	Addr     string     `json:"addr,omitempty"`
	Dialed   *dialed    `json:"dialed,omitempty"`
	Accepted []accepted `json:"accepted,omitempty"`
}

// node holds sockets for a test: echo servers, interception proxies and
// client connections, all kept open until it is closed. It runs in a helper
// process (serve reads commands from stdin) or in the test process (the
// remote side, where uids do not matter).
type node struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closers   []io.Closer
	accepts   []accepted
	upstreams map[string]bool // local addresses of this node's proxy upstream sockets
}

func newNode() *node {
	ctx, cancel := context.WithCancel(context.Background())
	return &node{ctx: ctx, cancel: cancel, upstreams: map[string]bool{}}
}

func (n *node) hold(c io.Closer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closers = append(n.closers, c)
}

// close closes every socket and waits for the node's goroutines.
func (n *node) close() {
	n.cancel()
	n.mu.Lock()
	closers := n.closers
	n.closers = nil
	n.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	n.wg.Wait()
}

// serve answers one JSON line per command line:
//
//	listen NAME ADDR KIND [transparent]   KIND: echo, proxy
//	dial ADDR                             connect, send "hello", read one line
//	accepted                              what the listeners accepted so far
func (n *node) serve(in io.Reader, out io.Writer) {
	enc := json.NewEncoder(out)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var r reply
		var err error
		switch {
		case len(f) >= 4 && f[0] == "listen":
			r.Addr, err = n.listen(f[1], f[2], f[3], len(f) > 4 && f[4] == "transparent")
		case len(f) == 2 && f[0] == "dial":
			r.Dialed, err = n.dial(f[1])
		case len(f) == 1 && f[0] == "accepted":
			r.Accepted = n.accepted()
		default:
			err = fmt.Errorf("unknown command %q", sc.Text())
		}
		if err != nil {
			r.Err = err.Error()
		}
		enc.Encode(r)
	}
}

func (n *node) accepted() []accepted {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]accepted(nil), n.accepts...)
}

// listen starts a listener. kind "echo" answers each line with "NAME
// line"; "proxy" is an Envoy-like interception proxy that sends each
// connection to its original destination.
func (n *node) listen(name, addr, kind string, transparent bool) (string, error) {
	var ln net.Listener
	var err error
	if transparent {
		ln, err = mesh.ListenTransparent(n.ctx, addr)
	} else {
		ln, err = (&net.ListenConfig{}).Listen(n.ctx, "tcp4", addr)
	}
	if err != nil {
		return "", err
	}
	n.hold(ln)
	n.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.hold(c)
			n.wg.Go(func() { n.handle(name, kind, c.(*net.TCPConn)) })
		}
	})
	return ln.Addr().String(), nil
}

func (n *node) handle(name, kind string, c *net.TCPConn) {
	a := accepted{Listener: name, Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String()}
	if od, err := mesh.OriginalDst(c); err != nil {
		a.OrigDstErr = err.Error()
	} else {
		a.OrigDst = od.String()
	}
	a.Transparent, _ = mesh.Transparent(c)
	if kind == "echo" {
		n.record(a)
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if _, err := fmt.Fprintf(c, "%s %s\n", name, sc.Text()); err != nil {
				break
			}
		}
		c.Close() // the peer closed first: its socket goes to TIME_WAIT
		return
	}
	// Envoy's original_dst filter: SO_ORIGINAL_DST, else the local address.
	dst := a.OrigDst
	if dst == "" {
		dst = a.Local
	}
	n.mu.Lock()
	loop := n.upstreams[a.Remote]
	n.mu.Unlock()
	if loop { // our own upstream came back to us: never forward in a circle
		a.UpstreamErr = "loop: connection from this proxy's own upstream socket"
		n.record(a)
		c.Close()
		return
	}
	up, err := n.dialUpstream(c, dst)
	if err != nil {
		a.UpstreamErr = err.Error()
		n.record(a)
		c.Close()
		return
	}
	n.hold(up)
	a.Upstream, a.UpstreamTo = up.LocalAddr().String(), up.RemoteAddr().String()
	n.record(a)
	n.wg.Go(func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() })
	io.Copy(c, up)
	c.CloseWrite()
}

func (n *node) record(a accepted) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.accepts = append(n.accepts, a)
}

// dialUpstream connects to dst as Istio's Envoy does: inbound (to the app)
// from 127.0.0.6, which Istio's rules let through in both modes; outbound
// from the pod's own address.
//
// Envoy's original_src filter (Istio adds it to virtualInbound in TPROXY
// mode: IP_TRANSPARENT, bind to the client's IP, SO_MARK 1337) is not
// imitated: with this Istio version's rules such a connection from uid 1337
// to podIP:port is caught by nat ISTIO_OUTPUT's "-o lo ! -d 127.0.0.1
// --uid-owner 1337" rule, redirected to 127.0.0.1:15006, and never gets a
// SYN-ACK (docs/interception.md).
func (n *node) dialUpstream(c *net.TCPConn, dst string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	d := net.Dialer{}
	if local.Port() != mesh.OutboundCapturePort {
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 6)} // Istio's InboundPassthroughBindIpv4
	}
	up, err := d.DialContext(ctx, "tcp4", dst)
	if err == nil {
		n.mu.Lock()
		n.upstreams[up.LocalAddr().String()] = true
		n.mu.Unlock()
	}
	return up, err
}

// dial connects to addr, sends "hello" and reads the one-line answer; the
// connection stays open.
func (n *node) dial(addr string) (*dialed, error) {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
	if err != nil {
		return nil, err
	}
	n.hold(c)
	d := &dialed{Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String()}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return d, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	d.Reply = strings.TrimSpace(line)
	if err != nil {
		return d, fmt.Errorf("read reply from %s: %w", addr, err)
	}
	return d, nil
}

// process is a node running as a helper process in a namespace.
type process struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *json.Decoder
}

// startNode starts the test binary as a node in ns with attr's credentials.
func startNode(t testing.TB, ns *testutil.NetNS, attr *syscall.SysProcAttr) *process {
	t.Helper()
	cmd := exec.Command(testutil.SelfCopy(t))
	cmd.Env = append(os.Environ(), nodeEnv+"=1")
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var startErr error
	ns.Do(t, func() { startErr = cmd.Start() })
	if startErr != nil {
		t.Fatalf("start node: %v", startErr)
	}
	p := &process{t: t, cmd: cmd, stdin: stdin, out: json.NewDecoder(stdout)}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	return p
}

// appSysProcAttr runs a process as the app: uid 1000, no capability.
func appSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: appUID, Gid: appUID}, Pdeathsig: syscall.SIGKILL}
}

const appUID = 1000

func (p *process) do(format string, args ...any) (reply, error) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.stdin, format+"\n", args...); err != nil {
		p.t.Fatalf("node command: %v", err)
	}
	var r reply
	if err := p.out.Decode(&r); err != nil {
		p.t.Fatalf("node reply: %v", err)
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

func (p *process) listen(name, addr, kind string, transparent bool) {
	p.t.Helper()
	flag := ""
	if transparent {
		flag = "transparent"
	}
	if _, err := p.do("listen %s %s %s %s", name, addr, kind, flag); err != nil {
		p.t.Fatalf("listen %s %s: %v", name, addr, err)
	}
}

func (p *process) dial(addr string) dialed {
	p.t.Helper()
	r, err := p.do("dial %s", addr)
	if err != nil {
		p.t.Fatalf("dial %s: %v", addr, err)
	}
	return *r.Dialed
}

func (p *process) accepted() []accepted {
	p.t.Helper()
	r, err := p.do("accepted")
	if err != nil {
		p.t.Fatal(err)
	}
	return r.Accepted
}
