package kubelet_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/draind/draind/e2e/kubelet/internal/fcap"
)

// dockerfile is the root Dockerfile, parsed by BuildKit's own parser.
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs map[string]string // ARGs before the first FROM, with their defaults
}

func parseDockerfile(t *testing.T) dockerfile { return parseDockerfileAt(t, "Dockerfile") }

// parseDockerfileAt parses the Dockerfile at rel, from the repository root.
func parseDockerfileAt(t *testing.T, rel string) dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", rel, w.Short)
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	d := dockerfile{stages: stages, metaArgs: map[string]string{}}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			d.metaArgs[kv.Key] = kv.ValueString()
		}
	}
	return d
}

// expand replaces ${NAME} with the global ARG defaults.
func (d dockerfile) expand(s string) string {
	return os.Expand(s, func(k string) string { return d.metaArgs[k] })
}

func (d dockerfile) stage(name string) *instructions.Stage {
	for i := range d.stages {
		if d.stages[i].Name == name {
			return &d.stages[i]
		}
	}
	return nil
}

func commandsOf[T any](s *instructions.Stage) []T {
	var out []T
	for _, c := range s.Commands {
		if v, ok := c.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

var envoyRef = regexp.MustCompile(`^docker\.io/envoyproxy/envoy:(?:distroless-)?v(\d+)\.(\d+)\.(\d+)@sha256:[0-9a-f]{64}$`)

// The final image is a pinned Envoy ≥ 1.34 (tag and digest).
func TestDockerfileBase(t *testing.T) {
	d := parseDockerfile(t)
	final := d.stages[len(d.stages)-1]
	base := d.expand(final.BaseName)
	m := envoyRef.FindStringSubmatch(base)
	if m == nil {
		t.Fatalf("final stage FROM %q: want docker.io/envoyproxy/envoy:vX.Y.Z@sha256:DIGEST", base)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 1 || (major == 1 && minor < 34) {
		t.Errorf("Envoy %s.%s: want ≥ 1.34 (drain semantics changed in 1.34)", m[1], m[2])
	}
	labels := map[string]string{}
	for _, l := range commandsOf[*instructions.LabelCommand](&final) {
		for _, kv := range l.Labels {
			labels[kv.Key] = strings.Trim(kv.Value, `"`)
		}
	}
	for _, k := range []string{"title", "description", "source", "version", "base.name", "base.digest"} {
		if labels["org.opencontainers.image."+k] == "" {
			t.Errorf("no LABEL org.opencontainers.image.%s", k)
		}
	}
	if got, want := labels["org.opencontainers.image.base.name"]+"@"+labels["org.opencontainers.image.base.digest"], base; got != want {
		t.Errorf("base labels %q, FROM %q", got, want)
	}
	users := commandsOf[*instructions.UserCommand](&final)
	if len(users) == 0 || users[len(users)-1].User != "1337:1337" {
		t.Errorf("final USER: want 1337:1337 (the proxy uid)")
	}
}

// The build stage builds a static, stamped draind, and every COPY source
// exists in the repository and passes .dockerignore.
func TestDockerfileBuildStage(t *testing.T) {
	d := parseDockerfile(t)
	build := d.stage("build")
	if build == nil {
		t.Fatal("no stage named build")
	}
	ignore := dockerignore(t)
	for _, c := range commandsOf[*instructions.CopyCommand](build) {
		if c.From != "" {
			continue
		}
		for _, src := range c.SourcePaths {
			p := filepath.Join(repoRoot, filepath.FromSlash(src))
			if _, err := os.Stat(p); err != nil {
				t.Errorf("COPY %s: %v", src, err)
			}
			if excluded, _ := ignore.MatchesOrParentMatches(strings.TrimSuffix(src, "/")); excluded {
				t.Errorf("COPY %s: excluded by .dockerignore", src)
			}
		}
	}
	var draindBuild string
	for _, r := range commandsOf[*instructions.RunCommand](build) {
		line := strings.Join(r.CmdLine, " ")
		if strings.Contains(line, "./cmd/draind") {
			draindBuild = line
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X github.com/draind/draind/internal/cli.Version=${VERSION}"} {
		if !strings.Contains(draindBuild, want) {
			t.Errorf("draind's go build lacks %q: %s", want, draindBuild)
		}
	}
	cli, _ := os.ReadFile(filepath.Join(repoRoot, "internal/cli/cli.go"))
	if !regexp.MustCompile(`(?m)^var Version = `).Match(cli) {
		t.Errorf("internal/cli has no `var Version`: the -X stamp would be a no-op")
	}
	// The Go image is at least the go.mod's go version.
	gomod, _ := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	img := regexp.MustCompile(`golang:(\d+\.\d+)`).FindStringSubmatch(d.metaArgs["GO_IMAGE"])
	if goVer == nil || img == nil || versionLess(img[1], string(goVer[1])) {
		t.Errorf("GO_IMAGE %q older than go.mod's go %s", d.metaArgs["GO_IMAGE"], goVer[1])
	}
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

func dockerignore(t *testing.T) *patternmatcher.PatternMatcher {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// draind lands in the final stage with file capabilities that give a
// non-root uid CAP_BPF and CAP_PERFMON, written by setfcap in the same
// step (a bind mount of the build stage's output).
func TestDockerfileFileCapabilities(t *testing.T) {
	d := parseDockerfile(t)
	final := &d.stages[len(d.stages)-1]
	capsArg := ""
	for _, a := range commandsOf[*instructions.ArgCommand](final) {
		for _, kv := range a.Args {
			if kv.Key == "DRAIND_FILE_CAPS" {
				capsArg = kv.ValueString()
			}
		}
	}
	set, err := fcap.Parse(capsArg)
	if err != nil {
		t.Fatalf("ARG DRAIND_FILE_CAPS=%q: %v", capsArg, err)
	}
	if !slices.Contains(set.Permitted, 38) || !slices.Contains(set.Permitted, 39) {
		t.Errorf("DRAIND_FILE_CAPS %q: want cap_bpf and cap_perfmon", capsArg)
	}
	if set.Effective {
		t.Errorf("DRAIND_FILE_CAPS %q: want no effective bit (+p): execve refuses a +ep binary whose capabilities are not all in the bounding set", capsArg)
	}
	if capsArg != imageFileCaps {
		t.Errorf("DRAIND_FILE_CAPS %q, but the e2e images carry %q (main_test.go's imageFileCaps)", capsArg, imageFileCaps)
	}
	var found bool
	for _, r := range commandsOf[*instructions.RunCommand](final) {
		if r.PrependShell {
			t.Errorf("RUN %v in the final stage uses a shell; the distroless base has none", r.CmdLine)
		}
		// Mount options are parsed when the command is expanded.
		if err := r.Expand(func(w string) (string, error) { return d.expand(w), nil }); err != nil {
			t.Fatal(err)
		}
		for _, m := range instructions.GetMounts(r) {
			if m.From != "build" || d.stage(m.From) == nil {
				t.Errorf("RUN mounts from %q: no such stage", m.From)
			}
			args := r.CmdLine
			if len(args) == 5 && args[0] == m.Target+"/setfcap" && args[1] == "--caps-env" && args[2] == "DRAIND_FILE_CAPS" &&
				args[3] == m.Target+"/draind" && args[4] == "/usr/local/bin/draind" {
				found = true
			}
		}
	}
	if !found {
		t.Error("no RUN --mount=type=bind,from=build ... setfcap --caps-env DRAIND_FILE_CAPS <mount>/draind /usr/local/bin/draind in the final stage")
	}
	// The build stage writes both files the RUN reads.
	var outs []string
	for _, r := range commandsOf[*instructions.RunCommand](d.stage("build")) {
		outs = append(outs, regexp.MustCompile(`-o (/out/\S+)`).FindAllString(strings.Join(r.CmdLine, " "), -1)...)
	}
	if !slices.Contains(outs, "-o /out/draind") || !slices.Contains(outs, "-o /out/setfcap") {
		t.Errorf("the build stage writes %v; want /out/draind and /out/setfcap", outs)
	}
}

// ENTRYPOINT + CMD is the README's documented `draind run [flags] -- envoy ARGS`.
func TestDockerfileEntrypoint(t *testing.T) {
	d := parseDockerfile(t)
	final := &d.stages[len(d.stages)-1]
	eps := commandsOf[*instructions.EntrypointCommand](final)
	cmds := commandsOf[*instructions.CmdCommand](final)
	if len(eps) == 0 || len(cmds) == 0 {
		t.Fatal("final stage needs ENTRYPOINT and CMD")
	}
	ep, cmd := eps[len(eps)-1], cmds[len(cmds)-1]
	if ep.PrependShell || cmd.PrependShell {
		t.Fatal("ENTRYPOINT and CMD must be exec form (no shell in the image)")
	}
	argv := append(slices.Clone(ep.CmdLine), cmd.CmdLine...)
	checkDraindRun(t, "Dockerfile", argv)
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The README's pod example: command: ["draind", "run", ... "--", "envoy", ...]
	m := regexp.MustCompile(`(?s)## In a pod.*?command: \[(.*?)\]`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no `command: [...]` in the In a pod section")
	}
	var readmeArgv []string
	for _, q := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(m[1], -1) {
		readmeArgv = append(readmeArgv, string(q[1]))
	}
	checkDraindRun(t, "README.md", readmeArgv)
	// The same Envoy flags as the README's example.
	for _, flag := range []string{"-c", "--drain-time-s", "--drain-strategy"} {
		if slices.Contains(readmeArgv, flag) != slices.Contains(argv, flag) {
			t.Errorf("Envoy flag %s: README %v, image %v", flag, readmeArgv, argv)
		}
	}
}

// checkDraindRun: argv is draind run [flags] -- envoy [args].
func checkDraindRun(t *testing.T, where string, argv []string) {
	t.Helper()
	sep := slices.Index(argv, "--")
	if len(argv) < 4 || filepath.Base(argv[0]) != "draind" || argv[1] != "run" || sep < 2 || sep+1 >= len(argv) || filepath.Base(argv[sep+1]) != "envoy" {
		t.Errorf("%s: %q is not `draind run [flags] -- envoy ARGS`", where, argv)
	}
}
