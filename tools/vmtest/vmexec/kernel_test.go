package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const sampleModulesDep = `kernel/fs/netfs/netfs.ko.xz:
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz: kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/ipv4/inet_diag.ko.xz:
kernel/net/ipv4/tcp_diag.ko.xz: kernel/net/ipv4/inet_diag.ko.xz
kernel/drivers/net/veth.ko.xz:
`

func TestModuleResolve(t *testing.T) {
	ix := &moduleIndex{deps: map[string][]string{}, byName: map[string]string{}, builtin: map[string]bool{}}
	if err := ix.parseDep(strings.NewReader(sampleModulesDep)); err != nil {
		t.Fatal(err)
	}
	ix.parseBuiltin(strings.NewReader("kernel/drivers/virtio/virtio_pci.ko\nkernel/drivers/char/virtio_console.ko\n"))

	files, missing := ix.resolve([]string{"virtio_pci", "9pnet-virtio", "9p", "tcp_diag", "inet_diag", "nosuch"})
	want := []string{
		"kernel/fs/netfs/netfs.ko.xz",
		"kernel/net/9p/9pnet.ko.xz",
		"kernel/net/9p/9pnet_virtio.ko.xz",
		"kernel/fs/9p/9p.ko.xz",
		"kernel/net/ipv4/inet_diag.ko.xz",
		"kernel/net/ipv4/tcp_diag.ko.xz",
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("files =\n%q\nwant\n%q", files, want)
	}
	if !reflect.DeepEqual(missing, []string{"nosuch"}) {
		t.Errorf("missing = %q", missing)
	}
}

func TestKernelFromDir(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "lib", "modules", "6.1.0-50-amd64")
	for _, d := range []string{filepath.Join(dir, "boot"), filepath.Join(mod, "kernel", "net")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, content := range map[string]string{
		filepath.Join(dir, "boot", "vmlinuz-6.1.0-50-amd64"): "bzImage",
		filepath.Join(mod, "modules.dep"):                    "kernel/net/plain.ko:\nkernel/net/gz.ko.gz: kernel/net/plain.ko\n",
		filepath.Join(mod, "kernel", "net", "plain.ko"):      "ELF plain",
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var gz bytes.Buffer
	writeGzip(t, &gz, "ELF gz")
	if err := os.WriteFile(filepath.Join(mod, "kernel", "net", "gz.ko.gz"), gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	k, err := resolveKernel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k.Release != "6.1.0-50-amd64" || k.ModDir != mod || filepath.Base(k.Vmlinuz) != "vmlinuz-6.1.0-50-amd64" {
		t.Errorf("kernel = %+v", k)
	}

	files, err := moduleFiles(context.Background(), k, []string{"gz", "absent"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Name != "/modules/00-plain.ko" || string(files[0].Data) != "ELF plain" ||
		files[1].Name != "/modules/01-gz.ko" || string(files[1].Data) != "ELF gz" {
		t.Errorf("module files = %+v", files)
	}

	t.Setenv("DRAIND_VM_CACHE", t.TempDir())
	if _, err := resolveKernel("9.9"); err == nil || !strings.Contains(err.Error(), "--fetch") {
		t.Errorf("uncached alias: err = %v", err)
	}
	if _, err := resolveKernel(""); err == nil {
		t.Error("empty kernel: want an error")
	}
}
