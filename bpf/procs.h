/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Minimal, hand-written kernel type definitions for bpf/procs.c.
 *
 * Not a generated vmlinux.h, on purpose: the object is rebuilt in CI on
 * another kernel and must come out byte-identical, so nothing here may depend
 * on the build machine's BTF. Every struct is marked preserve_access_index:
 * field offsets are relocated (CO-RE) against the running kernel's BTF at
 * load time, so only the members procs.c reads are listed, with the kernel's
 * own names and compatible types; their order here does not matter.
 *
 * The base types shared with tcpstate.c are in base.h; the kernel structs
 * here are procs.c's own, so the two programs can change independently.
 */
#ifndef __DRAIND_PROCS_H
#define __DRAIND_PROCS_H

#include "base.h"

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct ns_common {
	unsigned int inum;
};

struct net {
	struct ns_common ns;
};

/* fs/mount.h: private to the kernel, but in its BTF. */
struct mnt_namespace {
	struct ns_common ns;
};

struct nsproxy {
	struct mnt_namespace *mnt_ns;
	struct net *net_ns;
};

typedef struct {
	int counter;
} atomic_t;

struct list_head {
	struct list_head *next;
	struct list_head *prev;
};

struct signal_struct {
	/* Threads of the group not yet past do_exit's decrement. */
	atomic_t live;
	/* The group's threads, through task_struct.thread_node (since 3.14). */
	struct list_head thread_head;
	unsigned int flags; /* SIGNAL_* */
	int group_exit_code;
};

typedef struct {
	__u32 val;
} kuid_t;

struct cred {
	kuid_t uid;
};

struct pid_namespace {
	struct ns_common ns;
};

/* task_struct.flags: a kernel thread (include/linux/sched.h, stable). */
#define PF_KTHREAD 0x00200000

/* signal_struct.flags: the group is exiting (include/linux/sched/signal.h). */
#define SIGNAL_GROUP_EXIT 0x00000004

/* Not in base.h (which tcpstate.c shares): the array map and its mmap flag. */
#define PROCS_MAP_TYPE_ARRAY 2
#define PROCS_F_MMAPABLE (1U << 10)

/* A pid as one PID namespace numbers it. */
struct upid {
	int nr;
	struct pid_namespace *ns;
};

/* numbers[0..level]: the pid in each PID namespace from the initial one down. */
struct pid {
	unsigned int level;
	struct upid numbers[1];
};

struct task_struct {
	struct pid *thread_pid; /* since 4.19 */
	unsigned int flags;     /* PF_* */
	pid_t pid;
	pid_t tgid;
	int exit_code;
	/* Every thread-group leader, from init_task, in fork order (RCU). */
	struct list_head tasks;
	struct list_head thread_node;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	const struct cred *cred;
	struct nsproxy *nsproxy;
	struct signal_struct *signal;
	__u64 start_boottime; /* since 5.5 (real_start_time before) */
	char comm[16];
};

/* Context of an iter/task program (kernel/bpf/task_iter.c). */
struct bpf_iter_meta {
	struct seq_file *seq;
	__u64 session_id;
	__u64 seq_num;
};

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
};

#pragma clang attribute pop

#endif /* __DRAIND_PROCS_H */
