package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/logevent"
)

// nginx runs the Debian package's nginx in the pod as the app, serving a
// file slowly (limit_rate) so a download is in flight when it is told to
// quit.
type nginx struct {
	c    *container
	size int
}

const nginxRate = 200 << 10 // bytes per second

func startNginx(t *testing.T, p *pod, size int) *nginx {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		for _, c := range []string{"/usr/sbin/nginx", "/sbin/nginx"} {
			if _, e := os.Stat(c); e == nil {
				bin, err = c, nil
			}
		}
	}
	if err != nil {
		t.Skip("nginx is not installed (apt-get install nginx)")
	}
	www := filepath.Join(p.dir, "www")
	os.MkdirAll(www, 0o755)
	if err := os.WriteFile(filepath.Join(www, "big"), bytes.Repeat([]byte("x"), size), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path %[1]s/tmp;
  proxy_temp_path %[1]s/tmp;
  fastcgi_temp_path %[1]s/tmp;
  uwsgi_temp_path %[1]s/tmp;
  scgi_temp_path %[1]s/tmp;
  server {
    listen 0.0.0.0:8080;
    root %[1]s/www;
    location / { limit_rate %[2]d; }
  }
}
`, p.dir, nginxRate)
	path := filepath.Join(p.dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// nginx is the app's container: its master is PID 1.
	var errb syncBuffer
	c := p.runContainer("nginx", -1, &errb, bin, "-c", path, "-e", filepath.Join(p.dir, "error.log"))
	// Ready when it answers.
	end := time.Now().Add(10 * time.Second)
	for {
		c, err := p.remote.Dialer()(t.Context(), "tcp4", podIP+":8080")
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(end) {
			t.Fatalf("nginx did not start: %v\n%s", err, errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &nginx{c: c, size: size}
}

// quit is `nginx -s quit`: SIGQUIT to the master, a graceful shutdown
// that closes the listener at once and lets workers finish downloads.
func (n *nginx) quit() { n.c.Signal(syscall.SIGQUIT) }

// download fetches /big from url's host; done receives bytes and the time.
type download struct {
	n   int64
	err error
	at  time.Time
}

// startDownload returns once the response's headers have arrived: the
// download is then in flight, not hoped to be.
func startDownload(p *pod, url string) chan download {
	done := make(chan download, 1)
	resp, err := p.client.Get(url)
	if err != nil {
		done <- download{err: err, at: time.Now()}
		return done
	}
	go func() {
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- download{n: n, err: err, at: time.Now()}
	}()
	return done
}

// 6. draind prestop with nginx as the app: after `nginx -s quit` the
// listener closes at once, yet prestop returns only after the download
// finished. The netstat loop, run the same way, returns while it runs.
func TestPrestopNginx(t *testing.T) {
	if _, err := exec.LookPath("netstat"); err != nil {
		t.Skip("netstat is not installed (apt-get install net-tools): it is the comparison")
	}
	p := newPod(t)
	ng := startNginx(t, p, 3*nginxRate) // ~3 s
	dl := startDownload(p, "http://"+podIP+":8080/big")
	quitAt := time.Now()
	ng.quit()

	type ret struct {
		name string
		at   time.Time
		out  string
		err  error
	}
	rets := make(chan ret, 2)
	// Each hook runs in a container of its own (a preStop hook runs in the
	// proxy's container: its own PID namespace, the pod's network).
	run := func(name string, role string, args ...string) {
		var out syncBuffer
		c := p.runContainer(name, -1, &out, role, args...)
		go func() {
			<-c.done
			var err error
			if c.code != 0 {
				err = fmt.Errorf("exit %d", c.code)
			}
			rets <- ret{name, time.Now(), out.String(), err}
		}()
	}
	run("draind prestop", "__draind", "prestop", "--timeout", "20s")
	// The hook people paste (docs/design.md, "Pod shapes"), shown for comparison.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	run("netstat loop", sh, "-c", `while [ $(netstat -plunt | grep tcp | grep -v envoy | wc -l) -ne 0 ]; do sleep 1; done`)

	d := <-dl
	if d.err != nil || d.n != int64(ng.size) {
		t.Fatalf("download: %d of %d bytes, %v", d.n, ng.size, d.err)
	}
	for range 2 {
		r := <-rets
		t.Logf("%s returned %s after nginx -s quit (download finished at +%s), err %v", r.name, r.at.Sub(quitAt), d.at.Sub(quitAt), r.err)
		switch r.name {
		case "draind prestop":
			if r.err != nil {
				t.Errorf("prestop: %v\n%s", r.err, r.out)
			}
			if r.at.Before(d.at.Add(-50 * time.Millisecond)) {
				t.Errorf("prestop returned at +%s, before the download finished at +%s\n%s", r.at.Sub(quitAt), d.at.Sub(quitAt), r.out)
			}
		case "netstat loop":
			if r.at.Before(d.at) {
				t.Logf("the netstat loop returned %s before the download finished: it would have let the proxy go", d.at.Sub(r.at))
			}
		}
	}
}

// Issue 7, 3: nginx as the app under draind run --app-exit wait: the gate
// holds until nginx's master exits, after the download, then stops Envoy.
func TestRunNginxAppExitWait(t *testing.T) {
	p := newPod(t)
	ng := startNginx(t, p, 2*nginxRate) // ~2 s
	p.startDraind([]string{"--min-drain", "200ms", "--app-exit", "wait"})
	dl := startDownload(p, "http://"+podIP+":15006/big") // through Envoy
	p.terminate()
	ng.quit()
	masterGone := make(chan time.Time, 1)
	go func() { <-ng.c.done; masterGone <- time.Now() }()
	d := <-dl
	p.client.CloseIdleConnections() // the client hangs up; an idle keep-alive would hold Envoy (see TestIdleKeepAlive)
	code, took := p.waitExit(20 * time.Second)
	exitAt := <-masterGone
	stopping := p.phaseTime("stopping")
	t.Logf("download done +%s (%d bytes); nginx master exited +%s; quitquitquit +%s (%s after the master); draind exit %d at +%s",
		d.at.Sub(p.drainedAt), d.n, exitAt.Sub(p.drainedAt), stopping.Sub(p.drainedAt), stopping.Sub(exitAt), code, took)
	if d.err != nil || d.n != int64(ng.size) {
		t.Errorf("download through envoy: %d of %d bytes, %v", d.n, ng.size, d.err)
	}
	// The master's exit as the test sees it (its container's wait) can come
	// well after the kernel's, which draind reads, on a loaded machine: the
	// download's end is the sharp bound.
	if code != 0 || stopping.Before(exitAt.Add(-time.Second)) || stopping.Before(d.at) {
		t.Errorf("exit %d; proxy stopped at +%s before nginx exited at +%s; log:\n%s", code, stopping.Sub(p.drainedAt), exitAt.Sub(p.drainedAt), p.draindLog.String())
	}
	if live := p.logLines(logevent.AppLiveness); len(live) == 0 || live[0]["source"] != "ebpf" {
		t.Logf("app liveness was not eBPF here:\n%s", p.draindLog.String())
	}
}
