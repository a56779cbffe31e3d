package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestExtractFlags(t *testing.T) {
	vm, rest := extractFlags([]string{
		"/tmp/x.test", "-test.v=true", "-vm.kernel=6.12", "-test.timeout", "5m",
		"--vm.memory", "2G", "-vm.smp", "4", "-test.run=X", "--", "-vm.kernel=literal",
	}, vmFlags)
	want := map[string]string{"vm.kernel": "6.12", "vm.memory": "2G", "vm.smp": "4"}
	if !reflect.DeepEqual(vm, want) {
		t.Errorf("vm flags = %v, want %v", vm, want)
	}
	wantRest := []string{"/tmp/x.test", "-test.v=true", "-test.timeout", "5m", "-test.run=X", "--", "-vm.kernel=literal"}
	if !reflect.DeepEqual(rest, wantRest) {
		t.Errorf("rest = %q, want %q", rest, wantRest)
	}
}

func TestTimeoutFor(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"x.test", "-test.timeout=10m0s"}, 10*time.Minute + bootMargin},
		{[]string{"x.test", "-test.timeout", "30s"}, 30*time.Second + bootMargin},
		{[]string{"x.test", "-test.timeout=0"}, defaultTimeout},
		{[]string{"x.test", "-test.timeout=1m", "-test.timeout=2m"}, 2*time.Minute + bootMargin},
		{[]string{"x.test", "--", "-test.timeout=1m"}, defaultTimeout},
		{[]string{"x.test"}, defaultTimeout},
	} {
		if got := timeoutFor(tc.args); got != tc.want {
			t.Errorf("timeoutFor(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestLoadVimtoConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string // "" for no file
		want    vimtoConfig
		wantErr bool
	}{
		{
			name: "vimto's keys, the runner's three read",
			content: `# comment
kernel="ghcr.io/cilium/ci-kernels:stable" # trailing
smp = "cpus=2"
memory='768M'
user="root"
sudo = true
setup=[
  "mount -t cgroup2 -o nosuid,noexec,nodev cgroup2 /sys/fs/cgroup",
  "/bin/sh -c 'modprobe bpf_testmod || true'", # why
]
teardown = []
`,
			want: vimtoConfig{Kernel: "ghcr.io/cilium/ci-kernels:stable", Memory: "768M", SMP: "cpus=2"},
		},
		{name: "no file", want: vimtoConfig{}},
		{name: "unterminated string", content: `kernel = "x`, wantErr: true},
		{name: "duplicate key", content: "memory = \"1G\"\nmemory = \"2G\"\n", wantErr: true},
		{name: "memory is not a string", content: "memory = 1536\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				if err := os.WriteFile(filepath.Join(dir, ".vimto.toml"), []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
				tc.want.Dir = dir
			}
			cfg, err := loadVimtoConfig(dir)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("loaded %+v, want an error", cfg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *cfg != tc.want {
				t.Errorf("config = %+v, want %+v", *cfg, tc.want)
			}
		})
	}
}

// The repository's .vimto.toml must stay parseable.
func TestRepositoryVimtoConfig(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadVimtoConfig(cwd)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kernel == "" || cfg.Memory == "" || cfg.SMP == "" {
		t.Errorf(".vimto.toml not found or incomplete: %+v", cfg)
	}
	if k := cfg.usableKernel(); k != "" {
		t.Errorf("usableKernel() = %q for an OCI reference, want empty", k)
	}
}

func TestParseOptionsPrecedence(t *testing.T) {
	dir := t.TempDir()
	kdir := filepath.Join(dir, "kernel")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	toml := "kernel = \"kernel\"\nmemory = \"size=512M\"\n"
	if err := os.WriteFile(filepath.Join(dir, ".vimto.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(dir, "pkg")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	o, err := parseOptions([]string{"/x.test", "-test.timeout=1m"}, getenv, pkg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Kernel != kdir || o.Memory != "size=512M" || o.SMP != defaultSMP || o.Timeout != time.Minute+bootMargin {
		t.Errorf("from .vimto.toml: %+v", o)
	}

	env["DRAIND_VM_KERNEL"] = "5.10"
	env["DRAIND_VM_MODULES"] = "sch_netem, veth"
	o, err = parseOptions([]string{"/x.test"}, getenv, pkg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Kernel != "5.10" {
		t.Errorf("env kernel: got %q", o.Kernel)
	}
	if got := o.Modules[len(o.Modules)-2:]; !reflect.DeepEqual(got, []string{"sch_netem", "veth"}) {
		t.Errorf("extra modules = %q", got)
	}

	o, err = parseOptions([]string{"--kernel", "6.1", "--timeout", "3m", "--", "/x.test", "-vm.kernel=6.12", "-test.v"}, getenv, pkg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Kernel != "6.12" || o.Timeout != 3*time.Minute || !reflect.DeepEqual(o.Args, []string{"/x.test", "-test.v"}) {
		t.Errorf("flags: %+v", o)
	}

	if _, err := parseOptions([]string{"--kernel", "6.1"}, getenv, pkg, io.Discard); err == nil {
		t.Error("no binary: want an error")
	}
}
