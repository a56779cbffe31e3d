package cli

// `draind pods`: the node's view, each pod asked at once, its draind over
// the pod's loopback or its flows from the kernel (pods_target.go finds a
// pod's draind, pods_render.go writes the table).

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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/cri"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/sockdiag"
)

// podProbes is how many pods `draind pods` asks at once: a node's 110
// pods in seven rounds of --timeout at worst, while one CPU's worth of
// sock_diag dumps and HTTP calls never floods the node.
const podProbes = 16

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

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
