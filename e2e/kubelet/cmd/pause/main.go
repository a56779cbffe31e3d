// Command pause is the pod sandbox's process for the e2e images: it holds
// the pod's namespaces, reaps orphans (it is PID 1 of the sandbox's PID
// namespace, which shareProcessNamespace makes every container's), and
// exits on SIGINT/SIGTERM. The binary is named pause, so its comm is
// "pause", as draind expects of the sandbox process.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
