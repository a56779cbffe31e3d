package envoy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseStatsText: any body either parses or is ErrMalformed, never a
// panic; what parses renders back to text that parses the same, and sums.
func FuzzParseStatsText(f *testing.F) {
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
	for _, s := range []string{"", "\n", "a: 1", "a: \"x\ny\"\n", "h: P0(nan,1) P100(1,2)\n", `{"stats":[]}`,
		"listener.[__]_15006.downstream_cx_active: 3\nlistener.admin.downstream_cx_active: 1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		stats, err := parseStatsText(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		var sb strings.Builder
		for _, s := range stats {
			if s.name == "" || strings.ContainsAny(s.name, " \n\r\t\"") {
				t.Fatalf("bad name %q", s.name)
			}
			fmt.Fprintf(&sb, "%s: %d\n", s.name, s.value)
		}
		again, err := parseStatsText([]byte(sb.String()))
		if err != nil || !reflect.DeepEqual(again, stats) {
			t.Fatalf("round trip: %v, %v != %v", err, again, stats)
		}
		ac := sumActive(stats, DefaultExclude())
		if ac.Gauges != len(ac.Listeners) {
			t.Fatalf("gauges %d, listeners %d", ac.Gauges, len(ac.Listeners))
		}
	})
}

// FuzzParseListenerAddr: what parses is valid and renders back to Envoy's
// form, which parses the same.
func FuzzParseListenerAddr(f *testing.F) {
	for _, s := range []string{"0.0.0.0_15006", "[__]_15021", "[__1]_15090", "virtualOutbound", "[__ffff_10.0.0.1]_80", "[fe80__1%eth0]_80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, ok := parseListenerAddr(s)
		if !ok {
			return
		}
		if !ap.IsValid() {
			t.Fatalf("%q: ok but invalid", s)
		}
		var back string
		if ap.Addr().Is4() {
			back = ap.Addr().String() + "_" + fmt.Sprint(ap.Port())
		} else {
			back = "[" + strings.ReplaceAll(ap.Addr().String(), ":", "_") + "]_" + fmt.Sprint(ap.Port())
		}
		if again, ok := parseListenerAddr(back); !ok || again != ap {
			t.Fatalf("%q -> %v -> %q -> %v", s, ap, back, again)
		}
	})
}
