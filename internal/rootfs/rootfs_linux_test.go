package rootfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReadFile reads through a root a tenant made: what is inside is read,
// links resolve inside the root (an absolute one, "..", a magic one), and
// what could stall or flood the reader is refused without waiting: a FIFO
// nobody writes, a device, a file over the limit.
func TestReadFile(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	must(t, os.WriteFile(secret, []byte("the reader's own file"), 0o644))
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "etc/d"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "etc/ok"), []byte("inside"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "secret"), []byte("the root's own secret"), 0o644))
	must(t, os.Symlink("../ok", filepath.Join(root, "etc/d/rel")))
	must(t, os.Symlink(secret, filepath.Join(root, "etc/abs")))                          // resolves to root/OUTSIDE/secret: missing
	must(t, os.Symlink("../../../../../../../../secret", filepath.Join(root, "etc/up"))) // root/secret
	must(t, os.Symlink("/proc/self/root"+secret, filepath.Join(root, "etc/magic")))
	must(t, os.Symlink("/dev/urandom", filepath.Join(root, "etc/urandom")))
	must(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	must(t, unix.Mkfifo(filepath.Join(root, "etc/fifo"), 0o644))
	big := filepath.Join(root, "etc/big")
	must(t, os.WriteFile(big, nil, 0o644))
	must(t, os.Truncate(big, 100<<20))
	// /dev/urandom inside the root, as a container has it (root only).
	devInRoot := unix.Mknod(filepath.Join(root, "dev/urandom"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 9))) == nil

	read := func(path string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return ReadFile(ctx, root, path, 1024)
	}
	for path, want := range map[string]string{"/etc/ok": "inside", "etc/ok": "inside", "/etc/d/rel": "inside", "/etc/up": "the root's own secret"} {
		if b, err := read(path); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", path, b, err, want)
		}
	}
	if _, err := read("/etc/abs"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an absolute link out of the root: %v, want it resolved inside (missing there)", err)
	}
	if _, err := read("/etc/magic"); !errors.Is(err, unix.ELOOP) && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a link through /proc/self: %v, want refused", err)
	}
	if _, err := read("/etc/fifo"); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "FIFO") {
		t.Errorf("a FIFO: %v, want ErrNotRegular naming it", err)
	}
	if _, err := read("/etc/urandom"); devInRoot && !errors.Is(err, ErrNotRegular) || !devInRoot && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a link to /dev/urandom (a device in the root: %v): %v", devInRoot, err)
	}
	if _, err := read("/etc/big"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("100 MB: %v, want ErrTooLarge", err)
	}
	if _, err := read("/etc"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("a directory: %v, want ErrNotRegular", err)
	}
	// A file whose size says nothing (procfs: 0) is read to the limit
	// and refused past it.
	if _, err := ReadFile(context.Background(), "/", "/proc/self/environ", 1); os.Getenv("PATH") != "" && !errors.Is(err, ErrTooLarge) {
		t.Errorf("/proc/self/environ to 1 byte: %v, want ErrTooLarge", err)
	}
	// Root "": this process's own files, as open(2) resolves them.
	if b, err := ReadFile(context.Background(), "", secret, 1024); err != nil || string(b) != "the reader's own file" {
		t.Errorf("own file: %q, %v", b, err)
	}
	if _, err := ReadFile(context.Background(), "", filepath.Join(root, "etc/fifo"), 1024); !errors.Is(err, ErrNotRegular) {
		t.Errorf("own FIFO: %v, want ErrNotRegular", err)
	}
}

// TestReadFileContext: a context that has ended returns at once.
func TestReadFileContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	// Either the read won the race or the context did; never anything else.
	if b, err := ReadFile(ctx, dir, "f", 10); err != nil && !errors.Is(err, context.Canceled) || err == nil && string(b) != "x" {
		t.Errorf("%q, %v", b, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
