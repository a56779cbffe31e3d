package cri

import (
	"context"
	"os"
	"path/filepath"
	"slices"
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

// fakeProc is a /proc with one process per entry (pid → argv) beside
// PID 1, the node's init: its ns/pid and ns/mnt files and its root
// directory are the node's. Each process shares them (links to PID 1's;
// its cwd is the node's /srv) unless tenants gives it its own ("pid",
// "mnt", "root"); "self", this process, shares the namespaces with a
// root of its own (a debug pod's). Files are written under the fake
// /proc (the node's root is 1/root). Without PID 1 (noInit), self's
// namespaces are the node's and its root the kubelets'.
func fakeProc(t *testing.T, procs map[string][]string, tenants map[string][]string, files map[string]string, noInit bool) string {
	t.Helper()
	proc := t.TempDir()
	node := "1"
	if noInit {
		node = "self"
	}
	mkdir := func(p string) { must(t, os.MkdirAll(filepath.Join(proc, p), 0o755)) }
	mkdir(node + "/ns")
	mkdir(node + "/root/srv")
	for _, ns := range []string{"pid", "mnt"} {
		must(t, os.WriteFile(filepath.Join(proc, node, "ns", ns), nil, 0o644))
	}
	if !noInit {
		mkdir("self/ns")
		mkdir("self/root")
		for _, ns := range []string{"pid", "mnt"} {
			must(t, os.Symlink(filepath.Join(proc, "1/ns", ns), filepath.Join(proc, "self/ns", ns)))
		}
	}
	for pid, argv := range procs {
		dir := filepath.Join(proc, pid)
		mkdir(pid + "/ns")
		own := tenants[pid]
		for _, ns := range []string{"pid", "mnt"} {
			if slices.Contains(own, ns) {
				must(t, os.WriteFile(filepath.Join(dir, "ns", ns), nil, 0o644))
			} else {
				must(t, os.Symlink(filepath.Join(proc, node, "ns", ns), filepath.Join(dir, "ns", ns)))
			}
		}
		root := filepath.Join(proc, node, "root")
		if slices.Contains(own, "root") {
			root = filepath.Join(proc, "roots", pid)
			mkdir("roots/" + pid + "/srv")
		}
		must(t, os.Symlink(root, filepath.Join(dir, "root")))
		must(t, os.Symlink(filepath.Join(root, "srv"), filepath.Join(dir, "cwd")))
		must(t, os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644))
	}
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
	evil := []string{"/tenant/kubelet", "--container-runtime-endpoint=unix:///tenant.sock"}
	tests := []struct {
		name    string
		given   string
		procs   map[string][]string
		tenants map[string][]string
		files   map[string]string
		noInit  bool
		want    string // Socket, relative to the fake /proc when it starts with "@"
		wantWhy string
		wantPID int
		wantErr string
	}{
		{name: "given", given: "unix:///x/c.sock", want: "/x/c.sock", wantWhy: "--cri-endpoint"},
		{name: "kubelet flag", procs: map[string][]string{"7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}, "8": {"/bin/sh"}},
			want: "@1/root/run/k.sock", wantWhy: "kubelet pid 7 (/usr/bin/kubelet, in PID 1's namespaces) --container-runtime-endpoint, reached through", wantPID: 7},
		{name: "kubelet config", procs: map[string][]string{"9": {"kubelet", "--config", "/etc/kubelet.yaml", "--v", "3"}},
			files: map[string]string{"1/root/etc/kubelet.yaml": "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/draind-cluster/node/containerd.sock\n"},
			want:  "@1/root/run/draind-cluster/node/containerd.sock", wantWhy: "kubelet pid 9 (kubelet, in PID 1's namespaces) --config /etc/kubelet.yaml containerRuntimeEndpoint", wantPID: 9},
		{name: "kubelet config relative", procs: map[string][]string{"9": {"kubelet", "--config=k.yaml"}},
			files: map[string]string{"1/root/srv/k.yaml": "containerRuntimeEndpoint: /run/r.sock\n"},
			want:  "@1/root/run/r.sock", wantWhy: "containerRuntimeEndpoint", wantPID: 9},
		{name: "kubelet config without the field", procs: map[string][]string{"9": {"kubelet", "--config=/k.yaml"}},
			files: map[string]string{"1/root/k.yaml": "kind: KubeletConfiguration\n"},
			want:  "@1/root/run/containerd/containerd.sock", wantWhy: "the kubelet's default", wantPID: 9},
		{name: "kubelet config a link out of the node's root", procs: map[string][]string{"9": {"kubelet", "--config=/k.yaml"}},
			files: map[string]string{"1/root/run/containerd/containerd.sock": ""},
			want:  "@1/root/run/containerd/containerd.sock", wantWhy: "default, under"},
		{name: "no kubelet", procs: map[string][]string{"2": {"/sbin/init"}},
			want: "/run/containerd/containerd.sock", wantWhy: "no kubelet in PID 1's namespaces"},
		// A tenant's kubelet, with the lowest PID, and the node's: the
		// node's, however the tenant's differs.
		{name: "a tenant's kubelet in its own PID namespace", procs: map[string][]string{"3": evil, "7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}},
			tenants: map[string][]string{"3": {"pid", "mnt", "root"}},
			want:    "@1/root/run/k.sock", wantWhy: "kubelet pid 3 not trusted: another PID namespace", wantPID: 7},
		{name: "a tenant's kubelet in its own mount namespace", procs: map[string][]string{"3": evil, "7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}},
			tenants: map[string][]string{"3": {"mnt"}},
			want:    "@1/root/run/k.sock", wantWhy: "kubelet pid 3 not trusted: another mount namespace", wantPID: 7},
		{name: "a tenant's kubelet chrooted", procs: map[string][]string{"3": evil, "7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}},
			tenants: map[string][]string{"3": {"root"}},
			want:    "@1/root/run/k.sock", wantWhy: "kubelet pid 3 not trusted: another root", wantPID: 7},
		{name: "only a tenant's kubelet", procs: map[string][]string{"3": evil}, tenants: map[string][]string{"3": {"pid", "mnt", "root"}},
			want: "/run/containerd/containerd.sock", wantWhy: "kubelet pid 3 not trusted"},
		{name: "two kubelets", procs: map[string][]string{"7": {"kubelet"}, "12": {"/usr/bin/kubelet"}},
			wantErr: "2 kubelets in PID 1's namespaces (pids 7, 12): name the runtime's socket (--cri-endpoint)"},
		{name: "PID 1 unreadable", noInit: true, procs: map[string][]string{"3": evil, "7": {"/usr/bin/kubelet", "--container-runtime-endpoint=unix:///run/k.sock"}},
			tenants: map[string][]string{"3": {"pid"}},
			want:    "/run/k.sock", wantWhy: "kubelet pid 7 (/usr/bin/kubelet, in this process's namespaces) --container-runtime-endpoint; PID 1's namespaces unreadable (no such file or directory): this process's stand for the node's; kubelet pid 3 not trusted: another PID namespace", wantPID: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc := fakeProc(t, tt.procs, tt.tenants, tt.files, tt.noInit)
			if tt.name == "kubelet config a link out of the node's root" {
				outside := filepath.Join(t.TempDir(), "k.yaml")
				must(t, os.WriteFile(outside, []byte("containerRuntimeEndpoint: unix:///outside.sock\n"), 0o644))
				must(t, os.Symlink(outside, filepath.Join(proc, "1/root/k.yaml")))
			}
			ep, err := locator{proc: proc}.locate(context.Background(), tt.given, "--cri-endpoint")
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("%+v, %v; want the error %q", ep, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if strings.HasPrefix(want, "@") {
				want = filepath.Join(proc, want[1:])
			}
			if ep.Socket != want || !strings.Contains(ep.Why, tt.wantWhy) || ep.KubeletPID != tt.wantPID {
				t.Errorf("socket %q why %q kubelet %d; want %q, a why with %q, kubelet %d", ep.Socket, ep.Why, ep.KubeletPID, want, tt.wantWhy, tt.wantPID)
			}
		})
	}
	if _, err := Locate(context.Background(), "tcp://10.0.0.1:1", "CONTAINER_RUNTIME_ENDPOINT"); err == nil || !strings.Contains(err.Error(), "CONTAINER_RUNTIME_ENDPOINT") {
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
