// Command ociimage writes an OCI image archive (an OCI layout in a tar, for
// `ctr -n k8s.io images import`) from static binaries, with no Docker
// engine and no registry:
//
//	ociimage --out draind.tar --ref docker.io/draind/e2e-draind:dev \
//	  --file bin/draind:/usr/local/bin/draind:0755:cap_bpf,cap_perfmon+ep \
//	  --entrypoint '["/usr/local/bin/draind"]' --user 1337
//
// --file is SRC:DST[:MODE[:CAPS]], CAPS in setcap's text form; it becomes
// the PAX record SCHILY.xattr.security.capability of the layer entry.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/draind/draind/e2e/kubelet/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func run(args []string) error {
	fs := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	out := fs.String("out", "", "archive to write")
	ref := fs.String("ref", "", "image name, e.g. docker.io/draind/e2e-draind:dev")
	entry := fs.String("entrypoint", "", "JSON array")
	cmd := fs.String("cmd", "", "JSON array")
	user := fs.String("user", "", "image user")
	arch := fs.String("arch", runtime.GOARCH, "image architecture")
	var files, dirs, env, labels multi
	fs.Var(&files, "file", "SRC:DST[:MODE[:CAPS]] (repeatable)")
	fs.Var(&dirs, "dir", "an empty world-writable directory (repeatable)")
	fs.Var(&env, "env", "K=V (repeatable)")
	fs.Var(&labels, "label", "K=V (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" {
		return errors.New("--out and --ref are required")
	}
	spec := ociimage.Spec{Ref: *ref, Dirs: dirs, User: *user, Env: env, Labels: map[string]string{}}
	for _, f := range files {
		parsed, err := parseFile(f)
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, parsed)
	}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		spec.Labels[k] = v
	}
	for _, j := range []struct {
		s   string
		dst *[]string
	}{{*entry, &spec.Entrypoint}, {*cmd, &spec.Cmd}} {
		if j.s != "" {
			if err := json.Unmarshal([]byte(j.s), j.dst); err != nil {
				return fmt.Errorf("%q: want a JSON array: %w", j.s, err)
			}
		}
	}
	return ociimage.WriteArchive(*out, spec, *arch)
}

func parseFile(s string) (ociimage.File, error) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) < 2 {
		return ociimage.File{}, fmt.Errorf("--file %q: want SRC:DST[:MODE[:CAPS]]", s)
	}
	f := ociimage.File{Src: parts[0], Dst: parts[1]}
	if len(parts) > 2 && parts[2] != "" {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil {
			return f, fmt.Errorf("--file %q: mode: %w", s, err)
		}
		f.Mode = fs.FileMode(m)
	}
	if len(parts) > 3 {
		f.Caps = parts[3]
	}
	return f, nil
}
