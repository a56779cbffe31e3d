package envoysim

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// listener is one proxy listener.
type listener struct {
	s       *Sim
	cfg     ListenerConfig
	inbound bool
	sock    *boundSocket
	addr    net.Addr // bound address
	port    uint16   // bound port
	scope   string   // listener.<scope>. in stats
	// def is the listener's own upstream (Envoy's default_filter_chain),
	// chains its filter chains by destination port (nil: none).
	def    filterChain
	chains map[uint16]*filterChain

	// guarded by s.mu
	ln      net.Listener // once listening
	stopped bool         // listen socket closed (or never to open)
	// drainStart is when the listener was told of a drain (zero: never):
	// the start of its connections' drain timeline.
	drainStart time.Time

	rr atomic.Uint64 // round-robin worker assignment

	cxActive, cxTotal, cxDestroy *metric
	workers                      []workerStats // from LIVE on
	workersOnce                  sync.Once
	filter                       filterStats

	handler http.Handler // HTTP listeners: the connection manager and router
	// the upstream pools, HTTP/1.1 and h2c (HTTP listeners)
	h1, h2c *http.Transport
}

// filterChain is where a filter chain's connections or requests go.
type filterChain struct {
	upstream string // as ListenerConfig.Upstream
	kind     upstreamKind
	h2c      bool // HTTP: requests go upstream over h2c
}

func newFilterChain(upstream, protocol string) (*filterChain, error) {
	kind, err := parseUpstream(upstream)
	if err != nil {
		return nil, err
	}
	return &filterChain{upstream: upstream, kind: kind, h2c: protocol == "h2c"}, nil
}

type workerStats struct{ active, total *metric }

// filterStats are the network filter's: http.<prefix>. or tcp.<prefix>.
type filterStats struct {
	cxActive, cxTotal, cxDestroy, http1Active, http1Total *metric
	http2Active, http2Total                               *metric
	drainClose, rqActive, rqTotal, rqHTTP1, rqHTTP2       *metric
	rqCompleted                                           *metric
	rqClass                                               [6]*metric // 1xx..5xx
	upstreamFail                                          *metric
}

// statAddr is Envoy's stat form of an address: ':' becomes '_', so
// 127.0.0.1:15001 is 127.0.0.1_15001 and [::]:15001 is [__]_15001.
func statAddr(a string) string { return strings.ReplaceAll(a, ":", "_") }

func (s *Sim) newListener(lc ListenerConfig) (*listener, error) {
	ap, err := parseHostPort(lc.Address)
	if err != nil {
		return nil, err
	}
	def, err := newFilterChain(lc.Upstream, lc.UpstreamProtocol)
	if err != nil {
		return nil, err
	}
	var chains map[uint16]*filterChain
	for _, fc := range lc.FilterChains {
		c, err := newFilterChain(fc.Upstream, fc.UpstreamProtocol)
		if err != nil {
			return nil, err
		}
		if chains == nil {
			chains = map[uint16]*filterChain{}
		}
		chains[fc.DestinationPort] = c
	}
	sock, err := bindSocket(ap, lc.Transparent)
	if err != nil {
		return nil, err
	}
	l := &listener{s: s, cfg: lc, inbound: lc.Direction == "inbound", sock: sock, port: sock.addr.Port(), def: *def, chains: chains}
	l.addr = net.TCPAddrFromAddrPort(sock.addr)
	// Envoy names the listener by its configured address; a port-0
	// listener is named by its bound port here so that several coexist.
	l.scope = lc.StatPrefix
	if l.scope == "" {
		l.scope = statAddr(l.addr.String())
	}
	g, c := s.st.gauge, s.st.counter
	p := "listener." + l.scope + "."
	l.cxActive, l.cxTotal, l.cxDestroy = g(p+"downstream_cx_active"), c(p+"downstream_cx_total"), c(p+"downstream_cx_destroy")
	f := &l.filter
	if lc.Protocol == "http" {
		h := "http." + lc.FilterStatPrefix + "."
		f.cxActive, f.cxTotal, f.cxDestroy = g(h+"downstream_cx_active"), c(h+"downstream_cx_total"), c(h+"downstream_cx_destroy")
		f.http1Active, f.http1Total = g(h+"downstream_cx_http1_active"), c(h+"downstream_cx_http1_total")
		f.http2Active, f.http2Total = g(h+"downstream_cx_http2_active"), c(h+"downstream_cx_http2_total")
		f.drainClose = c(h + "downstream_cx_drain_close")
		f.rqActive, f.rqTotal = g(h+"downstream_rq_active"), c(h+"downstream_rq_total")
		f.rqHTTP1, f.rqHTTP2 = c(h+"downstream_rq_http1_total"), c(h+"downstream_rq_http2_total")
		f.rqCompleted = c(h + "downstream_rq_completed")
		for i := 1; i <= 5; i++ {
			f.rqClass[i] = c(h + "downstream_rq_" + string(rune('0'+i)) + "xx")
		}
		l.newHTTP()
	} else {
		t := "tcp." + lc.FilterStatPrefix + "."
		f.cxTotal = c(t + "downstream_cx_total")
	}
	f.upstreamFail = c("cluster." + lc.Name + ".upstream_cx_connect_fail")
	return l, nil
}

// upstreamKey carries a request's upstream in its context.
type upstreamKey struct{}

// upstreamRoute is a request's upstream: its address and protocol.
type upstreamRoute struct {
	addr string
	h2c  bool
}

// newTransport is an upstream pool: HTTP/1.1, or h2c (HTTP/2 cleartext
// with prior knowledge, a cluster with http2_protocol_options).
func newTransport(h2c bool) *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second} // a cluster's default connect_timeout
	t := &http.Transport{
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     time.Hour,
		DisableCompression:  true,
	}
	if h2c {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		t.Protocols = p
		t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr) // never TLS here
		}
		t.TLSClientConfig = &tls.Config{}
	}
	return t
}

// roundTripper sends each request through the pool of its route's protocol.
type roundTripper struct{ h1, h2c *http.Transport }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if route, _ := r.Context().Value(upstreamKey{}).(upstreamRoute); route.h2c {
		return rt.h2c.RoundTrip(r)
	}
	return rt.h1.RoundTrip(r)
}

// newHTTP builds the HTTP connection manager and router of an HTTP listener.
func (l *listener) newHTTP() {
	l.h1, l.h2c = newTransport(false), newTransport(true)
	f := &l.filter
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			route, _ := pr.In.Context().Value(upstreamKey{}).(upstreamRoute)
			pr.SetURL(&url.URL{Scheme: "http", Host: route.addr})
			pr.Out.Host = pr.In.Host // Envoy keeps the authority
			pr.Out.Header.Set("X-Forwarded-Proto", "http")
		},
		Transport: roundTripper{l.h1, l.h2c},
		ModifyResponse: func(r *http.Response) error {
			r.Header.Set("Server", "envoy")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the downstream is gone
			}
			f.upstreamFail.inc()
			l.upstreamFailure(w)
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	l.handler = l.connectionManager(rp)
}

// upstreamFailure is Envoy's local reply when no upstream connection could
// be made.
func (l *listener) upstreamFailure(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Server", "envoy")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, "upstream connect error or disconnect/reset before headers. reset reason: connection failure")
}

func (l *listener) initWorkerStats() {
	l.workersOnce.Do(func() {
		p := "listener." + l.scope + ".worker_"
		for i := range l.s.cfg.Concurrency {
			n := p + strconv.Itoa(i) + "."
			l.workers = append(l.workers, workerStats{l.s.st.gauge(n + "downstream_cx_active"), l.s.st.counter(n + "downstream_cx_total")})
		}
	})
}

// serve accepts connections until the listen socket closes.
func (l *listener) serve(ln net.Listener) {
	acc := &acceptor{ln: ln, track: l.track}
	for {
		c, err := acc.Accept()
		if err != nil {
			return
		}
		tc := c.(*conn)
		run := func() { l.proxyTCP(tc) }
		if l.handler != nil {
			run = func() { l.serveHTTP(tc) }
		}
		if !l.s.goTracked(run) {
			tc.Close()
		}
	}
}

// stopLocked closes the listen socket; connections stay. s.mu is held.
func (l *listener) stopLocked() bool {
	if l.stopped {
		return false
	}
	l.stopped = true
	l.sock.close()
	if l.ln != nil {
		l.ln.Close()
	}
	return true
}

// shutdown ends the upstream pools at stop.
func (l *listener) shutdown() {
	for _, t := range []*http.Transport{l.h1, l.h2c} {
		if t != nil {
			t.CloseIdleConnections()
		}
	}
}

// filterChain is c's filter chain, as Envoy's
// FilterChainManagerImpl::findFilterChain picks it with destination_port
// matches only (source/common/listener_manager/filter_chain_manager_impl.cc):
// the chain of the connection's destination port, else the default filter
// chain (here the listener's own upstream). Envoy matches the socket's
// local address, which the original_dst listener filter (Istio's
// virtualInbound has it) has set to the original destination: as
// [conn.originalDst].
func (l *listener) filterChain(c *conn) *filterChain {
	if l.chains != nil {
		if fc, ok := l.chains[c.originalDst().Port()]; ok {
			return fc
		}
	}
	return &l.def
}

// upstream is where c's connection or requests go, and over which
// protocol (HTTP listeners).
func (l *listener) upstream(c *conn) (upstreamRoute, error) {
	fc := l.filterChain(c)
	route := upstreamRoute{addr: fc.upstream, h2c: fc.h2c}
	if fc.kind == upstreamFixed {
		return route, nil
	}
	dst := c.originalDst()
	if dst.Port() == l.port {
		return route, fmt.Errorf("original destination %v is the listener itself", dst)
	}
	if fc.kind == upstreamOriginalDst {
		route.addr = dst.String()
		return route, nil
	}
	host, _, _ := net.SplitHostPort(fc.upstream)
	route.addr = net.JoinHostPort(host, strconv.Itoa(int(dst.Port())))
	return route, nil
}

// drainClose is Envoy's decision, when a response is sent, whether it
// closes its connection.
//
// Through 1.39 it is DrainManagerImpl::drainClose, polled: the gradual
// strategy works in whole seconds: it closes when
// drain_time_s - trunc(remaining_s) > rand % drain_time_s, so with
// probability 1/N already in the first second of an N-second drain, k/N in
// the k-th. Below one second of drain time (envoysim only) it is
// continuous: elapsed/drain time.
//
// Since 1.40 it is Network::shouldDrainClose
// (source/common/network/drain_close_util.cc) on the drain event the
// connection was given: immediate closes at once; gradual, in 1.40.0,
// trunc(elapsed_s) > rand % drain_time_s (never in the first second); on
// main after 1.40.0 (the connection-event generation) it ramps over
// ceil(drain time / 2) whole seconds: trunc(elapsed_s) > rand % ramp_s,
// and always once elapsed_s reaches the ramp.
func (l *listener) drainClose() bool {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hcFailed && l.cfg.DrainType == "default" {
		return true
	}
	d := s.drain
	if d == nil || l.drainStart.IsZero() {
		return false
	}
	if s.cfg.DrainStrategy == "immediate" || d.done {
		return true
	}
	if s.cfg.DrainGeneration == Drain140 {
		// Network::shouldDrainClose as 1.40.0 has it: whole seconds since
		// the connection was told, against the whole drain time, so never
		// in the first second (test/integration/drain_close_integration_test.cc,
		// DrainCloseGradualViaConnectionDrain).
		secs := int64(s.cfg.DrainTime / time.Second)
		elapsed := time.Since(l.drainStart)
		if elapsed >= s.cfg.DrainTime {
			return true
		}
		if secs == 0 {
			return rand.Float64() < float64(elapsed)/float64(s.cfg.DrainTime)
		}
		return int64(elapsed/time.Second) > rand.Int64N(secs)
	}
	if s.cfg.DrainGeneration == DrainConnectionEvent {
		ramp := int64((s.cfg.DrainTime/2 + time.Second - 1) / time.Second)
		elapsed := int64(time.Since(l.drainStart) / time.Second)
		if elapsed >= ramp {
			return true
		}
		return elapsed > rand.Int64N(ramp)
	}
	elapsed := time.Since(d.start)
	if elapsed >= s.cfg.DrainTime {
		return true
	}
	if secs := int64(s.cfg.DrainTime / time.Second); secs > 0 {
		remaining := int64((s.cfg.DrainTime - elapsed) / time.Second)
		return secs-remaining > rand.Int64N(secs)
	}
	return rand.Float64() < float64(elapsed)/float64(s.cfg.DrainTime)
}

// proactiveDrainDelay is Network::proactiveDrainDelay with the connection
// manager's arguments: a connection told of a drain that began elapsed ago
// drains itself at a random moment (millisecond jitter) in
// [2/3 drain time, drain time - drain_timeout], counted from the drain's
// start. Zero: no proactive drain, because the window is empty (a drain
// time of 3 drain_timeouts or less) or already open (a connection
// accepted late in the drain).
func proactiveDrainDelay(drainTime, drainTimeout, elapsed time.Duration) time.Duration {
	start := (drainTime * 2 / 3).Truncate(time.Millisecond)
	end := drainTime - drainTimeout
	if start >= end || elapsed >= start {
		return 0
	}
	span := int64((end - start) / time.Millisecond)
	if span <= 0 {
		return 0
	}
	return start + time.Duration(rand.Int64N(span))*time.Millisecond - elapsed
}

// scheduleProactiveLocked arms the connection's proactive drain, for a
// drain its listener was told of at start (connection-event generation,
// HTTP listeners: tcp_proxy does not drain). s.mu is held.
func (c *conn) scheduleProactiveLocked(start time.Time) {
	if c.l == nil || c.l.handler == nil {
		return
	}
	d := proactiveDrainDelay(c.s.cfg.DrainTime, c.l.cfg.DrainTimeout, time.Since(start))
	if d <= 0 {
		return
	}
	s := c.s
	s.goLocked(func() { s.wait(d, c.closed, c.proactiveDrain) })
}

// proactiveDrain is the connection manager draining its connection on its
// own (not with a response): HTTP/2 starts its GOAWAY sequence; HTTP/1.1
// marks the connection draining (its next response carries Connection:
// close) and closes it once drain_timeout has passed and no request is in
// flight, after the delayed close; a connection that never sent a byte
// (no codec yet) is closed. Not while health checks fail.
func (c *conn) proactiveDrain() {
	s := c.s
	s.mu.Lock()
	failed := s.hcFailed
	s.mu.Unlock()
	if failed {
		return
	}
	c.mu.Lock()
	h2, srv := c.h2, c.srv
	c.mu.Unlock()
	switch {
	case srv == nil:
		c.Close()
	case h2:
		c.startDrainSequence()
	default:
		c.startH1Drain(time.Now())
		s.goTracked(func() {
			s.wait(c.l.cfg.DrainTimeout, c.closed, func() {
				c.mu.Lock()
				c.drain = 2 // closing: the last request's end closes
				idle := c.active == 0
				c.mu.Unlock()
				if idle {
					c.lingerClose(time.Now())
				}
			})
		})
	}
}

// startH1Drain marks an HTTP/1.1 connection draining from at (the start of
// its drain_timeout); false if it already was.
func (c *conn) startH1Drain(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drain > 0 {
		return false
	}
	c.drain, c.drainAt = 1, at
	return true
}

// connKey carries the downstream *conn in a request's context.
type connKey struct{}

// connectionManager wraps the router with the HTTP connection manager's
// part: the upstream, stats and the drain's Connection: close or GOAWAY.
func (l *listener) connectionManager(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.s.enter() {
			panic(http.ErrAbortHandler) // stopping: drop the connection, no answer
		}
		defer l.s.leave()
		c, _ := r.Context().Value(connKey{}).(*conn)
		f := &l.filter
		f.rqTotal.inc()
		if r.ProtoMajor == 2 {
			f.rqHTTP2.inc()
		} else {
			f.rqHTTP1.inc()
		}
		f.rqActive.inc()
		c.requestStarted()
		dw := &drainWriter{ResponseWriter: w, l: l, c: c}
		defer func() {
			c.requestDone()
			f.rqActive.dec()
			f.rqCompleted.inc()
			if c := dw.code / 100; c >= 1 && c <= 5 {
				f.rqClass[c].inc()
			}
		}()
		up, err := l.upstream(c)
		if err != nil {
			f.upstreamFail.inc()
			l.upstreamFailure(dw)
			return
		}
		next.ServeHTTP(dw, r.WithContext(context.WithValue(r.Context(), upstreamKey{}, up)))
	})
}

// drainWriter decides, when the response's headers go out, whether the
// connection drains, as Envoy's connection manager does in encodeHeaders:
// an HTTP/1.1 response carries Connection: close and the connection
// closes after it; an HTTP/2 connection starts its drain sequence (a
// GOAWAY before these headers, the final one after drain_timeout).
type drainWriter struct {
	http.ResponseWriter
	l    *listener
	c    *conn
	code int
}

func (w *drainWriter) WriteHeader(code int) {
	if code >= 200 && w.code == 0 {
		w.code = code
		h2 := w.c != nil && w.c.isH2()
		switch {
		case w.c == nil:
		case h2 && w.c.draining():
			// Draining already: no further decision.
		case !h2 && w.c.draining():
			w.Header().Set("Connection", "close") // drained before (proactively)
			w.c.lingerFrom(w.c.drainStarted())
		case w.l.drainClose():
			w.l.filter.drainClose.inc()
			if h2 {
				w.c.startDrainSequence()
			} else {
				now := time.Now()
				w.c.startH1Drain(now)
				w.Header().Set("Connection", "close")
				w.c.lingerFrom(now)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *drainWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *drainWriter) Flush() {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *drainWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// h2Preface is the HTTP/2 client connection preface.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// serveHTTP serves one downstream connection of an HTTP listener, as
// Envoy's codec_type AUTO: HTTP/2 if it starts with the HTTP/2 preface
// (prior knowledge), HTTP/1.1 otherwise. Each connection has a server of
// its own, so that an HTTP/2 connection's final GOAWAY can be sent to it
// alone.
func (l *listener) serveHTTP(c *conn) {
	br := bufio.NewReaderSize(c.Conn, 4096)
	h2 := true
	for i := 1; i <= len(h2Preface); i++ {
		b, err := br.Peek(i)
		if err != nil {
			c.Close() // closed before saying anything
			return
		}
		if b[i-1] != h2Preface[i-1] {
			h2 = false
			break
		}
	}
	f := &l.filter
	p := new(http.Protocols)
	if h2 {
		f.http2Active.inc()
		f.http2Total.inc()
		p.SetUnencryptedHTTP2(true)
	} else {
		f.http1Active.inc()
		f.http1Total.inc()
		p.SetHTTP1(true)
	}
	srv := &http.Server{
		Handler:        l.handler,
		Protocols:      p,
		ErrorLog:       log.New(io.Discard, "", 0),
		MaxHeaderBytes: 60 << 10,  // Envoy's max_request_headers_kb
		IdleTimeout:    time.Hour, // the HTTP connection manager's default idle_timeout
		HTTP2:          &http.HTTP2Config{MaxConcurrentStreams: 1<<31 - 1},
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	ln := &oneConnListener{c: &peekedConn{conn: c, r: br}, done: make(chan struct{})}
	c.setCodec(h2, srv, ln.close)
	srv.Serve(ln)
}

// proxyTCP pipes bytes between the downstream and the upstream, passing
// half-closes on, as tcp_proxy does.
func (l *listener) proxyTCP(down *conn) {
	defer down.Close()
	up, err := l.upstream(down)
	if err != nil {
		l.filter.upstreamFail.inc()
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second} // a cluster's default connect_timeout
	upc, err := d.DialContext(l.s.ctx, "tcp", up.addr)
	if err != nil {
		l.filter.upstreamFail.inc()
		return
	}
	upConn := upc.(*net.TCPConn)
	defer upConn.Close()
	// At exit the upstream side closes too, even with a write to it
	// blocked (an upstream that does not read).
	defer context.AfterFunc(l.s.ctx, func() { upConn.Close() })()
	errc := make(chan error, 1)
	if !l.s.goTracked(func() { errc <- pipe(upConn, down, down.Conn.(*net.TCPConn)) }) {
		return
	}
	pipe(down.Conn.(*net.TCPConn), upConn, upConn)
	<-errc
}

// pipe copies src to dst and half-closes dst at src's end; on an error it
// closes both sides so that the other direction ends too (tcp_proxy
// closes the other side normally: a FIN, not a reset).
func pipe(dst *net.TCPConn, src io.Reader, srcConn *net.TCPConn) error {
	_, err := io.Copy(dst, src)
	if err == nil {
		return dst.CloseWrite()
	}
	dst.Close()
	srcConn.Close()
	return err
}

// conn is a connection the sim counts: a proxied one (l set) or an admin one.
type conn struct {
	net.Conn
	l      *listener // nil: admin
	s      *Sim
	worker int
	once   sync.Once
	closed chan struct{}

	dstOnce sync.Once
	dst     netip.AddrPort

	// HTTP listeners, set once the codec is known.
	mu      sync.Mutex
	h2      bool
	srv     *http.Server
	onClose func()
	drain   int       // 0 not draining, 1 draining (h2: first GOAWAY sent), 2 closing (h2: final GOAWAY)
	drainAt time.Time // h1: when the drain sequence (its drain_timeout) began
	active  int       // requests in flight
	inj     *goawayInjector
	// lingerUntil, when set (an HTTP/1.1 response drain-closed it), makes
	// Close wait for the client to close, until then plus the delayed
	// close: Envoy closes a drain-closed HTTP/1.1 connection only when its
	// drain_timeout has passed (onDrainTimeout), then waits
	// delayed_close_timeout for the peer's FIN (FlushWriteAndDelay).
	lingerUntil time.Time
	lingering   bool
}

func newConn(nc net.Conn, l *listener, s *Sim) *conn {
	return &conn{Conn: nc, l: l, s: s, closed: make(chan struct{})}
}

// Close closes the connection: at once, or, for an HTTP/1.1 connection a
// drain closed, as Envoy does (see lingerUntil). A stopping sim closes at once.
func (c *conn) Close() error {
	c.mu.Lock()
	until, lingering := c.lingerUntil, c.lingering
	c.mu.Unlock()
	if c.s.ctx.Err() == nil && (lingering || !until.IsZero()) {
		if lingering {
			return nil
		}
		c.lingerClose(until)
		return nil
	}
	return c.closeNow()
}

func (c *conn) closeNow() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// lingerClose closes the connection when the client closes it, or at
// max(until, now) + the delayed close timeout. The http.Server is done
// with the connection (or it is idle): reading it here is safe.
func (c *conn) lingerClose(until time.Time) {
	c.mu.Lock()
	if c.lingering {
		c.mu.Unlock()
		return
	}
	c.lingering = true
	c.mu.Unlock()
	deadline := until
	if now := time.Now(); deadline.Before(now) {
		deadline = now
	}
	deadline = deadline.Add(DelayedCloseTimeout)
	s := c.s
	if !s.goTracked(func() {
		c.Conn.SetReadDeadline(deadline)
		stop := context.AfterFunc(s.ctx, func() { c.Conn.SetReadDeadline(time.Now()) })
		io.Copy(io.Discard, c.Conn)
		stop()
		c.closeNow()
	}) {
		c.closeNow()
	}
}

// lingerFrom arms the drain-closed HTTP/1.1 close: drain_timeout after at.
func (c *conn) lingerFrom(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lingerUntil.IsZero() {
		c.lingerUntil = at.Add(c.l.cfg.DrainTimeout)
	}
}

func (c *conn) drainStarted() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drainAt
}

func (c *conn) requestStarted() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.active++
	c.mu.Unlock()
}

// requestDone notes that a request ended: a closing HTTP/1.1 connection
// (drain_timeout passed) closes when its last request ends.
func (c *conn) requestDone() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.active--
	closeNow := c.active == 0 && c.drain == 2 && !c.h2
	c.mu.Unlock()
	if closeNow {
		c.lingerClose(time.Now())
	}
}

// Write goes through the GOAWAY injector on an HTTP/2 connection.
func (c *conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	inj := c.inj
	c.mu.Unlock()
	if inj != nil {
		return inj.write(c.Conn, b)
	}
	return c.Conn.Write(b)
}

// originalDst is the connection's original destination: what
// SO_ORIGINAL_DST reports (an iptables REDIRECT or DNAT rewrote it), else
// the accepted socket's local address (TPROXY keeps it).
func (c *conn) originalDst() netip.AddrPort {
	c.dstOnce.Do(func() { c.dst = originalDst(c.Conn) })
	return c.dst
}

func (c *conn) setCodec(h2 bool, srv *http.Server, onClose func()) {
	c.mu.Lock()
	c.h2, c.srv, c.onClose = h2, srv, onClose
	if h2 {
		c.inj = &goawayInjector{}
	}
	c.mu.Unlock()
	select {
	case <-c.closed:
		onClose()
	default:
	}
}

func (c *conn) isH2() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.h2
}

func (c *conn) draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drain > 0
}

// startDrainSequence is Envoy's for an HTTP/2 connection: a GOAWAY with
// the last stream id 2^31-1 now (a shutdown notice: streams keep coming),
// then after the connection manager's drain_timeout the final GOAWAY with
// the last stream id processed, after which the connection closes once
// its streams are done (Go's server closes it 1 s later, as Envoy's
// delayed close).
func (c *conn) startDrainSequence() {
	c.mu.Lock()
	if c.drain > 0 {
		c.mu.Unlock()
		return
	}
	c.drain = 1
	inj, srv := c.inj, c.srv
	c.mu.Unlock()
	inj.inject(c.Conn, goawayFrame(1<<31-1))
	s := c.s
	s.goTracked(func() {
		s.wait(c.l.cfg.DrainTimeout, c.closed, func() {
			c.mu.Lock()
			c.drain = 2
			c.mu.Unlock()
			srv.Shutdown(s.ctx) // the final GOAWAY, then close when idle
		})
	})
}

// goawayFrame is an HTTP/2 GOAWAY frame with NO_ERROR.
func goawayFrame(lastStreamID uint32) []byte {
	return []byte{0, 0, 8, 0x7, 0, 0, 0, 0, 0, // length 8, type GOAWAY, no flags, stream 0
		byte(lastStreamID >> 24 & 0x7f), byte(lastStreamID >> 16), byte(lastStreamID >> 8), byte(lastStreamID),
		0, 0, 0, 0} // NO_ERROR
}

// goawayInjector follows the frames an HTTP/2 server writes, so that a
// frame of the sim's own (the drain's first GOAWAY) goes out between two
// of them. Go's server knows nothing of it; GOAWAY touches neither the
// header compression state nor flow control.
type goawayInjector struct {
	mu      sync.Mutex
	hdr     [9]byte
	hdrN    int    // bytes of the current frame header seen
	left    int    // payload bytes of the current frame still to come
	pending []byte // frames waiting for a frame boundary
}

func (g *goawayInjector) atBoundary() bool { return g.hdrN == 0 && g.left == 0 }

// inject writes frame at once if the writer is between frames, else with
// the next write, at the next frame boundary.
func (g *goawayInjector) inject(w io.Writer, frame []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.atBoundary() {
		w.Write(frame)
		return
	}
	g.pending = append(g.pending, frame...)
}

func (g *goawayInjector) write(w io.Writer, b []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for len(b) > 0 {
		if g.atBoundary() && len(g.pending) > 0 {
			if _, err := w.Write(g.pending); err != nil {
				return n, err
			}
			g.pending = nil
		}
		var k int
		if g.left == 0 {
			k = min(9-g.hdrN, len(b))
			copy(g.hdr[g.hdrN:], b[:k])
			g.hdrN += k
			if g.hdrN == 9 {
				g.hdrN = 0
				g.left = int(g.hdr[0])<<16 | int(g.hdr[1])<<8 | int(g.hdr[2])
			}
		} else {
			k = min(g.left, len(b))
			g.left -= k
		}
		m, err := w.Write(b[:k])
		n += m
		if err != nil {
			return n, err
		}
		b = b[k:]
	}
	if g.atBoundary() && len(g.pending) > 0 {
		if _, err := w.Write(g.pending); err != nil {
			return n, err
		}
		g.pending = nil
	}
	return n, nil
}

func (c *conn) release() {
	close(c.closed)
	s := c.s
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if c.l == nil {
		s.admin.cxActive.dec()
		s.admin.mainActive.dec()
		s.admin.httpCxActive.dec()
		return
	}
	l := c.l
	l.cxActive.dec()
	l.cxDestroy.inc()
	l.workers[c.worker].active.dec()
	if l.handler != nil {
		l.filter.cxActive.dec()
		l.filter.cxDestroy.inc()
		c.mu.Lock()
		h2, srv, onClose := c.h2, c.srv, c.onClose
		c.mu.Unlock()
		switch {
		case srv == nil: // closed before its codec was known
		case h2:
			l.filter.http2Active.dec()
		default:
			l.filter.http1Active.dec()
		}
		if onClose != nil {
			onClose()
		}
	}
	s.totalConns.Add(-1)
}

// register adds c to the sim's connections; false once closing.
func (s *Sim) register(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// track counts a new proxied connection and gives it a worker.
func (l *listener) track(nc net.Conn) *conn {
	w := int((l.rr.Add(1) - 1) % uint64(len(l.workers)))
	c := newConn(nc, l, l.s)
	c.worker = w
	l.cxActive.inc()
	l.cxTotal.inc()
	l.workers[w].active.inc()
	l.workers[w].total.inc()
	l.filter.cxTotal.inc()
	if l.handler != nil {
		l.filter.cxActive.inc()
	}
	l.s.totalConns.Add(1)
	if !l.s.register(c) {
		c.Close()
		return nil
	}
	// A connection accepted on a listener told of a drain is told too
	// (the active listener replays the drain event).
	s := l.s
	s.mu.Lock()
	if s.cfg.DrainGeneration == DrainConnectionEvent && !l.drainStart.IsZero() {
		c.scheduleProactiveLocked(l.drainStart)
	}
	s.mu.Unlock()
	return c
}

// trackAdmin counts a new admin connection.
func (s *Sim) trackAdmin(nc net.Conn) *conn {
	c := newConn(nc, nil, s)
	s.admin.cxActive.inc()
	s.admin.cxTotal.inc()
	s.admin.mainActive.inc()
	s.admin.mainTotal.inc()
	s.admin.httpCxActive.inc()
	s.admin.httpCxTotal.inc()
	if !s.register(c) {
		c.Close()
		return nil
	}
	return c
}

// acceptor is a net.Listener whose connections are tracked.
type acceptor struct {
	ln    net.Listener
	track func(net.Conn) *conn
}

func (a *acceptor) Accept() (net.Conn, error) {
	for {
		nc, err := a.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return nil, err
		}
		if c := a.track(nc); c != nil {
			return c, nil
		}
	}
}

func (a *acceptor) Close() error   { return a.ln.Close() }
func (a *acceptor) Addr() net.Addr { return a.ln.Addr() }

// peekedConn replays the bytes read to tell the codec apart.
type peekedConn struct {
	*conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// oneConnListener hands one connection to an http.Server, then blocks
// until closed (when the connection closes).
type oneConnListener struct {
	c         net.Conn
	mu        sync.Mutex
	taken     bool
	done      chan struct{}
	closeOnce sync.Once
}

func (o *oneConnListener) Accept() (net.Conn, error) {
	o.mu.Lock()
	if !o.taken {
		o.taken = true
		o.mu.Unlock()
		return o.c, nil
	}
	o.mu.Unlock()
	<-o.done
	return nil, net.ErrClosed
}

func (o *oneConnListener) close()         { o.closeOnce.Do(func() { close(o.done) }) }
func (o *oneConnListener) Close() error   { o.close(); return nil }
func (o *oneConnListener) Addr() net.Addr { return o.c.LocalAddr() }
