package proxy

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/draind/draind/internal/privs"
)

// The capability tests start a copy of the test binary as draind (the
// changes it makes are irreversible), which starts the test binary again
// as its proxy; the proxy prints its sets.

const roleEnv = "PROXY_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "draind":
		os.Exit(draindRole())
	case "holder", "holder-parent":
		os.Exit(holderRole(os.Getenv(roleEnv)))
	case "shutter":
		os.Exit(shutterRole())
	case "proxy":
		s, err := privs.Current()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Printf("sets %s %s %s %s %s\n", s.Effective.Hex(), s.Permitted.Hex(), s.Inheritable.Hex(), s.Ambient.Hex(), s.Bounding.Hex())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// draindRole does what agent.Run does before the proxy starts, then starts
// it with PROXY_TEST_CAPS (and as PROXY_TEST_UID) and relays its line.
func draindRole() int {
	caps, err := privs.ParseSet(os.Getenv("PROXY_TEST_CAPS"))
	if err == nil {
		_, err = privs.LimitInherited(caps)
	}
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	// The proxy's role replaces draind's (a duplicate would keep the
	// first: the proxy would start a proxy...).
	env := []string{roleEnv + "=proxy"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, roleEnv+"=") {
			env = append(env, kv)
		}
	}
	opts := Options{Stdout: w, Caps: caps, Env: env}
	if uid := os.Getenv("PROXY_TEST_UID"); uid != "" {
		n, _ := strconv.Atoi(uid)
		opts.Credential = &syscall.Credential{Uid: uint32(n), Gid: uint32(n)}
	}
	p, err := Start([]string{"/proc/self/exe"}, opts)
	w.Close()
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	<-p.Exited()
	fmt.Print(line)
	return 0
}

func TestProxyGetsOnlyItsCaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: draind here holds every capability and starts the proxy as 1337")
	}
	if err := privs.Supported(); err != nil {
		t.Skipf("this test binary links cgo (-race does): %v", err)
	}
	dir, bin := selfCopy(t) // the proxy runs as 1337
	na := privs.SetOf(privs.CapNetAdmin).Hex()
	for _, tc := range []struct {
		caps, uid string
		// effective permitted inheritable ambient bounding
		want string
	}{
		{"", "", "sets 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000"},
		{"", "1337", "sets 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000"},
		{"NET_ADMIN", "", fmt.Sprintf("sets %s %s %s %s %s", na, na, na, na, na)},
		{"NET_ADMIN", "1337", fmt.Sprintf("sets %s %s %s %s %s", na, na, na, na, na)},
	} {
		cmd := exec.Command(bin)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), roleEnv+"=draind", "PROXY_TEST_CAPS="+tc.caps, "PROXY_TEST_UID="+tc.uid)
		out, err := cmd.CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != tc.want {
			t.Errorf("caps %q, uid %q: %v\n%s\nwant %s", tc.caps, tc.uid, err, got, tc.want)
		}
	}
}

// selfCopy copies the test binary into a directory of its own that uid
// 1337 may enter and run it from.
func selfCopy(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "draind-proxy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin = dir + "/proxy.test"
	data, err := os.ReadFile("/proc/self/exe")
	if err == nil {
		err = os.WriteFile(bin, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir, bin
}
