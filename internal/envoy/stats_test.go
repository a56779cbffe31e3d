package envoy_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/draind/draind/internal/envoy"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func statMap(stats []envoy.Stat) map[string]uint64 {
	m := map[string]uint64{}
	for _, s := range stats {
		m[s.Name] = s.Value
	}
	return m
}

func TestParseStatsTextFixture(t *testing.T) {
	stats, err := envoy.ParseStatsText(fixture(t, "stats_sidecar.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := statMap(stats)
	if len(m) != len(stats) {
		t.Errorf("duplicate names in %d stats", len(stats))
	}
	for name, want := range map[string]uint64{
		"listener.[__]_15006.downstream_cx_active":                                  2,
		"listener.0.0.0.0_15006.worker_1.downstream_cx_active":                      1,
		"listener.virtualOutbound.downstream_cx_total":                              77,
		"cluster.outbound|80||reviews.default.svc.cluster.local.upstream_cx_active": 3,
		"server.state":                     0,
		"listener_manager.workers_started": 1,
		"server.uptime":                    3127,
	} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %d, %t; want %d", name, got, ok, want)
		}
	}
	for name := range m {
		if strings.Contains(name, "version_text") || strings.Contains(name, "readout") || strings.HasSuffix(name, "_ms") {
			t.Errorf("text readout or histogram %q parsed as a stat", name)
		}
	}
	if len(stats) != 40 {
		t.Errorf("got %d stats, want the fixture's 40 counters and gauges", len(stats))
	}
}

func TestParseStatsJSONFixture(t *testing.T) {
	text, err := envoy.ParseStatsText(fixture(t, "stats_sidecar.txt"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := envoy.ParseStatsJSON(fixture(t, "stats_sidecar.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(text, js) {
		t.Errorf("text and JSON fixtures parse differently:\ntext %v\njson %v", text, js)
	}
}

func TestParseStatsText(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []envoy.Stat // nil with err
		err  bool
	}{
		{name: "empty", in: "", want: []envoy.Stat{}},
		{name: "blank lines", in: "\n\n", want: []envoy.Stat{}},
		{name: "one", in: "a.b: 1\n", want: []envoy.Stat{{"a.b", 1}}},
		{name: "no final newline", in: "a: 1\nb: 2", want: []envoy.Stat{{"a", 1}, {"b", 2}}},
		{name: "crlf", in: "a: 1\r\nb: 2\r\n", want: []envoy.Stat{{"a", 1}, {"b", 2}}},
		{name: "max uint64", in: "a: 18446744073709551615\n", want: []envoy.Stat{{"a", 1<<64 - 1}}},
		{name: "readout with colon and quotes", in: "r: \"x: \"y\" z\"\na: 3\n", want: []envoy.Stat{{"a", 3}}},
		{name: "multi-line readout", in: "r: \"line one\nline two\"\na: 3\n", want: []envoy.Stat{{"a", 3}}},
		{name: "empty readout", in: "r: \"\"\na: 3\n", want: []envoy.Stat{{"a", 3}}},
		{name: "histograms", in: "a: 3\nh: No recorded values\ng: P0(nan,0) P25(nan,0) P100(1.5,2)\nb: B0.5(0,0) B1(0,0) B1.8e+06(3,3)\n", want: []envoy.Stat{{"a", 3}}},
		{name: "unterminated readout", in: "r: \"abc\na: 3\n", err: true},
		{name: "lone quote readout", in: "r: \"\n", err: true},
		{name: "no separator", in: "a 1\n", err: true},
		{name: "colon no space", in: "a:1\n", err: true},
		{name: "empty name", in: ": 1\n", err: true},
		{name: "space in name", in: "a b: 1\n", err: true},
		{name: "negative", in: "a: -1\n", err: true},
		{name: "float", in: "a: 1.5\n", err: true},
		{name: "overflow", in: "a: 18446744073709551616\n", err: true},
		{name: "empty value", in: "a: \n", err: true},
		{name: "trailing space", in: "a: 1 \n", err: true},
		{name: "html", in: "<html><body>502 Bad Gateway</body></html>\n", err: true},
		{name: "json", in: `{"stats":[{"name":"a","value":1}]}`, err: true},
		{name: "pretty json", in: "{\n \"stats\": [\n", err: true},
		{name: "http header", in: "Content-Type: text/plain\n", err: true},
		{name: "state name", in: "LIVE\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envoy.ParseStatsText([]byte(tc.in))
			if tc.err {
				if !errors.Is(err, envoy.ErrMalformed) {
					t.Fatalf("err = %v, want ErrMalformed (stats %v)", err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := envoy.ParseStatsText(fixture(t, "garbage.bin")); !errors.Is(err, envoy.ErrMalformed) {
		t.Errorf("garbage.bin: err = %v, want ErrMalformed", err)
	}
}

func TestParseStatsJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []envoy.Stat
		err  bool
	}{
		{name: "empty stats", in: `{"stats":[]}`, want: []envoy.Stat{}},
		{name: "envoy key order", in: `{"stats":[ {"value":42, "name":"name"}]}`, want: []envoy.Stat{{"name", 42}}},
		{name: "readout skipped", in: `{"stats":[{"value":"abc \u003c","name":"r"},{"name":"a","value":1}]}`, want: []envoy.Stat{{"a", 1}}},
		{name: "histograms skipped", in: `{"stats":[{"name":"a","value":1},{"histograms":{"supported_quantiles":[0],"computed_quantiles":[]}}]}`, want: []envoy.Stat{{"a", 1}}},
		{name: "bucket histograms skipped", in: `{"stats":[{"histograms":[{"name":"h1","buckets":[]}]}]}`, want: []envoy.Stat{}},
		{name: "big", in: `{"stats":[{"name":"a","value":18446744073709551615}]}`, want: []envoy.Stat{{"a", 1<<64 - 1}}},
		{name: "trailing newline", in: "{\"stats\":[]}\n", want: []envoy.Stat{}},
		{name: "empty body", in: "", err: true},
		{name: "no stats", in: `{}`, err: true},
		{name: "null stats", in: `{"stats":null}`, err: true},
		{name: "stats not array", in: `{"stats":{}}`, err: true},
		{name: "truncated", in: `{"stats":[{"name":`, err: true},
		{name: "trailing data", in: `{"stats":[]} x`, err: true},
		{name: "two documents", in: `{"stats":[]}{"stats":[]}`, err: true},
		{name: "float", in: `{"stats":[{"name":"a","value":1.5}]}`, err: true},
		{name: "negative", in: `{"stats":[{"name":"a","value":-1}]}`, err: true},
		{name: "exponent", in: `{"stats":[{"name":"a","value":1e3}]}`, err: true},
		{name: "no value", in: `{"stats":[{"name":"a"}]}`, err: true},
		{name: "null value", in: `{"stats":[{"name":"a","value":null}]}`, err: true},
		{name: "no name", in: `{"stats":[{"value":1}]}`, err: true},
		{name: "empty name", in: `{"stats":[{"name":"","value":1}]}`, err: true},
		{name: "number name", in: `{"stats":[{"name":1,"value":1}]}`, err: true},
		{name: "text format", in: "a: 1\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envoy.ParseStatsJSON([]byte(tc.in))
			if tc.err {
				if !errors.Is(err, envoy.ErrMalformed) {
					t.Fatalf("err = %v, want ErrMalformed (stats %v)", err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseListenerAddr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" for not an address
	}{
		{"0.0.0.0_15006", "0.0.0.0:15006"},
		{"127.0.0.1_15090", "127.0.0.1:15090"},
		{"10.1.2.3_9080", "10.1.2.3:9080"},
		{"[__]_15021", "[::]:15021"},
		{"[__1]_15090", "[::1]:15090"},
		{"[fd00__2]_8443", "[fd00::2]:8443"},
		{"[__ffff_10.0.0.1]_80", "[::ffff:10.0.0.1]:80"},
		{"0.0.0.0_0", "0.0.0.0:0"},
		{"virtualOutbound", ""},
		{"inbound_15021", ""},
		{"inbound_0.0.0.0_8080", ""},
		{"0.0.0.0_65536", ""},
		{"0.0.0.0_", ""},
		{"0.0.0.0_+1", ""},
		{"_15021", ""},
		{"[]_15021", ""},
		{"[__]15021", ""},
		{"[1.2.3.4]_80", ""},
		{"1.2.3_80", ""},
		{"admin", ""},
	} {
		ap, ok := envoy.ParseListenerAddr(tc.in)
		got := ""
		if ok {
			got = ap.String()
		}
		if got != tc.want {
			t.Errorf("ParseListenerAddr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func la(stat string, active uint64) envoy.ListenerActive {
	name := strings.TrimSuffix(strings.TrimPrefix(stat, "listener."), ".downstream_cx_active")
	l := envoy.ListenerActive{Stat: stat, Listener: name, Active: active}
	if ap, ok := envoy.ParseListenerAddr(name); ok {
		l.Addr, l.Port = ap, ap.Port()
	}
	return l
}

func TestSumActive(t *testing.T) {
	sidecar, err := envoy.ParseStatsText(fixture(t, "stats_active_usedonly.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		stats   []envoy.Stat
		exclude envoy.ExcludeSet
		want    envoy.ActiveConns
	}{
		{name: "nothing", want: envoy.ActiveConns{}},
		{
			name:    "sidecar, istio exclusions by port in every address form",
			stats:   sidecar,
			exclude: envoy.DefaultExclude(),
			want: envoy.ActiveConns{
				Total: 15,
				Listeners: []envoy.ListenerActive{
					la("listener.0.0.0.0_15006.downstream_cx_active", 4),
					la("listener.10.1.2.3_9080.downstream_cx_active", 5),
					la("listener.[__]_15006.downstream_cx_active", 2),
					la("listener.[fd00__2]_8443.downstream_cx_active", 1),
					la("listener.virtualOutbound.downstream_cx_active", 3),
				},
				Excluded: []envoy.ListenerActive{
					la("listener.0.0.0.0_15021.downstream_cx_active", 1),
					la("listener.0.0.0.0_15090.downstream_cx_active", 1),
					la("listener.127.0.0.1_15090.downstream_cx_active", 1),
					la("listener.[__1]_15090.downstream_cx_active", 2),
					la("listener.[__]_15021.downstream_cx_active", 1),
				},
			},
		},
		{
			name:    "exclude a stat_prefix and an address by name",
			stats:   sidecar,
			exclude: envoy.ExcludeSet{Names: []string{"virtualOutbound", "10.1.2.3_9080"}},
			want: envoy.ActiveConns{
				Total: 13,
				Listeners: []envoy.ListenerActive{
					la("listener.0.0.0.0_15006.downstream_cx_active", 4),
					la("listener.0.0.0.0_15021.downstream_cx_active", 1),
					la("listener.0.0.0.0_15090.downstream_cx_active", 1),
					la("listener.127.0.0.1_15090.downstream_cx_active", 1),
					la("listener.[__1]_15090.downstream_cx_active", 2),
					la("listener.[__]_15006.downstream_cx_active", 2),
					la("listener.[__]_15021.downstream_cx_active", 1),
					la("listener.[fd00__2]_8443.downstream_cx_active", 1),
				},
				Excluded: []envoy.ListenerActive{
					la("listener.10.1.2.3_9080.downstream_cx_active", 5),
					la("listener.virtualOutbound.downstream_cx_active", 3),
				},
			},
		},
		{
			name: "admin, per-thread, internal and other stats skipped",
			stats: []envoy.Stat{
				{"listener.admin.downstream_cx_active", 1},
				{"listener.admin.main_thread.downstream_cx_active", 1},
				{"listener.0.0.0.0_15006.worker_0.downstream_cx_active", 7},
				{"listener.0.0.0.0_15006.worker_12.downstream_cx_active", 7},
				{"listener.envoy_internal_x.downstream_cx_active", 7},
				{"listener.x.envoy_internal.downstream_cx_active", 7},
				{"listener.0.0.0.0_15006.downstream_cx_total", 99},
				{"http.inbound.downstream_cx_active", 9},
				{"listener..downstream_cx_active", 9},
				{"listener.downstream_cx_active", 9},
				{"listener.0.0.0.0_15006.downstream_cx_active", 0},
			},
			want: envoy.ActiveConns{Listeners: []envoy.ListenerActive{la("listener.0.0.0.0_15006.downstream_cx_active", 0)}},
		},
		{
			name: "a stat_prefix that looks like a port is not port-excluded; worker_x is a name",
			stats: []envoy.Stat{
				{"listener.inbound_15021.downstream_cx_active", 2},
				{"listener.a.worker_x.downstream_cx_active", 1},
			},
			exclude: envoy.ExcludeSet{Ports: []uint16{15021}},
			want: envoy.ActiveConns{Total: 3, Listeners: []envoy.ListenerActive{
				la("listener.a.worker_x.downstream_cx_active", 1),
				la("listener.inbound_15021.downstream_cx_active", 2),
			}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := envoy.SumActive(tc.stats, tc.exclude)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// The per-listener breakdown carries parsed addresses.
	got := envoy.SumActive(sidecar, envoy.DefaultExclude())
	if a := got.Listeners[2].Addr; a != netip.MustParseAddrPort("[::]:15006") {
		t.Errorf("[__]_15006 parsed as %v", a)
	}
}

func TestServerState(t *testing.T) {
	for s, name := range map[envoy.ServerState]string{0: "LIVE", 1: "DRAINING", 2: "PRE_INITIALIZING", 3: "INITIALIZING", 9: "ServerState(9)"} {
		if s.String() != name {
			t.Errorf("%d.String() = %q, want %q", uint64(s), s.String(), name)
		}
		if p, err := envoy.ParseServerState(name); s < 4 && (err != nil || p != s) {
			t.Errorf("ParseServerState(%q) = %v, %v", name, p, err)
		}
	}
	if _, err := envoy.ParseServerState("live"); err == nil {
		t.Error("ParseServerState(live): no error")
	}
}
