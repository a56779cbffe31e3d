package conntrack

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/draind/draind/internal/testutil"
)

// TestCaptureFixtures rewrites testdata/sockdiag/mixed.bin from a real dump
// when DRAIND_UPDATE_FIXTURES=1: listeners (v4, v6), established flows,
// CLOSE_WAIT, FIN_WAIT2 and TIME_WAIT sockets.
func TestCaptureFixtures(t *testing.T) {
	if os.Getenv("DRAIND_UPDATE_FIXTURES") == "" {
		t.Skip("set DRAIND_UPDATE_FIXTURES=1 to recapture the sock_diag fixtures")
	}
	ns := testutil.NewNetNS(t)
	l4 := listenAs(t, ns, 0, "127.0.0.1:8080")
	l6 := listenAs(t, ns, 1337, "[::1]:15006")
	dialAs(t, ns, 0, "127.0.0.1:8080")
	accepted(t, l4)
	dialAs(t, ns, 0, "[::1]:15006")
	acceptedAs(t, l6, 1337).Close()
	c := dialAs(t, ns, 0, "127.0.0.1:8080")
	s := accepted(t, l4)
	c.Close()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	time.Sleep(50 * time.Millisecond)

	d := dialDiag(t, ns)
	var out []byte
	dumpTap = func(m []byte) {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(m)))
		out = append(out, m...)
	}
	defer func() { dumpTap = nil }()
	if _, err := d.Sockets(AllStates); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "sockdiag", "mixed.bin")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d bytes to %s", len(out), path)
}
