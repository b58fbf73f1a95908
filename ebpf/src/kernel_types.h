/* Just the kernel types and fields the ringlet programs read. Every struct is marked
 * preserve_access_index, so clang emits CO-RE relocations and libbpf-compatible loaders (aya) fix
 * the offsets against the running kernel's BTF: the layouts here need the right field NAMES and
 * types, not the right offsets. A generated vmlinux.h would be megabytes for a dozen fields. */
#ifndef RINGLET_KERNEL_TYPES_H
#define RINGLET_KERNEL_TYPES_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
enum {
	false = 0,
	true = 1,
};
typedef int pid_t;
typedef unsigned int uid_t;

/* The uapi constants the map definitions and helpers use (values from include/uapi/linux/bpf.h). */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_CGROUP_ARRAY = 8,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

typedef struct {
	int counter;
} atomic_t;

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup_root {
	int hierarchy_id;
} __attribute__((preserve_access_index));

struct cgroup {
	int level;
	struct kernfs_node *kn;
	struct cgroup_root *root;
	/* Since 6.2: the ancestors themselves, indexed by level. */
	struct cgroup *ancestors[];
} __attribute__((preserve_access_index));

/* Before 6.2 the cgroup kept its ancestors' ids instead (the kn ids); the ___ suffix makes this a
 * CO-RE flavour of struct cgroup that only the bpf_core_field_exists() branch uses. */
struct cgroup___ancestor_ids {
	int level;
	__u64 ancestor_ids[];
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

struct pid_namespace;

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[];
} __attribute__((preserve_access_index));

struct signal_struct {
	atomic_t live;
} __attribute__((preserve_access_index));

struct task_struct {
	int exit_code;
	pid_t pid;
	pid_t tgid;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	struct css_set *cgroups;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

struct linux_binprm;

#endif
