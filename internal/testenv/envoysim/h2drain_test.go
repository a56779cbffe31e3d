package envoysim_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// These tests hold envoysim's inbound HTTP/2 drain to Envoy's, as read in
// envoyproxy/envoy (docs/envoysim.md, "Envoy's behaviour, from its
// source"): the connection manager decides whether a connection drains
// when a response's headers are encoded
// (source/common/http/conn_manager_impl.cc, encodeHeaders); draining starts
// startDrainSequence: the codec's shutdownNotice, a GOAWAY with last
// stream id 2^31-1 written before those headers, then drain_timeout later
// onDrainTimeout: goAway(), the final GOAWAY with the highest stream id
// received (source/common/http/http2/codec_impl.cc), and the connection
// closes once its streams are done. The client is golang.org/x/net/http2's
// framer, so every frame and its time is seen.

const maxStreamID = 1<<31 - 1

// h2Event is one frame (or the end of the connection) as the client saw
// it, with the time it arrived.
type h2Event struct {
	at       time.Time
	kind     string // "headers", "trailers", "data", "goaway", "rst", "eof", "error"
	stream   uint32
	end      bool
	last     uint32        // GOAWAY's last stream id
	code     http2.ErrCode // GOAWAY's or RST_STREAM's error code
	data     string
	grpcCode string // a trailer's grpc-status
	err      error
}

func (e h2Event) String() string {
	switch e.kind {
	case "goaway":
		return fmt.Sprintf("goaway(last=%d,%v)", e.last, e.code)
	case "eof", "error":
		return fmt.Sprintf("%s(%v)", e.kind, e.err)
	}
	return fmt.Sprintf("%s(%d)", e.kind, e.stream)
}

// h2Client is an HTTP/2 cleartext client with prior knowledge (as gRPC)
// that reports every frame it reads.
type h2Client struct {
	t      *testing.T
	nc     net.Conn
	wmu    sync.Mutex
	fr     *http2.Framer
	hbuf   bytes.Buffer
	enc    *hpack.Encoder
	next   uint32
	events chan h2Event
	done   chan struct{}
}

func dialH2(t *testing.T, addr string) *h2Client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := &h2Client{t: t, nc: nc, fr: http2.NewFramer(nc, nc), next: 1,
		events: make(chan h2Event, 1024), done: make(chan struct{})}
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go c.readLoop()
	t.Cleanup(func() { nc.Close(); <-c.done })
	return c
}

func (c *h2Client) readLoop() {
	defer close(c.done)
	defer close(c.events)
	for {
		f, err := c.fr.ReadFrame()
		now := time.Now()
		if err != nil {
			kind := "error"
			if errors.Is(err, io.EOF) {
				kind = "eof"
			}
			c.events <- h2Event{at: now, kind: kind, err: err}
			return
		}
		ev := h2Event{at: now, stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				c.fr.WriteSettingsAck()
				c.wmu.Unlock()
			}
			continue
		case *http2.PingFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				c.fr.WritePing(true, f.Data)
				c.wmu.Unlock()
			}
			continue
		case *http2.MetaHeadersFrame:
			ev.kind, ev.end = "headers", f.StreamEnded()
			if f.PseudoValue("status") == "" {
				ev.kind, ev.grpcCode = "trailers", headerValue(f.RegularFields(), "grpc-status")
			}
		case *http2.DataFrame:
			ev.kind, ev.end, ev.data = "data", f.StreamEnded(), string(f.Data())
			if n := len(f.Data()); n > 0 {
				c.wmu.Lock()
				c.fr.WriteWindowUpdate(0, uint32(n))
				c.fr.WriteWindowUpdate(f.StreamID, uint32(n))
				c.wmu.Unlock()
			}
		case *http2.GoAwayFrame:
			ev.kind, ev.last, ev.code = "goaway", f.LastStreamID, f.ErrCode
		case *http2.RSTStreamFrame:
			ev.kind, ev.code = "rst", f.ErrCode
		default:
			continue
		}
		c.events <- ev
	}
}

func headerValue(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// get opens a GET stream and returns its id.
func (c *h2Client) get(path string) uint32 {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "app"}, {":path", path}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	id := c.next
	c.next += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(),
		EndStream: true, EndHeaders: true}); err != nil {
		c.t.Fatalf("request %s: %v", path, err)
	}
	return id
}

// until reads events until one matches, failing after timeout; it returns
// every event read, the match last.
func (c *h2Client) until(what string, timeout time.Duration, match func(h2Event) bool) []h2Event {
	c.t.Helper()
	var seen []h2Event
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				c.t.Fatalf("waiting for %s: connection gone after %v", what, seen)
			}
			seen = append(seen, ev)
			if match(ev) {
				return seen
			}
			if ev.kind == "eof" || ev.kind == "error" {
				c.t.Fatalf("waiting for %s: %v", what, seen)
			}
		case <-deadline:
			c.t.Fatalf("no %s within %v; saw %v", what, timeout, seen)
		}
	}
}

// quiet reads events for d and returns them.
func (c *h2Client) quiet(d time.Duration) []h2Event {
	var seen []h2Event
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return seen
			}
			seen = append(seen, ev)
		case <-deadline:
			return seen
		}
	}
}

// fetch sends a GET and waits for its end; the events read on the way are
// returned.
func (c *h2Client) fetch(path string) (uint32, []h2Event) {
	c.t.Helper()
	id := c.get(path)
	return id, c.until(fmt.Sprintf("end of stream %d", id), 10*time.Second,
		func(e h2Event) bool { return e.stream == id && e.end })
}

func goaways(evs []h2Event) []h2Event {
	var g []h2Event
	for _, e := range evs {
		if e.kind == "goaway" {
			g = append(g, e)
		}
	}
	return g
}

var drainGenerations = []string{envoysim.Drain139, envoysim.Drain140, envoysim.DrainConnectionEvent}

// Under --drain-strategy immediate, POST /drain_listeners?inboundonly&graceful
// sends nothing by itself, in every generation (the connection-event
// generation's proactive drain is 20 s away here): the GOAWAY notice goes
// out with the next response on the connection, before its headers, with
// last stream id 2^31-1; the final GOAWAY, naming the highest stream,
// follows drain_timeout later; a stream in flight since before the drain
// completes after it, trailers included, and then the connection closes.
// An idle connection gets nothing; the outbound listener is not drained.
func TestH2GoAwayAtDrainImmediate(t *testing.T) {
	for _, gen := range drainGenerations {
		t.Run(gen, func(t *testing.T) {
			t.Parallel()
			const drainTimeout = 400 * time.Millisecond
			up := streamUpstream(t, 12, 100*time.Millisecond)
			sim := startSim(t, envoysim.Config{DrainStrategy: "immediate", DrainTime: 30 * time.Second,
				DrainGeneration: gen, Listeners: []envoysim.ListenerConfig{
					{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up, DrainTimeout: drainTimeout},
					{Name: "out", Address: "127.0.0.1:0", Direction: "outbound", Protocol: "http", Upstream: up, DrainTimeout: drainTimeout},
				}})
			a := dialH2(t, sim.ListenerAddr("in"))
			idle := dialH2(t, sim.ListenerAddr("in"))
			out := dialH2(t, sim.ListenerAddr("out"))
			long := a.get("/stream")
			seen := a.until("the stream's first data", 10*time.Second, func(e h2Event) bool { return e.stream == long && e.kind == "data" })
			idle.fetch("/fast")
			out.fetch("/fast")

			drainAt := time.Now()
			if code, _ := adminDo(t, sim, "POST", "/drain_listeners?inboundonly&graceful"); code != 200 {
				t.Fatal(code)
			}
			before := a.quiet(300 * time.Millisecond)
			if g := goaways(before); len(g) > 0 {
				t.Fatalf("GOAWAY with no response after the drain: %v", g)
			}
			seen = append(seen, before...)

			reqAt := time.Now()
			short := a.get("/fast")
			evs := a.until("the final GOAWAY", 10*time.Second, func(e h2Event) bool { return e.kind == "goaway" && e.last != maxStreamID })
			var notice, final h2Event
			var headersAfterNotice bool
			for _, e := range evs {
				switch {
				case e.kind == "goaway" && e.last == maxStreamID:
					notice = e
				case e.kind == "goaway":
					final = e
				case e.kind == "headers" && e.stream == short:
					headersAfterNotice = !notice.at.IsZero()
				}
			}
			if notice.at.IsZero() || notice.code != http2.ErrCodeNo || notice.at.Before(reqAt) {
				t.Fatalf("no GOAWAY(2^31-1, NO_ERROR) after the request: %v", evs)
			}
			if !headersAfterNotice {
				t.Errorf("the response's headers came before the GOAWAY notice: %v", evs)
			}
			if final.last != short || final.code != http2.ErrCodeNo {
				t.Errorf("final GOAWAY %v, want last stream %d, NO_ERROR", final, short)
			}
			if d := final.at.Sub(notice.at); d < drainTimeout-50*time.Millisecond || d > drainTimeout+time.Second {
				t.Errorf("final GOAWAY %v after the notice, want drain_timeout (%v)", d, drainTimeout)
			}
			t.Logf("drain → notice %v (request at %v), final %v later",
				notice.at.Sub(drainAt), reqAt.Sub(drainAt), final.at.Sub(notice.at))

			// The stream in flight completes after the final GOAWAY, then the
			// connection closes.
			rest := a.until("the long stream's trailers", 10*time.Second, func(e h2Event) bool { return e.stream == long && e.end })
			all := append(append(seen, evs...), rest...)
			var body strings.Builder
			for _, e := range all {
				if e.stream == long && e.kind == "data" {
					body.WriteString(e.data)
				}
				if e.kind == "rst" {
					t.Errorf("stream reset: %v", all)
				}
			}
			tr := rest[len(rest)-1]
			if tr.kind != "trailers" || tr.grpcCode != "0" || !tr.at.After(final.at) {
				t.Errorf("long stream ended with %v (grpc-status %q at %v after the final GOAWAY)", tr, tr.grpcCode, tr.at.Sub(final.at))
			}
			if n := strings.Count(body.String(), "chunk"); n != 12 {
				t.Errorf("%d chunks, want 12: %q", n, body.String())
			}
			a.until("the connection's close", 10*time.Second, func(e h2Event) bool { return e.kind == "eof" })

			// The outbound listener's connection answers with no GOAWAY;
			// the idle connection never heard of the drain.
			if _, evs := out.fetch("/fast"); len(goaways(evs)) > 0 {
				t.Errorf("outbound listener drained by inboundonly: %v", evs)
			}
			if g := goaways(idle.quiet(100 * time.Millisecond)); len(g) > 0 {
				t.Errorf("idle connection got %v", g)
			}
			if v, _ := sim.Stat("http.in.downstream_cx_drain_close"); v != 1 {
				t.Errorf("downstream_cx_drain_close %d, want 1", v)
			}
		})
	}
}

// Under --drain-strategy gradual the decision is a draw per response,
// in whole seconds of drain, so the first second is deterministic:
// through 1.39 (DrainManagerImpl::drainClose, source/server/drain_manager_impl.cc)
// the elapsed time counts from the truncated remaining time, so a 1 s drain
// drains the first response; 1.40.0's Network::shouldDrainClose counts
// whole seconds elapsed, so no response drains in the first second and
// every one once the drain time has passed; main after 1.40.0 ramps over
// half the drain time, every response draining from second 1 of a 2 s
// drain. A response that drains is preceded by the GOAWAY notice, the
// final GOAWAY follows drain_timeout later.
func TestH2GoAwayAtDrainGradual(t *testing.T) {
	for _, c := range []struct {
		gen       string
		drainTime time.Duration
		quiet     time.Duration // no GOAWAY on responses this long into the drain
		sure      time.Duration // a GOAWAY on the first response from then
	}{
		{envoysim.Drain139, time.Second, 0, 0},
		{envoysim.Drain140, 2 * time.Second, 800 * time.Millisecond, 2 * time.Second},
		{envoysim.DrainConnectionEvent, 2 * time.Second, 800 * time.Millisecond, time.Second},
	} {
		t.Run(c.gen, func(t *testing.T) {
			t.Parallel()
			const drainTimeout = 300 * time.Millisecond
			up := streamUpstream(t, 1, time.Millisecond)
			sim := startSim(t, envoysim.Config{DrainTime: c.drainTime, DrainGeneration: c.gen,
				Listeners: []envoysim.ListenerConfig{
					{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up, DrainTimeout: drainTimeout},
				}})
			a := dialH2(t, sim.ListenerAddr("in"))
			a.fetch("/fast")
			drainAt := time.Now()
			if code, _ := adminDo(t, sim, "POST", "/drain_listeners?inboundonly&graceful"); code != 200 {
				t.Fatal(code)
			}
			for time.Since(drainAt) < c.quiet {
				if _, evs := a.fetch("/fast"); len(goaways(evs)) > 0 {
					t.Fatalf("GOAWAY %v into a %v gradual drain: %v", time.Since(drainAt), c.drainTime, evs)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// drainAt is taken before the admin call: the sim's drain starts
			// a little later.
			time.Sleep(time.Until(drainAt.Add(c.sure + 200*time.Millisecond)))
			reqAt := time.Now()
			id, evs := a.fetch("/fast")
			g := goaways(evs)
			if len(g) != 1 || g[0].last != maxStreamID || g[0].at.Before(reqAt) {
				t.Fatalf("response %v into the drain: %v, want one GOAWAY(2^31-1) before it", reqAt.Sub(drainAt), evs)
			}
			final := goaways(a.until("the final GOAWAY", 10*time.Second, func(e h2Event) bool { return e.kind == "goaway" }))[0]
			if final.last != id {
				t.Errorf("final GOAWAY names stream %d, want %d", final.last, id)
			}
			if d := final.at.Sub(g[0].at); d < drainTimeout-50*time.Millisecond || d > drainTimeout+time.Second {
				t.Errorf("final GOAWAY %v after the notice, want drain_timeout (%v)", d, drainTimeout)
			}
			a.until("the connection's close", 10*time.Second, func(e h2Event) bool { return e.kind == "eof" })
		})
	}
}

// An idle HTTP/2 connection: through 1.40.0 nothing reaches it, even past
// the drain time (the connection manager only asks when it encodes a
// response; DrainManagerImpl::addOnDrainCloseCb exists but a listener's
// filter chain context refuses it,
// https://github.com/envoyproxy/envoy/blob/main/source/common/listener_manager/filter_chain_manager_impl.h).
// On main after 1.40.0 it drains on its own at a random moment in
// [2/3 drain time, drain time - drain_timeout]: GOAWAY notice, final GOAWAY
// drain_timeout later, then the close.
func TestH2IdleConnectionAtDrain(t *testing.T) {
	for _, gen := range drainGenerations {
		t.Run(gen, func(t *testing.T) {
			t.Parallel()
			const (
				drainTime    = 3 * time.Second
				drainTimeout = 200 * time.Millisecond
			)
			up := streamUpstream(t, 1, time.Millisecond)
			sim := startSim(t, envoysim.Config{DrainStrategy: "immediate", DrainTime: drainTime, DrainGeneration: gen,
				Listeners: []envoysim.ListenerConfig{
					{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Protocol: "http", Upstream: up, DrainTimeout: drainTimeout},
				}})
			idle := dialH2(t, sim.ListenerAddr("in"))
			id, _ := idle.fetch("/fast")
			drainAt := time.Now()
			if code, _ := adminDo(t, sim, "POST", "/drain_listeners?inboundonly&graceful"); code != 200 {
				t.Fatal(code)
			}
			if gen != envoysim.DrainConnectionEvent {
				if evs := idle.quiet(drainTime + 500*time.Millisecond); len(evs) > 0 {
					t.Errorf("idle connection got %v", evs)
				}
				return
			}
			evs := idle.until("the close", drainTime+2*time.Second, func(e h2Event) bool { return e.kind == "eof" })
			g := goaways(evs)
			if len(g) != 2 || g[0].last != maxStreamID || g[1].last != id {
				t.Fatalf("idle connection: %v, want GOAWAY(2^31-1), GOAWAY(%d), close", evs, id)
			}
			lo, hi := drainTime*2/3, drainTime-drainTimeout
			if at := g[0].at.Sub(drainAt); at < lo-50*time.Millisecond || at > hi+250*time.Millisecond {
				t.Errorf("GOAWAY notice %v into the drain, want in [%v, %v]", at, lo, hi)
			}
			if d := g[1].at.Sub(g[0].at); d < drainTimeout-50*time.Millisecond || d > drainTimeout+time.Second {
				t.Errorf("final GOAWAY %v after the notice, want drain_timeout (%v)", d, drainTimeout)
			}
		})
	}
}
