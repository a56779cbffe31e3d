//go:build linux

package envoysim

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelSigaction is the kernel's struct sigaction for rt_sigaction(2) on
// the 64-bit architectures Go supports on Linux (handler, flags, restorer,
// mask).
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// abortProcess kills the process with SIGABRT, as a crashing Envoy dies: a
// parent's wait status says "killed by signal 6" and the kernel closes the
// sockets. Go's runtime turns a SIGABRT into a goroutine dump and exit
// code 2, so the default action is restored first, with no core dump
// (the process is made non-dumpable). It returns only if that failed.
func abortProcess() {
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	sa := kernelSigaction{} // SIG_DFL
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(syscall.SIGABRT),
		uintptr(unsafe.Pointer(&sa)), 0, unsafe.Sizeof(sa.mask), 0, 0); errno != 0 {
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGABRT)
	time.Sleep(time.Second) // delivery is asynchronous
}
