package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testenv/testutil"
)

// sockDiagFDs lists this process's NETLINK_SOCK_DIAG sockets.
func sockDiagFDs(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dom, derr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		proto, perr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
		if derr == nil && perr == nil && dom == unix.AF_NETLINK && proto == unix.NETLINK_SOCK_DIAG {
			fds = append(fds, fd)
		}
	}
	return fds
}

// A tracker whose poll fails ends prestop at once with the tracker's error
// and an error in the log, not at --timeout on the counts it had: its
// sock_diag socket is replaced under it by /dev/null (dup2), so the next
// poll's request fails with ENOTSOCK, while an app flow holds the drain.
func TestPrestopTrackerFailureEndsIt(t *testing.T) {
	ns := testutil.NewNetNS(t)
	ln := ns.ListenAs(t, 0, "127.0.0.1:8080")
	ns.DialAs(t, 0, "127.0.0.1:8080")
	defer testutil.Accept(t, ln).Close()

	nsh, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	before := sockDiagFDs(t)
	core, logs := observer.New(zap.InfoLevel)
	const timeout = 20 * time.Second
	type outcome struct {
		clean bool
		err   error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Prestop(context.Background(), nsh, PrestopConfig{
			Tracker: flows.TrackerConfig{Mode: flows.ModeSockDiag, Policy: flows.Policy{ProxyUID: flows.DefaultProxyUID}, Logger: zap.New(core)},
			Timeout: timeout,
			Logger:  zap.New(core),
		})
		done <- outcome{res.Clean, err}
	}()
	testutil.Eventually(t, "prestop holding on the app's flow", func() error {
		if logs.FilterField(logevent.GateHolds.Field()).Len() == 0 {
			return errors.New("no gate holds yet")
		}
		return nil
	})
	devNull, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(devNull)
	var broken int
	for _, fd := range sockDiagFDs(t) {
		if !slices.Contains(before, fd) {
			if err := unix.Dup3(devNull, fd, unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			broken++
		}
	}
	if broken == 0 {
		t.Fatal("found no sock_diag socket of prestop's tracker")
	}
	var got outcome
	select {
	case got = <-done:
	case <-time.After(2 * timeout):
		t.Fatal("prestop did not return")
	}
	if got.err == nil || !strings.Contains(got.err.Error(), "tracker") {
		t.Errorf("prestop returned %v (clean %v), want the tracker's error", got.err, got.clean)
	}
	if n := logs.FilterLevelExact(zap.ErrorLevel).Len(); n == 0 {
		t.Errorf("no error logged; log:\n%s", fmt.Sprint(logs.AllUntimed()))
	}
}
