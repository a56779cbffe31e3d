package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/draind/draind/internal/rootfs"
)

// Istio's settings as pilot-agent reads them today (istio/istio 1.31:
// pilot/cmd/pilot-agent/config/config.go, ConstructProxyConfig): ProxyConfig
// from the PROXY_CONFIG variable (the injector writes it as JSON with
// Istio's defaults left out; a gateway's or a hand-written one may be
// YAML), then the pod's `proxy.istio.io/config` annotation and its
// `status.sidecar.istio.io/port` annotation from the downward-API file, each
// replacing the fields it sets. `proxyMetadata` entries reach the
// container as plain variables (MINIMUM_DRAIN_DURATION,
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS: internal/cli reads those).
const (
	// ProxyConfigEnv holds ProxyConfig, YAML or JSON.
	ProxyConfigEnv = "PROXY_CONFIG"
	// IstioPodAnnotations is the downward-API file of the pod's
	// annotations Istio's injector mounts, relative to the working
	// directory as pilot-agent reads it (proxyv2 runs in /).
	IstioPodAnnotations = "./etc/istio/pod/annotations"
	// ExitOnZeroEnv is Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS: draind's
	// gate always waits for the connections, and more (the app's work).
	ExitOnZeroEnv = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS"
	// TerminationDrainEnv is the variable Istio removed in 1.10 for
	// ProxyConfig terminationDrainDuration; draind still reads it as an
	// alias of --drain-deadline, with a warning.
	TerminationDrainEnv = "TERMINATION_DRAIN_DURATION_SECONDS"

	annotationProxyConfig = "proxy.istio.io/config"
	annotationStatusPort  = "status.sidecar.istio.io/port"
)

// Istio's defaults (pkg/config/mesh/mesh.go, DefaultProxyConfig): what a
// PROXY_CONFIG without the field means.
const (
	IstioStatusPort               uint16 = 15020
	IstioAdminPort                uint16 = 15000
	IstioTerminationDrainDuration        = 5 * time.Second
)

// IstioPorts are the ports Istio's sidecar and control plane use
// (istio.io, "Ports used by Istio"): draind's own status port is never one
// of them when it supervises pilot-agent.
var IstioPorts = []uint16{15000, 15001, 15004, 15006, 15008, 15009, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090}

// PilotAgentStatusPort is draind's status port next to pilot-agent when
// nothing says otherwise: the first port from here that no Istio setting
// or IstioPorts takes.
const PilotAgentStatusPort uint16 = 15022

// IstioSettings are the ProxyConfig fields draind uses.
type IstioSettings struct {
	// ProxyConfig: PROXY_CONFIG was set (a container Istio injected).
	ProxyConfig bool
	// TerminationDrain is terminationDrainDuration (0: not set: Istio's
	// default, 5 s); TerminationDrainFrom names where it was read.
	TerminationDrain     time.Duration
	TerminationDrainFrom string
	// StatusPort is pilot-agent's status port (IstioStatusPort unless
	// set); StatusPortFrom names where it was read ("" : the default).
	StatusPort     uint16
	StatusPortFrom string
	// AdminPort is Envoy's admin port, proxyAdminPort (IstioAdminPort
	// unless set); AdminPortSet says it was.
	AdminPort    uint16
	AdminPortSet bool
}

// ReadIstio reads Istio's settings the way pilot-agent merges them:
// PROXY_CONFIG (through lookup), then the annotations file at path (a
// missing file is no error: not every pod mounts it). Errors name the
// variable or the file and are configuration errors.
func ReadIstio(lookup func(string) (string, bool), path string) (IstioSettings, error) {
	return readIstio(lookup, path, func() ([]byte, error) { return ReadAnnotationsFile(context.Background(), "", path) })
}

// IstioAnnotationsLimit bounds the annotations file: Kubernetes keeps a
// pod's annotations under 256 KiB, and the file quotes them.
const IstioAnnotationsLimit = 512 << 10

// ReadAnnotationsFile reads an annotations file as [ReadIstio] does:
// path inside root ("" : this process's own files, path relative to its
// working directory), a regular file of at most [IstioAnnotationsLimit],
// within ctx; nil and no error when there is none.
func ReadAnnotationsFile(ctx context.Context, root, path string) ([]byte, error) {
	b, err := rootfs.ReadFile(ctx, root, path, IstioAnnotationsLimit)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// readIstio is ReadIstio with the annotations file (named name) read by
// readAnnotations.
func readIstio(lookup func(string) (string, bool), name string, readAnnotations func() ([]byte, error)) (IstioSettings, error) {
	s := IstioSettings{StatusPort: IstioStatusPort, AdminPort: IstioAdminPort}
	if v, ok := lookup(ProxyConfigEnv); ok && strings.TrimSpace(v) != "" {
		s.ProxyConfig = true
		if err := s.apply(v, ProxyConfigEnv); err != nil {
			return s, configErr("%s: %v", ProxyConfigEnv, err)
		}
	}
	b, err := readAnnotations()
	if err != nil {
		return s, configErr("%s: %v", name, err)
	}
	annos, err := parseDownwardAnnotations(b)
	if err != nil {
		return s, configErr("%s: %v", name, err)
	}
	if v, ok := annos[annotationProxyConfig]; ok {
		from := "annotation " + annotationProxyConfig
		if err := s.apply(v, from); err != nil {
			return s, configErr("%s, %s: %v", name, from, err)
		}
	}
	if v, ok := annos[annotationStatusPort]; ok {
		p, err := strconv.ParseUint(strings.TrimSpace(v), 10, 16)
		if err != nil {
			return s, configErr("%s, annotation %s=%q: not a port", name, annotationStatusPort, v)
		}
		s.StatusPort, s.StatusPortFrom = uint16(p), "annotation "+annotationStatusPort
	}
	return s, nil
}

// apply merges one ProxyConfig document (YAML, of which JSON is a part)
// over s. Field names are protobuf's JSON names or their original ones,
// as protojson takes both.
func (s *IstioSettings) apply(doc, from string) error {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		return fmt.Errorf("not YAML or JSON: %v", oneLine(err.Error()))
	}
	for _, f := range []struct {
		json, proto string
		set         func(any) error
	}{
		{"terminationDrainDuration", "termination_drain_duration", func(v any) error {
			d, err := protoDuration(v)
			if err == nil {
				s.TerminationDrain, s.TerminationDrainFrom = d, from
			}
			return err
		}},
		{"statusPort", "status_port", func(v any) error {
			p, err := protoPort(v)
			if err == nil {
				s.StatusPort, s.StatusPortFrom = p, from
			}
			return err
		}},
		{"proxyAdminPort", "proxy_admin_port", func(v any) error {
			p, err := protoPort(v)
			if err == nil {
				s.AdminPort, s.AdminPortSet = p, true
			}
			return err
		}},
	} {
		for _, name := range []string{f.json, f.proto} {
			if v, ok := m[name]; ok && v != nil {
				if err := f.set(v); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
		}
	}
	return nil
}

// durationRE is protobuf's JSON form of a Duration: seconds with up to nine
// decimals and the "s" suffix ("40s", "0.5s"); pilot-agent refuses others.
var durationRE = regexp.MustCompile(`^-?[0-9]+(\.[0-9]{1,9})?s$`)

func protoDuration(v any) (time.Duration, error) {
	str, ok := v.(string)
	if !ok || !durationRE.MatchString(str) {
		return 0, fmt.Errorf("%v is not a protobuf duration (seconds with the s suffix: \"40s\", \"0.5s\")", v)
	}
	d, err := time.ParseDuration(str)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration of zero or more", str)
	}
	return d, nil
}

// protoPort reads an int32 field as protojson does: a number, or a string
// holding one.
func protoPort(v any) (uint16, error) {
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case string:
		var err error
		if n, err = strconv.ParseInt(x, 10, 32); err != nil {
			return 0, fmt.Errorf("%q is not a port", x)
		}
	default:
		return 0, fmt.Errorf("%v is not a port", v)
	}
	if n < 0 || n > 65535 {
		return 0, fmt.Errorf("%d is not a port", n)
	}
	return uint16(n), nil
}

// parseDownwardAnnotations reads a downward-API file of annotations:
// one `key="value"` line each, the value quoted as Go's %q does.
func parseDownwardAnnotations(b []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), IstioAnnotationsLimit+1)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		out[k] = v
	}
	return out, sc.Err()
}

// pilotAgentStatusPort picks draind's status port next to pilot-agent: the
// first from PilotAgentStatusPort that is neither one of IstioPorts nor
// one of Istio's settings (taken).
func pilotAgentStatusPort(taken ...uint16) uint16 {
	for p := PilotAgentStatusPort; ; p++ {
		busy := false
		for _, q := range append(append([]uint16(nil), IstioPorts...), taken...) {
			busy = busy || p == q
		}
		if !busy {
			return p
		}
	}
}

// IsPilotAgent tells whether a proxy command is Istio's pilot-agent, by
// its file name.
func IsPilotAgent(command []string) bool {
	return len(command) > 0 && filepath.Base(command[0]) == "pilot-agent"
}

// IstioDrainStatusAddr is the status address `draind drain` asks when
// nothing names one: in a container Istio injected (PROXY_CONFIG set)
// the one `draind run -- pilot-agent` takes, with the same settings.
func IstioDrainStatusAddr(lookup func(string) (string, bool), path string) (string, bool, error) {
	if v, ok := lookup(ProxyConfigEnv); !ok || strings.TrimSpace(v) == "" {
		return "", false, nil
	}
	addr, err := PilotAgentStatusAddr(lookup, path)
	return addr, err == nil, err
}

// PilotAgentStatusAddr is the status address `draind run -- pilot-agent`
// takes with the Istio settings lookup and the annotations file at path
// give (none: Istio's defaults).
func PilotAgentStatusAddr(lookup func(string) (string, bool), path string) (string, error) {
	return PilotAgentStatusAddrFrom(lookup, path, func() ([]byte, error) { return ReadAnnotationsFile(context.Background(), "", path) })
}

// PilotAgentStatusAddrFrom is [PilotAgentStatusAddr] with the annotations
// file (named name in errors) read by readAnnotations (nil: none), as
// `draind pods` reads another container's ([ReadAnnotationsFile] inside
// its root).
func PilotAgentStatusAddrFrom(lookup func(string) (string, bool), name string, readAnnotations func() ([]byte, error)) (string, error) {
	s, err := readIstio(lookup, name, readAnnotations)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(":%d", pilotAgentStatusPort(s.StatusPort, s.AdminPort)), nil
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
