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

struct nsproxy {
	struct net *net_ns;
};

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	/* Threads of the group not yet past do_exit's decrement. */
	atomic_t live;
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
	pid_t pid;
	pid_t tgid;
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
