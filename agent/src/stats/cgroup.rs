//! CPU and memory usage of one cgroup, read from the v1 `cpuacct` and `memory` controllers or from
//! the unified v2 tree (what cAdvisor reads for the kubelet in `pkg/kubelet/stats`).

use std::path::{Component, Path, PathBuf};

use super::StatsError;
use super::host::{read_key_values, read_to_string};

/// Above this a memory limit means "unlimited": the kernel rounds the v1 "no limit" value down to a
/// page multiple, so it is not exactly `i64::MAX` (the kubelet uses the same threshold).
const UNLIMITED_MEMORY: u64 = 1 << 62;

/// Where the controllers the stats come from are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v1, also on hybrid hosts whose cgroup2 mount has no controllers.
    V1 {
        /// Mount point of the hierarchy with the `cpuacct` controller.
        cpuacct: PathBuf,
        /// Mount point of the hierarchy with the `memory` controller.
        memory: PathBuf,
    },
    /// The unified cgroup v2 hierarchy.
    V2 {
        /// Its mount point, usually `/sys/fs/cgroup`.
        root: PathBuf,
    },
}

impl CgroupLayout {
    /// The host's layout, from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self, StatsError> {
        let text = read_to_string(Path::new(crate::mountinfo::PATH))?;
        Self::from_mountinfo(&text)
    }

    /// The layout a mount table describes: v1 when both the `cpuacct` and `memory` controllers are
    /// mounted as v1 hierarchies, else the cgroup2 mount.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Self, StatsError> {
        let mounts = crate::mountinfo::parse(mountinfo);
        let first = |wanted: &dyn Fn(&crate::mountinfo::Mount) -> bool| {
            mounts
                .iter()
                .find(|mount| wanted(mount))
                .map(|mount| mount.mount_point.clone())
        };
        let cpuacct = first(&|mount| mount.is_cgroup_v1_with("cpuacct"));
        let memory = first(&|mount| mount.is_cgroup_v1_with("memory"));
        let unified = first(&crate::mountinfo::Mount::is_cgroup2);
        match (cpuacct, memory, unified) {
            (Some(cpuacct), Some(memory), _) => Ok(Self::V1 { cpuacct, memory }),
            (_, _, Some(root)) => Ok(Self::V2 { root }),
            _ => Err(StatsError::NoCgroupHierarchy),
        }
    }

    /// The files [`cpu_usage_ns`](Self::cpu_usage_ns) and [`memory`](Self::memory) read for a cgroup.
    pub(super) fn files(&self, cgroup: &str) -> Vec<PathBuf> {
        match self {
            Self::V1 { cpuacct, memory } => {
                let memory = cgroup_dir(memory, cgroup);
                vec![
                    cgroup_dir(cpuacct, cgroup).join("cpuacct.usage"),
                    memory.join("memory.usage_in_bytes"),
                    memory.join("memory.stat"),
                    memory.join("memory.limit_in_bytes"),
                ]
            }
            Self::V2 { root } => {
                let dir = cgroup_dir(root, cgroup);
                ["cpu.stat", "memory.current", "memory.stat", "memory.max"]
                    .iter()
                    .map(|file| dir.join(file))
                    .collect()
            }
        }
    }

    /// Cumulative CPU time of the cgroup in nanoseconds.
    pub(super) fn cpu_usage_ns(&self, cgroup: &str) -> Result<u64, StatsError> {
        match self {
            Self::V1 { cpuacct, .. } => {
                read_u64(&cgroup_dir(cpuacct, cgroup).join("cpuacct.usage"))
            }
            Self::V2 { root } => {
                let path = cgroup_dir(root, cgroup).join("cpu.stat");
                let stat = read_key_values(&path)?;
                let usec = required(&stat, "usage_usec", &path)?;
                Ok(usec.saturating_mul(1000))
            }
        }
    }

    /// Memory usage of the cgroup.
    pub(super) fn memory(&self, cgroup: &str) -> Result<MemorySample, StatsError> {
        match self {
            Self::V1 { memory, .. } => {
                let dir = cgroup_dir(memory, cgroup);
                let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
                let stat_path = dir.join("memory.stat");
                let stat = read_key_values(&stat_path)?;
                let limit = read_u64(&dir.join("memory.limit_in_bytes"))?;
                Ok(MemorySample {
                    usage,
                    inactive_file: required(&stat, "total_inactive_file", &stat_path)?,
                    rss: required(&stat, "total_rss", &stat_path)?,
                    page_faults: required(&stat, "total_pgfault", &stat_path)?,
                    major_page_faults: required(&stat, "total_pgmajfault", &stat_path)?,
                    limit: (limit <= UNLIMITED_MEMORY).then_some(limit),
                })
            }
            Self::V2 { root } => {
                let dir = cgroup_dir(root, cgroup);
                let usage = read_u64(&dir.join("memory.current"))?;
                let stat_path = dir.join("memory.stat");
                let stat = read_key_values(&stat_path)?;
                let max_path = dir.join("memory.max");
                let max = read_to_string(&max_path)?;
                let limit = match max.trim() {
                    "max" => None,
                    value => Some(parse_u64(value, &max_path)?),
                };
                Ok(MemorySample {
                    usage,
                    inactive_file: required(&stat, "inactive_file", &stat_path)?,
                    rss: required(&stat, "anon", &stat_path)?,
                    page_faults: required(&stat, "pgfault", &stat_path)?,
                    major_page_faults: required(&stat, "pgmajfault", &stat_path)?,
                    limit: limit.filter(|limit| *limit <= UNLIMITED_MEMORY),
                })
            }
        }
    }
}

/// Memory figures of one cgroup (or the node) at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MemorySample {
    pub usage: u64,
    pub inactive_file: u64,
    pub rss: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The memory limit, `None` when unlimited.
    pub limit: Option<u64>,
}

impl MemorySample {
    /// Usage minus inactive file pages, floored at zero (cAdvisor's working set).
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    /// What is left below the limit.
    pub fn available(&self) -> Option<u64> {
        self.limit
            .map(|limit| limit.saturating_sub(self.working_set()))
    }
}

/// The cgroup's directory under a hierarchy mount. Only normal components of `cgroup` are used, so
/// the path cannot leave the hierarchy.
pub(super) fn cgroup_dir(mount: &Path, cgroup: &str) -> PathBuf {
    let mut dir = mount.to_path_buf();
    for component in Path::new(cgroup).components() {
        if let Component::Normal(part) = component {
            dir.push(part);
        }
    }
    dir
}

fn read_u64(path: &Path) -> Result<u64, StatsError> {
    parse_u64(read_to_string(path)?.trim(), path)
}

pub(super) fn parse_u64(value: &str, path: &Path) -> Result<u64, StatsError> {
    value.parse().map_err(|_| StatsError::Parse {
        path: path.to_owned(),
        what: "an unsigned integer",
        value: value.to_owned(),
    })
}

pub(super) fn required(
    values: &std::collections::HashMap<String, u64>,
    key: &'static str,
    path: &Path,
) -> Result<u64, StatsError> {
    values
        .get(key)
        .copied()
        .ok_or_else(|| StatsError::MissingField {
            path: path.to_owned(),
            field: key,
        })
}
