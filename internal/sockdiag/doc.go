// Package sockdiag speaks NETLINK_SOCK_DIAG (inet_diag_req_v2) to list a
// network namespace's TCP sockets, and decodes the kernel's inet_diag_msg.
//
// # Dumps
//
// [Dial] opens a sock_diag socket in a namespace (through the namespace's
// fd: the caller's thread never switches namespace, and a process looking
// at its own namespace needs no capability). [Conn.Each] walks every TCP
// socket (IPv4, then IPv6) whose state is in a [StateMask]: the mask is
// applied by the kernel, so a LISTEN-only dump never walks established
// sockets. A dump the kernel interrupts (NLM_F_DUMP_INTR, the socket tables
// changed under it) is read to its end and reported as [ErrDumpInterrupted];
// [Conn.Sockets] retries it.
//
// mdlayher/netlink's Conn speaks the protocol (sequence numbers,
// multi-part dumps, NLMSG_DONE, NLMSG_ERROR) over a netlink.Socket of this
// package that reads every datagram into one 64 KiB buffer; each message
// is decoded in place from it into one reused Socket. A dump of any size
// allocates a few small objects per datagram and nothing per socket: a
// namespace of 200k sockets is read without a copy of it. Sockets collects
// a reused slice for callers that want one.
//
// # Messages
//
// [ParseMessage] decodes one inet_diag_msg and the attributes draind uses
// (tcp_info's idle times, the cgroup id) into a [Socket] without retaining
// the buffer. A socket's state is a [tcpstate.State], numbered as the
// kernel numbers TCP states.
//
// # Errors
//
// Errors are wrapped with %w and name the namespace. [ErrNoInetDiag] means
// the kernel has no inet_diag for TCP (modules not loaded);
// [ErrShortMessage] is wrapped by decoding errors. The package logs nothing.
package sockdiag
