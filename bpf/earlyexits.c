// SPDX-License-Identifier: GPL-2.0
/*
 * earlyexits: how the pod's other containers' processes ended, from
 * draind's first milliseconds on, before procs.c is live.
 *
 *   raw_tp/signal_generate  SIGCHLD raised by a process of another container
 *                           of draind's pod (its cgroup v2 below the pod's,
 *                           not below draind's own container's): the exit
 *                           as its parent will read it, into exits[]
 *   raw_tp/signal_generate  whoami: run once by draind through
 *   (whoami)                BPF_PROG_TEST_RUN, in its own context: its
 *                           cgroup's ancestors, so that it can tell which
 *                           cgroup is its pod's (the parent of its own)
 *
 * Why: procs.c reads kernel structs (CO-RE), so loading it waits for the
 * kernel's BTF to be decoded, a tenth of a second and more; an app container
 * started beside draind may run and leave in that time. This object reads
 * no kernel struct: helpers, and the siginfo, whose layout is uapi
 * (include/uapi/asm-generic/siginfo.h), so it loads without the kernel's
 * BTF, in a millisecond.
 *
 * The exiting process raises its SIGCHLD itself (exit_notify ->
 * do_notify_parent runs in its context), so the current task's cgroup is the
 * exiting process's. A container's first process, PID 1 of its PID
 * namespace, raises its SIGCHLD only after every other process of that
 * namespace is gone (exit_notify -> forget_original_parent ->
 * zap_pid_ns_processes comes first): a container's last record is its main
 * process's exit.
 *
 * The pod (its cgroup and level, and draind's own container's cgroup) is in
 * config[], written by internal/probes/earlyexits_linux.go after whoami ran;
 * until then nothing is recorded. The records go through a ring buffer;
 * those it has no room for are counted in lost.
 *
 * Kernel requirements: raw tracepoints (4.17); bpf_get_current_ancestor_cgroup_id
 * (5.7); the BPF ring buffer (5.8); BPF_PROG_TEST_RUN of raw tracepoints
 * (5.10). The ids are cgroup v2's:
 * on a cgroup v1 node every task is in v2's root and nothing is recorded.
 */
#include "base.h"

#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

struct bpf_raw_tracepoint_args {
	__u64 args[0];
};

#define SIGCHLD 17
#define MAX_LEVELS 16

/* The records, decoded by hand in internal/probes/earlyexits_linux.go
 * (56 bytes, little-endian on bpfel): change both together. */
struct early_exit {
	__u64 ts_ns;     /* bpf_ktime_get_ns() when SIGCHLD was raised */
	__u64 container; /* the cgroup id below the pod's it came from */
	__u64 cgroup;    /* the process's own cgroup id */
	__u32 tgid;      /* the process (global pid) */
	__s32 code;      /* si_code: CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3... */
	__s32 status;    /* si_status: the exit code, or the signal */
	__u32 pad;
	char comm[16];
};

/* config[0]: the pod's level; [1]: the pod's cgroup id; [2]: draind's own
 * container's cgroup id (at level + 1). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 3);
} config SEC(".maps");

/* A pod's start-up raises a few dozen SIGCHLDs (the runtime's helpers,
 * short tasks): 16 KiB holds about 290 records. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16384);
} exits SEC(".maps");

/* whoami's answer: [0..MAX_LEVELS) the ancestors of draind's cgroup by
 * level (0 past its own), [MAX_LEVELS] its own cgroup's id. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, MAX_LEVELS + 1);
} self SEC(".maps");

/* Records the ring had no room for. */
__u64 lost = 0;

/* Makes clang emit struct early_exit for bpf2go's -type. */
struct early_exit *unused_early_exit __attribute__((unused));

/* The uapi siginfo's start on 64-bit: si_signo, si_errno, si_code, a pad,
 * then _sigchld's pid, uid, status. */
struct sigchld_info {
	int signo;
	int errno_;
	int code;
	int pad;
	int pid;
	unsigned int uid;
	int status;
};

static __always_inline __u64 config_at(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&config, &i);
	return v ? *v : 0;
}

SEC("raw_tp/signal_generate")
int early_sigchld(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(int sig, struct kernel_siginfo *info, struct task_struct *task, int group, int result) */
	if ((int)ctx->args[0] != SIGCHLD)
		return 0;
	__u64 info = ctx->args[1];
	/* SEND_SIG_NOINFO (0) and SEND_SIG_PRIV (1) carry no siginfo. */
	if (info <= 1)
		return 0;
	__u64 level = config_at(0), pod = config_at(1), own = config_at(2);
	if (pod == 0 || level >= MAX_LEVELS)
		return 0;
	if (bpf_get_current_ancestor_cgroup_id((int)level) != pod)
		return 0;
	__u64 container = bpf_get_current_ancestor_cgroup_id((int)level + 1);
	if (container == 0 || container == own)
		return 0;
	struct sigchld_info si = {};
	if (bpf_probe_read_kernel(&si, sizeof(si), (void *)info) != 0)
		return 0;
	struct early_exit *e = bpf_ringbuf_reserve(&exits, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&lost, 1);
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->container = container;
	e->cgroup = bpf_get_current_cgroup_id();
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->code = si.code;
	e->status = si.status;
	e->pad = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("raw_tp/signal_generate")
int early_whoami(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 own = bpf_get_current_cgroup_id();
	__u32 k = MAX_LEVELS;
	bpf_map_update_elem(&self, &k, &own, 0);
	for (__u32 l = 0; l < MAX_LEVELS; l++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id((int)l);
		bpf_map_update_elem(&self, &l, &id, 0);
		if (id == own || id == 0)
			break;
	}
	return 0;
}
