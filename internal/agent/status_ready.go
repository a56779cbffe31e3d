package agent

import (
	"context"
	"sync"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
)

// readyFlight shares one readiness check among the probes that arrive
// while it runs (singleflight): each check is an admin call, and a
// hundred probes at once against an admin API answering large bodies
// took draind from 46 to 119 MB (issue 43). Nothing is kept once the
// check is done: the next probe asks again.
type readyFlight struct {
	mu  sync.Mutex
	cur *readyCheck
}

type readyCheck struct {
	done chan struct{}
	ok   bool
	why  string
}

// readyCheckTimeout bounds a shared check: its calls have their own
// timeouts (the admin call's and pilot-agent's, 1 s each), and it no
// longer ends with the probe that began it.
const readyCheckTimeout = 3 * time.Second

// do runs check, or waits for the one running. The first caller runs it
// on its own goroutine (no other is started), under a context detached
// from its request: a probe that leaves must not fail those waiting on
// its check. A caller that leaves stops waiting.
func (f *readyFlight) do(ctx context.Context, check func(context.Context) (bool, string)) (bool, string) {
	f.mu.Lock()
	if c := f.cur; c != nil {
		f.mu.Unlock()
		select {
		case <-c.done:
			return c.ok, c.why
		case <-ctx.Done():
			return false, "probe gone: " + ctx.Err().Error()
		}
	}
	c := &readyCheck{done: make(chan struct{})}
	f.cur = c
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyCheckTimeout)
	defer cancel()
	c.ok, c.why = check(cctx)
	f.mu.Lock()
	f.cur = nil
	f.mu.Unlock()
	close(c.done)
	return c.ok, c.why
}

// draining reports whether the drain has begun, or was asked for before the
// machine took it up (what readiness reads first, without a call).
func (a *agent) draining() (string, bool) {
	if m, _ := a.early.machine(); m != nil {
		if p := m.Phase(); p != drain.Ready && p != drain.Starting {
			return p.String(), true
		}
	}
	if a.early.asked() {
		return "draining", true
	}
	return "", false
}

// probeAdminMaxBody bounds an admin answer to a readiness probe: the two
// gauges of a filtered GET /stats, or GET /ready's state name, are tens
// of bytes; an impersonator's megabytes are refused, not read.
const probeAdminMaxBody = 16 << 10

// newProbeAdmin is the readiness probes' admin client: one attempt (a
// probe wants the answer now, the kubelet asks again), 1 s, and a small
// body limit.
func newProbeAdmin(addr string) *envoy.Client {
	return envoy.New(addr, envoy.WithTimeout(time.Second), envoy.WithRetries(0), envoy.WithMaxBody(probeAdminMaxBody))
}
