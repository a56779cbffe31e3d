package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/istio"
)

// The pod's hooks: postStart (wait), preStop (prestop, drain).

// loopbackURL is http://<loopback>:<port><path> for a status address: the
// endpoints that change the drain answer loopback callers only.
func loopbackURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

func runWait(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("wait", "wait [--url URL] [--timeout D] [--period D]", stdout)
	url := fs.String("url", defaultWaitURL(), "readiness URL to poll")
	var timeout, period time.Duration
	fs.durationVar(&timeout, "timeout", 60*time.Second, "give up after this long (exit 1)")
	fs.durationVar(&period, "period", 500*time.Millisecond, "poll period")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if period <= 0 || timeout <= 0 {
		return usageErr("wait: --period and --timeout must be positive")
	}
	if err := agent.WaitReady(ctx, *url, period, timeout); err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	return nil
}

// defaultWaitURL is draind's readiness where a draind that nothing moved
// listens (istio.StatusAddrOf with no setting). It follows neither
// DRAIND_STATUS_ADDR nor Istio's settings: a postStart hook names its
// --url.
func defaultWaitURL() string {
	_, port, _ := net.SplitHostPort(istio.StatusAddrOf(istio.StatusInput{}).Addr)
	return "http://" + net.JoinHostPort("localhost", port) + "/healthz/ready"
}

func runPrestop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prestop", "prestop [--timeout D] [--app-ports P,...] [--wait-listeners] [--idle-timeout D]", stdout)
	var nf nsFlags
	nf.register(fs, true)
	var timeout time.Duration
	fs.durationVar(&timeout, "timeout", 25*time.Second, "return (exit 0) after this long even with flows open")
	appPorts := portList{}
	fs.Var(&appPorts, "app-ports", "with --wait-listeners: the app ports whose listeners must close")
	waitListeners := fs.Bool("wait-listeners", false, "also wait for the app's listeners to close")
	tracker := trackerFlag(fs)
	logFormat := logFormatFlag(fs)
	if err := nf.parse(fs, args); err != nil {
		return helped(err)
	}
	if timeout <= 0 {
		return usageErr("prestop: --timeout must be positive")
	}
	log, err := newLogger(logFormat.val, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	nf.caps.log(log)
	ns, err := nf.open()
	if err != nil {
		return err
	}
	defer ns.Close()
	// The kubelet kills a hook at the grace period; a signal ends us too.
	ctx, stop := untilSignal(ctx)
	defer stop()
	_, err = agent.Prestop(ctx, ns, agent.PrestopConfig{
		Tracker:       flows.TrackerConfig{Mode: tracker.val, Policy: nf.policy(), Logger: log},
		Timeout:       timeout,
		WaitListeners: *waitListeners,
		AppPorts:      appPorts,
		Logger:        log,
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("prestop: %w", err)
	}
	return nil
}

// runDrain is `draind drain`, a native sidecar's preStop hook: it asks the
// `draind run` of its container to start draining (POST /drain on the
// status server, over loopback) and returns at once. It does not wait: the
// kubelet SIGTERMs the sidecar only after the app has exited, and draind
// run finishes the drain then.
func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("drain", "drain [--status-addr HOST:PORT] [--timeout D]", stdout)
	addr := fs.String("status-addr", istio.DefaultStatusAddr, "draind run's status server (the same setting as run's: "+istio.StatusAddrEnv+")")
	var timeout time.Duration
	fs.durationVar(&timeout, "timeout", 2*time.Second, "give up after this long (exit 1)")
	if err := fs.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("drain: unexpected argument %q", fs.Arg(0))
	}
	// In a container Istio injected, draind run -- pilot-agent left
	// pilot-agent its status port and took another: ask that one.
	in := istio.StatusInput{PilotAgent: istio.Injected(os.LookupEnv)}
	if fs.isSet("status-addr") {
		in.Given, in.GivenBy = *addr, fs.sourceOf("status-addr")
	}
	if in.NeedsSettings() {
		var err error
		if in.Settings, err = istio.Read(os.LookupEnv, istio.PodAnnotations); err != nil {
			return usageErr("drain: %v", err)
		}
	}
	*addr = istio.StatusAddrOf(in).Addr
	url, err := loopbackURL(*addr, "/drain?cause=prestop")
	if err != nil {
		return usageErr("drain: --status-addr %q: %v", *addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("drain: no draind run answers at %s: %w", url, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("drain: %s answered %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "draining: %s\n", strings.TrimSpace(string(body)))
	return nil
}
