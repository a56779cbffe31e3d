package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// BenchmarkUntoldKeepAliveClients measures what --close-idle-keepalives
// costs and saves real HTTP clients (docs/design.md, "Untold keep-alives";
// docs/benchmarks.md). Each op is one pod's deletion, as kube-proxy and
// the kubelet make it: clients in the remote namespace reach the pod
// through a Service address (a DNAT rule in their namespace, as
// kube-proxy's); CONNS keep-alive connections, one client each, a GET
// every 2 s. After two periods the endpoint moves to another pod (the
// rule now points at a server in the remote namespace; conntrack keeps
// established connections where they were), draind gets SIGTERM, the
// app's preStop waits out of rotation (min-drain 1 s), and then the app
// gets SIGTERM: it stops accepting and makes 10 calls out over 3 s before
// it exits, as the cluster bench's app does. Half the connections are
// idle since before the drain when the wait ends: untold. With the closer
// off their next request reaches an app that no longer accepts (a 503)
// until the proxy stops after the app's exit; with it on they get a FIN
// first, and a client that sees it dials the Service again, unless its
// request raced the FIN.
//
// Clients: Go's net/http; Python's requests and Node's http (the
// scripts in e2e/testdata/keepalive-clients), each with its defaults (no
// retries). Reported per op: requests ok and failed.
func BenchmarkUntoldKeepAliveClients(b *testing.B) {
	const (
		conns  = 100
		period = 2 * time.Second
		run    = 10 * time.Second // 2 periods steady, the drain, 3 periods after
	)
	python, node := lookTool(b, "python3"), lookTool(b, "node")
	if out, err := exec.Command(python, "-c", "import requests").CombinedOutput(); err != nil {
		b.Fatalf("python3 has no requests module (Debian: python3-requests): %v %s", err, out)
	}
	for _, closer := range []bool{false, true} {
		for _, client := range []string{"go", "requests", "node"} {
			b.Run(fmt.Sprintf("closer=%v/%s", closer, client), func(b *testing.B) {
				var ok, failed int
				byClass := map[string]int{}
				for b.Loop() {
					p := newPod(b)
					p.startApp("--on-term", "graceful", "--outbound-count", "10", "--outbound-pause", "300ms")
					p.startDraind([]string{"--min-drain", "1s", "--close-idle-keepalives=" + strconv.FormatBool(closer)})
					svc := newServiceRule(b, p)
					var res clientCounts
					done := make(chan struct{})
					// The load ends by itself (run, each request's 5 s
					// timeout); a failed step below waits for it too,
					// before the pod's namespaces go.
					defer func() { <-done }()
					go func() {
						defer close(done)
						switch client {
						case "go":
							res = goKeepAliveLoad(p, "http://"+serviceAddr+"/", conns, period, run)
						case "requests":
							res = p.remoteTool(b, python, "testdata/keepalive-clients/requests_client.py", conns, period, run)
						case "node":
							res = p.remoteTool(b, node, "testdata/keepalive-clients/node_client.js", conns, period, run)
						}
					}()
					time.Sleep(100*time.Millisecond + 2*period)
					svc.moveTo(remoteIP + ":" + otherPodPort)
					p.drainedAt = time.Now()
					p.draind.Signal(syscall.SIGTERM)
					callRotationWait(b, p)
					p.app.Signal(syscall.SIGTERM) // the kubelet, once the hook returned
					<-done
					if code, _ := p.waitExit(30 * time.Second); code != 0 {
						b.Fatalf("draind exited %d; log:\n%s", code, p.draindLog.String())
					}
					untold := 0.0
					if l := p.logLines(logevent.UntoldClosed); len(l) == 1 {
						untold, _ = l[0]["closed"].(float64)
					}
					b.Logf("drain: app exit +%s, quit +%s; untold closed %v", p.app.exitedAt.Sub(p.drainedAt), p.phaseTime("stopping").Sub(p.drainedAt), untold)
					ok, failed = ok+res.OK, failed+res.Failed
					for k, v := range res.ByClass {
						byClass[k] += v
					}
					for _, e := range res.Errors {
						if closer { // off, they are the 503s this measures
							b.Logf("%s: %s", client, e)
						}
					}
				}
				b.ReportMetric(float64(ok)/float64(b.N), "ok/op")
				b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
				b.Logf("closer %v, %s: %d ok, %d failed %v over %d drains", closer, client, ok, failed, byClass, b.N)
			})
		}
	}
}

// The Service address the clients use, and the other pod's port behind it
// once the endpoint moves.
const (
	serviceAddr  = "192.0.2.100:80"
	otherPodPort = "18081"
)

// serviceRule is a kube-proxy's DNAT rule in the remote namespace.
type serviceRule struct {
	b  testing.TB
	ns string // nsenter's option (remoteNSArg)
}

// newServiceRule points serviceAddr at the pod's inbound listener and
// starts the other pod, a server answering 200, in the remote namespace.
func newServiceRule(b testing.TB, p *pod) *serviceRule {
	b.Helper()
	other := p.remote.Listen(b, "tcp4", remoteIP+":"+otherPodPort)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "other pod\n") })}
	go srv.Serve(other)
	b.Cleanup(func() { srv.Close() })
	s := &serviceRule{b: b, ns: p.remoteNSArg()}
	s.iptables("-A", "OUTPUT", "-d", "192.0.2.100", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", podIP+":15006")
	return s
}

// moveTo points the rule at addr: new connections go there, established
// ones stay (conntrack), as when kube-proxy removes an endpoint.
func (s *serviceRule) moveTo(addr string) {
	s.iptables("-R", "OUTPUT", "1", "-d", "192.0.2.100", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", addr)
}

func (s *serviceRule) iptables(args ...string) {
	s.b.Helper()
	if out, err := exec.Command("nsenter", append([]string{s.ns, "iptables", "-w", "-t", "nat"}, args...)...).CombinedOutput(); err != nil {
		s.b.Fatalf("iptables %v: %v %s", args, err, out)
	}
}

// clientCounts is what a load client reports (the scripts' JSON line).
type clientCounts struct {
	OK      int            `json:"ok"`
	Failed  int            `json:"failed"`
	ByClass map[string]int `json:"by_class"`
	Errors  []string       `json:"errors"`
}

// remoteNSArg is nsenter's option for the remote namespace, the test's
// handle on it seen from a child.
func (p *pod) remoteNSArg() string {
	return fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(p.remote.Handle))
}

// remoteTool runs a client script in the remote namespace, killed 15 s
// past its run.
func (p *pod) remoteTool(b testing.TB, tool, script string, conns int, period, run time.Duration) clientCounts {
	ctx, cancel := context.WithTimeout(context.Background(), run+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", p.remoteNSArg(), tool, script, "http://"+serviceAddr+"/", strconv.Itoa(conns),
		strconv.FormatInt(period.Milliseconds(), 10), strconv.FormatInt(run.Milliseconds(), 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var c clientCounts
	if err == nil {
		err = json.Unmarshal(out, &c)
	}
	if err != nil {
		b.Errorf("%s %s: %v: %s %s", tool, script, err, out, stderr.Bytes())
	}
	return c
}

// goKeepAliveLoad is the Go client: one http.Client per connection, the
// transport's defaults but the remote namespace's dialer.
func goKeepAliveLoad(p *pod, url string, conns int, period, run time.Duration) clientCounts {
	var mu sync.Mutex
	c := clientCounts{ByClass: map[string]int{}}
	record := func(class string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if class == "" {
			c.OK++
			return
		}
		c.Failed++
		c.ByClass[class]++
		if len(c.Errors) < 5 {
			c.Errors = append(c.Errors, fmt.Sprintf("%s: %v", class, err))
		}
	}
	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(run)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			tr := &http.Transport{DialContext: p.remote.Dialer(), MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			for at := start.Add(time.Duration(i) * period / time.Duration(conns)); at.Before(end); at = at.Add(period) {
				time.Sleep(time.Until(at))
				resp, err := hc.Get(url)
				if err != nil {
					record("error", err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					record(fmt.Sprintf("status %d", resp.StatusCode), nil)
					continue
				}
				record("", nil)
			}
		})
	}
	wg.Wait()
	return c
}

func lookTool(b testing.TB, name string) string {
	path, err := exec.LookPath(name)
	if err != nil {
		b.Fatalf("%s not found: tools/deps.sh bench installs it", name)
	}
	return path
}
