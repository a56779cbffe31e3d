package envoysim

import (
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
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
	scope   string   // listener.<scope>. in stats

	// guarded by s.mu
	ln      net.Listener // once listening
	stopped bool         // listen socket closed (or never to open)

	rr atomic.Uint64 // round-robin worker assignment

	cxActive, cxTotal, cxDestroy *metric
	workers                      []workerStats // from LIVE on
	workersOnce                  sync.Once
	filter                       filterStats

	httpSrv   *http.Server
	transport *http.Transport
}

type workerStats struct{ active, total *metric }

// filterStats are the network filter's: http.<prefix>. or tcp.<prefix>.
type filterStats struct {
	cxActive, cxTotal, cxDestroy, http1Active, http1Total *metric
	drainClose, rqActive, rqTotal, rqHTTP1, rqCompleted   *metric
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
	sock, err := bindSocket(ap)
	if err != nil {
		return nil, err
	}
	l := &listener{s: s, cfg: lc, inbound: lc.Direction == "inbound", sock: sock}
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
		f.drainClose = c(h + "downstream_cx_drain_close")
		f.rqActive, f.rqTotal, f.rqHTTP1 = g(h+"downstream_rq_active"), c(h+"downstream_rq_total"), c(h+"downstream_rq_http1_total")
		f.rqCompleted = c(h + "downstream_rq_completed")
		for i := 1; i <= 5; i++ {
			f.rqClass[i] = c(h + "downstream_rq_" + string(rune('0'+i)) + "xx")
		}
		l.transport = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     time.Hour,
			DisableCompression:  true,
		}
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(&url.URL{Scheme: "http", Host: lc.Upstream})
				pr.Out.Host = pr.In.Host // Envoy keeps the authority
				pr.Out.Header.Set("X-Forwarded-Proto", "http")
			},
			Transport: l.transport,
			ModifyResponse: func(r *http.Response) error {
				r.Header.Set("Server", "envoy")
				return nil
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() != nil {
					return // the downstream is gone
				}
				f.upstreamFail.inc()
				w.Header().Set("Content-Type", "text/plain")
				w.Header().Set("Server", "envoy")
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "upstream connect error or disconnect/reset before headers. reset reason: connection failure")
			},
			ErrorLog: log.New(io.Discard, "", 0),
		}
		l.httpSrv = &http.Server{
			Handler:        l.handler(rp),
			ErrorLog:       log.New(io.Discard, "", 0),
			MaxHeaderBytes: 60 << 10,  // Envoy's max_request_headers_kb
			IdleTimeout:    time.Hour, // the HTTP connection manager's default idle_timeout
		}
	} else {
		t := "tcp." + lc.FilterStatPrefix + "."
		f.cxTotal = c(t + "downstream_cx_total")
	}
	f.upstreamFail = c("cluster." + lc.Name + ".upstream_cx_connect_fail")
	return l, nil
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
	if l.httpSrv != nil {
		l.httpSrv.Serve(acc)
		return
	}
	for {
		c, err := acc.Accept()
		if err != nil {
			return
		}
		tc := c.(*conn)
		if !l.s.goTracked(func() { l.proxyTCP(tc) }) {
			tc.reset()
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

// shutdown ends the HTTP server and the upstream pool at stop.
func (l *listener) shutdown() {
	if l.httpSrv != nil {
		l.httpSrv.Close()
	}
	if l.transport != nil {
		l.transport.CloseIdleConnections()
	}
}

// drainClose is Envoy's DrainDecision::drainClose for this listener: should
// this response close its connection?
func (l *listener) drainClose() bool {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hcFailed && l.cfg.DrainType == "default" {
		return true
	}
	d := s.drain
	if d == nil || !d.all && !l.inbound {
		return false
	}
	if s.cfg.DrainStrategy == "immediate" || d.done {
		return true
	}
	elapsed := time.Since(d.start)
	if elapsed >= s.cfg.DrainTime {
		return true
	}
	return rand.Float64() < float64(elapsed)/float64(s.cfg.DrainTime)
}

// handler wraps the reverse proxy with the HTTP connection manager's part:
// stats and the drain's Connection: close.
func (l *listener) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.s.enter() {
			panic(http.ErrAbortHandler) // stopping: drop the connection, no answer
		}
		defer l.s.leave()
		f := &l.filter
		f.rqTotal.inc()
		f.rqHTTP1.inc()
		f.rqActive.inc()
		dw := &drainWriter{ResponseWriter: w, l: l}
		defer func() {
			f.rqActive.dec()
			f.rqCompleted.inc()
			if c := dw.code / 100; c >= 1 && c <= 5 {
				f.rqClass[c].inc()
			}
		}()
		next.ServeHTTP(dw, r)
	})
}

// drainWriter decides, when the response's headers go out, whether the
// connection closes after it, as Envoy's HTTP/1.1 codec does while
// draining.
type drainWriter struct {
	http.ResponseWriter
	l    *listener
	code int
}

func (w *drainWriter) WriteHeader(code int) {
	if code >= 200 && w.code == 0 {
		w.code = code
		if w.l.drainClose() {
			w.Header().Set("Connection", "close")
			w.l.filter.drainClose.inc()
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

// proxyTCP pipes bytes between the downstream and the upstream, passing
// half-closes on, as tcp_proxy does.
func (l *listener) proxyTCP(down *conn) {
	defer down.Close()
	d := net.Dialer{Timeout: 5 * time.Second} // a cluster's default connect_timeout
	upc, err := d.DialContext(l.s.ctx, "tcp", l.cfg.Upstream)
	if err != nil {
		l.filter.upstreamFail.inc()
		return
	}
	up := upc.(*net.TCPConn)
	defer up.Close()
	errc := make(chan error, 1)
	if !l.s.goTracked(func() { errc <- pipe(up, down, down.Conn.(*net.TCPConn)) }) {
		down.reset()
		return
	}
	pipe(down.Conn.(*net.TCPConn), up, up)
	<-errc
}

// pipe copies src to dst and half-closes dst at src's end; on an error it
// closes both sides so the other direction ends too.
func pipe(dst *net.TCPConn, src io.Reader, srcConn *net.TCPConn) error {
	_, err := io.Copy(dst, src)
	if err == nil {
		return dst.CloseWrite()
	}
	dst.SetLinger(0)
	dst.Close()
	srcConn.SetLinger(0)
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
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// reset closes with SO_LINGER 0: the peer gets a RST.
func (c *conn) reset() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (c *conn) release() {
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
	if l.httpSrv != nil {
		l.filter.cxActive.dec()
		l.filter.http1Active.dec()
		l.filter.cxDestroy.inc()
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
	c := &conn{Conn: nc, l: l, s: l.s, worker: w}
	l.cxActive.inc()
	l.cxTotal.inc()
	l.workers[w].active.inc()
	l.workers[w].total.inc()
	l.filter.cxTotal.inc()
	if l.httpSrv != nil {
		l.filter.cxActive.inc()
		l.filter.http1Active.inc()
		l.filter.http1Total.inc()
	}
	l.s.totalConns.Add(1)
	if !l.s.register(c) {
		c.reset()
		return nil
	}
	return c
}

// trackAdmin counts a new admin connection.
func (s *Sim) trackAdmin(nc net.Conn) *conn {
	c := &conn{Conn: nc, s: s}
	s.admin.cxActive.inc()
	s.admin.cxTotal.inc()
	s.admin.mainActive.inc()
	s.admin.mainTotal.inc()
	s.admin.httpCxActive.inc()
	s.admin.httpCxTotal.inc()
	if !s.register(c) {
		c.reset()
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
