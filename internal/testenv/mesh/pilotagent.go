//go:build linux

package mesh

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// IstioVersion is the istio.io/istio module version tools/peers/pilot-agent.sh
// builds (Istio master of 2026-08-27, between 1.31 and 1.32: its VERSION file
// says 1.31). Keep it equal to ISTIO_VERSION in that script; a test checks.
const IstioVersion = "v0.0.0-20260827124520-eed52ebb66ad"

// PilotAgentEnv names the environment variable that overrides where the
// pilot-agent binary is.
const PilotAgentEnv = "DRAIND_PILOT_AGENT"

// BuildCommand is the command that builds pilot-agent into the cache, run
// from the repository's root.
const BuildCommand = "bash tools/peers/pilot-agent.sh"

// CachedPilotAgent is where tools/peers/pilot-agent.sh puts the binary:
// $DRAIND_PEERS_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/draind-peers,
// then pilot-agent-IstioVersion.
func CachedPilotAgent() string {
	dir := os.Getenv("DRAIND_PEERS_CACHE")
	if dir == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			cache = filepath.Join(os.Getenv("HOME"), ".cache")
		}
		dir = filepath.Join(cache, "draind-peers")
	}
	return filepath.Join(dir, "pilot-agent-"+IstioVersion)
}

// PilotAgent returns the path of the pilot-agent binary: $DRAIND_PILOT_AGENT
// when set (it must then exist), else CachedPilotAgent. When it is missing
// the test is skipped with the command that builds it, or failed under
// CI=true.
func PilotAgent(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(PilotAgentEnv); p != "" {
		if !executable(p) {
			tb.Fatalf("mesh: %s=%s is not an executable file", PilotAgentEnv, p)
		}
		return p
	}
	p := CachedPilotAgent()
	if !executable(p) {
		absent(tb, fmt.Sprintf("pilot-agent %s not built (looked for %s, or set %s): build it with `%s` from the repository root",
			IstioVersion, p, PilotAgentEnv, BuildCommand))
	}
	return p
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
