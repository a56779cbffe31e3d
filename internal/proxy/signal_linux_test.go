package proxy

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startSupervisor starts a shell standing in for pilot-agent: it starts a
// child in its own process group (as pilot-agent starts Envoy), prints the
// child's PID, and exits 0 on SIGTERM without passing it on.
func startSupervisor(t *testing.T, opts Options) (*Process, int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	opts.Stdout = w
	p, err := Start([]string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 30 & echo $!; wait"}, opts)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	child, cerr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || cerr != nil {
		t.Fatalf("child pid: %q %v %v", line, err, cerr)
	}
	t.Cleanup(func() { unix.Kill(child, syscall.SIGKILL); p.Signal(syscall.SIGKILL); <-p.Exited() })
	// Until the child has exec'd sleep it is a fork of the shell, whose
	// trap would swallow a SIGTERM that comes now.
	for end := time.Now().Add(5 * time.Second); ; {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(child) + "/comm")
		if strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the child never became sleep: %q", comm)
		}
		time.Sleep(time.Millisecond)
	}
	return p, child
}

func alive(pid int) bool {
	// A zombie still answers kill(0): read its state.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// Under SignalPIDOnly a SIGTERM reaches the supervisor alone: its child
// (Envoy under pilot-agent) lives on; without it the group gets it.
func TestSignalPIDOnly(t *testing.T) {
	p, child := startSupervisor(t, Options{SignalPIDOnly: true})
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("the supervisor did not exit on SIGTERM")
	}
	if code := p.ExitCode(); code != 0 || !alive(child) {
		t.Errorf("PID only: supervisor exit %d, child alive %v; want 0 and alive", code, alive(child))
	}

	p, child = startSupervisor(t, Options{})
	p.Signal(syscall.SIGTERM)
	<-p.Exited()
	for end := time.Now().Add(5 * time.Second); alive(child) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(child) + "/status")
		t.Errorf("group: the child survived the group's SIGTERM: %s", st)
	}

	// SIGKILL, the last step, goes to the whole group even PID-only.
	p, child = startSupervisor(t, Options{SignalPIDOnly: true})
	p.Signal(syscall.SIGKILL)
	<-p.Exited()
	for end := time.Now().Add(5 * time.Second); alive(child) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		t.Error("PID only: the child survived SIGKILL")
	}
}
