package envoy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/testenv/envoysim"
)

// The listeners as envoysim's /listeners and /config_dump describe them:
// names, configured and bound ports, stat_prefix, traffic_direction
// (UNSPECIFIED left out, as proto3 JSON does).
func TestClientSimListeners(t *testing.T) {
	echo := echoServer(t)
	sim := startSim(t, envoysim.Config{Listeners: []envoysim.ListenerConfig{
		{Name: "in", Address: "127.0.0.1:0", Direction: "inbound", Upstream: echo},
		{Name: "out", Address: "127.0.0.1:0", Direction: "outbound", StatPrefix: "virtualOutbound", Upstream: echo},
		{Name: "metrics", Address: "127.0.0.1:0", StatPrefix: "prometheus_stats", Upstream: echo},
	}})
	c := envoy.New(sim.AdminAddr())
	ls, err := c.Listeners(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	port := func(name string) uint16 { return portOf(t, sim.ListenerAddr(name)) }
	want := []envoy.Listener{
		{Name: "in", Port: port("in"), Direction: "INBOUND"},
		{Name: "metrics", Port: port("metrics"), StatPrefix: "prometheus_stats"},
		{Name: "out", Port: port("out"), StatPrefix: "virtualOutbound", Direction: "OUTBOUND"},
	}
	if len(ls) != len(want) {
		t.Fatalf("listeners %+v", ls)
	}
	for i, l := range ls {
		w := want[i]
		if l.Name != w.Name || l.Port != w.Port || l.StatPrefix != w.StatPrefix || l.Direction != w.Direction ||
			l.Address.String() != "127.0.0.1:0" || l.Inbound() != (w.Direction == "INBOUND") {
			t.Errorf("listener %d: %+v, want %+v with the configured address 127.0.0.1:0", i, l, w)
		}
	}
	// Envoy names a port-0 listener's scope by its configured address.
	if s := ls[0].StatScope(); s != "127.0.0.1_0" {
		t.Errorf("stat scope %q, want 127.0.0.1_0", s)
	}

	// By listener name or by stat_prefix: the bound port for the kernel,
	// the stat scope for the admin sum; an unknown name is kept.
	ex := envoy.ExcludeSet{Ports: []uint16{15090}, Names: []string{"metrics", "virtualOutbound", "nope"}}
	got, unmatched := ex.Resolve(ls)
	if !slices.Equal(got.Ports, []uint16{15090, port("metrics"), port("out")}) ||
		!slices.Equal(got.Names, []string{"metrics", "virtualOutbound", "nope", "prometheus_stats"}) ||
		!slices.Equal(unmatched, []string{"nope"}) {
		t.Errorf("resolved %v, unmatched %v", got, unmatched)
	}

	// Resolved, the sum leaves the metrics listener out, whatever its stat name.
	dialEcho(t, sim.ListenerAddr("metrics"))
	dialEcho(t, sim.ListenerAddr("in"))
	c.SetExclude(got)
	ac, err := c.ActiveDownstream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ac.Total != 1 || len(ac.Excluded) != 1 || ac.Excluded[0].Listener != "prometheus_stats" {
		t.Errorf("active %+v", ac)
	}
}

// Ready reads GET /ready: LIVE, a state name on 503, an error on anything
// else; and it works where a stats_matcher rejects every stat, where Live
// cannot.
func TestClientReady(t *testing.T) {
	sim := startSim(t, envoysim.Config{StatsMatcher: "reject_all"})
	c := envoy.New(sim.AdminAddr())
	if _, err := c.Live(context.Background()); err == nil {
		t.Fatal("Live under reject_all: no error")
	}
	st, err := c.Ready(context.Background())
	if err != nil || st != envoy.StateLive {
		t.Fatalf("Ready: %v %v", st, err)
	}
	if code := adminPost(t, sim.AdminAddr(), "/healthcheck/fail"); code != 200 {
		t.Fatal(code)
	}
	if st, err := c.Ready(context.Background()); err != nil || st != envoy.StateDraining {
		t.Errorf("after /healthcheck/fail: %v %v", st, err)
	}
	junk := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("maybe\n")) }))
	defer junk.Close()
	if _, err := envoy.New(junk.URL, envoy.WithTimeout(time.Second)).Ready(context.Background()); err == nil {
		t.Error("a body that is no state: no error")
	}
}
