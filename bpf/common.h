/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Minimal, hand-written kernel type definitions for draind's eBPF programs.
 *
 * This replaces a generated vmlinux.h on purpose: the objects are rebuilt in
 * CI on another kernel and must come out byte-identical, so nothing here may
 * depend on the build machine's BTF. Every struct is marked
 * preserve_access_index: field offsets are relocated (CO-RE) against the
 * running kernel's BTF at load time, so only the members we read are listed
 * and their order/offsets here do not matter.
 *
 * Add a member only when a program reads it, with the kernel's own name and
 * a compatible type.
 */
#ifndef __DRAIND_COMMON_H
#define __DRAIND_COMMON_H

/* Fixed-width types (normally from linux/types.h via vmlinux.h). */
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
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef _Bool bool;
#define true 1
#define false 0

/* Enough of uapi/linux/bpf.h for bpf_helpers.h and bpf_helper_defs.h. */
enum bpf_map_type {
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

/*
 * bpf_helper_defs.h declares every helper with pointers to these types;
 * declaring them incomplete is all it needs.
 */
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
struct task_struct;
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

/* Address families and protocols (include/linux/socket.h, uapi/linux/in.h). */
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6

/* include/net/tcp_states.h */
enum {
	TCP_ESTABLISHED = 1,
	TCP_SYN_SENT = 2,
	TCP_SYN_RECV = 3,
	TCP_FIN_WAIT1 = 4,
	TCP_FIN_WAIT2 = 5,
	TCP_TIME_WAIT = 6,
	TCP_CLOSE = 7,
	TCP_CLOSE_WAIT = 8,
	TCP_LAST_ACK = 9,
	TCP_LISTEN = 10,
	TCP_CLOSING = 11,
	TCP_NEW_SYN_RECV = 12,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__be16 u6_addr16[8];
		__be32 u6_addr32[4];
	} in6_u;
};

struct ns_common {
	unsigned int inum;
};

struct net {
	struct ns_common ns;
};

typedef struct {
	struct net *net;
} possible_net_t;

typedef struct {
	__u32 val;
} kuid_t;

struct sock_common {
	union {
		struct {
			__be32 skc_daddr;
			__be32 skc_rcv_saddr;
		};
	};
	union {
		struct {
			__be16 skc_dport;
			__u16 skc_num;
		};
	};
	unsigned short skc_family;
	volatile unsigned char skc_state;
	possible_net_t skc_net;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
};

struct sock {
	struct sock_common __sk_common;
	kuid_t sk_uid;
	/* A plain u16 since 5.6; a bitfield before (tp_btf's 5.5 only). */
	__u16 sk_protocol;
};

struct inet_sock {
	struct sock sk;
	__be16 inet_sport;
};

#pragma clang attribute pop

#endif /* __DRAIND_COMMON_H */
