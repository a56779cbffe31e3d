package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/cri"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
)

func TestDraindStatusAddr(t *testing.T) {
	dir := t.TempDir()
	annos := filepath.Join(dir, "annotations")
	if err := os.WriteFile(annos, []byte("status.sidecar.istio.io/port=\"15022\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(dir, "none")
	tests := []struct {
		name            string
		args, env       []string
		annotations     string
		wantAddr, wantF string
		wantOK          bool
	}{
		{name: "the image's entrypoint", args: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoy", "-c", "x"},
			wantAddr: "127.0.0.1:15020", wantF: "default", wantOK: true},
		{name: "flag", args: []string{"draind", "run", "--status-addr", ":15099", "--", "envoy"}, wantAddr: "127.0.0.1:15099", wantF: "--status-addr", wantOK: true},
		{name: "flag with =", args: []string{"draind", "run", "-status-addr=127.0.0.2:15021", "--", "envoy"}, wantAddr: "127.0.0.2:15021", wantF: "--status-addr", wantOK: true},
		{name: "variable", args: []string{"draind", "run", "--", "envoy"}, env: []string{"PATH=/bin", "DRAIND_STATUS_ADDR=0.0.0.0:16000"},
			wantAddr: "127.0.0.1:16000", wantF: "DRAIND_STATUS_ADDR", wantOK: true},
		{name: "the flag beats the variable", args: []string{"draind", "run", "--status-addr=:1", "--", "envoy"}, env: []string{"DRAIND_STATUS_ADDR=:2"},
			wantAddr: "127.0.0.1:1", wantF: "--status-addr", wantOK: true},
		{name: "ipv6 any", args: []string{"draind", "run", "--status-addr", "[::]:15020", "--", "envoy"}, wantAddr: "[::1]:15020", wantF: "--status-addr", wantOK: true},
		{name: "an init wrapper first", args: []string{"/sbin/tini", "--", "/usr/local/bin/draind", "run", "--", "envoy"}, wantAddr: "127.0.0.1:15020", wantF: "default", wantOK: true},
		// Istio's injection template: draind run -- pilot-agent, with
		// PROXY_CONFIG: pilot-agent keeps 15020, draind takes 15022.
		{name: "istio template", args: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/pilot-agent", "proxy", "sidecar"},
			env: []string{`PROXY_CONFIG={"discoveryAddress":"istiod.istio-system.svc:15012"}`}, annotations: none,
			wantAddr: "127.0.0.1:15022", wantF: "beside pilot-agent", wantOK: true},
		{name: "istio without PROXY_CONFIG", args: []string{"draind", "run", "--", "pilot-agent", "proxy"}, annotations: none,
			wantAddr: "127.0.0.1:15022", wantF: "beside pilot-agent", wantOK: true},
		{name: "istio, pilot-agent's status port moved to 15022", args: []string{"draind", "run", "--", "pilot-agent", "proxy"},
			env: []string{"PROXY_CONFIG={}"}, annotations: annos, wantAddr: "127.0.0.1:15023", wantF: "beside pilot-agent", wantOK: true},
		{name: "--proxy pilot-agent", args: []string{"draind", "run", "--proxy", "pilot-agent", "--", "/opt/agent"}, annotations: none,
			wantAddr: "127.0.0.1:15022", wantF: "beside pilot-agent", wantOK: true},
		{name: "istio with the flag", args: []string{"draind", "run", "--status-addr", ":15030", "--", "pilot-agent"}, wantAddr: "127.0.0.1:15030", wantF: "--status-addr", wantOK: true},
		{name: "pilot-agent alone", args: []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"}},
		{name: "draind prestop is no draind run", args: []string{"draind", "prestop"}},
		{name: "draind alone", args: []string{"draind"}},
		{name: "another run", args: []string{"npm", "run", "start"}},
		{name: "no args"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := func() ([]byte, error) { return nil, nil }
			if tt.annotations != "" {
				read = func() ([]byte, error) { return istio.ReadAnnotationsFile(context.Background(), "", tt.annotations) }
			}
			addr, from, ok, err := draindStatusAddr(tt.args, tt.env, read)
			if err != nil || ok != tt.wantOK || addr != tt.wantAddr || !strings.Contains(from, tt.wantF) {
				t.Errorf("= %q, %q, %v; want %q, %q, %v", addr, from, ok, tt.wantAddr, tt.wantF, tt.wantOK)
			}
		})
	}
}

// The variable istio.RunArgs reads for --status-addr is the flag's own
// twin.
func TestStatusAddrEnvIsTheTwin(t *testing.T) {
	if got := envName("status-addr"); got != istio.StatusAddrEnv {
		t.Errorf("envName(status-addr) = %s, istio.StatusAddrEnv %s", got, istio.StatusAddrEnv)
	}
	if got := envName("proxy"); got != "DRAIND_PROXY" {
		t.Errorf("envName(proxy) = %s", got)
	}
}

func TestFindDraind(t *testing.T) {
	cs := []cri.Container{
		{Name: "app", Args: []string{"/usr/local/bin/testapp"}},
		{Name: "envoy", Args: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoy"}, Env: []string{"DRAIND_STATUS_ADDR=:15021"}},
	}
	got, err := findDraind(context.Background(), cs)
	if err != nil || got == nil || *got != (draindRef{Container: "envoy", StatusAddr: "127.0.0.1:15021", From: "DRAIND_STATUS_ADDR"}) {
		t.Errorf("findDraind = %+v", got)
	}
	if got, _ := findDraind(context.Background(), cs[:1]); got != nil {
		t.Errorf("no draind: %+v", got)
	}
}

func TestPodCells(t *testing.T) {
	ref := &draindRef{Container: "envoy", StatusAddr: "127.0.0.1:15020"}
	trig := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		row  podRow
		want [7]string
	}{
		{"ready", podRow{Namespace: "shop", Name: "web-1", Draind: ref, State: &agent.PodState{Phase: "ready", Holds: []agent.PodHold{}}},
			[7]string{"shop/web-1", "envoy:15020", "ready", "-", "-", "-", "-"}},
		{"gating, held by a request", podRow{Namespace: "shop", Name: "web-2", Draind: ref, State: &agent.PodState{
			Phase: "gating", Trigger: "SIGTERM", TriggeredAt: &trig, SinceTriggerMS: 3240, DeadlineInMS: 21760,
			Holds: []agent.PodHold{{Kind: "app-flows", What: "1 inbound flow: 198.18.64.1:40000 → 198.18.64.7:8080"}}}},
			[7]string{"shop/web-2", "envoy:15020", "gating", "SIGTERM", "3.2s", "21.8s", "app-flows: 1 inbound flow: 198.18.64.1:40000 → 198.18.64.7:8080"}},
		{"many holds, long text", podRow{Namespace: "a", Name: "b", Draind: ref, State: &agent.PodState{Phase: "gating", Trigger: "preStop", DeadlineInMS: -400,
			Holds: []agent.PodHold{{Kind: "app-procs", What: strings.Repeat("x", 100)}, {Kind: "app-flows", What: "2"}, {Kind: "envoy-active", What: "3"}, {Kind: "settle", What: "4"}}}},
			[7]string{"a/b", "envoy:15020", "gating", "preStop", "0s", "-400ms", "app-procs: " + strings.Repeat("x", 59) + "…; app-flows: 2; envoy-active: 3; +1 more"}},
		{"ended, cut", podRow{Namespace: "a", Name: "b", Draind: ref, State: &agent.PodState{Phase: "stopping", Trigger: "SIGTERM", SinceTriggerMS: 25000, DeadlineInMS: 0,
			End: &agent.PodEnd{Why: "deadline", TookMS: 25000, Cut: true, OpenFlows: 2, AppProcesses: 1}}},
			[7]string{"a/b", "envoy:15020", "stopping", "SIGTERM", "25s", "0s", "ended: deadline after 25s, cut by the deadline (2 flows, 1 app processes open)"}},
		{"hung", podRow{Namespace: "a", Name: "hung", Draind: ref, Error: "draind at 127.0.0.1:15020: no answer in 1s"},
			[7]string{"a/hung", "envoy:15020", "?", "-", "-", "-", "draind at 127.0.0.1:15020: no answer in 1s"}},
		{"no draind", podRow{Namespace: "a", Name: "plain", Flows: &flows.Summary{AppListeners: 1, AppInbound: 2}},
			[7]string{"a/plain", "-", "-", "-", "-", "-", "no draind: app listeners 1, inbound 2, outbound 0; proxy listeners 0, flows 0"}},
		{"host network", podRow{Namespace: "kube-system", Name: "proxy", HostNetwork: true},
			[7]string{"kube-system/proxy", "-", "-", "-", "-", "-", "no draind; host network (its flows are the node's)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := podCells(&tt.row); got != tt.want {
				t.Errorf("cells\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestWriteNodeView(t *testing.T) {
	v := nodeView{Time: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC), Runtime: "containerd 1.6.20", TimeoutMS: 1000,
		CRI: cri.Endpoint{Address: "unix:///run/containerd/containerd.sock", Why: "kubelet pid 7 --config /k.yaml containerRuntimeEndpoint"},
		Pods: []podRow{
			{Namespace: "a", Name: "web", Draind: &draindRef{Container: "envoy", StatusAddr: "127.0.0.1:15020"}, State: &agent.PodState{Phase: "ready"}},
			{Namespace: "b", Name: "hung", Draind: &draindRef{Container: "envoy", StatusAddr: "127.0.0.1:15020"}, Error: "draind at 127.0.0.1:15020: no answer in 1s"},
		}}
	var b bytes.Buffer
	if err := writeNodeView(&b, &v); err != nil {
		t.Fatal(err)
	}
	want := `10:00:00 pods on this node: 2 (containerd 1.6.20 at unix:///run/containerd/containerd.sock: kubelet pid 7 --config /k.yaml containerRuntimeEndpoint; each asked for at most 1s)
POD     DRAIND       PHASE  TRIGGER  SINCE  DEADLINE IN  HOLDS / FLOWS
a/web   envoy:15020  ready  -        -      -            -
b/hung  envoy:15020  ?      -        -      -            draind at 127.0.0.1:15020: no answer in 1s
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"phase":"ready"`, `"error":"draind at 127.0.0.1:15020: no answer in 1s"`, `"why":"kubelet pid 7`, `"timeout_ms":1000`} {
		if !bytes.Contains(j, []byte(s)) {
			t.Errorf("json has no %s: %s", s, j)
		}
	}
}

func TestPodUsageErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no.sock")
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"conns", "--pod", "web"}, nil, `conns: --pod "web": want NAMESPACE/NAME`},
		{[]string{"watch", "--pod", "a/b/c"}, nil, `watch: --pod "a/b/c": want NAMESPACE/NAME`},
		{[]string{"conns", "--pod", "a/b", "--pid", "1"}, nil, "conns: --pod is exclusive with --pid and --netns"},
		{[]string{"watch", "--pod", "a/b", "--netns", "/x"}, nil, "watch: --pod is exclusive with --pid and --netns"},
		{[]string{"conns", "--container", "envoy"}, nil, "conns: --container needs --pod"},
		{[]string{"conns", "--pod", "a/b", "--cri-endpoint", "tcp://127.0.0.1:1"}, nil, `conns: cri endpoint "tcp://127.0.0.1:1" (--cri-endpoint): a tcp endpoint`},
		{[]string{"conns", "--pod", "a/b", "--cri-endpoint", "unix://" + missing}, nil, "conns: cri endpoint unix://" + missing + " (--cri-endpoint): no container runtime"},
		{[]string{"watch", "--pod", "a/b"}, map[string]string{"CONTAINER_RUNTIME_ENDPOINT": missing}, "watch: cri endpoint " + missing + " (CONTAINER_RUNTIME_ENDPOINT): no container runtime"},
		{[]string{"pods", "--cri-endpoint", missing}, nil, "pods: cri endpoint " + missing + " (--cri-endpoint): no container runtime"},
		{[]string{"pods", "--timeout", "0s", "--cri-endpoint", missing}, nil, "pods: --timeout must be positive"},
		{[]string{"pods", "extra"}, nil, `pods: unexpected argument "extra"`},
		{[]string{"pods", "-o", "yaml"}, nil, "must be one of table|json"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := exitCode(Run(context.Background(), tt.args, &out, &errb), &errb)
			if code != 2 || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errb.String(), tt.want)
			}
			if strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
				t.Errorf("error is not one line: %q", errb.String())
			}
		})
	}
}

func TestPodsWatchFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 0}, {[]string{"-w"}, time.Second}, {[]string{"--watch"}, time.Second}, {[]string{"-w", "250ms"}, 250 * time.Millisecond},
		{[]string{"--watch=3s", "-o", "json"}, 3 * time.Second}, {[]string{"-w", "-o", "json"}, time.Second},
	} {
		fs, o := podsFlags(&bytes.Buffer{})
		if err := fs.parse(tt.args); err != nil || o.every != tt.want {
			t.Errorf("%q: %v, %v; want %v", tt.args, o.every, err, tt.want)
		}
	}
}

// TestProbeAllLeavesStuckProbes: a probe that ignores its deadline (a
// system call a hung filesystem never returns from) costs the view its
// timeout and a mark, and holds neither the view nor, at a signal, its
// return; the other pods are read.
func TestProbeAllLeavesStuckProbes(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	pods := []cri.Pod{{Namespace: "a", Name: "stuck"}, {Namespace: "a", Name: "ok"}}
	probe := func(_ context.Context, p *cri.Pod) podRow {
		if p.Name == "stuck" {
			<-stuck // ignores its context
		}
		return podRow{Namespace: p.Namespace, Name: p.Name, HostNetwork: true}
	}
	rows, err := probeAll(context.Background(), pods, 50*time.Millisecond, probe)
	if err != nil || len(rows) != 2 || rows[0].Name != "stuck" || rows[0].Error != "no answer in 50ms" || rows[1].Name != "ok" || rows[1].Error != "" {
		t.Fatalf("rows %+v, %v; want stuck marked, ok read", rows, err)
	}
	// A signal (ctx cancelled) while a probe is stuck, with a timeout
	// that would not end before the test's: probeAll returns.
	ctx, cancel := context.WithCancel(context.Background())
	entered := make(chan struct{})
	go func() {
		<-entered
		cancel()
	}()
	rows, err = probeAll(ctx, pods[:1], time.Hour, func(ctx context.Context, p *cri.Pod) podRow {
		close(entered)
		return probe(ctx, p)
	})
	if !errors.Is(err, context.Canceled) || rows != nil {
		t.Errorf("cancelled: %+v, %v; want context.Canceled", rows, err)
	}
}
