// Package privs holds draind's Linux privileges: the capability sets of
// every thread of the process, and what a child process may inherit.
//
// `draind run` uses it three times (docs/threat-model.md):
//
//  1. At start, [RaiseEffective] raises the permitted capabilities into the
//     effective set. An image ships draind with file capabilities
//     `cap_bpf,cap_perfmon+p` (no effective bit): execve then puts them in
//     the permitted set only when the container's bounding set has them,
//     and never refuses to run draind (`+ep` makes execve fail with EPERM
//     when the bounding set lacks one). draind raises what it was given.
//  2. Before the proxy starts, [LimitInherited] clears the inheritable and
//     ambient sets and, when draind may (CAP_SETPCAP), shrinks the bounding
//     set to the capabilities the proxy is explicitly given: the proxy gets
//     those (through its ambient set, see SysProcAttr.AmbientCaps) and
//     nothing else, under any uid.
//  3. Once its eBPF programs are loaded and attached and its namespace
//     handles are open, [Drop] keeps only what the rest of the run needs
//     ([Needs.Keep]: CAP_KILL to signal a proxy under another uid; CAP_BPF
//     where the kernel checks it on every bpf() call; CAP_SYS_PTRACE for the
//     /proc poller), empties the bounding set when it may, sets
//     no_new_privs, so that no later execve gains anything, and makes the
//     process non-dumpable (no same-uid ptrace).
//
// # Threads
//
// Capabilities belong to threads, not to processes. Every change here is
// made on every thread of the Go runtime at once (syscall.AllThreadsSyscall),
// so a goroutine finds the same privileges on whichever thread it runs. The
// runtime refuses that in a binary linked with cgo: the changes then fail
// with an error wrapping [ErrCgo] and nothing is changed. draind is built
// with CGO_ENABLED=0 (Makefile, Dockerfile).
//
// The package logs nothing.
package privs
