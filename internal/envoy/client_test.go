package envoy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
)

// recorded is an admin API that answers with recorded Envoy bodies. /stats
// applies filter (RE2, partial match) to the recorded lines, as Envoy does.
type recorded struct {
	t        *testing.T
	srv      *httptest.Server
	mu       sync.Mutex
	stats    []byte // /stats text body (filtered line by line)
	statsRaw []byte // when set, /stats answers this verbatim
	json     []byte // /stats?format=json
	hits     atomic.Int32
	queries  []string
	methods  []string
	// answer, when set, answers every request.
	answer func(n int32, w http.ResponseWriter, r *http.Request)
	hang   chan struct{}
}

func newRecorded(t *testing.T) *recorded {
	rec := &recorded{t: t, hang: make(chan struct{})}
	rec.srv = httptest.NewServer(http.HandlerFunc(rec.serve))
	t.Cleanup(func() {
		close(rec.hang)
		rec.srv.Close()
	})
	return rec
}

func (rec *recorded) addr() string { return strings.TrimPrefix(rec.srv.URL, "http://") }

func (rec *recorded) serve(w http.ResponseWriter, r *http.Request) {
	n := rec.hits.Add(1)
	rec.mu.Lock()
	rec.queries = append(rec.queries, r.URL.RawQuery)
	rec.methods = append(rec.methods, r.Method+" "+r.URL.Path)
	answer := rec.answer
	rec.mu.Unlock()
	if answer != nil {
		answer(n, w, r)
		return
	}
	switch r.URL.Path {
	case "/stats":
		if rec.statsRaw != nil {
			w.Write(rec.statsRaw)
			return
		}
		q := r.URL.Query()
		if q.Get("format") == "json" {
			w.Write(rec.json)
			return
		}
		var re *regexp.Regexp
		if f := q.Get("filter"); f != "" {
			var err error
			if re, err = regexp.Compile(f); err != nil {
				w.WriteHeader(400)
				w.Write(fixture(rec.t, "answer_400_regex.txt"))
				return
			}
		}
		sc := bufio.NewScanner(bytes.NewReader(rec.stats))
		for sc.Scan() {
			line := sc.Text()
			name, _, _ := strings.Cut(line, ": ")
			if re == nil || re.MatchString(name) {
				w.Write([]byte(line + "\n"))
			}
		}
	case "/server_info":
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixture(rec.t, "server_info.json"))
	case "/ready":
		w.Write([]byte("LIVE\n"))
	case "/drain_listeners", "/healthcheck/fail", "/healthcheck/ok", "/quitquitquit":
		if r.Method != "POST" {
			w.WriteHeader(405)
			w.Write(fixture(rec.t, "answer_405.txt"))
			return
		}
		w.Write([]byte("OK\n"))
	default:
		w.WriteHeader(404)
		w.Write(fixture(rec.t, "answer_404.txt"))
	}
}

func (rec *recorded) setAnswer(f func(n int32, w http.ResponseWriter, r *http.Request)) {
	rec.mu.Lock()
	rec.answer = f
	rec.mu.Unlock()
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

func TestClientRecorded(t *testing.T) {
	ctx := context.Background()
	rec := newRecorded(t)
	rec.stats = fixture(t, "stats_sidecar.txt")
	rec.json = fixture(t, "stats_sidecar.json")
	c := fast(rec.addr())

	t.Run("active downstream", func(t *testing.T) {
		ac, err := c.ActiveDownstream(ctx, envoy.DefaultExclude())
		if err != nil {
			t.Fatal(err)
		}
		if ac.Total != 15 || len(ac.Listeners) != 5 || len(ac.Excluded) != 5 {
			t.Errorf("got %+v; want 15 over 5 listeners, 5 excluded", ac)
		}
	})
	t.Run("active downstream query", func(t *testing.T) {
		rec.mu.Lock()
		q := rec.queries[len(rec.queries)-1]
		rec.mu.Unlock()
		if want := `usedonly&filter=%5Elistener%5C..%2Adownstream_cx_active%24`; q != want {
			t.Errorf("query %q, want %q", q, want)
		}
	})
	t.Run("json", func(t *testing.T) {
		stats, err := c.Stats(ctx, envoy.StatsQuery{Format: "json"})
		if err != nil || len(stats) != 40 {
			t.Fatalf("%d stats, %v", len(stats), err)
		}
	})
	t.Run("unknown format refused locally", func(t *testing.T) {
		before := rec.hits.Load()
		if _, err := c.Stats(ctx, envoy.StatsQuery{Format: "prometheus"}); err == nil {
			t.Error("no error")
		}
		if rec.hits.Load() != before {
			t.Error("request sent")
		}
	})
	t.Run("server state", func(t *testing.T) {
		s, err := c.ServerState(ctx)
		if err != nil || s != envoy.StateLive {
			t.Errorf("got %v, %v", s, err)
		}
	})
	t.Run("workers started", func(t *testing.T) {
		ok, err := c.WorkersStarted(ctx)
		if err != nil || !ok {
			t.Errorf("got %v, %v", ok, err)
		}
	})
	t.Run("stat absent", func(t *testing.T) {
		_, err := c.Stat(ctx, "listener_manager.nope")
		if !errors.Is(err, envoy.ErrStatAbsent) || errors.Is(err, envoy.ErrUnreachable) {
			t.Errorf("err = %v, want ErrStatAbsent only", err)
		}
	})
	t.Run("stat name is quoted", func(t *testing.T) {
		// "listener.0.0.0.0_15006" unquoted would match "listener.0x0.0..."; the
		// dots must be literal and the match exact.
		v, err := c.Stat(ctx, "listener.0.0.0.0_15006.downstream_cx_active")
		if err != nil || v != 4 {
			t.Errorf("got %d, %v", v, err)
		}
	})
	t.Run("bad regex", func(t *testing.T) {
		before := rec.hits.Load()
		_, err := c.Stats(ctx, envoy.StatsQuery{Filter: "("})
		var se *envoy.StatusError
		if !errors.As(err, &se) || se.Code != 400 || se.Body != "Invalid re2 regex" {
			t.Errorf("err = %v, want a 400 StatusError", err)
		}
		if n := rec.hits.Load() - before; n != 1 {
			t.Errorf("%d requests, want 1: a 4xx is not retried", n)
		}
	})
	t.Run("server info", func(t *testing.T) {
		si, err := c.ServerInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := envoy.ServerInfo{
			Version:            "6a3d9a8d5e6f0b4c1a2b3c4d5e6f708192a3b4c5/1.30.2/Clean/RELEASE/BoringSSL",
			State:              "LIVE",
			Uptime:             3127 * time.Second,
			Concurrency:        2,
			DrainTime:          45 * time.Second,
			DrainStrategy:      "Immediate",
			ParentShutdownTime: 60 * time.Second,
		}
		if si != want {
			t.Errorf("got %+v\nwant %+v", si, want)
		}
	})
	t.Run("drain query and method", func(t *testing.T) {
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
			rec.mu.Lock()
			q, m := rec.queries[len(rec.queries)-1], rec.methods[len(rec.methods)-1]
			rec.mu.Unlock()
			if q != tc.want || m != "POST /drain_listeners" {
				t.Errorf("%+v: sent %s ?%s, want POST ?%s", tc.o, m, q, tc.want)
			}
		}
	})
	t.Run("post endpoints", func(t *testing.T) {
		for _, f := range []func(context.Context) error{c.HealthcheckFail, c.HealthcheckOK, c.QuitQuitQuit} {
			if err := f(ctx); err != nil {
				t.Error(err)
			}
		}
	})
}

func TestClientAnswers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		answer   func(int32, http.ResponseWriter, *http.Request)
		call     func(*envoy.Client) error
		code     int    // want a StatusError with this code
		body     string // and this body
		is       error  // or an error matching this
		attempts int32
	}{
		{
			name:   "405 on a GET to a mutating endpoint",
			answer: fixed(405, "Method GET not allowed, POST required."),
			call:   func(c *envoy.Client) error { return c.HealthcheckFail(ctx) },
			code:   405, body: "Method GET not allowed, POST required.", attempts: 1,
		},
		{
			name:   "404",
			answer: fixed(404, "invalid path. admin commands are:\n"),
			call:   func(c *envoy.Client) error { _, err := c.ServerInfo(ctx); return err },
			code:   404, body: "invalid path. admin commands are:\n", attempts: 1,
		},
		{
			name:   "400 bad format",
			answer: fixed(400, "usage: /stats?format=(html|active-html|json|prometheus|text)\n\n"),
			call:   func(c *envoy.Client) error { _, err := c.Stats(ctx, envoy.StatsQuery{}); return err },
			code:   400, body: "usage: /stats?format=(html|active-html|json|prometheus|text)\n\n", attempts: 1,
		},
		{
			name:   "500 retried then given up",
			answer: fixed(500, "boom"),
			call:   func(c *envoy.Client) error { _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); return err },
			code:   500, body: "boom", attempts: 3,
		},
		{
			name: "503 then 200",
			answer: func(n int32, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.WriteHeader(503)
					return
				}
				w.Write([]byte("listener.admin.downstream_cx_active: 1\nlistener.127.0.0.1_8080.downstream_cx_active: 2\n"))
			},
			call: func(c *envoy.Client) error {
				ac, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{})
				if err == nil && ac.Total != 2 {
					return errors.New("wrong total")
				}
				return err
			},
			attempts: 2,
		},
		{
			name:     "garbage stats",
			answer:   func(_ int32, w http.ResponseWriter, _ *http.Request) { w.Write(fixture(t, "garbage.bin")) },
			call:     func(c *envoy.Client) error { _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); return err },
			is:       envoy.ErrMalformed,
			attempts: 1,
		},
		{
			name:     "empty stats",
			answer:   fixed(200, ""),
			call:     func(c *envoy.Client) error { _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); return err },
			is:       envoy.ErrMalformed,
			attempts: 1,
		},
		{
			name:     "idle: only the admin listener's own gauge",
			answer:   func(_ int32, w http.ResponseWriter, _ *http.Request) { w.Write(fixture(t, "stats_active_idle.txt")) },
			call:     func(c *envoy.Client) error { _, err := c.ActiveDownstream(ctx, envoy.ExcludeSet{}); return err },
			attempts: 1,
		},
		{
			name:     "garbage ready",
			answer:   func(_ int32, w http.ResponseWriter, _ *http.Request) { w.Write(fixture(t, "garbage.bin")) },
			call:     func(c *envoy.Client) error { _, _, err := c.Ready(ctx); return err },
			is:       envoy.ErrMalformed,
			attempts: 1,
		},
		{
			name:     "garbage server_info",
			answer:   func(_ int32, w http.ResponseWriter, _ *http.Request) { w.Write(fixture(t, "garbage.bin")) },
			call:     func(c *envoy.Client) error { _, err := c.ServerInfo(ctx); return err },
			is:       envoy.ErrMalformed,
			attempts: 1,
		},
		{
			name: "reset before the answer is retried for a GET",
			answer: func(n int32, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					resetConn(w)
					return
				}
				w.Write([]byte("LIVE\n"))
			},
			call:     func(c *envoy.Client) error { _, _, err := c.Ready(ctx); return err },
			attempts: 2,
		},
		{
			name:     "reset before the answer is not retried for quitquitquit",
			answer:   func(_ int32, w http.ResponseWriter, _ *http.Request) { resetConn(w) },
			call:     func(c *envoy.Client) error { return c.QuitQuitQuit(ctx) },
			is:       envoy.ErrUnreachable,
			attempts: 1,
		},
		{
			name: "body over the limit",
			answer: func(_ int32, w http.ResponseWriter, _ *http.Request) {
				w.Write(bytes.Repeat([]byte("a: 1\n"), 1000))
			},
			call:     func(c *envoy.Client) error { _, err := c.Stats(ctx, envoy.StatsQuery{}); return err },
			is:       errAny,
			attempts: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorded(t)
			rec.setAnswer(tc.answer)
			err := tc.call(fast(rec.addr(), envoy.WithMaxBody(4096)))
			switch {
			case tc.code != 0:
				var se *envoy.StatusError
				if !errors.As(err, &se) || se.Code != tc.code || se.Body != tc.body {
					t.Errorf("err = %v, want status %d %q", err, tc.code, tc.body)
				}
				if errors.Is(err, envoy.ErrUnreachable) {
					t.Errorf("a status error is not ErrUnreachable")
				}
			case tc.is == errAny:
				if err == nil {
					t.Error("no error")
				}
			case tc.is != nil:
				if !errors.Is(err, tc.is) {
					t.Errorf("err = %v, want %v", err, tc.is)
				}
			default:
				if err != nil {
					t.Error(err)
				}
			}
			if n := rec.hits.Load(); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
		})
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

func TestClientReady(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		code  int
		body  string
		state string
		ready bool
		err   bool
	}{
		{200, "LIVE\n", "LIVE", true, false},
		{503, "DRAINING\n", "DRAINING", false, false},
		{503, "PRE_INITIALIZING\n", "PRE_INITIALIZING", false, false},
		{503, "INITIALIZING\n", "INITIALIZING", false, false},
		{503, "", "", false, true},
		{500, "x", "", false, true},
		{404, "invalid path. ", "", false, true},
	} {
		rec := newRecorded(t)
		rec.setAnswer(fixed(tc.code, tc.body))
		state, ready, err := fast(rec.addr(), envoy.WithRetries(0)).Ready(ctx)
		if state != tc.state || ready != tc.ready || (err != nil) != tc.err {
			t.Errorf("%d %q: got %q, %t, %v", tc.code, tc.body, state, ready, err)
		}
		if n := rec.hits.Load(); n != 1 {
			t.Errorf("%d %q: %d requests, a 503 from /ready is an answer", tc.code, tc.body, n)
		}
	}
}

func TestClientHangs(t *testing.T) {
	rec := newRecorded(t)
	rec.setAnswer(func(_ int32, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-rec.hang:
		}
	})
	c := envoy.New(rec.addr(), envoy.WithTimeout(200*time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, err := c.ActiveDownstream(context.Background(), envoy.ExcludeSet{})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, envoy.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrUnreachable and DeadlineExceeded", err)
		}
		var ue *envoy.UnreachableError
		if !errors.As(err, &ue) || ue.Path != "/stats" {
			t.Errorf("err = %#v, want an UnreachableError for /stats", err)
		}
		if n := rec.hits.Load(); n != 1 {
			t.Errorf("%d attempts: a timeout is not retried", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the call did not return by its timeout")
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
	_, err = c.ServerState(context.Background())
	if !errors.Is(err, envoy.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("err = %v, want ErrUnreachable and ECONNREFUSED", err)
	}
	if errors.Is(err, envoy.ErrStatAbsent) {
		t.Error("unreachable is not absent")
	}

	// The caller's own cancellation is not Envoy's unreachability.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.ServerState(ctx)
	if !errors.Is(err, context.Canceled) || errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("canceled: err = %v, want context.Canceled and not ErrUnreachable", err)
	}
}

func TestClientRetriesWithinTimeout(t *testing.T) {
	rec := newRecorded(t)
	rec.setAnswer(fixed(503, "no"))
	// Many retries, long backoff, short timeout: the timeout wins.
	c := envoy.New(rec.addr(), envoy.WithRetries(100), envoy.WithBackoff(50*time.Millisecond), envoy.WithTimeout(300*time.Millisecond))
	start := time.Now()
	_, err := c.Stats(context.Background(), envoy.StatsQuery{})
	var se *envoy.StatusError
	if !errors.As(err, &se) || se.Code != 503 {
		t.Errorf("err = %v, want the last 503", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v, far past the 300ms timeout", d)
	}
	if n := rec.hits.Load(); n < 2 || n > 100 {
		t.Errorf("%d attempts", n)
	}
}

func TestClientCanceledDuringBackoff(t *testing.T) {
	rec := newRecorded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec.setAnswer(func(_ int32, w http.ResponseWriter, _ *http.Request) {
		cancel() // the caller gives up while the client backs off
		w.WriteHeader(503)
	})
	c := envoy.New(rec.addr(), envoy.WithRetries(5), envoy.WithBackoff(time.Second), envoy.WithTimeout(10*time.Second))
	_, err := c.Stats(ctx, envoy.StatsQuery{})
	if !errors.Is(err, context.Canceled) || errors.Is(err, envoy.ErrUnreachable) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if n := rec.hits.Load(); n != 1 {
		t.Errorf("%d attempts after the cancel", n)
	}
}
