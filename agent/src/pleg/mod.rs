//! Pod lifecycle event generator: turns what the container runtime reports into per-container
//! lifecycle events for the sync loop and keeps the timestamped pod cache current. Corresponds to the
//! kubelet's `pkg/kubelet/pleg` (`GenericPLEG`, relist mode).
//!
//! The relister is the authority: only it reads the runtime and writes the pod cache. Its health is
//! exposed through a cloneable [`PlegHandle`] so the sync loop can stall when the PLEG falls behind.

mod generic;
mod hints;
mod health;

pub use generic::GenericPleg;
pub use health::PlegHandle;
pub use hints::{Hint, HintKind, PodHint};

use std::time::Duration;

use crate::container::{ContainerId, PodUid, RuntimeError};

/// Capacity of the event channel (the kubelet's `plegChannelCapacity`).
pub const EVENT_CHANNEL_CAPACITY: usize = 1000;

/// The relist period of relist mode (the kubelet's `plegRelistPeriod`).
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// How long the PLEG may go without a successful relist before it is unhealthy (relist mode).
pub const RELIST_THRESHOLD: Duration = Duration::from_mins(3);

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
}
