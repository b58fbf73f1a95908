//! Pod cgroups under per-QoS parents: created before the sandbox runs (with `podPidsLimit` as
//! their `pids.max`), removed after it is gone, listed for orphan cleanup, processes of nothing
//! the runtime reports killed (the kubelet's `pod_container_manager_linux.go` and
//! `qos_container_manager_linux.go`, with `cgroupsPerQOS`); the node allocatable limits written to
//! the pods' top cgroup and the reserved cgroups (`node_container_manager_linux.go`).
//!
//! All operations are blocking filesystem calls on cgroupfs (a few `mkdir`/`rmdir` per hierarchy);
//! callers on the async core run them with `spawn_blocking`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use cgroups_rs::fs::Cgroup;
use cgroups_rs::fs::hierarchies::{self, UNIFIED_MOUNTPOINT};
use k8s_openapi::api::core::v1::Pod;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::CmError;
use super::cgroup_name::{CgroupName, unescape_systemd};
use super::qos::{QosClass, qos_class};
use super::resource_config::{self, ResourceConfig};
use crate::apis::config::{CgroupDriver, KubeletConfiguration};
use crate::container::PodUid;
use crate::mountinfo;

/// The top-level cgroup for all pods, below `cgroupRoot`.
const KUBEPODS: &str = "kubepods";
const POD_PREFIX: &str = "pod";

/// A pod cgroup found on the host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodCgroup {
    pub uid: PodUid,
    pub qos: QosClass,
    /// The driver's absolute path, e.g. `/kubepods/besteffort/pod<uid>`.
    pub path: String,
}

/// The cgroup hierarchies mounted on the host.
#[derive(Debug, Clone)]
struct Hierarchies {
    /// Pure cgroup v2 (cgroups-rs then manages the unified tree).
    v2: bool,
    /// Mount points of every hierarchy pod cgroups are created in.
    roots: Vec<PathBuf>,
    /// The cgroup2 mount of a hybrid host (e.g. `/sys/fs/cgroup/unified`), which cgroups-rs does not
    /// manage but runc creates container cgroups in.
    unified: Option<PathBuf>,
}

impl Hierarchies {
    fn detect() -> Result<Self, CmError> {
        let hierarchy = hierarchies::auto();
        if hierarchy.v2() {
            return Ok(Self {
                v2: true,
                roots: vec![PathBuf::from(UNIFIED_MOUNTPOINT)],
                unified: None,
            });
        }
        let root = Cgroup::load(hierarchy, "");
        let mut roots: Vec<PathBuf> = root
            .subsystems()
            .iter()
            .map(|subsystem| subsystem.to_controller().path().to_path_buf())
            .collect();
        roots.sort();
        roots.dedup();
        let unified = find_cgroup2_mount()?;
        roots.extend(unified.clone());
        if roots.is_empty() {
            return Err(CmError::NoCgroupHierarchy);
        }
        Ok(Self {
            v2: false,
            roots,
            unified,
        })
    }
}

/// Finds the cgroup2 mount point in the mount table.
fn find_cgroup2_mount() -> Result<Option<PathBuf>, CmError> {
    let text = std::fs::read_to_string(mountinfo::PATH).map_err(|source| CmError::Io {
        action: "reading mount table",
        path: PathBuf::from(mountinfo::PATH),
        source,
    })?;
    Ok(mountinfo::parse(&text)
        .into_iter()
        .find(mountinfo::Mount::is_cgroup2)
        .map(|mount| mount.mount_point))
}

/// Creates, checks, lists and removes pod cgroups (`<cgroupRoot>/kubepods/<qos>/pod<uid>`).
#[derive(Debug, Clone)]
pub struct PodContainerManager {
    root: CgroupName,
    driver: CgroupDriver,
    cgroups_per_qos: bool,
    /// `podPidsLimit` when it limits anything (above 0).
    pod_pids_limit: Option<i64>,
    hierarchies: Hierarchies,
}

impl PodContainerManager {
    /// A manager for the host's cgroup hierarchies. With `cgroups_per_qos` off pods share
    /// `cgroup_root` as their parent and no pod cgroups are created, as in the kubelet.
    pub fn new(
        cgroup_root: &str,
        driver: CgroupDriver,
        cgroups_per_qos: bool,
    ) -> Result<Self, CmError> {
        Ok(Self {
            root: CgroupName::parse(cgroup_root, driver),
            driver,
            cgroups_per_qos,
            pod_pids_limit: None,
            hierarchies: Hierarchies::detect()?,
        })
    }

    /// A manager configured by `cgroupRoot`, `cgroupDriver`, `cgroupsPerQOS` and `podPidsLimit`.
    pub fn from_config(config: &KubeletConfiguration) -> Result<Self, CmError> {
        Ok(Self::new(
            &config.cgroup_root,
            config.cgroup_driver,
            config.cgroups_per_qos,
        )?
        .with_pod_pids_limit(config.resources.pod_pids_limit))
    }

    /// The `pids.max` of new pod cgroups; 0 or less (the kubelet's -1 default) sets none.
    #[must_use]
    pub fn with_pod_pids_limit(mut self, limit: i64) -> Self {
        self.pod_pids_limit = (limit > 0).then_some(limit);
        self
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// The cgroup2 directory of the pods' parent (`kubepods`, `kubepods.slice` with systemd), under
    /// which the eBPF programs watch container cgroups; `None` when the host mounts no cgroup2.
    pub fn pods_cgroup2_dir(&self) -> Option<PathBuf> {
        let mount = if self.hierarchies.v2 {
            PathBuf::from(UNIFIED_MOUNTPOINT)
        } else {
            self.hierarchies.unified.clone()?
        };
        let kubepods = self.root.child(KUBEPODS).to_driver_path(self.driver);
        Some(mount.join(kubepods.trim_start_matches('/')))
    }

    /// The `QoS` parent: `kubepods` for Guaranteed pods, `kubepods/<qos>` for the others.
    pub fn qos_cgroup_name(&self, qos: QosClass) -> CgroupName {
        let kubepods = self.root.child(KUBEPODS);
        match qos {
            QosClass::Guaranteed => kubepods,
            QosClass::Burstable => kubepods.child("burstable"),
            QosClass::BestEffort => kubepods.child("besteffort"),
        }
    }

    /// The pod's cgroup (`<qos parent>/pod<uid>`).
    pub fn pod_cgroup_name(&self, uid: &PodUid, qos: QosClass) -> CgroupName {
        self.qos_cgroup_name(qos)
            .child(format!("{POD_PREFIX}{}", uid.as_str()))
    }

    /// The `cgroup_parent` for the pod's CRI sandbox: the pod cgroup as the driver spells it (an
    /// absolute `/kubepods/...` path with cgroupfs), or `cgroupRoot` when `cgroupsPerQOS` is off.
    pub fn cgroup_parent_for(&self, uid: &PodUid, qos: QosClass) -> String {
        if self.cgroups_per_qos {
            self.pod_cgroup_name(uid, qos).to_driver_path(self.driver)
        } else {
            self.root.to_driver_path(self.driver)
        }
    }

    /// [`Self::cgroup_parent_for`] with the pod's UID and `QoS` class.
    pub fn cgroup_parent_for_runtime(&self, pod: &Pod) -> Result<String, CmError> {
        Ok(self.cgroup_parent_for(&pod_uid(pod)?, qos_class(pod)))
    }

    /// Creates the pod's `QoS` parent and pod cgroup in every hierarchy, the pod cgroup with the
    /// `podPidsLimit` (no-op when they exist or `cgroupsPerQOS` is off).
    pub fn ensure_exists(&self, pod: &Pod) -> Result<(), CmError> {
        self.ensure_pod_cgroup(&pod_uid(pod)?, qos_class(pod))
    }

    /// [`Self::ensure_exists`] for a known UID and `QoS` class.
    pub fn ensure_pod_cgroup(&self, uid: &PodUid, qos: QosClass) -> Result<(), CmError> {
        if !self.cgroups_per_qos {
            return Ok(());
        }
        let name = self.pod_cgroup_name(uid, qos);
        let relative = name.relative_path(self.driver);
        // The pod cgroup implies its parents: a running pod's sync checks one path per hierarchy.
        // As in the kubelet, its settings are written only when it is created.
        if self.exists_everywhere(&relative) {
            return Ok(());
        }
        self.create_levels(&name)?;
        if let Some(limit) = self.pod_pids_limit {
            resource_config::apply(
                &relative,
                &ResourceConfig {
                    pids_max: Some(limit),
                    ..ResourceConfig::default()
                },
            )?;
        }
        Ok(())
    }

    /// Creates `name` and its missing parents in every hierarchy.
    fn create_levels(&self, name: &CgroupName) -> Result<(), CmError> {
        // Level by level, so cgroups-rs initialises every new v1 cpuset parent before its child.
        for depth in 1..=name.components().len() {
            let level = CgroupName::new(name.components()[..depth].to_vec());
            let relative = level.relative_path(self.driver);
            if self.exists_everywhere(&relative) {
                continue;
            }
            let path = level.to_driver_path(self.driver);
            Cgroup::load(hierarchies::auto(), &relative)
                .create()
                .map_err(|source| CmError::Create {
                    path: path.clone(),
                    source,
                })?;
            if let Some(unified) = &self.hierarchies.unified {
                let dir = unified.join(&relative);
                std::fs::create_dir_all(&dir).map_err(|source| CmError::Io {
                    action: "creating cgroup",
                    path: dir,
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// The pods' top cgroup as the driver spells it (`/kubepods`, `/kubepods.slice`).
    pub fn pods_cgroup_path(&self) -> String {
        self.root.child(KUBEPODS).to_driver_path(self.driver)
    }

    /// Creates the pods' top cgroup if needed and writes the node allocatable `config` to it.
    pub fn enforce_pods_cgroup(&self, config: &ResourceConfig) -> Result<(), CmError> {
        let kubepods = self.root.child(KUBEPODS);
        self.create_levels(&kubepods)?;
        resource_config::apply(&kubepods.relative_path(self.driver), config)
    }

    /// Writes `config` to `cgroup` (a `systemReservedCgroup` or `kubeReservedCgroup`, spelled as
    /// the driver spells names), which must already exist in every controller hierarchy.
    pub fn enforce_existing(&self, cgroup: &str, config: &ResourceConfig) -> Result<(), CmError> {
        let relative = CgroupName::parse(cgroup, self.driver).relative_path(self.driver);
        let exists = self
            .hierarchies
            .roots
            .iter()
            .filter(|root| Some(*root) != self.hierarchies.unified.as_ref())
            .all(|root| root.join(&relative).is_dir());
        if !exists {
            return Err(CmError::CgroupMissing {
                path: cgroup.to_owned(),
            });
        }
        resource_config::apply(&relative, config)
    }

    /// Whether the pod cgroup exists in every hierarchy (always true with `cgroupsPerQOS` off).
    pub fn exists(&self, uid: &PodUid, qos: QosClass) -> bool {
        !self.cgroups_per_qos
            || self.exists_everywhere(&self.pod_cgroup_name(uid, qos).relative_path(self.driver))
    }

    fn exists_everywhere(&self, relative: &str) -> bool {
        self.hierarchies
            .roots
            .iter()
            .all(|root| root.join(relative).is_dir())
    }

    /// Removes the pod cgroup, and any container cgroups left below it, from every hierarchy. Call it
    /// after the pod's sandbox is removed: a cgroup that still has processes is an error naming it,
    /// and nothing is removed then.
    pub fn destroy(&self, uid: &PodUid, qos: QosClass) -> Result<(), CmError> {
        if !self.cgroups_per_qos {
            return Ok(());
        }
        let name = self.pod_cgroup_name(uid, qos);
        let relative = name.relative_path(self.driver);
        let subtree = self.subtree(&relative)?;

        for cgroup in &subtree {
            let pids = self.processes(cgroup)?;
            if !pids.is_empty() {
                return Err(CmError::HasProcesses {
                    path: format!("/{cgroup}"),
                    pids,
                });
            }
        }
        // Deepest first: a cgroup can only be removed once its children are gone.
        let mut deepest_first: Vec<&String> = subtree.iter().collect();
        deepest_first.sort_by_key(|cgroup| std::cmp::Reverse(cgroup.matches('/').count()));
        for cgroup in deepest_first {
            self.remove(cgroup)?;
        }
        Ok(())
    }

    /// Sends SIGKILL to every process left in the pod cgroup and the cgroups below it, and returns
    /// their pids: the kubelet's last resort before removing a pod cgroup, for processes of nothing
    /// the runtime still reports. They are gone once the kernel has reaped them, so a
    /// [`Self::destroy`] right after may still find them.
    pub fn kill_processes(&self, uid: &PodUid, qos: QosClass) -> Result<Vec<u64>, CmError> {
        if !self.cgroups_per_qos {
            return Ok(Vec::new());
        }
        let relative = self.pod_cgroup_name(uid, qos).relative_path(self.driver);
        let mut signalled = Vec::new();
        for cgroup in &self.subtree(&relative)? {
            for pid in self.processes(cgroup)? {
                let Ok(raw) = i32::try_from(pid) else {
                    continue;
                };
                match kill(Pid::from_raw(raw), Signal::SIGKILL) {
                    // Already gone.
                    Ok(()) | Err(Errno::ESRCH) => signalled.push(pid),
                    Err(source) => {
                        return Err(CmError::Io {
                            action: "killing a process left in cgroup",
                            path: PathBuf::from(format!("/{cgroup}")),
                            source: source.into(),
                        });
                    }
                }
            }
        }
        Ok(signalled)
    }

    /// Relative paths of `relative` and every cgroup below it, in any hierarchy.
    fn subtree(&self, relative: &str) -> Result<BTreeSet<String>, CmError> {
        let mut found = BTreeSet::new();
        for root in &self.hierarchies.roots {
            let mut pending = vec![relative.to_owned()];
            while let Some(current) = pending.pop() {
                let dir = root.join(&current);
                let entries = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(source) => {
                        return Err(CmError::Io {
                            action: "listing cgroup",
                            path: dir,
                            source,
                        });
                    }
                };
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        pending.push(format!("{current}/{}", entry.file_name().to_string_lossy()));
                    }
                }
                found.insert(current);
            }
        }
        Ok(found)
    }

    /// Processes in the cgroup, read from `cgroup.procs` in every hierarchy.
    fn processes(&self, relative: &str) -> Result<Vec<u64>, CmError> {
        let mut pids: Vec<u64> = Vec::new();
        for root in &self.hierarchies.roots {
            let procs = root.join(relative).join("cgroup.procs");
            match std::fs::read_to_string(&procs) {
                Ok(text) => pids.extend(text.lines().filter_map(|l| l.trim().parse::<u64>().ok())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CmError::Io {
                        action: "reading cgroup processes",
                        path: procs,
                        source,
                    });
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    fn remove(&self, relative: &str) -> Result<(), CmError> {
        // cgroups-rs retries a v1 rmdir that races with exiting tasks; it does not manage the
        // cgroup2 tree of a hybrid host, and on pure v2 it fails for a missing cgroup, so every
        // hierarchy is swept afterwards.
        if !self.hierarchies.v2 {
            Cgroup::load(hierarchies::auto(), relative)
                .delete()
                .map_err(|source| CmError::Remove {
                    path: format!("/{relative}"),
                    source,
                })?;
        }
        for root in &self.hierarchies.roots {
            let dir = root.join(relative);
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CmError::Io {
                        action: "removing cgroup",
                        path: dir,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every pod cgroup below the `QoS` parents in any hierarchy, so pods the agent no longer knows
    /// can be cleaned up. Empty with `cgroupsPerQOS` off.
    pub fn list_pod_cgroups(&self) -> Result<Vec<PodCgroup>, CmError> {
        if !self.cgroups_per_qos {
            return Ok(Vec::new());
        }
        let mut found: BTreeMap<(QosClass, String), PodCgroup> = BTreeMap::new();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let parent = self.qos_cgroup_name(qos);
            let relative = parent.relative_path(self.driver);
            let leaf_prefix = match self.driver {
                CgroupDriver::Cgroupfs => POD_PREFIX.to_owned(),
                CgroupDriver::Systemd => {
                    let probe = parent.child(POD_PREFIX).leaf(self.driver);
                    probe.strip_suffix(".slice").unwrap_or(&probe).to_owned()
                }
            };
            for root in &self.hierarchies.roots {
                let dir = root.join(&relative);
                for leaf in child_dirs(&dir)? {
                    let Some(uid) = self.uid_from_leaf(&leaf, &leaf_prefix) else {
                        continue;
                    };
                    let uid = PodUid::new(uid);
                    found
                        .entry((qos, uid.as_str().to_owned()))
                        .or_insert_with(|| PodCgroup {
                            path: self.pod_cgroup_name(&uid, qos).to_driver_path(self.driver),
                            uid,
                            qos,
                        });
                }
            }
        }
        Ok(found.into_values().collect())
    }

    fn uid_from_leaf(&self, leaf: &str, prefix: &str) -> Option<String> {
        let rest = leaf.strip_prefix(prefix)?;
        let uid = match self.driver {
            CgroupDriver::Cgroupfs => rest.to_owned(),
            CgroupDriver::Systemd => unescape_systemd(rest.strip_suffix(".slice")?),
        };
        validate_uid(&uid).ok().map(|()| uid)
    }
}

fn child_dirs(dir: &Path) -> Result<Vec<String>, CmError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CmError::Io {
                action: "listing cgroup",
                path: dir.to_owned(),
                source,
            });
        }
    };
    Ok(entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect())
}

/// The pod's UID, checked to be usable as part of a cgroup path.
fn pod_uid(pod: &Pod) -> Result<PodUid, CmError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(CmError::MissingUid {
            pod: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
        });
    }
    validate_uid(uid)?;
    Ok(PodUid::new(uid))
}

/// UIDs become directory names: only characters that cannot leave or confuse the cgroup tree.
fn validate_uid(uid: &str) -> Result<(), CmError> {
    let ok = !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CmError::InvalidUid {
            uid: uid.to_owned(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests;
