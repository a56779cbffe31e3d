//go:build linux

// Package testutil holds helpers for tests that use the real kernel:
// network namespaces, root checks and feature checks.
//
// # Skips and failures
//
// A helper skips a test only when what it needs is truly absent (not root,
// no BTF on this kernel). When the need is present, any failure to use it
// fails the test: a broken kernel feature must not hide behind a skip.
package testutil

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RequireRoot skips the test unless it runs as root (euid 0).
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: run the tests as root (sudo go test ...)")
	}
}

// RequireBTF skips the test when the kernel exposes no BTF, which tp_btf
// programs need. It never skips as root on a kernel that has BTF.
func RequireBTF(tb testing.TB) {
	tb.Helper()
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); errors.Is(err, os.ErrNotExist) {
		tb.Skip("kernel has no BTF (/sys/kernel/btf/vmlinux absent)")
	}
}

// NetNS is a network namespace created for one test.
type NetNS struct {
	Handle netns.NsHandle
	Inode  uint64
}

// Path is a file path that names the namespace while the test runs
// (the /proc path of the handle's fd in this process).
func (n *NetNS) Path() string { return "/proc/self/fd/" + itoa(int(n.Handle)) }

// NewNetNS creates a network namespace with lo up, closed when the test
// ends. The calling goroutine's thread is not left in it.
func NewNetNS(tb testing.TB) *NetNS {
	tb.Helper()
	RequireRoot(tb)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("get current netns: %v", err)
	}
	defer orig.Close()
	h, err := netns.New() // unshares: this thread is now in the new namespace
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		// The thread is stuck in the new namespace; let it die with the
		// goroutine rather than be reused (LockOSThread without Unlock).
		runtime.LockOSThread()
		tb.Fatalf("restore netns: %v", err)
	}
	tb.Cleanup(func() { h.Close() })
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		tb.Fatalf("netlink handle in new netns: %v", err)
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		tb.Fatalf("find lo: %v", err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		tb.Fatalf("set lo up: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		tb.Fatalf("stat netns: %v", err)
	}
	return &NetNS{Handle: h, Inode: st.Ino}
}

// Do runs fn on a thread switched into the namespace. Sockets created in fn
// stay in the namespace; processes started in fn (os/exec) are born in it.
func (n *NetNS) Do(tb testing.TB, fn func()) {
	tb.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.Handle); err != nil {
			errc <- err
			return
		}
		defer func() {
			if err := netns.Set(orig); err == nil {
				runtime.UnlockOSThread()
			} // else: the thread dies with this goroutine, locked
		}()
		done := false
		defer func() {
			if !done {
				errc <- errors.New("fn panicked or called runtime.Goexit (t.Fatal is not allowed in Do)")
			}
		}()
		fn()
		done = true
		errc <- nil
	}()
	if err := <-errc; err != nil {
		tb.Fatalf("in netns: %v", err)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	neg := i < 0
	if neg {
		i = -i
	}
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
