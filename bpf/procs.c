// SPDX-License-Identifier: GPL-2.0
/*
 * procs: the processes of one network namespace, seen from the kernel.
 *
 *   iter/task                 a snapshot: one record per process with a live
 *                             thread in the namespace, then an END record.
 *                             The kernel walks only the reader's PID
 *                             namespace (and those below it): the final call
 *                             (no task) also walks the global process list
 *                             (see "The walk" below), into walk_out
 *   tp_btf/sched_process_fork a new process born in the namespace
 *   tp_btf/sched_process_exec a process of the namespace ran execve (new
 *                             comm, maybe new uid)
 *   tp_btf/sched_process_exit the last thread of a process of the namespace
 *                             exited: the process is gone
 *
 * The namespace is a load-time constant (target_netns, the ns.inum of the
 * namespace, which is the inode of /proc/PID/ns/net). No PID namespace is
 * needed: pids are the kernel's global ones. The three tp_btf programs run
 * for every fork, exec and exit of the node while attached: each compares
 * the namespace first and returns for another before any other work.
 *
 * Loaded by internal/probes/procs_linux.go. Compiled by bpf2go with
 * procs.h only (no vmlinux.h): see the comment there.
 *
 * Kernel requirements: BTF; BPF task iterator, bpf_seq_write and the BPF ring
 * buffer (5.8); tp_btf (5.5); task->start_boottime (5.5); global functions
 * (5.6); mmap-able arrays (5.5).
 */
#include "procs.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

/*
 * One record, from the iterator (bpf_seq_write), the walk (walk_out) or the
 * ring buffer. Fixed layout (80 bytes, little-endian on bpfel), decoded by
 * hand in internal/probes/procs_linux.go: change both together, and the
 * offset checks in internal/probes/procs_linux_test.go.
 *
 * The END record reuses some fields for the walk's result: pid is the
 * number of processes visited, ppid the number of records in walk_out,
 * flags the PROC_F_WALK_* bits, netns the initial network namespace's inode.
 */
struct proc_event {
	__u64 ts_ns;    /* bpf_ktime_get_ns() when the record was made */
	__u64 start_ns; /* group leader's start_boottime: ns since boot */
	__u32 kind;     /* PROC_EV_* */
	__u32 tgid;     /* the process (global pid); END: the reader's tgid */
	__u32 pid;      /* the thread that made the record; END: visited */
	__u32 ppid;     /* group leader's real_parent->tgid; END: written */
	__u32 uid;      /* real uid (cred->uid), init user namespace */
	__u32 flags;    /* PROC_F_* */
	__u32 nspid;    /* tgid in the reader's PID namespace, 0: not in it */
	__u32 nsppid;   /* ppid in the reader's PID namespace, 0: not in it */
	__u32 status;   /* EXIT: the wait(2) status the parent reads */
	__u32 netns;    /* END: ns.inum of the initial network namespace */
	char comm[16];  /* group leader's comm */
	__u32 mntns;    /* ns.inum of the mount namespace: its container */
	__u32 _pad;
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

/* END: how the walk ended. Complete only with DONE alone. */
#define PROC_F_WALK_DONE 0x10  /* back at init_task: every process visited */
#define PROC_F_WALK_CAP 0x20   /* stopped after walk_cap processes */
#define PROC_F_WALK_FULL 0x40  /* walk_out full: more processes matched */
#define PROC_F_WALK_FAULT 0x80 /* a read failed, or no init_task found */

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

/*
 * The walk's output: one PROC_EV_TASK record per process of the namespace,
 * read by user space through mmap after the iterator's END record. Its size
 * (max_entries) is set at load.
 */
struct {
	__uint(type, PROCS_MAP_TYPE_ARRAY);
	__uint(map_flags, PROCS_F_MMAPABLE);
	__uint(max_entries, 4096); /* overridden at load */
	__type(key, __u32);
	__type(value, struct proc_event);
} walk_out SEC(".maps");

/* Where a task is, for the namespace. */
enum {
	WHERE_ELSEWHERE = 0, /* another namespace, or a kernel thread */
	WHERE_TARGET = 1,    /* a user task of the namespace */
	WHERE_GONE = 2,      /* its namespaces are gone: exiting, or a zombie */
};

/*
 * Kernel threads are not processes of any pod: they all live in the
 * initial namespace, which a hostNetwork pod watches.
 */
static __always_inline int where(const struct task_struct *t)
{
	if (BPF_CORE_READ(t, flags) & PF_KTHREAD)
		return WHERE_ELSEWHERE;
	/* NULL once exit_task_namespaces ran (late in do_exit), and for zombies. */
	struct nsproxy *nsp = BPF_CORE_READ(t, nsproxy);
	if (!nsp)
		return WHERE_GONE;
	return BPF_CORE_READ(nsp, net_ns, ns.inum) == target_netns ? WHERE_TARGET : WHERE_ELSEWHERE;
}

static __always_inline bool in_target(const struct task_struct *t)
{
	return where(t) == WHERE_TARGET;
}

/*
 * in_target for the tp_btf programs, whose task arguments are BTF-typed:
 * direct loads (fault-safe, made so by the verifier) instead of
 * bpf_probe_read_kernel calls. They run for every fork, exec and exit of
 * the node while attached, and for another pod's this is all they do.
 */
static __always_inline bool hook_in_target(const struct task_struct *t)
{
	if (t->flags & PF_KTHREAD)
		return false;
	const struct nsproxy *nsp = t->nsproxy;
	/* NULL once exit_task_namespaces ran, and for zombies. */
	if (!nsp)
		return false;
	return nsp->net_ns->ns.inum == target_netns;
}

/*
 * The number the reader's PID namespace gives thread-group leader t, 0 when t
 * is not in it (nor in one below it). draind and the app are in different
 * PID namespaces: this is how pids draind knows (its own, its proxy's) are
 * matched with the kernel's.
 *
 * A global function: the verifier checks its loop once, not at every call.
 * Its argument is a scalar (a pointer read with bpf_probe_read_kernel): 5.10
 * passes nothing else to a global function but the context.
 */
__noinline __u32 reader_nr(__u64 addr)
{
	const struct task_struct *t = (const struct task_struct *)addr;
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

/*
 * Fills everything but ts_ns, kind, flags, status and netns from task t's
 * thread group.
 */
static __always_inline void fill(struct proc_event *e, const struct task_struct *t)
{
	struct task_struct *leader = BPF_CORE_READ(t, group_leader);
	struct task_struct *parent = BPF_CORE_READ(leader, real_parent, group_leader);

	e->tgid = BPF_CORE_READ(t, tgid);
	e->pid = BPF_CORE_READ(t, pid);
	e->ppid = BPF_CORE_READ(parent, tgid);
	e->nspid = reader_nr((__u64)leader);
	e->nsppid = reader_nr((__u64)parent);
	e->uid = BPF_CORE_READ(t, cred, uid.val);
	/*
	 * Every container has a mount namespace of its own, whatever else the
	 * pod shares; hooks and `kubectl exec` join it. t's own: a leader that
	 * exited before its threads has none left.
	 */
	e->mntns = BPF_CORE_READ(t, nsproxy, mnt_ns, ns.inum);
	e->_pad = 0;
	e->start_ns = BPF_CORE_READ(leader, start_boottime);
	BPF_CORE_READ_INTO(&e->comm, leader, comm);
}

/*
 * The wait(2) status the parent of p's group reads (wait_task_zombie): the
 * group's exit code when the group exits as one (exit_group, a fatal
 * signal), else the leader's own. At sched_process_exit of the group's last
 * thread both are set: do_exit sets exit_code before the tracepoint.
 */
static __always_inline __u32 wait_status(const struct task_struct *p)
{
	struct signal_struct *sig = BPF_CORE_READ(p, signal);

	if (BPF_CORE_READ(sig, flags) & SIGNAL_GROUP_EXIT)
		return BPF_CORE_READ(sig, group_exit_code);
	return BPF_CORE_READ(p, group_leader, exit_code);
}

static __always_inline void emit(const struct task_struct *t, __u32 kind, __u32 status)
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
	e->status = status;
	e->netns = 0;
	fill(e, t);
	bpf_ringbuf_submit(e, 0);
}

/*
 * The walk
 *
 * The task iterator visits the tasks of the reader's PID namespace only (the
 * kernel takes task_active_pid_ns(current) when the iterator is opened): in
 * a pod draind and the app are in sibling PID namespaces, and the app is not
 * among them. So its final call walks the kernel's list of every thread
 * group leader (task_struct.tasks, circular through init_task, in fork
 * order), which the iterator runs in one RCU read-side section: a leader
 * unlinked meanwhile (release_task, list_del_rcu) keeps its next pointer,
 * and its memory, until the section ends. Reads go through
 * bpf_probe_read_kernel: the pointers are the kernel's, not the verifier's.
 *
 * The verifier checks every iteration of a bounded loop, and 5.10 has no
 * bpf_loop: the walk is nested global functions, which it verifies once
 * each whatever the number of calls: WALK_STEPS leaders per walk_steps,
 * WALK_SPANS calls of it per walk_span, WALK_CALLS calls of that from the
 * iterator.
 */
#define WALK_STEPS 32
#define WALK_SPANS 64
#define WALK_CALLS 32
#define WALK_MAX (WALK_STEPS * WALK_SPANS * WALK_CALLS)

/* Most processes visited (set at load, at most WALK_MAX). */
volatile const __u32 walk_cap = WALK_MAX;

struct walk_state {
	__u64 head;    /* &init_task.tasks: the end of the walk */
	__u64 next;    /* the tasks member of the next leader to visit */
	__u32 visited; /* leaders visited */
	__u32 written; /* records in walk_out */
	__u32 flags;   /* PROC_F_WALK_* */
	__u32 netns;   /* init_task's network namespace */
};

/* One walk at a time: only the tracker reads its iterator. */
static struct walk_state walk;

#define PROC_F_WALK_OVER (PROC_F_WALK_DONE | PROC_F_WALK_CAP | PROC_F_WALK_FULL | PROC_F_WALK_FAULT)

/* How far the search for init_task climbs the process tree. */
#define MAX_TREE_DEPTH 32

/* Threads of a group whose leader exited that the walk looks at. */
#define WALK_THREADS 16

/*
 * Finds init_task, the list's head: every task's chain of real parents ends
 * there (the parent of pid 1 and of kthreadd; its own real_parent).
 */
__noinline int walk_begin(void)
{
	__u64 t = bpf_get_current_task();

	walk.head = 0;
	walk.next = 0;
	walk.visited = 0;
	walk.written = 0;
	walk.flags = 0;
	walk.netns = 0;
	for (int i = 0; i < MAX_TREE_DEPTH && t; i++) {
		__u64 parent = (__u64)BPF_CORE_READ((struct task_struct *)t, real_parent);
		if (parent == t) {
			struct task_struct *init = (struct task_struct *)t;

			walk.head = (__u64)__builtin_preserve_access_index(&init->tasks);
			walk.next = (__u64)BPF_CORE_READ(init, tasks.next);
			walk.netns = BPF_CORE_READ(init, nsproxy, net_ns, ns.inum);
			return 0;
		}
		t = parent;
	}
	walk.flags = PROC_F_WALK_FAULT;
	return 0;
}

/* where() of task addr, for the walk: verified once. */
__noinline int task_where(__u64 addr)
{
	return where((const struct task_struct *)addr);
}

/*
 * A live thread of the namespace in the group of leader addr, whose own
 * nsproxy is gone (it exited before its threads), or 0.
 */
__noinline __u64 walk_thread(__u64 addr)
{
	struct signal_struct *sig = BPF_CORE_READ((struct task_struct *)addr, signal);
	__u64 head = (__u64)__builtin_preserve_access_index(&sig->thread_head);
	__u64 node = (__u64)BPF_CORE_READ(sig, thread_head.next);
	__u64 off = bpf_core_field_offset(struct task_struct, thread_node);

	for (int i = 0; i < WALK_THREADS; i++) {
		if (!node || node == head)
			return 0;
		if (task_where(node - off) == WHERE_TARGET)
			return node - off;
		node = (__u64)BPF_CORE_READ((struct task_struct *)(node - off), thread_node.next);
	}
	return 0;
}

/*
 * Records leader addr in walk_out when its group is alive and in the
 * namespace. Returns 1 when walk_out is full.
 */
__noinline int walk_visit(__u64 addr)
{
	struct task_struct *t = (struct task_struct *)addr;
	__u64 member = addr;
	__u32 flags = 0;
	int loc = task_where(addr);

	if (loc == WHERE_ELSEWHERE)
		return 0;
	/* Dead (see procs_iter): its exit event is in the ring buffer. */
	if (BPF_CORE_READ(t, signal, live.counter) == 0)
		return 0;
	if (loc == WHERE_GONE) {
		member = walk_thread(addr);
		if (!member)
			return 0;
		flags = PROC_F_THREAD;
	}
	__u32 idx = walk.written;
	struct proc_event *e = bpf_map_lookup_elem(&walk_out, &idx);
	if (!e) {
		walk.flags |= PROC_F_WALK_FULL;
		return 1;
	}
	walk.written = idx + 1;
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = PROC_EV_TASK;
	e->flags = flags;
	e->status = 0;
	e->netns = 0;
	fill(e, (const struct task_struct *)member);
	return 0;
}

/* Visits up to WALK_STEPS leaders. Returns 1 when the walk is over. */
__noinline int walk_steps(void)
{
	__u64 off = bpf_core_field_offset(struct task_struct, tasks);
	__u64 cur = walk.next, head = walk.head;
	__u32 visited = walk.visited, cap = walk_cap;
	int over = 0;

	for (int i = 0; i < WALK_STEPS; i++) {
		__u64 next;

		if (cur == head) {
			walk.flags |= PROC_F_WALK_DONE;
			over = 1;
			break;
		}
		if (visited >= cap) {
			walk.flags |= PROC_F_WALK_CAP;
			over = 1;
			break;
		}
		if (bpf_probe_read_kernel(&next, sizeof(next), (void *)cur)) {
			walk.flags |= PROC_F_WALK_FAULT;
			over = 1;
			break;
		}
		visited++;
		if (walk_visit(cur - off)) {
			over = 1;
			break;
		}
		cur = next;
	}
	walk.next = cur;
	walk.visited = visited;
	return over;
}

/* Calls walk_steps up to WALK_SPANS times. Returns 1 when the walk is over. */
__noinline int walk_span(void)
{
	for (int i = 0; i < WALK_SPANS; i++)
		if (walk_steps())
			return 1;
	return 0;
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
		 * Called once more with no task when the iteration is complete:
		 * walk every process, then tell the reader how the walk went and
		 * who the reader is in the kernel's pid numbering (its own PID
		 * namespace may number it differently).
		 */
		walk_begin();
		for (int i = 0; i < WALK_CALLS && !(walk.flags & PROC_F_WALK_OVER); i++)
			walk_span();
		if (!(walk.flags & PROC_F_WALK_OVER))
			walk.flags |= PROC_F_WALK_CAP; /* WALK_MAX visited */
		struct task_struct *me = (struct task_struct *)bpf_get_current_task();

		e.ts_ns = bpf_ktime_get_ns();
		e.kind = PROC_EV_END;
		e.tgid = bpf_get_current_pid_tgid() >> 32;
		e.nspid = reader_nr((__u64)BPF_CORE_READ(me, group_leader));
		e.pid = walk.visited;
		e.ppid = walk.written;
		e.flags = walk.flags;
		e.netns = walk.netns;
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
	 * The iteration visits every thread. Report a process through its
	 * leader; through another thread only when the leader is not in the
	 * namespace itself (it exited early, or is elsewhere): user space
	 * dedupes by tgid.
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
	/* The child's own namespace: clone(CLONE_NEWNET) puts it elsewhere. */
	if (!hook_in_target(child))
		return 0;
	/* A new thread is not a new process. */
	if (BPF_CORE_READ(child, pid) != BPF_CORE_READ(child, tgid))
		return 0;
	emit(child, PROC_EV_FORK, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(procs_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	if (!hook_in_target(p))
		return 0;
	emit(p, PROC_EV_EXEC, 0);
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
	if (!hook_in_target(p))
		return 0;
	/* A thread's exit is not the process's: only the last one counts. */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	emit(p, PROC_EV_EXIT, wait_status(p));
	return 0;
}
