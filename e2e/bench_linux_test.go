package e2e

import (
	"io"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// BenchmarkExitLatency measures, over b.N drains per mode, the time from
// the last downstream flow's close to draind sending /quitquitquit (DESIGN
// target: p99 ≤ 20 ms with eBPF, ≤ one poll period + 5 ms with sock_diag;
// pilot-agent polls once a second). Each drain: a pod with an app that
// exits on SIGTERM and one client connection through Envoy, closed by the
// client after min-drain. Run: tools/bench/exit.sh.
func BenchmarkExitLatency(b *testing.B) {
	for _, mode := range []string{"ebpf", "sockdiag"} {
		b.Run(mode, func(b *testing.B) {
			var lat []time.Duration
			p := newPod(b)
			for b.Loop() {
				lat = append(lat, oneDrain(b, p, mode))
			}
			slices.Sort(lat)
			q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))]) / float64(time.Millisecond) }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Millisecond), "max-ms")
		})
	}
}

func oneDrain(b *testing.B, p *pod, mode string) time.Duration {
	b.Helper()
	p.app = nil
	args := []string{"--min-drain", "100ms", "--tracker", mode, "--app-procs", "off", "--app-exit", "flows"}
	if mode == "ebpf" {
		args[3] = "ebpf"
	}
	p.startDraind(args)
	conn, err := p.remote.Dialer()(b.Context(), "tcp4", podIP+":15006")
	if err != nil {
		b.Fatal(err)
	}
	// Half a request: Envoy owes it a response, so the flow is busy to the
	// end (an idle one would be parked, there being no app, and stop
	// holding before it closes: docs/design.md, "Parked, once the app is
	// gone").
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\n"); err != nil {
		b.Fatal(err)
	}
	p.terminate()
	time.Sleep(300 * time.Millisecond) // past min-drain: the gate waits on this flow alone
	closedAt := time.Now()
	conn.Close()
	code, _ := p.waitExit(10 * time.Second)
	if code != 0 {
		b.Fatalf("exit %d:\n%s", code, p.draindLog.String())
	}
	for _, l := range p.logLines(logevent.Phase) {
		if l["phase"] == "stopping" {
			ns, _ := l["quit_sent_unix_ns"].(float64)
			if p.phaseTime("gating").IsZero() {
				b.Fatalf("no gating phase:\n%s", p.draindLog.String())
			}
			return time.Unix(0, int64(ns)).Sub(closedAt)
		}
	}
	b.Fatalf("no stopping line:\n%s", p.draindLog.String())
	return 0
}

// BenchmarkPodShapes measures, over b.N pods each, the moments issue 12
// names: for a native sidecar, from the preStop hook (`draind drain`) to
// readiness 503 and to drain_listeners, and from the sidecar's SIGTERM to
// /quitquitquit; for a Job (--exit-with-app), from the app's exit to
// /quitquitquit. Run: go test -run '^$' -bench PodShapes -benchtime 20x ./e2e
func BenchmarkPodShapes(b *testing.B) {
	quantiles := func(b *testing.B, name string, d []time.Duration) {
		slices.Sort(d)
		q := func(f float64) float64 { return float64(d[int(f*float64(len(d)-1))]) / float64(time.Millisecond) }
		b.ReportMetric(q(0.5), name+"-p50-ms")
		b.ReportMetric(q(0.99), name+"-p99-ms")
	}
	b.Run("native", func(b *testing.B) {
		var to503, toDrain, toQuit []time.Duration
		for b.Loop() {
			p := newPod(b)
			p.startApp("--on-term", "exit")
			p.startDraind([]string{"--min-drain", "100ms", "--app-procs", "ebpf"})
			hook := time.Now()
			p.app.Signal(syscall.SIGTERM)
			if code, out := p.nativeHook(); code != 0 {
				b.Fatalf("draind drain: %d %s", code, out)
			}
			for p.readyStatus() != 503 {
				time.Sleep(time.Millisecond)
			}
			to503 = append(to503, time.Since(hook))
			sent := p.waitLog(5*time.Second, logevent.DrainListenersSent, nil)
			ts, _ := time.Parse("2006-01-02T15:04:05.000Z0700", sent["ts"].(string))
			toDrain = append(toDrain, ts.Sub(hook))
			p.app.wait(10 * time.Second)
			p.drainedAt = time.Now()
			p.draind.Signal(syscall.SIGTERM)
			if code, _ := p.waitExit(10 * time.Second); code != 0 {
				b.Fatalf("exit %d:\n%s", code, p.draindLog.String())
			}
			toQuit = append(toQuit, p.phaseTime("stopping").Sub(p.drainedAt))
		}
		quantiles(b, "hook-to-503", to503)
		quantiles(b, "hook-to-drain_listeners", toDrain)
		quantiles(b, "sigterm-to-quit", toQuit)
	})
	b.Run("job", func(b *testing.B) {
		var toQuit []time.Duration
		for b.Loop() {
			p := newPod(b)
			p.startApp("--run-for", "500ms", "--exit-code", "0")
			p.startDraind([]string{"--exit-with-app", "success", "--app-procs", "ebpf"})
			p.app.wait(10 * time.Second)
			if code, _ := p.waitExit(10 * time.Second); code != 0 {
				b.Fatalf("exit %d:\n%s", code, p.draindLog.String())
			}
			_, _, _, appExit := p.appCalls()
			toQuit = append(toQuit, p.phaseTime("stopping").Sub(appExit))
		}
		quantiles(b, "app-exit-to-quit", toQuit)
	})
}
