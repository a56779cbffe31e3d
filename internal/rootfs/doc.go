// Package rootfs reads small files that another process's filesystem
// holds, as the node commands read a container's (`draind pods`: Istio's
// annotations file in draind's container) or the kubelet's (its --config),
// without letting that filesystem's owner steer or stall the reader.
//
// [ReadFile] resolves a path inside a root directory (a process's
// /proc/PID/root) with openat2(2): RESOLVE_IN_ROOT, so that an absolute
// symbolic link or a ".." resolves inside that root, never in the
// reader's; RESOLVE_NO_MAGICLINKS, so that /proc/PID/fd-style links do
// not jump out of it. It opens with O_NONBLOCK (a FIFO does not wait for
// a writer), takes regular files only ([ErrNotRegular]: no FIFO, device
// or socket), reads at most a limit ([ErrTooLarge]), and returns when
// its context ends whatever the read is doing.
//
// openat2 is Linux 5.6's; a kernel without it, or a seccomp filter that
// refuses it, is [ErrNoOpenat2]: there is no fallback that resolves
// links safely, so nothing is read.
//
// Errors are lowercase and wrap their cause (%w). The package logs
// nothing.
package rootfs
