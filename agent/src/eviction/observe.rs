//! What the eviction manager observes (the kubelet's `makeSignalObservations` and the pod usage
//! helpers in `pkg/kubelet/eviction/helpers.go`): `memory.available` as the node's memory capacity
//! minus the root memory cgroup's working set (usage minus inactive file pages, as cAdvisor
//! reports it for the kubelet), the node and image filesystems and the process limit from the
//! Summary API, and each pod's usage.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::EvictionError;
use super::message::ContainerUsage;
use super::rank::PodUsage;
use super::signals::Signal;
use super::thresholds::{Observation, Observations};
use crate::stats::{CgroupLayout, FsStats, PodStatsInput, Summary, read_key_values};

/// Where the node's memory figures are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySource {
    /// `/proc/meminfo`, for `MemTotal` (and the usage without a v1 root memory cgroup).
    pub meminfo: PathBuf,
    /// The v1 memory hierarchy's root directory; `None` on cgroup v2, where the root cgroup has
    /// no usage file and meminfo stands in.
    pub root_memory_cgroup: Option<PathBuf>,
}

impl MemorySource {
    /// The host's sources for a cgroup layout.
    pub fn for_layout(layout: &CgroupLayout) -> Self {
        Self {
            meminfo: PathBuf::from("/proc/meminfo"),
            root_memory_cgroup: match layout {
                CgroupLayout::V1 { memory, .. } => Some(memory.clone()),
                CgroupLayout::V2 { .. } => None,
            },
        }
    }
}

/// The node's memory as the kubelet sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMemory {
    pub capacity: u64,
    /// Usage including the page cache.
    pub usage: u64,
    pub inactive_file: u64,
}

impl NodeMemory {
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    pub fn observation(&self) -> Observation {
        let capacity = i64::try_from(self.capacity).unwrap_or(i64::MAX);
        let working_set = i64::try_from(self.working_set()).unwrap_or(i64::MAX);
        Observation {
            available: capacity.saturating_sub(working_set).max(0),
            capacity,
        }
    }
}

fn read_error(path: &Path, source: crate::stats::StatsError) -> EvictionError {
    EvictionError::Read {
        path: path.to_owned(),
        source,
    }
}

fn field(
    values: &HashMap<String, u64>,
    key: &'static str,
    path: &Path,
) -> Result<u64, EvictionError> {
    values
        .get(key)
        .copied()
        .ok_or_else(|| EvictionError::MissingField {
            path: path.to_owned(),
            field: key,
        })
}

/// Reads the node's memory. Blocking.
pub fn read_node_memory(source: &MemorySource) -> Result<NodeMemory, EvictionError> {
    let meminfo = read_key_values(&source.meminfo).map_err(|e| read_error(&source.meminfo, e))?;
    let capacity = field(&meminfo, "MemTotal", &source.meminfo)?;
    let Some(root) = &source.root_memory_cgroup else {
        return Ok(NodeMemory {
            capacity,
            usage: capacity.saturating_sub(field(&meminfo, "MemFree", &source.meminfo)?),
            inactive_file: field(&meminfo, "Inactive(file)", &source.meminfo)?,
        });
    };
    let usage_path = root.join("memory.usage_in_bytes");
    let usage = std::fs::read_to_string(&usage_path)
        .map_err(|source| EvictionError::Io {
            path: usage_path.clone(),
            source,
        })?
        .trim()
        .parse()
        .map_err(|_| EvictionError::MissingField {
            path: usage_path.clone(),
            field: "a byte count",
        })?;
    let stat_path = root.join("memory.stat");
    let stat = read_key_values(&stat_path).map_err(|e| read_error(&stat_path, e))?;
    Ok(NodeMemory {
        capacity,
        usage,
        inactive_file: field(&stat, "total_inactive_file", &stat_path)?,
    })
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn fs_observations(fs: &FsStats, bytes: Signal, inodes: Signal, into: &mut Observations) {
    if let (Some(available), Some(capacity)) = (fs.available_bytes, fs.capacity_bytes) {
        into.insert(
            bytes,
            Observation {
                available: to_i64(available),
                capacity: to_i64(capacity),
            },
        );
    }
    if let (Some(free), Some(total)) = (fs.inodes_free, fs.inodes) {
        into.insert(
            inodes,
            Observation {
                available: to_i64(free),
                capacity: to_i64(total),
            },
        );
    }
}

/// Every signal that could be observed: memory from `memory`, the rest from the summary (image
/// filesystem signals fall back to the node filesystem's when the runtime reports none).
pub fn observations(memory: Option<&NodeMemory>, summary: Option<&Summary>) -> Observations {
    let mut observed = BTreeMap::new();
    if let Some(memory) = memory {
        observed.insert(Signal::MemoryAvailable, memory.observation());
    }
    let Some(node) = summary.map(|s| &s.node) else {
        return observed;
    };
    if let Some(fs) = &node.fs {
        fs_observations(
            fs,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
            &mut observed,
        );
    }
    match node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()) {
        Some(image_fs) => fs_observations(
            image_fs,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
            &mut observed,
        ),
        None => {
            for (from, to) in [
                (Signal::NodeFsAvailable, Signal::ImageFsAvailable),
                (Signal::NodeFsInodesFree, Signal::ImageFsInodesFree),
            ] {
                if let Some(o) = observed.get(&from).copied() {
                    observed.insert(to, o);
                }
            }
        }
    }
    if let Some(rlimit) = &node.rlimit
        && let (Some(max), Some(current)) = (rlimit.maxpid, rlimit.curproc)
    {
        observed.insert(
            Signal::PidAvailable,
            Observation {
                available: max.saturating_sub(current),
                capacity: max,
            },
        );
    }
    observed
}

/// A pod's usage and its containers', from the summary (keyed by pod UID).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsageReport {
    pub usage: PodUsage,
    pub containers: Vec<ContainerUsage>,
}

/// Each pod's usage from the summary, with its process count read from its cgroup.
pub fn pod_usage(
    summary: &Summary,
    inputs: &[PodStatsInput],
    layout: &CgroupLayout,
) -> HashMap<String, PodUsageReport> {
    summary
        .pods
        .iter()
        .map(|pod| {
            let containers: Vec<ContainerUsage> = pod
                .containers
                .iter()
                .map(|c| ContainerUsage {
                    name: c.name.clone(),
                    memory: c
                        .memory
                        .as_ref()
                        .and_then(|m| m.working_set_bytes)
                        .map(to_i64),
                    disk: c
                        .logs
                        .as_ref()
                        .and_then(|l| l.used_bytes)
                        .map(|logs| {
                            logs + c.rootfs.as_ref().and_then(|r| r.used_bytes).unwrap_or(0)
                        })
                        .map(to_i64),
                })
                .collect();
            let ephemeral = pod.ephemeral_storage.as_ref();
            let processes = inputs
                .iter()
                .find(|input| input.uid.as_str() == pod.pod_ref.uid)
                .map_or(0, |input| process_count(layout, &input.cgroup));
            let usage = PodUsage {
                memory: containers.iter().filter_map(|c| c.memory).sum(),
                ephemeral_storage: ephemeral.and_then(|e| e.used_bytes).map_or(0, to_i64),
                inodes: ephemeral.and_then(|e| e.inodes_used).map_or(0, to_i64),
                processes,
            };
            (
                pod.pod_ref.uid.clone(),
                PodUsageReport { usage, containers },
            )
        })
        .collect()
}

/// Processes in a cgroup and its children (`cgroup.procs` of each), 0 when unreadable.
fn process_count(layout: &CgroupLayout, cgroup: &str) -> i64 {
    let mount = match layout {
        CgroupLayout::V1 { memory, .. } => memory,
        CgroupLayout::V2 { root } => root,
    };
    let dir = mount.join(cgroup.trim_start_matches('/'));
    let mut count = 0;
    let mut pending = vec![dir];
    while let Some(dir) = pending.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            count += procs.lines().count();
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            pending.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn memory_available_is_capacity_minus_the_root_cgroups_working_set() {
        let dir = tempfile::tempdir().unwrap();
        let meminfo = dir.path().join("meminfo");
        std::fs::write(
            &meminfo,
            "MemTotal: 1000 kB\nMemFree: 100 kB\nInactive(file): 10 kB\n",
        )
        .unwrap();
        let root = dir.path().join("memory");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("memory.usage_in_bytes"), "614400\n").unwrap();
        std::fs::write(
            root.join("memory.stat"),
            "cache 1\ntotal_inactive_file 204800\n",
        )
        .unwrap();
        let v1 = read_node_memory(&MemorySource {
            meminfo: meminfo.clone(),
            root_memory_cgroup: Some(root),
        })
        .unwrap();
        assert_eq!(v1.working_set(), 409_600);
        assert_eq!(
            v1.observation(),
            Observation {
                available: 1_024_000 - 409_600,
                capacity: 1_024_000
            }
        );
        let v2 = read_node_memory(&MemorySource {
            meminfo,
            root_memory_cgroup: None,
        })
        .unwrap();
        assert_eq!(v2.working_set(), (900 - 10) * 1024);
    }
}
