package envoy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/draind/draind/internal/envoy"
)

// seeds adds every fixture and a few edge cases.
func seeds(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, s := range []string{"", "\n", "a: 1", "a: \"x\ny\"\n", "h: P0(nan,1) P100(1,2)\n", `{"stats":[]}`, `{"stats":[{"name":"a","value":1}]}`} {
		f.Add([]byte(s))
	}
}

func FuzzParseStatsText(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		stats, err := envoy.ParseStatsText(b)
		if err != nil {
			if !errors.Is(err, envoy.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// What parses renders back to text that parses the same.
		var sb strings.Builder
		for _, s := range stats {
			if s.Name == "" || strings.ContainsAny(s.Name, " \n\r\t\"") {
				t.Fatalf("bad name %q", s.Name)
			}
			fmt.Fprintf(&sb, "%s: %d\n", s.Name, s.Value)
		}
		again, err := envoy.ParseStatsText([]byte(sb.String()))
		if err != nil || !reflect.DeepEqual(again, stats) {
			t.Fatalf("round trip: %v, %v != %v", err, again, stats)
		}
		envoy.SumActive(stats, envoy.DefaultExclude())
	})
}

func FuzzParseStatsJSON(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		stats, err := envoy.ParseStatsJSON(b)
		if err != nil {
			if !errors.Is(err, envoy.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		type nv struct {
			Name  string `json:"name"`
			Value uint64 `json:"value"`
		}
		doc := struct {
			Stats []nv `json:"stats"`
		}{Stats: []nv{}}
		for _, s := range stats {
			if s.Name == "" {
				t.Fatal("empty name")
			}
			doc.Stats = append(doc.Stats, nv(s))
		}
		out, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		again, err := envoy.ParseStatsJSON(out)
		if err != nil || !reflect.DeepEqual(again, stats) {
			t.Fatalf("round trip: %v, %v != %v", err, again, stats)
		}
		envoy.SumActive(stats, envoy.ExcludeSet{Names: []string{"admin"}})
	})
}

func FuzzParseListenerAddr(f *testing.F) {
	for _, s := range []string{"0.0.0.0_15006", "[__]_15021", "[__1]_15090", "virtualOutbound", "[__ffff_10.0.0.1]_80", "[fe80__1%eth0]_80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, ok := envoy.ParseListenerAddr(s)
		if !ok {
			return
		}
		if !ap.IsValid() {
			t.Fatalf("%q: ok but invalid", s)
		}
		// The address renders back to Envoy's form.
		var back string
		if ap.Addr().Is4() {
			back = ap.Addr().String() + "_" + fmt.Sprint(ap.Port())
		} else {
			back = "[" + strings.ReplaceAll(ap.Addr().String(), ":", "_") + "]_" + fmt.Sprint(ap.Port())
		}
		if again, ok := envoy.ParseListenerAddr(back); !ok || again != ap {
			t.Fatalf("%q -> %v -> %q -> %v", s, ap, back, again)
		}
	})
}
