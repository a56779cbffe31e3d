/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the two TCP state programs share: the event they put in the ring,
 * the ring itself, its loss counter, the namespace they watch, and emit().
 *
 * bpf/tcpstate.c (tp_btf on inet_sock_set_state: every state change of the
 * node) and bpf/podsock.c (sock_ops in the pod's cgroup: only the pod's own
 * sockets) both include it. They are two objects; internal/probes loads
 * podsock with tcpstate's events and lost_events maps in place of its own,
 * so user space reads one ring whichever program wrote to it.
 */
#ifndef __DRAIND_TCPEVENT_H
#define __DRAIND_TCPEVENT_H

#include "tcpstate.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

/*
 * One state change. Layout is fixed (72 bytes, little-endian on bpfel) and
 * decoded by hand in internal/probes/tcpstate_linux.go: change both
 * together, and the size assertion in internal/probes/tcpstate_linux_test.go.
 */
struct event {
	__u64 ts_ns;    /* bpf_ktime_get_ns() */
	__u64 cookie;   /* the socket cookie, 0 when unavailable */
	__u64 skaddr;   /* kernel address of the struct sock */
	__u8 saddr[16]; /* local address, network order; AF_INET: first 4 bytes */
	__u8 daddr[16]; /* remote address, same layout */
	__u32 uid;      /* sk->sk_uid (kuid, init user namespace) */
	__u16 sport;    /* local port, host order */
	__u16 dport;    /* remote port, host order */
	__u16 family;   /* AF_INET or AF_INET6 */
	__u8 oldstate;
	__u8 newstate;
	__u8 _pad[4];
};

/* Set by the loader before loading (CollectionSpec.Variables). */
volatile const __u64 target_netns = 0; /* ns.inum of the namespace to watch */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* overridden at load: TCPStateOptions.RingSize */
} events SEC(".maps");

/* Failed ring buffer reservations, per CPU: the lost-event counter. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost_events SEC(".maps");

/*
 * Puts one change of sk (at kernel address skaddr) in the ring, or counts
 * it lost. The cookie comes from the caller: each program type has its own
 * way to ask for it.
 */
static __always_inline void emit(const struct sock *sk, __u64 skaddr, int oldstate, int newstate,
                                 __u64 cookie)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&lost_events, &zero);
		if (lost) /* atomic: a nested run may count too */
			__sync_fetch_and_add(lost, 1);
		return;
	}

	e->ts_ns = bpf_ktime_get_ns();
	e->skaddr = skaddr;
	e->oldstate = oldstate;
	e->newstate = newstate;
	e->_pad[0] = e->_pad[1] = e->_pad[2] = e->_pad[3] = 0;
	e->cookie = cookie;

	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	e->family = family;
	e->uid = BPF_CORE_READ(sk, sk_uid.val);

	/*
	 * skc_num (the local port) is already 0 on transitions to CLOSE:
	 * inet_sport keeps it. Both are network order here.
	 */
	const struct inet_sock *inet = (const struct inet_sock *)sk;
	e->sport = bpf_ntohs(BPF_CORE_READ(inet, inet_sport));
	e->dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));

	if (family == AF_INET6) {
		BPF_CORE_READ_INTO(&e->saddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(&e->daddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	} else {
		__builtin_memset(e->saddr, 0, sizeof(e->saddr));
		__builtin_memset(e->daddr, 0, sizeof(e->daddr));
		BPF_CORE_READ_INTO((__be32 *)e->saddr, sk, __sk_common.skc_rcv_saddr);
		BPF_CORE_READ_INTO((__be32 *)e->daddr, sk, __sk_common.skc_daddr);
	}

	bpf_ringbuf_submit(e, 0);
}

#endif /* __DRAIND_TCPEVENT_H */
