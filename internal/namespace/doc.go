// Package namespace opens handles on Linux network namespaces and answers
// the few questions draind asks about namespaces: which one a process or a
// thread is in, and whether a PID namespace is the host's.
//
// # Handles
//
// A [Net] is an open file on a network namespace (nsfs): the calling
// process's ([Current]), one bound at a path ([Open], e.g. /run/netns/NAME or
// /proc/PID/ns/net) or a process's ([ByPID]). Its [Net.Inode] is the number
// the kernel calls net->ns.inum, which the eBPF programs filter on. Sockets
// are opened inside a namespace through the handle's fd (netlink's
// Config.NetNS): no thread ever switches namespace.
//
// # PID namespaces
//
// [InitialPIDInode] is the fixed inode of the host's (initial) PID
// namespace; [SelfPID] tells whether the caller runs in it. In a container
// it does not, and /proc then shows only the container's own processes.
//
// # Errors
//
// [*Error] names the namespace that could not be opened and wraps the
// cause; [ErrProcessGone] is wrapped when the process named by pid is gone.
// The package logs nothing.
package namespace
