package kubelet_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/draind/draind/internal/logevent"
)

// securityContext builds a container securityContext.
func securityContext(uid int64, noEscalation bool, add ...corev1.Capability) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		RunAsUser: &uid, RunAsGroup: &uid,
		Capabilities: &corev1.Capabilities{Add: add, Drop: []corev1.Capability{"ALL"}},
	}
	if noEscalation {
		f := false
		sc.AllowPrivilegeEscalation = &f
	}
	return sc
}

func withSeccomp(sc *corev1.SecurityContext) *corev1.SecurityContext {
	sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	return sc
}

var trackerInfo = regexp.MustCompile(`draind_tracker_info\{mode="([a-z]+)"\} 1`)

// What a row expects when draind does not run.
const (
	execRefused = "exec-refused" // the kernel refuses to exec draind (the container exits 1 at once)
	configError = "config-error" // draind exits 2 at start, one line naming the flag
)

// Capabilities by number (linux/capability.h), for /proc/PID/status.
var capNames = [...]string{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
	"SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
	"SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
	"MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"}

// capMask is the set of the named capabilities.
func capMask(names ...string) uint64 {
	var m uint64
	for _, n := range names {
		for i, c := range capNames {
			if c == n {
				m |= 1 << i
			}
		}
	}
	return m
}

func capString(m uint64) string {
	var out []string
	for i, c := range capNames {
		if m&(1<<i) != 0 {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

// procCaps are a process's capability sets as /proc/PID/status shows them.
type procCaps struct {
	inh, prm, eff, bnd, amb uint64
	noNewPrivs              bool
}

func readProcCaps(pid int) (procCaps, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procCaps{}, err
	}
	var c procCaps
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		n, _ := strconv.ParseUint(v, 16, 64)
		switch k {
		case "CapInh":
			c.inh = n
		case "CapPrm":
			c.prm = n
		case "CapEff":
			c.eff = n
		case "CapBnd":
			c.bnd = n
		case "CapAmb":
			c.amb = n
		case "NoNewPrivs":
			c.noNewPrivs = v == "1"
		}
	}
	return c, nil
}

func (c procCaps) String() string {
	return fmt.Sprintf("eff=%s prm=%s inh=%s amb=%s bnd=%s nnp=%v", capString(c.eff), capString(c.prm), capString(c.inh),
		capString(c.amb), capString(c.bnd), c.noNewPrivs)
}

// childPIDs are the processes whose parent is pid (any of its threads).
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// capRow is one row of docs/kubernetes.md's capability table.
type capRow struct {
	name   string // pod name: caps-NAME
	image  string
	sc     *corev1.SecurityContext
	flags  []string // draind run's flags
	want   string   // tracker mode, execRefused or configError
	proxy  uint64   // what Envoy holds (effective, permitted and ambient)
	keep   uint64   // what draind keeps after start-up (and BPF where the kernel checks it on every bpf() call)
	noBnd  bool     // draind (root with SETPCAP) empties its bounding set, Envoy's too
	lacks  string   // the capability draind says at start it lacks
	errMsg string   // configError: the line it prints
}

// Which tracker draind runs under each securityContext, as the kubelet and
// runc apply it, and what draind and Envoy hold once started (read from
// /proc/PID/status on the host and from draind's log). A non-root user
// gets capabilities.add only in its bounding set (the CRI sets no ambient
// or inheritable ones), so eBPF needs file capabilities on the binary;
// root gets the added ones directly.
func TestTrackerModeBySecurityContext(t *testing.T) {
	ebpf := []corev1.Capability{"BPF", "PERFMON"}
	rootAdd := append(ebpf, "SETUID", "SETGID", "KILL", "SETPCAP")
	for _, r := range []capRow{
		// The image (+p).
		{name: "p-documented", image: imgDraind, sc: nonRootEBPF(), want: "ebpf"},
		{name: "p-escalation-allowed", image: imgDraind, sc: securityContext(1337, false, ebpf...), want: "ebpf"},
		{name: "p-seccomp", image: imgDraind, sc: withSeccomp(nonRootEBPF()), want: "ebpf"},
		{name: "p-none", image: imgDraind, sc: securityContext(1337, true), want: "sockdiag"},
		{name: "p-proxy-caps", image: imgDraind, sc: securityContext(1337, true, append(ebpf, "NET_ADMIN")...),
			flags: []string{"--proxy-caps", "NET_ADMIN"}, want: "ebpf", proxy: capMask("NET_ADMIN")},
		{name: "p-proxy-caps-not-held", image: imgDraind, sc: securityContext(1337, true, ebpf...),
			flags: []string{"--proxy-caps", "NET_ADMIN"}, want: configError,
			errMsg: "--proxy-caps NET_ADMIN: draind does not hold NET_ADMIN (permitted: PERFMON,BPF)"},
		// The old image (+ep).
		{name: "ep", image: imgDraindEP, sc: securityContext(1337, false, ebpf...), want: "ebpf"},
		{name: "ep-noescalation", image: imgDraindEP, sc: securityContext(1337, true, ebpf...), want: "ebpf"},
		{name: "ep-seccomp", image: imgDraindEP, sc: withSeccomp(securityContext(1337, true, ebpf...)), want: "ebpf"},
		{name: "ep-none", image: imgDraindEP, sc: securityContext(1337, false), want: execRefused},
		// No file capabilities.
		{name: "nofcaps-added", image: imgDraindNoCaps, sc: securityContext(1337, false, ebpf...), want: "sockdiag"},
		{name: "nofcaps-none", image: imgDraindNoCaps, sc: securityContext(1337, true), want: "sockdiag"},
		// Root, Envoy as 1337.
		{name: "root", image: imgDraind, sc: securityContext(0, true, rootAdd...),
			flags: []string{"--run-proxy-as", "1337"}, want: "ebpf", keep: capMask("KILL"), noBnd: true},
		{name: "root-no-kill", image: imgDraind, sc: securityContext(0, true, append(ebpf, "SETUID", "SETGID")...),
			flags: []string{"--run-proxy-as", "1337"}, want: "ebpf", lacks: "KILL"},
	} {
		t.Run(r.name, func(t *testing.T) { runCapRow(t, r) })
	}
}

func runCapRow(t *testing.T, r capRow) {
	pd := startPod(t, "classic.yaml", podParams{
		Name: "caps-" + r.name, DraindImage: r.image, SecurityContext: r.sc,
		DraindCommand: draindCommand(append([]string{"--min-drain", "0s"}, r.flags...)),
		AppArgs:       []string{"--on-term", "exit"},
		NoWait:        r.want == execRefused || r.want == configError,
	})
	if r.want == execRefused || r.want == configError {
		var c *ctrRecord
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if c = pd.firstAttempt("draind"); c != nil && c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
				break
			}
		}
		if c == nil || c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("draind's container did not exit; want %s", r.want)
		}
		_, stderr := splitCRILog(c.log)
		why := errorLine(c.msg + "\n" + stderr)
		t.Logf("%s: container %s, exit %d, reason %q: %s", r.name, c.state, c.exitCode, c.reason, why)
		report.add("caps", r.name, fmt.Sprintf("does not run: exit %d %s: %s", c.exitCode, c.reason, why))
		switch {
		case r.want == configError && (c.exitCode != 2 || !strings.Contains(stderr, r.errMsg)):
			t.Errorf("exit %d, stderr %q: want 2 and %q", c.exitCode, stderr, r.errMsg)
		case r.want == execRefused && (c.exitCode == 0 || !strings.Contains(why, "exec /usr/local/bin/draind: operation not permitted")):
			// runc's init reports the refused execve on the
			// container's stderr and exits 1.
			t.Errorf("exit %d, %q: want execve refused with EPERM", c.exitCode, why)
		}
		return
	}
	// After start-up draind has dropped what it does not keep.
	var after map[string]any
	for end := time.Now().Add(10 * time.Second); after == nil && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		after = findLogWith(pd.draindLog(-1), logevent.Capabilities, "stage", "after start-up")
	}
	logs := pd.draindLog(-1)
	tracker, live := findLog(logs, logevent.Tracker), findLog(logs, logevent.AppLiveness)
	start := findLogWith(logs, logevent.Capabilities, "stage", "start")
	_, metrics := pd.getBody(statusPort, "/metrics")
	m := trackerInfo.FindStringSubmatch(metrics)
	if tracker == nil || m == nil || after == nil || start == nil {
		t.Fatalf("log lines: tracker %v, capabilities at start %v and after start-up %v; draind_tracker_info %v", tracker, start, after, m)
	}
	pid := containerPID(t, pd, pd.container("draind").id)
	draind, err := readProcCaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	kids := childPIDs(pid)
	if len(kids) != 1 {
		t.Fatalf("draind (pid %d) has children %v, want Envoy alone", pid, kids)
	}
	proxy, err := readProcCaps(kids[0])
	if err != nil {
		t.Fatal(err)
	}
	lacks := findLog(logs, logevent.CapabilityMissing)
	t.Logf("%s: tracker %v (%v); metrics mode=%s; app liveness %v (%v)", r.name, tracker["mode"], tracker["reason"], m[1], live["source"], live["reason"])
	t.Logf("%s: at start effective %v (raised %v); draind after start-up: %v, kept %v; Envoy: %v; lacks: %v",
		r.name, start["effective"], start["raised"], draind, after["kept"], proxy, lacks)
	report.add("caps", r.name, fmt.Sprintf("tracker=%v (%v); at start raised %v; after start-up draind %v kept %v; Envoy %v",
		tracker["mode"], tracker["reason"], start["raised"], draind, after["kept"], proxy))
	if tracker["mode"] != r.want || m[1] != r.want {
		t.Errorf("tracker %v (metrics %s), want %s", tracker["mode"], m[1], r.want)
	}
	keep := r.keep
	if strings.Contains(fmt.Sprint(after["kept"]), "BPF:") {
		keep |= capMask("BPF")
	}
	if draind.eff != keep || draind.prm != keep || !draind.noNewPrivs || draind.inh != 0 || draind.amb != 0 {
		t.Errorf("draind after start-up holds %v; want exactly %s and no_new_privs", draind, capString(keep))
	}
	if r.noBnd && (draind.bnd != 0 || proxy.bnd != 0) {
		t.Errorf("bounding sets: draind %s, Envoy %s; want both empty", capString(draind.bnd), capString(proxy.bnd))
	}
	if proxy.eff != r.proxy || proxy.prm != r.proxy || proxy.amb != r.proxy {
		t.Errorf("Envoy holds %v; want exactly %s", proxy, capString(r.proxy))
	}
	if r.lacks != "" && (lacks == nil || lacks["cap"] != r.lacks) {
		t.Errorf("no warning that draind lacks %s (got %v)", r.lacks, lacks)
	}
}

// firstAttempt is the named container's first attempt (a container that
// fails at start is restarted with a later one).
func (pd *pod) firstAttempt(name string) *ctrRecord {
	a := pd.attempts(name)
	if len(a) == 0 {
		return nil
	}
	return &a[0]
}

// errorLine is the first line of s that is neither one of draind's JSON log
// records nor a line of the proxy's log.
func errorLine(s string) string {
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		// draind's log lines are JSON; the proxy's ("[date][envoysim] ...",
		// as Envoy's) share the container's stderr and may come first.
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "{") && !strings.HasPrefix(line, "[") {
			return line
		}
	}
	return firstLine(s)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
