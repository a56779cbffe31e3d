package envoysim_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
	"github.com/draind/draind/internal/testenv/envoysim/conformance"
)

// streamUpstream is an HTTP/1.1 upstream whose /stream answers in n
// chunks, period apart, and ends with a grpc-status trailer: a gRPC-style
// server stream. /fast answers at once.
func streamUpstream(t *testing.T, n int, period time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			io.WriteString(w, "fast")
			return
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.Header().Set("Content-Type", "application/grpc")
		rc := http.NewResponseController(w)
		for i := range n {
			fmt.Fprintf(w, "chunk %d\n", i)
			rc.Flush()
			select {
			case <-time.After(period):
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Grpc-Status", "0")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// h2cClient speaks HTTP/2 cleartext with prior knowledge, as gRPC does.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}, Timeout: 30 * time.Second}
}

func TestH2CProxy(t *testing.T) {
	up := streamUpstream(t, 3, time.Millisecond)
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Protocol: "http", Upstream: up},
	}})
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + sim.ListenerAddr("in") + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "fast" || resp.ProtoMajor != 2 || resp.Header.Get("Server") != "envoy" {
		t.Errorf("%s %d %q %v", resp.Proto, resp.StatusCode, b, resp.Header)
	}
	// HTTP/1.1 on the same listener (codec AUTO).
	h1 := dialHTTP(t, sim.ListenerAddr("in"))
	if resp, body := h1.get("/fast"); resp.StatusCode != 200 || body != "fast" || resp.ProtoMajor != 1 {
		t.Errorf("HTTP/1.1: %d %q", resp.StatusCode, body)
	}
	for name, want := range map[string]uint64{
		"http.in.downstream_cx_http2_total": 1, "http.in.downstream_cx_http2_active": 1,
		"http.in.downstream_cx_http1_total": 1, "http.in.downstream_rq_http2_total": 1, "http.in.downstream_rq_http1_total": 1,
	} {
		if v, ok := sim.Stat(name); !ok || v != want {
			t.Errorf("%s = %d, %t; want %d", name, v, ok, want)
		}
	}
	// Trailers pass through, as gRPC needs.
	resp, err = hc.Get("http://" + sim.ListenerAddr("in") + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "chunk 0\nchunk 1\nchunk 2\n" || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("stream: %q, trailer %v", b, resp.Trailer)
	}
}

// A server stream in flight across a drain completes. Its response's
// headers went out before the drain, so it brings no GOAWAY itself; the
// next response on the connection does (last-stream-id 2^31-1), the final
// GOAWAY (last-stream-id 3) follows drain_timeout later while the stream
// still runs, and the connection closes once the stream is done.
func TestH2CStreamAcrossDrain(t *testing.T) {
	up := streamUpstream(t, 10, 100*time.Millisecond)
	sim := startSim(t, envoysim.Config{DrainStrategy: "immediate", Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up, DrainTimeout: 300 * time.Millisecond},
	}})
	h, err := conformance.DialH2(context.Background(), sim.ListenerAddr("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	stream, err := h.Get("app", "/stream")
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	seen := func(f conformance.Frame) string {
		if last, _, ok := f.GoAway(); ok {
			return fmt.Sprintf("goaway %d", last)
		}
		switch {
		case f.Type == conformance.FrameHeaders && f.EndStream():
			return fmt.Sprintf("trailers %d", f.Stream)
		case f.Type == conformance.FrameHeaders:
			return fmt.Sprintf("headers %d", f.Stream)
		case f.Type == conformance.FrameData:
			return fmt.Sprintf("data %d", f.Stream)
		}
		return f.String()
	}
	next := func() conformance.Frame {
		t.Helper()
		f, err := h.Next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", log, err)
		}
		log = append(log, seen(f))
		return f
	}
	for f := next(); f.Type != conformance.FrameData; f = next() {
	}
	if code, _ := adminDo(t, sim, "POST", "/drain_listeners?inboundonly&graceful"); code != 200 {
		t.Fatal(code)
	}
	second, err := h.Get("app", "/fast")
	if err != nil {
		t.Fatal(err)
	}
	done := false
	for !done {
		f := next()
		done = f.Stream == stream && f.EndStream()
	}
	if _, err := h.Next(10 * time.Second); !errors.Is(err, io.EOF) {
		t.Errorf("after the stream: %v, want the connection closed with a FIN", err)
	}
	got := strings.Join(log, ", ")
	// The order that matters, the stream's data aside (and a DATA frame
	// that only ends a stream counted with the one before).
	var order []string
	for _, e := range log {
		if e != fmt.Sprintf("data %d", stream) && (len(order) == 0 || order[len(order)-1] != e) {
			order = append(order, e)
		}
	}
	want := []string{
		fmt.Sprintf("headers %d", stream),
		fmt.Sprintf("goaway %d", conformance.MaxStreamID),
		fmt.Sprintf("headers %d", second), fmt.Sprintf("data %d", second),
		fmt.Sprintf("goaway %d", second),
		fmt.Sprintf("trailers %d", stream),
	}
	if strings.Join(order, ", ") != strings.Join(want, ", ") {
		t.Errorf("frames: %s\nwant (stream %d's data aside): %s", got, stream, strings.Join(want, ", "))
	}
	if i := strings.Index(got, fmt.Sprintf("goaway %d", second)); i < 0 || !strings.Contains(got[i:], fmt.Sprintf("data %d", stream)) {
		t.Errorf("no stream data after the final GOAWAY: %s", got)
	}
	if n := strings.Count(got, fmt.Sprintf("data %d", stream)); n < 10 {
		t.Errorf("%d data frames on the stream, want 10: %s", n, got)
	}
	if v, _ := sim.Stat("http.in.downstream_cx_drain_close"); v != 1 {
		t.Errorf("downstream_cx_drain_close %d", v)
	}
}

// With a Go gRPC-style client (HTTP/2 cleartext, prior knowledge), the
// stream started before the drain is whole, trailer included, and the
// client moves its next request to a new connection after the GOAWAY.
func TestH2CGoClientAcrossDrain(t *testing.T) {
	up := streamUpstream(t, 8, 100*time.Millisecond)
	sim := startSim(t, envoysim.Config{DrainStrategy: "immediate", Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up, DrainTimeout: 200 * time.Millisecond},
	}})
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	base := "http://" + sim.ListenerAddr("in")
	resp, err := hc.Get(base + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("chunk 0\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	adminDo(t, sim, "POST", "/drain_listeners?inboundonly&graceful")
	for range 3 {
		r, err := hc.Get(base + "/fast")
		if err != nil {
			t.Fatalf("request during the drain: %v", err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		time.Sleep(150 * time.Millisecond)
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("stream cut: %v after %q", err, rest)
	}
	body := string(first) + string(rest)
	if strings.Count(body, "chunk") != 8 || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("stream: %q, trailer %v", body, resp.Trailer)
	}
	if v, _ := sim.Stat("http.in.downstream_cx_http2_total"); v < 2 {
		t.Errorf("%d HTTP/2 connections: the client should have moved to a new one after the GOAWAY", v)
	}
}
