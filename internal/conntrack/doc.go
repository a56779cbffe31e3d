// Package conntrack tells what a network namespace's TCP sockets are doing:
// who owns each one (the app or the proxy), which way it points, whether it
// still holds a pod's drain open, and for how long it has been idle.
//
// # Sources
//
// The kernel is the only source. [DiagConn] speaks NETLINK_SOCK_DIAG
// (inet_diag_req_v2) itself, with a kernel-side state filter so that a
// listener check never walks established sockets. The eBPF probe on
// inet_sock_set_state ([Probe]) keeps a [FlowTable] live between snapshots.
//
// # Namespaces
//
// Every entry point takes a [NetNS] handle. A netlink socket is opened in the
// target namespace directly (on a short-lived locked thread); the caller's
// thread never changes namespace.
//
// # Attribution
//
// [Policy] holds the rules of DESIGN.md ("Who owns a socket"): a socket is
// the proxy's when its uid is the proxy uid, its local port is one of the
// proxy ports, or it is one of draind's own; every other socket is the
// app's. A flow is inbound when its local port is one its owner listens on,
// outbound otherwise.
//
// # Errors
//
// Errors are wrapped with %w. [*NetNSError] says which namespace could not
// be opened and why; [ErrNoInetDiag] means the kernel lacks the inet_diag
// module. The package logs nothing.
package conntrack
