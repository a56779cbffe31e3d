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
// --grpc-port N also serves grpc.health.v1.Health (plaintext HTTP/2) on N
// for e2e/kubelet/cmd/xdsload; graceful stops it with the HTTP server.
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
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

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
	grpcPort := fs.Int("grpc-port", 0, "also serve grpc.health.v1.Health (plaintext HTTP/2) on this port of --listen's address; 0: no gRPC")
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
	gsrv, grpcServed, err := serveGRPC(*listen, *grpcPort)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		return 1
	}
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
		var stops sync.WaitGroup
		if gsrv != nil {
			// As Shutdown below: stop accepting, tell each connection to
			// go (GOAWAY), and wait for the calls in flight.
			stops.Go(gsrv.GracefulStop)
		}
		if err := srv.Shutdown(context.Background()); err != nil {
			rec.line("shutdown %v", err)
		}
		stops.Wait()
	})
	wg.Go(func() { callOut(0, *calls, *pause) })
	wg.Wait()
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		rec.line("serve %v", err)
	}
	if gsrv != nil {
		if err := <-grpcServed; err != nil {
			rec.line("grpc serve %v", err)
		}
	}
	rec.line("drained %d", time.Now().UnixNano())
	if *tailCalls > 0 {
		time.Sleep(*tailPause)
		callOut(*calls, *tailCalls, *tailPause)
	}
	rec.line("exit %d 0", time.Now().UnixNano())
	return 0
}

// serveGRPC serves the gRPC health service on port (0: nothing) of
// listen's host. Its answer stays SERVING until the server stops: the
// checks are the load's own calls, which succeed while the app serves,
// as its HTTP / does. The server ends with GracefulStop (or the process);
// served then has Serve's result.
func serveGRPC(listen string, port int) (srv *grpc.Server, served chan error, err error) {
	if port == 0 {
		return nil, nil, nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, nil, fmt.Errorf("--listen %q: %w", listen, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, nil, fmt.Errorf("grpc listener: %w", err)
	}
	srv = grpc.NewServer()
	healthgrpc.RegisterHealthServer(srv, health.NewServer()) // "" SERVING
	served = make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return srv, served, nil
}
