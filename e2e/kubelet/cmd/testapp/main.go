// Command testapp is the application container of the e2e pods: an HTTP
// server (/, /slow?ms=N) whose behaviour on SIGTERM is chosen by flags, or
// a batch task (--job) that makes its calls and exits with a chosen code.
//
// On SIGTERM (--on-term):
//
//	exit      exit at once
//	ignore    keep serving (the kubelet SIGKILLs it at the end of the grace period)
//	graceful  stop accepting, finish in-flight requests and, meanwhile, make
//	          --calls outbound calls through the proxy, then exit 0
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
	"syscall"
	"time"
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
	pause := fs.Duration("call-pause", 100*time.Millisecond, "pause between outbound calls")
	callURL := fs.String("call-url", "http://127.0.0.1:15001/ping", "outbound call target (the proxy's outbound listener)")
	result := fs.String("result", "", "also append result lines to this file")
	job := fs.Bool("job", false, "batch mode: make --calls calls after --job-delay, then exit with --exit-code")
	jobDelay := fs.Duration("job-delay", time.Second, "batch mode: wait this long first")
	exitCode := fs.Int("exit-code", 0, "batch mode: exit code")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rec := &recorder{path: *result}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	callOut := func() {
		for i := range *calls {
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
			time.Sleep(*pause)
		}
	}
	if *job {
		time.Sleep(*jobDelay)
		callOut()
		rec.line("exit %d %d", time.Now().UnixNano(), *exitCode)
		return *exitCode
	}

	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		fmt.Fprintf(w, "slept %d ms\n", ms)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app ok\n") })
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
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			rec.line("shutdown %v", err)
		}
	})
	wg.Go(callOut)
	wg.Wait()
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		rec.line("serve %v", err)
	}
	rec.line("exit %d 0", time.Now().UnixNano())
	return 0
}
