package agent

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// statusServer serves the kubelet's probes, Prometheus, and (to loopback
// callers only) the drain controls and /debug/flows.
type statusServer struct {
	a   *agent
	srv *http.Server
	ln  net.Listener
}

func newStatusServer(a *agent, ln net.Listener) *statusServer {
	s := &statusServer{a: a, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz/ready", s.ready)
	mux.HandleFunc("GET /healthz/live", s.live)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /drain", s.loopbackOnly(s.drain))
	mux.HandleFunc("POST /quitquitquit", s.loopbackOnly(s.quit))
	mux.HandleFunc("GET /debug/flows", s.loopbackOnly(s.flows))
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      10 * time.Second,
		ErrorLog:          nil,
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
// draining, and the app listens on --app-ports. Nothing is cached: each
// probe asks (the admin call has its own short timeout).
func (s *statusServer) ready(w http.ResponseWriter, r *http.Request) {
	ok, why := s.a.readiness(r.Context())
	if !ok {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ready\n"))
}

func (s *statusServer) live(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.a.proxy.Exited():
		http.Error(w, "proxy exited", http.StatusServiceUnavailable)
	default:
		w.Write([]byte("live\n"))
	}
}

// drain starts the drain. `draind drain` (a native sidecar's preStop hook)
// says so with ?cause=prestop.
func (s *statusServer) drain(w http.ResponseWriter, r *http.Request) {
	cause := drain.CausePOST
	if r.URL.Query().Get("cause") == "prestop" {
		cause = drain.CausePreStop
	}
	s.a.machine.Trigger(cause)
	w.WriteHeader(http.StatusAccepted)
	w.Write([]byte("draining\n"))
}

func (s *statusServer) quit(w http.ResponseWriter, r *http.Request) {
	s.a.machine.Quit()
	w.WriteHeader(http.StatusAccepted)
	w.Write([]byte("stopping\n"))
}

func (s *statusServer) flows(w http.ResponseWriter, r *http.Request) {
	snap := s.a.tracker.Snapshot()
	w.Header().Set("Content-Type", "application/json")
	b, err := json.Marshal(map[string]any{"summary": snap.Summary, "listeners": snap.Listeners, "flows": snap.Flows,
		"taken": snap.Taken, "namespace": snap.Namespace, "phase": s.a.machine.Phase().String()})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Write(b)
}

// loopbackOnly refuses callers from outside the pod: these endpoints stop
// or expose the proxy.
func (s *statusServer) loopbackOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "loopback only", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}
