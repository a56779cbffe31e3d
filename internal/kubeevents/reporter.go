package kubeevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
)

// Defaults: a drain posts two Events, so a queue of four holds a drain's
// and a second trigger's; a request that takes longer than
// DefaultRequestTimeout is one the drain will not miss.
const (
	DefaultQueueSize      = 4
	DefaultRequestTimeout = 3 * time.Second
	// EndWait is the longest wait for the last Event once the proxy has
	// stopped (Flush's caller also bounds it by the drain's deadline).
	EndWait = time.Second
)

// The "why" of a KubeEventsUnavailable line: stable words for scripts.
const (
	WhyNoAPIServer = "no-api-server"
	WhyNoToken     = "no-service-account-token"
	WhyConfig      = "service-account-files"
	WhyDenied      = "denied"
	WhyUnreachable = "unreachable"
)

// WhyUnavailable is LoadInCluster's error as a KubeEventsUnavailable why.
func WhyUnavailable(err error) string {
	switch {
	case errors.Is(err, ErrNoAPIServer):
		return WhyNoAPIServer
	case errors.Is(err, ErrNoToken):
		return WhyNoToken
	}
	return WhyConfig
}

// Config is what Start needs.
type Config struct {
	API InCluster
	// Pod is the Events' pod; its Namespace defaults to API.Namespace.
	Pod Pod
	// Log receives the package's lines (nil: none).
	Log *zap.Logger
	// QueueSize and RequestTimeout: 0 for the defaults.
	QueueSize      int
	RequestTimeout time.Duration
	// Transport, when set, replaces the one built from API.CAs (tests).
	Transport http.RoundTripper
}

// Reporter posts the drain's Events on the pod (a drain.Reporter). Its
// goroutine runs from Start to Close.
type Reporter struct {
	cfg    Config
	pod    Pod
	hc     *http.Client
	tokens *tokenSource
	log    *zap.Logger

	queue chan queued
	// mu orders enqueues (last is the latest queued's done).
	mu     sync.Mutex
	last   chan struct{}
	closed bool
	// off is set once the API server said no; nothing more is queued.
	off atomic.Bool

	pending, dropped, posted, failed atomic.Int64

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ drain.Reporter = (*Reporter)(nil)

type queued struct {
	text Text
	at   time.Time
	done chan struct{}
}

// Start starts the reporter's goroutine: it asks the API server whether
// the pod may create Events (bounded by the request timeout, never
// delaying a drain: what is queued meanwhile waits), then posts what is
// queued until Close.
func Start(cfg Config) *Reporter {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	pod := cfg.Pod
	if pod.Namespace == "" {
		pod.Namespace = cfg.API.Namespace
	}
	rt := cfg.Transport
	if rt == nil {
		rt = cfg.API.transport()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reporter{cfg: cfg, pod: pod, hc: &http.Client{Transport: rt}, log: cfg.Log,
		tokens: &tokenSource{file: cfg.API.TokenFile, last: cfg.API.Token},
		queue:  make(chan queued, cfg.QueueSize), cancel: cancel, done: make(chan struct{})}
	go r.run(ctx)
	return r
}

// Pod is the pod the Events are about.
func (r *Reporter) Pod() Pod { return r.pod }

// DrainBegan queues the start's Event. It never blocks.
func (r *Reporter) DrainBegan(st drain.State) { r.enqueue(BeganText(st), st.Triggered) }

// DrainEnded queues the end's Event. It never blocks.
func (r *Reporter) DrainEnded(st drain.State) { r.enqueue(EndedText(st), st.Since) }

// Dropped is how many Events found the queue full.
func (r *Reporter) Dropped() int64 { return r.dropped.Load() }

// Posted is how many Events the API server took; Failed how many it
// refused or did not answer.
func (r *Reporter) Posted() int64 { return r.posted.Load() }
func (r *Reporter) Failed() int64 { return r.failed.Load() }

func (r *Reporter) enqueue(t Text, at time.Time) {
	if r.off.Load() {
		return
	}
	if at.IsZero() {
		at = time.Now()
	}
	q := queued{text: t, at: at, done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	select {
	case r.queue <- q:
		r.last = q.done
		r.pending.Add(1)
	default:
		r.dropped.Add(1)
		r.log.Warn("kube event dropped: the queue is full", logevent.KubeEventPostFailed.Field(),
			zap.String("reason", t.Reason), zap.Int64("dropped", r.dropped.Load()))
	}
}

// Flush waits, at most wait, until every Event queued so far was posted
// (or failed), and says whether they all were.
func (r *Reporter) Flush(wait time.Duration) bool {
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if last == nil {
		return true
	}
	select {
	case <-last:
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-last:
		return true
	case <-r.done:
		select {
		case <-last:
			return true
		default:
			return false
		}
	case <-t.C:
		return false
	}
}

// Close stops the goroutine, cancelling a request in flight, and says
// how many Events were queued and never posted. Safe twice.
func (r *Reporter) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.cancel()
		<-r.done
		r.hc.CloseIdleConnections()
		var errs []error
		if n := r.pending.Load(); n > 0 {
			errs = append(errs, fmt.Errorf("kube events: %d queued and not posted", n))
		}
		if n := r.dropped.Load(); n > 0 {
			errs = append(errs, fmt.Errorf("kube events: %d dropped (queue full)", n))
		}
		r.closeErr = errors.Join(errs...)
	})
	return r.closeErr
}

func (r *Reporter) run(ctx context.Context) {
	defer close(r.done)
	ok := r.allowed(ctx)
	if ctx.Err() != nil {
		return // Close: what is queued stays counted as not posted
	}
	if !ok {
		r.off.Store(true)
		for {
			select {
			case q := <-r.queue:
				r.pending.Add(-1)
				close(q.done)
			default:
				return
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case q := <-r.queue:
			r.post(ctx, q)
			if ctx.Err() != nil {
				return // cut by Close: counted as not posted
			}
			r.pending.Add(-1)
			close(q.done)
		}
	}
}

// allowed asks the API server (a SelfSubjectAccessReview) whether the
// pod may create Events, and says so once when it may not or cannot be
// asked. Unreachable is not no: the drain's Events are still tried.
func (r *Reporter) allowed(ctx context.Context) bool {
	review := map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]string{
			"namespace": r.pod.Namespace, "verb": "create", "group": "", "resource": "events"}},
	}
	var answer struct {
		Status struct {
			Allowed bool   `json:"allowed"`
			Reason  string `json:"reason"`
		} `json:"status"`
	}
	err := r.call(ctx, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, &answer)
	var se *statusError
	switch {
	case ctx.Err() != nil:
		return false
	case errors.As(err, &se) && (se.code == http.StatusUnauthorized || se.code == http.StatusForbidden):
		r.unavailable(WhyDenied, "no Kubernetes Events: the API server refused the account", zap.Error(err))
		return false
	case err != nil:
		r.unavailable(WhyUnreachable, "Events permission unknown: the drain's are still tried", zap.Error(err))
		return true
	case !answer.Status.Allowed:
		fields := []zap.Field{zap.String("namespace", r.pod.Namespace)}
		if answer.Status.Reason != "" {
			fields = append(fields, zap.String("reason", answer.Status.Reason))
		}
		r.unavailable(WhyDenied, "no Kubernetes Events: the account may not create them", fields...)
		return false
	}
	return true
}

// unavailable says once why the pod gets no Events (detail: in words);
// what to do about each why is in docs/kubernetes.md ("What happens
// without it").
func (r *Reporter) unavailable(why, detail string, fields ...zap.Field) {
	r.log.Warn("no Kubernetes Events", append([]zap.Field{logevent.KubeEventsUnavailable.Field(), zap.String("why", why), zap.String("detail", detail)}, fields...)...)
}

// event is a core/v1 Event, the fields draind sets.
type event struct {
	APIVersion     string    `json:"apiVersion"`
	Kind           string    `json:"kind"`
	Metadata       objMeta   `json:"metadata"`
	InvolvedObject objRef    `json:"involvedObject"`
	Reason         string    `json:"reason"`
	Message        string    `json:"message"`
	Type           string    `json:"type"`
	FirstTimestamp string    `json:"firstTimestamp"`
	LastTimestamp  string    `json:"lastTimestamp"`
	Count          int       `json:"count"`
	Source         objSource `json:"source"`
	// ReportingComponent and ReportingInstance: the newer fields for
	// Source, which the events.k8s.io API reads.
	ReportingComponent string `json:"reportingComponent"`
	ReportingInstance  string `json:"reportingInstance,omitempty"`
}

type objMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type objRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	UID        string `json:"uid,omitempty"`
}

type objSource struct {
	Component string `json:"component"`
	Host      string `json:"host,omitempty"`
}

// Component is the Events' source: kubectl describe's "From".
const Component = "draind"

// newEvent is q as the Event posted. Its name is client-go's: the
// object's name and the time in hex, unique enough for one pod.
func (r *Reporter) newEvent(q queued) event {
	ts := q.at.UTC().Format(time.RFC3339)
	return event{
		APIVersion: "v1", Kind: "Event",
		Metadata:       objMeta{Name: fmt.Sprintf("%s.%x", r.pod.Name, q.at.UnixNano()), Namespace: r.pod.Namespace},
		InvolvedObject: objRef{APIVersion: "v1", Kind: "Pod", Name: r.pod.Name, Namespace: r.pod.Namespace, UID: r.pod.UID},
		Reason:         q.text.Reason, Message: q.text.Message, Type: q.text.Type,
		FirstTimestamp: ts, LastTimestamp: ts, Count: 1,
		Source:             objSource{Component: Component, Host: r.pod.Node},
		ReportingComponent: Component, ReportingInstance: r.pod.Name,
	}
}

func (r *Reporter) post(ctx context.Context, q queued) {
	err := r.call(ctx, "/api/v1/namespaces/"+url.PathEscape(r.pod.Namespace)+"/events", r.newEvent(q), nil)
	if err != nil {
		if ctx.Err() != nil {
			return // Close: the caller counts what was not posted
		}
		r.failed.Add(1)
		r.log.Warn("kube event not posted", logevent.KubeEventPostFailed.Field(), zap.String("reason", q.text.Reason), zap.Error(err))
		return
	}
	r.posted.Add(1)
}

// statusError is an API server's answer other than 2xx.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return fmt.Sprintf("%d %s", e.code, e.msg) }

// call POSTs body as JSON to the API server, bounded by the request
// timeout, and decodes a 2xx answer into out (nil: ignored).
func (r *Reporter) call(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.API.Server+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "draind")
	if tok := r.tokens.token(); len(tok) > 0 {
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		// A metav1.Status says why in its message.
		var st struct {
			Message string `json:"message"`
		}
		msg := strings.TrimSpace(string(answer))
		if json.Unmarshal(answer, &st) == nil && st.Message != "" {
			msg = st.Message
		}
		if len(msg) > 300 {
			msg = msg[:300]
		}
		return fmt.Errorf("POST %s: %w", path, &statusError{code: resp.StatusCode, msg: msg})
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("POST %s: answer: %w", path, err)
	}
	return nil
}
