//! Pod volumes (the kubelet's `pkg/kubelet/volumemanager` with the `pkg/volume/empty_dir` and
//! `pkg/volume/host_path` plugins, done synchronously): creates a pod's `emptyDir` directories,
//! checks its `hostPath` volumes against their `type`, turns a container's `volumeMounts` (with
//! `subPath`, confined to the volume) into CRI mounts, and removes the pod's volume directories when
//! the pod is gone. `emptyDir` with `medium: Memory`, `subPathExpr` and API-backed sources (configMap,
//! secret, projected, PVC, …) are refused with an error naming them.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, HostPathVolumeSource, Pod, Volume};
use ringlet_proto::runtime::v1::{Mount, MountPropagation};

/// Directory of emptyDir volumes under a pod's directory.
const EMPTY_DIR_PLUGIN_DIR: &str = "volumes/kubernetes.io~empty-dir";

/// Why a pod's volumes could not be prepared or mounted.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: {kind} volumes are not supported by this agent")]
    Unsupported { volume: String, kind: String },
    #[error("volume {volume:?} has no source")]
    NoSource { volume: String },
    #[error(
        "volume {volume:?}: emptyDir medium {medium:?} is not supported (only the default disk medium)"
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
    #[error("container {container:?} mounts volume {volume:?}, which the pod does not define")]
    UnknownVolume { container: String, volume: String },
    #[error(
        "container {container:?} mounts volume {volume:?} with subPathExpr, which is not supported"
    )]
    SubPathExprUnsupported { container: String, volume: String },
    #[error("container {container:?} mounts volume {volume:?} with subPath {sub_path:?}: {why}")]
    InvalidSubPath {
        container: String,
        volume: String,
        sub_path: String,
        why: &'static str,
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
}

/// The host paths of a pod's prepared volumes, by volume name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodVolumes {
    host_paths: HashMap<String, PathBuf>,
}

/// Where an emptyDir volume lives: `<pod_dir>/volumes/kubernetes.io~empty-dir/<name>`.
pub fn empty_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join(EMPTY_DIR_PLUGIN_DIR).join(name)
}

/// Prepares every volume of the pod: creates emptyDir directories (idempotent, contents are kept
/// across container restarts) and checks or creates hostPaths per their `type`.
pub fn setup_pod_volumes(pod: &Pod, pod_dir: &Path) -> Result<PodVolumes, VolumeError> {
    let mut host_paths = HashMap::new();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for volume in volumes {
        let path = setup_volume(volume, pod_dir)?;
        host_paths.insert(volume.name.clone(), path);
    }
    Ok(PodVolumes { host_paths })
}

fn setup_volume(volume: &Volume, pod_dir: &Path) -> Result<PathBuf, VolumeError> {
    let name = &volume.name;
    if let Some(empty_dir) = &volume.empty_dir {
        match empty_dir.medium.as_deref() {
            None | Some("") => {}
            Some(medium) => {
                return Err(VolumeError::UnsupportedMedium {
                    volume: name.clone(),
                    medium: medium.to_owned(),
                });
            }
        }
        let path = empty_dir_path(pod_dir, name);
        // World-writable like upstream, so non-root containers can use the volume.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o777)
            .create(&path)
            .map_err(|source| io_error(name, &path, source))?;
        set_mode(&path, 0o777).map_err(|source| io_error(name, &path, source))?;
        return Ok(path);
    }
    if let Some(host_path) = &volume.host_path {
        return setup_host_path(name, host_path);
    }
    Err(source_kind(volume).map_or_else(
        || VolumeError::NoSource {
            volume: name.clone(),
        },
        |kind| VolumeError::Unsupported {
            volume: name.clone(),
            kind,
        },
    ))
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

fn setup_host_path(name: &str, source: &HostPathVolumeSource) -> Result<PathBuf, VolumeError> {
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
    match source.type_.as_deref().unwrap_or_default() {
        "" => {}
        "DirectoryOrCreate" => match file_type {
            Some(t) if t.is_dir() => {}
            Some(_) => return Err(mismatch("a directory")),
            None => fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&path)
                .map_err(|e| io_error(name, &path, e))?,
        },
        "Directory" => {
            if !file_type.is_some_and(|t| t.is_dir()) {
                return Err(mismatch("an existing directory"));
            }
        }
        "FileOrCreate" => match file_type {
            Some(t) if t.is_file() => {}
            Some(_) => return Err(mismatch("a regular file")),
            None => {
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(&path)
                    .map_err(|e| io_error(name, &path, e))?;
            }
        },
        "File" => {
            if !file_type.is_some_and(|t| t.is_file()) {
                return Err(mismatch("an existing regular file"));
            }
        }
        "Socket" => {
            if !file_type.is_some_and(|t| t.is_socket()) {
                return Err(mismatch("an existing unix socket"));
            }
        }
        "CharDevice" => {
            if !file_type.is_some_and(|t| t.is_char_device()) {
                return Err(mismatch("an existing character device"));
            }
        }
        "BlockDevice" => {
            if !file_type.is_some_and(|t| t.is_block_device()) {
                return Err(mismatch("an existing block device"));
            }
        }
        other => {
            return Err(VolumeError::InvalidHostPathType {
                volume: name.to_owned(),
                kind: other.to_owned(),
            });
        }
    }
    Ok(path)
}

/// The API field name of a volume's source (e.g. `configMap`), for sources this agent does not
/// implement.
fn source_kind(volume: &Volume) -> Option<String> {
    let json = serde_json::to_value(volume).ok()?;
    json.as_object()?.keys().find(|k| *k != "name").cloned()
}

impl PodVolumes {
    /// The CRI mounts for a container's `volumeMounts`.
    pub fn mounts_for(&self, container: &Container) -> Result<Vec<Mount>, VolumeError> {
        container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| {
                let err_ctx = || (container.name.clone(), mount.name.clone());
                let Some(host_path) = self.host_paths.get(&mount.name) else {
                    let (container, volume) = err_ctx();
                    return Err(VolumeError::UnknownVolume { container, volume });
                };
                if mount
                    .sub_path_expr
                    .as_deref()
                    .is_some_and(|p| !p.is_empty())
                {
                    let (container, volume) = err_ctx();
                    return Err(VolumeError::SubPathExprUnsupported { container, volume });
                }
                let host_path = match mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
                    Some(sub_path) => resolve_sub_path(host_path, sub_path).map_err(|e| {
                        let (container, volume) = err_ctx();
                        match e {
                            SubPathError::Invalid(why) => VolumeError::InvalidSubPath {
                                container,
                                volume,
                                sub_path: sub_path.to_owned(),
                                why,
                            },
                            SubPathError::Io(path, source) => VolumeError::Io {
                                volume,
                                path,
                                source,
                            },
                        }
                    })?,
                    None => host_path.clone(),
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
                    readonly: mount.read_only.unwrap_or(false),
                    propagation: propagation.into(),
                    ..Mount::default()
                })
            })
            .collect()
    }
}

enum SubPathError {
    Invalid(&'static str),
    Io(PathBuf, io::Error),
}

/// The host path of `sub_path` inside a volume: created as a directory (with the volume's
/// permissions) when missing, and refused when it would leave the volume, by `..` or by a symlink.
fn resolve_sub_path(root: &Path, sub_path: &str) -> Result<PathBuf, SubPathError> {
    use std::path::Component;
    let relative = Path::new(sub_path);
    if relative.is_absolute() {
        return Err(SubPathError::Invalid("must be a relative path"));
    }
    if relative.components().any(|c| c == Component::ParentDir) {
        return Err(SubPathError::Invalid("must not contain '..'"));
    }
    let path = root.join(relative);
    if fs::symlink_metadata(&path).is_err() {
        let mode = fs::metadata(root).map_or(0o755, |m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o7777
        });
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&path)
            .map_err(|e| SubPathError::Io(path.clone(), e))?;
    }
    let real_root = fs::canonicalize(root).map_err(|e| SubPathError::Io(root.to_owned(), e))?;
    let real = fs::canonicalize(&path).map_err(|e| SubPathError::Io(path.clone(), e))?;
    if real.starts_with(&real_root) {
        Ok(real)
    } else {
        Err(SubPathError::Invalid("resolves outside the volume"))
    }
}

/// Removes the pod's volume directories (`<pod_dir>/volumes`); host paths are never touched. A pod
/// without volumes is fine.
pub fn cleanup_pod_volumes(pod_dir: &Path) -> Result<(), VolumeError> {
    let path = pod_dir.join("volumes");
    match fs::remove_dir_all(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(VolumeError::Cleanup { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, EmptyDirVolumeSource, PodSpec, VolumeMount,
    };

    fn pod(volumes: Vec<Volume>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn empty_dir(name: &str) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }
    }

    fn host_path(name: &str, path: &Path, kind: &str) -> Volume {
        Volume {
            name: name.into(),
            host_path: Some(HostPathVolumeSource {
                path: path.to_string_lossy().into_owned(),
                type_: Some(kind.into()),
            }),
            ..Volume::default()
        }
    }

    fn mounting(mounts: Vec<VolumeMount>) -> Container {
        Container {
            name: "c".into(),
            volume_mounts: Some(mounts),
            ..Container::default()
        }
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..VolumeMount::default()
        }
    }

    #[test]
    fn empty_dir_is_created_under_the_pod_dir_and_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = setup_pod_volumes(&pod(vec![empty_dir("cache")]), dir.path()).unwrap();
        let expected = dir.path().join("volumes/kubernetes.io~empty-dir/cache");
        assert!(expected.is_dir());
        let mut m = mount("cache", "/cache");
        m.read_only = Some(true);
        let mounts = volumes.mounts_for(&mounting(vec![m])).unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].host_path, expected.to_string_lossy());
        assert_eq!(mounts[0].container_path, "/cache");
        assert!(mounts[0].readonly);
        cleanup_pod_volumes(dir.path()).unwrap();
        assert!(!expected.exists());
        cleanup_pod_volumes(dir.path()).unwrap();
    }

    #[test]
    fn memory_medium_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = empty_dir("m");
        v.empty_dir = Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..EmptyDirVolumeSource::default()
        });
        let err = setup_pod_volumes(&pod(vec![v]), dir.path()).unwrap_err();
        assert!(
            matches!(err, VolumeError::UnsupportedMedium { .. }),
            "{err}"
        );
    }

    #[test]
    fn host_path_types_are_checked_and_created() {
        let dir = tempfile::tempdir().unwrap();
        let new_dir = dir.path().join("made");
        let new_file = dir.path().join("file");
        setup_pod_volumes(
            &pod(vec![
                host_path("a", &new_dir, "DirectoryOrCreate"),
                host_path("b", &new_file, "FileOrCreate"),
            ]),
            dir.path(),
        )
        .unwrap();
        assert!(new_dir.is_dir());
        assert!(new_file.is_file());
        setup_pod_volumes(
            &pod(vec![
                host_path("a", &new_dir, "Directory"),
                host_path("b", &new_file, "File"),
                host_path("c", &dir.path().join("anything"), ""),
            ]),
            dir.path(),
        )
        .unwrap();
        for (path, kind) in [
            (&new_file, "Directory"),
            (&new_dir, "File"),
            (&new_dir, "Socket"),
            (&dir.path().join("missing"), "Directory"),
        ] {
            let err =
                setup_pod_volumes(&pod(vec![host_path("x", path, kind)]), dir.path()).unwrap_err();
            assert!(
                matches!(err, VolumeError::HostPathTypeMismatch { .. }),
                "{kind}: {err}"
            );
        }
        let err =
            setup_pod_volumes(&pod(vec![host_path("x", &new_dir, "Dir")]), dir.path()).unwrap_err();
        assert!(matches!(err, VolumeError::InvalidHostPathType { .. }));
    }

    #[test]
    fn socket_host_path_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        setup_pod_volumes(&pod(vec![host_path("s", &sock, "Socket")]), dir.path()).unwrap();
    }

    #[test]
    fn mount_errors_name_the_container_and_volume() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = setup_pod_volumes(&pod(vec![empty_dir("data")]), dir.path()).unwrap();
        let err = volumes
            .mounts_for(&mounting(vec![mount("nope", "/x")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"c\" mounts volume \"nope\", which the pod does not define"
        );
        let mut expr = mount("data", "/x");
        expr.sub_path_expr = Some("$(POD)".into());
        assert!(matches!(
            volumes.mounts_for(&mounting(vec![expr])),
            Err(VolumeError::SubPathExprUnsupported { .. })
        ));
        assert!(matches!(
            volumes.mounts_for(&mounting(vec![mount("data", "rel")])),
            Err(VolumeError::RelativeMountPath { .. })
        ));
    }

    #[test]
    fn sub_paths_are_created_inside_the_volume_and_escapes_refused() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = setup_pod_volumes(&pod(vec![empty_dir("data")]), dir.path()).unwrap();
        let root = empty_dir_path(dir.path(), "data");
        let with_sub = |sub: &str| {
            let mut m = mount("data", "/x");
            m.sub_path = Some(sub.into());
            volumes.mounts_for(&mounting(vec![m]))
        };
        let mounts = with_sub("a/b").unwrap();
        assert_eq!(
            PathBuf::from(&mounts[0].host_path),
            fs::canonicalize(root.join("a/b")).unwrap()
        );
        assert!(root.join("a/b").is_dir());
        for bad in ["../up", "/abs"] {
            assert!(
                matches!(with_sub(bad), Err(VolumeError::InvalidSubPath { .. })),
                "{bad}"
            );
        }
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let err = with_sub("link").unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"c\" mounts volume \"data\" with subPath \"link\": resolves outside the volume"
        );
    }

    #[test]
    fn unsupported_sources_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let v = Volume {
            name: "cm".into(),
            config_map: Some(ConfigMapVolumeSource::default()),
            ..Volume::default()
        };
        let err = setup_pod_volumes(&pod(vec![v]), dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "volume \"cm\": configMap volumes are not supported by this agent"
        );
        let none = Volume {
            name: "n".into(),
            ..Volume::default()
        };
        assert!(matches!(
            setup_pod_volumes(&pod(vec![none]), dir.path()),
            Err(VolumeError::NoSource { .. })
        ));
    }
}
