// Package conformance holds envoysim's conformance scenarios as data and a
// runner that plays them against a target: envoysim on every test run, and
// a real Envoy when one is installed (ENVOY_BIN, or envoy on PATH), with an
// equivalent bootstrap. A scenario that passes against both says envoysim
// behaves as Envoy there; the scenarios are the list of behaviours the
// stand-in is held to (docs/envoysim.md).
//
// Steps are admin calls (status and body), dials (accepted or refused),
// HTTP exchanges on HTTP/1.1 and HTTP/2 cleartext connections (Connection:
// close, GOAWAY frames and their order), how connections end when the
// proxy quits (FIN or RST), and stats present or absent with and without
// usedonly and under Istio's stats_matcher.
//
// Like envoysim, this is a test part: nothing in draind's product imports it.
package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// Target is what scenarios run against.
type Target interface {
	// Name names the target in test names: "envoysim", "envoy".
	Name() string
	// Start runs a proxy set up as s, LIVE when it returns, stopped by
	// t.Cleanup. It calls t.Skip, saying why, when the target is not
	// available here.
	Start(t *testing.T, s Setup) Instance
}

// Instance is one running proxy.
type Instance interface {
	// AdminAddr is the admin API's address.
	AdminAddr() string
	// ListenerAddr is a listener's bound address, by name.
	ListenerAddr(name string) string
	// Signal sends sig to the proxy (SIGTERM: Envoy's shutdown).
	Signal(sig os.Signal) error
	// Done is closed once the proxy has exited.
	Done() <-chan struct{}
}

// Setup is the proxy configuration a scenario needs, in terms both an
// envoysim config and an Envoy bootstrap can express.
type Setup struct {
	// DrainTime is --drain-time-s (whole seconds for Envoy); 0 is 0.
	DrainTime time.Duration
	// DrainStrategy is --drain-strategy: "immediate" or "gradual".
	DrainStrategy string
	// StatsMatcher is "", "istio", "istio_exit_on_zero" (see
	// envoysim.IstioStatsInclusion) or "reject_all".
	StatsMatcher string
	// DrainGeneration is envoysim.Drain139 or envoysim.DrainConnectionEvent
	// (for a real Envoy after 1.39: the runtime guards off or on). Run sets
	// it for scenarios that leave it empty; a scenario that sets it pins a
	// behaviour of that generation and runs only under it.
	DrainGeneration string
	Listeners       []Listener
}

// Upstream kinds the runner starts for listeners.
const (
	UpstreamEcho  = "echo"  // TCP: echoes
	UpstreamHTTP  = "http"  // HTTP/1.1: /fast answers "fast"
	UpstreamStuck = "stuck" // TCP: accepts, never reads
)

// Listener is one listener of a Setup. Listeners bind 127.0.0.1:0.
type Listener struct {
	Name       string
	Direction  string // "inbound", "outbound" or ""
	Protocol   string // "tcp" or "http" (the HTTP connection manager, codec AUTO)
	StatPrefix string // listener.<StatPrefix>. stats
	Upstream   string // UpstreamEcho, UpstreamHTTP or UpstreamStuck
	// UpstreamAddr is filled by the runner before Start.
	UpstreamAddr string
	// DrainTimeout is the HTTP connection manager's drain_timeout (0: Envoy's 5 s).
	DrainTimeout time.Duration
}

// Op is what a step does.
type Op string

// Step operations. Each says which Step fields it reads.
const (
	// OpAdmin is an admin request: Method (default GET) Path → Code, and
	// Body (exact) or BodyPrefix when set.
	OpAdmin Op = "admin"
	// OpDial is a dial: Listener → Want "accepted" or "refused" (Within:
	// how long a change may take to show).
	OpDial Op = "dial"
	// OpOpen opens connection Conn to Listener with Proto "tcp" (proved
	// with an echo unless the upstream is stuck), "http1" or "h2c".
	OpOpen Op = "open"
	// OpRequest is a request: GET Path on Conn → 200 and, for http1, Want
	// "close" (Connection: close, then the server closes) or "keep-alive";
	// for h2c, Want "goaway" (a GOAWAY with last-stream-id 2^31-1 came
	// before the response's headers) or "no-goaway".
	OpRequest Op = "request"
	// OpGoAway checks that, on h2c Conn, the final GOAWAY (last-stream-id
	// the last stream sent, NO_ERROR) comes within Within; with Want
	// "notice", the first one (last-stream-id 2^31-1, NO_ERROR).
	OpGoAway Op = "goaway"
	// OpQuiet checks that nothing comes on Conn for Within (an idle
	// connection is left alone).
	OpQuiet Op = "quiet"
	// OpFill writes to Conn until the proxy stops reading, leaving data
	// unread in its socket.
	OpFill Op = "fill"
	// OpClosed checks that Conn ends with Want "fin" or "rst" within
	// Within, or "open": it is still open.
	OpClosed Op = "closed"
	// OpStat checks stat Stat (exact name) with UsedOnly → Want "present"
	// (with Value, if set) or "absent".
	OpStat Op = "stat"
	// OpSignal sends SIGTERM and waits for the proxy to exit.
	OpSignal Op = "sigterm"
	// OpExit waits for the proxy to exit (after /quitquitquit).
	OpExit Op = "exit"
	// OpSleep waits Within.
	OpSleep Op = "sleep"
)

// Step is one step of a scenario; Op says which fields matter.
type Step struct {
	Op         Op
	Method     string
	Path       string
	Code       int
	Body       string
	BodyPrefix string
	Listener   string
	Conn       string
	Proto      string
	Want       string
	Stat       string
	UsedOnly   bool
	Value      *uint64
	Within     time.Duration
}

// Scenario is a setup and the steps played against it.
type Scenario struct {
	Name  string
	Setup Setup
	Steps []Step
}

// U64 is a *uint64 for Step.Value.
func U64(v uint64) *uint64 { return &v }

// Generations are the drain generations every scenario runs under.
var Generations = []string{envoysim.Drain139, envoysim.DrainConnectionEvent}

// Run plays every scenario of [Scenarios] against target under each drain
// generation, each as a subtest: generation/scenario.
func Run(t *testing.T, target Target) {
	for _, gen := range Generations {
		t.Run(gen, func(t *testing.T) {
			var scs []Scenario
			for _, sc := range Scenarios() {
				switch sc.Setup.DrainGeneration {
				case "":
					sc.Setup.DrainGeneration = gen
				case gen:
				default:
					continue
				}
				scs = append(scs, sc)
			}
			RunScenarios(t, target, scs)
		})
	}
}

// RunScenarios plays the given scenarios against target.
func RunScenarios(t *testing.T, target Target, scenarios []Scenario) {
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			s := sc.Setup
			s.Listeners = append([]Listener(nil), s.Listeners...)
			for i := range s.Listeners {
				s.Listeners[i].UpstreamAddr = startUpstream(t, s.Listeners[i].Upstream)
			}
			r := &runner{t: t, in: target.Start(t, s), conns: map[string]*clientConn{}}
			for i, st := range sc.Steps {
				if !r.step(st) {
					t.Fatalf("step %d (%s) failed", i+1, st.Op)
				}
			}
		})
	}
}

// clientConn is a connection a scenario opened.
type clientConn struct {
	proto string
	c     net.Conn
	br    *bufio.Reader
	h2    *H2Conn
	last  uint32 // h2: the last stream sent
	addr  string
}

type runner struct {
	t     *testing.T
	in    Instance
	conns map[string]*clientConn
}

func (r *runner) errorf(format string, args ...any) bool {
	r.t.Helper()
	r.t.Errorf(format, args...)
	return false
}

// step plays one step; false stops the scenario.
func (r *runner) step(st Step) bool {
	r.t.Helper()
	switch st.Op {
	case OpAdmin:
		return r.admin(st)
	case OpDial:
		return r.dial(st)
	case OpOpen:
		return r.open(st)
	case OpRequest:
		return r.request(st)
	case OpGoAway:
		return r.goAway(st)
	case OpQuiet:
		return r.quiet(st)
	case OpFill:
		return r.fill(st)
	case OpClosed:
		return r.closed(st)
	case OpStat:
		return r.stat(st)
	case OpSignal:
		if err := r.in.Signal(syscall.SIGTERM); err != nil {
			return r.errorf("SIGTERM: %v", err)
		}
		return r.exited()
	case OpExit:
		return r.exited()
	case OpSleep:
		time.Sleep(st.Within)
		return true
	}
	return r.errorf("unknown op %q", st.Op)
}

func (r *runner) exited() bool {
	select {
	case <-r.in.Done():
		return true
	case <-time.After(15 * time.Second):
		return r.errorf("the proxy did not exit")
	}
}

var adminClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 15 * time.Second}

func (r *runner) admin(st Step) bool {
	method := st.Method
	if method == "" {
		method = "GET"
	}
	req, err := http.NewRequest(method, "http://"+r.in.AdminAddr()+st.Path, nil)
	if err != nil {
		return r.errorf("%v", err)
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return r.errorf("%s %s: %v", method, st.Path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return r.errorf("%s %s: %v", method, st.Path, err)
	}
	body := string(b)
	switch {
	case resp.StatusCode != st.Code:
		return r.errorf("%s %s: status %d %q, want %d", method, st.Path, resp.StatusCode, body, st.Code)
	case st.BodyPrefix != "" && !strings.HasPrefix(body, st.BodyPrefix):
		return r.errorf("%s %s: body %q, want it to start with %q", method, st.Path, body, st.BodyPrefix)
	case st.BodyPrefix == "" && body != st.Body:
		return r.errorf("%s %s: body %q, want %q", method, st.Path, body, st.Body)
	}
	return true
}

func (r *runner) listenerAddr(name string) string {
	a := r.in.ListenerAddr(name)
	if a == "" {
		r.t.Fatalf("no listener %q", name)
	}
	return a
}

func (r *runner) dial(st Step) bool {
	addr := r.listenerAddr(st.Listener)
	deadline := time.Now().Add(st.Within)
	for {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		accepted := err == nil
		if accepted {
			c.Close()
		}
		switch {
		case st.Want == "accepted" && accepted, st.Want == "refused" && errors.Is(err, syscall.ECONNREFUSED):
			return true
		case time.Now().After(deadline):
			return r.errorf("dial %s (%s): %v, want %s", st.Listener, addr, err, st.Want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *runner) open(st Step) bool {
	addr := r.listenerAddr(st.Listener)
	cc := &clientConn{proto: st.Proto, addr: addr}
	switch st.Proto {
	case "h2c":
		h, err := DialH2(context.Background(), addr)
		if err != nil {
			return r.errorf("open %s: %v", st.Conn, err)
		}
		cc.h2, cc.c = h, h.c
	case "tcp", "http1":
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return r.errorf("open %s: %v", st.Conn, err)
		}
		cc.c, cc.br = c, bufio.NewReader(c)
	default:
		return r.errorf("open %s: proto %q", st.Conn, st.Proto)
	}
	r.t.Cleanup(func() { cc.c.Close() })
	r.conns[st.Conn] = cc
	if st.Proto == "tcp" && st.Want != "no-echo" {
		cc.c.SetDeadline(time.Now().Add(10 * time.Second))
		defer cc.c.SetDeadline(time.Time{})
		buf := make([]byte, 4)
		if _, err := cc.c.Write([]byte("ping")); err != nil {
			return r.errorf("open %s: %v", st.Conn, err)
		}
		if _, err := io.ReadFull(cc.br, buf); err != nil || string(buf) != "ping" {
			return r.errorf("open %s: echo %q %v", st.Conn, buf, err)
		}
	}
	return true
}

func (r *runner) conn(name string) *clientConn {
	cc, ok := r.conns[name]
	if !ok {
		r.t.Fatalf("no connection %q", name)
	}
	return cc
}

func (r *runner) request(st Step) bool {
	cc := r.conn(st.Conn)
	if cc.proto == "h2c" {
		return r.requestH2(st, cc)
	}
	if _, err := io.WriteString(cc.c, "GET "+st.Path+" HTTP/1.1\r\nHost: app\r\n\r\n"); err != nil {
		return r.errorf("%s: %v", st.Conn, err)
	}
	cc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer cc.c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(cc.br, nil)
	if err != nil {
		return r.errorf("%s: %v", st.Conn, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return r.errorf("%s: status %d", st.Conn, resp.StatusCode)
	}
	switch {
	case st.Want == "close" && !resp.Close:
		return r.errorf("%s: no Connection: close (%v)", st.Conn, resp.Header)
	case st.Want == "keep-alive" && resp.Close:
		return r.errorf("%s: Connection: close", st.Conn)
	}
	return true
}

func (r *runner) requestH2(st Step, cc *clientConn) bool {
	id, err := cc.h2.Get("app", st.Path)
	if err != nil {
		return r.errorf("%s: %v", st.Conn, err)
	}
	cc.last = id
	goaway, headers := false, false
	for {
		f, err := cc.h2.Next(10 * time.Second)
		if err != nil {
			return r.errorf("%s: stream %d: %v", st.Conn, id, err)
		}
		if last, code, ok := f.GoAway(); ok {
			if headers {
				return r.errorf("%s: %v after the response's headers", st.Conn, f)
			}
			if last != MaxStreamID || code != 0 {
				return r.errorf("%s: %v, want a shutdown notice (last=%d, NO_ERROR)", st.Conn, f, MaxStreamID)
			}
			goaway = true
			continue
		}
		if f.Stream != id {
			continue
		}
		if f.Type == FrameRSTStream {
			return r.errorf("%s: stream %d reset", st.Conn, id)
		}
		if f.Type == FrameHeaders && !headers {
			headers = true
			if !f.Status200() {
				return r.errorf("%s: stream %d: not a 200", st.Conn, id)
			}
		}
		if f.EndStream() {
			break
		}
	}
	if (st.Want == "goaway") != goaway {
		return r.errorf("%s: GOAWAY before the response: %t, want %s", st.Conn, goaway, st.Want)
	}
	return true
}

func (r *runner) goAway(st Step) bool {
	cc := r.conn(st.Conn)
	f, err := cc.h2.Next(st.Within)
	if err != nil {
		return r.errorf("%s: no final GOAWAY within %v: %v", st.Conn, st.Within, err)
	}
	want := cc.last
	if st.Want == "notice" {
		want = MaxStreamID
	}
	last, code, ok := f.GoAway()
	if !ok || last != want || code != 0 {
		return r.errorf("%s: %v, want GOAWAY(last=%d, NO_ERROR)", st.Conn, f, want)
	}
	return true
}

func (r *runner) quiet(st Step) bool {
	cc := r.conn(st.Conn)
	if cc.h2 != nil {
		if f, err := cc.h2.Next(st.Within); !errors.Is(err, ErrQuiet) {
			return r.errorf("%s: got %v %v, want nothing", st.Conn, f, err)
		}
		return true
	}
	cc.c.SetReadDeadline(time.Now().Add(st.Within))
	defer cc.c.SetReadDeadline(time.Time{})
	if _, err := cc.br.Peek(1); !isTimeout(err) {
		return r.errorf("%s: %v, want nothing", st.Conn, err)
	}
	return true
}

func (r *runner) fill(st Step) bool {
	cc := r.conn(st.Conn)
	buf := make([]byte, 64<<10)
	for {
		cc.c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := cc.c.Write(buf); err != nil {
			cc.c.SetWriteDeadline(time.Time{})
			if isTimeout(err) {
				return true
			}
			return r.errorf("%s: %v", st.Conn, err)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ending reads a connection until it ends: "fin", "rst", or "open" if it
// did not end within d.
func ending(cc *clientConn, d time.Duration) (string, error) {
	var err error
	if cc.h2 != nil {
		for {
			if _, err = cc.h2.Next(d); err != nil {
				break
			}
		}
		if errors.Is(err, ErrQuiet) {
			return "open", nil
		}
	} else {
		cc.c.SetReadDeadline(time.Now().Add(d))
		_, err = io.Copy(io.Discard, cc.br)
		if err == nil {
			err = io.EOF
		}
		if isTimeout(err) {
			return "open", nil
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		return "fin", nil
	case errors.Is(err, syscall.ECONNRESET):
		return "rst", nil
	}
	return "", err
}

func (r *runner) closed(st Step) bool {
	cc := r.conn(st.Conn)
	d := st.Within
	if d == 0 {
		d = 10 * time.Second
	}
	got, err := ending(cc, d)
	if got != st.Want {
		return r.errorf("%s ended as %q (%v), want %q", st.Conn, got, err, st.Want)
	}
	return true
}

func (r *runner) stat(st Step) bool {
	q := "filter=" + urlEscape("^"+regexp.QuoteMeta(st.Stat)+"$")
	if st.UsedOnly {
		q = "usedonly&" + q
	}
	resp, err := adminClient.Get("http://" + r.in.AdminAddr() + "/stats?" + q)
	if err != nil {
		return r.errorf("stats: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		return r.errorf("stats: %d %v", resp.StatusCode, err)
	}
	var value string
	present := false
	for _, line := range strings.Split(string(b), "\n") {
		if name, v, ok := strings.Cut(line, ": "); ok && name == st.Stat {
			present, value = true, v
		}
	}
	switch {
	case st.Want == "absent" && present:
		return r.errorf("%s (usedonly %t) present: %s", st.Stat, st.UsedOnly, value)
	case st.Want == "present" && !present:
		return r.errorf("%s (usedonly %t) absent; answer %q", st.Stat, st.UsedOnly, b)
	case st.Want == "present" && st.Value != nil && value != strconv.FormatUint(*st.Value, 10):
		return r.errorf("%s = %s, want %d", st.Stat, value, *st.Value)
	}
	return true
}

func urlEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// startUpstream starts an upstream of a kind for the test's duration.
func startUpstream(t *testing.T, kind string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	switch kind {
	case UpstreamHTTP:
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "fast")
		})}
		go func() { srv.Serve(ln); close(done) }()
		t.Cleanup(func() { srv.Close(); <-done })
		return ln.Addr().String()
	case UpstreamEcho, UpstreamStuck:
		// Every connection is kept, and closed at the end; echoes are
		// waited for.
		var mu sync.Mutex
		var held []net.Conn
		var echoes sync.WaitGroup
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				if kind == UpstreamEcho {
					echoes.Go(func() { io.Copy(c, c); c.Close() })
				}
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			<-done
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
			echoes.Wait()
		})
		return ln.Addr().String()
	}
	t.Fatalf("unknown upstream %q", kind)
	return ""
}
