package sockdiag

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testenv/testutil"
)

// TestCaptureFixtures rewrites testdata/sockdiag/mixed.bin from a real dump
// when DRAIND_UPDATE_FIXTURES=1: listeners (v4, v6), established flows,
// CLOSE_WAIT, FIN_WAIT2 and TIME_WAIT sockets. The file holds the payloads
// exactly as the kernel sent them.
func TestCaptureFixtures(t *testing.T) {
	if os.Getenv("DRAIND_UPDATE_FIXTURES") == "" {
		t.Skip("set DRAIND_UPDATE_FIXTURES=1 to recapture the sock_diag fixtures")
	}
	ns := testutil.NewNetNS(t)
	l4 := ns.ListenAs(t, 0, "127.0.0.1:8080")
	l6 := ns.ListenAs(t, 1337, "[::1]:15006")
	ns.DialAs(t, 0, "127.0.0.1:8080")
	testutil.Accept(t, l4)
	ns.DialAs(t, 0, "[::1]:15006")
	testutil.AcceptAs(t, l6, 1337).Close()
	c := ns.DialAs(t, 0, "127.0.0.1:8080")
	s := testutil.Accept(t, l4)
	c.Close()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	time.Sleep(50 * time.Millisecond)

	h, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	d, err := Dial(h)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The raw payloads, exactly as the kernel sent them.
	var out []byte
	if err := d.dump(AllStates, func(m []byte) bool {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(m)))
		out = append(out, m...)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "sockdiag", "mixed.bin")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d bytes to %s", len(out), path)
}
