// Command loadclient sends HTTP requests at a fixed rate, with no retries,
// and reports every failure with its time: the load of the rollout
// measurements (a client pod calling a Service through kube-proxy).
//
//	loadclient --url http://SVC/ --qps 25 --duration 60s --mode newconn
//
// Modes: newconn (a new connection for every request, Kubernetes' rolling
// update e2e), keepalive (HTTP/1.1, one pool), h2 (HTTP/2 cleartext with
// prior knowledge, one connection at a time). Each failure is a JSON line
// {"t": UNIXNANO, "class": refused|reset|timeout|status|other, "err": ...,
// "local": "IP:PORT", "reached": dial|connected|sent|headers} on stdout
// (local: the client's end of the connection, bound before connect so a
// dial that times out has one too: the node's conntrack maps it to the
// pod kube-proxy chose; reached: the request's last step), and the last
// line a summary {"sent", "ok", "failed", "by_class"}. SIGTERM ends the run early, with its summary; so does a
// request to /stop on --stop-addr, after which the pod completes and
// keeps its log for `kubectl logs` (a deleted pod's log stream may end
// before its last line).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/loadline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadclient:", err)
		os.Exit(2)
	}
}

// A request's steps, as far as it reached them.
const (
	reachedDial      = "dial"
	reachedConnected = "connected"
	reachedSent      = "sent"
	reachedHeaders   = "headers"
)

// requestTrace is what one request's trace saw; its dial's local address
// comes from the Transport's dialer (boundDialer), through the context.
type requestTrace struct {
	mu             sync.Mutex
	local, reached string
}

func (r *requestTrace) set(local, reached string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if local != "" {
		r.local = local
	}
	if reached != "" {
		r.reached = reached
	}
}

func (r *requestTrace) get() (local, reached string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.local, r.reached
}

type traceKey struct{}

// context is a request's context with its trace.
func (r *requestTrace) context(ctx context.Context) context.Context {
	ctx = context.WithValue(ctx, traceKey{}, r)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart:         func(string, string) { r.set("", reachedDial) },
		GotConn:              func(i httptrace.GotConnInfo) { r.set(i.Conn.LocalAddr().String(), reachedConnected) },
		WroteRequest:         func(httptrace.WroteRequestInfo) { r.set("", reachedSent) },
		GotFirstResponseByte: func() { r.set("", reachedHeaders) },
	})
}

// boundDialer dials TCP with the socket bound to an ephemeral port before
// connect, and records that port in the dialing request's trace: a SYN
// never answered leaves no connection for GotConn, but its conntrack entry
// (and so the pod it went to) is found by the port. The Transport may
// hand a dialed connection to another waiting request; GotConn then
// records the right one for it.
func boundDialer(ctx context.Context, network, addr string) (net.Conn, error) {
	tr, _ := ctx.Value(traceKey{}).(*requestTrace)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var bindErr error
		err := c.Control(func(fd uintptr) {
			if bindErr = syscall.Bind(int(fd), &syscall.SockaddrInet4{}); bindErr != nil {
				return
			}
			sa, err := syscall.Getsockname(int(fd))
			if sa4, ok := sa.(*syscall.SockaddrInet4); ok && err == nil && tr != nil {
				tr.set(fmt.Sprintf("*:%d", sa4.Port), "")
			}
		})
		return errors.Join(err, bindErr)
	}}
	return d.DialContext(ctx, network, addr)
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("loadclient", flag.ContinueOnError)
	url := fs.String("url", "", "the URL to GET")
	qps := fs.Float64("qps", 25, "requests a second, sent on a fixed schedule (a request every 1/qps)")
	duration := fs.Duration("duration", time.Minute, "how long to send")
	mode := fs.String("mode", "newconn", "newconn | keepalive | h2")
	timeout := fs.Duration("timeout", 5*time.Second, "a request's timeout")
	stopAddr := fs.String("stop-addr", "", "serve /stop here: a request ends the run, with its summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if *stopAddr != "" {
		closeStop, err := loadline.ServeStop(*stopAddr, stop)
		if err != nil {
			return err
		}
		defer closeStop()
	}
	if *url == "" || *qps <= 0 {
		return errors.New("--url and a positive --qps are required")
	}
	var tr http.RoundTripper
	switch *mode {
	case "newconn":
		tr = &http.Transport{DisableKeepAlives: true, DialContext: boundDialer}
	case "keepalive":
		tr = &http.Transport{MaxIdleConnsPerHost: 64, DialContext: boundDialer}
	case "h2":
		// HTTP/2 with prior knowledge over cleartext, nothing else.
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr = &http.Transport{Protocols: &p, DialContext: boundDialer}
	default:
		return fmt.Errorf("--mode %q: newconn, keepalive or h2", *mode)
	}
	client := &http.Client{Transport: tr, Timeout: *timeout}
	var mu sync.Mutex
	sum := loadline.Summary{ByClass: map[string]int{}}
	enc := json.NewEncoder(stdout)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / *qps))
	defer tick.Stop()
	end := time.After(*duration)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-tick.C:
		}
		wg.Go(func() {
			start := time.Now()
			var trace requestTrace
			// Not the run's ctx: a request in flight at the end completes.
			class, err := get(trace.context(context.Background()), client, *url)
			mu.Lock()
			defer mu.Unlock()
			sum.Sent++
			if err == nil {
				sum.OK++
				return
			}
			sum.Failed++
			sum.ByClass[class]++
			local, reached := trace.get()
			enc.Encode(loadline.Call{T: start.UnixNano(), Class: class, Err: err.Error(), Local: local, Reached: reached})
		})
	}
	wg.Wait()
	return enc.Encode(sum)
}

// get makes one request and classifies its failure.
func get(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "other", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return classify(err), err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return classify(err), err
	}
	if resp.StatusCode >= 500 {
		return "status", fmt.Errorf("status %s", resp.Status)
	}
	return "", nil
}

func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "reset"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}
