package cli

import (
	"io"
	"strings"
	"testing"
)

// FuzzRunConfig: `draind run`'s arguments and variables come from the pod
// spec. Whatever they say, parsing and validating them never panics, and a
// refusal is one line (the kubelet shows a container's last lines).
//
// args are NUL-separated arguments; env NUL-separated NAME=VALUE pairs, of
// which those draind may read (DRAIND_*, Istio's aliases) are set.
func FuzzRunConfig(f *testing.F) {
	for _, seed := range [][2]string{
		{"--\x00envoy", ""},
		{"--min-drain\x005s\x00--drain-deadline\x0025s\x00--\x00envoy\x00-c\x00x.yaml", ""},
		{"--proxy-caps\x00NET_ADMIN,NET_BIND_SERVICE\x00--run-proxy-as\x001337\x00--\x00envoy", ""},
		{"--app-ports\x008080,9090\x00--exit-with-app\x00true\x00--\x00envoy", "DRAIND_TRACKER=ebpf"},
		{"--\x00envoy", "MINIMUM_DRAIN_DURATION=30s\x00TERMINATION_DRAIN_DURATION_SECONDS=45\x00DRAIND_PROXY_CAPS=NET_RAW"},
		{"--admin-addr\x00[::1]:15000\x00--status-addr\x00:0\x00--\x00envoy", "DRAIND_IDLE_TIMEOUT=1m"},
		{"-h", ""},
		{"--nope", "DRAIND_MIN_DRAIN=soon"},
		{"--admin-addr\x00a\nb\x00--\x00envoy", "DRAIND_STATUS_ADDR=x\ny"},
	} {
		f.Add(seed[0], seed[1])
	}
	aliases := map[string]bool{}
	for _, a := range istioAliases {
		aliases[a.name] = true
	}
	f.Fuzz(func(t *testing.T, args, env string) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\x00")
		}
		for kv := range strings.SplitSeq(env, "\x00") {
			if name, val, ok := strings.Cut(kv, "="); ok && (strings.HasPrefix(name, "DRAIND_") || aliases[name]) {
				t.Setenv(name, val)
			}
		}
		cfg, _, err := runConfig(argv, io.Discard)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil && strings.ContainsAny(err.Error(), "\n\r") {
			t.Fatalf("a refusal of more than one line: %q", err)
		}
	})
}
