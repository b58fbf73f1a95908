//! The Summary API (`stats.k8s.io/v1alpha1`, served on `/stats/summary`): the JSON field names of
//! the kubelet's `k8s.io/kubelet/pkg/apis/stats/v1alpha1`. Optional values are left out when absent,
//! as the kubelet's `omitempty` does; times are `metav1.Time` (RFC 3339, whole seconds on the wire,
//! full precision in memory for the metric timestamps).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// Name of the system container that covers every pod (the kubelet's `SystemContainerPods`).
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

/// Node and pod stats, the body of `/stats/summary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// Node-level stats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// When the node's aggregate stats started (boot time).
    pub start_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the agent's root directory (`nodefs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// Stats of the container runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// The filesystem holding images (`imagefs`); `usedBytes` counts image bytes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

/// Process limits of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    pub time: Time,
    /// `kernel.pid_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    /// Processes (threads) on the node now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

/// Stats of one pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: Time,
    pub containers: Vec<ContainerStats>,
    /// Usage of the pod cgroup (every container plus the sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(
        rename = "ephemeral-storage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral_storage: Option<FsStats>,
}

/// Which pod a [`PodStats`] is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// Stats of one container (or a system container such as `pods`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The container's writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The container's log files; `usedBytes` is their size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// Network traffic: the default interface (`eth0`) inline, every interface in `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStats {
    pub time: Time,
    /// `eth0`'s counters; only an empty name when the node has no `eth0`, as with the kubelet.
    #[serde(flatten)]
    pub default_interface: InterfaceStats,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// Cumulative counters of one network interface.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// CPU usage of a cgroup or the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    /// Average usage (core-nanoseconds per second) since the previous sample; absent on the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative usage of all cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage of a cgroup or the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    /// Limit minus working set; absent without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the kernel cannot simply drop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// Swap usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    pub time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// Usage of a filesystem, or of one consumer's share of it (`usedBytes`, `inodesUsed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}
