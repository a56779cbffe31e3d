package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/envoy"
)

// The parts a machine needs to run a drain to its end: no flows, a live
// admin API, a proxy that exits when asked.
type (
	quietFlows struct{ changed chan struct{} }
	liveAdmin  struct{ p *stopProxy } // quit: the proxy exits
	stopProxy  struct {
		once   sync.Once
		exited chan struct{}
	}
)

func (f quietFlows) Changed() <-chan struct{}                   { return f.changed }
func (quietFlows) Observe() drain.FlowView                      { return drain.FlowView{} }
func (quietFlows) Refresh() error                               { return nil }
func (quietFlows) Holding() []drain.OpenFlow                    { return nil }
func (liveAdmin) Live(context.Context) (bool, string)           { return true, "" }
func (liveAdmin) DrainListeners(context.Context, bool) error    { return nil }
func (liveAdmin) ActiveDownstream(context.Context) (int, error) { return 0, nil }
func (liveAdmin) Gauges(context.Context) (bool, error)          { return true, nil }
func (a liveAdmin) Quit(context.Context) error                  { return nil }
func (p *stopProxy) Exited() <-chan struct{}                    { return p.exited }
func (p *stopProxy) Signal(syscall.Signal) error                { p.once.Do(func() { close(p.exited) }); return nil }
func (p *stopProxy) ExitCode() int                              { return 0 }
func (p *stopProxy) ExitDescription() string                    { return "exited with code 0" }
func newStopProxy() *stopProxy                                  { return &stopProxy{exited: make(chan struct{})} }

func testMachine(p *stopProxy) *drain.Machine {
	cfg := drain.DefaultConfig()
	cfg.MinDrain = 0
	return drain.New(cfg, drain.Parts{Flows: quietFlows{make(chan struct{})}, Admin: liveAdmin{p}, Proxy: p})
}

// What is asked for while the eBPF objects load reaches the machine once
// it is built: a SIGTERM during start-up drains, a quit stops.
func TestEarlyControlsReachTheMachine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		before    []drain.Cause // drain.CauseNone: quit
		after     drain.Cause
		wantCause drain.Cause
	}{
		{"signal while starting", []drain.Cause{drain.CauseSignal}, -1, drain.CauseSignal},
		// A native sidecar's hook: the drain ends with the kubelet's SIGTERM.
		{"prestop while starting", []drain.Cause{drain.CausePreStop}, drain.CauseSignal, drain.CausePreStop},
		{"quit while starting", []drain.Cause{drain.CauseNone}, -1, drain.CauseNone},
		{"first trigger wins", []drain.Cause{drain.CausePOST, drain.CauseSignal}, -1, drain.CausePOST},
		{"signal after attach", nil, drain.CauseSignal, drain.CauseSignal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each drain takes the machine's fixed steps (2 s)
			var e earlyControls
			for _, c := range tc.before {
				e.trigger(c)
			}
			if m, _ := e.machine(); m != nil {
				t.Fatal("machine before attach")
			}
			if got := e.asked(); got != (len(tc.before) > 0) {
				t.Fatalf("asked = %v", got)
			}
			p := newStopProxy()
			m := testMachine(p)
			e.attach(m, http.NotFoundHandler())
			if tc.after >= 0 {
				e.trigger(tc.after)
			}
			done := make(chan drain.Result, 1)
			go func() { done <- m.Run(context.Background()) }()
			select {
			case res := <-done:
				if got := m.Cause(); got != tc.wantCause {
					t.Errorf("cause %v, want %v (result %+v)", got, tc.wantCause, res)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the machine never ended: the queued request was lost")
			}
		})
	}
}

// Readiness before the machine exists: Envoy LIVE is enough, unless a
// drain was asked for, --app-ports needs the tracker or --exit-with-app
// the app's process source (a Job's app gated on it must be watched).
func TestReadinessBeforeTheMachine(t *testing.T) {
	live := "server.state: 0\nlistener_manager.workers_started: 1\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(live))
	}))
	defer srv.Close()
	client := envoy.New(strings.TrimPrefix(srv.URL, "http://"))
	defer client.CloseIdleConnections()

	for _, tc := range []struct {
		name     string
		stats    string
		appPorts []uint16
		exitWith drain.ExitWithApp
		asked    bool
		ok       bool
		why      string
	}{
		{"envoy live", live, nil, "", false, true, ""},
		{"envoy initializing", "server.state: 3\nlistener_manager.workers_started: 0\n", nil, "", false, false, "envoy state INITIALIZING"},
		{"drain asked", live, nil, "", true, false, "draining"},
		{"app ports need the tracker", live, []uint16{8080}, "", false, false, "starting: the tracker is not open yet (--app-ports)"},
		{"exit-with-app off", live, nil, drain.ExitWithAppOff, false, true, ""},
		{"exit-with-app needs the app's process source", live, nil, drain.ExitWithAppSuccess, false, false, "starting: the app's process source is not open yet (--exit-with-app)"},
		{"exit-with-app any too", live, nil, drain.ExitWithAppAny, false, false, "starting: the app's process source is not open yet (--exit-with-app)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live = tc.stats
			a := &agent{probeAdmin: adminView{c: client}, cfg: Config{AppPorts: tc.appPorts}}
			a.cfg.Drain.ExitWithApp = tc.exitWith
			if tc.asked {
				a.early.trigger(drain.CauseSignal)
			}
			ok, why := a.readiness(context.Background())
			if ok != tc.ok || why != tc.why {
				t.Errorf("readiness = %v %q, want %v %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}
