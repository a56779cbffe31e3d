// Package loadline is what the load clients (cmd/loadclient, cmd/xdsload)
// print and how a run is stopped, in one place for the clients and the
// tests that read them.
//
// # Output
//
// One JSON object a line on stdout: a [Call] for each failed call (and,
// asked, each one that succeeded), then the run's [Summary] last.
//
// # Stopping
//
// A client run with --stop-addr serves /stop there ([ServeStop]): a
// request ends the run, its summary printed, and the pod completes.
package loadline

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
)

// Summary is a run's last line.
type Summary struct {
	Sent    int            `json:"sent"`
	OK      int            `json:"ok"`
	Failed  int            `json:"failed"`
	ByClass map[string]int `json:"by_class"`
}

// Call is a call's line: when it started (T, Unix nanoseconds), its class
// ("ok" or why it failed), the error, the client's end of the connection,
// the last step it reached, and the peer that answered, where known.
type Call struct {
	T       int64  `json:"t"`
	Class   string `json:"class"`
	Err     string `json:"err,omitempty"`
	Local   string `json:"local,omitempty"`
	Reached string `json:"reached,omitempty"`
	Peer    string `json:"peer,omitempty"`
}

// ServeStop serves /stop on addr: a request answers "stopping" and calls
// stop. The returned close ends the server.
func ServeStop(addr string, stop context.CancelFunc) (close func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stop address: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stop", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "stopping\n")
		w.(http.Flusher).Flush() // before the run ends and closes the server
		stop()
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln) // ends with close
	return srv.Close, nil
}
