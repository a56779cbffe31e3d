/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel types bpf/tcpstate.c and bpf/podsock.c read, hand-written
 * (base.h has the scalar types every program shares; podsock.h the types
 * only podsock.c reads).
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
#ifndef __DRAIND_TCPSTATE_H
#define __DRAIND_TCPSTATE_H

#include "base.h"

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

struct cgroup;

/* The cgroup v2 the socket was made in (a union of two u32 before 5.15). */
struct sock_cgroup_data {
	struct cgroup *cgroup;
};

struct sock {
	struct sock_common __sk_common;
	kuid_t sk_uid;
	struct sock_cgroup_data sk_cgrp_data;
	/* A plain u16 since 5.6; a bitfield before (tp_btf's 5.5 only). */
	__u16 sk_protocol;
};

struct inet_sock {
	struct sock sk;
	__be16 inet_sport;
};

#pragma clang attribute pop

#endif /* __DRAIND_TCPSTATE_H */
