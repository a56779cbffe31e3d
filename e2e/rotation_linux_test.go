package e2e

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// Issue 31's acceptance cases 1, 2 and 4 in the pod harness: a gateway
// (--gateway, envoysim's listener 15006 to the remote's upstream), its
// clients in the remote namespace opening a new connection per request,
// and --min-drain auto deciding when the gateway stops accepting.

// clients open a new connection every period and send one request on it,
// each in its own goroutine so that a slow one delays none.
type clients struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	last       time.Time // the last connection opened
	firstErr   error
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startClients(p *pod, period time.Duration) *clients {
	c := &clients{stop: make(chan struct{})}
	c.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tk.C:
			}
			c.mu.Lock()
			c.last = time.Now()
			c.mu.Unlock()
			c.wg.Go(func() {
				hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 5 * time.Second}
				resp, err := hc.Get("http://" + podIP + ":15006/")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = &statusErr{resp.StatusCode}
					}
				}
				if err != nil {
					c.failed.Add(1)
					c.mu.Lock()
					if c.firstErr == nil {
						c.firstErr = err
					}
					c.mu.Unlock()
					return
				}
				c.ok.Add(1)
			})
		}
	})
	return c
}

type statusErr struct{ code int }

func (e *statusErr) Error() string { return http.StatusText(e.code) }

// halt stops opening connections and waits for those in flight; it
// returns when the last was opened.
func (c *clients) halt() time.Time {
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// gatewayRotation runs one case: clients every period from before the
// trigger until stopAfter after it; it returns when the last connection
// was opened and when draind exited (the proxy stopped accepting before).
func gatewayRotation(t *testing.T, period, stopAfter time.Duration, args ...string) (p *pod, c *clients, last, exited time.Time) {
	p = newPod(t)
	// A gateway: one listener, to the remote's upstream.
	p.useSim(simConfig{Listeners: []simListener{
		{Name: "gateway", Address: "0.0.0.0:15006", Direction: "inbound", Protocol: "http", Upstream: remoteIP + ":9000"},
	}})
	p.startDraind(append([]string{"--gateway", "--min-drain", "auto"}, args...))
	c = startClients(p, period)
	// The rate before the trigger: at least two gaps' worth, and 2 s.
	time.Sleep(max(2*time.Second, 3*period))
	p.terminate()
	time.Sleep(stopAfter)
	last = c.halt()
	code, after := p.waitExit(30 * time.Second)
	exited = p.drainedAt.Add(after)
	if code != 0 {
		t.Fatalf("draind exited %d; log:\n%s", code, p.draindLog.String())
	}
	if n := c.failed.Load(); n != 0 || c.ok.Load() == 0 {
		t.Fatalf("%d connections failed (first: %v), %d ok; log:\n%s", n, c.firstErr, c.ok.Load(), p.draindLog.String())
	}
	if len(p.logLines(logevent.OutOfRotation)) != 1 {
		t.Fatalf("no out_of_rotation line; log:\n%s", p.draindLog.String())
	}
	return p, c, last, exited
}

// TestRotationGatewaySlowPropagation (acceptance 1): clients every 50 ms
// until 7 s after SIGTERM. No connection fails, and the proxy stops
// accepting no later than 1.5 s after the last one.
// In sock_diag mode (a connection shorter than the poll is never seen by
// the kernel's view) Envoy's counters, read every poll during the wait,
// count them.
func TestRotationGatewaySlowPropagation(t *testing.T) {
	for _, tracker := range []string{"ebpf", "sockdiag"} {
		t.Run(tracker, func(t *testing.T) {
			p, c, last, exited := gatewayRotation(t, 50*time.Millisecond, 7*time.Second, "--tracker", tracker)
			out := p.logLines(logevent.OutOfRotation)[0]
			if d := exited.Sub(last); d > 1500*time.Millisecond {
				t.Fatalf("draind exited %s after the last connection, want ≤ 1.5 s; out_of_rotation %v", d, out)
			}
			if out["why"] != "quiet" {
				t.Errorf("out of rotation by %v, want quiet; %v", out["why"], out)
			}
			t.Logf("%d connections; out of rotation %v (%v after %v connections); exited %s after the last connection",
				c.ok.Load(), out["took"], out["why"], out["connections"], exited.Sub(last))
		})
	}
}

// TestRotationGatewayFastPropagation (acceptance 2): the clients stop
// 0.3 s after SIGTERM; the proxy stops accepting no later than 1.5 s after
// SIGTERM.
func TestRotationGatewayFastPropagation(t *testing.T) {
	p, c, _, exited := gatewayRotation(t, 50*time.Millisecond, 300*time.Millisecond)
	out := p.logLines(logevent.OutOfRotation)[0]
	if d := exited.Sub(p.drainedAt); d > 1500*time.Millisecond {
		t.Fatalf("draind exited %s after SIGTERM, want ≤ 1.5 s; out_of_rotation %v", d, out)
	}
	t.Logf("%d connections; out of rotation %v (%v); exited %s after SIGTERM", c.ok.Load(), out["took"], out["why"], exited.Sub(p.drainedAt))
}

// TestRotationLowRate (acceptance 4): one request every 2 s before and
// after SIGTERM, stopping 5 s after it: the window grows with the gap, so
// none fails.
func TestRotationLowRate(t *testing.T) {
	p, c, last, exited := gatewayRotation(t, 2*time.Second, 5*time.Second)
	out := p.logLines(logevent.OutOfRotation)[0]
	if took, _ := time.ParseDuration(out["took"].(string)); took < 5*time.Second {
		t.Errorf("out of rotation %s after SIGTERM, before the clients stopped", took)
	}
	t.Logf("%d connections; out of rotation %v (%v, window %v); exited %s after the last connection", c.ok.Load(), out["took"], out["why"], out["window"], exited.Sub(last))
}
