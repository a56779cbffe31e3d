// SPDX-License-Identifier: GPL-2.0
/*
 * tcpstate: every TCP state change (inet_sock_set_state) of one network
 * namespace, delivered to user space through a ring buffer.
 *
 * Loaded by internal/probes/tcpstate_linux.go. Compiled by bpf2go with
 * tcpstate.h only (no vmlinux.h): see the comment there.
 *
 * Both programs run for every TCP state change of the node, in every
 * namespace, for as long as they are attached (draind attaches them only
 * while it drains, and not at all where bpf/podsock.c covers the pod): each
 * compares the namespace first and returns for another before touching a
 * map.
 *
 * Kernel requirements: BTF and tp_btf (5.5), BPF ring buffer (5.8).
 * bpf_get_socket_cookie in tracing programs needs 5.12: on older kernels the
 * loader sets use_cookie = 0, the verifier then sees the helper call as dead
 * code (use_cookie lives in frozen .rodata, so its value is a known constant)
 * and never checks it, and events carry cookie = 0; user space keys them by
 * skaddr + 5-tuple instead.
 */
#include "tcpevent.h"

#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

/* Makes clang emit struct event (bpf/tcpevent.h) into BTF so that bpf2go -type event finds it. */
const struct event *unused_event __attribute__((unused));

volatile const __u8 use_cookie = 1; /* 0 before 5.12; set by the loader */

/*
 * The socket's cookie. LISTEN -> SYN_RECV fires on the child while
 * inet_csk_clone_lock is still turning a copy of the listener into it: on
 * some kernels its cookie is still the listener's (6.18 already gives the
 * child's). Never report it: the child's own comes with its next change
 * (SYN_RECV -> ESTABLISHED, in the same softirq).
 */
static __always_inline __u64 cookie_of(const struct sock *sk, int oldstate, int newstate)
{
	if (!use_cookie || (oldstate == TCP_LISTEN && newstate == TCP_SYN_RECV))
		return 0;
	return bpf_get_socket_cookie((void *)sk);
}

/*
 * Recursion. The kernel runs a tracing program at most once per CPU at a
 * time: if an interrupt arrives while on_set_state runs in process context
 * (connect, close, ...) and the softirqs run on its way out change another
 * socket's state, that nested call is skipped and only counted in the
 * program's recursion_misses. Under loopback load this lost ~0.1% of the
 * events here, most of them nested in the self-IPI by which
 * bpf_ringbuf_submit wakes the reader.
 *
 * So a second program, on_set_state_backup, is attached after the first
 * one. The kernel calls them one after the other for each state change and
 * counts their nesting separately, so a change nested in one of them still
 * reaches the other. The primary records, per CPU, the last changes of the
 * namespace it saw (both filter alike, first); the backup emits only
 * the changes the primary did not see, and counts them in
 * backup_covered. A change is lost only if both were busy (three nested
 * levels: not seen in practice); user space counts those as the primary's
 * recursion_misses minus backup_covered. If more than SEEN_SLOTS changes
 * run the primary between its run and the backup's for one change, the
 * backup no longer finds it and sends it again: a duplicate, harmless to a
 * consumer that applies events idempotently.
 */
#define SEEN_SLOTS 32 /* a power of two */

struct seen {
	__u64 key[SEEN_SLOTS];
	__u32 head;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct seen);
} primary_seen SEC(".maps");

/* Changes the primary missed and the backup emitted, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} backup_covered SEC(".maps");

/*
 * Identifies a state change on this CPU among the last few: the low 48 bits
 * of the sock address (kernel addresses share their top 16 bits) and the
 * two states.
 */
static __always_inline __u64 change_key(__u64 skaddr, int oldstate, int newstate)
{
	return (skaddr & 0xffffffffffffULL) | ((__u64)(oldstate & 0xff) << 56) |
	       ((__u64)(newstate & 0xff) << 48);
}

/*
 * The sock's address as a number: the verifier forbids arithmetic on the
 * trusted pointer itself, so copy the context slot that holds it.
 */
static __always_inline __u64 sk_addr(unsigned long long *ctx)
{
	__u64 addr = 0;
	bpf_probe_read_kernel(&addr, sizeof(addr), &ctx[0]);
	return addr;
}

/*
 * Whether a change is one to report: a TCP socket (the tracepoint also
 * fires for SCTP and MPTCP) of the namespace. The namespace first: most
 * calls are another pod's. sk is the tracepoint's BTF-typed argument, so
 * the namespace is read with direct loads (the verifier makes them
 * fault-safe) rather than bpf_probe_read_kernel calls: for another pod's
 * event this is the whole cost of the program.
 */
static __always_inline bool wanted(const struct sock *sk)
{
	if (sk->__sk_common.skc_net.net->ns.inum != target_netns)
		return false;
	return BPF_CORE_READ(sk, sk_protocol) == IPPROTO_TCP;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_set_state, const struct sock *sk, int oldstate, int newstate)
{
	if (!wanted(sk))
		return 0;
	__u64 skaddr = sk_addr(ctx);
	__u32 zero = 0;
	struct seen *seen = bpf_map_lookup_elem(&primary_seen, &zero);
	if (seen) {
		__u32 h = seen->head;
		seen->key[h & (SEEN_SLOTS - 1)] = change_key(skaddr, oldstate, newstate);
		seen->head = h + 1;
	}
	emit(sk, skaddr, oldstate, newstate, cookie_of(sk, oldstate, newstate));
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_set_state_backup, const struct sock *sk, int oldstate, int newstate)
{
	if (!wanted(sk))
		return 0;
	__u32 zero = 0;
	struct seen *seen = bpf_map_lookup_elem(&primary_seen, &zero);
	if (!seen)
		return 0;
	__u64 skaddr = sk_addr(ctx);
	__u64 key = change_key(skaddr, oldstate, newstate);
	/*
	 * Newest first: without nesting the primary's last record is this
	 * change, found at once. Changes nested between the two programs
	 * (a softirq's whole batch) push it further back.
	 */
	__u32 h = seen->head;
	for (__u32 i = 1; i <= SEEN_SLOTS; i++) {
		__u32 slot = (h - i) & (SEEN_SLOTS - 1);
		if (seen->key[slot] == key) {
			seen->key[slot] = 0; /* the primary saw it */
			return 0;
		}
	}
	__u64 *covered = bpf_map_lookup_elem(&backup_covered, &zero);
	if (covered)
		__sync_fetch_and_add(covered, 1);
	emit(sk, skaddr, oldstate, newstate, cookie_of(sk, oldstate, newstate));
	return 0;
}
