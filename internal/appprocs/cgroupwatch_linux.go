package appprocs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupWatch follows a pod's containers through their cgroups, with no
// program that runs for other pods' events: inotify on the cgroup.events
// file of every child cgroup of the pod's (one per container) but draind's
// own, and on the pod's cgroup directory. The kernel notifies a
// modification of cgroup.events when its "populated" value changes (as
// the cgroup v2 interface documents it): a container's first process
// came, or its last one left. IN_CREATE and
// IN_DELETE on the pod's directory are a container started or removed
// during the drain: a new child is watched at once.
//
// What it does not see: a process that exits while others of its
// container live on (the container stays populated), one born into a
// populated container, and a process of the namespace outside the pod's
// child cgroups (one that joined it from the node). The source's Run resyncs on every event and every
// cgroupResyncPeriod, so such a change is seen late, never missed: the
// drain waits for the app's processes to be none, and the last exit of
// each container empties it, which is an event.
type cgroupWatch struct {
	f        *os.File // the inotify instance, read through the runtime's poller
	fd       int      // f's, for inotify_add_watch (valid until Close)
	pod, own string

	closeOnce sync.Once
	closeErr  error
}

// cgroupResyncPeriod is how often a source following the pod's cgroups
// takes a snapshot when no event came: the bound on how late an exit
// without a cgroup event (see cgroupWatch) is seen. A snapshot walks the
// node's processes once, in draind alone; nothing runs for other pods.
const cgroupResyncPeriod = time.Second

// watchPodCgroups watches the child cgroups of pod (a cgroup v2
// directory) but own, and pod's directory for children made or removed.
func watchPodCgroups(pod, own string) (*cgroupWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &cgroupWatch{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, pod: filepath.Clean(pod), own: filepath.Clean(own)}
	if _, err := unix.InotifyAddWatch(fd, w.pod, unix.IN_CREATE|unix.IN_DELETE|unix.IN_ONLYDIR); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch %s: %w", w.pod, err)
	}
	if _, err := os.Stat(filepath.Join(w.pod, "cgroup.events")); err != nil {
		w.Close()
		return nil, fmt.Errorf("%s is not a cgroup v2 directory: %w", w.pod, err)
	}
	if err := w.watchChildren(); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// watchChildren watches every child cgroup of the pod's (again: a watch
// added twice is one).
func (w *cgroupWatch) watchChildren() error {
	ents, err := os.ReadDir(w.pod)
	if err != nil {
		return fmt.Errorf("list %s: %w", w.pod, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := w.watchChild(e.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

// watchChild watches the cgroup.events of the pod's child cgroup name,
// unless it is draind's own. One removed meanwhile is skipped.
func (w *cgroupWatch) watchChild(name string) error {
	dir := filepath.Join(w.pod, name)
	if dir == w.own {
		return nil
	}
	_, err := unix.InotifyAddWatch(w.fd, filepath.Join(dir, "cgroup.events"), unix.IN_MODIFY)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("watch %s/cgroup.events: %w", dir, err)
	}
	return nil
}

// wait blocks until events come or period passes, and watches the
// cgroups made since. ctx's end cuts it short (nil).
func (w *cgroupWatch) wait(ctx context.Context, buf []byte, period time.Duration) error {
	if err := w.f.SetReadDeadline(time.Now().Add(period)); err != nil {
		return err
	}
	if ctx.Err() != nil { // checked after the deadline is set: see runCgroupEvents
		return nil
	}
	n, err := w.f.Read(buf)
	switch {
	case ctx.Err() != nil, errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	case err != nil:
		return fmt.Errorf("read cgroup events: %w", err)
	}
	return w.apply(buf[:n])
}

// Offsets in struct inotify_event.
const (
	ieMask = 4
	ieLen  = 12
)

// apply watches the child cgroups that events in b say were made; a lost
// queue (IN_Q_OVERFLOW) makes it watch every child again.
func (w *cgroupWatch) apply(b []byte) error {
	for len(b) >= unix.SizeofInotifyEvent {
		mask := binary.NativeEndian.Uint32(b[ieMask:])
		n := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[ieLen:]))
		if n > len(b) {
			return fmt.Errorf("inotify event of %d bytes, %d read", n, len(b))
		}
		name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:n], "\x00"))
		b = b[n:]
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			if err := w.watchChildren(); err != nil {
				return err
			}
		case mask&unix.IN_CREATE != 0 && mask&unix.IN_ISDIR != 0 && name != "":
			if err := w.watchChild(name); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close closes the inotify instance. Safe twice.
func (w *cgroupWatch) Close() error {
	w.closeOnce.Do(func() { w.closeErr = w.f.Close() })
	return w.closeErr
}
