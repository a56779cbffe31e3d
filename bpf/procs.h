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
 * Self-contained (does not include common.h) so that procs.c and
 * tcpstate.c can change independently.
 */
#ifndef __DRAIND_PROCS_H
#define __DRAIND_PROCS_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;
typedef int pid_t;
typedef _Bool bool;
#define true 1
#define false 0

/* Enough of uapi/linux/bpf.h for bpf_helpers.h and this program. */
enum bpf_map_type {
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

/* bpf_helper_defs.h declares helpers with pointers to these. */
struct bpf_fib_lookup;
struct bpf_sk_lookup;
struct bpf_perf_event_data;
struct bpf_perf_event_value;
struct bpf_pidns_info;
struct bpf_redir_neigh;
struct bpf_sock;
struct bpf_sock_addr;
struct bpf_sock_ops;
struct bpf_sock_tuple;
struct bpf_spin_lock;
struct bpf_sysctl;
struct bpf_tcp_sock;
struct bpf_tunnel_key;
struct bpf_xfrm_state;
struct linux_binprm;
struct pt_regs;
struct sk_reuseport_md;
struct sockaddr;
struct tcphdr;
struct seq_file;
struct tcp6_sock;
struct tcp_sock;
struct tcp_timewait_sock;
struct tcp_request_sock;
struct udp6_sock;
struct unix_sock;
struct cgroup;
struct __sk_buff;
struct sk_msg_md;
struct xdp_md;
struct path;
struct btf_ptr;
struct inode;
struct socket;
struct file;
struct bpf_timer;
struct mptcp_sock;
struct bpf_dynptr;
struct iphdr;
struct ipv6hdr;

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
