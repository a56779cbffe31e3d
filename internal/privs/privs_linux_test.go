package privs

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The tests start copies of the test binary as helpers (one process per
// case: the changes are irreversible), under the uid, file capabilities
// and bounding set a container runtime would give draind, and read what
// the helper reports as JSON lines.

const helperEnv = "PRIVS_TEST_HELPER"

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(helperMain(role))
	}
	os.Exit(m.Run())
}

// helperLine is one line a helper prints.
type helperLine struct {
	Step string `json:"step"`
	Sets *Sets  `json:"sets,omitempty"`
	Err  string `json:"err,omitempty"`
	N    int    `json:"n,omitempty"`
}

func emit(l helperLine) {
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// helperMain runs a role:
//
//	run     what `draind run` does: raise, limit what the child gets
//	        (PRIVS_GIVE), start a child (report), drop all but what
//	        PRIVS_NEEDS asks, then try BPF and setns, compare every thread,
//	        and start a child again
//	report  print this process's sets
//	maps    create a BPF map, drop (PRIVS_KEEP_BPF: keeping what Keep
//	        says), then look it up
func helperMain(role string) int {
	switch role {
	case "report":
		s, err := Current()
		emit(helperLine{Step: "child", Sets: &s, Err: errString(err)})
		return 0
	case "run":
		helperRun()
		return 0
	case "maps":
		helperMaps()
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

func helperRun() {
	// Threads of every kind: parked, locked to their thread and blocked in
	// a syscall, and busy: the changes must reach each one.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	r, w, _ := os.Pipe()
	for i := range 4 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if i == 0 {
				var b [1]byte
				r.Read(b[:]) // blocked in read(2) until the end
				return
			}
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		})
	}
	defer func() { close(stop); w.Close(); wg.Wait() }()

	report := func(step string, s Sets, err error) {
		emit(helperLine{Step: step, Sets: &s, Err: errString(err)})
	}
	s, err := Current()
	report("exec", s, err)
	_, s, err = RaiseEffective()
	report("raised", s, err)
	emit(helperLine{Step: "load-before", Err: errString(TryLoadBPF())})

	give, _ := ParseSet(os.Getenv("PRIVS_GIVE"))
	s, err = LimitInherited(give)
	report("limited", s, err)
	// The proxy: a copy of this binary without file capabilities.
	child := exec.Command(os.Getenv("PRIVS_PROXY_BIN"))
	child.Env = append(os.Environ(), helperEnv+"=report")
	child.SysProcAttr = &syscall.SysProcAttr{AmbientCaps: give.Numbers()}
	if uid := os.Getenv("PRIVS_CHILD_UID"); uid != "" {
		n, _ := strconv.Atoi(uid)
		child.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(n), Gid: uint32(n)}
	}
	out, err := child.CombinedOutput()
	if err != nil {
		emit(helperLine{Step: "child", Err: fmt.Sprintf("%v: %s", err, out)})
	} else {
		os.Stdout.Write(out)
	}

	var needs Needs
	json.Unmarshal([]byte(os.Getenv("PRIVS_NEEDS")), &needs)
	kept, _ := needs.Keep(s.Permitted)
	s, err = Drop(KeptSet(kept))
	report("dropped", s, err)
	dumpable, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	var st unix.Stat_t
	unix.Stat("/proc/self/mem", &st)
	emit(helperLine{Step: "dumpable", N: dumpable*100000 + int(st.Uid)})
	emit(helperLine{Step: "load-after", Err: errString(TryLoadBPF())})
	emit(helperLine{Step: "setns-after", Err: errString(TrySetns())})
	threads, err := Threads(0)
	distinct := map[Sets]bool{}
	for _, ts := range threads {
		distinct[ts] = true
	}
	emit(helperLine{Step: "threads", N: len(threads), Err: errString(err)})
	for ts := range distinct {
		report("thread-sets", ts, nil)
	}
	// This binary again, file capabilities included: no_new_privs ignores
	// them.
	child = exec.Command("/proc/self/exe")
	child.Env = append(os.Environ(), helperEnv+"=report")
	out, err = child.CombinedOutput()
	if err != nil {
		emit(helperLine{Step: "child", Err: fmt.Sprintf("%v: %s", err, out)})
		return
	}
	os.Stdout.Write(bytesReplace(out, `"step":"child"`, `"step":"child-after"`))
}

func bytesReplace(b []byte, old, repl string) []byte {
	return []byte(strings.ReplaceAll(string(b), old, repl))
}

// bpfSys is bpf(2) with attr.
func bpfSys(cmd uintptr, attr []byte) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

func helperMaps() {
	create := make([]byte, 72)
	le := binary.LittleEndian
	le.PutUint32(create[0:], unix.BPF_MAP_TYPE_ARRAY)
	le.PutUint32(create[4:], 4) // key
	le.PutUint32(create[8:], 8) // value
	le.PutUint32(create[12:], 1)
	fd, err := bpfSys(unix.BPF_MAP_CREATE, create)
	if err != nil {
		emit(helperLine{Step: "create", Err: err.Error()})
		return
	}
	n := 0
	if bpfCallsNeedCap() { // asked before the drop, as draind does
		n = 1
	}
	s, _ := Current()
	var keep Set
	if os.Getenv("PRIVS_KEEP_BPF") != "" {
		kept, _ := Needs{BPFObjects: true}.Keep(s.Permitted)
		keep = KeptSet(kept)
	}
	s, err = Drop(keep)
	emit(helperLine{Step: "dropped", Sets: &s, Err: errString(err)})
	key, val := new(uint32), new(uint64)
	lookup := make([]byte, 32)
	le.PutUint32(lookup[0:], uint32(fd))
	le.PutUint64(lookup[8:], uint64(uintptr(unsafe.Pointer(key))))
	le.PutUint64(lookup[16:], uint64(uintptr(unsafe.Pointer(val))))
	_, err = bpfSys(unix.BPF_MAP_LOOKUP_ELEM, lookup)
	runtime.KeepAlive(key)
	runtime.KeepAlive(val)
	emit(helperLine{Step: "lookup", Err: errString(err), N: n})
}

// --- the parent side ---------------------------------------------------

// helperSpec is how a helper starts: what a container runtime would give
// draind.
type helperSpec struct {
	uid      int    // < 0: root
	fileCaps string // setcap's form ("cap_bpf,cap_perfmon+p"), "" for none
	bounding *Set   // the bounding set it starts with (nil: the test's)
	env      []string
}

// encodeFileCaps is the security.capability xattr (vfs_cap_data revision
// 2) for setcap's text form NAMES+p or NAMES+ep.
func encodeFileCaps(t *testing.T, text string) []byte {
	t.Helper()
	names, flags, _ := strings.Cut(text, "+")
	set, err := ParseSet(names)
	if err != nil || (flags != "p" && flags != "ep") {
		t.Fatalf("file caps %q: %v", text, err)
	}
	b := make([]byte, 20)
	magic := uint32(0x02000000)
	if flags == "ep" {
		magic |= 1
	}
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(set))
	binary.LittleEndian.PutUint32(b[12:], uint32(set>>32))
	return b
}

// fileCapsDir is a temporary directory whose filesystem honours file
// capabilities: not mounted nosuid (the VM runner's /tmp is).
func fileCapsDir(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{os.TempDir(), "/var/tmp"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Flags&unix.ST_NOSUID == 0 {
			return dir
		}
	}
	t.Skipf("%s and /var/tmp are mounted nosuid: execve ignores file capabilities there", os.TempDir())
	return ""
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts helpers under other uids with file capabilities")
	}
	if err := Supported(); err != nil {
		t.Skipf("this test binary links cgo (-race does): %v", err)
	}
}

// In a cgo binary every change is refused, and nothing changes.
func TestCgoRefused(t *testing.T) {
	if Supported() == nil {
		t.Skip("built with CGO_ENABLED=0: the changes are supported (the other tests)")
	}
	before, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	_, _, errRaise := RaiseEffective()
	if before.Effective == before.Permitted {
		errRaise = ErrCgo // nothing to raise: not attempted
	}
	_, errLimit := LimitInherited(0)
	_, errDrop := Drop(0)
	for _, err := range []error{errRaise, errLimit, errDrop} {
		if !errors.Is(err, ErrCgo) {
			t.Errorf("in a cgo binary: %v, want ErrCgo", err)
		}
	}
	if after, _ := Current(); after != before {
		t.Errorf("sets changed:\n%s\nwas\n%s", after.StatusLines(), before.StatusLines())
	}
}

// runHelper starts role as spec says and returns its lines by step (the
// last of each), or the start error.
func runHelper(t *testing.T, role string, spec helperSpec) (map[string]helperLine, []Sets, error) {
	t.Helper()
	dir, err := os.MkdirTemp(fileCapsDir(t), "draind-privs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin, proxyBin := filepath.Join(dir, "draind-privs.test"), filepath.Join(dir, "proxy")
	data, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bin, proxyBin} {
		if err := os.WriteFile(path, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if spec.fileCaps != "" {
		if err := unix.Setxattr(bin, "security.capability", encodeFileCaps(t, spec.fileCaps), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				t.Skipf("the filesystem of %s takes no file capabilities: %v", dir, err)
			}
			t.Fatalf("set file capabilities: %v", err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, "PRIVS_PROXY_BIN="+proxyBin), spec.env...)
	if spec.uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(spec.uid), Gid: uint32(spec.uid)}}
	}
	var out []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		if spec.bounding != nil {
			// The child inherits the bounding set of the thread that forks
			// it: shrink this one's, and let the thread die with the
			// goroutine (never unlocked).
			runtime.LockOSThread()
			for c := range lastCap() + 1 {
				if !spec.bounding.Has(c) {
					if perr := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); perr != nil {
						out, err = nil, fmt.Errorf("drop %s from the bounding set: %w", c, perr)
						return
					}
				}
			}
		}
		out, err = cmd.CombinedOutput()
	}()
	<-done
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("helper %s: %v\n%s", role, err, out)
		}
		return nil, nil, err
	}
	lines := map[string]helperLine{}
	var threadSets []Sets
	for l := range strings.SplitSeq(string(out), "\n") {
		var hl helperLine
		if json.Unmarshal([]byte(l), &hl) != nil || hl.Step == "" {
			continue
		}
		if hl.Step == "thread-sets" {
			threadSets = append(threadSets, *hl.Sets)
		}
		lines[hl.Step] = hl
	}
	t.Logf("helper %s (uid %d, file caps %q):\n%s", role, spec.uid, spec.fileCaps, out)
	return lines, threadSets, nil
}

// want checks one step's sets.
func wantSets(t *testing.T, lines map[string]helperLine, step string, want Sets) {
	t.Helper()
	l, ok := lines[step]
	switch {
	case !ok:
		t.Errorf("%s: no line", step)
	case l.Err != "ok":
		t.Errorf("%s: %s", step, l.Err)
	case l.Sets == nil || *l.Sets != want:
		t.Errorf("%s:\n%s\nwant\n%s", step, l.Sets.StatusLines(), want.StatusLines())
	}
}

func wantErr(t *testing.T, lines map[string]helperLine, step, want string) {
	t.Helper()
	if got := lines[step].Err; !strings.Contains(got, want) {
		t.Errorf("%s: %q, want %q", step, got, want)
	}
}

var (
	ebpfCaps = SetOf(CapBPF, CapPerfmon)
	allCaps  = func() Set { s, _ := Current(); return s.Bounding }()
)

// bpfKept is what Drop keeps for eBPF objects on this kernel: CAP_BPF when
// it checks every bpf() call.
func bpfKept(t *testing.T) Set {
	if bpfCallsNeedCap() {
		t.Logf("this kernel checks CAP_BPF on every bpf() call (unprivileged_bpf_disabled set, before 6.5): BPF is kept")
		return SetOf(CapBPF)
	}
	return 0
}

// uid 1337 with `cap_bpf,cap_perfmon+p` on the binary and both in the
// bounding set (what capabilities.add does for a non-root user): execve
// makes them permitted, not effective; draind raises them, loads, then
// drops everything, and no thread can load a tracing program any more.
func TestRaiseFromFilePermitted(t *testing.T) {
	requireRoot(t)
	lines, threads, err := runHelper(t, "run", helperSpec{uid: 1337, fileCaps: "cap_bpf,cap_perfmon+p",
		env: []string{`PRIVS_NEEDS={"BPFObjects":true}`}})
	if err != nil {
		t.Fatal(err)
	}
	wantSets(t, lines, "exec", Sets{Permitted: ebpfCaps, Bounding: allCaps})
	wantSets(t, lines, "raised", Sets{Effective: ebpfCaps, Permitted: ebpfCaps, Bounding: allCaps})
	wantErr(t, lines, "load-before", "ok")
	// No CAP_SETPCAP: the bounding set stays; no_new_privs stops any
	// execve from using it.
	kept := bpfKept(t)
	wantSets(t, lines, "dropped", Sets{Effective: kept, Permitted: kept, Bounding: allCaps, NoNewPrivs: true})
	wantErr(t, lines, "load-after", "operation not permitted")
	wantErr(t, lines, "setns-after", "operation not permitted")
	// Not dumpable: /proc/self/mem belongs to root, not to uid 1337.
	if n := lines["dumpable"].N; n != 0 {
		t.Errorf("after the drop: dumpable %d, /proc/self/mem owned by uid %d", n/100000, n%100000)
	}
	if lines["threads"].N < 5 || len(threads) != 1 {
		t.Errorf("%d threads with %d distinct sets, want ≥ 5 threads all alike: %v", lines["threads"].N, len(threads), threads)
	}
	// The proxy gets nothing (the inheritable and ambient sets are empty);
	// after the drop, even draind's own binary gets nothing from its file
	// capabilities (no_new_privs: no more than draind still holds).
	wantSets(t, lines, "child", Sets{Bounding: allCaps})
	wantSets(t, lines, "child-after", Sets{Permitted: kept, Bounding: allCaps, NoNewPrivs: true})
}

// The same binary in a container whose bounding set lacks the capabilities
// (no capabilities.add): `+p` starts and runs without them.
func TestFilePermittedOutsideBounding(t *testing.T) {
	requireRoot(t)
	bnd := allCaps &^ ebpfCaps
	lines, _, err := runHelper(t, "run", helperSpec{uid: 1337, fileCaps: "cap_bpf,cap_perfmon+p", bounding: &bnd})
	if err != nil {
		t.Fatal(err)
	}
	wantSets(t, lines, "exec", Sets{Bounding: bnd})
	wantSets(t, lines, "raised", Sets{Bounding: bnd})
	wantErr(t, lines, "load-before", "operation not permitted")
	wantSets(t, lines, "dropped", Sets{Bounding: bnd, NoNewPrivs: true})
}

// `+ep` is the trap measured under the kubelet: execve refuses the binary
// when the bounding set lacks one of its capabilities, for any uid.
func TestFileEffectiveOutsideBounding(t *testing.T) {
	requireRoot(t)
	bnd := allCaps &^ SetOf(CapBPF)
	for _, uid := range []int{1337, -1} {
		_, _, err := runHelper(t, "report", helperSpec{uid: uid, fileCaps: "cap_bpf,cap_perfmon+ep", bounding: &bnd})
		if !errors.Is(err, unix.EPERM) {
			t.Errorf("uid %d: exec of a +ep binary outside the bounding set: %v, want EPERM", uid, err)
		}
	}
	lines, _, err := runHelper(t, "report", helperSpec{uid: 1337, fileCaps: "cap_bpf,cap_perfmon+ep"})
	if err != nil {
		t.Fatal(err)
	}
	wantSets(t, lines, "child", Sets{Effective: ebpfCaps, Permitted: ebpfCaps, Bounding: allCaps})
}

// Root with every capability, starting the proxy as 1337: after start-up
// only CAP_KILL is left (to signal the proxy), the bounding set is empty,
// and a child, even root's, gets nothing.
func TestDropAsRoot(t *testing.T) {
	requireRoot(t)
	lines, threads, err := runHelper(t, "run", helperSpec{uid: -1,
		env: []string{`PRIVS_NEEDS={"SignalOtherUID":true,"BPFObjects":true}`, "PRIVS_CHILD_UID=1337"}})
	if err != nil {
		t.Fatal(err)
	}
	wantSets(t, lines, "raised", Sets{Effective: allCaps, Permitted: allCaps, Bounding: allCaps})
	wantErr(t, lines, "load-before", "ok")
	wantSets(t, lines, "limited", Sets{Effective: allCaps, Permitted: allCaps})
	keep := SetOf(CapKill) | bpfKept(t)
	wantSets(t, lines, "dropped", Sets{Effective: keep, Permitted: keep, NoNewPrivs: true})
	wantErr(t, lines, "load-after", "operation not permitted")
	wantErr(t, lines, "setns-after", "operation not permitted")
	if len(threads) != 1 {
		t.Errorf("threads differ: %v", threads)
	}
	wantSets(t, lines, "child", Sets{})
	wantSets(t, lines, "child-after", Sets{NoNewPrivs: true})
}

// --proxy-caps NET_ADMIN: the child gets exactly that, whoever draind is.
func TestGiveChildOnly(t *testing.T) {
	requireRoot(t)
	na := SetOf(CapNetAdmin)
	for _, tc := range []struct {
		name string
		spec helperSpec
		// what the child holds: NET_ADMIN effective, permitted, ambient
		// (and inheritable: Go raises it there to make it ambient)
		child Sets
	}{
		{"root, child as root", helperSpec{uid: -1}, Sets{Effective: na, Permitted: na, Inheritable: na, Ambient: na, Bounding: na}},
		{"root, child as 1337", helperSpec{uid: -1, env: []string{"PRIVS_CHILD_UID=1337"}}, Sets{Effective: na, Permitted: na, Inheritable: na, Ambient: na, Bounding: na}},
		{"uid 1337 with file caps", helperSpec{uid: 1337, fileCaps: "cap_bpf,cap_perfmon,cap_net_admin+p"}, Sets{Effective: na, Permitted: na, Inheritable: na, Ambient: na, Bounding: allCaps}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.env = append(tc.spec.env, "PRIVS_GIVE=NET_ADMIN")
			lines, _, err := runHelper(t, "run", tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			wantSets(t, lines, "child", tc.child)
			if s := lines["dropped"].Sets; s == nil || s.Effective|s.Permitted|s.Ambient|s.Inheritable != 0 {
				t.Errorf("draind after the drop:\n%s", s.StatusLines())
			}
		})
	}
	// Nothing draind does not hold can be given.
	lines, _, err := runHelper(t, "run", helperSpec{uid: 1337, fileCaps: "cap_bpf,cap_perfmon+p", env: []string{"PRIVS_GIVE=NET_ADMIN"}})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, lines, "limited", "cannot pass NET_ADMIN to a child: not in the permitted set (PERFMON,BPF)")
}

// A map created before the drop stays usable with what Keep keeps, on every
// kernel; with nothing kept, exactly the kernels the probe names refuse.
func TestHeldBPFObjects(t *testing.T) {
	requireRoot(t)
	for _, keepBPF := range []bool{true, false} {
		var env []string
		if keepBPF {
			env = []string{"PRIVS_KEEP_BPF=1"}
		}
		lines, _, err := runHelper(t, "maps", helperSpec{uid: -1, env: env})
		if err != nil {
			t.Fatal(err)
		}
		l := lines["lookup"]
		needs := l.N == 1
		sysctl, _ := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
		t.Logf("kernel %s, unprivileged_bpf_disabled=%s: keep BPF=%v: lookup %s (kernel checks every call: %v)",
			kernelRelease(), strings.TrimSpace(string(sysctl)), keepBPF, l.Err, needs)
		switch {
		case keepBPF && l.Err != "ok":
			t.Errorf("lookup with what Keep keeps: %s", l.Err)
		case !keepBPF && needs && !strings.Contains(l.Err, "operation not permitted"):
			t.Errorf("the probe says the kernel checks every call, but the lookup gave %s", l.Err)
		case !keepBPF && !needs && l.Err != "ok":
			t.Errorf("the probe says no capability is needed, but the lookup gave %s", l.Err)
		}
	}
}

func kernelRelease() string {
	var u unix.Utsname
	unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}
