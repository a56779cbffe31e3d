package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/cri"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/rootfs"
	"github.com/draind/draind/internal/sockdiag"
)

// criTimeout bounds a node command's calls to the runtime (the pod's
// lookup, the node's listing).
const criTimeout = 5 * time.Second

// podProbes is how many pods `draind pods` asks at once: a node's 110
// pods in seven rounds of --timeout at worst, while one CPU's worth of
// sock_diag dumps and HTTP calls never floods the node.
const podProbes = 16

// criFlags is --cri-endpoint, with crictl's variable as an alias.
type criFlags struct {
	endpoint string
	fs       *flagSet
}

func (c *criFlags) register(fs *flagSet) {
	c.fs = fs
	fs.StringVar(&c.endpoint, "cri-endpoint", "", "the container runtime's CRI socket (unix:///PATH); unset: the node's kubelet's, else "+strings.Join(cri.DefaultEndpoints, " or "))
	fs.alias("cri-endpoint", envAlias{name: "CONTAINER_RUNTIME_ENDPOINT"})
}

// dial finds the endpoint and connects. Its errors are usage errors (exit
// 2), one line naming the endpoint and why it was chosen.
func (c *criFlags) dial(ctx context.Context, cmd string) (*cri.Client, cri.Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, criTimeout)
	defer cancel()
	ep, err := cri.Locate(ctx, c.endpoint, c.fs.sourceOf("cri-endpoint"))
	if err != nil {
		return nil, ep, usageErr("%s: %v", cmd, err)
	}
	client, err := cri.Dial(ctx, ep.Socket)
	if err != nil {
		return nil, ep, usageErr("%s: cri endpoint %s (%s): %v", cmd, ep.Address, ep.Why, err)
	}
	return client, ep, nil
}

// podTarget is the pod --pod named, as conns and watch looked into it.
type podTarget struct {
	Pod cri.Pod `json:"pod"`
	// Container is --container; PID the process whose network namespace
	// was entered (the sandbox's, or that container's).
	Container string       `json:"container,omitempty"`
	PID       int          `json:"pid,omitempty"`
	CRI       cri.Endpoint `json:"cri"`
	Runtime   string       `json:"runtime"`
}

// label names the target in the output's header and summary (raw: a
// table prints it through printable).
func (t *podTarget) label() string {
	via := "pid " + strconv.Itoa(t.PID)
	if t.Container != "" {
		via = "container " + t.Container + ", " + via
	}
	if t.PID == 0 {
		via = "netns " + t.Pod.NetNSPath
	}
	return fmt.Sprintf("pod %s (%s)", t.Pod.String(), via)
}

// criLine says where the pod was found: the runtime, its endpoint and why.
func (t *podTarget) criLine() string {
	return fmt.Sprintf("found through %s at %s (%s)", cell(t.Runtime, headerWidth), cell(t.CRI.Address, headerWidth), cell(t.CRI.Why, whyWidth))
}

// jsonMembers are the target as more members of a JSON object
// (",\"target\":{...}").
func (t *podTarget) jsonMembers() []byte {
	b, err := json.Marshal(t)
	if err != nil {
		return nil
	}
	return append([]byte(`,"target":`), b...)
}

// registerPod adds --pod, --container and --cri-endpoint (conns, watch).
func (n *nsFlags) registerPod(fs *flagSet) {
	fs.StringVar(&n.pod, "pod", "", "look into this pod's network namespace: NAMESPACE/NAME, found through the node's CRI socket")
	fs.StringVar(&n.container, "container", "", "with --pod: enter through this container's process (default: the pod's sandbox)")
	n.cri.register(fs)
}

// validatePod checks --pod against the other targets.
func (n *nsFlags) validatePod(cmd string) error {
	if n.pod == "" {
		if n.container != "" {
			return usageErr("%s: --container needs --pod", cmd)
		}
		return nil
	}
	if n.netns != "" || n.pid != 0 {
		return usageErr("%s: --pod is exclusive with --pid and --netns", cmd)
	}
	if _, _, ok := splitPod(n.pod); !ok {
		return usageErr("%s: --pod %q: want NAMESPACE/NAME", cmd, n.pod)
	}
	return nil
}

func splitPod(s string) (ns, name string, ok bool) {
	ns, name, ok = strings.Cut(s, "/")
	return ns, name, ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

// openTarget opens the namespace --pod names, through the CRI (n.target
// records it), or the one --pid or --netns name. An unknown pod, a pod of
// another node and a missing CRI socket are usage errors (exit 2).
func (n *nsFlags) openTarget(ctx context.Context, cmd string) (*namespace.Net, error) {
	if n.pod == "" {
		return n.open()
	}
	client, ep, err := n.cri.dial(ctx, cmd)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, criTimeout)
	defer cancel()
	podNS, name, _ := splitPod(n.pod)
	pod, err := client.FindPod(ctx, podNS, name)
	if errors.Is(err, cri.ErrPodNotFound) || errors.Is(err, cri.ErrPodNotReady) {
		return nil, usageErr("%s: pod %s: %v (%s at %s: %s)", cmd, n.pod, err, client.Runtime, ep.Address, ep.Why)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: pod %s: %w", cmd, n.pod, err)
	}
	t := &podTarget{Pod: *pod, PID: pod.PID, CRI: ep, Runtime: client.Runtime, Container: n.container}
	if n.container != "" {
		cs, err := client.Containers(ctx, pod)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd, err)
		}
		i := slices.IndexFunc(cs, func(c cri.Container) bool { return c.Name == n.container })
		if i < 0 || cs[i].PID == 0 {
			names := make([]string, len(cs))
			for j, c := range cs {
				names[j] = c.Name
			}
			return nil, usageErr("%s: pod %s has no running container %q (running: %s)", cmd, n.pod, n.container, strings.Join(names, ", "))
		}
		t.PID = cs[i].PID
	}
	ns, err := openPodNetNS(ep, &t.Pod, t.PID)
	if err != nil {
		return nil, fmt.Errorf("%s: pod %s: %w", cmd, n.pod, err)
	}
	n.target = t
	return ns, nil
}

// label names what conns and watch look into.
func (n *nsFlags) label(ns *namespace.Net) string {
	if n.target != nil {
		return n.target.label()
	}
	return ns.Name()
}

// openPodNetNS opens a pod's network namespace: through a process of the
// pod (its PID on the node, which this process sees with hostPID), else
// through the path the runtime names, under the node's root as reached
// from here.
func openPodNetNS(ep cri.Endpoint, pod *cri.Pod, pid int) (*namespace.Net, error) {
	if pid > 0 {
		ns, err := namespace.ByPID(pid)
		if err == nil || pod.NetNSPath == "" {
			return ns, err
		}
	}
	if pod.NetNSPath == "" {
		return nil, errors.New("the runtime names no process and no network namespace of it")
	}
	return namespace.Open(ep.HostRoot + pod.NetNSPath)
}

// podsOptions are `draind pods`' flags.
type podsOptions struct {
	nf             nsFlags
	cri            criFlags
	out            *oneOf[outputFormat]
	every, timeout time.Duration
}

func podsFlags(stdout io.Writer) (*flagSet, *podsOptions) {
	fs := newFlagSet("pods", "pods [--cri-endpoint unix:///PATH] [-o table|json] [-w [INTERVAL]] [--timeout D]", stdout)
	o := &podsOptions{out: newOneOf(outputTable, outputFormats)}
	o.nf.register(fs, false)
	o.cri.register(fs)
	fs.Var(o.out, "o", "output format: "+o.out.choices()+" (json: one object per view; with -w, JSON lines)")
	fs.durationVar(&o.every, "watch", 0, "refresh every INTERVAL (alone: 1s): the table redrawn on a terminal, else printed again")
	fs.durationVar(&o.every, "w", 0, "short for --watch")
	fs.optionalValue("watch", "1s")
	fs.optionalValue("w", "1s")
	fs.durationVar(&o.timeout, "timeout", time.Second, "how long each pod may take to answer before it is marked and left out")
	return fs, o
}

// runPods is `draind pods`: every pod of the node, one line each. For a
// pod that runs draind, where its drain stands, as its draind says
// (GET /debug/state over the pod's loopback); for the others, their
// flows as the kernel has them.
func runPods(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := podsFlags(stdout)
	if err := o.nf.parse(fs, args); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageErr("pods: unexpected argument %q", fs.Arg(0))
	}
	if o.timeout <= 0 {
		return usageErr("pods: --timeout must be positive")
	}
	o.nf.caps.warn(stderr, "pods")
	ctx, stop := untilSignal(ctx)
	defer stop()
	client, ep, err := o.cri.dial(ctx, "pods")
	if err != nil {
		return err
	}
	defer client.Close()
	v := &nodeViewer{cri: client, ep: ep, policy: o.nf.policy(), timeout: o.timeout}
	redraw := o.every > 0 && o.out.val == outputTable && isTerminal(stdout)
	enc := json.NewEncoder(stdout)
	tick := time.NewTimer(0)
	defer tick.Stop()
	for first := true; ; first = false {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		view, err := v.view(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("pods: %w", err)
		}
		switch {
		case o.out.val == outputJSON:
			err = enc.Encode(view)
		case redraw:
			_, err = io.WriteString(stdout, "\x1b[H\x1b[2J")
			if err == nil {
				err = writeNodeView(stdout, &view)
			}
		default:
			if !first {
				io.WriteString(stdout, "\n")
			}
			err = writeNodeView(stdout, &view)
		}
		if err != nil || o.every == 0 {
			return err
		}
		tick.Reset(o.every)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// nodeView is one look at the node's pods: `draind pods -o json`.
type nodeView struct {
	Time    time.Time    `json:"time"`
	CRI     cri.Endpoint `json:"cri"`
	Runtime string       `json:"runtime"`
	// Timeout is what each pod had to answer (--timeout), in ms.
	TimeoutMS int64    `json:"timeout_ms"`
	Pods      []podRow `json:"pods"`
}

// podRow is one pod of the view.
type podRow struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	HostNetwork bool   `json:"host_network,omitempty"`
	// Draind is the pod's `draind run`, when one of its containers runs
	// it; State what it answered.
	Draind *draindRef      `json:"draind,omitempty"`
	State  *agent.PodState `json:"state,omitempty"`
	// Flows is the kernel's count of a pod without draind.
	Flows *flows.Summary `json:"flows,omitempty"`
	// Error is what could not be read ("no answer in 1s").
	Error string `json:"error,omitempty"`
}

// draindRef is where a pod's draind serves its state.
type draindRef struct {
	Container string `json:"container"`
	// StatusAddr is the address dialled in the pod's network namespace;
	// From what set it (--status-addr, DRAIND_STATUS_ADDR, pilot-agent's
	// neighbour, the default).
	StatusAddr string `json:"status_addr"`
	From       string `json:"status_addr_from"`
}

// nodeViewer takes views of the node.
type nodeViewer struct {
	cri     *cri.Client
	ep      cri.Endpoint
	policy  flows.Policy
	timeout time.Duration
}

// view lists the node's ready pods and asks each, podProbes at a time,
// each within the timeout: a pod that does not answer is marked, never
// waited for longer. It returns when ctx ends (a signal), whatever the
// probes are doing.
func (v *nodeViewer) view(ctx context.Context) (nodeView, error) {
	lctx, cancel := context.WithTimeout(ctx, criTimeout)
	pods, err := v.cri.Pods(lctx)
	cancel()
	if err != nil {
		return nodeView{}, err
	}
	view := nodeView{Time: time.Now(), CRI: v.ep, Runtime: v.cri.Runtime, TimeoutMS: v.timeout.Milliseconds()}
	view.Pods, err = probeAll(ctx, pods, v.timeout, v.probe)
	return view, err
}

// probeGrace is how long past its timeout a probe that ignores it (a
// system call the kernel does not interrupt: a hung filesystem) is
// waited for before its pod is marked without it.
const probeGrace = 100 * time.Millisecond

// probeAll runs probe on each pod, podProbes at a time, each with ctx
// bounded by timeout, and returns their rows in the pods' order; ctx's
// error when it ends first. A probe that has not returned by its
// timeout and probeGrace is left behind: its pod is marked, its slot
// freed, and its goroutine ends when its probe returns, into a buffer
// nobody reads. Nothing waits for it: not the view, not the exit.
func probeAll(ctx context.Context, pods []cri.Pod, timeout time.Duration, probe func(context.Context, *cri.Pod) podRow) ([]podRow, error) {
	type result struct {
		i   int
		row podRow
	}
	results := make(chan result, len(pods))
	slots := make(chan struct{}, podProbes)
	for i := range pods {
		go func() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-slots }()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			done := make(chan podRow, 1)
			go func() { done <- probe(pctx, &pods[i]) }()
			backstop := time.NewTimer(timeout + probeGrace)
			defer backstop.Stop()
			select {
			case row := <-done:
				results <- result{i, row}
			case <-backstop.C:
				p := &pods[i]
				results <- result{i, podRow{Namespace: p.Namespace, Name: p.Name, HostNetwork: p.HostNetwork,
					Error: fmt.Sprintf("no answer in %s", timeout)}}
			case <-ctx.Done():
			}
		}()
	}
	rows := make([]podRow, len(pods))
	for range pods {
		select {
		case r := <-results:
			rows[r.i] = r.row
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return rows, nil
}

// probe reads one pod, within the timeout.
func (v *nodeViewer) probe(ctx context.Context, pod *cri.Pod) podRow {
	row := podRow{Namespace: pod.Namespace, Name: pod.Name, HostNetwork: pod.HostNetwork}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	failed := func(what string, err error) podRow {
		if errors.Is(err, context.DeadlineExceeded) {
			row.Error = fmt.Sprintf("%s: no answer in %s", what, v.timeout)
		} else {
			row.Error = what + ": " + oneLine(err.Error())
		}
		return row
	}
	if pod.StatusErr != nil {
		return failed("the runtime", pod.StatusErr)
	}
	cs, err := v.cri.Containers(ctx, pod)
	if err != nil {
		return failed("the runtime", err)
	}
	row.Draind, err = findDraind(ctx, cs)
	if err != nil {
		return failed("draind's settings", err)
	}
	ns, err := openPodNetNS(v.ep, pod, pod.PID)
	if err != nil {
		return failed("network namespace", err)
	}
	defer ns.Close()
	if row.Draind != nil {
		st, err := readPodState(ctx, ns, row.Draind.StatusAddr)
		if err != nil {
			return failed("draind at "+row.Draind.StatusAddr, err)
		}
		row.State = st
		return row
	}
	if pod.HostNetwork {
		return row // the node's flows are no pod's
	}
	sum, err := flowSummary(ns, v.policy)
	if err != nil {
		return failed("sock_diag", err)
	}
	row.Flows = &sum
	return row
}

// flowSummary counts a namespace's sockets (no tcp_info: the summary's
// idle count needs it only with --idle-timeout).
func flowSummary(ns *namespace.Net, p flows.Policy) (flows.Summary, error) {
	d, err := sockdiag.Dial(ns)
	if err != nil {
		return flows.Summary{}, err
	}
	defer d.Close()
	d.SetInfo(p.IdleTimeout > 0)
	skip := func(*flows.Flow) {}
	var sum flows.Summary
	for range 3 {
		if sum, err = eachFlow(d, p, skip, skip); !errors.Is(err, sockdiag.ErrDumpInterrupted) {
			break
		}
	}
	return sum, err
}

// findDraind is the pod's container that runs `draind run`, and where
// its status server is; nil when none does. The address can depend on
// a file in the container (Istio's annotations): read inside its root,
// within ctx; what cannot be read is an error, with the container named.
func findDraind(ctx context.Context, cs []cri.Container) (*draindRef, error) {
	for _, c := range cs {
		annotations := func() ([]byte, error) { return nil, nil }
		if c.PID > 0 {
			annotations = func() ([]byte, error) { return containerAnnotations(ctx, c.PID) }
		}
		addr, from, ok, err := draindStatusAddr(c.Args, c.Env, annotations)
		if !ok {
			continue
		}
		ref := &draindRef{Container: c.Name, StatusAddr: addr, From: from}
		if err != nil {
			ref.StatusAddr, ref.From = "", ""
		}
		return ref, err
	}
	return nil, nil
}

// containerAnnotations reads Istio's annotations file where pilot-agent
// reads it, relative to its working directory, inside its container's
// root (/proc/PID/root): links in the container resolve there, never in
// this process's root.
func containerAnnotations(ctx context.Context, pid int) ([]byte, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	cwd, err := rootfs.Cwd(proc)
	if err != nil {
		return nil, err
	}
	return istio.ReadAnnotationsFile(ctx, proc+"/root", filepath.Join(cwd, istio.PodAnnotations))
}

// draindStatusAddr says whether a container's argv runs `draind run`
// (draind as argv[0], or after an init wrapper), and the address to dial
// in the pod for its status server: where that draind listens
// (istio.StatusAddrOf, from its argv and environment, and under
// pilot-agent Istio's settings from its environment and the annotations
// file annotations reads, as run reads them), an address on every
// interface dialled on loopback, which /debug/state requires. An
// annotations file that cannot be read or parsed is an error (ok still
// true): run would have refused it.
func draindStatusAddr(args, env []string, annotations func() ([]byte, error)) (addr, from string, ok bool, err error) {
	in, lookup, ok := istio.RunArgs(args, env)
	if !ok {
		return "", "", false, nil
	}
	if in.NeedsSettings() {
		if in.Settings, err = istio.ReadFrom(lookup, istio.PodAnnotations, annotations); err != nil {
			return "", "", true, err
		}
	}
	a := istio.StatusAddrOf(in)
	return loopbackAddr(a.Addr), a.From, true, nil
}

// loopbackAddr is where a status server listening at addr is dialled
// from inside its pod: loopback for an unspecified host (or none).
func loopbackAddr(addr string) string {
	host, port, err := agent.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	ip, perr := netip.ParseAddr(host)
	switch {
	case host == "" || perr == nil && ip.IsUnspecified() && ip.Is4():
		host = "127.0.0.1"
	case perr == nil && ip.IsUnspecified():
		host = "::1"
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// readPodState asks a pod's draind where its drain stands (GET
// /debug/state), over a TCP connection made inside the pod's network
// namespace, within ctx.
func readPodState(ctx context.Context, ns *namespace.Net, addr string) (*agent.PodState, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dialIn(ctx, ns, ap) },
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/state", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) && ue.Unwrap() != nil {
			err = ue.Unwrap() // the cause, without the URL repeated
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var st agent.PodState
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("not a state: %w", err)
	}
	return &st, nil
}

// dialIn connects to ap from inside ns (namespace.Net.Do: the socket is
// made there, and stays there), within ctx. Entering a namespace takes
// CAP_SYS_ADMIN.
func dialIn(ctx context.Context, ns *namespace.Net, ap netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", ap.String())
		return err
	})
	if err != nil && c != nil {
		c.Close() // made, but the thread could not go back
		c = nil
	}
	return c, err
}

// writeNodeView writes the view as a table, one line per pod, sorted by
// namespace and name (the runtime's listing is).
func writeNodeView(w io.Writer, v *nodeView) error {
	fmt.Fprintf(w, "%s pods on this node: %d (%s at %s: %s; each asked for at most %s)\n",
		v.Time.Format("15:04:05"), len(v.Pods), cell(v.Runtime, headerWidth), cell(v.CRI.Address, headerWidth), cell(v.CRI.Why, whyWidth),
		time.Duration(v.TimeoutMS)*time.Millisecond)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tDRAIND\tPHASE\tTRIGGER\tSINCE\tDEADLINE IN\tHOLDS / FLOWS")
	for i := range v.Pods {
		c := podCells(&v.Pods[i])
		fmt.Fprintln(tw, strings.Join(c[:], "\t"))
	}
	return tw.Flush()
}

// The widths of the table's cells that hold strings from outside (the
// runtime's names, a pod's draind's answer, errors quoting either): each
// is escaped (printable) and cut there; -o json has them whole.
const (
	podWidth     = 80  // namespace/name: 63 and 1 and, rarely, up to 253
	nameWidth    = 40  // a container's name, a phase, a trigger, a hold's kind
	errorWidth   = 160 // an error, which may quote a pod's answer
	headerWidth  = 120 // the runtime's name and address
	whyWidth     = 400 // why that endpoint: the kubelet, and those not trusted
	commWidth    = 32  // a process's name (15 bytes, escaped)
	endWhyWidth  = 40
	holdKindWide = 24
)

// podCells are a row's table cells.
func podCells(r *podRow) [7]string {
	c := [7]string{cell(r.Namespace+"/"+r.Name, podWidth), "-", "-", "-", "-", "-", "-"}
	if d := r.Draind; d != nil {
		c[1] = cell(d.Container, nameWidth) + ":?" // its settings unread: the error says why
		if _, port, err := agent.SplitHostPort(d.StatusAddr); err == nil {
			c[1] = cell(d.Container, nameWidth) + ":" + strconv.Itoa(int(port))
		}
	}
	switch {
	case r.Error != "":
		c[2], c[6] = "?", cell(r.Error, errorWidth)
	case r.State != nil:
		st := r.State
		c[2] = cell(st.Phase, nameWidth)
		if st.Trigger != "" {
			c[3], c[4], c[5] = cell(st.Trigger, nameWidth), msString(st.SinceTriggerMS), msString(st.DeadlineInMS)
		}
		c[6] = holdsCell(st)
	case r.Flows != nil:
		s := r.Flows
		c[6] = fmt.Sprintf("no draind: app listeners %d, inbound %d, outbound %d; proxy listeners %d, flows %d",
			s.AppListeners, s.AppInbound, s.AppOutbound, s.ProxyListeners, s.ProxyFlows)
	case r.HostNetwork:
		c[6] = "no draind; host network (its flows are the node's)"
	}
	return c
}

// maxHolds and maxHoldText bound the holds cell: the table stays one
// line a pod; -o json has them all.
const (
	maxHolds    = 3
	maxHoldText = 60
)

// holdsCell is what holds the drain now, or how it ended.
func holdsCell(st *agent.PodState) string {
	if e := st.End; e != nil {
		s := fmt.Sprintf("ended: %s after %s", cell(e.Why, endWhyWidth), msString(e.TookMS))
		if e.Cut {
			s += fmt.Sprintf(", cut by the deadline (%d flows, %d app processes open)", e.OpenFlows, e.AppProcesses)
		}
		return s
	}
	if len(st.Holds) == 0 {
		return "-"
	}
	var parts []string
	for i, h := range st.Holds {
		if i == maxHolds {
			parts = append(parts, fmt.Sprintf("+%d more", len(st.Holds)-i))
			break
		}
		parts = append(parts, cell(h.Kind, holdKindWide)+": "+cell(h.What, maxHoldText))
	}
	return strings.Join(parts, "; ")
}

// msString is a span in ms as a short duration (0.1 s precision).
func msString(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
