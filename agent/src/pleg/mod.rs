//! Pod lifecycle event generator: turns what the container runtime reports into per-container
//! lifecycle events for the sync loop and keeps the timestamped pod cache current. Corresponds to the
//! kubelet's `pkg/kubelet/pleg` (`GenericPLEG`).
//!
//! The relister is the authority: only it reads the runtime and writes the pod cache. It runs in one
//! of two modes ([`PlegMode`]): `relist` (the kubelet's: every pod, every second) or `ebpf`, where
//! [`Hint`]s from the kernel make it re-read just the pod they name (a targeted relist, coalesced per
//! pod) and a slow full relist stays on as the safety net. One kernel fact is taken as it is: the
//! exit of a container's proven init (the pid the runtime reports for it) is published at once and
//! overlays the runtime's reads until the runtime reports it too. Its health and mode are exposed through a
//! cloneable [`PlegHandle`] so the sync loop can stall when the PLEG falls behind.

mod generic;
mod health;
mod hints;
mod init_processes;
mod kernel_exits;
mod latency;
mod queue;
mod records;

pub use generic::{GenericPleg, PlegOptions};
pub use health::PlegHandle;
pub use hints::{
    Hint, HintChannel, HintKind, HintSourceCheck, PlegHints, PodHint, RefreshRequester, Refreshes,
};
pub(crate) use init_processes::InitProcesses;
pub(crate) use kernel_exits::runtime_exit_code;
pub use latency::{LatencyTracker, monotonic_now_ns};

use std::time::Duration;

use crate::container::{ContainerId, PodUid, RuntimeError};

/// Capacity of the event channel (the kubelet's `plegChannelCapacity`).
pub const EVENT_CHANNEL_CAPACITY: usize = 1000;

/// The relist period of relist mode (the kubelet's `plegRelistPeriod`).
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// The period of the safety relist in ebpf mode, where hints carry the changes.
pub const DEFAULT_SAFETY_RELIST_PERIOD: Duration = Duration::from_mins(1);

/// How the PLEG learns about changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlegMode {
    /// Periodic full relists only (the kubelet's behaviour, and the fallback).
    Relist,
    /// Hints from the eBPF programs trigger targeted relists; a slow full relist is the safety net.
    Ebpf,
}

impl PlegMode {
    /// The mode's name as flags, metrics and `/healthz` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relist => "relist",
            Self::Ebpf => "ebpf",
        }
    }

    /// The full-relist period when none is configured.
    pub fn default_relist_period(self) -> Duration {
        match self {
            Self::Relist => DEFAULT_RELIST_PERIOD,
            Self::Ebpf => DEFAULT_SAFETY_RELIST_PERIOD,
        }
    }
}

impl std::fmt::Display for PlegMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long the PLEG may go without a successful relist (full or targeted) before it is unhealthy,
/// in both modes; a relist period longer than half of it raises the threshold to twice the period,
/// so an idle node with a long safety period stays healthy.
pub const RELIST_THRESHOLD: Duration = Duration::from_mins(3);

/// How long a kernel-published exit overlays a runtime that still reports the container running
/// before the overlay is withdrawn (and the runtime trusted again).
pub const KERNEL_EXIT_GRACE: Duration = Duration::from_secs(3);

/// What happened to a container (or sandbox) of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodLifecycleEventKind {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// The container went into a state the agent does not act on (created, unknown); never sent,
    /// because the runtime reports these transiently.
    ContainerChanged,
    /// The pod as a whole needs a sync (targeted relists that saw a change without a container
    /// transition).
    PodSync,
}

/// One lifecycle event: the pod it belongs to and, for container events, the container (or sandbox)
/// id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodLifecycleEvent {
    pub pod: PodUid,
    pub kind: PodLifecycleEventKind,
    pub container: Option<ContainerId>,
}

/// Why a relist step failed.
#[derive(Debug, thiserror::Error)]
pub enum PlegError {
    #[error("listing pods from the runtime")]
    ListPods {
        #[source]
        source: RuntimeError,
    },
    #[error("inspecting pod {namespace}/{name} ({uid}) in the runtime")]
    InspectPod {
        uid: PodUid,
        name: String,
        namespace: String,
        #[source]
        source: RuntimeError,
    },
    #[error("reading pod {uid}, which the pleg has not listed, from the runtime by its uid label")]
    InspectUnlistedPod {
        uid: PodUid,
        #[source]
        source: RuntimeError,
    },
}
