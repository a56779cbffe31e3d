// Package flows tells what a network namespace's TCP sockets are doing for
// a drain: who owns each one (the app or the proxy), which way it points,
// whether it still holds the drain open, and for how long it has been idle;
// and keeps that view live.
//
// # Attribution
//
// [Policy] holds the rules (docs/design.md, "Who owns a socket"): a socket
// is the proxy's when its uid is the proxy uid, its local port is one of the
// proxy ports, or its peer is the proxy's admin API on loopback (draind's
// own calls); every other socket is the app's. A flow is inbound when its
// local port is one its owner listens on, outbound otherwise. [Classifier]
// applies the policy to sockets and [Summary] counts them by class.
//
// # The live table
//
// [FlowTable] is one entry per socket, keyed by socket cookie (or by
// 5-tuple on kernels whose tracing programs cannot read cookies), with the
// per-class counts kept as entries change. Its entries are packed records
// (48 bytes, no pointers, in fixed chunks) found through open-addressing
// indexes of uint32 positions (record.go): 65–110 bytes of Go heap per
// socket, nothing allocated per socket once grown. [Tracker] keeps a
// FlowTable of one namespace live: from eBPF events (package probes) with
// sock_diag snapshots (package sockdiag) at start and after any loss, or
// from sock_diag polls where eBPF cannot run; a snapshot streams from the
// dump into the records in place. Subscribers are told whenever the
// per-class counts change. [Tracker.Each] walks the table without copying
// it; [Tracker.Flows] returns copies.
//
// # Concurrency and logging
//
// A FlowTable is not safe for concurrent use; a Tracker is (one goroutine
// runs [Tracker.Run], the owner cancels its context and then calls Close).
// The Tracker logs only to the *zap.Logger it is given, and only its mode
// changes and resyncs after lost events.
package flows
