// Command setfcap installs a file with file capabilities in one step:
//
//	setfcap CAPS SRC DST     e.g. setfcap cap_bpf,cap_perfmon+ep /out/draind /usr/local/bin/draind
//	setfcap --caps-env NAME SRC DST   CAPS from the environment variable NAME
//	                                  (a Dockerfile ARG: exec-form RUN expands no variables)
//
// It copies SRC to DST (mode 0755) and sets the security.capability
// xattr on DST. The root Dockerfile runs it in the final stage with SRC
// bind-mounted from the build stage (RUN --mount, exec form), so the
// binary lands in a single layer with its capabilities: copying a file
// that already has them (COPY --from) keeps them only with some builders
// (see docs/kubernetes.md), and a later setcap would copy the whole binary
// up into a second layer. Static, no libcap, no shell: it runs in a
// distroless image.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/draind/draind/e2e/kubelet/internal/fcap"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "setfcap:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 4 && args[0] == "--caps-env" {
		caps, ok := os.LookupEnv(args[1])
		if !ok {
			return fmt.Errorf("--caps-env %s: not set", args[1])
		}
		args = append([]string{caps}, args[2:]...)
	}
	if len(args) != 3 {
		return errors.New("usage: setfcap CAPS SRC DST | setfcap --caps-env NAME SRC DST")
	}
	set, err := fcap.Parse(args[0])
	if err != nil {
		return err
	}
	return install(args[1], args[2], set)
}

func install(src, dst string, set fcap.Set) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".setfcap"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	// chmod and chown clear security.capability: set it last.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := syscall.Setxattr(tmp, fcap.XattrName, set.Encode(), 0); err != nil {
		return fmt.Errorf("set %s on %s: %w", fcap.XattrName, dst, err)
	}
	return os.Rename(tmp, dst)
}
