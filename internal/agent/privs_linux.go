package agent

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/privs"
)

// draind's privileges over a run (docs/threat-model.md, "Privileges"): Run
// raises what execve left permitted, limits what the proxy inherits before
// starting it, and drops what it no longer needs once everything that
// needs a capability is open.

// capFields are a thread's sets as log fields.
func capFields(s privs.Sets) []zap.Field {
	return []zap.Field{
		zap.Stringer("effective", s.Effective), zap.Stringer("permitted", s.Permitted),
		zap.Stringer("inheritable", s.Inheritable), zap.Stringer("ambient", s.Ambient),
		zap.Stringer("bounding", s.Bounding), zap.Bool("no_new_privs", s.NoNewPrivs),
	}
}

// AllowUndroppedCapsEnv lets a draind that cannot change its
// capabilities (a binary linked with cgo, privs.ErrCgo) start anyway,
// keeping every capability execve gave it and handing them all to the
// proxy. Without it such a binary refuses to start: the drop is what
// bounds a compromised draind or Envoy (docs/threat-model.md), and a
// build that silently skips it fails open (issue 43).
const AllowUndroppedCapsEnv = "DRAIND_ALLOW_UNDROPPED_CAPS"

// capsUnsupported is the start-up's verdict on a binary that cannot
// change its capabilities (supported: privs.Supported()'s error): a
// one-line *ConfigError unless AllowUndroppedCapsEnv is true, else nil
// and the warning to log ("" when supported is nil).
func capsUnsupported(supported error, lookupEnv func(string) (string, bool)) (warning string, err error) {
	if supported == nil {
		return "", nil
	}
	v, set := lookupEnv(AllowUndroppedCapsEnv)
	allow, perr := strconv.ParseBool(strings.TrimSpace(v))
	switch {
	case set && perr != nil:
		return "", configErr("%s=%q: want true or false", AllowUndroppedCapsEnv, v)
	case !set || !allow:
		return "", configErr("cannot drop capabilities: %v; build with CGO_ENABLED=0, or set %s=true to keep every capability execve gave (draind's and the proxy's)", supported, AllowUndroppedCapsEnv)
	}
	return "capabilities are left as execve gave them (" + AllowUndroppedCapsEnv + "=true): draind and the proxy keep them all", nil
}

// raisePrivileges makes draind's permitted capabilities effective: an
// image's `cap_bpf,cap_perfmon+p` file capabilities (no effective bit,
// which would make execve fail when the pod does not add them) give them
// permitted only. Logged with the sets execve gave. A binary that cannot
// change them refuses to start unless told (capsUnsupported).
func (a *agent) raisePrivileges() error {
	if err := privs.Supported(); err != nil {
		warning, err := capsUnsupported(err, a.cfg.lookupEnv)
		if err != nil {
			return err
		}
		a.log.Warn("capabilities not dropped", logevent.Capabilities.Field(), zap.String("stage", "unsupported"),
			zap.String("detail", warning), zap.String("env", AllowUndroppedCapsEnv))
		return nil
	}
	before, after, err := privs.RaiseEffective()
	if err != nil {
		a.log.Warn("capabilities: raise", logevent.CapabilitiesFailed.Field(), zap.String("action", "raise"), zap.Error(err))
	}
	a.log.Info("capabilities", append(capFields(after), logevent.Capabilities.Field(), zap.String("stage", "start"),
		zap.Stringer("raised", after.Effective&^before.Effective))...)
	return nil
}

// limitProxyPrivileges leaves the proxy exactly --proxy-caps: draind must
// hold them, and clears its inheritable and ambient sets (and, as root,
// its bounding set but for them) before the proxy is started.
func (a *agent) limitProxyPrivileges() error {
	give := a.cfg.Proxy.Caps
	cur, err := privs.Current()
	if err != nil {
		return err
	}
	if missing := give &^ cur.Permitted; missing != 0 {
		return configErr("--proxy-caps %s: draind does not hold %s (permitted: %s): add it to the container's securityContext.capabilities.add and, when draind is not root, to the image's file capabilities (docs/kubernetes.md)",
			give, missing, cur.Permitted)
	}
	if privs.Supported() != nil {
		return nil // logged at start
	}
	after, err := privs.LimitInherited(give)
	if err != nil {
		a.log.Warn("capabilities: limit what the proxy inherits", logevent.CapabilitiesFailed.Field(), zap.String("action", "limit"), zap.Error(err))
		return nil
	}
	a.log.Info("capabilities", logevent.Capabilities.Field(), zap.String("stage", "proxy"), zap.Stringer("proxy_caps", give),
		zap.Stringer("inheritable", after.Inheritable), zap.Stringer("ambient", after.Ambient), zap.Stringer("bounding", after.Bounding))
	return nil
}

// dropPrivileges runs once the tracker, the app's process source and the
// proxy are started: from here on draind loads no eBPF program, enters no
// namespace and starts no process. It keeps only what the rest of the run
// uses (privs.Needs) and sets no_new_privs.
func (a *agent) dropPrivileges() {
	if privs.Supported() != nil {
		return // logged at start
	}
	if n := waitLoaderThreadsGone(200 * time.Millisecond); n > 0 {
		// They keep their capabilities until they end.
		a.log.Warn("eBPF loader threads alive at the capability drop", logevent.Capabilities.Field(), zap.String("stage", "loader_threads"), zap.Int("threads", n))
	}
	cur, err := privs.Current()
	if err != nil {
		a.log.Warn("capabilities: not dropped", logevent.CapabilitiesFailed.Field(), zap.String("action", "drop"), zap.Error(err))
		return
	}
	mode, _ := a.tracker.Mode()
	needs := privs.Needs{BPFObjects: mode == flows.ModeEBPF}
	if a.procs != nil {
		needs.BPFObjects = needs.BPFObjects || a.procs.Kind() == appprocs.ModeEBPF
		needs.OtherUsersProcs = a.procs.Kind() == appprocs.ModeProc
	}
	if c := a.cfg.Proxy.Credential; c != nil && int(c.Uid) != os.Getuid() && int(c.Uid) != os.Geteuid() {
		needs.SignalOtherUID = true
	}
	kept, lacking := needs.Keep(cur.Permitted)
	for _, k := range lacking {
		a.log.Warn("capabilities: draind lacks one it would use after start-up", logevent.CapabilityMissing.Field(), zap.Stringer("cap", k.Cap), zap.String("for", k.Why))
	}
	after, err := privs.Drop(privs.KeptSet(kept))
	if err != nil {
		a.log.Warn("capabilities: not dropped", logevent.CapabilitiesFailed.Field(), zap.String("action", "drop"), zap.Error(err))
		return
	}
	why := make([]string, len(kept))
	for i, k := range kept {
		why[i] = k.Cap.String() + ": " + k.Why
	}
	a.log.Info("capabilities", append(capFields(after), logevent.Capabilities.Field(), zap.String("stage", "after start-up"), zap.Strings("kept", why))...)
}

// waitLoaderThreadsGone waits, at most d, until no thread of the process
// runs at backgroundNice: the eBPF loaders' (background). Each ends with
// its goroutine, a moment after it: the runtime has unlinked it by then,
// so a capability drop, which reaches every thread the runtime knows,
// would miss it while it lives. Returns how many are left.
func waitLoaderThreadsGone(d time.Duration) int {
	end := time.Now().Add(d)
	for {
		n := loaderThreads()
		if n == 0 || time.Now().After(end) {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}

// loaderThreads counts the threads whose nice value is backgroundNice
// (field 19 of /proc/self/task/TID/stat).
func loaderThreads() int {
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	n := 0
	for _, tid := range tids {
		b, err := os.ReadFile("/proc/self/task/" + tid.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// "tid (comm) S ..." : the fields after comm, from field 3.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 16 && f[16] == strconv.Itoa(backgroundNice) {
			n++
		}
	}
	return n
}
