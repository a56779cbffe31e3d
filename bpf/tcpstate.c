// SPDX-License-Identifier: GPL-2.0
/*
 * tcpstate: every TCP state change (inet_sock_set_state) of one network
 * namespace, delivered to user space through a ring buffer.
 *
 * Loaded by internal/conntrack/probe_linux.go. Compiled by bpf2go with
 * common.h only (no vmlinux.h): see the comment there.
 *
 * Kernel requirements: BTF and tp_btf (5.5), BPF ring buffer (5.8).
 * bpf_get_socket_cookie in tracing programs needs 5.12: on older kernels the
 * loader sets use_cookie = 0, the verifier then sees the helper call as dead
 * code (use_cookie lives in frozen .rodata, so its value is a known constant)
 * and never checks it, and events carry cookie = 0; user space keys them by
 * skaddr + 5-tuple instead.
 */
#include "common.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

/*
 * One state change. Layout is fixed (72 bytes, little-endian on bpfel) and
 * decoded by hand in probe_linux.go: change both together, and the size
 * assertion in probe_linux_test.go.
 */
struct event {
	__u64 ts_ns;     /* bpf_ktime_get_ns() */
	__u64 cookie;    /* bpf_get_socket_cookie(sk), 0 when unavailable */
	__u64 skaddr;    /* kernel address of the struct sock */
	__u8 saddr[16];  /* local address, network order; AF_INET: first 4 bytes */
	__u8 daddr[16];  /* remote address, same layout */
	__u32 uid;       /* sk->sk_uid (kuid, init user namespace) */
	__u16 sport;     /* local port, host order */
	__u16 dport;     /* remote port, host order */
	__u16 family;    /* AF_INET or AF_INET6 */
	__u8 oldstate;
	__u8 newstate;
	__u8 _pad[4];
};

/* Makes clang emit struct event into BTF so that bpf2go -type event finds it. */
const struct event *unused_event __attribute__((unused));

/* Set by the loader before loading (CollectionSpec.Variables). */
volatile const __u64 target_netns = 0; /* ns.inum of the namespace to watch */
volatile const __u8 use_cookie = 1;    /* 0 before 5.12 */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* overridden at load: ProbeOptions.RingSize */
} events SEC(".maps");

/* Failed ring buffer reservations, per CPU: the lost-event counter. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost_events SEC(".maps");

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_set_state, const struct sock *sk, int oldstate, int newstate)
{
	/* The tracepoint also fires for SCTP and MPTCP. */
	if (BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	if (BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum) != target_netns)
		return 0;

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&lost_events, &zero);
		if (lost)
			*lost += 1; /* per-CPU slot: no other writer */
		return 0;
	}

	e->ts_ns = bpf_ktime_get_ns();
	e->skaddr = (__u64)sk;
	e->oldstate = oldstate;
	e->newstate = newstate;
	e->_pad[0] = e->_pad[1] = e->_pad[2] = e->_pad[3] = 0;

	/*
	 * LISTEN -> SYN_RECV fires on the child while inet_csk_clone_lock is
	 * still turning a copy of the listener into it: its cookie (and ports,
	 * addresses) are still the listener's. Never report that cookie: the
	 * child's own comes with its next event (SYN_RECV -> ESTABLISHED).
	 */
	e->cookie = 0;
	if (use_cookie && !(oldstate == TCP_LISTEN && newstate == TCP_SYN_RECV))
		e->cookie = bpf_get_socket_cookie((void *)sk);

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
	return 0;
}
