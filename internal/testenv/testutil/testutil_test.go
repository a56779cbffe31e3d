//go:build linux

package testutil

import (
	"net"
	"testing"
)

func TestNewNetNSIsolated(t *testing.T) {
	ns := NewNetNS(t)
	var ln net.Listener
	ns.Do(t, func() {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Errorf("listen in netns: %v", err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	defer ln.Close()
	// The host namespace cannot reach the listener: it lives in the test's.
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		// Only an error if the host happens not to listen on the same port.
		t.Logf("dial to %s in host ns succeeded (port in use on host?)", ln.Addr())
	}
	if ns.Inode == 0 {
		t.Fatal("namespace inode is 0")
	}
}
