package istio

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Readiness asks pilot-agent's own readiness (GET /healthz/ready
// on its status port, over loopback): Envoy got its first CDS and LDS from
// istiod, went LIVE with its workers started, and Istio's DNS proxy is
// ready. draind's readiness adds it to its own under pilot-agent, so that
// the probe moved to draind's status port (deploy/istio) says no less than
// Istio's did, and 503 from the drain's first moment, which Istio's does
// not (pilot-agent keeps answering 200 until its own SIGTERM, which
// draind sends only at the very end, if ever).
type Readiness struct {
	url string
	c   *http.Client
}

// NewReadiness asks pilot-agent's readiness on its status port.
func NewReadiness(statusPort uint16) *Readiness {
	return &Readiness{
		url: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(statusPort))) + "/healthz/ready",
		c:   &http.Client{Timeout: time.Second, Transport: &http.Transport{MaxIdleConns: 1, IdleConnTimeout: 30 * time.Second}},
	}
}

// Ready is one probe: true on a 200, else why not.
func (r *Readiness) Ready(ctx context.Context) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return false, "pilot-agent readiness: " + err.Error()
	}
	resp, err := r.c.Do(req)
	if err != nil {
		return false, "pilot-agent readiness: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return true, ""
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return false, fmt.Sprintf("pilot-agent not ready: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}

// Close drops its idle connection.
func (r *Readiness) Close() error {
	r.c.CloseIdleConnections()
	return nil
}
