//! `subPath` mounts a container cannot redirect (the kubelet's `pkg/volume/util/subpath`,
//! `subpath_linux.go`: `SafeMakeDir`, `PrepareSafeSubpath`, `CleanSubPaths`; the fixes of
//! CVE-2017-1002101 and CVE-2021-25741). A volume is writable by the pod's containers, so any name
//! in it may be a symlink a container planted, pointing anywhere on the host, and may be swapped
//! for one at any moment:
//!
//! - the subPath is resolved in the kernel, beneath the volume's root (`openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`): a link that stays inside the volume is followed,
//!   one that leaves it (absolute, or through `..`) is refused;
//! - missing directories are created one at a time with `mkdirat` in the parent already opened,
//!   each then opened without following links, with the volume root's mode;
//! - what the runtime gets is not a path into the volume but a bind mount of the opened file
//!   (`/proc/self/fd/<n>`) at `<pod dir>/volume-subpaths/<volume>/<container>/<index>`, which a
//!   container cannot swap. It stays for the container's restarts and is unmounted and removed
//!   with the pod's volumes ([`clean`]), never by a recursive removal.
//!
//! A `subPathExpr` is first expanded with the container's environment ([`expand_expr`], the
//! kubelet's `ExpandContainerVolumeMounts`); an absolute result or one with `..` is refused in the
//! kubelet's words, as a plain `subPath` is.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::mounter::{Mounter, Placement};

/// Where the bind mounts live in a pod's directory.
pub const SUBPATHS_DIR: &str = "volume-subpaths";
/// Modes of what is created there: only the agent (and the runtime) need to get in.
const BIND_DIR_MODE: u32 = 0o750;
const BIND_FILE_MODE: u32 = 0o640;
/// A target found still mounted after this many unmounts is left, with an error.
const MAX_UNMOUNTS: usize = 8;

/// Why a subPath could not be mounted or cleaned up.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// The subPath names nothing in the volume, or leads out of it through a link.
    #[error("{0}")]
    Invalid(&'static str),
    /// A `subPathExpr` refers to variables the container does not have or has empty (sorted).
    #[error("missing value for {}", .0.join(", "))]
    MissingValues(Vec<String>),
    #[error("error SubPath `{0}` must not be an absolute path")]
    Absolute(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    Backsteps(String),
    #[error("creating {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{action} {path}")]
    Prepare {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is still mounted after {MAX_UNMOUNTS} unmounts")]
    StillMounted { path: PathBuf },
    #[error("cleaning up the subPath mount {path}")]
    Clean {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl SubPathError {
    /// Whether it happened while creating the subPath's missing directories.
    pub fn is_create(&self) -> bool {
        matches!(self, Self::Create { .. })
    }

    /// Whether the kubelet refuses this subPath with these words, before it touches the volume.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::MissingValues(_) | Self::Absolute(_) | Self::Backsteps(_)
        )
    }
}

/// Expands a `subPathExpr` with the container's environment, `env` looking a variable up
/// (`$(NAME)`, `$$` for a `$`, as in `command`), except that a variable the environment lacks or
/// has empty is an error naming them all: a path with a part left out would be another directory.
pub fn expand_expr<'v>(
    expr: &str,
    env: impl Fn(&str) -> Option<&'v str>,
) -> Result<String, SubPathError> {
    let missing = RefCell::new(BTreeSet::new());
    let expanded = crate::kuberuntime::container::expand(expr, |name| {
        let value = env(name).filter(|v| !v.is_empty());
        if value.is_none() {
            missing.borrow_mut().insert(name.to_owned());
        }
        Some(value.unwrap_or_default())
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(SubPathError::MissingValues(missing.into_iter().collect()))
    }
}

fn prepare_error(action: &'static str, path: &Path) -> impl FnOnce(Errno) -> SubPathError {
    let path = path.to_owned();
    move |errno| SubPathError::Prepare {
        action,
        path,
        source: errno.into(),
    }
}

/// The bind target of the `index`th volume mount of `container`.
pub fn bind_target(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir
        .join(SUBPATHS_DIR)
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// The components of a subPath, which must be relative and free of `..` (`.` and empty ones
/// dropped).
fn components(sub_path: &str) -> Result<Vec<&OsStr>, SubPathError> {
    let path = Path::new(sub_path);
    if path.is_absolute() {
        return Err(SubPathError::Absolute(sub_path.to_owned()));
    }
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            _ => return Err(SubPathError::Backsteps(sub_path.to_owned())),
        }
    }
    if parts.is_empty() {
        return Err(SubPathError::Invalid("must name something in the volume"));
    }
    Ok(parts)
}

/// Resolves `relative` beneath `root`, following links that stay in it; `flags` are the open
/// flags (`O_CLOEXEC` is added).
fn open_beneath(
    root: BorrowedFd<'_>,
    relative: &Path,
    flags: OFlags,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        root,
        relative,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        resolve | ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
}

/// Mounts `sub_path` of the volume at `volume_root` on `target` (see [`bind_target`]), creating
/// its missing directories first; returns the path to hand the runtime.
pub fn prepare(
    mounter: &dyn Mounter,
    volume_root: &Path,
    sub_path: &str,
    target: &Path,
) -> Result<PathBuf, SubPathError> {
    let parts = components(sub_path)?;
    let relative: PathBuf = parts.iter().collect();
    let root = rustix::fs::openat(
        CWD,
        volume_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(prepare_error("opening the volume", volume_root))?;
    make_dirs(root.as_fd(), volume_root, &parts)?;
    let file = open_beneath(root.as_fd(), &relative, OFlags::PATH, ResolveFlags::empty()).map_err(
        |errno| match errno {
            Errno::XDEV => SubPathError::Invalid("resolves outside the volume"),
            errno => prepare_error("opening", &volume_root.join(&relative))(errno),
        },
    )?;
    bind(mounter, file.as_fd(), target)
}

/// Creates the missing directories of `parts` under `root` (the kubelet's `doSafeMakeDir`), with
/// the mode of the volume's root, so a subPath of a volume with an `fsGroup` is usable by the
/// group.
fn make_dirs(root: BorrowedFd<'_>, root_path: &Path, parts: &[&OsStr]) -> Result<(), SubPathError> {
    let create_error = |path: PathBuf| {
        move |errno: Errno| SubPathError::Create {
            path,
            source: errno.into(),
        }
    };
    let mut parent: Option<OwnedFd> = None;
    let mut missing = parts.len();
    for depth in 1..=parts.len() {
        let prefix: PathBuf = parts[..depth].iter().collect();
        match open_beneath(root, &prefix, OFlags::PATH, ResolveFlags::empty()) {
            Ok(fd) => parent = Some(fd),
            Err(Errno::NOENT) => {
                missing = depth - 1;
                break;
            }
            Err(Errno::XDEV) => return Err(SubPathError::Invalid("resolves outside the volume")),
            Err(errno) => return Err(create_error(root_path.join(&prefix))(errno)),
        }
        if depth == parts.len() {
            return Ok(());
        }
    }
    let mode = rustix::fs::fstat(root)
        .map_err(create_error(root_path.to_owned()))?
        .st_mode
        & 0o7777;
    let mut path: PathBuf = root_path.join(parts[..missing].iter().collect::<PathBuf>());
    for part in &parts[missing..] {
        path.push(part);
        let dir = parent.as_ref().map_or(root, AsFd::as_fd);
        let created = match rustix::fs::mkdirat(dir, *part, Mode::from_raw_mode(mode)) {
            Ok(()) => true,
            // Made meanwhile, maybe as a link: the open below refuses anything but a directory.
            Err(Errno::EXIST) => false,
            Err(errno) => return Err(create_error(path)(errno)),
        };
        let child = rustix::fs::openat2(
            dir,
            *part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(create_error(path.clone()))?;
        if created {
            // mkdirat's mode was masked by the umask; the setgid and sticky bits count too.
            rustix::fs::fchmod(&child, Mode::from_raw_mode(mode))
                .map_err(create_error(path.clone()))?;
        }
        parent = Some(child);
    }
    Ok(())
}

/// Bind-mounts the file `fd` holds on `target` (the kubelet's `doBindSubPath`), unless it is there
/// already.
fn bind(mounter: &dyn Mounter, fd: BorrowedFd<'_>, target: &Path) -> Result<PathBuf, SubPathError> {
    let source = Placement::of(fd).map_err(|source| SubPathError::Prepare {
        action: "reading",
        path: target.to_owned(),
        source,
    })?;
    let in_use = match mounter.is_mount_point(target) {
        Ok(is_mount) => is_mount,
        Err(err) if err.kind() == io::ErrorKind::NotFound => false,
        Err(source) => {
            return Err(SubPathError::Prepare {
                action: "checking the mount on",
                path: target.to_owned(),
                source,
            });
        }
    };
    if in_use {
        if Placement::at(target).is_ok_and(|there| there.same_file(&source)) {
            return Ok(target.to_owned());
        }
        mounter
            .unmount(target)
            .map_err(|source| SubPathError::Prepare {
                action: "unmounting a stale subPath mount on",
                path: target.to_owned(),
                source,
            })?;
    }
    let prepare = |action| {
        let path = target.to_owned();
        move |source| SubPathError::Prepare {
            action,
            path,
            source,
        }
    };
    if let Some(parent) = target.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(BIND_DIR_MODE)
            .create(parent)
            .map_err(prepare("creating the parent of"))?;
    }
    // A file is enough for every kind of non-directory: the bind mount gives it the source's type.
    let created = if source.file_type == FileType::Directory {
        match fs::DirBuilder::new().mode(BIND_DIR_MODE).create(target) {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(BIND_FILE_MODE)
            .open(target)
            .map(drop)
    };
    created.map_err(prepare("creating"))?;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if let Err(source) = mounter.bind_mount(&by_fd, target) {
        // Nothing is mounted there: the empty target goes, and the mount is retried next time.
        let _ = fs::remove_dir(target).or_else(|_| fs::remove_file(target));
        return Err(SubPathError::Prepare {
            action: "bind-mounting the subPath on",
            path: target.to_owned(),
            source,
        });
    }
    Ok(target.to_owned())
}

/// Unmounts and removes every subPath mount of the pod (the kubelet's `CleanSubPaths`, for all
/// its volumes). Only empty directories and the targets' own files are removed: a target that
/// cannot be unmounted stops it with an error, its content untouched.
pub fn clean(mounter: &dyn Mounter, pod_dir: &Path) -> Result<(), SubPathError> {
    let root = pod_dir.join(SUBPATHS_DIR);
    let clean_error = |path: &Path| {
        let path = path.to_owned();
        move |source| SubPathError::Clean { path, source }
    };
    let list = |dir: &Path| -> Result<Vec<PathBuf>, SubPathError> {
        let entries = fs::read_dir(dir).map_err(clean_error(dir))?;
        entries
            .map(|entry| entry.map(|e| e.path()).map_err(clean_error(dir)))
            .collect()
    };
    if !root.exists() {
        return Ok(());
    }
    for volume in list(&root)? {
        for container in list(&volume)? {
            for target in list(&container)? {
                unmount_all(mounter, &target)?;
                let is_dir = fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir());
                let removed = if is_dir {
                    fs::remove_dir(&target)
                } else {
                    fs::remove_file(&target)
                };
                removed.map_err(clean_error(&target))?;
            }
            fs::remove_dir(&container).map_err(clean_error(&container))?;
        }
        fs::remove_dir(&volume).map_err(clean_error(&volume))?;
    }
    fs::remove_dir(&root).map_err(clean_error(&root))
}

/// Unmounts `path` until nothing is mounted there (a mount may be stacked on another).
fn unmount_all(mounter: &dyn Mounter, path: &Path) -> Result<(), SubPathError> {
    for _ in 0..MAX_UNMOUNTS {
        let is_mount = mounter
            .is_mount_point(path)
            .map_err(|source| SubPathError::Clean {
                path: path.to_owned(),
                source,
            })?;
        if !is_mount {
            return Ok(());
        }
        mounter
            .unmount(path)
            .map_err(|source| SubPathError::Clean {
                path: path.to_owned(),
                source,
            })?;
    }
    Err(SubPathError::StillMounted {
        path: path.to_owned(),
    })
}

#[cfg(test)]
mod tests;
