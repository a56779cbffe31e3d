package fcap

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []byte
	}{
		// setcap cap_bpf,cap_perfmon+ep: magic 0x02000001, data[1].permitted 0xc0.
		{"cap_bpf,cap_perfmon+ep", []byte{1, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0}},
		{"cap_perfmon,cap_bpf+p", []byte{0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0}},
		{"cap_net_admin+ep", []byte{1, 0, 0, 2, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
	} {
		s, err := Parse(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Encode(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: % x, want % x", tc.in, got, tc.want)
		}
		back, err := Decode(tc.want)
		if err != nil || !slices.Equal(back.Permitted, s.Permitted) || back.Effective != s.Effective {
			t.Errorf("%s: decoded %+v %v", tc.in, back, err)
		}
	}
	for _, bad := range []string{"cap_bpf", "cap_bpf+i", "cap_nope+ep"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

// The kernel and libcap's getcap agree with our encoding.
func TestAgainstGetcap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting security.capability needs root (CAP_SETFCAP)")
	}
	getcap, err := exec.LookPath("getcap")
	if err != nil {
		t.Skip("getcap not installed (Debian: libcap2-bin)")
	}
	f := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(f, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, _ := Parse("cap_bpf,cap_perfmon+ep")
	if err := unix.Setxattr(f, XattrName, s.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(getcap, f).CombinedOutput()
	if err != nil {
		t.Fatalf("getcap: %v %s", err, out)
	}
	if !strings.Contains(string(out), "cap_perfmon,cap_bpf=ep") {
		t.Errorf("getcap: %s", out)
	}
}
