// Package testapp is the HTTP side of the e2e test apps, the pod harness's
// (e2e/) and the kubelet's image (e2e/kubelet/cmd/testapp): the handlers
// both serve, and InFlight, which tells a test when a request to them is
// in flight.
package testapp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Handle registers the shared handlers on mux: / ("app ok"), /slow,
// /inflight and /stream.
func Handle(mux *http.ServeMux) {
	mux.HandleFunc("/slow", Slow)
	mux.HandleFunc("/inflight", Waiting)
	mux.HandleFunc("/stream", Stream)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app ok\n") })
}

// waiting holds the ids of the /slow requests in their wait.
var waiting sync.Map

// Slow answers /slow?ms=N with "slept N ms" after N ms. With id=X the
// request is listed as waiting (Waiting) from when it reached the handler
// until it answers.
//
// It sends nothing before its answer: a flow that sent a response and
// then fell silent looks to draind like an idle keep-alive, which it may
// close; one that awaits its response does not.
func Slow(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ms, _ := strconv.Atoi(q.Get("ms"))
	if id := q.Get("id"); id != "" {
		waiting.Store(id, struct{}{})
		defer waiting.Delete(id)
	}
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
	case <-r.Context().Done():
		return // the client left
	}
	fmt.Fprintf(w, "slept %d ms\n", ms)
}

// Waiting answers /inflight?id=X: 200 while the /slow request with that
// id waits, 404 otherwise.
func Waiting(w http.ResponseWriter, r *http.Request) {
	if _, ok := waiting.Load(r.URL.Query().Get("id")); !ok {
		http.Error(w, "not waiting", http.StatusNotFound)
		return
	}
	io.WriteString(w, "waiting\n")
}

// Stream answers /stream?n=N&ms=M as a gRPC server stream does: N chunks
// M ms apart, each flushed, then a grpc-status trailer.
func Stream(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	w.Header().Set("Trailer", "Grpc-Status")
	w.Header().Set("Content-Type", "application/grpc")
	rc := http.NewResponseController(w)
	for i := range n {
		fmt.Fprintf(w, "chunk %d\n", i)
		rc.Flush()
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Grpc-Status", "0")
}

// Reply is how a request ended: its status, whether the response asked
// to close the connection, its header, body and trailer, or the error;
// and when.
type Reply struct {
	Code    int
	Close   bool
	Header  http.Header
	Body    string
	Trailer http.Header
	Err     error
	At      time.Time
}

var lastID atomic.Int64

// InFlight sends GET target (a /slow URL) with c and returns once the app
// says the request waits in its handler (/inflight): from then on it is
// known to be in flight through every hop, though no byte of its answer
// has come back. The reply comes on the channel once the body has been
// read, or ctx is done. It fails if the request ends before that, or is
// not seen within wait.
//
// The asking goes on connections of its own, closed after each answer
// (c's transport, keep-alives off), so that c's pool stays as it was.
func InFlight(ctx context.Context, c *http.Client, target string, wait time.Duration) (<-chan Reply, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), lastID.Add(1))
	q := u.Query()
	q.Set("id", id)
	u.RawQuery = q.Encode()
	ask := &http.Client{Timeout: time.Second}
	if tr, ok := c.Transport.(*http.Transport); ok {
		tr = tr.Clone()
		tr.DisableKeepAlives = true
		ask.Transport = tr
	} else {
		ask.Transport = &http.Transport{DisableKeepAlives: true}
	}
	askURL := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/inflight", RawQuery: url.Values{"id": {id}}.Encode()}).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	done := make(chan Reply, 1)
	go func() {
		resp, err := c.Do(req)
		r := Reply{Err: err}
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			r = Reply{Code: resp.StatusCode, Close: resp.Close, Header: resp.Header, Body: string(b), Trailer: resp.Trailer, Err: err}
		}
		r.At = time.Now()
		done <- r
	}()
	for end := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		select {
		case r := <-done:
			if r.Err != nil {
				return nil, fmt.Errorf("GET %s ended before it was seen waiting: %w", target, r.Err)
			}
			return nil, fmt.Errorf("GET %s ended before it was seen waiting: %d", target, r.Code)
		default:
		}
		if resp, err := ask.Get(askURL); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return done, nil
			}
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("GET %s: not seen waiting within %s", target, wait)
		}
	}
}
