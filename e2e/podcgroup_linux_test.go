package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/drain"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/testenv/testutil"
)

// With --cgroup-root draind tracks TCP for its own pod only: at the drain
// trigger it attaches a sock_ops program to the pod's cgroup (the parent
// of its own), enables state callbacks on the pod's existing sockets, and
// attaches nothing to the node-wide inet_sock_set_state tracepoint. It
// falls back to that tracepoint when the kernel cannot enable callbacks on
// existing sockets (TCP_BPF_SOCK_OPS_CB_FLAGS, before 6.12) or when a
// socket of the pod's network namespace was made outside the pod's cgroup,
// and says which at the trigger. Either way, a request in flight at
// SIGTERM, a flow opened 1 s before it and an outbound call made 10 ms
// after it hold the drain exactly as without the flag.
func TestPodCgroupTracking(t *testing.T) {
	// The kernel that can enable state callbacks on existing sockets.
	podScoped := testutil.KernelAtLeast(t, 6, 12)
	for _, tc := range []struct {
		last string    // which of the three flows ends last
		opt  podOption // the containers' cgroup namespaces
	}{
		{flowOutbound, inPodCgroup},
		{flowInFlight, cgroupNamespaces},
		{flowOpenedBefore, cgroupNamespaces},
	} {
		t.Run("held/"+tc.last+"-last", func(t *testing.T) {
			ends := map[string]time.Duration{tc.last: 2400 * time.Millisecond}
			earlier := []time.Duration{800 * time.Millisecond, 1600 * time.Millisecond}
			for _, f := range []string{flowInFlight, flowOpenedBefore, flowOutbound} {
				if f != tc.last {
					ends[f], earlier = earlier[0], earlier[1:]
				}
			}
			p := newPod(t, tc.opt)
			// The app calls this service directly 10 ms after SIGTERM.
			slow := newSlowService(t, p.remote, remoteIP+":9001")
			outboundMS := (ends[flowOutbound] - 10*time.Millisecond).Milliseconds()
			// --app-procs off: the app is done when its sockets are (the
			// kernel's TCP view decides, not its processes).
			p.startApp("--on-term", "graceful", "--linger", "10ms", "--outbound-count", "1",
				"--outbound-url", fmt.Sprintf("http://%s:9001/slow?ms=%d", remoteIP, outboundMS))
			p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "off", "--cgroup-root", p.cgroupRoot})
			p.wantSources("ebpf", "sockets")
			pid := p.draind.Pid()
			if l := draindLinks(t, pid); l.tcpState != 0 || l.cgroup != 0 {
				t.Errorf("Ready: %s, want nothing attached", l)
			}

			// A stream opened 1 s before SIGTERM, a request in flight at
			// it: each ends at its time after SIGTERM.
			openedBefore := p.inbound(fmt.Sprintf("/stream?n=%d&ms=100", (time.Second+ends[flowOpenedBefore]).Milliseconds()/100))
			time.Sleep(time.Second) // the stream's age at SIGTERM (inbound waited for it to be in flight)
			inFlight := p.inbound(slowPath(ends[flowInFlight]))
			p.terminate()

			p.waitLog(10*time.Second, logevent.TrackingLive, nil)
			scope := p.wantTCPTracking(podScoped, "")
			if l := draindLinks(t, pid); p.draind.wait(0) {
				t.Errorf("draind exited before the flows ended; log:\n%s", p.draindLog.String())
			} else {
				p.wantLinks(l, scope)
			}

			// Each flow's end is no earlier than these moments: the app's
			// handler (or the upstream's, for the outbound call) ran that
			// long from when the client asked.
			var heldUntil []time.Time
			for _, in := range []*inboundCall{openedBefore, inFlight} {
				r := in.result()
				if r.err != nil || r.code != 200 || !r.complete {
					t.Errorf("%s: %d complete=%v %v", in.path, r.code, r.complete, r.err)
				}
				heldUntil = append(heldUntil, in.until)
			}
			code, _ := p.waitExit(20 * time.Second)
			stopping := p.phaseTime("stopping")
			if !p.app.wait(10 * time.Second) {
				t.Errorf("app still running after draind's exit")
			}
			ok, fail, _ := p.appResults()
			served := slow.served()
			if len(served) == 1 {
				heldUntil = append(heldUntil, served[0])
			}
			t.Logf("scope %s; flows end at +%s (in flight), +%s (opened 1 s before), +%s (outbound at +10ms); quitquitquit at +%s; exit %d",
				scope, ends[flowInFlight], ends[flowOpenedBefore], ends[flowOutbound], stopping.Sub(p.drainedAt), code)
			if code != 0 || ok != 1 || fail != 0 || len(served) != 1 {
				t.Errorf("exit %d; app's outbound call: %d ok, %d failed, %d served; log:\n%s", code, ok, fail, len(served), p.draindLog.String())
			}
			for i, until := range heldUntil {
				if stopping.IsZero() || stopping.Before(until) {
					t.Errorf("quitquitquit at +%s, before flow %d ended (+%s); log:\n%s", stopping.Sub(p.drainedAt), i, until.Sub(p.drainedAt), p.draindLog.String())
				}
			}
			if !p.gateHeldBy(drain.HoldAppSockets) {
				t.Errorf("the log does not say the app's sockets held the drain:\n%s", p.draindLog.String())
			}
		})
	}

	// A socket of the pod's network namespace made outside the pod's
	// cgroup (as a CNI plugin or a node agent entering the namespace
	// would): sock_ops in the pod's cgroup never sees it, so draind falls
	// back to the node-wide tracepoint, says why, and waits for it.
	t.Run("outside-socket", func(t *testing.T) {
		p := newPod(t, inPodCgroup)
		p.startApp("--on-term", "exit")
		p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--app-procs", "off", "--cgroup-root", p.cgroupRoot})
		p.wantSources("ebpf", "sockets")
		// The test (outside the pod's cgroup) connects from the pod's
		// namespace to the upstream, and holds the connection: an app
		// outbound flow (neither the proxy's uid nor a control port).
		var outside net.Conn
		var err error
		p.ns.Do(t, func() { outside, err = net.DialTimeout("tcp4", remoteIP+":9000", 5*time.Second) })
		if err != nil {
			t.Fatalf("dial from the pod's namespace: %v", err)
		}
		defer outside.Close()
		p.terminate()
		p.waitLog(10*time.Second, logevent.TrackingLive, nil)
		scope := p.wantTCPTracking(false, outside.LocalAddr().String())
		if l := draindLinks(t, p.draind.Pid()); !p.draind.wait(0) {
			p.wantLinks(l, scope)
		}
		time.Sleep(1500 * time.Millisecond)
		select {
		case <-p.draind.done:
			t.Fatalf("draind exited (%d) while the outside socket was open; log:\n%s", p.draind.code, p.draindLog.String())
		default:
		}
		closed := time.Now()
		outside.Close()
		code, _ := p.waitExit(10 * time.Second)
		stopping := p.phaseTime("stopping")
		t.Logf("outside socket closed at +%s; quitquitquit at +%s; exit %d", closed.Sub(p.drainedAt), stopping.Sub(p.drainedAt), code)
		if code != 0 || stopping.Before(closed) {
			t.Errorf("exit %d, quitquitquit %s before the outside socket closed; log:\n%s", code, closed.Sub(stopping), p.draindLog.String())
		}
		if !p.gateHeldBy(drain.HoldAppSockets) {
			t.Errorf("the log does not say the app's sockets held the drain:\n%s", p.draindLog.String())
		}
	})

	// App process tracking on (the default): at the trigger draind follows
	// the app's processes through the populated state of the pod's
	// containers' cgroups, attaching no node-wide sched program, and says
	// so. The app exits on SIGTERM once its in-flight request is done; its
	// processes hold the drain until then, and draind quits after its exit.
	// While it drains draind holds no raw_tracepoint or tracing link but
	// inet_sock_set_state's where TCP is tracked node-wide (before 6.12).
	t.Run("app-procs", func(t *testing.T) {
		p := newPod(t, cgroupNamespaces)
		p.startApp("--on-term", "graceful", "--linger", "300ms")
		p.startDraind([]string{"--min-drain", "200ms", "--tracker", "ebpf", "--cgroup-root", p.cgroupRoot})
		p.wantSources("ebpf", "ebpf")
		pid := p.draind.Pid()
		if l := draindLinks(t, pid); l.tcpState != 0 || l.cgroup != 0 || len(nodeWideLinks(l)) != 0 {
			t.Errorf("Ready: %s, want nothing attached", l)
		}
		inFlight := p.inbound(slowPath(2 * time.Second))
		p.terminate()

		p.waitLog(10*time.Second, logevent.TrackingLive, nil)
		scope := p.wantTCPTracking(podScoped, "")
		line := p.waitLog(5*time.Second, logevent.AppTracking, nil)
		t.Logf("app tracking: via %q reason %q", line["via"], line["reason"])
		if line["via"] != string(appprocs.ViaCgroupEvents) {
			t.Errorf("app tracking via %q (%v), want %q", line["via"], line["reason"], appprocs.ViaCgroupEvents)
		}
		if l := draindLinks(t, pid); p.draind.wait(0) {
			t.Errorf("draind exited before the app; log:\n%s", p.draindLog.String())
		} else {
			p.wantLinks(l, scope)
			if nw := nodeWideLinks(l); len(nw) != 0 {
				t.Errorf("draining: node-wide links %v, want none but inet_sock_set_state's", nw)
			}
		}

		if r := inFlight.result(); r.err != nil || r.code != 200 || !r.complete {
			t.Errorf("in-flight request: %d complete=%v %v", r.code, r.complete, r.err)
		}
		code, _ := p.waitExit(20 * time.Second)
		stopping := p.phaseTime("stopping")
		if !p.app.wait(10 * time.Second) {
			t.Errorf("app still running after draind's exit")
		}
		_, _, appExit := p.appResults()
		t.Logf("app exited at +%s; quitquitquit at +%s; exit %d", appExit.Sub(p.drainedAt), stopping.Sub(p.drainedAt), code)
		if code != 0 || appExit.IsZero() || stopping.IsZero() || stopping.Before(appExit) {
			t.Errorf("exit %d; quitquitquit at +%s, the app's exit at +%s: want it after; log:\n%s",
				code, stopping.Sub(p.drainedAt), appExit.Sub(p.drainedAt), p.draindLog.String())
		}
		if !p.gateHeldBy(drain.HoldAppProcs) {
			t.Errorf("the log does not say the app's processes held the drain:\n%s", p.draindLog.String())
		}
	})

	// A directory that is not a cgroup2 mount is bad input: refused at
	// start, naming the flag, before the proxy starts.
	t.Run("bad-root", func(t *testing.T) {
		p := newPod(t)
		dir := filepath.Join(p.dir, "not-cgroup2")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p.startDraindNoWait([]string{"--cgroup-root", dir})
		if !p.draind.wait(10 * time.Second) {
			t.Fatalf("draind still running with --cgroup-root %s; log:\n%s", dir, p.draindLog.String())
		}
		log := p.draindLog.String()
		t.Logf("exit %d: %s", p.draind.code, strings.TrimSpace(log))
		if p.draind.code == 0 || !strings.Contains(log, "--cgroup-root") || strings.Contains(log, "not defined") {
			t.Errorf("exit %d, want an error naming --cgroup-root; log:\n%s", p.draind.code, log)
		}
		if n := len(p.logLines(logevent.ProxyStarted)); n != 0 {
			t.Errorf("the proxy started (%d) before --cgroup-root was refused", n)
		}
	})
}

// The three flows of TestPodCgroupTracking.
const (
	flowInFlight     = "in-flight"     // a request in flight at SIGTERM, held by the app
	flowOpenedBefore = "opened-before" // a stream opened 1 s before SIGTERM
	flowOutbound     = "outbound"      // the app's call made 10 ms after SIGTERM
)

// The scopes of draind's tcp tracking line, as strings.
var (
	scopePodCgroup = string(probes.ScopePodCgroup)
	scopeNode      = string(probes.ScopeNode)
)

// wantTCPTracking waits for draind's tcp tracking line (at the trigger)
// and checks its scope: the pod's cgroup when podScoped, else the node
// with a reason, which names outside (a socket's address) when given. It
// returns the scope.
func (p *pod) wantTCPTracking(podScoped bool, outside string) string {
	p.t.Helper()
	line := p.waitLog(5*time.Second, logevent.TCPTracking, nil)
	scope, _ := line["scope"].(string)
	reason, _ := line["reason"].(string)
	p.t.Logf("tcp tracking: scope %q reason %q", scope, reason)
	switch {
	case podScoped && scope != scopePodCgroup:
		p.t.Errorf("tcp tracking scope %q (%s), want %q on this kernel", scope, reason, scopePodCgroup)
	case !podScoped && (scope != scopeNode || reason == ""):
		p.t.Errorf("tcp tracking scope %q reason %q, want %q with a reason", scope, reason, scopeNode)
	case outside != "" && testutil.KernelAtLeast(p.t, 6, 12) && !mentionsSocket(reason, outside):
		p.t.Errorf("tcp tracking reason %q does not name the socket made outside the pod's cgroup (%s)", reason, outside)
	}
	return scope
}

// mentionsSocket reports whether reason names the socket at addr (its
// address or its port) or says it is outside the pod's cgroup.
func mentionsSocket(reason, addr string) bool {
	_, port, _ := net.SplitHostPort(addr)
	return strings.Contains(reason, addr) || port != "" && strings.Contains(reason, port) || strings.Contains(reason, "outside")
}

// wantLinks checks what draind holds attached while it drains: on the pod's
// cgroup, a cgroup link on the pod's cgroup and nothing on
// inet_sock_set_state; on the node, the tracepoint as without the flag.
func (p *pod) wantLinks(l linkSet, scope string) {
	p.t.Helper()
	p.t.Logf("draining: %s", l)
	switch scope {
	case scopePodCgroup:
		if l.tcpState != 0 || l.podCgroup(p.cgroup.ID) == 0 {
			p.t.Errorf("draining on the pod's cgroup (id %d): %s, want a cgroup link there and none on inet_sock_set_state", p.cgroup.ID, l)
		}
	case scopeNode:
		if l.tcpState == 0 {
			p.t.Errorf("draining on the node: %s, want inet_sock_set_state attached", l)
		}
	}
}

// linkSet is what BPF links a process holds, from its /proc/PID/fdinfo.
type linkSet struct {
	// tcpState links are on the inet_sock_set_state tracepoint.
	tcpState int
	// cgroup counts cgroup links by the cgroup's id.
	cgroup    int
	cgroupIDs map[uint64]int
	other     []string // other links' types
}

func (l linkSet) podCgroup(id uint64) int { return l.cgroupIDs[id] }

func (l linkSet) String() string {
	return fmt.Sprintf("%d links on inet_sock_set_state, cgroup links %v, others %v", l.tcpState, l.cgroupIDs, l.other)
}

// nodeWideLinks are l's raw_tracepoint and tracing links but those on
// inet_sock_set_state: programs run for every process of the node (the
// sched tracepoints).
func nodeWideLinks(l linkSet) []string {
	var out []string
	for _, o := range l.other {
		if strings.HasPrefix(o, "raw_tracepoint:") || strings.HasPrefix(o, "tracing:") {
			out = append(out, o)
		}
	}
	return out
}

// draindLinks reads the BPF links process pid holds. A tp_btf program is a
// raw_tracepoint link naming its tracepoint (tp_name); a tracing link
// names its target by BTF id (target_btf_id), resolved in the kernel's BTF
// (btf_trace_inet_sock_set_state).
func draindLinks(t *testing.T, pid int) linkSet {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	l := linkSet{cgroupIDs: map[uint64]int{}}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		info := map[string]string{}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				info[k] = strings.TrimSpace(v)
			}
		}
		switch info["link_type"] {
		case "":
		case "raw_tracepoint":
			if info["tp_name"] == "inet_sock_set_state" {
				l.tcpState++
			} else {
				l.other = append(l.other, "raw_tracepoint:"+info["tp_name"])
			}
		case "tracing":
			if target := btfTypeName(t, info["target_btf_id"]); strings.HasSuffix(target, "inet_sock_set_state") {
				l.tcpState++
			} else {
				l.other = append(l.other, "tracing:"+target)
			}
		case "cgroup":
			id, _ := strconv.ParseUint(info["cgroup_id"], 10, 64)
			l.cgroup++
			l.cgroupIDs[id]++
		default:
			l.other = append(l.other, info["link_type"])
		}
	}
	return l
}

var kernelBTF struct {
	sync.Once
	spec *btf.Spec
	err  error
}

// btfTypeName names the kernel BTF type with id ("" when unknown).
func btfTypeName(t *testing.T, id string) string {
	n, err := strconv.ParseUint(id, 10, 32)
	if err != nil || n == 0 {
		return ""
	}
	kernelBTF.Do(func() { kernelBTF.spec, kernelBTF.err = btf.LoadKernelSpec() })
	if kernelBTF.err != nil {
		t.Fatalf("kernel BTF: %v", kernelBTF.err)
	}
	typ, err := kernelBTF.spec.TypeByID(btf.TypeID(n))
	if err != nil {
		return "btf#" + id
	}
	return typ.TypeName()
}

// inboundCall is a request from the remote namespace to the pod's inbound
// listener (Envoy's 15006, to the app), on a connection of its own closed
// after the response.
type inboundCall struct {
	path string
	// until: the app's handler runs at least until then (asked at start,
	// it sleeps or streams for as long as path says).
	until time.Time
	done  chan inboundResult
}

type inboundResult struct {
	code     int
	complete bool // the body (and a stream's grpc-status trailer) arrived whole
	err      error
}

// inbound starts a call of path (/slow?ms=N or /stream?n=N&ms=M) and
// returns once it is in flight.
func (p *pod) inbound(path string) *inboundCall {
	p.t.Helper()
	c := &inboundCall{path: path, until: time.Now().Add(handlerTime(path)), done: make(chan inboundResult, 1)}
	hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 30 * time.Second}
	get := inFlight
	if strings.HasPrefix(path, "/stream") {
		get = streamInFlight
	}
	reply := get(p.t, hc, "http://"+podIP+":15006"+path)
	go func() {
		r := <-reply
		res := inboundResult{code: r.Code, err: r.Err}
		if strings.HasPrefix(path, "/stream") {
			res.complete = r.Trailer.Get("Grpc-Status") == "0"
		} else {
			res.complete = strings.HasPrefix(r.Body, "slept ")
		}
		c.done <- res
	}()
	return c
}

func (c *inboundCall) result() inboundResult { return <-c.done }

// handlerTime is how long the app's handler runs for path.
func handlerTime(path string) time.Duration {
	_, query, _ := strings.Cut(path, "?")
	v := map[string]int{}
	for kv := range strings.SplitSeq(query, "&") {
		k, val, _ := strings.Cut(kv, "=")
		v[k], _ = strconv.Atoi(val)
	}
	if strings.HasPrefix(path, "/stream") {
		return time.Duration(v["n"]*v["ms"]) * time.Millisecond
	}
	return time.Duration(v["ms"]) * time.Millisecond
}

// slowService is an upstream in the remote namespace whose /slow?ms=N
// answers after N ms; it notes when each handler finished.
type slowService struct {
	mu   sync.Mutex
	ends []time.Time
}

func newSlowService(t *testing.T, ns *testutil.NetNS, addr string) *slowService {
	s := &slowService{}
	ln := ns.Listen(t, "tcp4", addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		s.mu.Lock()
		s.ends = append(s.ends, time.Now())
		s.mu.Unlock()
		io.WriteString(w, "slow pong\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

// served is when each call's handler finished.
func (s *slowService) served() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.ends...)
}
