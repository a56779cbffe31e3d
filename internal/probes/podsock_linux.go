package probes

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type walk podsock ../../bpf/podsock.c -- -I../../bpf -O2 -g -Wall -Werror

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// podScope is bpf/podsock.c loaded for one pod's cgroup, writing into its
// TCPState's ring: the sock_ops program, attached at Attach, and the tcp
// iterator that turns on the state callbacks of the sockets made before.
type podScope struct {
	cg    PodCgroup
	netns uint64
	objs  podsockLoaded

	mu     sync.Mutex
	link   link.Link // the sock_ops program on the cgroup, once attached
	closed bool
}

// podsockLoaded is what loadPodScope takes from the spec: the programs
// and the walk's counters. events and lost_events are tcpstate's
// (CollectionOptions.MapReplacements), owned by the TCPState.
type podsockLoaded struct {
	podsockPrograms
	PodWalk *ebpf.Map `ebpf:"pod_walk"`
}

// loadPodScope loads bpf/podsock.c for cg, writing into events and
// lostEvents (tcpstate's maps, which ringSize sized).
func loadPodScope(cg PodCgroup, netns uint64, ringSize uint32, events, lostEvents *ebpf.Map, cache *btf.Cache) (*podScope, error) {
	if cg.ID == 0 || cg.Path == "" {
		return nil, errors.New("pod cgroup: no path or id")
	}
	spec, err := loadPodsock()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[podsockVarTargetNetns].Set(netns); err != nil {
		return nil, err
	}
	if err := spec.Variables[podsockVarPodCgroupId].Set(cg.ID); err != nil {
		return nil, err
	}
	// A replacement must match its spec: the ring's size is set at load.
	spec.Maps[podsockMapEvents].MaxEntries = ringSize
	s := &podScope{cg: cg, netns: netns}
	err = spec.LoadAndAssign(&s.objs, &ebpf.CollectionOptions{
		Cache: cache,
		MapReplacements: map[string]*ebpf.Map{
			podsockMapEvents:     events,
			podsockMapLostEvents: lostEvents,
		},
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// attach attaches the sock_ops program to the pod's cgroup, then turns on
// the state callback of every socket of the pod made before. It returns
// why the pod's cgroup cannot see all of the pod's sockets ("" when it
// can); the program stays attached either way (detach removes it).
func (s *podScope) attach() (why string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", fmt.Errorf("attach pod cgroup: %w", syscall.EBADF)
	}
	if s.link == nil {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: s.cg.Path, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.PodsockOps})
		if err != nil {
			return "", fmt.Errorf("attach sock_ops to %s: %w", s.cg.Path, err)
		}
		s.link = l
	}
	w, err := s.walk()
	if err != nil {
		return "", err
	}
	switch {
	case w.Unknown > 0:
		return fmt.Sprintf("this kernel cannot tell which cgroup made a socket (%d of the namespace's; sock_cgroup_data.cgroup, 5.15)", w.Unknown), nil
	case w.Failed > 0:
		return fmt.Sprintf("the kernel refused to turn on the state callbacks of %d of the pod's sockets, opened before the drain (%v; the socket option TCP_BPF_SOCK_OPS_CB_FLAGS needs 6.12)",
			w.Failed, syscall.Errno(-w.Err)), nil
	case w.Outside > 0:
		return fmt.Sprintf("%d sockets of the pod's network namespace were made outside its cgroup %s (a process that joined the namespace from the node): the pod's cgroup does not see them", w.Outside, s.cg.Path), nil
	}
	return "", nil
}

// walk runs the tcp iterator once over the namespace of the calling
// thread, which must be the pod's (the iterator walks the namespace of
// the thread that opens it), and returns its counts.
func (s *podScope) walk() (podsockWalk, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	if st.Ino != s.netns {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: draind's thread is in network namespace %d, not the pod's %d", st.Ino, s.netns)
	}
	if err := s.objs.PodWalk.Put(uint32(0), podsockWalk{}); err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	it, err := link.AttachIter(link.IterOptions{Program: s.objs.PodsockFlag})
	if err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	defer it.Close()
	rd, err := it.Open()
	if err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	_, err = io.Copy(io.Discard, rd)
	if cerr := rd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	var w podsockWalk
	if err := s.objs.PodWalk.Lookup(uint32(0), &w); err != nil {
		return podsockWalk{}, fmt.Errorf("walk the pod's sockets: %w", err)
	}
	return w, nil
}

// linked reports whether the sock_ops program runs.
func (s *podScope) linked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.link != nil
}

// detach removes the sock_ops program from the cgroup. Idempotent.
func (s *podScope) detach() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.link == nil {
		return nil
	}
	err := s.link.Close()
	s.link = nil
	return err
}

// Close detaches and frees the programs and the walk's map (not the
// shared ring). Safe twice.
func (s *podScope) Close() error {
	err := s.detach()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return err
	}
	s.closed = true
	return errors.Join(err, s.objs.PodsockOps.Close(), s.objs.PodsockFlag.Close(), s.objs.PodWalk.Close())
}
