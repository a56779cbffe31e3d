package images

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"text/template"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// TestProxyV2BootstrapStats: rendered as pilot-agent renders Envoy's
// bootstrap template, the stand-in's config keeps the stats Istio's
// bootstrap lets Envoy keep: its default list, and what a proxy config or
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS adds.
func TestProxyV2BootstrapStats(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     map[string]any
		suffixes []string
	}{
		{"Istio's default", map[string]any{
			"inclusionPrefix":  []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"},
			"inclusionSuffix":  []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"},
			"inclusionRegexps": []string{`vhost\..*\.route\..*`},
		}, []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}},
		{"EXIT_ON_ZERO and a proxy config's suffix", map[string]any{
			"inclusionPrefix":  []string{"server"},
			"inclusionSuffix":  []string{"downstream_cx_total", "downstream_cx_active"},
			"inclusionRegexps": []string{`vhost\..*\.route\..*`},
		}, []string{"downstream_cx_total", "downstream_cx_active"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := template.Must(template.New("bootstrap").Parse(proxyV2Bootstrap)).Execute(&b, tc.opts); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "envoy-rev.json")
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := envoysim.LoadConfig(path)
			if err != nil {
				t.Fatalf("rendered:\n%s\n%v", b.String(), err)
			}
			in := cfg.StatsInclusion
			if in == nil || !slices.Equal(in.Suffixes, tc.suffixes) || !slices.Contains(in.Prefixes, "reporter=") || !slices.Contains(in.Prefixes, "server") ||
				!slices.Equal(in.Regexes, []string{`vhost\..*\.route\..*`}) {
				t.Fatalf("stats inclusion %+v from:\n%s", in, b.String())
			}
		})
	}
}
