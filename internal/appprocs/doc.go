// Package appprocs follows the app's processes in a pod's network
// namespace: how many there are, and how the ones that left ended. draind
// uses it to tell when the app's work is done.
//
// # Who is the app
//
// Every process of the namespace but draind's own, the proxy's and the
// pod's pause process: [Rules] name them (draind's pids, the proxy's uid
// and pids, the pause rule's name) and [Classify] applies them, with the
// pause rule and the descent checks it documents. ProxyUID is taken as
// given, as the socket policy takes --proxy-uid: 0 is root.
//
// # Sources
//
// [Open] returns a [Source] with one of two backends ([Mode]):
//
//   - ebpf: the programs of bpf/procs.c (package probes, [probes.Procs]):
//     a task iterator's snapshot, which walks every process of the node
//     (the app's PID namespace is not draind's in a pod), then
//     sched_process_fork/exec/exit events, each seen within one event, with
//     the kernel's exit status. A loss of events is followed by a new
//     snapshot. Started with the pod's cgroups ([WithPodCgroup]), it
//     attaches none of them: a snapshot is taken whenever one of the pod's
//     containers' cgroups fills or empties (inotify on cgroup.events), and
//     every second, so that nothing runs for other pods' processes.
//   - proc: /proc scanned on a period, where /proc shows the app (a shared
//     PID namespace, or the host's with CAP_SYS_PTRACE). Exits are inferred,
//     without a status.
//
// Both keep the same table (table.go): every process of the namespace, the
// pause process pinned on the first snapshot, the app's processes, their
// exits ([Exit], the last [ExitHistory] and the last [MainExitHistory] of
// the containers' main processes) and whether the last snapshot saw every
// process ([Coverage]). A backend that cannot run here says why with an
// [*UnavailableError]; auto mode then tries the next one.
//
// # Lifecycle and concurrency
//
// As flows.Tracker: Open takes the first snapshot; Run(ctx) follows
// changes until ctx ends, in a goroutine the caller owns; Close releases
// what the source holds, after Run returned (safe twice). Readers (Count,
// Processes, Exits, Changed...) may be called from any goroutine. The
// package logs nothing.
package appprocs
