package vmcheck

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inVM skips the test unless it runs inside a VM started by vmexec.
func inVM(t *testing.T) {
	t.Helper()
	if os.Getenv("DRAIND_VM_GUEST") != "1" {
		t.Skip("not in a vmexec VM (run: bash tools/vmtest/vmtest.sh ./tools/vmtest/vmcheck)")
	}
}

func TestForcedFailure(t *testing.T) {
	inVM(t)
	if os.Getenv("VMTEST_FORCE_FAIL") == "1" {
		t.Fatal("VMTEST_FORCE_FAIL=1: failing on purpose to prove failure propagation")
	}
}

func TestKernel(t *testing.T) {
	inVM(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	t.Logf("uname -r: %s", release)
	if want := os.Getenv("DRAIND_VM_KERNEL_RELEASE"); release != want {
		t.Errorf("uname -r = %q, runner booted %q", release, want)
	}
	if want := os.Getenv("VMTEST_EXPECT_KERNEL"); want != "" && !strings.HasPrefix(release, want+".") {
		t.Errorf("uname -r = %q, want a %s kernel", release, want)
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Errorf("no kernel BTF: %v", err)
	}
}

// TestArch: the guest runs the test binary's architecture natively (an arm64
// binary on an arm64 kernel, not through some binfmt emulator).
func TestArch(t *testing.T) {
	inVM(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	machine := unix.ByteSliceToString(uts.Machine[:])
	want := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[runtime.GOARCH]
	t.Logf("uname -m: %s, GOARCH %s", machine, runtime.GOARCH)
	if machine != want {
		t.Errorf("uname -m = %q, want %q for GOARCH %s", machine, want, runtime.GOARCH)
	}
}

// TestCgroupV2Only: booted with cgroup_no_v1=all (vmexec --cgroup2,
// tools/vmtest/vmtest.sh --cgroup2), a v1 hierarchy cannot be mounted and
// the unified one offers cpu, memory and pids.
func TestCgroupV2Only(t *testing.T) {
	inVM(t)
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	v2only := strings.Contains(string(cmdline), "cgroup_no_v1=all")
	// tools/vmtest/vmtest.sh says what it asked for (1: --cgroup2).
	if expect, ok := os.LookupEnv("VMTEST_EXPECT_CGROUP2"); ok && v2only != (expect == "1") {
		t.Fatalf("kernel command line %q, runner asked for cgroup v2 only: %s", cmdline, expect)
	}
	if !v2only {
		t.Skip("booted with cgroup v1 controllers available (no --cgroup2)")
	}
	dir := t.TempDir()
	if err := unix.Mount("cgroup", dir, "cgroup", 0, "memory"); err == nil {
		unix.Unmount(dir, 0)
		t.Error("mounted a v1 memory hierarchy under cgroup_no_v1=all")
	}
	controllers, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup2 controllers: %s", strings.TrimSpace(string(controllers)))
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !strings.Contains(" "+string(controllers)+" ", " "+c+" ") {
			t.Errorf("controller %s missing from the unified hierarchy: %q", c, controllers)
		}
	}
}

func TestMounts(t *testing.T) {
	inVM(t)
	for _, m := range []struct {
		path  string
		magic int64
	}{
		{"/proc", unix.PROC_SUPER_MAGIC},
		{"/sys", unix.SYSFS_MAGIC},
		{"/sys/fs/bpf", unix.BPF_FS_MAGIC},
		{"/sys/fs/cgroup", unix.CGROUP2_SUPER_MAGIC},
		{"/tmp", unix.TMPFS_MAGIC},
	} {
		var st unix.Statfs_t
		if err := unix.Statfs(m.path, &st); err != nil {
			t.Errorf("statfs %s: %v", m.path, err)
			continue
		}
		if int64(st.Type) != m.magic {
			t.Errorf("%s: filesystem magic %#x, want %#x", m.path, st.Type, m.magic)
		}
	}
	// The root is writable (an overlay) without touching the host.
	if err := os.WriteFile("/etc/draind-vmcheck", []byte("x"), 0o644); err != nil {
		t.Errorf("root overlay is not writable: %v", err)
	}
}

func TestRoot(t *testing.T) {
	inVM(t)
	if os.Geteuid() != 0 {
		t.Fatalf("euid %d, want 0", os.Geteuid())
	}
}

func TestTestdataRelativeToCwd(t *testing.T) {
	inVM(t)
	b, err := os.ReadFile("testdata/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "hello from the host" {
		t.Fatalf("testdata/hello.txt = %q", got)
	}
}

func TestHostPrograms(t *testing.T) {
	inVM(t)
	out, err := exec.Command("/usr/bin/env").CombinedOutput()
	if err != nil {
		t.Fatalf("/usr/bin/env: %v", err)
	}
	if !strings.Contains(string(out), "DRAIND_VM_GUEST=1") {
		t.Errorf("env output lacks DRAIND_VM_GUEST=1")
	}
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		t.Log("nginx not installed on the host; skipped")
		return
	}
	out, err = exec.Command(nginx, "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -v: %v: %s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

func TestSockDiagListenDump(t *testing.T) {
	inVM(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	ports, err := listeningPorts()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p == port {
			return
		}
	}
	t.Fatalf("sock_diag LISTEN dump %v lacks our port %d", ports, port)
}

// listeningPorts dumps IPv4 TCP sockets in LISTEN with NETLINK_SOCK_DIAG
// (inet_diag_req_v2) and returns their local ports.
func listeningPorts() ([]uint16, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)

	const (
		hdrLen    = unix.SizeofNlMsghdr
		reqLen    = 56 // struct inet_diag_req_v2
		tcpListen = 10
	)
	msg := make([]byte, hdrLen+reqLen)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(msg[8:12], 1) // sequence
	req := msg[hdrLen:]
	req[0] = unix.AF_INET
	req[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:8], 1<<tcpListen)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}

	var ports []uint16
	buf := make([]byte, 64*1024)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return ports, nil
			case unix.NLMSG_ERROR:
				code := int32(binary.NativeEndian.Uint32(m.Data[0:4]))
				return nil, errors.New("sock_diag: " + unix.Errno(-code).Error())
			}
			// struct inet_diag_msg: family, state, timer, retrans, then
			// inet_diag_sockid whose first field is the big-endian sport.
			if len(m.Data) >= 6 {
				ports = append(ports, binary.BigEndian.Uint16(m.Data[4:6]))
			}
		}
	}
}

// Orphans are reparented to the VM's init, which must reap them as a host's
// init does: zombies would linger in /proc and in BPF task iterators.
func TestOrphansReaped(t *testing.T) {
	inVM(t)
	if out, err := exec.Command("/bin/sh", "-c", "sleep 0.2 & echo $!").Output(); err != nil {
		t.Fatalf("start orphan: %v", err)
	} else {
		pid := strings.TrimSpace(string(out))
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := os.Stat("/proc/" + pid)
			if errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				stat, _ := os.ReadFile("/proc/" + pid + "/stat")
				t.Fatalf("orphan %s not reaped: %s", pid, stat)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
