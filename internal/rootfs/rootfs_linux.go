package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors callers branch on (errors.Is). A missing file wraps
// fs.ErrNotExist.
var (
	// ErrNotRegular means the path names a FIFO, a device, a socket or a
	// directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge means the file holds more than the limit.
	ErrTooLarge = errors.New("larger than the limit")
	// ErrNoOpenat2 means the kernel (before 5.6) or a seccomp filter
	// refuses openat2.
	ErrNoOpenat2 = errors.New("openat2 unavailable")
)

// ReadFile reads the regular file at path, resolved inside root as if
// root were "/" (a relative path starts at root too; root "": this
// process's own files, resolved as open(2) does), at most limit
// bytes, within ctx. The read runs on a goroutine of its own: when ctx
// ends first, ReadFile returns ctx's error at once and that goroutine
// ends (closing the file) when its system call returns, which only a
// hung filesystem (FUSE, NFS) delays; nothing waits for it.
func ReadFile(ctx context.Context, root, path string, limit int64) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1) // never blocks the reader
	go func() {
		b, err := readFile(root, path, limit)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", path, ctx.Err())
	}
}

func readFile(root, path string, limit int64) ([]byte, error) {
	fd, err := open(root, path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(st.Mode))
	}
	if st.Size > limit {
		return nil, fmt.Errorf("%s: %w (%d bytes, the limit %d)", path, ErrTooLarge, st.Size, limit)
	}
	// The size can lie (procfs says 0) or grow: read up to one byte past
	// the limit to know.
	b := make([]byte, min(st.Size, limit)+1)
	n := 0
	for {
		if n == len(b) {
			if int64(n) > limit {
				return nil, fmt.Errorf("%s: %w (the limit %d)", path, ErrTooLarge, limit)
			}
			b = append(b, make([]byte, min(int64(len(b)), limit+1-int64(len(b))))...)
		}
		m, err := unix.Read(fd, b[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return b[:n], nil
		}
		n += m
	}
}

// flags open without waiting: a FIFO's open waits for a writer, and a
// terminal's could make it the caller's.
const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC

// open opens path inside root; root "" is this process's own files
// (path relative to its working directory), resolved as open(2) does.
func open(root, path string) (int, error) {
	if root == "" {
		fd, err := unix.Open(path, flags, 0)
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, path, &unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return -1, fmt.Errorf("%s: %w: %w", path, ErrNoOpenat2, err)
	}
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// kind names a file type for an error.
func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
}

// Cwd is the working directory of the process at procDir (/proc/PID) as
// a path inside its root (procDir/root), to resolve a relative path of
// that process with [ReadFile]. The kernel writes both links from the
// reader's root: a chroot seen from here reads /ROOT and /ROOT/DIR, a
// pivot_root in another mount namespace (a container) reads / and /DIR;
// the root's part is cut. What cannot be read is an error.
func Cwd(procDir string) (string, error) {
	root, err := os.Readlink(procDir + "/root")
	if err != nil {
		return "", err
	}
	cwd, err := os.Readlink(procDir + "/cwd")
	if err != nil {
		return "", err
	}
	if root == "/" {
		return cwd, nil
	}
	if rest, ok := strings.CutPrefix(cwd, root); ok && (rest == "" || rest[0] == '/') {
		return "/" + strings.TrimPrefix(rest, "/"), nil
	}
	// Outside its root (a chdir before a chroot): inside it, nowhere.
	return "", fmt.Errorf("%s/cwd %s is outside its root %s", procDir, cwd, root)
}
