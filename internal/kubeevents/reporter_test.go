package kubeevents

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
)

// fakeAPI is an API server over TLS: it answers the access review with
// allow, and records the Events posted and the tokens each request bore.
type fakeAPI struct {
	*httptest.Server
	allow bool
	mu    sync.Mutex
	paths []string
	auth  []string
	posts []event
}

func newFakeAPI(t *testing.T, allow bool) *fakeAPI {
	f := &fakeAPI{allow: allow}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
			var rev struct {
				Spec struct {
					ResourceAttributes map[string]string `json:"resourceAttributes"`
				} `json:"spec"`
			}
			json.NewDecoder(r.Body).Decode(&rev)
			ra := rev.Spec.ResourceAttributes
			ok := f.allow && ra["verb"] == "create" && ra["resource"] == "events" && ra["namespace"] == "shop"
			json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"allowed": ok, "reason": "no RBAC policy matched"}})
		case "/api/v1/namespaces/shop/events":
			var ev event
			if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			f.posts = append(f.posts, ev)
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(ev)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) got() (paths, auth []string, posts []event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.paths...), append([]string(nil), f.auth...), append([]event(nil), f.posts...)
}

// serviceAccount writes the files the kubelet mounts and returns the
// directory and the variables for f.
func serviceAccount(t *testing.T, f *fakeAPI, token string) (string, func(string) (string, bool)) {
	t.Helper()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
	for name, content := range map[string][]byte{"token": []byte(token + "\n"), "ca.crt": ca, "namespace": []byte("shop")} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u, _ := url.Parse(f.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	env := map[string]string{ServiceHostEnv: host, ServicePortEnv: port}
	return dir, func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func drainStates() (began, ended drain.State) {
	t0 := time.Now()
	began = drain.State{Phase: drain.Draining, Cause: drain.CauseSignal, Shape: drain.ShapeClassicSidecar, Triggered: t0, Deadline: t0.Add(22 * time.Second), Since: t0}
	ended = began
	ended.Phase, ended.Since = drain.Exited, t0.Add(3*time.Second)
	ended.Held = []drain.HeldFor{{Kind: drain.HoldAppProcs, For: 3 * time.Second}}
	ended.End = &drain.StateEnd{Why: "drained", Clean: true, Took: 3 * time.Second, ExitCodeKnown: true}
	return began, ended
}

func TestLoadInCluster(t *testing.T) {
	f := newFakeAPI(t, true)
	dir, lookup := serviceAccount(t, f, "tok")
	ic, err := LoadInCluster(lookup, dir)
	if err != nil {
		t.Fatal(err)
	}
	if ic.Server != f.URL || string(ic.Token) != "tok" || ic.Namespace != "shop" || ic.TokenFile != filepath.Join(dir, "token") {
		t.Errorf("loaded %+v", ic)
	}
	if _, err := LoadInCluster(func(string) (string, bool) { return "", false }, dir); !errors.Is(err, ErrNoAPIServer) || WhyUnavailable(err) != WhyNoAPIServer {
		t.Errorf("no host: %v", err)
	}
	os.Remove(filepath.Join(dir, "token"))
	if _, err := LoadInCluster(lookup, dir); !errors.Is(err, ErrNoToken) || WhyUnavailable(err) != WhyNoToken {
		t.Errorf("no token: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "token"), []byte("tok"), 0o600)
	os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("not a certificate"), 0o600)
	if _, err := LoadInCluster(lookup, dir); err == nil || WhyUnavailable(err) != WhyConfig {
		t.Errorf("bad CA: %v", err)
	}
}

func TestPodFromEnv(t *testing.T) {
	env := map[string]string{PodNameEnv: "web-1", PodNamespaceEnv: "shop", PodUIDEnv: "u-1", IstioNodeNameEnv: "node-a"}
	p := PodFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if p != (Pod{Name: "web-1", Namespace: "shop", UID: "u-1", Node: "node-a"}) {
		t.Errorf("pod %+v", p)
	}
	env[NodeNameEnv] = "node-b"
	if p := PodFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); p.Node != "node-b" {
		t.Errorf("NODE_NAME must win over Istio's: %q", p.Node)
	}
}

// The token and the CA of the service account are what the requests use:
// the server's certificate is trusted only through ca.crt, every request
// bears the token, read again after the kubelet rotated it.
func TestReporterPosts(t *testing.T) {
	f := newFakeAPI(t, true)
	dir, lookup := serviceAccount(t, f, "tok-1")
	ic, err := LoadInCluster(lookup, dir)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	r := Start(Config{API: ic, Pod: Pod{Name: "web-1", UID: "u-1", Node: "node-a"}, Log: zap.New(core)})
	defer r.Close()
	began, ended := drainStates()
	r.DrainBegan(began)
	if !r.Flush(5 * time.Second) {
		t.Fatal("the start's Event not posted")
	}
	os.WriteFile(filepath.Join(dir, "token"), []byte("tok-2"), 0o600) // rotated
	r.DrainEnded(ended)
	if !r.Flush(5 * time.Second) {
		t.Fatal("the end's Event not posted")
	}
	paths, auth, posts := f.got()
	want := []string{"POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "POST /api/v1/namespaces/shop/events", "POST /api/v1/namespaces/shop/events"}
	if strings.Join(paths, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests %q, want %q", paths, want)
	}
	if strings.Join(auth, ",") != "Bearer tok-1,Bearer tok-1,Bearer tok-2" {
		t.Errorf("tokens %q", auth)
	}
	if len(posts) != 2 {
		t.Fatalf("%d Events", len(posts))
	}
	for i, want := range []Text{BeganText(began), EndedText(ended)} {
		ev := posts[i]
		if ev.Type != want.Type || ev.Reason != want.Reason || ev.Message != want.Message {
			t.Errorf("Event %d: %s %s %q, want %+v", i, ev.Type, ev.Reason, ev.Message, want)
		}
		io := ev.InvolvedObject
		if io != (objRef{APIVersion: "v1", Kind: "Pod", Name: "web-1", Namespace: "shop", UID: "u-1"}) || ev.Metadata.Namespace != "shop" ||
			!strings.HasPrefix(ev.Metadata.Name, "web-1.") || ev.Source != (objSource{Component: "draind", Host: "node-a"}) || ev.Count != 1 || ev.FirstTimestamp == "" {
			t.Errorf("Event %d: %+v", i, ev)
		}
	}
	if r.Posted() != 2 || r.Failed() != 0 || r.Dropped() != 0 {
		t.Errorf("posted %d failed %d dropped %d", r.Posted(), r.Failed(), r.Dropped())
	}
	if n := logs.FilterFieldKey(logevent.Key).Len(); n != 0 {
		t.Errorf("%d lines logged: %v", n, logs.All())
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// Denied: one warning naming why, and nothing posted.
func TestReporterDenied(t *testing.T) {
	f := newFakeAPI(t, false)
	dir, lookup := serviceAccount(t, f, "tok")
	ic, err := LoadInCluster(lookup, dir)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	r := Start(Config{API: ic, Pod: Pod{Name: "web-1", UID: "u-1"}, Log: zap.New(core)})
	began, ended := drainStates()
	r.DrainBegan(began)
	r.Flush(5 * time.Second)
	r.DrainEnded(ended)
	if !r.Flush(time.Second) {
		t.Error("Flush waited on a reporter the API server turned down")
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	paths, _, posts := f.got()
	if len(posts) != 0 || len(paths) != 1 {
		t.Errorf("requests %q after a denial", paths)
	}
	warned := logs.FilterField(logevent.KubeEventsUnavailable.Field()).All()
	if len(warned) != 1 || warned[0].ContextMap()["why"] != WhyDenied || warned[0].Level != zap.WarnLevel {
		t.Errorf("warnings %+v, want one kube_events_unavailable why=denied", warned)
	}
}

// hungTransport never answers: each request waits for its context.
type hungTransport struct{}

func (hungTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// A hung API server holds nothing: the machine's calls return at once,
// each request ends at its timeout, the end's wait at Flush's bound, and
// Close stops it all.
func TestReporterAPIHung(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		r := Start(Config{API: InCluster{Server: "https://10.0.0.1:443", Namespace: "shop"}, Pod: Pod{Name: "web-1"}, Log: zap.New(core),
			Transport: hungTransport{}, RequestTimeout: 2 * time.Second})
		began, ended := drainStates()
		t0 := time.Now()
		r.DrainBegan(began)
		if d := time.Since(t0); d != 0 {
			t.Errorf("DrainBegan took %s of the drain", d)
		}
		// The access review times out: unreachable is said once, and the
		// Events are still tried.
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		if w := logs.FilterField(logevent.KubeEventsUnavailable.Field()).All(); len(w) != 1 || w[0].ContextMap()["why"] != WhyUnreachable {
			t.Errorf("warnings %+v, want one why=unreachable", w)
		}
		t1 := time.Now()
		r.DrainEnded(ended)
		if d := time.Since(t1); d != 0 {
			t.Errorf("DrainEnded took %s", d)
		}
		if r.Flush(EndWait) {
			t.Error("Flush says a hung API server took the Events")
		}
		if d := time.Since(t1); d != EndWait {
			t.Errorf("Flush waited %s, want %s", d, EndWait)
		}
		t2 := time.Now()
		err := r.Close()
		if d := time.Since(t2); d != 0 {
			t.Errorf("Close waited %s for a hung request", d)
		}
		// The start's post began once the review timed out and was in
		// flight at Close: both Events are said lost, by Close.
		if err == nil || !strings.Contains(err.Error(), "2 queued and not posted") {
			t.Errorf("Close: %v, want the two Events not posted", err)
		}
		if r.Posted() != 0 || r.Failed() != 0 {
			t.Errorf("posted %d failed %d", r.Posted(), r.Failed())
		}
	})
}

// A full queue drops and counts; Close is safe twice, and a drain's call
// after it is a no-op.
func TestReporterQueueFullAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		r := Start(Config{API: InCluster{Server: "https://10.0.0.1:443", Namespace: "shop"}, Pod: Pod{Name: "web-1"}, Log: zap.New(core),
			Transport: hungTransport{}, QueueSize: 1, RequestTimeout: time.Minute})
		began, ended := drainStates()
		synctest.Wait() // the goroutine waits on the access review; the queue holds one
		r.DrainBegan(began)
		r.DrainEnded(ended)
		r.DrainEnded(ended)
		if r.Dropped() != 2 {
			t.Errorf("dropped %d, want 2", r.Dropped())
		}
		if n := logs.FilterField(logevent.KubeEventPostFailed.Field()).Len(); n != 2 {
			t.Errorf("%d drop lines, want 2", n)
		}
		err1 := r.Close()
		err2 := r.Close()
		if err1 == nil || !errors.Is(err1, err2) && err1.Error() != err2.Error() {
			t.Errorf("Close: %v, then %v", err1, err2)
		}
		if !strings.Contains(err1.Error(), "2 dropped") || !strings.Contains(err1.Error(), "1 queued and not posted") {
			t.Errorf("Close: %v", err1)
		}
		r.DrainEnded(ended) // after Close: nothing, no panic
		if r.Flush(time.Second) {
			t.Error("Flush after Close says posted")
		}
	})
}

// The reporter is stopped with the caller's context unused: Close cancels
// the request in flight (a context the test can see end).
func TestReporterCloseCancelsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		started := make(chan context.Context, 1)
		rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			started <- req.Context()
			<-req.Context().Done()
			return nil, req.Context().Err()
		})
		r := Start(Config{API: InCluster{Server: "https://10.0.0.1:443"}, Pod: Pod{Name: "web-1", Namespace: "shop"}, Transport: rt, RequestTimeout: time.Hour})
		ctx := <-started
		r.Close()
		if ctx.Err() == nil {
			t.Error("the request in flight outlived Close")
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
