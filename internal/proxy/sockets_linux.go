package proxy

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ShutdownSockets shuts down both ways (shutdown SHUT_RDWR) the sockets
// with the given inodes that a process of the proxy's process group
// holds: Envoy itself, or Envoy under pilot-agent (its child, in the
// group draind made). The peer gets a FIN; the proxy's next read of its
// end returns 0, as after its peer's close, and it lets the connection
// go (Envoy's downstream_cx_active drops at once, whatever the client
// does with its FIN). It returns how many it shut.
//
// Each socket is taken from its owner with pidfd_getfd(2) (Linux 5.6),
// shut, and the copy closed at once. That needs ptrace access to the
// owner: the same uid, and no capability draind does not hold (draind
// drops its own after start-up, so a proxy given --proxy-caps is out of
// reach), and a seccomp profile that allows the call: containerd's
// RuntimeDefault allows pidfd_getfd only to a container whose bounding
// set has CAP_SYS_PTRACE. Those failures come back as ErrNoAccess.
func (p *Process) ShutdownSockets(inodes map[uint32]bool) (int, error) {
	if len(inodes) == 0 {
		return 0, nil
	}
	left := make(map[uint32]bool, len(inodes))
	for ino := range inodes {
		left[ino] = true
	}
	pids, err := groupPIDs(p.pid)
	if err != nil {
		return 0, err
	}
	shut := 0
	var errs []error
	for _, pid := range pids {
		n, err := shutdownIn(pid, left)
		shut += n
		if err != nil {
			errs = append(errs, err)
		}
		if len(left) == 0 {
			break
		}
	}
	if len(left) > 0 && len(errs) == 0 {
		// Gone between the snapshot and now: closed by the proxy or its
		// client meanwhile, which is what was wanted.
		return shut, nil
	}
	return shut, errors.Join(errs...)
}

// ErrNoAccess means draind may not take the proxy's sockets (ptrace access
// or seccomp; ShutdownSockets).
var ErrNoAccess = errors.New("no access to the proxy's sockets (pidfd_getfd needs ptrace access: the same uid, none of the proxy's capabilities dropped, and a seccomp profile that allows it, which RuntimeDefault does only with CAP_SYS_PTRACE)")

// groupPIDs lists the processes of process group pgid (as /proc/PID/stat
// has them), the group's leader first.
func groupPIDs(pgid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	pids := []int{pgid}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pgid {
			continue
		}
		if g, ok := statPGID(pid); ok && g == pgid {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// statPGID reads a process's group from /proc/PID/stat (field 5, after
// the command's parenthesised name, which may hold spaces and ')').
func statPGID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return 0, false
	}
	g, err := strconv.Atoi(f[2])
	return g, err == nil
}

// shutdownIn shuts the sockets of left that pid holds, deleting each from
// left once shut (or found gone).
func shutdownIn(pid int, left map[uint32]bool) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return 0, nil
		}
		return 0, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		if errors.Is(err, os.ErrPermission) {
			if exiting(pidfd) {
				return 0, nil // its sockets go with it
			}
			return 0, fmt.Errorf("process %d: %w: %w", pid, ErrNoAccess, err)
		}
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	shut := 0
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		ino, ok := socketInode(link)
		if !ok || !left[ino] {
			continue
		}
		fd, _ := strconv.Atoi(e.Name())
		dup, err := unix.PidfdGetfd(pidfd, fd, 0)
		switch {
		case errors.Is(err, unix.EBADF):
			delete(left, ino) // closed since the listing
			continue
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
			if exiting(pidfd) {
				return shut, nil
			}
			return shut, fmt.Errorf("process %d: %w: %w", pid, ErrNoAccess, err)
		case err != nil:
			return shut, fmt.Errorf("pidfd_getfd %d/%d: %w", pid, fd, err)
		}
		err = unix.Shutdown(dup, unix.SHUT_RDWR)
		unix.Close(dup)
		delete(left, ino)
		switch {
		case err == nil:
			shut++
		case errors.Is(err, unix.ENOTCONN): // reset or closed meanwhile
		default:
			return shut, fmt.Errorf("shutdown %d/%d: %w", pid, fd, err)
		}
		if len(left) == 0 {
			break
		}
	}
	return shut, nil
}

// exitWait is how long a process refusing access gets to show it is
// exiting rather than out of reach.
const exitWait = 50 * time.Millisecond

// exiting reports whether the process behind pidfd exits now: an exiting
// process refuses another uid its /proc/PID/fd and its descriptors (its
// memory is gone, so the ptrace access check fails) a moment before its
// pidfd reads exited. A process out of reach costs exitWait.
func exiting(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(exitWait.Milliseconds()))
	return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// socketInode parses a /proc/PID/fd link to a socket: "socket:[12345]".
func socketInode(link string) (uint32, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}
