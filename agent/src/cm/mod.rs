//! Container management on the node: pod `QoS` classes and pod cgroups under per-QoS parents
//! (`cgroupsPerQOS`). Corresponds to the kubelet's `pkg/kubelet/cm` (pod and `QoS` container managers,
//! cgroup naming) and `pkg/apis/core/v1/helper/qos`.

mod cgroup_name;
mod pod_container_manager;
mod qos;

use std::path::PathBuf;

pub use cgroup_name::CgroupName;
pub use pod_container_manager::{PodCgroup, PodContainerManager};
pub use qos::{QosClass, parse_quantity, qos_class};

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    #[error("pod {pod} has no metadata.uid to name its cgroup after")]
    MissingUid { pod: String },
    #[error("pod uid {uid:?} cannot name a cgroup (only letters, digits and '-' are allowed)")]
    InvalidUid { uid: String },
    #[error("invalid resource quantity {value:?}")]
    InvalidQuantity { value: String },
    #[error("no cgroup hierarchy is mounted")]
    NoCgroupHierarchy,
    #[error("creating cgroup {path}")]
    Create {
        path: String,
        #[source]
        source: cgroups_rs::fs::error::Error,
    },
    #[error("removing cgroup {path}")]
    Remove {
        path: String,
        #[source]
        source: cgroups_rs::fs::error::Error,
    },
    #[error(
        "cgroup {path} still has processes {pids:?}; it can only be removed once they are gone"
    )]
    HasProcesses { path: String, pids: Vec<u64> },
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
