package envoy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fixtureAdmin is an admin API that answers with the hand-written fixtures
// of testdata/ (Envoy's formats, from its docs and admin tests). /stats
// applies filter (RE2, partial match) to the fixture's lines, as Envoy does.
type fixtureAdmin struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	stats   []byte // /stats text body, filtered line by line
	hits    atomic.Int32
	queries []string
	methods []string
	// answer, when set, answers every request.
	answer func(n int32, w http.ResponseWriter, r *http.Request)
	hang   chan struct{}
}

func newFixtureAdmin(t *testing.T, statsFixture string) *fixtureAdmin {
	fa := &fixtureAdmin{t: t, hang: make(chan struct{})}
	if statsFixture != "" {
		fa.stats = fixture(t, statsFixture)
	}
	fa.srv = httptest.NewServer(http.HandlerFunc(fa.serve))
	t.Cleanup(func() {
		close(fa.hang)
		fa.srv.Close()
	})
	return fa
}

func (fa *fixtureAdmin) addr() string { return strings.TrimPrefix(fa.srv.URL, "http://") }

func (fa *fixtureAdmin) last() (method, query string) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return fa.methods[len(fa.methods)-1], fa.queries[len(fa.queries)-1]
}

func (fa *fixtureAdmin) serve(w http.ResponseWriter, r *http.Request) {
	n := fa.hits.Add(1)
	fa.mu.Lock()
	fa.queries = append(fa.queries, r.URL.RawQuery)
	fa.methods = append(fa.methods, r.Method+" "+r.URL.Path)
	answer := fa.answer
	fa.mu.Unlock()
	if answer != nil {
		answer(n, w, r)
		return
	}
	switch r.URL.Path {
	case "/stats":
		var re *regexp.Regexp
		if f := r.URL.Query().Get("filter"); f != "" {
			var err error
			if re, err = regexp.Compile(f); err != nil {
				w.WriteHeader(400)
				w.Write(fixture(fa.t, "answer_400_regex.txt"))
				return
			}
		}
		sc := bufio.NewScanner(bytes.NewReader(fa.stats))
		for sc.Scan() {
			line := sc.Text()
			name, _, _ := strings.Cut(line, ": ")
			if re == nil || re.MatchString(name) {
				w.Write([]byte(line + "\n"))
			}
		}
	case "/drain_listeners", "/quitquitquit":
		if r.Method != "POST" {
			w.WriteHeader(405)
			w.Write(fixture(fa.t, "answer_405.txt"))
			return
		}
		w.Write([]byte("OK\n"))
	default:
		w.WriteHeader(404)
		w.Write(fixture(fa.t, "answer_404.txt"))
	}
}

func (fa *fixtureAdmin) setAnswer(f func(n int32, w http.ResponseWriter, r *http.Request)) {
	fa.mu.Lock()
	fa.answer = f
	fa.mu.Unlock()
}

func fixed(code int, body string) func(int32, http.ResponseWriter, *http.Request) {
	return func(_ int32, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(code)
		w.Write([]byte(body))
	}
}

// fast is a client with short backoffs, for tests.
func fast(addr string, opts ...envoy.Option) *envoy.Client {
	return envoy.New(addr, append([]envoy.Option{envoy.WithBackoff(time.Millisecond), envoy.WithTimeout(5 * time.Second)}, opts...)...)
}

// call is one of the client's calls, made for its error.
type call struct {
	name string
	do   func(context.Context, *envoy.Client) error
	get  bool // a GET (repeatable)
}

var calls = []call{
	{"ActiveDownstream", func(ctx context.Context, c *envoy.Client) error { _, err := c.ActiveDownstream(ctx); return err }, true},
	{"DownstreamGauges", func(ctx context.Context, c *envoy.Client) error { _, err := c.DownstreamGauges(ctx); return err }, true},
	{"Live", func(ctx context.Context, c *envoy.Client) error { _, err := c.Live(ctx); return err }, true},
	{"DrainListeners", func(ctx context.Context, c *envoy.Client) error {
		return c.DrainListeners(ctx, envoy.DrainOptions{InboundOnly: true, Graceful: true})
	}, false},
	{"QuitQuitQuit", func(ctx context.Context, c *envoy.Client) error { return c.QuitQuitQuit(ctx) }, false},
}

func TestClientFixtures(t *testing.T) {
	ctx := context.Background()
	fa := newFixtureAdmin(t, "stats_sidecar.txt")
	c := fast(fa.addr())

	ac, err := c.ActiveDownstream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Total != 15 || ac.Gauges != 5 || len(ac.Listeners) != 5 || len(ac.Excluded) != 5 {
		t.Errorf("got %+v; want 15 over 5 gauges, 5 excluded (the default 15020/15021/15090)", ac)
	}
	if m, q := fa.last(); m != "GET /stats" || q != `usedonly&filter=%5Elistener%5C..%2Adownstream_cx_active%24` {
		t.Errorf("sent %s ?%s", m, q)
	}

	// The accepted connections' counters: admin left out (the fixture
	// admin filters as Envoy does), and Istio's outbound listener, whose
	// connections are the app's own calls.
	if total, n, err := c.ArrivalTotal(ctx, envoy.ExcludeSet{}); err != nil || total != 1931+77 || n != 2 {
		t.Errorf("total: %d over %d counters, %v; want 2008 over 2", total, n, err)
	}
	if total, n, err := c.ArrivalTotal(ctx, envoy.IstioOutbound()); err != nil || total != 1931 || n != 2 {
		t.Errorf("total without the outbound listener: %d over %d counters, %v; want 1931 over 2", total, n, err)
	}
	if m, q := fa.last(); m != "GET /stats" || q != `filter=%5Elistener%5C..%2Adownstream_cx_total%24` {
		t.Errorf("total: sent %s ?%s", m, q)
	}

	if present, err := c.DownstreamGauges(ctx); err != nil || !present {
		t.Errorf("gauges: %t %v", present, err)
	}
	if m, q := fa.last(); m != "GET /stats" || q != `filter=%5Elistener%5C..%2Adownstream_cx_active%24` {
		t.Errorf("gauges: sent %s ?%s, want no usedonly", m, q)
	}

	l, err := c.Live(ctx)
	if err != nil || !l.Live() || l.State != envoy.StateLive || !l.WorkersStarted {
		t.Errorf("live: %+v %v", l, err)
	}
	if _, q := fa.last(); q != `filter=%5E%28server%5C.state%7Clistener_manager%5C.workers_started%29%24` {
		t.Errorf("live: sent ?%s", q)
	}

	for _, tc := range []struct {
		o    envoy.DrainOptions
		want string
	}{
		{envoy.DrainOptions{InboundOnly: true, Graceful: true}, "inboundonly&graceful"},
		{envoy.DrainOptions{Graceful: true}, "graceful"},
		{envoy.DrainOptions{}, ""},
		{envoy.DrainOptions{InboundOnly: true, Graceful: true, SkipExit: true}, "inboundonly&graceful&skip_exit"},
	} {
		if err := c.DrainListeners(ctx, tc.o); err != nil {
			t.Fatal(err)
		}
		if m, q := fa.last(); q != tc.want || m != "POST /drain_listeners" {
			t.Errorf("%+v: sent %s ?%s, want POST ?%s", tc.o, m, q, tc.want)
		}
	}
	if err := c.QuitQuitQuit(ctx); err != nil {
		t.Error(err)
	}
	if m, _ := fa.last(); m != "POST /quitquitquit" {
		t.Errorf("quit sent %s", m)
	}

	// Exclusions are the client's, given once.
	ac, err = fast(fa.addr(), envoy.WithExclude(envoy.ExcludeSet{})).ActiveDownstream(ctx)
	if err != nil || ac.Total != 21 || ac.Gauges != 10 || len(ac.Excluded) != 0 {
		t.Errorf("no exclusions: %+v %v", ac, err)
	}
}

// Istio's default stats_matcher keeps no downstream_cx_active gauge: the
// answer is empty. That is 0 over 0 gauges, and no gauges at all; Live
// still works (server and listener_manager are kept).
func TestClientIstioMatcher(t *testing.T) {
	ctx := context.Background()
	fa := newFixtureAdmin(t, "stats_istio_live.txt")
	c := fast(fa.addr())
	ac, err := c.ActiveDownstream(ctx)
	if err != nil || ac.Total != 0 || ac.Gauges != 0 {
		t.Errorf("active: %+v %v", ac, err)
	}
	if present, err := c.DownstreamGauges(ctx); err != nil || present {
		t.Errorf("gauges: %t %v, want absent", present, err)
	}
	if l, err := c.Live(ctx); err != nil || !l.Live() {
		t.Errorf("live: %+v %v", l, err)
	}

	// Only the excluded listeners' gauges: no traffic gauge.
	fa.setAnswer(fixed(200, "listener.0.0.0.0_15021.downstream_cx_active: 0\nlistener.admin.downstream_cx_active: 1\n"))
	if present, err := c.DownstreamGauges(ctx); err != nil || present {
		t.Errorf("only excluded gauges: %t %v, want absent", present, err)
	}
	fa.setAnswer(fixed(200, "listener.0.0.0.0_15006.downstream_cx_active: 0\n"))
	if present, err := c.DownstreamGauges(ctx); err != nil || !present {
		t.Errorf("a zero traffic gauge: %t %v, want present", present, err)
	}

	// A matcher that drops server.state: liveness cannot be told.
	fa.setAnswer(fixed(200, "listener_manager.workers_started: 1\n"))
	if _, err := c.Live(ctx); !errors.Is(err, envoy.ErrStatAbsent) || !strings.Contains(err.Error(), "server.state") {
		t.Errorf("live without server.state: %v", err)
	}
	// A starting Envoy: server.state unset (0), workers not started.
	fa.setAnswer(fixed(200, "listener_manager.workers_started: 0\nserver.state: 0\n"))
	if l, err := c.Live(ctx); err != nil || l.Live() || l.WorkersStarted {
		t.Errorf("starting: %+v %v", l, err)
	}
}

func TestClientAnswers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		answer func(int32, http.ResponseWriter, *http.Request)
		code   int    // want a StatusError with this code
		body   string // and this body
		is     error  // or an error matching this
		// attempts made by a GET and by a POST
		getAttempts, postAttempts int32
	}{
		{name: "405", answer: fixed(405, "Method GET not allowed, POST required."),
			code: 405, body: "Method GET not allowed, POST required.", getAttempts: 1, postAttempts: 1},
		{name: "404", answer: fixed(404, "invalid path. admin commands are:\n"),
			code: 404, body: "invalid path. admin commands are:\n", getAttempts: 1, postAttempts: 1},
		{name: "400 bad regex", answer: fixed(400, "Invalid re2 regex"),
			code: 400, body: "Invalid re2 regex", getAttempts: 1, postAttempts: 1},
		{name: "500 retried then given up", answer: fixed(500, "boom"),
			code: 500, body: "boom", getAttempts: 3, postAttempts: 3},
		{name: "garbage", answer: func(_ int32, w http.ResponseWriter, _ *http.Request) { w.Write(fixture(t, "garbage.bin")) },
			is: envoy.ErrMalformed, getAttempts: 1, postAttempts: 1},
		{name: "reset before the answer", answer: func(_ int32, w http.ResponseWriter, _ *http.Request) { resetConn(w) },
			is: envoy.ErrUnreachable, getAttempts: 3, postAttempts: 3},
		{name: "body over the limit", answer: func(_ int32, w http.ResponseWriter, _ *http.Request) {
			w.Write(bytes.Repeat([]byte("a: 1\n"), 1000))
		}, is: errAny, getAttempts: 1, postAttempts: 1},
	} {
		for _, cl := range calls {
			t.Run(tc.name+"/"+cl.name, func(t *testing.T) {
				fa := newFixtureAdmin(t, "")
				fa.setAnswer(tc.answer)
				err := cl.do(ctx, fast(fa.addr(), envoy.WithMaxBody(4096)))
				want := tc.getAttempts
				if !cl.get {
					want = tc.postAttempts
				}
				switch {
				case errors.Is(tc.is, envoy.ErrMalformed) && cl.name == "QuitQuitQuit":
					// A quit's body is not read: any 200 is Envoy going.
					if err != nil {
						t.Errorf("err = %v", err)
					}
				case errors.Is(tc.is, envoy.ErrMalformed) && cl.name == "DrainListeners":
					// A drain's is: only Envoy's OK says it drains.
					if !errors.Is(err, envoy.ErrMalformed) {
						t.Errorf("err = %v, want ErrMalformed", err)
					}
				case errors.Is(tc.is, envoy.ErrUnreachable) && cl.name == "QuitQuitQuit":
					want = 1 // the request may have been acted on: not retried
					if !errors.Is(err, envoy.ErrUnreachable) {
						t.Errorf("err = %v", err)
					}
				case errors.Is(tc.is, errAny) && !cl.get:
					if err == nil {
						t.Error("no error for a body over the limit")
					}
				case tc.code != 0:
					var se *envoy.StatusError
					if !errors.As(err, &se) || se.Code != tc.code || se.Body != tc.body {
						t.Errorf("err = %v, want status %d %q", err, tc.code, tc.body)
					}
					if errors.Is(err, envoy.ErrUnreachable) {
						t.Errorf("a status error is not ErrUnreachable")
					}
				case errors.Is(tc.is, errAny):
					if err == nil {
						t.Error("no error")
					}
				default:
					if !errors.Is(err, tc.is) {
						t.Errorf("err = %v, want %v", err, tc.is)
					}
				}
				if n := fa.hits.Load(); n != want {
					t.Errorf("%d attempts, want %d", n, want)
				}
			})
		}
	}
}

var errAny = errors.New("any error")

// resetConn resets the connection under a handler.
func resetConn(w http.ResponseWriter) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

// Every call returns by its timeout when the admin API hangs or answers
// after the timeout; a timeout is not retried.
func TestClientNeverHangs(t *testing.T) {
	for _, mode := range []string{"hang", "slow"} {
		for _, cl := range calls {
			t.Run(mode+"/"+cl.name, func(t *testing.T) {
				fa := newFixtureAdmin(t, "stats_sidecar.txt")
				fa.setAnswer(func(_ int32, w http.ResponseWriter, r *http.Request) {
					d := time.Hour
					if mode == "slow" {
						d = 2 * time.Second
					}
					select {
					case <-r.Context().Done():
					case <-fa.hang:
					case <-time.After(d):
						w.Write([]byte("OK\n"))
					}
				})
				c := envoy.New(fa.addr(), envoy.WithTimeout(200*time.Millisecond))
				done := make(chan error, 1)
				go func() { done <- cl.do(context.Background(), c) }()
				select {
				case err := <-done:
					if !errors.Is(err, envoy.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("err = %v, want ErrUnreachable and DeadlineExceeded", err)
					}
					var ue *envoy.UnreachableError
					if !errors.As(err, &ue) || ue.Path == "" {
						t.Errorf("err = %#v, want an UnreachableError naming the path", err)
					}
					if n := fa.hits.Load(); n != 1 {
						t.Errorf("%d attempts: a timeout is not retried", n)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("the call did not return by its timeout")
				}
			})
		}
	}
}

func TestClientUnreachable(t *testing.T) {
	// A port nothing listens on: bind one, note it, close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := fast(addr)
	for _, cl := range calls {
		err := cl.do(context.Background(), c)
		if !errors.Is(err, envoy.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: err = %v, want ErrUnreachable and ECONNREFUSED", cl.name, err)
		}
		if errors.Is(err, envoy.ErrStatAbsent) || errors.Is(err, envoy.ErrMalformed) {
			t.Errorf("%s: unreachable is neither absent nor malformed", cl.name)
		}
		// The caller's own cancellation is not Envoy's unreachability.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err = cl.do(ctx, c)
		if !errors.Is(err, context.Canceled) || errors.Is(err, envoy.ErrUnreachable) {
			t.Errorf("%s canceled: err = %v, want context.Canceled and not ErrUnreachable", cl.name, err)
		}
	}
}

func TestClientRetriesWithinTimeout(t *testing.T) {
	fa := newFixtureAdmin(t, "")
	fa.setAnswer(fixed(503, "no"))
	// Many retries, long backoff, short timeout: the timeout wins.
	c := envoy.New(fa.addr(), envoy.WithRetries(100), envoy.WithBackoff(50*time.Millisecond), envoy.WithTimeout(300*time.Millisecond))
	start := time.Now()
	_, err := c.ActiveDownstream(context.Background())
	var se *envoy.StatusError
	if !errors.As(err, &se) || se.Code != 503 {
		t.Errorf("err = %v, want the last 503", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v, far past the 300ms timeout", d)
	}
	if n := fa.hits.Load(); n < 2 || n > 100 {
		t.Errorf("%d attempts", n)
	}
}

func TestClientCanceledDuringBackoff(t *testing.T) {
	fa := newFixtureAdmin(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fa.setAnswer(func(_ int32, w http.ResponseWriter, _ *http.Request) {
		cancel() // the caller gives up while the client backs off
		w.WriteHeader(503)
	})
	c := envoy.New(fa.addr(), envoy.WithRetries(5), envoy.WithBackoff(time.Second), envoy.WithTimeout(10*time.Second))
	_, err := c.Live(ctx)
	if !errors.Is(err, context.Canceled) || errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if n := fa.hits.Load(); n != 1 {
		t.Errorf("%d attempts after the cancel", n)
	}
}

func TestClient503Then200(t *testing.T) {
	fa := newFixtureAdmin(t, "")
	fa.setAnswer(func(n int32, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(503)
			return
		}
		w.Write([]byte("listener.admin.downstream_cx_active: 1\nlistener.127.0.0.1_8080.downstream_cx_active: 2\n"))
	})
	ac, err := fast(fa.addr()).ActiveDownstream(context.Background())
	if err != nil || ac.Total != 2 || ac.Gauges != 1 || fa.hits.Load() != 2 {
		t.Errorf("%+v %v after %d attempts", ac, err, fa.hits.Load())
	}
}

// What the fixtures answer, through the calls that read them.
func TestClientFixtureAnswers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		fixture string
		code    int
		total   uint64
		gauges  int
	}{
		{"stats_active_idle.txt", 200, 0, 0}, // only the admin listener's own gauge
		{"stats_empty.txt", 200, 0, 0},       // a stats_matcher that keeps no gauge
		{"stats_active_usedonly.txt", 200, 15, 5},
		{"answer_400_format.txt", 400, 0, 0},
		{"answer_400_regex.txt", 400, 0, 0},
		{"answer_400_type.txt", 400, 0, 0},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			body := string(fixture(t, tc.fixture))
			fa := newFixtureAdmin(t, "")
			fa.setAnswer(fixed(tc.code, body))
			ac, err := fast(fa.addr()).ActiveDownstream(ctx)
			if tc.code != 200 {
				var se *envoy.StatusError
				if !errors.As(err, &se) || se.Code != tc.code || se.Body != body {
					t.Errorf("err = %v, want a %d with the fixture's body", err, tc.code)
				}
				return
			}
			if err != nil || ac.Total != tc.total || ac.Gauges != tc.gauges {
				t.Errorf("%+v %v, want %d over %d gauges", ac, err, tc.total, tc.gauges)
			}
		})
	}
}
