package cli

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testutil"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "__draind" {
		os.Exit(Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	testutil.RemoveSelfCopy()
	os.Exit(code)
}

// TestWatchUnprivilegedFallsBack runs `draind watch` inside a namespace as
// uid 1000 without CAP_BPF, CAP_PERFMON or CAP_SYS_ADMIN, as a plain pod
// container would: it must say, in one line, that it polls and why, and
// still report changes.
func TestWatchUnprivilegedFallsBack(t *testing.T) {
	ns := testutil.NewNetNS(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	cmd := exec.Command(setpriv, "--reuid", "1000", "--regid", "1000", "--clear-groups", "--inh-caps=-all",
		"--bounding-set=-bpf,-perfmon,-sys_admin", testutil.SelfCopy(t), "__draind", "watch", "--poll-period", "50ms")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	ns.Do(t, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	first := <-lines
	if !strings.Contains(first, "sockdiag mode") || !strings.Contains(first, "no CAP_BPF") || !strings.Contains(first, "polling") {
		t.Fatalf("first line %q: want the sockdiag fallback and its reason", first)
	}
	<-lines // the summary
	var ln net.Listener
	ns.Do(t, func() { ln, err = net.Listen("tcp4", "127.0.0.1:7777") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, "app processes") {
				continue // the process view, not visible here without privileges
			}
			if !strings.Contains(l, "LISTEN") || !strings.Contains(l, "127.0.0.1:7777") {
				t.Fatalf("change line %q", l)
			}
			return
		case <-timeout:
			t.Fatal("no change reported")
		}
	}
}
