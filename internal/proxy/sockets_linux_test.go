package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/testutil"
)

// holderRole is a proxy that accepts one connection on loopback and holds
// it, reading, printing "port INODE" (the accepted socket's inode) once
// it has it. As "holder-parent" it starts the holder as its own child
// instead, and relays its line: Envoy under pilot-agent.
func holderRole(role string) int {
	if role == "holder-parent" {
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = append(os.Environ(), roleEnv+"=holder")
		cmd.Stdout = os.Stdout
		if err := cmd.Run(); err != nil {
			fmt.Println("error", err)
		}
		return 0
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("listening %d\n", ln.Addr().(*net.TCPAddr).Port)
	c, err := ln.Accept()
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var st syscall.Stat_t
	f, _ := c.(*net.TCPConn).File()
	syscall.Fstat(int(f.Fd()), &st)
	f.Close()
	fmt.Printf("inode %d\n", st.Ino)
	// Read until the peer closes: ShutdownSockets ends this read. Closed
	// before the line, so a second ShutdownSockets finds it gone.
	io.Copy(io.Discard, c)
	c.Close()
	fmt.Println("peer closed")
	return 0
}

// TestShutdownSockets: draind shuts a socket its proxy holds, and one its
// proxy's child holds (pilot-agent's Envoy): the client reads EOF, and
// the proxy reads its end closed without the client closing its own. A
// socket already gone is no error.
func TestShutdownSockets(t *testing.T) {
	if !testutil.KernelAtLeast(t, 5, 6) {
		t.Skip("pidfd_getfd needs Linux 5.6")
	}
	for _, role := range []string{"holder", "holder-parent"} {
		t.Run(role, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			env := append(os.Environ(), roleEnv+"="+role)
			p, err := Start([]string{"/proc/self/exe"}, Options{Stdout: w, Env: env})
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Signal(syscall.SIGKILL); <-p.Exited() })
			lines := bufio.NewScanner(r)
			next := func(prefix string) string {
				t.Helper()
				if !lines.Scan() {
					t.Fatalf("the proxy said nothing more (want %q)", prefix)
				}
				v, ok := strings.CutPrefix(lines.Text(), prefix+" ")
				if !ok {
					t.Fatalf("the proxy said %q, want %q", lines.Text(), prefix)
				}
				return v
			}
			c, err := net.Dial("tcp", "127.0.0.1:"+next("listening"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ino, _ := strconv.ParseUint(next("inode"), 10, 32)
			n, err := p.ShutdownSockets(map[uint32]bool{uint32(ino): true, 1: true})
			if err != nil || n != 1 {
				t.Fatalf("ShutdownSockets: %d, %v; want 1", n, err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("the client read %v, want EOF", err)
			}
			next("peer")
			if n, err := p.ShutdownSockets(map[uint32]bool{uint32(ino): true}); err != nil || n != 0 {
				t.Errorf("a socket gone: %d, %v; want 0, nil", n, err)
			}
		})
	}
}

func TestSocketInode(t *testing.T) {
	for link, want := range map[string]int64{
		"socket:[12345]": 12345, "socket:[4294967295]": 4294967295, "pipe:[12]": -1,
		"socket:[]": -1, "socket:[12": -1, "/dev/null": -1, "socket:[4294967296]": -1,
	} {
		got, ok := socketInode(link)
		if !ok && want != -1 || ok && int64(got) != want {
			t.Errorf("socketInode(%q) = %d, %v; want %d", link, got, ok, want)
		}
	}
}

// shutterRole is draind without ptrace access to its proxy: as root it
// starts the holder as uid 1337, becomes uid 1000 itself (which clears
// every capability), connects, and prints what ShutdownSockets said.
func shutterRole() int {
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	env := []string{roleEnv + "=holder"} // the first of two wins: replace draind's role
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, roleEnv+"=") {
			env = append(env, kv)
		}
	}
	p, err := Start([]string{os.Getenv("PROXY_TEST_BIN")}, Options{Stdout: w, Env: env, Credential: &syscall.Credential{Uid: 1337, Gid: 1337}})
	w.Close()
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	defer func() { p.Signal(syscall.SIGKILL); <-p.Exited() }()
	lines := bufio.NewScanner(r)
	lines.Scan()
	port, _ := strings.CutPrefix(lines.Text(), "listening ")
	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	defer c.Close()
	lines.Scan()
	ino, _ := strconv.ParseUint(strings.TrimPrefix(lines.Text(), "inode "), 10, 32)
	if err := syscall.Setresuid(1000, 1000, 1000); err != nil {
		fmt.Println("error", err)
		return 0
	}
	n, err := p.ShutdownSockets(map[uint32]bool{uint32(ino): true})
	fmt.Printf("shut %d, no access %v: %v\n", n, errors.Is(err, ErrNoAccess), err)
	return 0
}

// TestShutdownSocketsNoAccess: a draind that may not ptrace its proxy
// (another uid, no capability) shuts nothing and says why (ErrNoAccess).
func TestShutdownSocketsNoAccess(t *testing.T) {
	testutil.RequireRoot(t)
	if !testutil.KernelAtLeast(t, 5, 6) {
		t.Skip("pidfd_getfd needs Linux 5.6")
	}
	dir, bin := selfCopy(t) // the holder runs as 1337
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), roleEnv+"=shutter", "PROXY_TEST_BIN="+bin)
	out, err := cmd.CombinedOutput()
	if got := strings.TrimSpace(string(out)); err != nil || !strings.HasPrefix(got, "shut 0, no access true:") {
		t.Fatalf("%v: %s; want shut 0, no access true", err, got)
	}
	t.Log(strings.TrimSpace(string(out)))
}
