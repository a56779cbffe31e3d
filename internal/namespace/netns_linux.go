package namespace

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Net is an open handle on a network namespace. The zero value is not
// usable; see [Current], [Open] and [ByPID].
type Net struct {
	f     *os.File
	name  string
	inode uint64
}

// Error says which namespace could not be opened, and why.
type Error struct {
	What string // "netns /run/netns/x" or "pid 42"
	Err  error
}

func (e *Error) Error() string { return e.What + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrProcessGone is wrapped by errors for a pid that no longer exists.
var ErrProcessGone = errors.New("no such process")

// Current opens the calling process's network namespace.
func Current() (*Net, error) {
	return open("/proc/self/ns/net", "current netns")
}

// Open opens the namespace bound at path (e.g. /run/netns/NAME or
// /proc/PID/ns/net).
func Open(path string) (*Net, error) {
	return open(path, "netns "+path)
}

// ByPID opens the network namespace of process pid.
func ByPID(pid int) (*Net, error) {
	what := "pid " + strconv.Itoa(pid)
	if pid <= 0 {
		return nil, &Error{What: what, Err: errors.New("not a valid pid")}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
		return nil, &Error{What: what, Err: ErrProcessGone}
	}
	return open("/proc/"+strconv.Itoa(pid)+"/ns/net", what)
}

func open(path, what string) (*Net, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		if errors.Is(err, unix.ENOENT) && what != "netns "+path {
			err = ErrProcessGone
		}
		return nil, &Error{What: what, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, &Error{What: what, Err: err}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		f.Close()
		return nil, &Error{What: what, Err: err}
	}
	// nsfs (a bind mount or /proc/PID/ns/net) is the only valid target; a
	// regular file would make setns fail later with a vaguer error.
	if fs.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, &Error{What: what, Err: fmt.Errorf("%s is not a namespace file", path)}
	}
	return &Net{f: f, name: what, inode: st.Ino}, nil
}

// Inode is the namespace's inode number: the value the kernel shows as
// net->ns.inum, which the eBPF programs filter on.
func (n *Net) Inode() uint64 { return n.inode }

// Name says how the namespace was opened ("pid 42", "netns /run/netns/x").
func (n *Net) Name() string { return n.name }

// Fd is the namespace file descriptor, valid until Close.
func (n *Net) Fd() int { return int(n.f.Fd()) }

// HoldsThread reports whether the calling thread is in the namespace. The
// caller locks its goroutine to the thread (runtime.LockOSThread) for the
// answer to mean anything.
func (n *Net) HoldsThread() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/thread-self/ns/net", &st) == nil && st.Ino == n.inode
}

// Do runs fn in the namespace: a socket fn makes there stays there, and
// may be used from any thread after. When the calling thread is already
// in it (a pod looking at itself), fn runs right here, entering nothing,
// which needs no capability; otherwise on a thread of its own that enters
// the namespace (CAP_SYS_ADMIN) and goes back before Do returns. A thread
// that cannot go back stays locked, and the runtime retires it with its
// goroutine. A nil n is the caller's own namespace.
func (n *Net) Do(fn func() error) error {
	runtime.LockOSThread()
	if n == nil || n.HoldsThread() {
		defer runtime.UnlockOSThread()
		return fn()
	}
	runtime.UnlockOSThread()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter netns: %w", err)
			return
		}
		err = fn()
		if rerr := unix.Setns(self, unix.CLONE_NEWNET); rerr != nil {
			done <- errors.Join(err, fmt.Errorf("return to own netns: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// Close releases the handle. It is safe to call twice.
func (n *Net) Close() error {
	if n == nil || n.f == nil {
		return nil
	}
	err := n.f.Close()
	n.f = nil
	return err
}

// InitialPIDInode is the inode of the initial PID namespace
// (PROC_PID_INIT_INO, include/linux/proc_ns.h): fixed since Linux 3.8.
const InitialPIDInode = 0xEFFFFFFC

// SelfPID returns the inode of the calling process's PID namespace and
// whether it is the initial (host's) one.
func SelfPID() (inode uint64, initial bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0, false, fmt.Errorf("stat own pid namespace: %w", err)
	}
	return st.Ino, st.Ino == InitialPIDInode, nil
}
