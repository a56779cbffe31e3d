package conformance_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/draind/draind/internal/testenv/envoysim/conformance"
)

func TestEnvoysim(t *testing.T) { conformance.Run(t, conformance.Sim()) }

// TestEnvoysimProgram plays them against the envoysim program, a process.
func TestEnvoysimProgram(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "envoysim")
	goBin, err := exec.LookPath("go") // go test puts its own toolchain first in the PATH
	if err != nil {
		t.Fatalf("no go toolchain to build envoysim: %v", err)
	}
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/draind/draind/internal/testenv/envoysim/cmd/envoysim")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	conformance.Run(t, conformance.Program(bin))
}

// TestEnvoy plays the same scenarios against a real Envoy; it skips when
// none is installed (ENVOY_BIN or envoy on PATH).
func TestEnvoy(t *testing.T) {
	if _, err := conformance.EnvoyBinary(); err != nil {
		t.Skip(err)
	}
	conformance.Run(t, conformance.Envoy())
}

// The bootstrap given to a real Envoy is well-formed JSON with what the
// setup asks for, even where no Envoy can check it.
func TestBootstrap(t *testing.T) {
	for _, sc := range conformance.Scenarios() {
		s := sc.Setup
		for i := range s.Listeners {
			s.Listeners[i].UpstreamAddr = "127.0.0.1:1"
		}
		b, err := conformance.Bootstrap(s)
		if err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		var boot struct {
			Admin           map[string]any `json:"admin"`
			StaticResources struct {
				Listeners []map[string]any `json:"listeners"`
				Clusters  []map[string]any `json:"clusters"`
			} `json:"static_resources"`
			StatsConfig *struct {
				StatsMatcher struct {
					InclusionList struct {
						Patterns []map[string]any `json:"patterns"`
					} `json:"inclusion_list"`
				} `json:"stats_matcher"`
			} `json:"stats_config"`
		}
		if err := json.Unmarshal(b, &boot); err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if len(boot.StaticResources.Listeners) != len(s.Listeners) || len(boot.StaticResources.Clusters) != len(s.Listeners) || boot.Admin == nil {
			t.Errorf("%s: %s", sc.Name, b)
		}
		if (s.StatsMatcher != "") != (boot.StatsConfig != nil) {
			t.Errorf("%s: stats matcher %q: %s", sc.Name, s.StatsMatcher, b)
		}
	}
}
