package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeGzip(t *testing.T, w io.Writer, s string) {
	t.Helper()
	zw := gzip.NewWriter(w)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPlanShares(t *testing.T) {
	for _, tc := range []struct {
		name            string
		bin, workspace  string
		wantHost        []string
		wantReadOnlyMod bool
	}{
		{"go test $WORK", "/tmp/go-build1/b001", "/work/main", []string{"/work/main", "/tmp/go-build1/b001", "/mods"}, true},
		{"binary inside the repo", "/work/main/bin", "/work/main", []string{"/work/main", "/mods"}, true},
		{"binary visible through the root", "/usr/bin", "/work/main", []string{"/work/main", "/mods"}, true},
		{"workspace is the root", "/tmp/x", "/", []string{"/tmp/x", "/mods"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shares := planShares(tc.bin, tc.workspace, "/mods", "/lib/modules/r")
			var hosts []string
			for i, s := range shares {
				hosts = append(hosts, s.HostPath)
				if s.Tag != "share"+string(rune('0'+i)) {
					t.Errorf("tag %q at %d", s.Tag, i)
				}
				if s.ReadOnly != (s.HostPath == "/mods") {
					t.Errorf("%s: read-only %v", s.HostPath, s.ReadOnly)
				}
			}
			if !reflect.DeepEqual(hosts, tc.wantHost) {
				t.Errorf("shares %q, want %q", hosts, tc.wantHost)
			}
			if last := shares[len(shares)-1]; last.GuestPath != "/lib/modules/r" {
				t.Errorf("modules mounted at %q", last.GuestPath)
			}
		})
	}
}

func TestGuestEnviron(t *testing.T) {
	env := guestEnviron([]string{"PATH=/bin", "FOO=bar", guestEnv + "=0"}, "6.1.0-50-amd64")
	want := []string{"PATH=/bin", "FOO=bar", "HOME=/root", guestEnv + "=1", kernelEnv + "=6.1.0-50-amd64"}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("env = %q, want %q", env, want)
	}
}

func TestParseDone(t *testing.T) {
	for _, tc := range []struct {
		line        string
		out, errOut int64
		status      string
		ok          bool
	}{
		{"done 12 0 exit 0\n", 12, 0, "exit 0", true},
		{"done 0 5 error mount share share0 on /x: no such device", 0, 5, "error mount share share0 on /x: no such device", true},
		{"done 1 2", 0, 0, "", false},
		{"exit 0", 0, 0, "", false},
		{"done x 2 exit 0", 0, 0, "", false},
	} {
		out, errOut, status, ok := parseDone(tc.line)
		if out != tc.out || errOut != tc.errOut || status != tc.status || ok != tc.ok {
			t.Errorf("parseDone(%q) = %d, %d, %q, %v", tc.line, out, errOut, status, ok)
		}
	}
}

func TestKernelProblems(t *testing.T) {
	var quiet strings.Builder
	for range 50 {
		quiet.WriteString("[    1.0] boot message\n")
	}
	if got := kernelProblems([]byte(quiet.String())); got != "" {
		t.Errorf("quiet console: %q", got)
	}
	oops := quiet.String() + "[    2.0] BUG: kernel NULL pointer dereference, address: 0000000000000000\n[    2.1] Call Trace:\n"
	got := kernelProblems([]byte(oops))
	if !strings.HasPrefix(got, "[    1.0] boot message\n") || !strings.Contains(got, "BUG: kernel NULL") || strings.Count(got, "\n") != 7 {
		t.Errorf("excerpt = %q", got)
	}
	if got := tailLines("a\nb\nc", 2); got != "b\nc\n" {
		t.Errorf("tailLines = %q", got)
	}
}

// TestVM boots real VMs. It is slow (about 10 s per kernel under TCG) and
// needs qemu and the kernels cached by tools/vmtest/vmtest.sh --fetch, so it runs
// only with DRAIND_VMTEST=1. DRAIND_VMTEST_KERNELS picks the kernels
// (default 6.1).
func TestVM(t *testing.T) {
	if os.Getenv("DRAIND_VMTEST") != "1" {
		t.Skip("boots VMs: set DRAIND_VMTEST=1 (after bash tools/vmtest/vmtest.sh --fetch)")
	}
	kernels := strings.Fields(os.Getenv("DRAIND_VMTEST_KERNELS"))
	if len(kernels) == 0 {
		kernels = []string{"6.1"}
	}
	dir := t.TempDir()
	runner := filepath.Join(dir, "vmexec")
	build := exec.Command("go", "build", "-o", runner, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build runner: %v\n%s", err, out)
	}
	checkDir, err := filepath.Abs("../vmcheck")
	if err != nil {
		t.Fatal(err)
	}
	checkBin := filepath.Join(dir, "bin", "vmcheck.test")
	if out, err := exec.Command("go", "test", "-c", "-o", checkBin, checkDir).CombinedOutput(); err != nil {
		t.Fatalf("build vmcheck: %v\n%s", err, out)
	}

	for _, k := range kernels {
		t.Run(k, func(t *testing.T) {
			var out bytes.Buffer
			cmd := exec.Command(runner, "--kernel", k, checkBin, "-test.v")
			cmd.Dir = checkDir
			cmd.Env = append(os.Environ(), "VMTEST_EXPECT_KERNEL="+k)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("vmcheck on %s: %v\n%s", k, err, out.String())
			}
			if !strings.Contains(out.String(), "--- PASS: TestSockDiagListenDump") {
				t.Errorf("output lacks the sock_diag test:\n%s", out.String())
			}

			out.Reset()
			cmd = exec.Command(runner, "--kernel", k, checkBin, "-test.run", "ForcedFailure")
			cmd.Dir = checkDir
			cmd.Env = append(os.Environ(), "VMTEST_FORCE_FAIL=1")
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
				t.Fatalf("forced failure: err %v, want exit status 1\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "failing on purpose") {
				t.Errorf("forced failure output:\n%s", out.String())
			}
		})
	}
}
