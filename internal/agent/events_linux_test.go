package agent

import (
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/draind/draind/internal/kubeevents"
	"github.com/draind/draind/internal/logevent"
)

// draind run's Events at start: off says so, no cluster warns once and
// naming why, a cluster starts the reporter for the pod the downward
// API's variables name.
func TestStartEvents(t *testing.T) {
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"allowed": true}})
	}))
	defer api.Close()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("tok"), 0o600)
	os.WriteFile(filepath.Join(dir, "namespace"), []byte("shop"), 0o600)
	os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw}), 0o600)
	u, _ := url.Parse(api.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	inCluster := map[string]string{kubeevents.ServiceHostEnv: host, kubeevents.ServicePortEnv: port,
		kubeevents.PodNameEnv: "web-1", kubeevents.NodeNameEnv: "node-a"}

	for _, tc := range []struct {
		name    string
		mode    EventsMode
		env     map[string]string
		started bool
		warn    string // the kube_events_unavailable why, or ""
	}{
		{"off", EventsOff, inCluster, false, ""},
		{"no cluster", EventsAuto, map[string]string{}, false, kubeevents.WhyNoAPIServer},
		{"in a cluster", EventsAuto, inCluster, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			a := &agent{log: zap.New(core), cfg: Config{Events: tc.mode, ServiceAccountDir: dir,
				LookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }}}
			r := a.startEvents()
			if (r != nil) != tc.started {
				t.Fatalf("reporter %v, want started %v", r != nil, tc.started)
			}
			if r != nil {
				defer r.Close()
				if p := r.Pod(); p != (kubeevents.Pod{Name: "web-1", Namespace: "shop", Node: "node-a"}) {
					t.Errorf("pod %+v", p)
				}
				// No POD_UID: posted, but kubectl describe will not list
				// them; said at start.
				if n := logs.FilterField(logevent.KubeEvents.Field()).FilterMessageSnippet(kubeevents.PodUIDEnv).Len(); n != 1 {
					t.Errorf("%d lines about %s, want 1", n, kubeevents.PodUIDEnv)
				}
			}
			warned := logs.FilterField(logevent.KubeEventsUnavailable.Field()).All()
			switch {
			case tc.warn == "" && len(warned) != 0:
				t.Errorf("warned %v", warned)
			case tc.warn != "" && (len(warned) != 1 || warned[0].ContextMap()["why"] != tc.warn):
				t.Errorf("warnings %v, want one why=%s", warned, tc.warn)
			}
			if tc.mode == EventsOff && logs.FilterField(logevent.KubeEvents.Field()).Len() != 1 {
				t.Error("--events off not said")
			}
		})
	}
}
