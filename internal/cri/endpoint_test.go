package cri

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFlagValue(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--config", "/a"}, "/a"},
		{[]string{"--config=/a"}, "/a"},
		{[]string{"-config", "/a", "--config=/b"}, "/b"},
		{[]string{"--configx=/a", "config", "/b"}, ""},
		{[]string{"--", "--config=/a"}, ""},
		{[]string{"--config"}, ""},
	}
	for _, tt := range tests {
		if got := FlagValue(tt.args, "config"); got != tt.want {
			t.Errorf("FlagValue(%q) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

func TestSocketPath(t *testing.T) {
	for in, want := range map[string]string{
		"unix:///run/containerd/containerd.sock": "/run/containerd/containerd.sock",
		"/run/crio/crio.sock":                    "/run/crio/crio.sock",
		"unix:///run//x/../c.sock":               "/run/c.sock",
	} {
		if got, err := socketPath(in); err != nil || got != want {
			t.Errorf("socketPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"tcp://127.0.0.1:1234", "npipe:////./pipe/x", "run/x.sock", "unix://run/x.sock"} {
		if _, err := socketPath(bad); err == nil {
			t.Errorf("socketPath(%q): no error", bad)
		}
	}
}

// fakeProc is a /proc with one process per entry (pid → argv), each with
// a root directory of its own; files are written under root/PID.
func fakeProc(t *testing.T, procs map[string][]string, files map[string]string) string {
	t.Helper()
	proc := t.TempDir()
	for pid, argv := range procs {
		dir := filepath.Join(proc, pid)
		must(t, os.MkdirAll(filepath.Join(dir, "root"), 0o755))
		must(t, os.MkdirAll(filepath.Join(dir, "cwd"), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644))
	}
	must(t, os.MkdirAll(filepath.Join(proc, "self", "root"), 0o755))
	for p, s := range files {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(proc, p)), 0o755))
		must(t, os.WriteFile(filepath.Join(proc, p), []byte(s), 0o644))
	}
	return proc
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestLocate(t *testing.T) {
	tests := []struct {
		name         string
		given        string
		procs        map[string][]string
		files        map[string]string
		want         string // Socket, relative to the fake /proc when it starts with "@"
		wantWhy      string
		wantRootFrom string
	}{
		{name: "given", given: "unix:///x/c.sock", want: "/x/c.sock", wantWhy: "--cri-endpoint"},
		{name: "kubelet flag", procs: map[string][]string{"7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}, "8": {"/bin/sh"}},
			want: "@7/root/run/k.sock", wantWhy: "kubelet pid 7 --container-runtime-endpoint, reached through"},
		{name: "kubelet config", procs: map[string][]string{"9": {"kubelet", "--config", "/etc/kubelet.yaml", "--v", "3"}},
			files: map[string]string{"9/root/etc/kubelet.yaml": "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/draind-cluster/node/containerd.sock\n"},
			want:  "@9/root/run/draind-cluster/node/containerd.sock", wantWhy: "kubelet pid 9 --config /etc/kubelet.yaml containerRuntimeEndpoint"},
		{name: "kubelet config relative", procs: map[string][]string{"9": {"kubelet", "--config=k.yaml"}},
			files: map[string]string{"9/cwd/k.yaml": "containerRuntimeEndpoint: /run/r.sock\n"},
			want:  "@9/root/run/r.sock", wantWhy: "containerRuntimeEndpoint"},
		{name: "kubelet config without the field", procs: map[string][]string{"9": {"kubelet", "--config=/k.yaml"}},
			files: map[string]string{"9/root/k.yaml": "kind: KubeletConfiguration\n"},
			want:  "@9/root/run/containerd/containerd.sock", wantWhy: "the kubelet's default"},
		{name: "no kubelet", procs: map[string][]string{"1": {"/sbin/init"}},
			want: "/run/containerd/containerd.sock", wantWhy: "no kubelet in"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc := fakeProc(t, tt.procs, tt.files)
			ep, err := locator{proc: proc}.locate(tt.given, "--cri-endpoint")
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if strings.HasPrefix(want, "@") {
				want = filepath.Join(proc, want[1:])
			}
			if ep.Socket != want || !strings.Contains(ep.Why, tt.wantWhy) {
				t.Errorf("socket %q why %q; want %q, a why with %q", ep.Socket, ep.Why, want, tt.wantWhy)
			}
		})
	}
	if _, err := Locate("tcp://10.0.0.1:1", "CONTAINER_RUNTIME_ENDPOINT"); err == nil || !strings.Contains(err.Error(), "CONTAINER_RUNTIME_ENDPOINT") {
		t.Errorf("a tcp endpoint: %v, want an error naming the variable", err)
	}
}

func TestParseInfo(t *testing.T) {
	v := parseInfo(map[string]string{"info": `{"pid":42,"runtimeSpec":{"process":{"args":["/usr/local/bin/draind","run","--","envoy"],"env":["A=1"]},
		"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`})
	if v.PID != 42 || v.netNS() != "/var/run/netns/cni-1" || len(v.args()) != 4 || v.env()[0] != "A=1" {
		t.Errorf("parsed %+v", v)
	}
	if v := parseInfo(map[string]string{"info": "not json"}); v.PID != 0 || v.args() != nil || v.netNS() != "" {
		t.Errorf("malformed: %+v", v)
	}
}
