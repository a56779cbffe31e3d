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
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/testenv/nsrun"
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

// KernelAtLeast reports whether the running kernel's release is at least
// major.minor.
func KernelAtLeast(tb testing.TB, major, minor int) bool {
	tb.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		tb.Fatalf("uname: %v", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var maj, mi int
	if _, err := fmt.Sscanf(rel, "%d.%d", &maj, &mi); err != nil {
		tb.Fatalf("kernel release %q: %v", rel, err)
	}
	return maj > major || maj == major && mi >= minor
}

// NetNS is a network namespace created for one test.
type NetNS struct {
	Handle netns.NsHandle
	Inode  uint64
}

// Path is a file path that names the namespace while the test runs
// (the /proc path of the handle's fd in this process).
func (n *NetNS) Path() string { return "/proc/self/fd/" + itoa(int(n.Handle)) }

// AddAddr adds cidr (e.g. "10.0.0.2/24") to link in the namespace.
func (n *NetNS) AddAddr(tb testing.TB, link, cidr string) {
	tb.Helper()
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		tb.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		tb.Fatalf("add %s to %s: %v", cidr, link, err)
	}
}

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
	done := false
	err := nsrun.Do(n.Handle, func() error {
		fn()
		done = true
		return nil
	})
	if err != nil {
		tb.Fatalf("in netns: %v", err)
	}
	if !done {
		tb.Fatalf("in netns: fn panicked or called runtime.Goexit (t.Fatal is not allowed in Do)")
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

// Link joins two namespaces with a veth pair, addressing each end with a
// /24 CIDR (e.g. "192.0.2.1/24" and "192.0.2.2/24": TEST-NET-1, never a
// real host), both up. The pair goes with the namespaces.
func Link(tb testing.TB, a, b *NetNS, cidrA, cidrB string) {
	tb.Helper()
	ha, err := netlink.NewHandleAt(a.Handle)
	if err != nil {
		tb.Fatalf("netlink in netns a: %v", err)
	}
	defer ha.Close()
	hb, err := netlink.NewHandleAt(b.Handle)
	if err != nil {
		tb.Fatalf("netlink in netns b: %v", err)
	}
	defer hb.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth-a"}, PeerName: "veth-b", PeerNamespace: netlink.NsFd(b.Handle)}
	if err := ha.LinkAdd(veth); err != nil {
		tb.Fatalf("add veth: %v", err)
	}
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		cidr string
	}{{ha, "veth-a", cidrA}, {hb, "veth-b", cidrB}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			tb.Fatalf("find %s: %v", side.name, err)
		}
		addr, err := netlink.ParseAddr(side.cidr)
		if err != nil {
			tb.Fatalf("parse %s: %v", side.cidr, err)
		}
		if err := side.h.AddrAdd(l, addr); err != nil {
			tb.Fatalf("address %s: %v", side.name, err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			tb.Fatalf("up %s: %v", side.name, err)
		}
	}
}

// Dialer returns a DialContext that connects from inside the namespace.
func (n *NetNS) Dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return nsrun.Dialer(n.Handle)
}

// Listen listens inside the namespace.
func (n *NetNS) Listen(tb testing.TB, network, addr string) net.Listener {
	tb.Helper()
	var ln net.Listener
	var err error
	n.Do(tb, func() { ln, err = net.Listen(network, addr) })
	if err != nil {
		tb.Fatalf("listen %s in netns: %v", addr, err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

var selfCopy struct {
	sync.Once
	path string
	err  error
}

// SelfCopy returns a copy of the running test binary that any uid can
// execute (go test's build directory is private to root), for tests that
// re-exec themselves as helper processes under other uids. The copy is
// removed by RemoveSelfCopy, which TestMain should call.
func SelfCopy(tb testing.TB) string {
	tb.Helper()
	selfCopy.Do(func() {
		dir, err := os.MkdirTemp("", "draind-test-")
		if err != nil {
			selfCopy.err = err
			return
		}
		os.Chmod(dir, 0o755)
		src, err := os.ReadFile("/proc/self/exe")
		if err != nil {
			selfCopy.err = err
			return
		}
		selfCopy.path = filepath.Join(dir, filepath.Base(os.Args[0]))
		selfCopy.err = os.WriteFile(selfCopy.path, src, 0o755)
	})
	if selfCopy.err != nil {
		tb.Fatalf("copy test binary: %v", selfCopy.err)
	}
	return selfCopy.path
}

// RemoveSelfCopy removes what SelfCopy made.
func RemoveSelfCopy() {
	if selfCopy.path != "" {
		os.RemoveAll(filepath.Dir(selfCopy.path))
	}
}
