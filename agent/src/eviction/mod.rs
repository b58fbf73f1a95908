//! Node-pressure eviction (the kubelet's `pkg/kubelet/eviction`): thresholds on `memory.available`,
//! `nodefs.available`, `nodefs.inodesFree`, `imagefs.available`, `imagefs.inodesFree` and
//! `pid.available`; the `MemoryPressure`, `DiskPressure` and `PIDPressure` node conditions; node-level
//! reclaim before pods are evicted one per round in the kubelet's order; and admission refusing
//! pods the node cannot take under pressure.
//!
//! The [`EvictionManager`] runs every monitoring period and, for memory, as soon as the kernel
//! reports the threshold crossed. The rest of the agent reaches its state through the cloneable
//! [`EvictionHandle`]: the node status reads the conditions, admission asks it, and a pod's status
//! generation applies the eviction's phase, reason and message.

mod handle;
mod manager;
mod message;
mod notifier;
mod observe;
mod rank;
mod signals;
mod thresholds;

use std::path::PathBuf;

pub use handle::{EvictionHandle, is_critical_pod};
pub use manager::{
    ActivePod, DEFAULT_MONITORING_PERIOD, EvictionHost, EvictionManager, EvictionSettings,
    ImageReclaimer,
};
pub use message::{REASON, admission_message, eviction_message};
pub use observe::{MemorySource, NodeMemory, read_node_memory};
pub use signals::{PressureCondition, Signal, Threshold, ThresholdConfig, parse_thresholds};

/// Why an observation could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: crate::stats::StatsError,
    },
    #[error("accessing {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {}: it has no {field}", path.display())]
    MissingField { path: PathBuf, field: &'static str },
}
