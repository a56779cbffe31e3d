// Command loadclient sends HTTP requests at a fixed rate, with no retries,
// and reports every failure with its time: the load of the rollout
// measurements (a client pod calling a Service through kube-proxy).
//
//	loadclient --url http://SVC/ --qps 25 --duration 60s --mode newconn
//
// Modes: newconn (a new connection for every request, Kubernetes' rolling
// update e2e), keepalive (HTTP/1.1, one pool), h2 (HTTP/2 cleartext with
// prior knowledge, one connection at a time). Each failure is a JSON line
// {"t": UNIXNANO, "class": refused|reset|timeout|status|other, "err": ...}
// on stdout, and the last line a summary {"sent", "ok", "failed",
// "by_class"}. SIGTERM ends the run early, with its summary; so does a
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
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
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

type summary struct {
	Sent    int            `json:"sent"`
	OK      int            `json:"ok"`
	Failed  int            `json:"failed"`
	ByClass map[string]int `json:"by_class"`
}

type failure struct {
	T     int64  `json:"t"`
	Class string `json:"class"`
	Err   string `json:"err"`
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
		ln, err := net.Listen("tcp", *stopAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/stop", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "stopping\n")
			w.(http.Flusher).Flush() // before the run ends and closes the server
			stop()
		})
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln) // ends with Close below
		defer srv.Close()
	}
	if *url == "" || *qps <= 0 {
		return errors.New("--url and a positive --qps are required")
	}
	var tr http.RoundTripper
	switch *mode {
	case "newconn":
		tr = &http.Transport{DisableKeepAlives: true}
	case "keepalive":
		tr = &http.Transport{MaxIdleConnsPerHost: 64}
	case "h2":
		// HTTP/2 with prior knowledge over cleartext, nothing else.
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr = &http.Transport{Protocols: &p}
	default:
		return fmt.Errorf("--mode %q: newconn, keepalive or h2", *mode)
	}
	client := &http.Client{Transport: tr, Timeout: *timeout}
	var mu sync.Mutex
	sum := summary{ByClass: map[string]int{}}
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
			class, err := get(client, *url)
			mu.Lock()
			defer mu.Unlock()
			sum.Sent++
			if err == nil {
				sum.OK++
				return
			}
			sum.Failed++
			sum.ByClass[class]++
			enc.Encode(failure{T: start.UnixNano(), Class: class, Err: err.Error()})
		})
	}
	wg.Wait()
	return enc.Encode(sum)
}

// get makes one request and classifies its failure.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
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
