package privs

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The numbers caps.go writes out are the kernel's.
func TestCapNumbersAreUnix(t *testing.T) {
	for _, tc := range []struct {
		c    Cap
		unix int
	}{
		{CapKill, unix.CAP_KILL}, {CapSetGID, unix.CAP_SETGID}, {CapSetUID, unix.CAP_SETUID},
		{CapSetPCap, unix.CAP_SETPCAP}, {CapNetAdmin, unix.CAP_NET_ADMIN}, {CapSysPtrace, unix.CAP_SYS_PTRACE},
		{CapSysAdmin, unix.CAP_SYS_ADMIN}, {CapPerfmon, unix.CAP_PERFMON}, {CapBPF, unix.CAP_BPF},
	} {
		if int(tc.c) != tc.unix {
			t.Errorf("%s = %d, unix says %d", tc.c, tc.c, tc.unix)
		}
	}
}
