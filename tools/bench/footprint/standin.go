package main

import (
	"net"
	"net/http"
)

// standinStats are the admin stats both agents read to decide that the
// proxy is LIVE: draind (server.state, workers_started) and pilot-agent
// (those, and one CDS and one LDS update accepted). envoysim has no xDS,
// so no update counters: pilot-agent never reports ready with it.
const standinStats = "cluster_manager.cds.update_rejected: 0\ncluster_manager.cds.update_success: 1\n" +
	"listener_manager.lds.update_rejected: 0\nlistener_manager.lds.update_success: 1\n" +
	"listener_manager.workers_started: 1\nserver.state: 0\n"

// standin is a proxy that is LIVE at once, for both agents alike: an
// admin API answering /ready and /stats, and one listener. It ignores its
// arguments (Envoy's flags) and runs until killed or /quitquitquit.
func standin() error {
	if ln, err := net.Listen("tcp", "0.0.0.0:15006"); err == nil {
		defer ln.Close()
	}
	admin, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return err
	}
	quit := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("LIVE\n")) })
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(standinStats)) })
	mux.HandleFunc("POST /quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("OK\n"))
		close(quit)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(admin)
	<-quit
	return srv.Close()
}
