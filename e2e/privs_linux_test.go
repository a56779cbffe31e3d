package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/privs"
)

// draind's privileges in a pod, with the real binary: static
// (CGO_ENABLED=0, as the image builds it: a cgo binary cannot change every
// thread's capabilities), carrying the image's file capabilities, run as
// the container's PID 1 under the uid and bounding set a runtime gives it.
// What it holds is read from /proc/PID/status of the running process, and
// from inside, on loopback, by /debug/privileges.

// boundingEnv (hex) is the bounding set containerInit gives a container
// (capabilities.add puts a capability there; drop: [ALL] empties it).
const boundingEnv = "DRAIND_E2E_BOUNDING"

// imageFileCaps are the Dockerfile's DRAIND_FILE_CAPS.
const imageFileCaps = "cap_bpf,cap_perfmon,cap_net_admin+p"

var staticDraind struct {
	sync.Once
	bin []byte // the static binary
	err error
}

// draindBinary writes a static draind with imageFileCaps into a directory
// of the test's whose filesystem honours file capabilities. DRAIND_E2E_BIN
// names a prebuilt one (where no Go toolchain is, e.g. in a VM); otherwise
// it is built once per test process.
func draindBinary(t *testing.T) string {
	t.Helper()
	var parent string
	for _, d := range []string{os.TempDir(), "/var/tmp"} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Flags&unix.ST_NOSUID == 0 {
			parent = d
			break
		}
	}
	if parent == "" {
		t.Skipf("%s and /var/tmp are mounted nosuid: execve ignores file capabilities there", os.TempDir())
	}
	staticDraind.Do(func() {
		if prebuilt := os.Getenv("DRAIND_E2E_BIN"); prebuilt != "" {
			staticDraind.bin, staticDraind.err = os.ReadFile(prebuilt)
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			staticDraind.err = fmt.Errorf("skip: no go toolchain to build a static draind (set DRAIND_E2E_BIN): %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "draind-build-")
		if err != nil {
			staticDraind.err = err
			return
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", filepath.Join(dir, "draind"), "../cmd/draind")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticDraind.err = fmt.Errorf("build a static draind: %w\n%s", err, out)
			return
		}
		staticDraind.bin, staticDraind.err = os.ReadFile(filepath.Join(dir, "draind"))
	})
	if err := staticDraind.err; err != nil {
		if msg, ok := strings.CutPrefix(err.Error(), "skip: "); ok {
			t.Skip(msg)
		}
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, "draind-privs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "draind")
	if err := os.WriteFile(path, staticDraind.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(path, "security.capability", fileCapsXattr(imageFileCaps), 0); err != nil {
		t.Fatalf("file capabilities: %v", err)
	}
	return path
}

// fileCapsXattr is security.capability (vfs_cap_data revision 2) for
// setcap's NAMES+p or NAMES+ep.
func fileCapsXattr(text string) []byte {
	names, flags, _ := strings.Cut(text, "+")
	set, err := privs.ParseSet(names)
	if err != nil {
		panic(err)
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

// procSets reads a process's sets from /proc/PID/status, and checks that
// every thread has them.
func procSets(t *testing.T, pid int) (privs.Sets, string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	s, err := privs.ReadStatus(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	threads, err := privs.Threads(pid)
	if err != nil {
		t.Fatal(err)
	}
	for tid, ts := range threads {
		if ts != s {
			t.Errorf("pid %d: thread %d has other sets:\n%s", pid, tid, ts.StatusLines())
		}
	}
	var lines []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Uid") {
			lines = append(lines, l)
		}
	}
	return s, strings.Join(lines, "\n")
}

// childPid is the host pid of draind's child (the proxy): any of its
// threads may have forked it.
func childPid(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.Atoi(f[0])
			return n
		}
	}
	t.Fatalf("draind (pid %d) has no child", pid)
	return 0
}

// debugPrivileges is GET /debug/privileges from inside the pod, on
// loopback.
func (p *pod) debugPrivileges(t *testing.T) (bpfLoad, setns string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: p.ns.Dialer()}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://127.0.0.1:15020/debug/privileges")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		BPFLoad string `json:"bpf_load"`
		Setns   string `json:"setns"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/debug/privileges: %d %s: %v", resp.StatusCode, b, err)
	}
	return out.BPFLoad, out.Setns
}

// startStaticDraind starts the static draind as the proxy container's PID
// 1 under uid (< 0: root) with bounding as its bounding set.
func (p *pod) startStaticDraind(t *testing.T, uid int, bounding privs.Set, draindArgs []string, proxy ...string) {
	t.Helper()
	t.Setenv(boundingEnv, strconv.FormatUint(uint64(bounding), 16))
	if proxy == nil {
		proxy = []string{p.bin, "__envoysim", "-c", p.envoyConfig(0)}
	}
	args := append([]string{"run", "--status-addr", "0.0.0.0:15020", "--log-format", "json"}, draindArgs...)
	args = append(append(args, "--"), proxy...)
	p.draindLog = &syncBuffer{}
	p.draind = p.runContainer("draind", uid, io.MultiWriter(p.draindLog, testWriter{t}), draindBinary(t), args...)
}

// hostBounding is the bounding set of this (root) test.
func hostBounding(t *testing.T) privs.Set {
	s, err := privs.Current()
	if err != nil {
		t.Fatal(err)
	}
	return s.Bounding
}

// keptBPF is CAP_BPF when draind kept it (a kernel that checks every bpf()
// call; its log says so).
func (p *pod) keptBPF() privs.Set {
	l := p.waitLog(5*time.Second, logevent.Capabilities, map[string]any{"stage": "after start-up"})
	if strings.Contains(fmt.Sprint(l["kept"]), "BPF:") {
		return privs.SetOf(privs.CapBPF)
	}
	return 0
}

// uid 1337, the image's file capabilities (+p), BPF and PERFMON added (and
// NET_ADMIN, with --proxy-caps NET_ADMIN): draind runs in eBPF mode, then
// holds nothing (CAP_BPF on kernels that check every bpf() call); the
// proxy holds only what it was given; from inside draind, loading a
// tracing program and entering a namespace fail with EPERM.
func TestPrivilegesNonRoot(t *testing.T) {
	bnd := privs.SetOf(privs.CapBPF, privs.CapPerfmon, privs.CapNetAdmin)
	for _, tc := range []struct {
		name      string
		bounding  privs.Set
		args      []string
		tracker   string
		proxyCaps privs.Set
	}{
		{"capabilities.add BPF PERFMON", bnd &^ privs.SetOf(privs.CapNetAdmin), nil, "ebpf", 0},
		{"drop ALL, nothing added", 0, nil, "sockdiag", 0},
		{"capabilities.add BPF PERFMON NET_ADMIN, --proxy-caps NET_ADMIN", bnd, []string{"--proxy-caps", "NET_ADMIN"}, "ebpf", privs.SetOf(privs.CapNetAdmin)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.startApp("--on-term", "exit")
			p.startStaticDraind(t, 1337, tc.bounding, append([]string{"--min-drain", "200ms"}, tc.args...))
			p.waitReady(20 * time.Second)
			p.wantSources(tc.tracker, "")
			start := p.waitLog(5*time.Second, logevent.Capabilities, map[string]any{"stage": "start"})
			t.Logf("at start: %v", start)
			// The file's capabilities that the bounding set has.
			if want := tc.bounding.String(); start["raised"] != want {
				t.Errorf("raised %v, want %s", start["raised"], want)
			}

			kept := privs.Set(0)
			if tc.tracker == "ebpf" {
				kept = p.keptBPF()
			}
			got, lines := procSets(t, p.draind.Pid())
			t.Logf("draind after start-up:\n%s", lines)
			if want := (privs.Sets{Effective: kept, Permitted: kept, Bounding: tc.bounding, NoNewPrivs: true}); got != want {
				t.Errorf("draind after start-up:\n%s\nwant\n%s", got.StatusLines(), want.StatusLines())
			}
			// Not dumpable: the proxy, under the same uid, may not ptrace it.
			var st unix.Stat_t
			if err := unix.Stat(fmt.Sprintf("/proc/%d/mem", p.draind.Pid()), &st); err != nil || st.Uid != 0 {
				t.Errorf("draind's /proc/PID/mem belongs to uid %d (%v): draind is dumpable", st.Uid, err)
			}
			proxySets, proxyLines := procSets(t, childPid(t, p.draind.Pid()))
			t.Logf("the proxy:\n%s", proxyLines)
			pc := tc.proxyCaps
			if want := (privs.Sets{Effective: pc, Permitted: pc, Inheritable: pc, Ambient: pc, Bounding: tc.bounding}); proxySets != want {
				t.Errorf("the proxy:\n%s\nwant\n%s", proxySets.StatusLines(), want.StatusLines())
			}
			bpfLoad, setns := p.debugPrivileges(t)
			if !strings.Contains(bpfLoad, "operation not permitted") || !strings.Contains(setns, "operation not permitted") {
				t.Errorf("inside draind after start-up: bpf load %q, setns %q: want EPERM", bpfLoad, setns)
			}
			p.terminate()
			if code, _ := p.waitExit(15 * time.Second); code != 0 {
				t.Errorf("exit %d; log:\n%s", code, p.draindLog.String())
			}
		})
	}
}

// Root, the proxy as 1337 (--run-proxy-as), a stuck proxy (it ignores
// SIGTERM and /quitquitquit): after start-up draind keeps CAP_KILL alone
// (to signal a proxy under another uid), empties its bounding set when it
// holds CAP_SETPCAP, and the proxy holds nothing; at the deadline the
// proxy is SIGKILLed. Without CAP_KILL (the set docs/kubernetes.md used to
// give) draind says so at start, and cannot kill it.
func TestPrivilegesRoot(t *testing.T) {
	ebpf := privs.SetOf(privs.CapBPF, privs.CapPerfmon)
	setid := privs.SetOf(privs.CapSetUID, privs.CapSetGID)
	for _, tc := range []struct {
		name     string
		bounding func(t *testing.T) privs.Set
		kill     bool // draind holds CAP_KILL
		setpcap  bool // and CAP_SETPCAP: its bounding set ends empty
	}{
		{"every capability", hostBounding, true, true},
		{"drop ALL, add BPF PERFMON SETUID SETGID KILL SETPCAP", func(*testing.T) privs.Set {
			return ebpf | setid | privs.SetOf(privs.CapKill, privs.CapSetPCap)
		}, true, true},
		{"drop ALL, add BPF PERFMON SETUID SETGID", func(*testing.T) privs.Set { return ebpf | setid }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t)
			p.startApp("--on-term", "exit")
			bnd := tc.bounding(t)
			p.startStaticDraind(t, -1, bnd, []string{"--run-proxy-as", "1337", "--min-drain", "100ms", "--drain-deadline", "4s", "--stop-timeout", "300ms"},
				p.bin, "__stuckproxy")
			p.wantSources("ebpf", "")
			keep := p.keptBPF()
			if tc.kill {
				keep |= privs.SetOf(privs.CapKill)
			} else {
				p.waitLog(time.Second, logevent.CapabilityMissing, map[string]any{"cap": "KILL"})
			}
			wantBnd := bnd
			if tc.setpcap {
				wantBnd = 0
			}
			got, lines := procSets(t, p.draind.Pid())
			t.Logf("draind (root) after start-up:\n%s", lines)
			if want := (privs.Sets{Effective: keep, Permitted: keep, Bounding: wantBnd, NoNewPrivs: true}); got != want {
				t.Errorf("draind after start-up:\n%s\nwant\n%s", got.StatusLines(), want.StatusLines())
			}
			proxySets, proxyLines := procSets(t, childPid(t, p.draind.Pid()))
			t.Logf("the proxy:\n%s", proxyLines)
			if proxySets != (privs.Sets{Bounding: wantBnd}) {
				t.Errorf("the proxy holds:\n%s", proxySets.StatusLines())
			}
			bpfLoad, setns := p.debugPrivileges(t)
			if !strings.Contains(bpfLoad, "operation not permitted") || !strings.Contains(setns, "operation not permitted") {
				t.Errorf("inside draind after start-up: bpf load %q, setns %q: want EPERM", bpfLoad, setns)
			}
			p.terminate()
			code, _ := p.waitExit(20 * time.Second)
			why := fmt.Sprint(p.waitLog(time.Second, logevent.Phase, map[string]any{"phase": "exited"})["why"])
			want := "proxy had to be killed"
			if !tc.kill {
				want = "proxy did not exit even after SIGKILL"
			}
			t.Logf("exit %d: %s", code, why)
			if code != 137 || !strings.Contains(why, want) {
				t.Errorf("exit %d, %q: want 137 and %q; log:\n%s", code, why, want, p.draindLog.String())
			}
		})
	}
}

// --proxy-caps asks for what draind does not hold: a one-line
// configuration error, exit 2, and no proxy.
func TestPrivilegesProxyCapsNotHeld(t *testing.T) {
	p := newPod(t)
	p.startStaticDraind(t, 1337, privs.SetOf(privs.CapBPF, privs.CapPerfmon), []string{"--proxy-caps", "NET_ADMIN,NET_RAW"})
	if !p.draind.wait(15 * time.Second) {
		t.Fatal("draind did not exit")
	}
	if p.draind.code != 2 || !strings.Contains(p.draindLog.String(), "--proxy-caps NET_ADMIN,NET_RAW: draind does not hold NET_ADMIN,NET_RAW (permitted: PERFMON,BPF)") {
		t.Errorf("exit %d; log:\n%s", p.draind.code, p.draindLog.String())
	}
}
