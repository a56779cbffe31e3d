package envoy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseStatsTextFixture(t *testing.T) {
	stats, err := parseStatsText(fixture(t, "stats_sidecar.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, s := range stats {
		m[s.name] = s.value
	}
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

func TestParseStatsText(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []stat // nil with err
		err  bool
	}{
		{name: "empty", in: "", want: []stat{}},
		{name: "blank lines", in: "\n\n", want: []stat{}},
		{name: "one", in: "a.b: 1\n", want: []stat{{"a.b", 1}}},
		{name: "no final newline", in: "a: 1\nb: 2", want: []stat{{"a", 1}, {"b", 2}}},
		{name: "crlf", in: "a: 1\r\nb: 2\r\n", want: []stat{{"a", 1}, {"b", 2}}},
		{name: "max uint64", in: "a: 18446744073709551615\n", want: []stat{{"a", 1<<64 - 1}}},
		{name: "readout with colon and quotes", in: "r: \"x: \"y\" z\"\na: 3\n", want: []stat{{"a", 3}}},
		{name: "multi-line readout", in: "r: \"line one\nline two\"\na: 3\n", want: []stat{{"a", 3}}},
		{name: "empty readout", in: "r: \"\"\na: 3\n", want: []stat{{"a", 3}}},
		{name: "histograms", in: "a: 3\nh: No recorded values\ng: P0(nan,0) P25(nan,0) P100(1.5,2)\nb: B0.5(0,0) B1(0,0) B1.8e+06(3,3)\n", want: []stat{{"a", 3}}},
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
			got, err := parseStatsText([]byte(tc.in))
			if tc.err {
				if !errors.Is(err, ErrMalformed) {
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
	if _, err := parseStatsText(fixture(t, "garbage.bin")); !errors.Is(err, ErrMalformed) {
		t.Errorf("garbage.bin: err = %v, want ErrMalformed", err)
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
		ap, ok := parseListenerAddr(tc.in)
		got := ""
		if ok {
			got = ap.String()
		}
		if got != tc.want {
			t.Errorf("parseListenerAddr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func la(name string, active uint64) ListenerActive {
	l := ListenerActive{Stat: name, Listener: strings.TrimSuffix(strings.TrimPrefix(name, "listener."), ".downstream_cx_active"), Active: active}
	if ap, ok := parseListenerAddr(l.Listener); ok {
		l.Addr, l.Port = ap, ap.Port()
	}
	return l
}

func TestSumActive(t *testing.T) {
	sidecar, err := parseStatsText(fixture(t, "stats_active_usedonly.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		stats   []stat
		exclude ExcludeSet
		want    ActiveConns
	}{
		{name: "nothing", want: ActiveConns{}},
		{
			name:    "sidecar, istio exclusions by port in every address form",
			stats:   sidecar,
			exclude: DefaultExclude(),
			want: ActiveConns{
				Total:  15,
				Gauges: 5,
				Listeners: []ListenerActive{
					la("listener.0.0.0.0_15006.downstream_cx_active", 4),
					la("listener.10.1.2.3_9080.downstream_cx_active", 5),
					la("listener.[__]_15006.downstream_cx_active", 2),
					la("listener.[fd00__2]_8443.downstream_cx_active", 1),
					la("listener.virtualOutbound.downstream_cx_active", 3),
				},
				Excluded: []ListenerActive{
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
			exclude: ExcludeSet{Names: []string{"virtualOutbound", "10.1.2.3_9080"}},
			want: ActiveConns{
				Total:  13,
				Gauges: 8,
				Listeners: []ListenerActive{
					la("listener.0.0.0.0_15006.downstream_cx_active", 4),
					la("listener.0.0.0.0_15021.downstream_cx_active", 1),
					la("listener.0.0.0.0_15090.downstream_cx_active", 1),
					la("listener.127.0.0.1_15090.downstream_cx_active", 1),
					la("listener.[__1]_15090.downstream_cx_active", 2),
					la("listener.[__]_15006.downstream_cx_active", 2),
					la("listener.[__]_15021.downstream_cx_active", 1),
					la("listener.[fd00__2]_8443.downstream_cx_active", 1),
				},
				Excluded: []ListenerActive{
					la("listener.10.1.2.3_9080.downstream_cx_active", 5),
					la("listener.virtualOutbound.downstream_cx_active", 3),
				},
			},
		},
		{
			name: "admin, per-thread, internal and other stats skipped; a zero gauge is counted",
			stats: []stat{
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
			want: ActiveConns{Gauges: 1, Listeners: []ListenerActive{la("listener.0.0.0.0_15006.downstream_cx_active", 0)}},
		},
		{
			name: "a stat_prefix that looks like a port is not port-excluded; worker_x is a name",
			stats: []stat{
				{"listener.inbound_15021.downstream_cx_active", 2},
				{"listener.a.worker_x.downstream_cx_active", 1},
			},
			exclude: ExcludeSet{Ports: []uint16{15021}},
			want: ActiveConns{Total: 3, Gauges: 2, Listeners: []ListenerActive{
				la("listener.a.worker_x.downstream_cx_active", 1),
				la("listener.inbound_15021.downstream_cx_active", 2),
			}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sumActive(tc.stats, tc.exclude)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// The per-listener breakdown carries parsed addresses.
	got := sumActive(sidecar, DefaultExclude())
	if a := got.Listeners[2].Addr; a != netip.MustParseAddrPort("[::]:15006") {
		t.Errorf("[__]_15006 parsed as %v", a)
	}
}

func TestServerStateAndLiveness(t *testing.T) {
	for s, name := range map[ServerState]string{0: "LIVE", 1: "DRAINING", 2: "PRE_INITIALIZING", 3: "INITIALIZING", 9: "ServerState(9)"} {
		if s.String() != name {
			t.Errorf("%d.String() = %q, want %q", uint64(s), s.String(), name)
		}
	}
	for _, tc := range []struct {
		l    Liveness
		live bool
	}{
		{Liveness{StateLive, true}, true},
		{Liveness{StateLive, false}, false}, // the unset gauge of a starting Envoy
		{Liveness{StateDraining, true}, false},
		{Liveness{StateInitializing, false}, false},
	} {
		if tc.l.Live() != tc.live {
			t.Errorf("%+v.Live() = %t", tc.l, !tc.live)
		}
	}
}
