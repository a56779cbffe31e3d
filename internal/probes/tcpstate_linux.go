package probes

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type event tcpstate ../../bpf/tcpstate.c -- -I../../bpf -O2 -g -Wall -Werror

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/tcpstate"
)

// TCPState delivers the TCP state changes of one network namespace, seen
// by the tp_btf/inet_sock_set_state programs in bpf/tcpstate.c (a primary
// and a backup that catches the changes the kernel skipped for the primary
// because they nested in it; see "Recursion" there).
//
// One goroutine reads (ReadEvent); SetDeadline, Lost, UsesCookie and Close
// may be called from any goroutine.
//
// What an event says:
//   - CLOSE->SYN_SENT comes before the local port is chosen: Local has port
//     0 (match it by SkAddr/Cookie, or by Remote).
//   - LISTEN->SYN_RECV fires on the new child while it is built from the
//     listener: its Cookie is 0 (the kernel may still hold the listener's);
//     the child's own cookie arrives with SYN_RECV->ESTABLISHED.
//   - UID is the socket's sk_uid (the creating thread's fsuid), as a kernel
//     uid (init user namespace).
//   - There is no change to TIME_WAIT: the full socket goes to CLOSE and a
//     timewait socket, visible only to sock_diag, takes over.
//
// # Known gaps
//
// In loopback stress on 6.18 (50k connections opened and closed as fast as
// 4 threads could, 500k changes) a few client sockets per run (0 to 20,
// in bursts of consecutive connections) showed ESTABLISHED->FIN_WAIT1 and
// then nothing: FIN_WAIT1->FIN_WAIT2 and FIN_WAIT2->CLOSE never reached
// either program (both programs' run and recursion-miss counts agree that
// the tracepoint was not called for them), so no counter sees it. The socket
// is gone (its address is reused). A table keyed on these events must not
// trust that every socket reaches CLOSE: evict an entry when a new socket
// (a CLOSE->x or LISTEN->SYN_RECV event) shows up at its SkAddr, and
// reconcile with sock_diag now and then. None of these states holds a
// drain.
type TCPState struct {
	objs       tcpstateLoaded
	attached   // links: the primary, then the backup (the order they run in)
	usesCookie bool

	full    perCPUCounter // ring reservations that failed
	covered perCPUCounter // changes the backup program emitted for the primary

	// pod is bpf/podsock.c when TCPStateOptions.PodCgroup was given and it
	// loaded; podUnavailable says why not when it did not.
	pod            *podScope
	podUnavailable string

	scopeMu     sync.Mutex
	scope       TCPScope // set by the first Attach that succeeded
	scopeReason string

	closeOnce sync.Once
	closeErr  error
}

// tcpstateLoaded is what OpenTCPState loads from the spec: the generated
// program and map sets, without the variables (the .bss holding the unused
// pointer that only exists to make clang emit struct event). The
// read-only .rodata (target_netns, use_cookie) is loaded as the programs'
// dependency.
type tcpstateLoaded struct {
	tcpstatePrograms
	tcpstateMaps
}

// eventSize is sizeof(struct event) in bpf/tcpstate.c; tcpstate_linux_test.go
// checks it against the generated tcpstateEvent.
const eventSize = 72

// Offsets of struct event's fields (little-endian).
const (
	evTs       = 0
	evCookie   = 8
	evSkaddr   = 16
	evSaddr    = 24
	evDaddr    = 40
	evUID      = 56
	evSport    = 60
	evDport    = 62
	evFamily   = 64
	evOldState = 66
	evNewState = 67
)

// cookieUnsupported remembers that this kernel's tracing programs cannot
// call bpf_get_socket_cookie (before 5.12), so later OpenTCPState calls skip
// the failing first load.
var cookieUnsupported atomic.Bool

// OpenTCPState loads bpf/tcpstate.c filtered to the namespace whose inode is
// netnsInode (namespace.Net.Inode) and attaches it. Events flow from the moment
// it returns. Everything opened is closed on any failure.
//
// An *UnavailableError says the probe cannot run on this host (no
// capability, no BTF, kernel too old, verifier refusal): fall back to
// polling. Other errors are the caller's (bad options).
func OpenTCPState(netnsInode uint64, opts TCPStateOptions) (*TCPState, error) {
	return openTCPState(netnsInode, opts, false)
}

// openTCPState is OpenTCPState; forceNoCookie loads the pre-5.12 variant (tests).
func openTCPState(netnsInode uint64, opts TCPStateOptions, forceNoCookie bool) (*TCPState, error) {
	if netnsInode == 0 {
		return nil, errors.New("open tcpstate probe: netns inode 0")
	}
	ringSize := opts.RingSize
	if ringSize == 0 {
		ringSize = DefaultTCPRingSize
	}
	if err := prepare("tcpstate probe", ringSize); err != nil {
		return nil, err
	}

	useCookie := !forceNoCookie && !cookieUnsupported.Load()
	p, err := loadProbe(netnsInode, uint32(ringSize), useCookie, opts.BTFCache)
	if err != nil && useCookie && isCookieRefused(err) {
		cookieUnsupported.Store(true)
		useCookie = false
		p, err = loadProbe(netnsInode, uint32(ringSize), false, opts.BTFCache)
	}
	if err != nil {
		return nil, unavailable(err)
	}
	p.usesCookie = useCookie
	if opts.PodCgroup != nil {
		pod, err := loadPodScope(*opts.PodCgroup, netnsInode, uint32(ringSize), p.objs.Events, p.objs.LostEvents, opts.BTFCache)
		if err != nil {
			p.podUnavailable = "the pod's cgroup program did not load: " + unavailableReason(err)
			if errors.Is(err, unix.EPERM) {
				p.podUnavailable = "the pod's cgroup program did not load: a sock_ops program needs CAP_NET_ADMIN to load"
			}
		} else {
			p.pod = pod
		}
	}
	if !opts.Detached {
		if err := p.Attach(); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

func loadProbe(netnsInode uint64, ringSize uint32, useCookie bool, cache *btf.Cache) (_ *TCPState, err error) {
	spec, err := loadTcpstate()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[tcpstateVarTargetNetns].Set(netnsInode); err != nil {
		return nil, err
	}
	var uc uint8
	if useCookie {
		uc = 1
	}
	if err := spec.Variables[tcpstateVarUseCookie].Set(uc); err != nil {
		return nil, err
	}
	spec.Maps[tcpstateMapEvents].MaxEntries = ringSize

	p := &TCPState{}
	if err := spec.LoadAndAssign(&p.objs, &ebpf.CollectionOptions{Cache: cache}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	// The primary first: the tracepoint calls its programs in the order
	// they were attached, and the backup only emits what the primary did
	// not see (bpf/tcpstate.c, "Recursion").
	p.hooks = []hook{{"inet_sock_set_state", p.objs.OnSetState}, {"inet_sock_set_state", p.objs.OnSetStateBackup}}
	if p.ring, err = newRingReader(p.objs.Events); err != nil {
		return nil, err
	}
	p.full = perCPUCounter{m: p.objs.LostEvents}
	p.covered = perCPUCounter{m: p.objs.BackupCovered}
	return p, nil
}

// Attach attaches the programs of a probe opened Detached: events flow
// from the moment it returns. It needs no capability where the kernel
// checks them only when a program or map is made (6.18: draind attaches
// with none left); a kernel that checks every bpf() call while
// kernel.unprivileged_bpf_disabled is set needs CAP_BPF, which draind keeps
// there (privs.Needs).
//
// With a PodCgroup, the pod's cgroup program goes first, then the walk
// that turns on the state callbacks of the pod's sockets made before; it
// must be called from the pod's network namespace (the walk's). Where that
// cannot see every socket of the namespace (Scope's reason), the
// node-wide tracepoint is attached, then the cgroup program removed: some
// changes may come twice meanwhile, none is missed. Idempotent; safe from
// any goroutine.
func (p *TCPState) Attach() error {
	p.scopeMu.Lock()
	defer p.scopeMu.Unlock()
	if p.scope != "" {
		return nil
	}
	why := p.podUnavailable
	if p.pod == nil && why == "" {
		why = ReasonNoPodCgroup
	}
	if p.pod != nil {
		var err error
		why, err = p.pod.attach()
		if err == nil && why == "" {
			p.scope = ScopePodCgroup
			return nil
		}
		if err != nil {
			why = "the pod's cgroup program did not attach: " + oneLine(err.Error())
		}
	}
	if err := p.attach(); err != nil {
		return unavailable(err)
	}
	if p.pod != nil {
		_ = p.pod.detach() // the tracepoint sees everything now; Close reports a failure to detach
	}
	p.scope, p.scopeReason = ScopeNode, why
	return nil
}

// Scope says which sockets' changes run the attached programs, and why
// the node's when a PodCgroup was asked for ("" before Attach).
func (p *TCPState) Scope() (TCPScope, string) {
	p.scopeMu.Lock()
	defer p.scopeMu.Unlock()
	return p.scope, p.scopeReason
}

// Attached reports whether the programs run.
func (p *TCPState) Attached() bool {
	return p.isAttached() || p.pod != nil && p.pod.linked()
}

// isCookieRefused reports whether the verifier refused the program only
// because tracing programs cannot call bpf_get_socket_cookie here (< 5.12).
func isCookieRefused(err error) bool {
	var ve *ebpf.VerifierError
	return errors.As(err, &ve) && cookieRefusedLog(ve.Log)
}

func cookieRefusedLog(log []string) bool {
	tag := "#" + strconv.Itoa(int(asm.FnGetSocketCookie))
	for _, l := range log {
		if (strings.Contains(l, "bpf_get_socket_cookie") || strings.Contains(l, tag)) &&
			(strings.Contains(l, "unknown func") || strings.Contains(l, "cannot use helper") ||
				strings.Contains(l, "invalid func")) {
			return true
		}
	}
	return false
}

// ReadEvent blocks until the next state change and decodes it into ev. It
// returns os.ErrDeadlineExceeded once the deadline (SetDeadline) has passed
// and the events already in the ring have been read, and an error wrapping
// os.ErrClosed (== ringbuf.ErrClosed) after Close. It allocates nothing.
func (p *TCPState) ReadEvent(ev *TCPEvent) error {
	return p.ring.read("tcpstate event", func(b []byte, more bool) error {
		if err := decodeEvent(b, ev); err != nil {
			return err
		}
		ev.More = more
		return nil
	})
}

// Queued is how many bytes of events wait in the ring: 0 when the reader
// has caught up with the kernel.
func (p *TCPState) Queued() int { return p.ring.rd.AvailableBytes() }

// SetDeadline sets when a blocked or future ReadEvent gives up with
// os.ErrDeadlineExceeded; the zero time removes the deadline. It may be
// called while ReadEvent blocks, from another goroutine.
func (p *TCPState) SetDeadline(t time.Time) { p.ring.setDeadline(t) }

// Lost is the number of state changes missed since OpenTCPState: those the
// kernel could not put in the ring buffer (it was full), summed over CPUs,
// plus those neither program ran for (nested three deep; see
// bpf/tcpstate.c, "Recursion"; counted from 5.12, when the kernel started
// counting recursion misses). It may count changes of other namespaces.
// When it grows, the caller's view is incomplete: resync from a sock_diag
// snapshot. It costs three bpf syscalls.
func (p *TCPState) Lost() uint64 { return p.lost.read(p.missed) }

func (p *TCPState) missed() (uint64, error) {
	full, err := p.full.sum()
	if err != nil {
		return 0, err
	}
	covered, err := p.covered.sum()
	if err != nil {
		return 0, err
	}
	st, err := p.objs.OnSetState.Stats()
	if err != nil {
		return 0, err
	}
	n := full
	if st.RecursionMisses > covered {
		n += st.RecursionMisses - covered
	}
	return n, nil
}

// UsesCookie is false when the kernel's tracing programs cannot read socket
// cookies (before 5.12): events then carry Cookie 0, and SkAddr with the
// 5-tuple is the key.
func (p *TCPState) UsesCookie() bool { return p.usesCookie }

// Close detaches the program and frees everything; a blocked ReadEvent
// returns an error wrapping os.ErrClosed. It is safe to call twice.
func (p *TCPState) Close() error {
	p.closeOnce.Do(func() {
		errs := p.detach()
		if p.pod != nil {
			errs = append(errs, p.pod.Close()) // before the ring it writes to
		}
		o := &p.objs
		for _, c := range []io.Closer{o.OnSetState, o.OnSetStateBackup, o.Events, o.LostEvents, o.PrimarySeen, o.BackupCovered} {
			errs = append(errs, c.Close())
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// decodeEvent reads a struct event (bpf/tcpstate.c) without reflection or
// allocation.
//
// An AF_INET6 socket talking IPv4 (IPv4-mapped addresses) is reported as the
// kernel holds it: an IPv6 address ::ffff:a.b.c.d. Callers matching against
// IPv4 listeners Unmap.
func decodeEvent(b []byte, ev *TCPEvent) error {
	if len(b) < eventSize {
		return fmt.Errorf("tcpstate event: %d bytes, want %d", len(b), eventSize)
	}
	le := binary.LittleEndian
	ev.Time = time.Duration(le.Uint64(b[evTs:]))
	ev.Cookie = le.Uint64(b[evCookie:])
	ev.SkAddr = le.Uint64(b[evSkaddr:])
	ev.UID = le.Uint32(b[evUID:])
	ev.OldState = tcpstate.State(b[evOldState])
	ev.NewState = tcpstate.State(b[evNewState])
	family := le.Uint16(b[evFamily:])
	ev.Family = uint8(family)
	sport, dport := le.Uint16(b[evSport:]), le.Uint16(b[evDport:])
	var local, remote netip.Addr
	if ev.Family == unix.AF_INET6 { // the family as reported (a u16 the program fills with 2 or 10)
		local = netip.AddrFrom16([16]byte(b[evSaddr : evSaddr+16]))
		remote = netip.AddrFrom16([16]byte(b[evDaddr : evDaddr+16]))
	} else {
		local = netip.AddrFrom4([4]byte(b[evSaddr : evSaddr+4]))
		remote = netip.AddrFrom4([4]byte(b[evDaddr : evDaddr+4]))
	}
	ev.Local = netip.AddrPortFrom(local, sport)
	ev.Remote = netip.AddrPortFrom(remote, dport)
	return nil
}
