package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/draind/draind/e2e/kubelet/internal/fcap"
)

// setfcap installs the file with its capabilities as the kernel reads them.
func TestInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting security.capability needs root (CAP_SETFCAP)")
	}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "bin", "draind")
	if err := os.WriteFile(src, []byte("#!binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CAPS_UNDER_TEST", "cap_bpf,cap_perfmon+ep")
	if err := run([]string{"--caps-env", "CAPS_UNDER_TEST", src, dst}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(dst, fcap.XattrName, buf)
	if err != nil {
		t.Fatal(err)
	}
	set, err := fcap.Decode(buf[:n])
	if err != nil || set.String() != "cap_perfmon,cap_bpf+ep" {
		t.Errorf("installed caps %v %v", set, err)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v", st.Mode())
	}
	if err := run([]string{"--caps-env", "NOT_SET_ANYWHERE", src, dst}); err == nil {
		t.Error("unset --caps-env variable: no error")
	}
}
