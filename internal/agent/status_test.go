package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/testenv/testutil"
)

// The status server is served on real sockets in a pod's network
// namespace (192.0.2.1, 2001:db8::1) and called from it (loopback, its own
// pod IP) and from another namespace (192.0.2.2, 2001:db8::2: the node or
// another pod). The agent behind it is a stand-in that records what it
// was asked to do.

type fakeBackend struct {
	mu    sync.Mutex
	calls []string
	why   string // readiness: "" ready
	// readyGate, when set, holds each readiness check until closed;
	// readyChecks counts the checks made.
	readyGate   chan struct{}
	readyChecks atomic.Int64
	// drainPhase, when set, is the drain's phase (draining).
	drainPhase string
	// watches counts watchState's calls.
	watches atomic.Int64
	// The machine's State (watchState): detached until set.
	st       drain.State
	attached bool
	changed  chan struct{}
}

// setState publishes st, as the machine does.
func (f *fakeBackend) setState(st drain.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st, f.attached = st, true
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
}

func (f *fakeBackend) watchState() (drain.State, <-chan struct{}, bool) {
	f.watches.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st, f.changed, f.attached
}

func (f *fakeBackend) record(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeBackend) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeBackend) readiness(ctx context.Context) (bool, string) {
	f.readyChecks.Add(1)
	if f.readyGate != nil {
		select {
		case <-f.readyGate:
		case <-ctx.Done():
			return false, ctx.Err().Error()
		}
	}
	return f.why == "", f.why
}

func (f *fakeBackend) draining() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drainPhase, f.drainPhase != ""
}

func (f *fakeBackend) proxyExited() <-chan struct{} { return nil }
func (f *fakeBackend) triggerDrain(c drain.Cause)   { f.record("drain " + c.String()) }
func (f *fakeBackend) quit()                        { f.record("quit") }
func (f *fakeBackend) flowsJSON() ([]byte, error) {
	f.record("flows")
	return []byte(`{"flows":[]}`), nil
}
func (f *fakeBackend) podState() PodState {
	f.record("state")
	return PodState{Version: PodStateVersion, Phase: "ready", Holds: []PodHold{}, Held: []PodHeldFor{}}
}
func (f *fakeBackend) metricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "draind_phase 1\n") })
}

// statusPod is a pod namespace serving the status handler twice: on
// [::]:15020 (dual-stack, as the default :15020 listens: IPv4 peers are
// seen as ::ffff:a.b.c.d) and on 0.0.0.0:15021 (IPv4 only).
type statusPod struct {
	pod, outside *testutil.NetNS
	b            *fakeBackend
}

func newStatusPod(t *testing.T, lim statusLimits) *statusPod {
	t.Helper()
	testutil.RequireRoot(t)
	sp := &statusPod{pod: testutil.NewNetNS(t), outside: testutil.NewNetNS(t), b: &fakeBackend{}}
	testutil.Link(t, sp.pod, sp.outside, "192.0.2.1/24", "192.0.2.2/24")
	addIPv6(t, sp.pod, "veth-a", "2001:db8::1/64")
	addIPv6(t, sp.outside, "veth-b", "2001:db8::2/64")
	for _, addr := range []string{"[::]:15020", "0.0.0.0:15021"} {
		network := "tcp4"
		if strings.HasPrefix(addr, "[") {
			network = "tcp"
		}
		s := newStatusServerLimits(sp.b, sp.pod.Listen(t, network, addr), lim)
		done := make(chan error, 1)
		go func() { done <- s.serve() }()
		t.Cleanup(func() {
			s.shutdown()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	return sp
}

// addIPv6 adds an address without duplicate address detection (usable at
// once).
func addIPv6(t *testing.T, ns *testutil.NetNS, link, cidr string) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s: %v", cidr, err)
	}
}

// dial connects from ns ("pod" or "outside") to addr. "passthrough" is
// the pod's namespace from 127.0.0.6, as Istio's inbound passthrough
// connects to the pod IP.
func (sp *statusPod) dial(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	ns, dial := sp.pod, sp.pod.Dialer()
	switch from {
	case "outside":
		ns = sp.outside
		dial = ns.Dialer()
	case "passthrough":
		dial = dialFrom(ns, "127.0.0.6")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// do sends one raw request (headers exactly as given) and reads the answer.
func (sp *statusPod) do(t *testing.T, from, addr, method, target string, headers ...string) (int, string) {
	t.Helper()
	c := sp.dial(t, from, addr)
	req := method + " " + target + " HTTP/1.1\r\n"
	if !slices.ContainsFunc(headers, func(h string) bool { return strings.HasPrefix(h, "Host:") }) {
		req += "Host: draind\r\n"
	}
	for _, h := range headers {
		req += h + "\r\n"
	}
	req += "Content-Length: 0\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s from %s to %s: %v", method, target, from, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// The loopback-only endpoints, what each does when allowed, and its status.
var loopbackEndpoints = []struct {
	method, target string
	call           string // what the backend records ("" for none)
	code           int
}{
	{"POST", "/drain", "drain post-drain", http.StatusAccepted},
	{"POST", "/drain?cause=prestop", "drain prestop-hook", http.StatusAccepted},
	{"POST", "/quitquitquit", "quit", http.StatusAccepted},
	{"GET", "/debug/flows", "flows", http.StatusOK},
	{"GET", "/debug/state", "state", http.StatusOK},
	{"GET", "/debug/privileges", "", http.StatusOK},
}

func TestStatusLoopbackOnly(t *testing.T) {
	sp := newStatusPod(t, defaultStatusLimits)
	for _, tc := range []struct {
		name    string
		from    string // "pod" or "outside"
		addr    string
		headers []string
		allowed bool
	}{
		{"loopback IPv4 to a dual-stack listener (::ffff:127.0.0.1)", "pod", "127.0.0.1:15020", nil, true},
		{"loopback IPv4", "pod", "127.0.0.1:15021", nil, true},
		{"loopback 127.0.0.2", "pod", "127.0.0.2:15021", nil, true},
		{"loopback IPv6", "pod", "[::1]:15020", nil, true},
		{"the pod's own IP (a pod-mate must use loopback)", "pod", "192.0.2.1:15021", nil, false},
		{"from 127.0.0.6 to the pod IP (Istio's inbound passthrough)", "passthrough", "192.0.2.1:15021", nil, false},
		{"from 127.0.0.6 to the pod IP, dual-stack (::ffff:127.0.0.6)", "passthrough", "192.0.2.1:15020", nil, false},
		{"outside IPv4", "outside", "192.0.2.1:15021", nil, false},
		{"outside IPv4-mapped IPv6 (::ffff:192.0.2.2)", "outside", "192.0.2.1:15020", nil, false},
		{"outside IPv6", "outside", "[2001:db8::1]:15020", nil, false},
		{"outside, Host: localhost", "outside", "192.0.2.1:15020", []string{"Host: localhost"}, false},
		{"outside, Host: 127.0.0.1:15020", "outside", "192.0.2.1:15021", []string{"Host: 127.0.0.1:15020"}, false},
		{"outside, Host: [::1]", "outside", "[2001:db8::1]:15020", []string{"Host: [::1]"}, false},
		{"outside, X-Forwarded-For: 127.0.0.1", "outside", "192.0.2.1:15020", []string{"X-Forwarded-For: 127.0.0.1"}, false},
		{"outside, X-Real-IP and Forwarded", "outside", "192.0.2.1:15021", []string{"X-Real-IP: 127.0.0.1", "Forwarded: for=127.0.0.1"}, false},
		{"loopback but relayed (X-Forwarded-For)", "pod", "127.0.0.1:15021", []string{"X-Forwarded-For: 192.0.2.2"}, false},
		{"loopback but relayed by Envoy (x-forwarded-proto, x-envoy-*)", "pod", "[::1]:15020", []string{"x-forwarded-proto: http", "x-envoy-expected-rq-timeout-ms: 15000"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ep := range loopbackEndpoints {
				code, body := sp.do(t, tc.from, tc.addr, ep.method, ep.target, tc.headers...)
				calls := sp.b.took()
				switch {
				case tc.allowed && (code != ep.code || (ep.call != "" && !slices.Equal(calls, []string{ep.call}))):
					t.Errorf("%s %s: %d %q, backend %v; want %d and %q", ep.method, ep.target, code, body, calls, ep.code, ep.call)
				case !tc.allowed && (code != http.StatusForbidden || len(calls) != 0 || !strings.HasPrefix(body, "loopback only")):
					t.Errorf("%s %s: %d %q, backend %v; want 403, nothing done", ep.method, ep.target, code, body, calls)
				}
			}
			// The probes and the metrics answer everyone.
			for _, target := range []string{"/healthz/ready", "/healthz/live", "/metrics"} {
				if code, body := sp.do(t, tc.from, tc.addr, "GET", target, tc.headers...); code != http.StatusOK {
					t.Errorf("GET %s: %d %q", target, code, body)
				}
			}
		})
	}
}

// The readiness reason outside the pod is its first part only: an admin
// error can quote Envoy's answer.
func TestStatusReadinessReason(t *testing.T) {
	sp := newStatusPod(t, defaultStatusLimits)
	sp.b.why = `envoy admin: envoy admin: GET /server_info: status 500: "internal detail"`
	for _, tc := range []struct{ from, addr, want string }{
		{"pod", "127.0.0.1:15020", sp.b.why},
		{"outside", "192.0.2.1:15020", "envoy admin"},
		{"outside", "[2001:db8::1]:15020", "envoy admin"},
	} {
		if code, body := sp.do(t, tc.from, tc.addr, "GET", "/healthz/ready"); code != http.StatusServiceUnavailable || body != tc.want {
			t.Errorf("from %s (%s): %d %q, want 503 %q", tc.from, tc.addr, code, body, tc.want)
		}
	}
	sp.b.why = "app not listening on port 8080"
	if _, body := sp.do(t, "outside", "192.0.2.1:15020", "GET", "/healthz/ready"); body != sp.b.why {
		t.Errorf("outside: %q", body)
	}
}

// /debug/privileges reports every thread's sets and the two trials.
func TestStatusPrivileges(t *testing.T) {
	sp := newStatusPod(t, defaultStatusLimits)
	code, body := sp.do(t, "pod", "127.0.0.1:15020", "GET", "/debug/privileges")
	var got struct {
		Sets []struct {
			Effective string `json:"effective"`
			Threads   int    `json:"threads"`
		} `json:"sets"`
		BPFLoad string `json:"bpf_load"`
		Setns   string `json:"setns"`
	}
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || len(got.Sets) == 0 || got.Sets[0].Threads == 0 {
		t.Fatalf("%d %s: %v", code, body, err)
	}
	// The test runs as root with every capability: both are allowed.
	if got.BPFLoad != "allowed" || got.Setns != "allowed" {
		t.Errorf("as root: bpf_load %q, setns %q", got.BPFLoad, got.Setns)
	}
}

// Oversized requests are refused; slow ones are cut.
func TestStatusLimits(t *testing.T) {
	lim := defaultStatusLimits
	lim.ReadHeader, lim.Read, lim.Idle = 300*time.Millisecond, 600*time.Millisecond, 300*time.Millisecond
	sp := newStatusPod(t, lim)
	const addr = "127.0.0.1:15020"

	t.Run("header", func(t *testing.T) {
		big := "X-Big: " + strings.Repeat("a", lim.MaxHeaderBytes+4096)
		if code, _ := sp.do(t, "pod", addr, "GET", "/healthz/live", big); code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("a %d-byte header: %d, want 431", len(big), code)
		}
		if code, _ := sp.do(t, "pod", addr, "GET", "/healthz/live", "X-Fine: "+strings.Repeat("a", 2000)); code != http.StatusOK {
			t.Errorf("a 2 KB header: %d", code)
		}
	})
	t.Run("body", func(t *testing.T) {
		for _, tc := range []struct {
			name, req string
			want      int
		}{
			{"small", "POST /drain HTTP/1.1\r\nHost: d\r\nContent-Length: 10\r\n\r\n0123456789", http.StatusAccepted},
			{"declared too large", fmt.Sprintf("POST /drain HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n", lim.MaxBodyBytes+1), http.StatusRequestEntityTooLarge},
			{"chunked too large", "POST /drain HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", lim.MaxBodyBytes+1, strings.Repeat("b", int(lim.MaxBodyBytes)+1)), http.StatusRequestEntityTooLarge},
		} {
			c := sp.dial(t, "pod", addr)
			io.WriteString(c, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusAccepted {
				sp.b.took()
			} else if calls := sp.b.took(); len(calls) != 0 {
				t.Errorf("%s: the backend was called: %v", tc.name, calls)
			}
		}
	})
	// A client that stops sending loses its connection (the server closes
	// it: EOF or a reset), whatever it stopped in.
	for _, tc := range []struct{ name, partial string }{
		{"header never ends", "GET /healthz/live HTTP/1.1\r\nHost: d\r\n"},
		{"body never comes", "POST /drain HTTP/1.1\r\nHost: d\r\nContent-Length: 100\r\n\r\n0123456789"},
		{"connects and sends nothing", ""},
		{"keep-alive, then idle", "GET /healthz/live HTTP/1.1\r\nHost: d\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := sp.dial(t, "pod", addr)
			io.WriteString(c, tc.partial)
			b, err := io.ReadAll(c) // until the server closes; the conn's deadline is 10 s
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the server kept the connection: %v", err)
			}
			if err != nil && !errors.Is(err, unix.ECONNRESET) {
				t.Fatalf("read: %v", err)
			}
			if calls := sp.b.took(); len(calls) != 0 {
				t.Errorf("the backend was called: %v (answer %q)", calls, b)
			}
		})
	}
}

// The app's preStop wait outlasts the server's read and write timeouts
// (the begin wait is 10 s, the min-drain's ceiling 15 s, both 10 s):
// it gets its answer, not an EOF when a deadline expires under it.
func TestStatusRotationWaitOutlastsTimeouts(t *testing.T) {
	lim := defaultStatusLimits
	lim.ReadHeader, lim.Read, lim.Write = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	lim.DrainBeginWait = 1500 * time.Millisecond
	sp := newStatusPod(t, lim)
	sp.b.setState(drain.State{Phase: drain.Ready})
	start := time.Now()
	code, body := sp.do(t, "outside", "192.0.2.1:15020", "GET", RotationWaitPath)
	if took := time.Since(start); code != http.StatusOK || !strings.HasPrefix(body, "no-drain") || took < lim.DrainBeginWait {
		t.Errorf("after %s: %d %q, want 200 no-drain after the %s begin wait", took, code, body, lim.DrainBeginWait)
	}
}
