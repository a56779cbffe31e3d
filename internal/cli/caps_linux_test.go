package cli

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/privs"
	"github.com/draind/draind/internal/testenv/testutil"
)

// conns on a thread whose permitted set holds a capability its effective
// set lacks (what `+p` file capabilities leave after execve): the raise
// makes it effective where the binary can change every thread's sets;
// where it cannot (a cgo build, as `go test` builds this one unless
// CGO_ENABLED=0) conns says so on stderr instead of nothing.
func TestConnsReportsCapsRaise(t *testing.T) {
	testutil.RequireRoot(t)
	type outcome struct {
		stderr string
		err    error
		after  privs.Sets
		setup  error
	}
	done := make(chan outcome, 1)
	go func() {
		// The thread stays locked: it ends with the goroutine, its
		// lowered effective set with it.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- outcome{setup: err}
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_RAW
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- outcome{setup: err}
			return
		}
		var out, errb bytes.Buffer
		err := Run(context.Background(), []string{"conns"}, &out, &errb)
		after, _ := privs.Current()
		done <- outcome{stderr: errb.String(), err: err, after: after}
	}()
	got := <-done
	if got.setup != nil {
		t.Fatalf("lower the effective set: %v", got.setup)
	}
	if got.err != nil {
		t.Fatalf("conns: %v (%s)", got.err, got.stderr)
	}
	t.Logf("stderr: %q", got.stderr)
	if privs.Supported() == nil {
		if !got.after.Effective.Has(privs.Cap(unix.CAP_NET_RAW)) || got.stderr != "" {
			t.Errorf("static build: effective %s after the raise, stderr %q; want NET_RAW raised, silently", got.after.Effective, got.stderr)
		}
		return
	}
	if !strings.Contains(got.stderr, "draind conns: capabilities:") || !strings.Contains(got.stderr, "CGO_ENABLED=0") {
		t.Errorf("cgo build, raise refused: stderr %q; want a line saying so", got.stderr)
	}
}
