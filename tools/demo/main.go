// Command demo shows draind doing its job on this machine in under a
// minute: a pod's network namespace with an app (uid 1000) and envoysim
// (the Envoy stand-in, uid 1337) under draind, a client in a second
// namespace with a long request in flight, and the kubelet's SIGTERM to
// both containers. It prints the timeline. Run as root: make demo.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/draind/draind/internal/testenv/nsrun"
)

const (
	podIP    = "192.0.2.1" // TEST-NET-1: a namespace of this demo's, not a host
	clientIP = "192.0.2.2"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "__app" {
		os.Exit(app(os.Args[2:]))
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	bin := fs.String("bin", "bin", "directory holding draind and envoysim")
	reqDur := fs.Duration("request", 6*time.Second, "duration of the in-flight request")
	minDrain := fs.Duration("min-drain", time.Second, "draind --min-drain")
	tracker := fs.String("tracker", "auto", "draind --tracker")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("run as root: the demo creates network namespaces and loads eBPF (sudo make demo)")
	}
	draind, err := filepath.Abs(filepath.Join(*bin, "draind"))
	if err != nil {
		return err
	}
	envoysim, _ := filepath.Abs(filepath.Join(*bin, "envoysim"))
	for _, b := range []string{draind, envoysim} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%w (make build)", err)
		}
	}
	dir, err := os.MkdirTemp("", "draind-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)

	pod, client, err := makeNamespaces()
	if err != nil {
		return err
	}
	defer pod.Close()
	defer client.Close()

	t0 := time.Now()
	say := func(format string, a ...any) {
		fmt.Fprintf(out, "%+8.3fs  %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, a...))
	}

	// The app container: uid 1000, an HTTP server on :8080.
	self, _ := os.Executable()
	selfCopy := filepath.Join(dir, "app")
	if b, err := os.ReadFile(self); err == nil {
		os.WriteFile(selfCopy, b, 0o755)
	}
	appCmd := exec.Command(selfCopy, "__app")
	// Each container its own mount namespace, as a runtime gives it: the
	// processes of draind's own are never the app (docs/design.md).
	appCmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWNS}
	appOut, _ := appCmd.StdoutPipe()
	if err := startIn(pod, appCmd); err != nil {
		return fmt.Errorf("start app: %w", err)
	}
	defer func() { appCmd.Process.Kill(); appCmd.Wait() }()
	bufio.NewReader(appOut).ReadString('\n')
	say("pod up: app (uid 1000) serves :8080 in the pod's network namespace")

	// The proxy container: draind running envoysim (uid 1337).
	conf := filepath.Join(dir, "envoy.json")
	os.WriteFile(conf, []byte(`{"admin_address":"127.0.0.1:15000","drain_time_s":45,"drain_strategy":"immediate",
 "listeners":[{"name":"inbound","address":"0.0.0.0:15006","direction":"inbound","protocol":"http","upstream":"127.0.0.1:8080"}]}`), 0o644)
	dcmd := exec.Command(draind, "run", "--min-drain", minDrain.String(), "--tracker", *tracker, "--run-proxy-as", "1337",
		"--status-addr", "0.0.0.0:15020", "--log-format", "json", "--", envoysim, "-c", conf)
	dcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWNS}
	logs, _ := dcmd.StderrPipe()
	dcmd.Stdout = io.Discard
	if err := startIn(pod, dcmd); err != nil {
		return fmt.Errorf("start draind: %w", err)
	}
	defer dcmd.Process.Kill()
	exited := make(chan int, 1)
	go func() {
		printLog(logs, say)
		dcmd.Wait()
		exited <- dcmd.ProcessState.ExitCode()
	}()

	hc := &http.Client{Transport: &http.Transport{DialContext: nsrun.Dialer(client)}, Timeout: 30 * time.Second}
	probe := func() string {
		resp, err := hc.Get("http://" + podIP + ":15020/healthz/ready")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, trim(b))
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		if r := probe(); r[:3] == "200" {
			say("kubelet probe: GET /healthz/ready → %s", r)
			break
		}
		if time.Now().After(deadline) {
			return errors.New("draind did not become ready")
		}
		time.Sleep(50 * time.Millisecond)
	}

	type result struct {
		status string
		took   time.Duration
	}
	done := make(chan result, 1)
	reqStart := time.Now()
	go func() {
		resp, err := hc.Get(fmt.Sprintf("http://%s:15006/slow?ms=%d", podIP, reqDur.Milliseconds()))
		if err != nil {
			done <- result{err.Error(), time.Since(reqStart)}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		conn := "keep-alive"
		if resp.Close {
			conn = "close: Envoy is draining"
		}
		done <- result{fmt.Sprintf("%s (Connection: %s)", resp.Status, conn), time.Since(reqStart)}
	}()
	say("client: GET /slow (%s) through Envoy's inbound listener — in flight", *reqDur)
	time.Sleep(500 * time.Millisecond)

	sigAt := time.Now()
	say("kubelet: SIGTERM to both containers (draind and the app)")
	appCmd.Process.Signal(syscall.SIGTERM)
	dcmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(20 * time.Millisecond)
	say("kubelet probe: GET /healthz/ready → %s", probe())

	r := <-done
	say("client: %s after %.2fs", r.status, r.took.Seconds())
	hc.CloseIdleConnections()
	code := <-exited
	say("draind exited with code %d, %.2fs after SIGTERM", code, time.Since(sigAt).Seconds())
	fmt.Fprintf(out, "\nA fixed %s drain timer (pilot-agent's default) would have killed Envoy at %+.3fs,\n%.1fs before this request finished. draind waited for the app and Envoy's last flow, then stopped it.\n",
		"5s", sigAt.Add(5*time.Second).Sub(t0).Seconds(), (r.took - 5*time.Second - sigAt.Sub(reqStart)).Seconds())
	return nil
}

// printLog turns draind's JSON log into timeline lines.
func printLog(r io.Reader, say func(string, ...any)) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue // envoysim's own lines
		}
		switch m["msg"] {
		case "phase":
			extra := ""
			if f, ok := m["flows"].(map[string]any); ok {
				extra = fmt.Sprintf(" (app listeners %v, app flows holding %v, Envoy downstream %v)", f["app_listeners"], f["app_holding"], f["envoy_downstream"])
			}
			why := ""
			for _, k := range []string{"trigger", "why"} {
				if v, ok := m[k]; ok {
					why = fmt.Sprintf(" [%v]", v)
				}
			}
			say("draind: phase %v%s%s", m["phase"], why, extra)
		case "gate holds":
			say("draind: gate holds: %v", m["holds"])
		case "tracker", "app liveness":
			say("draind: %v: %v (%v)", m["msg"], first(m["mode"], m["source"]), m["reason"])
		default:
			if m["level"] == "warn" || m["level"] == "error" {
				say("draind: %v %v", m["level"], m["msg"])
			}
		}
	}
}

func first(a, b any) any {
	if a != nil {
		return a
	}
	return b
}

func trim(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return string(b)
}

// makeNamespaces creates the pod's and the client's namespaces, joined by
// a veth pair, lo up in both.
func makeNamespaces() (pod, client netns.NsHandle, err error) {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // this thread ends in a foreign namespace: never unlocked
		if pod, err = netns.New(); err != nil {
			errc <- err
			return
		}
		if client, err = netns.New(); err != nil {
			errc <- err
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return 0, 0, fmt.Errorf("create namespaces: %w", err)
	}
	hp, err := netlink.NewHandleAt(pod)
	if err != nil {
		return 0, 0, err
	}
	defer hp.Close()
	hc, err := netlink.NewHandleAt(client)
	if err != nil {
		return 0, 0, err
	}
	defer hc.Close()
	if err := hp.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1", PeerNamespace: netlink.NsFd(client)}); err != nil {
		return 0, 0, fmt.Errorf("veth: %w", err)
	}
	for _, s := range []struct {
		h          *netlink.Handle
		link, cidr string
	}{{hp, "eth0", podIP + "/24"}, {hc, "eth1", clientIP + "/24"}, {hp, "lo", ""}, {hc, "lo", ""}} {
		l, err := s.h.LinkByName(s.link)
		if err != nil {
			return 0, 0, err
		}
		if s.cidr != "" {
			a, _ := netlink.ParseAddr(s.cidr)
			if err := s.h.AddrAdd(l, a); err != nil {
				return 0, 0, err
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			return 0, 0, err
		}
	}
	return pod, client, nil
}

// startIn starts cmd from a thread inside ns, so the process is born there.
func startIn(ns netns.NsHandle, cmd *exec.Cmd) error { return nsrun.Do(ns, cmd.Start) }

// app is the pod's application: /slow?ms=N; on SIGTERM it stops
// accepting, finishes in-flight requests, and exits.
func app(args []string) int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	ln, err := net.Listen("tcp", "0.0.0.0:8080")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		fmt.Fprintln(w, "done")
	})}
	go srv.Serve(ln)
	fmt.Println("ready")
	<-sig
	srv.Shutdown(context.Background())
	return 0
}
