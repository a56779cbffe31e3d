package main

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestArchOfAndGuestInit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	arch, err := archOf(self)
	if err != nil {
		t.Fatal(err)
	}
	if arch.goarch != runtime.GOARCH {
		t.Fatalf("archOf(the test binary) = %s, want %s", arch.goarch, runtime.GOARCH)
	}
	if _, err := archOf("config.go"); err == nil {
		t.Error("archOf(a Go source file): no error")
	}
	// A guest of another architecture needs vmexec-ARCH beside the runner.
	other := &guestArches[0]
	if other.goarch == runtime.GOARCH {
		other = &guestArches[1]
	}
	missing := filepath.Join(t.TempDir(), "vmexec")
	if _, err := guestInit(missing, "", other); err == nil || !strings.Contains(err.Error(), "vmexec-"+other.goarch) {
		t.Errorf("guestInit for %s without vmexec-%s: %v", other.goarch, other.goarch, err)
	}
	// An init of the wrong architecture is refused.
	if _, err := guestInit(missing, self, other); err == nil || !strings.Contains(err.Error(), "built for "+runtime.GOARCH) {
		t.Errorf("guestInit with an init for %s, guest %s: %v", runtime.GOARCH, other.goarch, err)
	}
	// The host's root for the host's architecture; a missing cached root
	// for another names the command that builds it.
	if root, err := guestRoot("", arch); err != nil || root != "/" {
		t.Errorf("guestRoot(host arch) = %q, %v", root, err)
	}
	t.Setenv("DRAIND_VM_CACHE", t.TempDir())
	if _, err := guestRoot("", other); err == nil || !strings.Contains(err.Error(), "--arch "+other.goarch) {
		t.Errorf("guestRoot(%s) without a cached root: %v", other.goarch, err)
	}
}

func TestParseOptionsCgroup2AndTmpfs(t *testing.T) {
	env := map[string]string{"DRAIND_VM_CGROUP2": "1", "DRAIND_VM_TMPFS": "/var/lib/a, /var/lib/b/"}
	getenv := func(k string) string { return env[k] }
	o, err := parseOptions([]string{"--append", "quiet", "/x.test"}, getenv, t.TempDir(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Append != cgroup2Cmdline+" quiet" {
		t.Errorf("append = %q", o.Append)
	}
	if strings.Join(o.Tmpfs, " ") != "/var/lib/a /var/lib/b" {
		t.Errorf("tmpfs = %q", o.Tmpfs)
	}
	if _, err := parseOptions([]string{"--tmpfs", "relative", "/x.test"}, func(string) string { return "" }, t.TempDir(), io.Discard); err == nil {
		t.Error("--tmpfs relative: no error")
	}
}
