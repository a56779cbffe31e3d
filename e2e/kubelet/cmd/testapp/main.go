// Command testapp is the application container of the e2e pods: an HTTP
// server (internal/testenv/testapp's /, /slow?ms=N and /stream) whose behaviour on SIGTERM is chosen by flags, or
// a batch task (--job) that makes its calls and exits with a chosen code
// (or fails its first run: --fail-once).
//
// On SIGTERM (--on-term):
//
//	exit      exit at once
//	ignore    keep serving (the kubelet SIGKILLs it at the end of the grace period)
//	graceful  stop accepting, finish in-flight requests and, meanwhile, make
//	          --calls outbound calls through the proxy; then --tail-calls
//	          more (its listener closed, no request in flight: only its
//	          process says the app is not done), then exit 0
//
// --delay-shutdown D puts agnhost's `netexec --delay-shutdown` shape before
// graceful: at SIGTERM /readyz answers 503 at once, and the app keeps
// serving (and accepting) for D before it stops accepting, its --calls
// made meanwhile. Run with no arguments it serves HTTP on :8080 (/,
// /readyz, /slow?ms=N) and exits at once on SIGTERM, as agnhost does.
//
// Every outcome is a line on stdout and, with --result, in that file:
// "ok N", "fail N ERROR", "term UNIXNANO", "exit UNIXNANO CODE".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/draind/draind/internal/testenv/testapp"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type recorder struct {
	mu   sync.Mutex
	path string
}

func (r *recorder) line(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf(format, args...)
	fmt.Println(s)
	if r.path == "" {
		return
	}
	f, err := os.OpenFile(r.path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp: result:", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, s)
}

func run(args []string) int {
	fs := flag.NewFlagSet("testapp", flag.ContinueOnError)
	listen := fs.String("listen", "0.0.0.0:8080", "address to serve HTTP on")
	onTerm := fs.String("on-term", "graceful", "exit|ignore|graceful")
	calls := fs.Int("calls", 0, "outbound calls to make during a graceful shutdown (or as the job)")
	tailCalls := fs.Int("tail-calls", 0, "graceful: outbound calls to make after the last in-flight request ended")
	tailPause := fs.Duration("tail-pause", 300*time.Millisecond, "pause before each tail call (no flow open meanwhile)")
	pause := fs.Duration("call-pause", 100*time.Millisecond, "pause between outbound calls")
	callURL := fs.String("call-url", "http://127.0.0.1:15001/ping", "outbound call target (the proxy's outbound listener)")
	result := fs.String("result", "", "also append result lines to this file")
	job := fs.Bool("job", false, "batch mode: make --calls calls after --job-delay, then exit with --exit-code")
	jobDelay := fs.Duration("job-delay", time.Second, "batch mode: wait this long first")
	exitCode := fs.Int("exit-code", 0, "batch mode: exit code")
	failOnce := fs.String("fail-once", "", "batch mode: exit 1 when this file does not exist yet (and create it): the restarted container then exits --exit-code")
	delayShutdown := fs.Duration("delay-shutdown", 0, "graceful: at SIGTERM answer 503 on /readyz and keep serving this long before stopping (agnhost netexec --delay-shutdown)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rec := &recorder{path: *result}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	callOut := func(first, n int, pause time.Duration) {
		for i := first; i < first+n; i++ {
			resp, err := client.Get(*callURL)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				rec.line("fail %d %v", i, err)
			} else {
				rec.line("ok %d", i)
			}
			time.Sleep(pause)
		}
	}
	if *job {
		time.Sleep(*jobDelay)
		callOut(0, *calls, *pause)
		code := *exitCode
		if *failOnce != "" {
			if f, err := os.OpenFile(*failOnce, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666); err == nil {
				f.Close()
				code = 1
			}
		}
		rec.line("exit %d %d", time.Now().UnixNano(), code)
		return code
	}

	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		return 1
	}
	mux := http.NewServeMux()
	testapp.Handle(mux) // /, /slow, /inflight, /stream: the pod harness's app (e2e/) serves them too
	var terminating atomic.Bool
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if terminating.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	rec.line("ready %d", time.Now().UnixNano())

	for {
		sig := <-sigc
		rec.line("term %d %s", time.Now().UnixNano(), sig)
		switch *onTerm {
		case "ignore":
			continue
		case "exit":
			rec.line("exit %d 0", time.Now().UnixNano())
			return 0
		}
		break
	}
	terminating.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(*delayShutdown)
		if err := srv.Shutdown(context.Background()); err != nil {
			rec.line("shutdown %v", err)
		}
	})
	wg.Go(func() { callOut(0, *calls, *pause) })
	wg.Wait()
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		rec.line("serve %v", err)
	}
	rec.line("drained %d", time.Now().UnixNano())
	if *tailCalls > 0 {
		time.Sleep(*tailPause)
		callOut(*calls, *tailCalls, *tailPause)
	}
	rec.line("exit %d 0", time.Now().UnixNano())
	return 0
}
