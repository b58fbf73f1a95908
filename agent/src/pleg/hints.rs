//! Hints: what a hint source (the eBPF ring-buffer reader) tells the PLEG. A hint never writes the
//! pod cache; it only makes the PLEG re-read one pod from the runtime (a targeted relist), or, for
//! `Resync`, everything. Corresponds to nothing in the kubelet: upstream's Evented PLEG wrote the
//! cache from runtime events, which is what this design avoids.

use crate::container::{ContainerId, PodUid};

/// What the kernel saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HintKind {
    /// A container (or sandbox) cgroup was created under the pods' parent cgroup.
    CgroupCreated,
    /// A container (or sandbox) cgroup was removed.
    CgroupRemoved,
    /// First exec in a container cgroup: the container's process started.
    Started,
    /// The container's init task exited.
    Died,
    /// The OOM killer chose a task of the container.
    OomKilled,
}

/// One fact about one pod, with the kernel's monotonic timestamp (`CLOCK_MONOTONIC`, ns) so the
/// PLEG can measure kernel → event and kernel → status latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHint {
    pub pod: PodUid,
    pub kind: HintKind,
    /// The container (or sandbox) id when the cgroup path names it.
    pub container: Option<ContainerId>,
    /// For `Died`: the exit code (`status >> 8`) and the terminating signal (`status & 0x7f`).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub kernel_time_ns: u64,
}

/// What a hint source sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hint {
    Pod(PodHint),
    /// Events may have been lost (ring-buffer reservations failed, or the reader fell behind): the
    /// PLEG must relist everything now.
    Resync { reason: String },
}
