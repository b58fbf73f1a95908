//! Container management on the node: pod `QoS` classes, pod cgroups under per-QoS parents
//! (`cgroupsPerQOS`) with their process limit (`podPidsLimit`), node allocatable enforcement on
//! the pods' and the reserved cgroups, and the CPU shares and CFS quota arithmetic. Corresponds to
//! the kubelet's `pkg/kubelet/cm` (pod, `QoS` and node container managers, cgroup naming) and
//! `pkg/apis/core/v1/helper/qos`.

mod cgroup_name;
mod node_allocatable;
mod pod_container_manager;
mod qos;
mod resource_config;

use std::path::PathBuf;

pub use cgroup_name::CgroupName;
pub use node_allocatable::{
    NodeAllocatablePlan, NodeResources, Reservation, ReservedCgroup, enforce_node_allocatable,
};
pub use pod_container_manager::{PodCgroup, PodContainerManager};
pub use qos::{QosClass, parse_quantity, qos_class};
pub use resource_config::{ResourceConfig, milli_cpu_to_quota, milli_cpu_to_shares};

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
    #[error("setting the {setting} of cgroup {path}")]
    Update {
        path: String,
        setting: &'static str,
        #[source]
        source: cgroups_rs::fs::error::Error,
    },
    #[error("cgroup {path} has no {controller} controller to limit")]
    NoController {
        path: String,
        controller: &'static str,
    },
    #[error("{path:?} cgroup does not exist")]
    CgroupMissing { path: String },
    #[error("invalid Node Allocatable configuration. {problems}")]
    InvalidNodeAllocatable { problems: String },
    #[error("cgroup work stopped: {0}")]
    Join(String),
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
