//! Pod volumes (the kubelet's `pkg/kubelet/volumemanager` with the `pkg/volume/{empty_dir,host_path,
//! configmap,secret,projected,downwardapi}` plugins). [`VolumeManager::mount_pod`] runs before the
//! runtime starts anything, on every sync of the pod (the kubelet's `WaitForAttachAndMount`, which
//! re-mounts the volumes whose content can change): it prepares every volume in the kubelet's layout,
//! `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`, and reports each volume it could
//! not prepare, so the pod does not start and is retried.
//!
//! - `emptyDir`: a directory (mode 0777); with `medium: Memory` a tmpfs sized by `sizeLimit`, the
//!   pod's memory limit or the node's allocatable memory, whichever is smallest.
//! - `hostPath`: checked (or created) per its `type`.
//! - `configMap`, `secret`, `downwardAPI`, `projected` (configMap, secret, downwardAPI and
//!   serviceAccountToken sources): their files, written through the [`atomic_writer`] so a reader
//!   never sees half an update, with the modes asked for (0644 by default). Secret and projected
//!   volumes live on a tmpfs of their own, so secrets and tokens never reach a disk. Objects come from
//!   the watch-based managers of [`crate::objects`], tokens from [`crate::token`]; without an API
//!   server, volumes that need one fail with a message that says so.
//!
//! With the pod's `fsGroup`, a volume's files get the group ([`ownership`]): an emptyDir (and the
//! directory under every other volume) when it is first set up, the API volumes whenever a new
//! version of their files is written. A volume set up once is marked ready
//! (`<pod dir>/plugins/kubernetes.io~empty-dir/<name>/ready`, the kubelet's place), so later syncs
//! leave the modes and groups its containers gave its files alone.
//!
//! Everything is removed (subPath binds and tmpfs unmounted first) when the pod is removed; pod
//! directories no pod owns any more (a pod deleted while the agent was down) are removed by
//! housekeeping. Removal never crosses into another mount ([`removeall`]). File work runs on the
//! blocking pool, never on the agent's core thread. [`PodVolumes`] turns a container's
//! `volumeMounts` into CRI mounts, a `subPath` (or a `subPathExpr` expanded with the container's
//! environment) through a bind mount a container cannot redirect ([`subpath`]); API-backed volumes
//! are always mounted read-only, as the kubelet mounts them.

mod atomic_writer;
mod mounter;
mod ownership;
mod projection;
mod removeall;
mod subpath;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource,
    Node, Pod, ProjectedVolumeSource, Secret, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ringlet_proto::runtime::v1::{KeyValue, Mount, MountPropagation};
use tokio::sync::watch;

pub use atomic_writer::{AtomicWriteError, DATA_DIR};
pub use mounter::{Mounter, SystemMounter};
pub use ownership::OwnershipError;
pub use projection::ProjectionError;
pub use removeall::RemoveError;
pub use subpath::SubPathError;

use crate::cm::parse_quantity;
use crate::container::PodUid;
use crate::objects::{ApiObjects, ObjectError};
use crate::token::{TokenError, TokenSpec};
use atomic_writer::Payload;
use ownership::Ownership;
use removeall::remove_all_one_filesystem;

const VOLUMES_DIR: &str = "volumes";
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
const CONFIG_MAP_PLUGIN: &str = "kubernetes.io~configmap";
const SECRET_PLUGIN: &str = "kubernetes.io~secret";
const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";
const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
/// Where the plugins keep what they know of a pod's volumes (the ready markers).
const PLUGINS_DIR: &str = "plugins";
const READY_FILE: &str = "ready";
/// A token's mode when the pod has an `fsGroup`, before the group's read is added.
const TOKEN_MODE_WITH_FS_GROUP: i32 = 0o600;
/// emptyDir and the disk-backed API volumes are world-writable like upstream's, so non-root
/// containers can use them (API volumes are mounted read-only into containers).
const EMPTY_DIR_MODE: u32 = 0o777;

/// Why a pod's volume could not be prepared or mounted.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: {kind} volumes are not supported by this agent")]
    Unsupported { volume: String, kind: String },
    #[error("volume {volume:?} has no source")]
    NoSource { volume: String },
    #[error("volume name {volume:?} is used by more than one volume of the pod")]
    DuplicateName { volume: String },
    #[error("volume name {volume:?} is not a valid directory name")]
    InvalidName { volume: String },
    #[error("pod UID {uid:?} is not a valid directory name")]
    InvalidPodUid { uid: String },
    #[error(
        "volume {volume:?}: emptyDir medium {medium:?} is not supported (only the default disk medium and Memory)"
    )]
    UnsupportedMedium { volume: String, medium: String },
    #[error("volume {volume:?}: hostPath type {kind:?} is not valid")]
    InvalidHostPathType { volume: String, kind: String },
    #[error("volume {volume:?}: hostPath {path} is not {expected}")]
    HostPathTypeMismatch {
        volume: String,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("volume {volume:?}: hostPath {path:?} must be an absolute path")]
    RelativeHostPath { volume: String, path: String },
    #[error("volume {volume:?}: preparing {path}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading a ConfigMap or Secret failed (`configmap "x" not found`).
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("couldn't get {kind} {namespace}/{name}: no API server (the agent runs standalone)")]
    NoApiServer {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("cannot setup projected volume {volume} because kube client is not configured")]
    ProjectedWithoutApiServer { volume: String },
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    #[error("mounting a tmpfs on {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmounting {path}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Several failures of one projected volume, as Go's error aggregate prints them.
    #[error("[{}]", .0.iter().map(|e| crate::error_chain::error_chain(e)).collect::<Vec<_>>().join(", "))]
    Several(Vec<VolumeError>),
    #[error("a volume task failed: {0}")]
    Task(String),
    #[error("container {container:?} mounts volume {volume:?}, which the pod does not define")]
    UnknownVolume { container: String, volume: String },
    /// A subPath the kubelet refuses before touching the volume, in its words.
    #[error(transparent)]
    SubPathRefused(SubPathError),
    #[error("container {container:?} mounts volume {volume:?} with subPath {sub_path:?}: {why}")]
    InvalidSubPath {
        container: String,
        volume: String,
        sub_path: String,
        why: &'static str,
    },
    /// The kubelet's words, which name no host path: the cause is in the source, for the log.
    #[error(
        "failed to create subPath directory for volumeMount {volume:?} of container {container:?}"
    )]
    SubPathCreate {
        container: String,
        volume: String,
        #[source]
        source: SubPathError,
    },
    #[error("failed to prepare subPath for volumeMount {volume:?} of container {container:?}")]
    SubPathPrepare {
        container: String,
        volume: String,
        #[source]
        source: SubPathError,
    },
    #[error("volume {volume:?}: fsGroup {fs_group} is not a valid group id")]
    InvalidFsGroup { volume: String, fs_group: i64 },
    #[error("volume {volume:?}")]
    Ownership {
        volume: String,
        #[source]
        source: OwnershipError,
    },
    #[error(
        "container {container:?} mounts volume {volume:?} at {path:?}: mountPath must be absolute"
    )]
    RelativeMountPath {
        container: String,
        volume: String,
        path: String,
    },
    #[error(
        "container {container:?} mounts volume {volume:?} with invalid mountPropagation {value:?}"
    )]
    InvalidPropagation {
        container: String,
        volume: String,
        value: String,
    },
    #[error("removing the volumes of the pod at {path}")]
    Cleanup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: RemoveError,
    },
    #[error("unmounting the subPaths of the pod at {path}")]
    SubPathCleanup {
        path: PathBuf,
        #[source]
        source: SubPathError,
    },
}

/// One volume of a pod that could not be prepared.
#[derive(Debug)]
pub struct MountFailure {
    pub volume: String,
    pub error: VolumeError,
}

impl MountFailure {
    /// The kubelet's event message: `MountVolume.SetUp failed for volume "x" : <why>`.
    pub fn message(&self) -> String {
        format!(
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume,
            crate::error_chain::error_chain(&self.error)
        )
    }
}

/// The kinds of volume this agent prepares.
enum Source<'a> {
    EmptyDir(&'a EmptyDirVolumeSource),
    HostPath(&'a HostPathVolumeSource),
    ConfigMap(&'a k8s_openapi::api::core::v1::ConfigMapVolumeSource),
    Secret(&'a k8s_openapi::api::core::v1::SecretVolumeSource),
    DownwardApi(&'a DownwardAPIVolumeSource),
    Projected(&'a ProjectedVolumeSource),
}

impl<'a> Source<'a> {
    fn of(volume: &'a Volume) -> Result<Self, VolumeError> {
        let source = if let Some(s) = &volume.empty_dir {
            Self::EmptyDir(s)
        } else if let Some(s) = &volume.host_path {
            Self::HostPath(s)
        } else if let Some(s) = &volume.config_map {
            Self::ConfigMap(s)
        } else if let Some(s) = &volume.secret {
            Self::Secret(s)
        } else if let Some(s) = &volume.downward_api {
            Self::DownwardApi(s)
        } else if let Some(s) = &volume.projected {
            Self::Projected(s)
        } else {
            return Err(source_kind(volume).map_or_else(
                || VolumeError::NoSource {
                    volume: volume.name.clone(),
                },
                |kind| VolumeError::Unsupported {
                    volume: volume.name.clone(),
                    kind,
                },
            ));
        };
        Ok(source)
    }

    /// The plugin directory of the volume; `None` for a hostPath, which lives where it says.
    fn plugin_dir(&self) -> Option<&'static str> {
        match self {
            Self::EmptyDir(_) => Some(EMPTY_DIR_PLUGIN),
            Self::HostPath(_) => None,
            Self::ConfigMap(_) => Some(CONFIG_MAP_PLUGIN),
            Self::Secret(_) => Some(SECRET_PLUGIN),
            Self::DownwardApi(_) => Some(DOWNWARD_API_PLUGIN),
            Self::Projected(_) => Some(PROJECTED_PLUGIN),
        }
    }

    /// Whether containers must mount it read-only (the API-backed volumes).
    fn read_only(&self) -> bool {
        !matches!(self, Self::EmptyDir(_) | Self::HostPath(_))
    }
}

/// The API field name of a volume's source (e.g. `persistentVolumeClaim`), for sources this agent
/// does not implement.
fn source_kind(volume: &Volume) -> Option<String> {
    let json = serde_json::to_value(volume).ok()?;
    json.as_object()?.keys().find(|k| *k != "name").cloned()
}

/// Whether `name` can be one directory name (no `/`, not `.` or `..`).
fn is_dir_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(components.next(), Some(Component::Normal(c)) if c == name)
        && components.next().is_none()
}

/// Where a volume lives on the host and whether containers must mount it read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HostVolume {
    path: PathBuf,
    read_only: bool,
}

/// The host paths of a pod's volumes, by volume name, and what mounts their subPaths.
#[derive(Clone)]
pub struct PodVolumes {
    volumes: HashMap<String, HostVolume>,
    pod_dir: PathBuf,
    mounter: Arc<dyn Mounter>,
}

impl PodVolumes {
    /// Where the pod's volumes live (the paths [`VolumeManager::mount_pod`] prepared); volumes of a
    /// kind this agent does not prepare are left out.
    pub fn of(pod: &Pod, pod_dir: &Path) -> Self {
        Self::with_mounter(pod, pod_dir, Arc::new(SystemMounter))
    }

    fn with_mounter(pod: &Pod, pod_dir: &Path, mounter: Arc<dyn Mounter>) -> Self {
        let volumes = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|volume| {
                let source = Source::of(volume).ok()?;
                let path = match (&source, source.plugin_dir()) {
                    (Source::HostPath(host), _) => PathBuf::from(&host.path),
                    (_, Some(plugin)) => volume_dir(pod_dir, plugin, &volume.name),
                    (_, None) => return None,
                };
                let read_only = source.read_only();
                Some((volume.name.clone(), HostVolume { path, read_only }))
            })
            .collect();
        Self {
            volumes,
            pod_dir: pod_dir.to_owned(),
            mounter,
        }
    }

    /// The CRI mounts for a container's `volumeMounts`, `env` its environment (for `subPathExpr`,
    /// as the kubelet's `makeMounts`). A `subPath` is resolved in its volume (its missing
    /// directories created) and bind-mounted under the pod's directory, so this belongs on the
    /// blocking pool.
    pub fn mounts_for(
        &self,
        container: &Container,
        env: &[KeyValue],
    ) -> Result<Vec<Mount>, VolumeError> {
        let vars: HashMap<&str, &str> = env
            .iter()
            .map(|var| (var.key.as_str(), var.value.as_str()))
            .collect();
        container
            .volume_mounts
            .iter()
            .flatten()
            .enumerate()
            .map(|(index, mount)| {
                let err_ctx = || (container.name.clone(), mount.name.clone());
                let Some(volume) = self.volumes.get(&mount.name) else {
                    let (container, volume) = err_ctx();
                    return Err(VolumeError::UnknownVolume { container, volume });
                };
                let sub_path = match mount.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                    Some(expr) => Some(
                        subpath::expand_expr(expr, |name| vars.get(name).copied())
                            .map_err(VolumeError::SubPathRefused)?,
                    ),
                    None => mount.sub_path.clone(),
                };
                let host_path = match sub_path.as_deref().filter(|p| !p.is_empty()) {
                    Some(sub_path) => {
                        self.sub_path(container, index, mount, &volume.path, sub_path)?
                    }
                    None => volume.path.clone(),
                };
                if !mount.mount_path.starts_with('/') {
                    let (container, volume) = err_ctx();
                    return Err(VolumeError::RelativeMountPath {
                        container,
                        volume,
                        path: mount.mount_path.clone(),
                    });
                }
                let propagation = match mount.mount_propagation.as_deref() {
                    None | Some("" | "None") => MountPropagation::PropagationPrivate,
                    Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
                    Some("Bidirectional") => MountPropagation::PropagationBidirectional,
                    Some(other) => {
                        let (container, volume) = err_ctx();
                        return Err(VolumeError::InvalidPropagation {
                            container,
                            volume,
                            value: other.to_owned(),
                        });
                    }
                };
                Ok(Mount {
                    container_path: mount.mount_path.clone(),
                    host_path: host_path.to_string_lossy().into_owned(),
                    readonly: mount.read_only.unwrap_or(false) || volume.read_only,
                    propagation: propagation.into(),
                    ..Mount::default()
                })
            })
            .collect()
    }

    /// The bind mount of the `index`th mount's subPath (see [`subpath`]).
    fn sub_path(
        &self,
        container: &Container,
        index: usize,
        mount: &VolumeMount,
        volume_path: &Path,
        sub_path: &str,
    ) -> Result<PathBuf, VolumeError> {
        let invalid = |why| VolumeError::InvalidSubPath {
            container: container.name.clone(),
            volume: mount.name.clone(),
            sub_path: sub_path.to_owned(),
            why,
        };
        // Both name directories of the bind target.
        if !is_dir_name(&container.name) || !is_dir_name(&mount.name) {
            return Err(invalid(
                "the container or volume name is not a directory name",
            ));
        }
        let target = subpath::bind_target(&self.pod_dir, &mount.name, &container.name, index);
        subpath::prepare(self.mounter.as_ref(), volume_path, sub_path, &target).map_err(|err| {
            if let SubPathError::Invalid(why) = err {
                return invalid(why);
            }
            if err.is_refusal() {
                return VolumeError::SubPathRefused(err);
            }
            tracing::warn!(container = %container.name, volume = %mount.name, sub_path,
                error = %crate::error_chain::error_chain(&err), "cannot mount a subPath");
            let (container, volume) = (container.name.clone(), mount.name.clone());
            if err.is_create() {
                VolumeError::SubPathCreate {
                    container,
                    volume,
                    source: err,
                }
            } else {
                VolumeError::SubPathPrepare {
                    container,
                    volume,
                    source: err,
                }
            }
        })
    }
}

fn volume_dir(pod_dir: &Path, plugin: &str, name: &str) -> PathBuf {
    pod_dir.join(VOLUMES_DIR).join(plugin).join(name)
}

/// The pod's `fsGroup` as a group id.
fn fs_group(pod: &Pod, volume: &str) -> Result<Option<u32>, VolumeError> {
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref()?.fs_group);
    fs_group
        .map(|group| {
            u32::try_from(group).map_err(|_| VolumeError::InvalidFsGroup {
                volume: volume.to_owned(),
                fs_group: group,
            })
        })
        .transpose()
}

/// Where the emptyDir plugin marks a volume (or the directory under another volume) set up.
fn ready_file(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir
        .join(PLUGINS_DIR)
        .join(EMPTY_DIR_PLUGIN)
        .join(name)
        .join(READY_FILE)
}

fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn io_error(volume: &str, path: &Path, source: io::Error) -> VolumeError {
    VolumeError::Io {
        volume: volume.to_owned(),
        path: path.to_owned(),
        source,
    }
}

/// What a volume directory is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Medium {
    Disk,
    /// A tmpfs of at most `size` bytes (`None`: the kernel's default).
    Memory {
        size: Option<u64>,
    },
}

/// Sets up the directory of a volume (the kubelet's emptyDir `SetUpAt`, which the other plugins
/// wrap). Once it is marked `ready`, there is nothing to do while it is there (a memory one still
/// mounted). Else it is created (mode 0777), a tmpfs is mounted on it for [`Medium::Memory`]
/// unless one is there already, it is given the `fsGroup` (as a writable volume, as the kubelet
/// does for the directory under every volume), and marked ready.
fn setup_dir(
    volume: &str,
    path: &Path,
    medium: Medium,
    ready: &Path,
    ownership: Option<Ownership>,
    mounter: &dyn Mounter,
) -> Result<(), VolumeError> {
    let is_mounted = |path: &Path| {
        mounter
            .is_mount_point(path)
            .map_err(|source| io_error(volume, path, source))
    };
    if ready.exists() {
        let present = match medium {
            Medium::Disk => path.is_dir(),
            Medium::Memory { .. } => path.is_dir() && is_mounted(path)?,
        };
        if present {
            return Ok(());
        }
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(EMPTY_DIR_MODE)
        .create(path)
        .map_err(|source| io_error(volume, path, source))?;
    if let Medium::Memory { size } = medium {
        if !is_mounted(path)? {
            mounter
                .mount_tmpfs(path, size)
                .map_err(|source| VolumeError::Mount {
                    path: path.to_owned(),
                    source,
                })?;
        }
    } else {
        set_mode(path, EMPTY_DIR_MODE).map_err(|source| io_error(volume, path, source))?;
    }
    if let Some(ownership) = ownership {
        ownership
            .apply(path)
            .map_err(|source| VolumeError::Ownership {
                volume: volume.to_owned(),
                source,
            })?;
    }
    if let Some(dir) = ready.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|source| io_error(volume, dir, source))?;
    }
    fs::write(ready, b"").map_err(|source| io_error(volume, ready, source))
}

fn setup_host_path(name: &str, source: &HostPathVolumeSource) -> Result<(), VolumeError> {
    let path = PathBuf::from(&source.path);
    if !path.is_absolute() {
        return Err(VolumeError::RelativeHostPath {
            volume: name.to_owned(),
            path: source.path.clone(),
        });
    }
    let mismatch = |expected| VolumeError::HostPathTypeMismatch {
        volume: name.to_owned(),
        path: path.clone(),
        expected,
    };
    let file_type = fs::metadata(&path).ok().map(|m| m.file_type());
    let check = |ok: bool, expected| if ok { Ok(()) } else { Err(mismatch(expected)) };
    match source.type_.as_deref().unwrap_or_default() {
        "" => Ok(()),
        "DirectoryOrCreate" => match file_type {
            Some(t) if t.is_dir() => Ok(()),
            Some(_) => Err(mismatch("a directory")),
            None => fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&path)
                .map_err(|e| io_error(name, &path, e)),
        },
        "Directory" => check(
            file_type.is_some_and(|t| t.is_dir()),
            "an existing directory",
        ),
        "FileOrCreate" => match file_type {
            Some(t) if t.is_file() => Ok(()),
            Some(_) => Err(mismatch("a regular file")),
            None => fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o644)
                .open(&path)
                .map(drop)
                .map_err(|e| io_error(name, &path, e)),
        },
        "File" => check(
            file_type.is_some_and(|t| t.is_file()),
            "an existing regular file",
        ),
        "Socket" => check(
            file_type.is_some_and(|t| t.is_socket()),
            "an existing unix socket",
        ),
        "CharDevice" => check(
            file_type.is_some_and(|t| t.is_char_device()),
            "an existing character device",
        ),
        "BlockDevice" => check(
            file_type.is_some_and(|t| t.is_block_device()),
            "an existing block device",
        ),
        other => Err(VolumeError::InvalidHostPathType {
            volume: name.to_owned(),
            kind: other.to_owned(),
        }),
    }
}

/// Unmounts the pod's subPath binds and every tmpfs under `<pod_dir>/volumes`, then removes the
/// volumes and their ready markers, never crossing into a mount still left below.
fn teardown(pod_dir: &Path, mounter: &dyn Mounter) -> Result<(), VolumeError> {
    subpath::clean(mounter, pod_dir).map_err(|source| VolumeError::SubPathCleanup {
        path: pod_dir.to_owned(),
        source,
    })?;
    let volumes = pod_dir.join(VOLUMES_DIR);
    let cleanup = |path: &Path, source| VolumeError::Cleanup {
        path: path.to_owned(),
        source,
    };
    let plugins = match fs::read_dir(&volumes) {
        Ok(entries) => Some(entries),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(cleanup(&volumes, e)),
    };
    for plugin in plugins.into_iter().flatten() {
        let plugin = plugin.map_err(|e| cleanup(&volumes, e))?.path();
        if !fs::symlink_metadata(&plugin).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        for volume in fs::read_dir(&plugin).map_err(|e| cleanup(&plugin, e))? {
            let volume = volume.map_err(|e| cleanup(&plugin, e))?.path();
            if mounter.is_mount_point(&volume).unwrap_or(false) {
                mounter
                    .unmount(&volume)
                    .map_err(|source| VolumeError::Unmount {
                        path: volume.clone(),
                        source,
                    })?;
            }
        }
    }
    for dir in [volumes, pod_dir.join(PLUGINS_DIR).join(EMPTY_DIR_PLUGIN)] {
        remove_all_one_filesystem(&dir)
            .map_err(|source| VolumeError::Remove { path: dir, source })?;
    }
    Ok(())
}

/// The memory limit of the pod as its cgroup gets it, when every app container declares one: the
/// sum of the app containers' limits or the largest init container's, whichever is larger.
fn pod_memory_limit(pod: &Pod) -> Option<i128> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| {
        let quantity = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        let nanos = parse_quantity(&quantity.0).ok()?;
        Some(nanos / 1_000_000_000).filter(|bytes| *bytes > 0)
    };
    let apps: Option<Vec<i128>> = spec.containers.iter().map(limit).collect();
    let sum: i128 = apps?.into_iter().sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(limit)
        .max()
        .unwrap_or(0);
    Some(sum.max(init)).filter(|bytes| *bytes > 0)
}

fn quantity_bytes(quantity: &Quantity) -> Option<i128> {
    parse_quantity(&quantity.0)
        .ok()
        .map(|nanos| nanos / 1_000_000_000)
        .filter(|bytes| *bytes > 0)
}

/// The size of a memory-backed volume (the kubelet's `calculateEmptyDirMemorySize`): the node's
/// allocatable memory, lowered to the pod's memory limit and then to `size_limit` when they are
/// smaller. `None` leaves the kernel's default.
fn memory_volume_size(
    node_allocatable: &BTreeMap<String, Quantity>,
    pod: &Pod,
    size_limit: Option<&Quantity>,
) -> Option<u64> {
    let mut size = node_allocatable.get("memory").and_then(quantity_bytes);
    let lower = |size: Option<i128>, candidate: Option<i128>| match (size, candidate) {
        (Some(s), Some(c)) if c <= s => Some(c),
        (None, Some(c)) => Some(c),
        (s, _) => s,
    };
    size = lower(size, pod_memory_limit(pod));
    size = lower(size, size_limit.and_then(quantity_bytes));
    size.and_then(|s| u64::try_from(s).ok())
}

struct Inner {
    pods_dir: PathBuf,
    objects: Option<ApiObjects>,
    node: watch::Receiver<Option<Node>>,
    mounter: Arc<dyn Mounter>,
}

/// Prepares and removes the pods' volumes. Cheap to clone.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

impl VolumeManager {
    /// Volumes under `pods_dir` (`<root-dir>/pods`); `objects` reads what API-backed volumes need
    /// (`None` standalone); `node` is the Node as last published (its allocatable sizes memory
    /// volumes and answers `resourceFieldRef`s).
    pub fn new(
        pods_dir: PathBuf,
        objects: Option<ApiObjects>,
        node: watch::Receiver<Option<Node>>,
    ) -> Self {
        Self::with_mounter(pods_dir, objects, node, Arc::new(SystemMounter))
    }

    fn with_mounter(
        pods_dir: PathBuf,
        objects: Option<ApiObjects>,
        node: watch::Receiver<Option<Node>>,
        mounter: Arc<dyn Mounter>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pods_dir,
                objects,
                node,
                mounter,
            }),
        }
    }

    fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        self.inner
            .node
            .borrow()
            .as_ref()
            .and_then(|node| node.status.as_ref()?.allocatable.clone())
            .unwrap_or_default()
    }

    fn pod_dir(&self, uid: &str) -> Result<PathBuf, VolumeError> {
        if is_dir_name(uid) {
            Ok(self.inner.pods_dir.join(uid))
        } else {
            Err(VolumeError::InvalidPodUid {
                uid: uid.to_owned(),
            })
        }
    }

    /// Runs `work` on the blocking pool with the mounter.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Mounter) -> Result<T, VolumeError> + Send + 'static,
    ) -> Result<T, VolumeError> {
        let mounter = Arc::clone(&self.inner.mounter);
        tokio::task::spawn_blocking(move || work(mounter.as_ref()))
            .await
            .map_err(|err| VolumeError::Task(err.to_string()))?
    }

    /// Prepares (or refreshes) every volume of the pod. Each volume is tried; the ones that failed
    /// are returned with why.
    pub async fn mount_pod(&self, pod: &Pod) -> Result<(), Vec<MountFailure>> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let volumes: Vec<&Volume> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .collect();
        if volumes.is_empty() {
            return Ok(());
        }
        let pod_dir = match self.pod_dir(uid) {
            Ok(dir) => dir,
            Err(error) => {
                return Err(vec![MountFailure {
                    volume: volumes[0].name.clone(),
                    error,
                }]);
            }
        };
        let mut seen = HashSet::new();
        let mut failures = Vec::new();
        for volume in volumes {
            let name = &volume.name;
            let outcome = if !is_dir_name(name) {
                Err(VolumeError::InvalidName {
                    volume: name.clone(),
                })
            } else if !seen.insert(name.as_str()) {
                Err(VolumeError::DuplicateName {
                    volume: name.clone(),
                })
            } else {
                self.mount_volume(pod, &pod_dir, volume).await
            };
            if let Err(error) = outcome {
                failures.push(MountFailure {
                    volume: name.clone(),
                    error,
                });
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }

    async fn mount_volume(
        &self,
        pod: &Pod,
        pod_dir: &Path,
        volume: &Volume,
    ) -> Result<(), VolumeError> {
        let name = volume.name.clone();
        let source = Source::of(volume)?;
        // Every volume but a hostPath (which returns first) lives in a plugin directory.
        let dir = source
            .plugin_dir()
            .map(|plugin| volume_dir(pod_dir, plugin, &name))
            .unwrap_or_default();
        let ready = ready_file(pod_dir, &name);
        let fs_group = fs_group(pod, &name)?;
        // The directory is the emptyDir's, writable; the API volumes' files are read-only.
        let dir_ownership = fs_group.map(|gid| Ownership {
            gid,
            read_only: false,
        });
        let file_ownership = fs_group.map(|gid| Ownership {
            gid,
            read_only: true,
        });
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let memory = |limit| Medium::Memory {
            size: memory_volume_size(&self.node_allocatable(), pod, limit),
        };
        let (payload, medium) = match source {
            Source::HostPath(host) => {
                let host = host.clone();
                return self.blocking(move |_| setup_host_path(&name, &host)).await;
            }
            Source::EmptyDir(empty) => {
                let medium = match empty.medium.as_deref() {
                    None | Some("") => Medium::Disk,
                    Some("Memory") => memory(empty.size_limit.as_ref()),
                    Some(medium) => {
                        return Err(VolumeError::UnsupportedMedium {
                            volume: name,
                            medium: medium.to_owned(),
                        });
                    }
                };
                return self
                    .blocking(move |mounter| {
                        setup_dir(&name, &dir, medium, &ready, dir_ownership, mounter)
                    })
                    .await;
            }
            Source::ConfigMap(cm) => {
                let optional = cm.optional == Some(true);
                let object = self.config_map(namespace, &cm.name, optional).await?;
                let payload = projection::config_map(
                    cm.items.as_deref(),
                    object.as_deref(),
                    cm.default_mode,
                    optional,
                )?;
                (payload, Medium::Disk)
            }
            Source::Secret(secret) => {
                let optional = secret.optional == Some(true);
                let secret_name = secret.secret_name.as_deref().unwrap_or_default();
                let object = self.secret(namespace, secret_name, optional).await?;
                let payload = projection::secret(
                    secret.items.as_deref(),
                    object.as_deref(),
                    secret.default_mode,
                    optional,
                )?;
                (payload, memory(None))
            }
            Source::DownwardApi(downward) => {
                let payload = projection::downward_api(
                    downward.items.as_deref(),
                    pod,
                    &self.node_allocatable(),
                    downward.default_mode,
                )?;
                (payload, Medium::Disk)
            }
            Source::Projected(projected) => {
                let payload = self
                    .projected(pod, &name, projected, fs_group.is_some())
                    .await?;
                (payload, memory(None))
            }
        };
        self.blocking(move |mounter| {
            setup_dir(&name, &dir, medium, &ready, dir_ownership, mounter)?;
            atomic_writer::write(&dir, &payload, file_ownership)?;
            Ok(())
        })
        .await
    }

    /// The ConfigMap, `None` when it is optional and does not exist.
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
        optional: bool,
    ) -> Result<Option<Arc<ConfigMap>>, VolumeError> {
        let Some(objects) = &self.inner.objects else {
            return Err(VolumeError::NoApiServer {
                kind: "configMap",
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        };
        match objects.config_maps.get(namespace, name).await {
            Ok(object) => Ok(Some(object)),
            Err(err) if err.is_not_found() && optional => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// The Secret, `None` when it is optional and does not exist.
    async fn secret(
        &self,
        namespace: &str,
        name: &str,
        optional: bool,
    ) -> Result<Option<Arc<Secret>>, VolumeError> {
        let Some(objects) = &self.inner.objects else {
            return Err(VolumeError::NoApiServer {
                kind: "secret",
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        };
        match objects.secrets.get(namespace, name).await {
            Ok(object) => Ok(Some(object)),
            Err(err) if err.is_not_found() && optional => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// The files of a projected volume (the kubelet's `collectData`): every source is tried, a later
    /// source's file replaces an earlier one's at the same path, and the failures are reported
    /// together. With an `fsGroup` a token is made 0600, which the group's read makes 0640.
    async fn projected(
        &self,
        pod: &Pod,
        volume: &str,
        projected: &ProjectedVolumeSource,
        has_fs_group: bool,
    ) -> Result<Payload, VolumeError> {
        let Some(objects) = &self.inner.objects else {
            return Err(VolumeError::ProjectedWithoutApiServer {
                volume: volume.to_owned(),
            });
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let default_mode = projected.default_mode;
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        for source in projected.sources.iter().flatten() {
            let part = if let Some(cm) = &source.config_map {
                let optional = cm.optional == Some(true);
                match self.config_map(namespace, &cm.name, optional).await {
                    Ok(object) => projection::config_map(
                        cm.items.as_deref(),
                        object.as_deref(),
                        default_mode,
                        optional,
                    )
                    .map_err(VolumeError::from),
                    Err(err) => Err(err),
                }
            } else if let Some(secret) = &source.secret {
                let optional = secret.optional == Some(true);
                match self.secret(namespace, &secret.name, optional).await {
                    Ok(object) => projection::secret(
                        secret.items.as_deref(),
                        object.as_deref(),
                        default_mode,
                        optional,
                    )
                    .map_err(VolumeError::from),
                    Err(err) => Err(err),
                }
            } else if let Some(downward) = &source.downward_api {
                projection::downward_api(
                    downward.items.as_deref(),
                    pod,
                    &self.node_allocatable(),
                    default_mode,
                )
                .map_err(VolumeError::from)
            } else if let Some(token) = &source.service_account_token {
                let mode = if has_fs_group {
                    Some(TOKEN_MODE_WITH_FS_GROUP)
                } else {
                    default_mode
                };
                self.token(objects, pod, token, mode).await
            } else {
                // clusterTrustBundle and podCertificate sources are not served.
                let kind = serde_json::to_value(source)
                    .ok()
                    .and_then(|v| v.as_object()?.keys().next().cloned())
                    .unwrap_or_default();
                Err(VolumeError::Unsupported {
                    volume: volume.to_owned(),
                    kind: format!("projected {kind}"),
                })
            };
            match part {
                Ok(part) => payload.extend(part),
                Err(err) => errors.push(err),
            }
        }
        match errors.len() {
            0 => Ok(payload),
            1 => Err(errors.remove(0)),
            _ => Err(VolumeError::Several(errors)),
        }
    }

    async fn token(
        &self,
        objects: &ApiObjects,
        pod: &Pod,
        source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
        default_mode: Option<i32>,
    ) -> Result<Payload, VolumeError> {
        let meta = &pod.metadata;
        let spec = TokenSpec {
            namespace: meta.namespace.clone().unwrap_or_default(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            audience: source.audience.clone().unwrap_or_default(),
            expiration_seconds: source.expiration_seconds,
            pod_name: meta.name.clone().unwrap_or_default(),
            pod_uid: meta.uid.clone().unwrap_or_default(),
        };
        let token = objects.tokens.get(&spec).await?;
        Ok(projection::token(&source.path, token, default_mode)?)
    }

    /// Removes the pod's volumes: unmounts its tmpfs mounts and removes `<pod_dir>/volumes`. Host
    /// paths are never touched. A pod without volumes is fine.
    pub async fn unmount_pod(&self, uid: &PodUid) -> Result<(), VolumeError> {
        let pod_dir = self.pod_dir(uid.as_str())?;
        self.blocking(move |mounter| teardown(&pod_dir, mounter))
            .await
    }

    /// The UIDs that have a directory under the pods directory.
    pub async fn pod_dirs(&self) -> Vec<PodUid> {
        let pods_dir = self.inner.pods_dir.clone();
        let listed = self
            .blocking(move |_| {
                let Ok(entries) = fs::read_dir(&pods_dir) else {
                    return Ok(Vec::new());
                };
                Ok(entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().to_str().map(PodUid::from))
                    .collect())
            })
            .await;
        listed.unwrap_or_default()
    }

    /// Removes the directories of pods nothing owns any more (the kubelet's
    /// `cleanupOrphanedPodDirs`), volumes unmounted first. A failure is logged and retried at the
    /// next housekeeping.
    pub async fn remove_pod_dirs(&self, uids: Vec<PodUid>) {
        for uid in uids {
            let Ok(pod_dir) = self.pod_dir(uid.as_str()) else {
                continue;
            };
            let removed = self
                .blocking(move |mounter| {
                    teardown(&pod_dir, mounter)?;
                    remove_all_one_filesystem(&pod_dir).map_err(|source| VolumeError::Remove {
                        path: pod_dir.clone(),
                        source,
                    })
                })
                .await;
            match removed {
                Ok(()) => tracing::info!(%uid, "removed the directory of a pod that is gone"),
                Err(err) => tracing::warn!(%uid, error = %crate::error_chain::error_chain(&err),
                    "cannot remove the directory of a pod that is gone"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
