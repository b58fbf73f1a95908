//! The stats provider: turns the node's procfs, cgroups and filesystems into a [`Summary`] (the
//! kubelet's `pkg/kubelet/stats` `Provider` with the summary builder of `pkg/kubelet/server/stats`).
//!
//! It keeps the previous CPU sample of every cgroup so `usageNanoCores` is the average rate since
//! the previous scrape, as cAdvisor's does between housekeeping runs.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::StatsError;
use super::cgroup::{CgroupLayout, MemorySample};
use super::host::{self, FsUsage, Procfs};
use super::types::{
    ContainerStats, CpuStats, FsStats, MemoryStats, NetworkStats, NodeStats, PodReference,
    PodStats, RlimitStats, RuntimeStats, SYSTEM_CONTAINER_PODS, Summary, SwapStats,
};
use crate::apis::config::CgroupDriver;
use crate::container::{ContainerId, ContainerState, PodStatus, PodUid};
use crate::error_chain::error_chain;
use crate::io::{self, IoEngine};

/// containerd's content store (compressed image blobs) below its root directory.
const CONTENT_BLOBS: &str = "io.containerd.content.v1.content/blobs";
/// The interface the Summary API reports inline (the kubelet's `defaultNetworkInterfaceName`).
const DEFAULT_INTERFACE: &str = "eth0";
/// The cgroup of the root of every hierarchy: the node's key in the CPU sample cache.
const ROOT_CGROUP: &str = "/";

/// Where "now" comes from, so tests can control the CPU rate window.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // jiff is built without its `std` feature here, so go through the epoch offset.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|since| i128::try_from(since.as_nanos()).ok())
            .and_then(|nanos| Timestamp::from_nanosecond(nanos).ok())
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// Where the provider reads from.
#[derive(Debug, Clone)]
pub struct StatsSettings {
    /// `nodeName` in the summary.
    pub node_name: String,
    /// The agent's root directory (`--root-dir`, `/var/lib/kubelet`): node `fs` is its filesystem,
    /// and a pod's `etc-hosts` under `pods/<uid>/` counts as its ephemeral storage.
    pub root_dir: PathBuf,
    /// containerd's root (`/var/lib/containerd`): `runtime.imageFs` is its filesystem and
    /// `usedBytes` the size of its content store.
    pub containerd_root: PathBuf,
    /// Where pod log directories live (`/var/log/pods`), each `<namespace>_<name>_<uid>/<container>/`.
    pub pod_log_root: PathBuf,
    /// Where the cgroup controllers are mounted.
    pub cgroups: CgroupLayout,
    /// How container cgroups are named below the pod cgroup (`<id>` with cgroupfs,
    /// `cri-containerd-<id>.scope` with systemd).
    pub cgroup_driver: CgroupDriver,
    /// `cgroupsPerQOS`: with it off there are no pod cgroups and pod usage is the sum of the
    /// containers'.
    pub cgroups_per_qos: bool,
    /// The cgroup all pods live under (`/kubepods`, as `PodContainerManager` spells it), reported
    /// as the `pods` system container; `None` leaves it out.
    pub pods_cgroup: Option<String>,
    /// procfs (`/proc`).
    pub proc_root: PathBuf,
}

impl StatsSettings {
    /// The kubelet's defaults for everything but the node name and the cgroup layout.
    pub fn new(node_name: impl Into<String>, cgroups: CgroupLayout) -> Self {
        Self {
            node_name: node_name.into(),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            containerd_root: PathBuf::from("/var/lib/containerd"),
            pod_log_root: PathBuf::from("/var/log/pods"),
            cgroups,
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroups_per_qos: true,
            pods_cgroup: Some("/kubepods".to_owned()),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// A pod to report on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatsInput {
    pub namespace: String,
    pub name: String,
    pub uid: PodUid,
    /// When the pod started (`status.startTime`, or its sandbox's creation).
    pub start_time: Timestamp,
    /// The cgroup parent the sandbox was created with
    /// (`PodContainerManager::cgroup_parent_for`, e.g. `/kubepods/burstable/pod<uid>`).
    pub cgroup: String,
    /// The pod's current containers (normally the running ones; one whose cgroup is already gone
    /// keeps its name, start time and logs but loses its CPU and memory).
    pub containers: Vec<ContainerStatsInput>,
}

impl PodStatsInput {
    /// A pod as the runtime reports it: its running containers with their start times, started
    /// when its newest sandbox was created (override `start_time` with `status.startTime` when the
    /// pod object has one). `cgroup` is the sandbox's cgroup parent.
    pub fn from_runtime(status: &PodStatus, cgroup: impl Into<String>) -> Self {
        Self {
            namespace: status.namespace.clone(),
            name: status.name.clone(),
            uid: status.uid.clone(),
            start_time: status
                .sandboxes
                .first()
                .map_or(Timestamp::UNIX_EPOCH, |sandbox| {
                    timestamp_from_unix_nanos(sandbox.created_at)
                }),
            cgroup: cgroup.into(),
            containers: status
                .containers
                .iter()
                .filter(|container| container.state == ContainerState::Running)
                .map(|container| ContainerStatsInput {
                    name: container.name.clone(),
                    id: container.id.clone(),
                    start_time: timestamp_from_unix_nanos(container.started_at),
                })
                .collect(),
        }
    }
}

/// A container to report on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatsInput {
    pub name: String,
    pub id: ContainerId,
    /// When it started (`started_at` of the runtime status, see [`timestamp_from_unix_nanos`]).
    pub start_time: Timestamp,
}

/// A CRI timestamp (nanoseconds since the epoch) as a [`Timestamp`]; out-of-range values become
/// the epoch.
pub fn timestamp_from_unix_nanos(nanos: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Reads node, pod and container stats; clones share the CPU sample cache.
#[derive(Debug, Clone)]
pub struct StatsProvider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: StatsSettings,
    procfs: Procfs,
    clock: Arc<dyn Clock>,
    /// Previous CPU sample per cgroup, for `usageNanoCores`.
    cpu_samples: Mutex<HashMap<String, CpuSample>>,
}

#[derive(Debug, Clone, Copy)]
struct CpuSample {
    usage_ns: u64,
    at: Timestamp,
}

impl StatsProvider {
    pub fn new(settings: StatsSettings) -> Self {
        Self::with_clock(settings, Arc::new(SystemClock))
    }

    /// A provider whose sample times come from `clock`.
    pub fn with_clock(settings: StatsSettings, clock: Arc<dyn Clock>) -> Self {
        let procfs = Procfs::new(settings.proc_root.clone(), host::clock_ticks());
        Self {
            inner: Arc::new(Inner {
                settings,
                procfs,
                clock,
                cpu_samples: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Node stats and the stats of `pods` (`/stats/summary`). What cannot be read is left out (and
    /// logged); this never fails as a whole. Blocking: run it off the async core.
    pub fn summary(&self, pods: &[PodStatsInput]) -> Summary {
        let settings = &self.inner.settings;
        self.collect(
            pods,
            Some(FsCache {
                root: fs_usage_logged(&settings.root_dir),
                logs: fs_usage_logged(&settings.pod_log_root),
            }),
        )
    }

    /// The cgroup files a scrape of `pods` reads (the node's root cgroup, each pod's and each
    /// container's), for reading them ahead in one batch.
    pub fn cgroup_files(&self, pods: &[PodStatsInput]) -> Vec<PathBuf> {
        let settings = &self.inner.settings;
        let layout = &settings.cgroups;
        let mut files = layout.files(ROOT_CGROUP);
        for pod in pods {
            if settings.cgroups_per_qos {
                files.extend(layout.files(&pod.cgroup));
            }
            for container in &pod.containers {
                let cgroup = container_cgroup(settings.cgroup_driver, &pod.cgroup, &container.id);
                files.extend(layout.files(&cgroup));
            }
        }
        files
    }

    /// [`summary`](Self::summary) (or, with `cpu_and_memory_only`,
    /// [`cpu_and_memory_summary`](Self::cpu_and_memory_summary)) with the contents of `files` read
    /// ahead, e.g. the [`cgroup_files`](Self::cgroup_files) read through the I/O engine.
    pub fn summary_prefetched(
        &self,
        pods: &[PodStatsInput],
        files: HashMap<PathBuf, Vec<u8>>,
        cpu_and_memory_only: bool,
    ) -> Summary {
        host::with_prefetched(files, || {
            if cpu_and_memory_only {
                self.cpu_and_memory_summary(pods)
            } else {
                self.summary(pods)
            }
        })
    }

    /// A whole scrape as the agent serves it: the many small cgroup files are read in one batch
    /// through `engine`, then parsing and the filesystem walks run on the blocking pool (a file
    /// that cannot be read is left out of the summary, as in [`summary`](Self::summary)). Must run
    /// inside [`block_on`](crate::io::block_on).
    pub async fn scrape(
        &self,
        pods: Vec<PodStatsInput>,
        engine: IoEngine,
        cpu_and_memory_only: bool,
    ) -> Result<Summary, tokio::task::JoinError> {
        let files = self.cgroup_files(&pods);
        let contents = io::read_small_files(&files, engine).await;
        let read: HashMap<PathBuf, Vec<u8>> = files
            .into_iter()
            .zip(contents)
            .filter_map(|(path, content)| Some((path, content.ok()?)))
            .collect();
        let provider = self.clone();
        tokio::task::spawn_blocking(move || {
            provider.summary_prefetched(&pods, read, cpu_and_memory_only)
        })
        .await
    }

    /// Only CPU, memory and swap, without walking any directory: the kubelet's
    /// `/stats/summary?only_cpu_and_memory=true` and the input of `/metrics/resource`.
    pub fn cpu_and_memory_summary(&self, pods: &[PodStatsInput]) -> Summary {
        self.collect(pods, None)
    }

    fn collect(&self, pods: &[PodStatsInput], fs: Option<FsCache>) -> Summary {
        let mut scrape = Scrape {
            inner: &self.inner,
            seen: HashSet::new(),
            fs,
        };
        let node = scrape.node();
        let pods = pods.iter().map(|pod| scrape.pod(pod)).collect();
        // Cgroups not scraped this time are gone (or their pods are): forget their samples.
        let seen = scrape.seen;
        self.inner
            .cpu_samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|cgroup, _| seen.contains(cgroup));
        Summary { node, pods }
    }
}

/// One summary in progress.
struct Scrape<'a> {
    inner: &'a Inner,
    /// Cgroups sampled during this scrape.
    seen: HashSet<String>,
    /// The filesystems every pod shares, read once per scrape; `None` when only CPU and memory
    /// are wanted.
    fs: Option<FsCache>,
}

#[derive(Debug, Clone, Copy)]
struct FsCache {
    /// The agent's root directory's filesystem (`nodefs`).
    root: Option<FsUsage>,
    /// The pod log root's filesystem.
    logs: Option<FsUsage>,
}

impl Scrape<'_> {
    fn settings(&self) -> &StatsSettings {
        &self.inner.settings
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    fn node(&mut self) -> NodeStats {
        let inner = self.inner;
        let start_time = match self.inner.procfs.boot_time() {
            Ok(seconds) => Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH),
            Err(error) => {
                log_unreadable("node start time", &error);
                Timestamp::UNIX_EPOCH
            }
        };
        let cpu = self.cpu(ROOT_CGROUP, || {
            inner
                .settings
                .cgroups
                .cpu_usage_ns(ROOT_CGROUP)
                .or_else(|_| inner.procfs.cpu_usage_ns())
        });

        let time = self.now();
        let (memory, swap) = match self.inner.procfs.memory() {
            // As the kubelet does (its eviction signal `memory.available` depends on it), the node's
            // available memory is capacity minus working set, not the kernel's MemAvailable.
            Ok(node) => (
                Some(memory_stats(&node.sample, time)),
                node.swap.map(|swap| SwapStats {
                    time: Time(time),
                    swap_available_bytes: Some(swap.available),
                    swap_usage_bytes: Some(swap.usage),
                }),
            ),
            Err(error) => {
                log_unreadable("node memory", &error);
                (None, None)
            }
        };

        let system_containers = self.system_containers(start_time);
        let mut node = NodeStats {
            node_name: self.settings().node_name.clone(),
            system_containers,
            start_time: Time(start_time),
            cpu,
            memory,
            network: None,
            fs: None,
            runtime: None,
            rlimit: None,
            swap,
        };
        if let Some(fs) = self.fs {
            node.network = self.network(time);
            node.fs = fs.root.map(|usage| whole_fs_stats(&usage, time));
            node.runtime = Some(RuntimeStats {
                image_fs: self.image_fs(time),
            });
            node.rlimit = self.rlimit(time);
        }
        node
    }

    /// The host's interfaces, `eth0` inline as the kubelet's default interface.
    fn network(&self, time: Timestamp) -> Option<NetworkStats> {
        let interfaces = self
            .inner
            .procfs
            .network_interfaces()
            .inspect_err(|error| log_unreadable("network interfaces", error))
            .ok()?;
        let default_interface = interfaces
            .iter()
            .find(|interface| interface.name == DEFAULT_INTERFACE)
            .cloned()
            .unwrap_or_default();
        Some(NetworkStats {
            time: Time(time),
            default_interface,
            interfaces,
        })
    }

    /// containerd's filesystem, with the content store's blobs as the bytes images take.
    fn image_fs(&self, time: Timestamp) -> Option<FsStats> {
        let root = &self.settings().containerd_root;
        let usage = fs_usage_logged(root)?;
        let images = host::dir_usage(&root.join(CONTENT_BLOBS))
            .inspect_err(|error| log_unreadable("image filesystem usage", error))
            .ok();
        Some(FsStats {
            used_bytes: images.map(|images| images.bytes),
            inodes_used: images.map(|images| images.inodes),
            ..fs_stats(&usage, time)
        })
    }

    fn rlimit(&self, time: Timestamp) -> Option<RlimitStats> {
        let maxpid = self
            .inner
            .procfs
            .pid_max()
            .inspect_err(|error| log_unreadable("pid_max", error))
            .ok();
        let curproc = self
            .inner
            .procfs
            .process_count()
            .inspect_err(|error| log_unreadable("process count", error))
            .ok();
        (maxpid.is_some() || curproc.is_some()).then_some(RlimitStats {
            time: Time(time),
            maxpid,
            curproc,
        })
    }

    fn system_containers(&mut self, start_time: Timestamp) -> Vec<ContainerStats> {
        let Some(cgroup) = self.settings().pods_cgroup.clone() else {
            return Vec::new();
        };
        let (cpu, memory) = self.cgroup_usage(&cgroup);
        vec![ContainerStats {
            name: SYSTEM_CONTAINER_PODS.to_owned(),
            start_time: Time(start_time),
            cpu,
            memory,
            rootfs: None,
            logs: None,
        }]
    }

    fn pod(&mut self, pod: &PodStatsInput) -> PodStats {
        let time = self.now();
        let pod_log_dir = self
            .settings()
            .pod_log_root
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid));
        let log_fs = self.fs.and_then(|fs| fs.logs);
        let containers: Vec<ContainerStats> = pod
            .containers
            .iter()
            .map(|container| {
                let cgroup = self.container_cgroup(&pod.cgroup, &container.id);
                let (cpu, memory) = self.cgroup_usage(&cgroup);
                let logs = log_fs.and_then(|fs| {
                    let dir = pod_log_dir.join(&container.name);
                    let used = host::dir_usage(&dir)
                        .inspect_err(|error| log_unreadable("container logs", error))
                        .ok()?;
                    Some(FsStats {
                        used_bytes: Some(used.bytes),
                        inodes_used: Some(used.inodes),
                        ..fs_stats(&fs, time)
                    })
                });
                ContainerStats {
                    name: container.name.clone(),
                    start_time: Time(container.start_time),
                    cpu,
                    memory,
                    rootfs: None,
                    logs,
                }
            })
            .collect();

        let (cpu, memory) = if self.settings().cgroups_per_qos {
            self.cgroup_usage(&pod.cgroup)
        } else {
            (sum_cpu(&containers), sum_memory(&containers))
        };
        let ephemeral_storage = self
            .fs
            .and_then(|fs| fs.root)
            .map(|root| self.ephemeral_storage(pod, &pod_log_dir, &root, time));

        PodStats {
            pod_ref: PodReference {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                uid: pod.uid.to_string(),
            },
            start_time: Time(pod.start_time),
            containers,
            cpu,
            memory,
            ephemeral_storage,
        }
    }

    /// The pod's share of the node filesystem: its logs (every container instance) and its
    /// `etc-hosts`. Container writable layers and emptyDir volumes are not counted.
    fn ephemeral_storage(
        &self,
        pod: &PodStatsInput,
        pod_log_dir: &std::path::Path,
        root: &FsUsage,
        time: Timestamp,
    ) -> FsStats {
        let settings = self.settings();
        let etc_hosts = settings
            .root_dir
            .join("pods")
            .join(pod.uid.as_str())
            .join("etc-hosts");
        let used = [pod_log_dir.to_path_buf(), etc_hosts]
            .iter()
            .filter_map(|path| host::dir_usage(path).ok())
            .fold(host::DirUsage::default(), |sum, usage| host::DirUsage {
                bytes: sum.bytes.saturating_add(usage.bytes),
                inodes: sum.inodes.saturating_add(usage.inodes),
            });
        FsStats {
            used_bytes: Some(used.bytes),
            inodes_used: Some(used.inodes),
            ..fs_stats(root, time)
        }
    }

    fn container_cgroup(&self, parent: &str, id: &ContainerId) -> String {
        container_cgroup(self.settings().cgroup_driver, parent, id)
    }

    fn cgroup_usage(&mut self, cgroup: &str) -> (Option<CpuStats>, Option<MemoryStats>) {
        let layout = &self.inner.settings.cgroups;
        let cpu = self.cpu(cgroup, || layout.cpu_usage_ns(cgroup));
        let time = self.now();
        let memory = match layout.memory(cgroup) {
            Ok(sample) => Some(memory_stats(&sample, time)),
            Err(error) => {
                log_unreadable("cgroup memory", &error);
                None
            }
        };
        (cpu, memory)
    }

    /// Reads a cumulative CPU counter and turns the change since the cgroup's previous sample into
    /// a rate.
    fn cpu(
        &mut self,
        cgroup: &str,
        read: impl FnOnce() -> Result<u64, StatsError>,
    ) -> Option<CpuStats> {
        let now = self.now();
        let usage_ns = match read() {
            Ok(usage) => usage,
            Err(error) => {
                log_unreadable("cgroup cpu", &error);
                return None;
            }
        };
        self.seen.insert(cgroup.to_owned());
        let mut samples = self
            .inner
            .cpu_samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = CpuSample { usage_ns, at: now };
        let rate = samples
            .insert(cgroup.to_owned(), current)
            .and_then(|previous| nano_cores(previous, current));
        Some(CpuStats {
            time: Time(now),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(usage_ns),
        })
    }
}

/// Average core-nanoseconds per second between two samples; `None` when no time passed or the
/// counter went backwards (the cgroup was re-created).
fn nano_cores(previous: CpuSample, current: CpuSample) -> Option<u64> {
    let elapsed = current.at.as_nanosecond() - previous.at.as_nanosecond();
    let elapsed = u128::try_from(elapsed).ok().filter(|ns| *ns > 0)?;
    let used = u128::from(current.usage_ns.checked_sub(previous.usage_ns)?);
    u64::try_from(used * 1_000_000_000 / elapsed).ok()
}

/// containerd names a container's cgroup after its id below the sandbox's cgroup parent.
fn container_cgroup(driver: CgroupDriver, parent: &str, id: &ContainerId) -> String {
    let parent = parent.trim_end_matches('/');
    match driver {
        CgroupDriver::Cgroupfs => format!("{parent}/{id}"),
        CgroupDriver::Systemd => format!("{parent}/cri-containerd-{id}.scope"),
    }
}

fn memory_stats(sample: &MemorySample, time: Timestamp) -> MemoryStats {
    MemoryStats {
        time: Time(time),
        available_bytes: sample.available(),
        usage_bytes: Some(sample.usage),
        working_set_bytes: Some(sample.working_set()),
        rss_bytes: Some(sample.rss),
        page_faults: Some(sample.page_faults),
        major_page_faults: Some(sample.major_page_faults),
    }
}

/// A filesystem's size and free space, without a `used` share.
fn fs_stats(usage: &FsUsage, time: Timestamp) -> FsStats {
    FsStats {
        time: Time(time),
        available_bytes: Some(usage.available),
        capacity_bytes: Some(usage.capacity),
        used_bytes: None,
        inodes_free: Some(usage.inodes_free),
        inodes: Some(usage.inodes),
        inodes_used: None,
    }
}

/// A filesystem with everything on it counted as used.
fn whole_fs_stats(usage: &FsUsage, time: Timestamp) -> FsStats {
    FsStats {
        used_bytes: Some(usage.used),
        inodes_used: Some(usage.inodes.saturating_sub(usage.inodes_free)),
        ..fs_stats(usage, time)
    }
}

fn fs_usage_logged(path: &std::path::Path) -> Option<FsUsage> {
    host::fs_usage(path)
        .inspect_err(|error| log_unreadable("filesystem usage", error))
        .ok()
}

/// Pod usage without a pod cgroup: the sum over its containers.
fn sum_cpu(containers: &[ContainerStats]) -> Option<CpuStats> {
    let cpus: Vec<&CpuStats> = containers.iter().filter_map(|c| c.cpu.as_ref()).collect();
    let time = cpus.iter().map(|cpu| cpu.time.clone()).max()?;
    Some(CpuStats {
        time,
        usage_nano_cores: sum_all(cpus.iter().map(|cpu| cpu.usage_nano_cores)),
        usage_core_nano_seconds: sum_all(cpus.iter().map(|cpu| cpu.usage_core_nano_seconds)),
    })
}

fn sum_memory(containers: &[ContainerStats]) -> Option<MemoryStats> {
    let memories: Vec<&MemoryStats> = containers
        .iter()
        .filter_map(|c| c.memory.as_ref())
        .collect();
    let time = memories.iter().map(|memory| memory.time.clone()).max()?;
    let sum = |field: fn(&MemoryStats) -> Option<u64>| sum_all(memories.iter().map(|m| field(m)));
    Some(MemoryStats {
        time,
        available_bytes: None,
        usage_bytes: sum(|m| m.usage_bytes),
        working_set_bytes: sum(|m| m.working_set_bytes),
        rss_bytes: sum(|m| m.rss_bytes),
        page_faults: sum(|m| m.page_faults),
        major_page_faults: sum(|m| m.major_page_faults),
    })
}

/// The sum, or `None` when any value is missing (a partial sum would read as a drop).
fn sum_all(mut values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.try_fold(0u64, |sum, value| Some(sum.saturating_add(value?)))
}

/// A container that just exited takes its cgroup with it: expected, so only at debug level.
fn log_unreadable(what: &str, error: &StatsError) {
    if error.is_not_found() {
        tracing::debug!(what, error = %error_chain(error), "stat not available");
    } else {
        tracing::warn!(what, error = %error_chain(error), "reading stat failed");
    }
}
