// Command posthook is the postStart hook of the e2e Job whose proxy
// container runs as root (owncontainer_test.go): it runs a command (draind
// wait), records when that returned, then stays --then longer and exits
// with the command's code.
//
// The kubelet starts the next container of the pod only once the hook has
// returned, so the stay delays the app's container with no process of the
// app alive meanwhile; and the hook's processes, root in the proxy's
// container, exit 0 while no app exists: what draind once took for the
// app's main process finishing (issue 20). The image has no shell, hence a
// binary.
//
//	posthook --then 3s --stamp /work/hook.stamp -- /usr/local/bin/draind wait
//
// The stamp file gets "returned UNIXNANO CODE" when the command returned and
// "done UNIXNANO" when the hook returns.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"
)

func main() {
	code, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "posthook:", err)
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	fs := flag.NewFlagSet("posthook", flag.ContinueOnError)
	then := fs.Duration("then", 3*time.Second, "stay this long after the command returned")
	stamp := fs.String("stamp", "", "append the command's return and the hook's end to this file")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if fs.NArg() == 0 {
		return 2, errors.New("no command: posthook [--then D] [--stamp FILE] -- CMD ARGS")
	}
	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	code := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return 1, fmt.Errorf("%s: %w", fs.Arg(0), err)
		}
		code = ee.ExitCode()
	}
	if err := appendStamp(*stamp, fmt.Sprintf("returned %d %d\n", time.Now().UnixNano(), code)); err != nil {
		return 1, err
	}
	time.Sleep(*then)
	return code, appendStamp(*stamp, fmt.Sprintf("done %d\n", time.Now().UnixNano()))
}

func appendStamp(path, line string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("--stamp: %w", err)
	}
	_, err = f.WriteString(line)
	return errors.Join(err, f.Close())
}
