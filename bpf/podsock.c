// SPDX-License-Identifier: GPL-2.0
/*
 * podsock: the TCP state changes of one pod's sockets, from a sock_ops
 * program attached to the pod's cgroup, into tcpstate's ring.
 *
 * Why: tcpstate's programs hang on inet_sock_set_state, a tracepoint of the
 * whole node. Each draining pod's pair runs for every state change of every
 * pod (issue 21: ten draining pods cost a loopback connect+close loop in
 * another pod half its rate). A sock_ops program attached to a cgroup runs
 * only for sockets made by processes in that cgroup or below it: the pod's.
 * Other pods pay nothing.
 *
 * How it sees every change of the pod's sockets:
 *   - podsock_ops gets the kernel's connect, listen and established
 *     callbacks for every socket of the cgroup made or accepted after it is
 *     attached; it reports the change and turns on the socket's state
 *     callback (BPF_SOCK_OPS_STATE_CB_FLAG), which reports every later
 *     change (tcp_set_state).
 *   - A socket that existed before the attach gets no callback. podsock_flag,
 *     a tcp iterator run once right after the attach, turns on the state
 *     callback of each of them (bpf_setsockopt TCP_BPF_SOCK_OPS_CB_FLAGS,
 *     6.12), under the socket's lock. A change before that is in the
 *     sock_diag snapshot user space takes after the walk.
 *   - A socket of the namespace made outside the pod's cgroup (a process
 *     that joined the namespace from the node) would never be seen: the walk
 *     counts them, and user space falls back to tcpstate's tracepoint.
 *
 * Loaded by internal/probes/podsock_linux.go, with tcpstate's events and
 * lost_events maps in place of its own (bpf/tcpevent.h). Kernel: sock_ops
 * with bpf_skc_to_tcp_sock and the ring buffer (5.10 loads it; the walk then
 * fails on the socket option, and user space falls back), the option itself
 * 6.12. Loading a sock_ops program needs CAP_NET_ADMIN; attaching it to a
 * cgroup needs none (an open directory of the cgroup).
 */
#include "tcpevent.h"
#include "podsock.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before loading: the kn->id (inode) of the pod's cgroup. */
volatile const __u64 pod_cgroup_id = 0;

/* What one run of podsock_flag found; user space zeroes it before a run. */
struct walk {
	__u64 flagged; /* sockets whose state callback is now on */
	__u64 outside; /* sockets of the namespace made outside the pod's cgroup */
	__u64 failed;  /* sockets the kernel refused the option for */
	__s64 err;     /* the last refusal's error */
	__u64 unknown; /* sockets whose cgroup this kernel cannot tell (before 5.15) */
};

/* Makes clang emit struct walk into BTF so that bpf2go -type walk finds it. */
const struct walk *unused_walk __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk);
} pod_walk SEC(".maps");

/*
 * The sock's address as a number (the table's second key, as tcpstate
 * reports it): copied out of the stack slot, since the verifier keeps a
 * pointer's value from being stored as a number.
 */
static __always_inline __u64 addr_of(const void *p)
{
	__u64 addr = 0;
	bpf_probe_read_kernel(&addr, sizeof(addr), &p);
	return addr;
}

static __always_inline bool in_target_netns(const struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum) == target_netns;
}

SEC("sockops")
int podsock_ops(struct bpf_sock_ops *skops)
{
	__u32 op = skops->op;
	int oldstate, newstate;

	switch (op) {
	case BPF_SOCK_OPS_STATE_CB:
		oldstate = skops->args[0];
		newstate = skops->args[1];
		break;
	case BPF_SOCK_OPS_TCP_CONNECT_CB: /* after tcp_set_state(SYN_SENT), before the SYN */
		oldstate = TCP_CLOSE;
		newstate = TCP_SYN_SENT;
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		oldstate = TCP_SYN_SENT;
		newstate = TCP_ESTABLISHED;
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		oldstate = TCP_SYN_RECV;
		newstate = TCP_ESTABLISHED;
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		oldstate = TCP_CLOSE;
		newstate = TCP_LISTEN;
		break;
	default:
		return 1;
	}
	if (op != BPF_SOCK_OPS_STATE_CB) {
		__u32 flags = skops->bpf_sock_ops_cb_flags;
		/* On already: the state callback reported this change. */
		if (flags & BPF_SOCK_OPS_STATE_CB_FLAG)
			return 1;
		bpf_sock_ops_cb_flags_set(skops, flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	}

	struct bpf_sock *bsk = skops->sk;
	if (!bsk)
		return 1;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);
	if (!tp)
		return 1;
	const struct sock *sk = (const struct sock *)tp;
	/* A process of the pod in another namespace (hostNetwork, a test). */
	if (!in_target_netns(sk))
		return 1;
	emit(sk, addr_of(tp), oldstate, newstate, bpf_get_socket_cookie(skops));
	return 1;
}

/* Whether sk was made in the pod's cgroup or one below it. */
static __always_inline bool in_pod(const struct sock *sk)
{
	struct cgroup *cg = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
	if (!cg)
		return false;
	int level = BPF_CORE_READ(cg, level);
	for (int i = 0; i < 32; i++) {
		if (i > level)
			break;
		struct cgroup *anc = NULL;
		bpf_core_read(&anc, sizeof(anc), &cg->ancestors[i]);
		if (anc && BPF_CORE_READ(anc, kn, id) == pod_cgroup_id)
			return true;
	}
	return false;
}

SEC("iter/tcp")
int podsock_flag(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	if (!skc)
		return 0;
	/* Request and timewait sockets: not full sockets, no callbacks. */
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	const struct sock *sk = (const struct sock *)tp;
	if (!in_target_netns(sk))
		return 0;
	__u32 zero = 0;
	struct walk *w = bpf_map_lookup_elem(&pod_walk, &zero);
	if (!w)
		return 0;
	if (!bpf_core_field_exists(((struct cgroup *)0)->ancestors) ||
	    !bpf_core_field_exists(((struct sock_cgroup_data *)0)->cgroup)) {
		w->unknown++;
		return 0;
	}
	if (!in_pod(sk)) {
		w->outside++;
		return 0;
	}
	int flags = BPF_CORE_READ(tp, bpf_sock_ops_cb_flags) | BPF_SOCK_OPS_STATE_CB_FLAG;
	long err = bpf_setsockopt(tp, SOL_TCP, TCP_BPF_SOCK_OPS_CB_FLAGS, &flags, sizeof(flags));
	if (err) {
		w->failed++;
		w->err = err;
		return 0;
	}
	w->flagged++;
	return 0;
}
