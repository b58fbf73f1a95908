/* The one ABI between the BPF programs and the agent: the record each program writes into the ring
 * buffer. The Rust side (src/lib.rs) mirrors it and checks the mirror at compile time against the
 * layout that build.rs has clang compute from this file, so a change here that is not made there
 * fails the build. Only fixed-width types, no implicit padding. */
#ifndef RINGLET_EVENT_H
#define RINGLET_EVENT_H

/* Long enough for the systemd driver's container path
 * (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope,
 * about 170 bytes); the cgroupfs path is about 125. */
#define RINGLET_PATH_LEN 192

enum ringlet_event_kind {
	RINGLET_EVENT_CGROUP_MKDIR = 1,
	RINGLET_EVENT_CGROUP_RMDIR = 2,
	RINGLET_EVENT_EXEC = 3,
	RINGLET_EVENT_EXIT = 4,
	RINGLET_EVENT_OOM_VICTIM = 5,
};

struct ringlet_event {
	__u32 kind;        /* enum ringlet_event_kind */
	__u32 tgid;        /* process id in the initial pid namespace (0 for cgroup events) */
	__u64 cgroup_id;   /* cgroup2 id (= kernfs inode number of the cgroup directory) */
	__u64 ktime_ns;    /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 pid;         /* thread id in the initial pid namespace (0 for cgroup events) */
	__u32 exit_status; /* EXIT: task->exit_code, i.e. code << 8 | signal (0x80: core dumped) */
	char path[RINGLET_PATH_LEN]; /* MKDIR/RMDIR: path from the hierarchy root, NUL-terminated */
};

#endif
