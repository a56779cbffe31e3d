package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of a Client.
const (
	DefaultTimeout = time.Second
	DefaultMaxBody = 4 << 20
	DefaultRetries = 2
	DefaultBackoff = 50 * time.Millisecond

	maxBackoff = time.Second
)

// Client calls one Envoy's admin API. It is safe for concurrent use.
type Client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
	maxBody int64
	retries int
	backoff time.Duration

	mu      sync.Mutex
	exclude ExcludeSet
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout sets how long one call may take, retries included (default
// 1 s). Zero or less means no timeout of the client's own: only the
// caller's context bounds the call.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithMaxBody sets the largest answer body read (default 4 MiB); a larger
// one is an error.
func WithMaxBody(n int64) Option {
	return func(c *Client) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithHTTPClient replaces the HTTP client (its Timeout, if any, applies per
// attempt on top of the call's timeout).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithRetries sets how many times a transient failure is retried after the
// first attempt (default 2); 0 disables retries.
func WithRetries(n int) Option {
	return func(c *Client) {
		if n >= 0 {
			c.retries = n
		}
	}
}

// WithBackoff sets the first wait between attempts (default 50 ms); it
// doubles on each retry, up to 1 s, with jitter.
func WithBackoff(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.backoff = d
		}
	}
}

// WithExclude sets the listeners ActiveDownstream and DownstreamGauges
// leave out (default [DefaultExclude]: 15020, 15021, 15090).
func WithExclude(e ExcludeSet) Option { return func(c *Client) { c.exclude = e } }

// SetExclude replaces the listeners ActiveDownstream and DownstreamGauges
// leave out (e.g. once names are resolved with [ExcludeSet.Resolve]).
func (c *Client) SetExclude(e ExcludeSet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exclude = e
}

// Exclude returns the listeners ActiveDownstream and DownstreamGauges leave out.
func (c *Client) Exclude() ExcludeSet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exclude
}

// New returns a client for the admin API at addr, "127.0.0.1:15000" or
// "[::1]:15000" (an "http://" URL is accepted too).
func New(addr string, opts ...Option) *Client {
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	c := &Client{
		base:    strings.TrimRight(base, "/"),
		timeout: DefaultTimeout,
		maxBody: DefaultMaxBody,
		retries: DefaultRetries,
		backoff: DefaultBackoff,
		exclude: DefaultExclude(),
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // the admin API is local: never through a proxy
			DialContext:         (&net.Dialer{KeepAlive: -1}).DialContext,
			MaxIdleConns:        2,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		}}
	}
	return c
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// request describes one admin call.
type request struct {
	method string
	path   string
	query  string
	// repeatable marks a request safe to send again after a reset or a cut
	// answer (the request may have reached Envoy). Dial failures are always
	// retried.
	repeatable bool
	// accept lists the status codes handed back to the caller; nil means
	// 200 only. Others become a StatusError.
	accept []int
}

func (r request) accepts(code int) bool {
	if r.accept == nil {
		return code == http.StatusOK
	}
	for _, a := range r.accept {
		if a == code {
			return true
		}
	}
	return false
}

// do runs a call, with retries, inside the call's timeout.
func (c *Client) do(ctx context.Context, r request) (int, []byte, error) {
	parent := ctx
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	wait := c.backoff
	for attempt := 0; ; attempt++ {
		code, body, err := c.once(ctx, parent, r)
		if err == nil || attempt >= c.retries || !retryable(err, r) {
			return code, body, err
		}
		d := wait/2 + rand.N(wait/2+1)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
			return code, body, err // no time left for another attempt
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			if perr := parent.Err(); perr != nil {
				// The parent's end is the cause callers match; the last
				// attempt's error is only told.
				return code, body, fmt.Errorf("envoy admin: %s %s: %w (after: %v)", r.method, r.path, perr, err) //nolint:errorlint // see above
			}
			return code, body, err
		case <-t.C:
		}
		wait = min(2*wait, maxBackoff)
	}
}

// once is one attempt.
func (c *Client) once(ctx, parent context.Context, r request) (int, []byte, error) {
	u := c.base + r.path
	if r.query != "" {
		u += "?" + r.query
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("envoy admin: %s %s: %w", r.method, r.path, err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, c.transportError(parent, r, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		return 0, nil, c.transportError(parent, r, err)
	}
	if int64(len(body)) > c.maxBody {
		return 0, nil, fmt.Errorf("envoy admin: %s %s: answer larger than %d bytes", r.method, r.path, c.maxBody)
	}
	if !r.accepts(resp.StatusCode) {
		return resp.StatusCode, body, &StatusError{Method: r.method, Path: r.path, Code: resp.StatusCode, Body: truncate(body, maxErrorBody)}
	}
	return resp.StatusCode, body, nil
}

func (c *Client) transportError(parent context.Context, r request, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if perr := parent.Err(); perr != nil {
		// The caller gave up: that says nothing about Envoy.
		return fmt.Errorf("envoy admin: %s %s: %w", r.method, r.path, perr)
	}
	if errors.Is(err, context.DeadlineExceeded) && c.timeout > 0 {
		err = fmt.Errorf("no answer within %v: %w", c.timeout, err)
	}
	return &UnreachableError{Method: r.method, Path: r.path, Err: err}
}

// retryable tells whether err is worth another attempt.
func retryable(err error, r request) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500
	}
	var ue *UnreachableError
	if !errors.As(err, &ue) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) {
		return true // the request never left
	}
	return r.repeatable
}
