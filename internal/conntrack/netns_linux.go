package conntrack

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// NetNS is an open handle on a network namespace. The zero value is not
// usable; see [CurrentNetNS], [OpenNetNS] and [OpenNetNSByPID].
type NetNS struct {
	f     *os.File
	name  string
	inode uint64
}

// NetNSError says which namespace could not be opened, and why.
type NetNSError struct {
	What string // "netns /run/netns/x" or "pid 42"
	Err  error
}

func (e *NetNSError) Error() string { return e.What + ": " + e.Err.Error() }
func (e *NetNSError) Unwrap() error { return e.Err }

// ErrProcessGone is wrapped by errors for a pid that no longer exists.
var ErrProcessGone = errors.New("no such process")

// CurrentNetNS opens the calling process's network namespace.
func CurrentNetNS() (*NetNS, error) {
	return openNetNS("/proc/self/ns/net", "current netns")
}

// OpenNetNS opens the namespace bound at path (e.g. /run/netns/NAME or
// /proc/PID/ns/net).
func OpenNetNS(path string) (*NetNS, error) {
	return openNetNS(path, "netns "+path)
}

// OpenNetNSByPID opens the network namespace of process pid.
func OpenNetNSByPID(pid int) (*NetNS, error) {
	what := "pid " + strconv.Itoa(pid)
	if pid <= 0 {
		return nil, &NetNSError{What: what, Err: errors.New("not a valid pid")}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
		return nil, &NetNSError{What: what, Err: ErrProcessGone}
	}
	return openNetNS("/proc/"+strconv.Itoa(pid)+"/ns/net", what)
}

func openNetNS(path, what string) (*NetNS, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		if errors.Is(err, unix.ENOENT) && what != "netns "+path {
			err = ErrProcessGone
		}
		return nil, &NetNSError{What: what, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, &NetNSError{What: what, Err: err}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		f.Close()
		return nil, &NetNSError{What: what, Err: err}
	}
	// nsfs (a bind mount or /proc/PID/ns/net) is the only valid target; a
	// regular file would make setns fail later with a vaguer error.
	if fs.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, &NetNSError{What: what, Err: fmt.Errorf("%s is not a namespace file", path)}
	}
	return &NetNS{f: f, name: what, inode: st.Ino}, nil
}

// Inode is the namespace's inode number: the value the kernel shows as
// net->ns.inum, which the eBPF programs filter on.
func (n *NetNS) Inode() uint64 { return n.inode }

// Name says how the namespace was opened ("pid 42", "netns /run/netns/x").
func (n *NetNS) Name() string { return n.name }

// Fd is the namespace file descriptor, valid until Close.
func (n *NetNS) Fd() int { return int(n.f.Fd()) }

// Close releases the handle. It is safe to call twice.
func (n *NetNS) Close() error {
	if n == nil || n.f == nil {
		return nil
	}
	err := n.f.Close()
	n.f = nil
	return err
}
