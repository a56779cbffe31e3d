// SPDX-License-Identifier: GPL-2.0
/*
 * procs: the processes of one network namespace, seen from the kernel.
 *
 *   iter/task                 a snapshot: one record per process with a live
 *                             thread in the namespace, then an END record
 *   tp_btf/sched_process_fork a new process born in the namespace
 *   tp_btf/sched_process_exec a process of the namespace ran execve (new
 *                             comm, maybe new uid)
 *   tp_btf/sched_process_exit the last thread of a process of the namespace
 *                             exited: the process is gone
 *
 * The namespace is a load-time constant (target_netns, the ns.inum of the
 * namespace, which is the inode of /proc/PID/ns/net). No PID namespace is
 * needed: pids are the kernel's global ones.
 *
 * Loaded by internal/conntrack/procs_linux.go. Compiled by bpf2go with
 * procs.h only (no vmlinux.h): see the comment there.
 *
 * Kernel requirements: BTF; BPF task iterator, bpf_seq_write and the BPF ring
 * buffer (5.8); tp_btf (5.5); task->start_boottime (5.5).
 */
#include "procs.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

/*
 * One record, from the iterator (bpf_seq_write) or the ring buffer. Fixed
 * layout (64 bytes, little-endian on bpfel), decoded by hand in
 * procs_linux.go: change both together, and the size check in
 * procs_linux_test.go.
 */
struct proc_event {
	__u64 ts_ns;    /* bpf_ktime_get_ns() when the record was made */
	__u64 start_ns; /* group leader's start_boottime: ns since boot */
	__u32 kind;     /* PROC_EV_* */
	__u32 tgid;     /* the process (global pid); END: the reader's tgid */
	__u32 pid;      /* the thread that made the record */
	__u32 ppid;     /* group leader's real_parent->tgid */
	__u32 uid;      /* real uid (cred->uid), init user namespace */
	__u32 flags;    /* PROC_F_* */
	__u32 nspid;    /* tgid in the reader's PID namespace, 0: not in it */
	__u32 nsppid;   /* ppid in the reader's PID namespace, 0: not in it */
	char comm[16];  /* group leader's comm */
};

enum {
	PROC_EV_TASK = 1, /* iterator: a process with a thread in the namespace */
	PROC_EV_END = 2,  /* iterator: the walk completed */
	PROC_EV_FORK = 3, /* a new process was born in the namespace */
	PROC_EV_EXEC = 4, /* a process of the namespace called execve */
	PROC_EV_EXIT = 5, /* the last thread of a process of the namespace exited */
};

/* PROC_EV_TASK came from a thread: the leader is gone or elsewhere. */
#define PROC_F_THREAD 1

/* Makes clang emit struct proc_event into BTF for bpf2go -type proc_event. */
const struct proc_event *unused_proc_event __attribute__((unused));

/* Set by the loader before loading (CollectionSpec.Variables). */
volatile const __u64 target_netns = 0; /* ns.inum of the network namespace */
volatile const __u64 reader_pidns = 0; /* ns.inum of the loader's PID namespace */

/* MAX_PID_NS_LEVEL (include/linux/pid_namespace.h). */
#define MAX_PIDNS_LEVEL 32

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10); /* overridden at load */
} proc_events SEC(".maps");

/* Failed ring buffer reservations, per CPU: the lost-event counter. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} proc_lost SEC(".maps");

static __always_inline bool in_target(const struct task_struct *t)
{
	/* NULL once exit_task_namespaces ran (late in do_exit), and for zombies. */
	struct nsproxy *nsp = BPF_CORE_READ(t, nsproxy);
	if (!nsp)
		return false;
	return BPF_CORE_READ(nsp, net_ns, ns.inum) == target_netns;
}

/*
 * The number the reader's PID namespace gives thread-group leader t, 0 when t
 * is not in it (nor in one below it). draind and the app are in different
 * PID namespaces: this is how pids draind knows (its own, its proxy's) are
 * matched with the kernel's.
 */
static __always_inline __u32 reader_nr(const struct task_struct *t)
{
	struct pid *p = BPF_CORE_READ(t, thread_pid);
	if (!p)
		return 0;
	unsigned int level = BPF_CORE_READ(p, level);
	struct upid *numbers = __builtin_preserve_access_index(&p->numbers[0]);
	for (int i = 0; i <= MAX_PIDNS_LEVEL; i++) {
		struct upid u;
		if (i > level)
			break;
		if (bpf_probe_read_kernel(&u, sizeof(u), numbers + i))
			break;
		if (BPF_CORE_READ(u.ns, ns.inum) == reader_pidns)
			return u.nr;
	}
	return 0;
}

/* Fills everything but ts_ns, kind and flags from task t's thread group. */
static __always_inline void fill(struct proc_event *e, const struct task_struct *t)
{
	struct task_struct *leader = BPF_CORE_READ(t, group_leader);
	struct task_struct *parent = BPF_CORE_READ(leader, real_parent, group_leader);

	e->tgid = BPF_CORE_READ(t, tgid);
	e->pid = BPF_CORE_READ(t, pid);
	e->ppid = BPF_CORE_READ(parent, tgid);
	e->nspid = reader_nr(leader);
	e->nsppid = reader_nr(parent);
	e->uid = BPF_CORE_READ(t, cred, uid.val);
	e->start_ns = BPF_CORE_READ(leader, start_boottime);
	BPF_CORE_READ_INTO(&e->comm, leader, comm);
}

static __always_inline void emit(const struct task_struct *t, __u32 kind)
{
	struct proc_event *e = bpf_ringbuf_reserve(&proc_events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&proc_lost, &zero);
		if (lost)
			*lost += 1; /* per-CPU slot: no other writer */
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->flags = 0;
	fill(e, t);
	bpf_ringbuf_submit(e, 0);
}

SEC("iter/task")
int procs_iter(struct bpf_iter__task *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	struct proc_event e;

	__builtin_memset(&e, 0, sizeof(e));
	if (!task) {
		/*
		 * Called once more with no task when the walk is complete: tell
		 * the reader who it is in the kernel's pid numbering (its own
		 * PID namespace may number it differently).
		 */
		e.ts_ns = bpf_ktime_get_ns();
		struct task_struct *me = (struct task_struct *)bpf_get_current_task();

		e.kind = PROC_EV_END;
		e.tgid = bpf_get_current_pid_tgid() >> 32;
		e.nspid = reader_nr(BPF_CORE_READ(me, group_leader));
		bpf_seq_write(seq, &e, sizeof(e));
		return 0;
	}
	if (!in_target(task))
		return 0;
	/*
	 * live is decremented in do_exit before sched_process_exit fires: a
	 * group at 0 is dead (its exit event is already in the ring buffer), a
	 * snapshot must not bring it back.
	 */
	if (BPF_CORE_READ(task, signal, live.counter) == 0)
		return 0;
	/*
	 * The walk visits every thread. Report a process through its leader;
	 * through another thread only when the leader is not in the namespace
	 * itself (it exited early, or is elsewhere): user space dedupes by tgid.
	 */
	if (BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid)) {
		if (in_target(BPF_CORE_READ(task, group_leader)))
			return 0;
		e.flags = PROC_F_THREAD;
	}
	e.ts_ns = bpf_ktime_get_ns();
	e.kind = PROC_EV_TASK;
	fill(&e, task);
	bpf_seq_write(seq, &e, sizeof(e));
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(procs_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A new thread is not a new process. */
	if (BPF_CORE_READ(child, pid) != BPF_CORE_READ(child, tgid))
		return 0;
	/* The child's own namespace: clone(CLONE_NEWNET) puts it elsewhere. */
	if (!in_target(child))
		return 0;
	emit(child, PROC_EV_FORK);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(procs_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	if (!in_target(p))
		return 0;
	emit(p, PROC_EV_EXEC);
	return 0;
}

/*
 * The first argument is the only one every kernel has (6.18 adds
 * group_dead): whether the group is dead is read from signal->live, which
 * do_exit decrements before this tracepoint and before exit_task_namespaces
 * clears nsproxy.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(procs_exit, struct task_struct *p)
{
	/* A thread's exit is not the process's: only the last one counts. */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	if (!in_target(p))
		return 0;
	emit(p, PROC_EV_EXIT);
	return 0;
}
