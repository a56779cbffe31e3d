/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The types only bpf/podsock.c reads, hand-written as tcpstate.h is (see
 * there): the kernel's, marked preserve_access_index and relocated at load;
 * and struct bpf_sock_ops, the sock_ops program's context, which is uapi
 * (include/uapi/linux/bpf.h) with fixed offsets the verifier rewrites, so
 * it is written out as the kernel defines it up to the last member read.
 */
#ifndef __DRAIND_PODSOCK_H
#define __DRAIND_PODSOCK_H

#include "tcpstate.h"

#define SOL_TCP 6

/* include/uapi/linux/bpf.h: TCP_BPF_SOCK_OPS_CB_FLAGS since 6.12. */
#define TCP_BPF_SOCK_OPS_CB_FLAGS 1008

/* include/uapi/linux/bpf.h, enum of bpf_sock_ops.op (values fixed by the ABI). */
enum {
	BPF_SOCK_OPS_TCP_CONNECT_CB = 3,
	BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB = 4,
	BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB = 5,
	BPF_SOCK_OPS_STATE_CB = 10,
	BPF_SOCK_OPS_TCP_LISTEN_CB = 11,
};

/* include/uapi/linux/bpf.h, bpf_sock_ops_cb_flags. */
#define BPF_SOCK_OPS_STATE_CB_FLAG (1 << 2)

/* include/uapi/linux/bpf.h (offsets checked: op 0, args 4, cb flags 84, sk 184). */
struct bpf_sock_ops {
	__u32 op;
	union {
		__u32 args[4];
		__u32 reply;
		__u32 replylong[4];
	};
	__u32 family;
	__u32 remote_ip4;
	__u32 local_ip4;
	__u32 remote_ip6[4];
	__u32 local_ip6[4];
	__u32 remote_port;
	__u32 local_port;
	__u32 is_fullsock;
	__u32 snd_cwnd;
	__u32 srtt_us;
	__u32 bpf_sock_ops_cb_flags;
	__u32 state;
	__u32 rtt_min;
	__u32 snd_ssthresh;
	__u32 rcv_nxt;
	__u32 snd_nxt;
	__u32 snd_una;
	__u32 mss_cache;
	__u32 ecn_flags;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u32 packets_out;
	__u32 retrans_out;
	__u32 total_retrans;
	__u32 segs_in;
	__u32 data_segs_in;
	__u32 segs_out;
	__u32 data_segs_out;
	__u32 lost_out;
	__u32 sacked_out;
	__u32 sk_txhash;
	__u64 bytes_received;
	__u64 bytes_acked;
	union {
		struct bpf_sock *sk;
		__u64 : 64;
	} __attribute__((aligned(8)));
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

/* Starts with its struct sock (through inet_connection_sock and inet_sock). */
struct tcp_sock {
	__u8 bpf_sock_ops_cb_flags;
};

struct kernfs_node {
	__u64 id;
};

/* ancestors[] since 6.0 (ancestor_ids[] before). */
struct cgroup {
	int level;
	struct kernfs_node *kn;
	struct cgroup *ancestors[];
};

struct bpf_iter_meta {
	struct seq_file *seq;
};

struct bpf_iter__tcp {
	union {
		struct bpf_iter_meta *meta;
		__u64 : 64;
	} __attribute__((aligned(8)));
	union {
		struct sock_common *sk_common;
		__u64 : 64;
	} __attribute__((aligned(8)));
};

#pragma clang attribute pop

#endif /* __DRAIND_PODSOCK_H */
