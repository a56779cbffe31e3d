package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// WaitReady polls url (draind's /healthz/ready) every period until it
// answers 200, or returns an error naming the last answer when timeout
// passes. Each request gets at most one period (and 1 s).
func WaitReady(ctx context.Context, url string, period, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{}
	var last string // the latest answer (or error), named when time runs out
	for {
		rctx, rcancel := context.WithTimeout(ctx, min(period, time.Second))
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
		if err != nil {
			rcancel()
			return fmt.Errorf("readiness url %q: %w", url, err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rcancel()
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, trimBody(body))
		} else {
			last = err.Error()
		}
		rcancel()
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: last answer from %s: %s", timeout, url, last)
		case <-time.After(period):
		}
	}
}

func trimBody(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return string(b)
}
