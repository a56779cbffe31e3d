// Package istio is what draind knows of Istio: the settings pilot-agent
// reads (ProxyConfig from PROXY_CONFIG and the pod's annotations), how
// pilot-agent is recognised in a proxy command, the ports Istio takes,
// and pilot-agent's readiness. It decides nothing about the drain: `draind
// run` (internal/agent) applies these settings, and the node commands
// (internal/cli) read them to find a pod's draind.
package istio

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
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
	// PodAnnotations is the downward-API file of the pod's annotations
	// Istio's injector mounts, relative to the working directory as
	// pilot-agent reads it (proxyv2 runs in /).
	PodAnnotations = "./etc/istio/pod/annotations"
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
	DefaultStatusPort       uint16 = 15020
	DefaultAdminPort        uint16 = 15000
	DefaultTerminationDrain        = 5 * time.Second
)

// Settings are the ProxyConfig fields draind uses.
type Settings struct {
	// ProxyConfig says PROXY_CONFIG was set (a container Istio injected).
	ProxyConfig bool
	// TerminationDrain is terminationDrainDuration (0: not set: Istio's
	// default, 5 s); TerminationDrainFrom names where it was read.
	TerminationDrain     time.Duration
	TerminationDrainFrom string
	// StatusPort is pilot-agent's status port (DefaultStatusPort unless
	// set); StatusPortFrom names where it was read ("": the default).
	StatusPort     uint16
	StatusPortFrom string
	// AdminPort is Envoy's admin port, proxyAdminPort (DefaultAdminPort
	// unless set); AdminPortSet says it was.
	AdminPort    uint16
	AdminPortSet bool
}

// Defaults are the settings of a pod that sets none.
func Defaults() Settings {
	return Settings{StatusPort: DefaultStatusPort, AdminPort: DefaultAdminPort}
}

// Injected tells whether lookup has a PROXY_CONFIG: the container is one
// Istio's injector wrote, whose proxy is pilot-agent.
func Injected(lookup func(string) (string, bool)) bool {
	v, ok := lookup(ProxyConfigEnv)
	return ok && strings.TrimSpace(v) != ""
}

// Read reads Istio's settings the way pilot-agent merges them:
// PROXY_CONFIG (through lookup), then the annotations file at path (a
// missing file is no error: not every pod mounts it). Errors name the
// variable or the file; the caller says they are configuration errors.
func Read(lookup func(string) (string, bool), path string) (Settings, error) {
	return ReadFrom(lookup, path, func() ([]byte, error) { return ReadAnnotationsFile(context.Background(), "", path) })
}

// AnnotationsLimit bounds the annotations file: Kubernetes keeps a pod's
// annotations under 256 KiB, and the file quotes them.
const AnnotationsLimit = 512 << 10

// ReadAnnotationsFile reads an annotations file as [Read] does: path
// inside root ("": this process's own files, path relative to its working
// directory), a regular file of at most [AnnotationsLimit], within ctx;
// nil and no error when there is none.
func ReadAnnotationsFile(ctx context.Context, root, path string) ([]byte, error) {
	b, err := rootfs.ReadFile(ctx, root, path, AnnotationsLimit)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// ReadFrom is [Read] with the annotations file (named name in errors)
// read by readAnnotations, as `draind pods` reads another container's
// ([ReadAnnotationsFile] inside its root).
func ReadFrom(lookup func(string) (string, bool), name string, readAnnotations func() ([]byte, error)) (Settings, error) {
	s := Defaults()
	if Injected(lookup) {
		v, _ := lookup(ProxyConfigEnv)
		s.ProxyConfig = true
		if err := s.apply(v, ProxyConfigEnv); err != nil {
			return s, fmt.Errorf("%s: %w", ProxyConfigEnv, err)
		}
	}
	b, err := readAnnotations()
	if err != nil {
		return s, fmt.Errorf("%s: %w", name, err)
	}
	annos, err := parseDownwardAnnotations(b)
	if err != nil {
		return s, fmt.Errorf("%s: %w", name, err)
	}
	if v, ok := annos[annotationProxyConfig]; ok {
		from := "annotation " + annotationProxyConfig
		if err := s.apply(v, from); err != nil {
			return s, fmt.Errorf("%s, %s: %w", name, from, err)
		}
	}
	if v, ok := annos[annotationStatusPort]; ok {
		p, err := strconv.ParseUint(strings.TrimSpace(v), 10, 16)
		if err != nil {
			return s, fmt.Errorf("%s, annotation %s=%q: not a port", name, annotationStatusPort, v)
		}
		s.StatusPort, s.StatusPortFrom = uint16(p), "annotation "+annotationStatusPort
	}
	return s, nil
}

// apply merges one ProxyConfig document (YAML, of which JSON is a part)
// over s. Field names are protobuf's JSON names or their original ones,
// as protojson takes both.
func (s *Settings) apply(doc, from string) error {
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

// protoDuration reads a Duration field as protojson does.
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
	sc.Buffer(make([]byte, 0, 64<<10), AnnotationsLimit+1)
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

// oneLine keeps an error one line.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
