package agent

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/testenv/nsrun"
	"github.com/draind/draind/internal/testenv/testutil"
)

// Issue 43: a neighbour, anyone who reaches the pod IP, must not shut the
// kubelet out of the status server. The neighbour here is 192.0.2.3 (a
// second address of the outside namespace); the kubelet is 192.0.2.2.

const neighbourIP = "192.0.2.3"

// dialFrom connects from ns with local as the source address.
func dialFrom(ns *testutil.NetNS, local string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = nsrun.Do(ns.Handle, func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// withNeighbour adds neighbourIP to the outside namespace.
func (sp *statusPod) withNeighbour(t *testing.T) {
	t.Helper()
	sp.outside.AddAddr(t, "veth-b", neighbourIP+"/24")
}

// hold opens n connections from the neighbour to addr, sends req on each
// and reads the status line of each answer that comes before the
// connection's first read deadline (none comes to a wait). It returns the
// connections (closed at the test's end) and the codes read, by
// connection.
func (sp *statusPod) hold(t *testing.T, n int, addr, req string, wait time.Duration) ([]net.Conn, []int) {
	t.Helper()
	dial := dialFrom(sp.outside, neighbourIP)
	conns := make([]net.Conn, n)
	codes := make([]int, n)
	for i := range n {
		c, err := dial(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatalf("neighbour connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatalf("neighbour connection %d: %v", i, err)
		}
		if wait > 0 {
			c.SetReadDeadline(time.Now().Add(wait))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				codes[i] = resp.StatusCode
				io.Copy(io.Discard, resp.Body)
			}
		}
	}
	return conns, codes
}

// count is how many of codes are code.
func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// A neighbour that opens every connection the server would serve, sends a
// request on each and keeps them idle gets its share (PerSource) served
// and the others answered 429; the kubelet's probe from another address
// is answered while they are held, and so is a pod container's. The idle
// timeout is long here: the share alone is tested.
func TestStatusNeighbourShare(t *testing.T) {
	lim := defaultStatusLimits
	lim.Idle = time.Minute
	sp := newStatusPod(t, lim)
	sp.withNeighbour(t)
	const req = "GET /healthz/live HTTP/1.1\r\nHost: draind\r\n\r\n"
	n := lim.MaxConns + 8
	conns, codes := sp.hold(t, n, "192.0.2.1:15020", req, 5*time.Second)
	if served, refused := count(codes, 200), count(codes, http.StatusTooManyRequests); served != lim.PerSource || refused != n-lim.PerSource {
		t.Errorf("a neighbour's %d kept-alive connections: %d served, %d refused (429), %d other; want %d served, the rest 429",
			n, served, refused, n-served-refused, lim.PerSource)
	}
	for _, from := range []struct{ ns, addr string }{{"outside", "192.0.2.1:15020"}, {"outside", "[2001:db8::1]:15020"}, {"pod", "127.0.0.1:15020"}} {
		if code, body := sp.do(t, from.ns, from.addr, "GET", "/healthz/ready"); code != 200 {
			t.Errorf("a probe from %s to %s while the neighbour holds its connections: %d %q", from.ns, from.addr, code, body)
		}
	}
	// Its share comes back as it closes them.
	for _, c := range conns {
		c.Close()
	}
	testutil.Eventually(t, "the neighbour's share back", func() error {
		_, codes := sp.hold(t, 1, "192.0.2.1:15020", "GET /healthz/live HTTP/1.1\r\nHost: draind\r\nConnection: close\r\n\r\n", 5*time.Second)
		if codes[0] != 200 {
			return &statusErr{codes[0]}
		}
		return nil
	})
}

type statusErr struct{ code int }

func (e *statusErr) Error() string { return http.StatusText(e.code) }

// A neighbour holding out-of-rotation waits cannot make the kubelet's
// preStop call return early: the call finds a connection, and is answered
// only once the pod is out of rotation, with what the drain published
// then. (The server refused the kubelet with 429 once 64 were waiting.)
func TestStatusRotationWaitersBounded(t *testing.T) {
	lim := defaultStatusLimits
	lim.DrainBeginWait = time.Minute // the neighbour's waits outlast the test
	sp := newStatusPod(t, lim)
	sp.withNeighbour(t)
	sp.b.setState(drain.State{Phase: drain.Ready})
	const n = 200
	const req = "GET " + RotationWaitPath + " HTTP/1.1\r\nHost: draind\r\n\r\n"
	sp.hold(t, n, "192.0.2.1:15020", req, 0)
	// Each served wait has read the state once.
	testutil.Eventually(t, "the neighbour's waits served", func() error {
		if w := sp.b.watches.Load(); w < int64(lim.PerSource) {
			return &statusErr{int(w)}
		}
		return nil
	})

	type answer struct {
		code          int
		outcome, body string
		err           error
	}
	kubelet := make(chan answer, 1)
	before := sp.b.watches.Load()
	go func() {
		c, err := sp.outside.Dialer()(context.Background(), "tcp", "192.0.2.1:15020")
		if err != nil {
			kubelet <- answer{err: err}
			return
		}
		defer c.Close()
		io.WriteString(c, req)
		c.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			kubelet <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		kubelet <- answer{code: resp.StatusCode, outcome: resp.Header.Get("Draind-Outcome"), body: string(b)}
	}()
	// The kubelet's call is served (it read the state), or answered.
	testutil.Eventually(t, "the kubelet's call served", func() error {
		select {
		case a := <-kubelet:
			kubelet <- a
			return nil
		default:
		}
		if sp.b.watches.Load() == before {
			return io.ErrNoProgress
		}
		return nil
	})
	sp.b.setState(drain.State{Phase: drain.Draining, Cause: drain.CauseSignal})
	const account = "quiet for 1s after 7 new connections"
	sp.b.setState(drain.State{Phase: drain.Gating, Cause: drain.CauseSignal,
		Rotation: &drain.RotationEnd{Took: 2 * time.Second, Why: drain.RotationQuiet, Account: account}})
	a := <-kubelet
	// Only an answer given once the pod was out of rotation names its
	// account.
	if a.err != nil || a.code != 200 || a.outcome != "out-of-rotation" || !strings.Contains(a.body, account) {
		t.Errorf("the kubelet's preStop call beside %d neighbour waits: %d %q %q %v; want 200 out-of-rotation with the rotation's account", n, a.code, a.outcome, a.body, a.err)
	}
}

// Concurrent readiness probes share one check; a probe that shared a
// check begun before the drain still fails from the drain's first moment.
func TestStatusReadinessShared(t *testing.T) {
	probe := func(h http.Handler) <-chan int {
		code := make(chan int, 1)
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "http://192.0.2.1:15020/healthz/ready", nil))
			code <- rec.Code
		}()
		return code
	}
	t.Run("a hundred probes, one check", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{readyGate: make(chan struct{})}
			h := newStatusServerLimits(b, nil, defaultStatusLimits).srv.Handler
			var codes []<-chan int
			for range 100 {
				codes = append(codes, probe(h))
			}
			synctest.Wait()
			close(b.readyGate)
			for _, c := range codes {
				if code := <-c; code != 200 {
					t.Errorf("a probe: %d", code)
				}
			}
			if n := b.readyChecks.Load(); n != 1 {
				t.Errorf("%d readiness checks for 100 concurrent probes, want 1", n)
			}
			// Once done, the next probe asks again.
			if code := <-probe(h); code != 200 || b.readyChecks.Load() != 2 {
				t.Errorf("a later probe: %d after %d checks", code, b.readyChecks.Load())
			}
		})
	})
	t.Run("the drain begins during a shared check", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{readyGate: make(chan struct{})}
			h := newStatusServerLimits(b, nil, defaultStatusLimits).srv.Handler
			first := probe(h)
			synctest.Wait()
			second := probe(h)
			synctest.Wait()
			b.mu.Lock()
			b.drainPhase = "draining"
			b.mu.Unlock()
			close(b.readyGate)
			if c1, c2 := <-first, <-second; c1 != 503 || c2 != 503 {
				t.Errorf("probes whose check began before the drain: %d %d, want 503", c1, c2)
			}
		})
	})
	t.Run("a probe that leaves does not fail the others", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{readyGate: make(chan struct{})}
			h := newStatusServerLimits(b, nil, defaultStatusLimits).srv.Handler
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, "GET", "http://192.0.2.1:15020/healthz/ready", nil))
			})
			synctest.Wait()
			other := probe(h)
			synctest.Wait()
			cancel()
			synctest.Wait()
			close(b.readyGate)
			if code := <-other; code != 200 {
				t.Errorf("the other probe: %d", code)
			}
			wg.Wait()
		})
	})
}

// The probes' admin client refuses a large answer (an impersonator of the
// admin API) instead of reading it: 4 MiB each was the drain client's
// limit, which the probes shared.
func TestProbeAdminBodyLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "LIVE"+strings.Repeat(" ", 1<<20))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c := newProbeAdmin(ln.Addr().String())
	defer c.CloseIdleConnections()
	if _, err := c.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a 1 MiB answer to GET /ready: %v; want refused as too large", err)
	}
}
