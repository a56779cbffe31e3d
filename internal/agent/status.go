package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/privs"
)

// statusServer serves the kubelet's probes, Prometheus, and (to loopback
// callers only) the drain controls and the debug views.
//
// Who reaches it (docs/threat-model.md): the kubelet and Prometheus from
// the node or the pod network, through the pod IP; every container of the
// pod, which shares the network namespace, through loopback too. Loopback
// is the pod: POST /drain, POST /quitquitquit and GET /debug/* answer only
// a connection whose both ends are loopback addresses (127.0.0.0/8, ::1,
// or ::ffff:127.0.0.0/104), never on what Host or X-Forwarded-For say, and
// refuse a loopback request that carries a proxy's headers (a listener of
// Envoy relaying outside traffic to 127.0.0.1:15020).
type statusServer struct {
	b              statusBackend
	srv            *http.Server
	ln             net.Listener
	drainBeginWait time.Duration
	// readyChecks shares one readiness check among concurrent probes.
	readyChecks readyFlight
}

// statusBackend is what the status server reads and drives: the agent (or
// a test's stand-in).
type statusBackend interface {
	readiness(ctx context.Context) (bool, string)
	// draining says, without any call, that the drain has begun (and
	// its phase): a probe that shared a check begun before it is told.
	draining() (string, bool)
	proxyExited() <-chan struct{}
	triggerDrain(cause drain.Cause)
	quit()
	flowsJSON() ([]byte, error)
	podState() PodState
	// watchState is the machine's State and a channel closed when it
	// changes; false before the machine exists.
	watchState() (drain.State, <-chan struct{}, bool)
	metricsHandler() http.Handler
}

// statusLimits bound what one client can hold or send.
type statusLimits struct {
	// ReadHeader, Read and Write bound a request's header, whole request
	// and answer; Idle a kept-alive connection between requests.
	ReadHeader, Read, Write, Idle time.Duration
	// MaxHeaderBytes bounds the request line and header (net/http allows
	// 4 KiB more); MaxBodyBytes a body (no endpoint reads one).
	MaxHeaderBytes int
	MaxBodyBytes   int64
	// MaxConns bounds the connections served at once: one more waits in
	// the kernel's accept queue, not in draind's memory. PerSource bounds
	// those from any one peer address (one more is answered 429 at once
	// and closed): the callers of GET /wait/out-of-rotation are bounded
	// by these, as every caller is.
	MaxConns  int
	PerSource int
	// DrainBeginWait is how long a caller of /wait/out-of-rotation waits
	// for a drain that has not begun (--drain-begin-wait).
	DrainBeginWait time.Duration
}

// StatusReadHeaderTimeout is how long the status server waits for a
// request's header after accepting its connection; then it closes the
// connection unanswered (a slowloris costs a slot that long).
const StatusReadHeaderTimeout = 5 * time.Second

// defaultStatusLimits are the status server's default limits: probes,
// scrapes and hooks send small requests and get their answer within the
// admin call's 1 s timeout; /metrics and /debug/flows at 100k flows write a
// few MB over loopback or the pod network.
var defaultStatusLimits = statusLimits{
	ReadHeader: StatusReadHeaderTimeout,
	Read:       10 * time.Second,
	Write:      10 * time.Second,
	// An idle kept-alive connection closes as soon as a new one that
	// sends nothing does: the kubelet's probes never keep one (its
	// prober disables keep-alive), a scrape every 15 s or more reconnects
	// at no cost, and a neighbour's idle connections held a slot for
	// 60 s each (issue 43).
	Idle:           StatusReadHeaderTimeout,
	MaxHeaderBytes: 8 << 10,
	MaxBodyBytes:   4 << 10,
	// A served connection costs ~30 KB of RSS (its goroutine and
	// net/http's buffers): under 10,000 callers, 512 took an idle draind
	// from 26.5 to 41 MB, 256 to 35 MB (TestRotationWaitAbuse). Probes,
	// scrapes and hooks need a few at a time; the kubelet's preStop is
	// one caller per app container.
	MaxConns: 128,
	// The kubelet needs one connection per app container's preStop wait
	// and per probe at once: 16 from its address serve a pod of a dozen
	// app containers, and leave 112 to the others. A single neighbour
	// can hold 16, not every slot; only eight addresses together can
	// hold them all (a NetworkPolicy on the status port closes that).
	PerSource:      16,
	DrainBeginWait: drain.DefaultDrainBeginWait,
}

func newStatusServer(b statusBackend, ln net.Listener, drainBeginWait time.Duration) *statusServer {
	lim := defaultStatusLimits
	lim.DrainBeginWait = drainBeginWait
	return newStatusServerLimits(b, ln, lim)
}

func newStatusServerLimits(b statusBackend, ln net.Listener, lim statusLimits) *statusServer {
	if lim.MaxConns > 0 {
		ln = newConnLimits(ln, lim.MaxConns, cmp.Or(lim.PerSource, lim.MaxConns))
	}
	s := &statusServer{b: b, ln: ln, drainBeginWait: lim.DrainBeginWait}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz/ready", s.ready)
	mux.HandleFunc("GET /healthz/live", s.live)
	mux.Handle("GET /metrics", b.metricsHandler())
	mux.HandleFunc("GET "+RotationWaitPath, s.waitOutOfRotation)
	mux.HandleFunc("POST /drain", loopbackOnly(s.drain))
	mux.HandleFunc("POST /quitquitquit", loopbackOnly(s.quit))
	mux.HandleFunc("GET /debug/flows", loopbackOnly(s.flows))
	mux.HandleFunc("GET /debug/state", loopbackOnly(s.state))
	mux.HandleFunc("GET /debug/privileges", loopbackOnly(privileges))
	s.srv = &http.Server{
		Handler:           limitBody(mux, lim.MaxBodyBytes),
		ReadHeaderTimeout: lim.ReadHeader,
		ReadTimeout:       lim.Read,
		WriteTimeout:      lim.Write,
		IdleTimeout:       lim.Idle,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
	}
	return s
}

// serve runs until shutdown; it owns no other goroutine.
func (s *statusServer) serve() error {
	if err := s.srv.Serve(s.ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func (s *statusServer) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}

// ready answers 200 only when the proxy is LIVE with workers started, not
// draining, and the app listens on --app-ports. Nothing is cached, but
// probes that arrive while a check runs share its answer (readyFlight):
// a hundred probes at once make one admin call, not a hundred. The drain's
// start is read again after a shared answer, so readiness still fails
// from the drain's first moment. Outside the pod the reason is cut to its
// first part: an admin error can quote Envoy's answer, which only the
// pod's own containers may read.
func (s *statusServer) ready(w http.ResponseWriter, r *http.Request) {
	ok, why := false, ""
	if phase, draining := s.b.draining(); draining {
		why = phase
	} else if ok, why = s.readyChecks.do(r.Context(), s.b.readiness); ok {
		if phase, draining := s.b.draining(); draining {
			ok, why = false, phase
		}
	}
	if !ok {
		if refused, _ := notLoopback(r); refused {
			why, _, _ = strings.Cut(why, ": ")
		}
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ready\n"))
}

func (s *statusServer) live(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.b.proxyExited():
		http.Error(w, "proxy exited", http.StatusServiceUnavailable)
	default:
		w.Write([]byte("live\n"))
	}
}

// RotationWaitPath is the app's preStop hook's endpoint: it returns once
// the pod is out of rotation (docs/kubernetes.md, "The app's preStop").
const RotationWaitPath = "/wait/out-of-rotation"

// waitOutOfRotation answers once the pod has left its Services' rotation
// (the min-drain is over: fixed, or --min-drain auto's rule), for the
// app's preStop hook, which the kubelet calls through the pod IP: so it is
// not loopback-only, and it only reads. It never starts a drain; a call
// before the drain waits --drain-begin-wait for one, then answers that
// none began. Its wait is the machine's: Draining ends by the min-drain,
// its ceiling or the deadline. Each waits on one channel, no polling. The
// callers are bounded by the connections (MaxConns, PerSource), not by a
// count of their own: a refused call is a preStop hook that returns at
// once, and the app stopped while still in rotation; a caller that
// found a connection is answered as every waiter is (issue 43).
func (s *statusServer) waitOutOfRotation(w http.ResponseWriter, r *http.Request) {
	// The wait outlasts the server's WriteTimeout (the min-drain's
	// ceiling is 15 s, the begin wait 10 s): the answer is one line, so
	// no write deadline; the waiters are bounded by the connections.
	http.NewResponseController(w).SetWriteDeadline(time.Time{})
	since := time.Now()
	for {
		st, changed, ok := s.b.watchState()
		if !ok {
			// Start-up: the machine is not built yet (tens of ms).
			st = drain.State{Phase: drain.Starting}
			changed = nil
		}
		v := drain.RotationWait(st, since, time.Now(), s.drainBeginWait)
		if v.Done {
			w.Header().Set("Draind-Outcome", v.Outcome.String())
			w.Write([]byte(v.Outcome.String() + ": " + v.Account + "\n"))
			return
		}
		wake := v.Until
		if !ok {
			wake = time.Now().Add(50 * time.Millisecond)
		}
		var t *time.Timer
		var timer <-chan time.Time
		if !wake.IsZero() {
			t = time.NewTimer(time.Until(wake))
			timer = t.C
		}
		select {
		case <-changed:
		case <-timer:
		case <-r.Context().Done():
		}
		if t != nil {
			t.Stop()
		}
		if r.Context().Err() != nil {
			return // the caller left
		}
	}
}

// drain starts the drain. `draind drain` (a native sidecar's preStop hook)
// says so with ?cause=prestop.
func (s *statusServer) drain(w http.ResponseWriter, r *http.Request) {
	cause := drain.CausePOST
	if r.URL.Query().Get("cause") == "prestop" {
		cause = drain.CausePreStop
	}
	s.b.triggerDrain(cause)
	w.WriteHeader(http.StatusAccepted)
	w.Write([]byte("draining\n"))
}

func (s *statusServer) quit(w http.ResponseWriter, r *http.Request) {
	s.b.quit()
	w.WriteHeader(http.StatusAccepted)
	w.Write([]byte("stopping\n"))
}

func (s *statusServer) flows(w http.ResponseWriter, r *http.Request) {
	b, err := s.b.flowsJSON()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// state is where the drain stands (PodState): what `draind pods` reads
// from the node, over the pod's loopback.
func (s *statusServer) state(w http.ResponseWriter, r *http.Request) {
	b, err := json.Marshal(s.b.podState())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}

// privileges shows what draind holds now, every thread's capability sets
// (grouped: they are all alike once draind changed them), and whether it
// can still load a tracing eBPF program or enter a namespace: after
// start-up both fail with EPERM (docs/threat-model.md).
func privileges(w http.ResponseWriter, r *http.Request) {
	type group struct {
		privs.Sets
		Threads int `json:"threads"`
	}
	var out struct {
		Sets    []group `json:"sets"`
		BPFLoad string  `json:"bpf_load"`
		Setns   string  `json:"setns"`
		Error   string  `json:"error,omitempty"`
	}
	threads, err := privs.Threads(0)
	if err != nil {
		out.Error = err.Error()
	}
	count := map[privs.Sets]int{}
	for _, s := range threads {
		count[s]++
	}
	for s, n := range count {
		out.Sets = append(out.Sets, group{s, n})
	}
	out.BPFLoad, out.Setns = resultString(privs.TryLoadBPF()), resultString(privs.TrySetns())
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func resultString(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}

// relayHeaders mark a request a proxy relayed: a loopback peer sending one
// is Envoy (or another proxy in the pod) forwarding someone else's request.
// Envoy sends x-forwarded-proto to HTTP/1.1 upstreams, and x-envoy-*
// headers unless told not to.
var relayHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "Via"}

// notLoopback says whether r must be refused a loopback-only endpoint, and
// why. Only the socket's addresses count: Host, X-Forwarded-For and the
// like are the client's to write. Both ends must be loopback: Istio's
// inbound passthrough connects from 127.0.0.6 to the pod IP, so a
// loopback peer alone may be any client of the mesh (issue 43).
func notLoopback(r *http.Request) (bool, string) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return true, "loopback only"
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if local == nil {
		return true, "loopback only"
	}
	if lp, err := netip.ParseAddrPort(local.String()); err != nil || !lp.Addr().Unmap().IsLoopback() {
		return true, "loopback only: to a pod address"
	}
	for _, h := range relayHeaders {
		if _, ok := r.Header[h]; ok {
			return true, "loopback only: a relayed request (" + h + ")"
		}
	}
	for h := range r.Header {
		if strings.HasPrefix(h, "X-Envoy-") {
			return true, "loopback only: a relayed request (" + h + ")"
		}
	}
	return false, ""
}

// loopbackOnly refuses callers from outside the pod: these endpoints stop
// or expose the proxy.
func loopbackOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if refused, why := notLoopback(r); refused {
			http.Error(w, why, http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// limitBody refuses a body larger than max (413), declared or streamed
// (chunked). No endpoint reads a body: it is read and dropped here, so
// that a connection is never held by one.
func limitBody(h http.Handler, max int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tooLarge := r.ContentLength > max
		if !tooLarge {
			_, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, max))
			var mbe *http.MaxBytesError
			tooLarge = errors.As(err, &mbe)
			if err != nil && !tooLarge {
				http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		if tooLarge {
			w.Header().Set("Connection", "close")
			http.Error(w, "request body over "+strconv.FormatInt(max, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// The agent is the status server's backend.

func (a *agent) proxyExited() <-chan struct{}   { return a.proxy.Exited() }
func (a *agent) triggerDrain(cause drain.Cause) { a.early.trigger(cause) }
func (a *agent) quit()                          { a.early.quit() }

// metricsHandler serves the registry once the machine is built (503
// "starting" in the start-up's first tens of milliseconds): draind's own
// metrics to everyone, and the Go runtime's and the process's (heap,
// threads, file descriptors, the namespace's network byte counters) only
// to the pod's loopback callers, as the loopback-only endpoints are.
func (a *agent) metricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, h := a.early.machine()
		if h == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		if refused, _ := notLoopback(r); !refused {
			h = a.metrics.withRuntime
		}
		h.ServeHTTP(w, r)
	})
}

func (a *agent) watchState() (drain.State, <-chan struct{}, bool) {
	m, _ := a.early.machine()
	if m == nil {
		return drain.State{}, nil, false
	}
	st, ch := m.Watch()
	return st, ch, true
}

// podState is /debug/state: the machine's published State, or "starting"
// before the machine exists.
func (a *agent) podState() PodState {
	now := time.Now()
	if m, _ := a.early.machine(); m != nil {
		return NewPodState(m.State(), now)
	}
	return PodState{Version: PodStateVersion, Now: now, Phase: drain.Starting.String(), PodShape: a.cfg.Drain.StartShape().Name(),
		Holds: []PodHold{}, Held: []PodHeldFor{}}
}

// flowsJSON is /debug/flows: what `draind conns -o json` shows, and the
// drain phase.
func (a *agent) flowsJSON() ([]byte, error) {
	m, _ := a.early.machine()
	if m == nil {
		return nil, errors.New("starting: the tracker is not open yet")
	}
	snap := a.tracker.Snapshot()
	return json.Marshal(map[string]any{"summary": snap.Summary, "listeners": snap.Listeners, "flows": snap.Flows,
		"taken": snap.Taken, "namespace": snap.Namespace, "phase": m.Phase().String()})
}
