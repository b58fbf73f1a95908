/* ringlet's kernel side: turns container lifecycle facts (cgroup created/removed, first exec, exit
 * of the container's init task, OOM victim) into records on one ring buffer, for cgroups below the
 * pods' parent cgroup only. Everything else on the node is rejected after one cheap check, so the
 * programs cost next to nothing on unrelated activity. Program and map names stay within the
 * kernel's 15 characters so `bpftool prog show` and `bpftool map` print them whole. */
#include "kernel_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "ringlet_event.h"

/* bpf_probe_read_kernel_str, bpf_current_task_under_cgroup and tp_btf need a GPL-compatible
 * program. */
char LICENSE[] SEC("license") = "GPL";

/* The pods' parent cgroup in the cgroup2 hierarchy: its id (kernfs inode) and depth below the root.
 * Set by the loader before the programs are verified, so they are constants to the verifier. */
const volatile __u64 pods_cgroup_id = 0;
const volatile __u32 pods_cgroup_level = 0;

/* Default size; the loader overrides it (a power of two, at least one page). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} ringlet_events SEC(".maps");

/* Reservations that failed because the ring buffer was full: the agent relists everything when it
 * moves. Per CPU so the programs never contend on it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} ringlet_drops SEC(".maps");

/* Slot 0 holds the pods' parent cgroup, for bpf_current_task_under_cgroup() in the programs that
 * run in the task's own context (exec, exit): one lookup decides. */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ringlet_pods_cg SEC(".maps");

/* cgroup id -> tgid of the first process that exec'd in it (0 once that process was reported dead).
 * Dedupes "started" and identifies the container's init when it is not pid 1 of its namespace
 * (pods sharing one pid namespace). Cleared on rmdir; LRU so a missed rmdir cannot fill it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u32);
} ringlet_started SEC(".maps");

static __always_inline void count_drop(void)
{
	__u32 zero = 0;
	__u64 *drops = bpf_map_lookup_elem(&ringlet_drops, &zero);

	/* Atomic: tracing programs run with only migration disabled, so two can interleave here. */
	if (drops)
		__sync_fetch_and_add(drops, 1);
}

static __always_inline struct ringlet_event *reserve(__u32 kind, __u64 cgroup_id)
{
	struct ringlet_event *event = bpf_ringbuf_reserve(&ringlet_events, sizeof(*event), 0);

	if (!event) {
		count_drop();
		return 0;
	}
	event->kind = kind;
	event->tgid = 0;
	event->cgroup_id = cgroup_id;
	event->ktime_ns = bpf_ktime_get_ns();
	event->pid = 0;
	event->exit_status = 0;
	event->path[0] = 0;
	return event;
}

/* True when cgrp is a strict descendant of the pods' parent cgroup (cgroup2 only). */
static __always_inline bool under_pods(struct cgroup *cgrp)
{
	__u32 parent_level = pods_cgroup_level;
	int level = BPF_CORE_READ(cgrp, level);
	__u64 ancestor_id = 0;

	if (level <= (int)parent_level)
		return false;
	if (bpf_core_field_exists(struct cgroup, ancestors)) {
		struct cgroup *ancestor = 0;

		bpf_core_read(&ancestor, sizeof(ancestor), &cgrp->ancestors[parent_level]);
		if (!ancestor)
			return false;
		ancestor_id = BPF_CORE_READ(ancestor, kn, id);
	} else {
		struct cgroup___ancestor_ids *old = (void *)cgrp;

		bpf_core_read(&ancestor_id, sizeof(ancestor_id), &old->ancestor_ids[parent_level]);
	}
	return ancestor_id == pods_cgroup_id;
}

/* cgroup_mkdir/rmdir fire once per hierarchy; hierarchy 0 is cgroup2. */
static __always_inline int cgroup_event(__u32 kind, struct cgroup *cgrp, const char *path)
{
	struct ringlet_event *event;
	__u64 id;

	if (BPF_CORE_READ(cgrp, root, hierarchy_id) != 0 || !under_pods(cgrp))
		return 0;
	id = BPF_CORE_READ(cgrp, kn, id);
	if (kind == RINGLET_EVENT_CGROUP_RMDIR)
		bpf_map_delete_elem(&ringlet_started, &id);
	event = reserve(kind, id);
	if (!event)
		return 0;
	bpf_probe_read_kernel_str(event->path, sizeof(event->path), path);
	bpf_ringbuf_submit(event, 0);
	return 0;
}

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(ringlet_mkdir, struct cgroup *cgrp, const char *path)
{
	return cgroup_event(RINGLET_EVENT_CGROUP_MKDIR, cgrp, path);
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(ringlet_rmdir, struct cgroup *cgrp, const char *path)
{
	return cgroup_event(RINGLET_EVENT_CGROUP_RMDIR, cgrp, path);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(ringlet_exec, struct task_struct *task)
{
	struct ringlet_event *event;
	__u64 cgroup_id;
	__u64 pid_tgid;
	__u32 tgid;

	if (bpf_current_task_under_cgroup(&ringlet_pods_cg, 0) != 1)
		return 0;
	cgroup_id = bpf_get_current_cgroup_id();
	pid_tgid = bpf_get_current_pid_tgid();
	tgid = pid_tgid >> 32;
	/* Fails with -EEXIST unless this is the cgroup's first exec. */
	if (bpf_map_update_elem(&ringlet_started, &cgroup_id, &tgid, BPF_NOEXIST) != 0)
		return 0;
	event = reserve(RINGLET_EVENT_EXEC, cgroup_id);
	if (!event)
		return 0;
	event->tgid = tgid;
	event->pid = (__u32)pid_tgid;
	bpf_ringbuf_submit(event, 0);
	return 0;
}

/* The task's pid as seen in its own (innermost) pid namespace. */
static __always_inline int pid_in_own_namespace(struct task_struct *task)
{
	struct pid *pid = BPF_CORE_READ(task, thread_pid);
	unsigned int level = BPF_CORE_READ(pid, level);
	int nr = 0;

	bpf_core_read(&nr, sizeof(nr), &pid->numbers[level].nr);
	return nr;
}

/* Recent kernels pass a group_dead flag to sched_process_exit, older ones do not; signal->live
 * (decremented before the tracepoint fires) says the same on every kernel. The container's init is
 * the first process that exec'd in the cgroup, or pid 1 of its own pid namespace (when the agent
 * started after the container). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(ringlet_exit, struct task_struct *task)
{
	struct ringlet_event *event;
	__u64 cgroup_id;
	__u32 tgid;
	__u32 *first_tgid;

	if (bpf_current_task_under_cgroup(&ringlet_pods_cg, 0) != 1)
		return 0;
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	cgroup_id = bpf_get_current_cgroup_id();
	tgid = BPF_CORE_READ(task, tgid);
	first_tgid = bpf_map_lookup_elem(&ringlet_started, &cgroup_id);
	if (first_tgid && *first_tgid == tgid) {
		*first_tgid = 0;
	} else if (pid_in_own_namespace(BPF_CORE_READ(task, group_leader)) != 1) {
		return 0;
	}
	event = reserve(RINGLET_EVENT_EXIT, cgroup_id);
	if (!event)
		return 0;
	event->tgid = tgid;
	event->pid = BPF_CORE_READ(task, pid);
	event->exit_status = BPF_CORE_READ(task, exit_code);
	bpf_ringbuf_submit(event, 0);
	return 0;
}

/* Runs in the context of the task that ran into the limit, which need not be the victim: use the
 * victim's own cgroup2 cgroup. The (task, uid) signature exists since 6.8; older kernels pass only a
 * pid, and the loader then goes without this program. */
SEC("tp_btf/mark_victim")
int BPF_PROG(ringlet_oom, struct task_struct *task)
{
	struct cgroup *cgrp = BPF_CORE_READ(task, cgroups, dfl_cgrp);
	struct ringlet_event *event;

	if (!cgrp || !under_pods(cgrp))
		return 0;
	event = reserve(RINGLET_EVENT_OOM_VICTIM, BPF_CORE_READ(cgrp, kn, id));
	if (!event)
		return 0;
	event->tgid = BPF_CORE_READ(task, tgid);
	event->pid = BPF_CORE_READ(task, pid);
	bpf_ringbuf_submit(event, 0);
	return 0;
}
