//! Resource usage of the node, its pods and their containers, read from cgroups (v1 and v2),
//! procfs and the filesystems, served as the Summary API (`/stats/summary`) and as the
//! `/metrics/resource` exposition metrics-server scrapes. Corresponds to the kubelet's
//! `pkg/kubelet/stats` (the stats provider), `pkg/kubelet/server/stats` (the Summary API types and
//! handler data) and `pkg/kubelet/metrics/collectors/resource_metrics.go`.
//!
//! Everything here is blocking file I/O (a handful of small reads per cgroup); callers on the async
//! core run [`StatsProvider::summary`] with `spawn_blocking`.

mod cgroup;
mod host;
mod provider;
mod resource_metrics;
mod types;

use std::io;
use std::path::PathBuf;

pub use cgroup::CgroupLayout;
pub(crate) use host::{fs_usage, read_key_values};
pub use provider::{
    Clock, ContainerStatsInput, PodStatsInput, StatsProvider, StatsSettings, SystemClock,
    timestamp_from_unix_nanos,
};
pub use resource_metrics::{RESOURCE_METRICS_CONTENT_TYPE, render_resource_metrics};
pub use types::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, RlimitStats, RuntimeStats, SYSTEM_CONTAINER_PODS, Summary, SwapStats,
};

/// Why a statistic could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {}: expected {what}, found {value:?}", path.display())]
    Parse {
        path: PathBuf,
        what: &'static str,
        value: String,
    },
    #[error("reading {}: it has no {field} field", path.display())]
    MissingField { path: PathBuf, field: &'static str },
    #[error("getting the filesystem usage of {}", path.display())]
    Statvfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "finding cgroup hierarchies: neither v1 cpuacct and memory controllers nor cgroup2 is mounted"
    )]
    NoCgroupHierarchy,
}

impl StatsError {
    /// Whether the file is gone, as happens when a container exits and its cgroup is removed
    /// between listing and reading (a removed cgroup's files answer `ENODEV`).
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Read { source, .. } | Self::Statvfs { source, .. } => {
                source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ENODEV)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests;
