//! Removing a pod's directories without crossing into other mounts (the kubelet's
//! `RemoveAllOneFilesystem`, `pkg/util/removeall`, like `rm -rf --one-file-system`). A tmpfs or a
//! bind mount left below a pod's directory (a mount a container propagated out, a subPath bind
//! that could not be unmounted) holds someone else's files, maybe a host directory: it is never
//! emptied, the removal stops there with an error naming it, and the caller retries once it is
//! gone. A file on another mount is recognised by its mount id as well as by its device, since a
//! bind mount of a directory of the same filesystem keeps the device number.
//!
//! Like the kubelet's, it removes what it can and reports the first failure. Directories are
//! entered through descriptors opened without following symlinks, so a link (planted by a
//! container) is removed, never followed.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};

use super::mounter::{Placement, is_mount_point};
use super::ownership::entries;

/// Why a tree was not removed in full.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("cannot delete directory {path}: it is a mount point")]
    MountPoint { path: PathBuf },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> RemoveError {
    let path = path.to_owned();
    move |errno| RemoveError::Io {
        action,
        path,
        source: errno.into(),
    }
}

/// Removes `path` and everything below it that is on its own mount; a missing `path` is fine.
pub fn remove_all_one_filesystem(path: &Path) -> Result<(), RemoveError> {
    let fd = match rustix::fs::openat(
        CWD,
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_error("opening", path)(e)),
    };
    let root = Placement::of(fd.as_fd()).map_err(|source| RemoveError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    if root.file_type != FileType::Directory {
        return rustix::fs::unlinkat(CWD, path, AtFlags::empty())
            .map_err(io_error("removing", path));
    }
    if is_mount_point(path).map_err(|e| RemoveError::Io {
        action: "reading",
        path: path.to_owned(),
        source: e,
    })? {
        return Err(RemoveError::MountPoint {
            path: path.to_owned(),
        });
    }
    let dir = open_dir(&fd, path)?;
    let mut first = remove_children(&dir, path, &root).err();
    if first.is_none() {
        first = rustix::fs::unlinkat(CWD, path, AtFlags::REMOVEDIR)
            .map_err(io_error("removing", path))
            .err();
    }
    first.map_or(Ok(()), Err)
}

/// The directory `fd` (an `O_PATH` descriptor) holds, opened for listing.
fn open_dir(fd: &OwnedFd, path: &Path) -> Result<OwnedFd, RemoveError> {
    rustix::fs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_error("opening", path))
}

/// Removes everything in `dir` (at `path`) that is on `root`'s mount; the first failure, after
/// trying the rest.
fn remove_children(dir: &OwnedFd, path: &Path, root: &Placement) -> Result<(), RemoveError> {
    let names = entries(dir).map_err(|source| RemoveError::Io {
        action: "listing",
        path: path.to_owned(),
        source,
    })?;
    let mut first = None;
    for name in names {
        let child_path = path.join(OsStr::from_bytes(name.to_bytes()));
        if let Err(err) = remove_child(dir, &name, &child_path, root) {
            first.get_or_insert(err);
        }
    }
    first.map_or(Ok(()), Err)
}

fn remove_child(
    dir: &OwnedFd,
    name: &CStr,
    path: &Path,
    root: &Placement,
) -> Result<(), RemoveError> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_error("opening", path)(e)),
    };
    let placement = Placement::of(fd.as_fd()).map_err(|source| RemoveError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    if !placement.same_mount(root) {
        return Err(RemoveError::MountPoint {
            path: path.to_owned(),
        });
    }
    let flags = if placement.file_type == FileType::Directory {
        remove_children(&open_dir(&fd, path)?, path, root)?;
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    match rustix::fs::unlinkat(dir, name, flags) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io_error("removing", path)(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn a_tree_goes_and_links_are_removed_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), "x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pod");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::write(root.join("a/b/c/file"), "y").unwrap();
        fs::write(root.join("top"), "z").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("a/link")).unwrap();
        std::os::unix::fs::symlink("/nowhere", root.join("dangling")).unwrap();

        remove_all_one_filesystem(&root).unwrap();
        assert!(!root.exists());
        assert!(
            outside.path().join("keep").exists(),
            "a link's target stays"
        );
        remove_all_one_filesystem(&root).unwrap();

        let file = dir.path().join("plain");
        fs::write(&file, "1").unwrap();
        remove_all_one_filesystem(&file).unwrap();
        assert!(!file.exists());
    }

    /// Needs root: a tmpfs and a bind mount (of the same filesystem, so the same device) below the
    /// tree; what they hold survives, everything else goes.
    #[test]
    fn mounts_below_are_never_entered() {
        use crate::volumes::mounter::{MountGuard, Mounter as _, SystemMounter};
        if !rustix::process::geteuid().is_root() {
            crate::testing::skip("mounts_below_are_never_entered", "mounting needs root");
            return;
        }
        let host = tempfile::tempdir().unwrap();
        fs::write(host.path().join("precious"), "host data").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pod");
        let (tmpfs, bind) = (root.join("a/tmpfs"), root.join("b/c/bind"));
        fs::create_dir_all(&tmpfs).unwrap();
        fs::create_dir_all(&bind).unwrap();
        fs::write(root.join("b/plain"), "p").unwrap();
        let mut mounted = MountGuard::default();
        SystemMounter.mount_tmpfs(&tmpfs, None).unwrap();
        mounted.0.push(tmpfs.clone());
        fs::write(tmpfs.join("in-tmpfs"), "t").unwrap();
        SystemMounter.bind_mount(host.path(), &bind).unwrap();
        mounted.0.push(bind.clone());
        assert!(
            is_mount_point(&bind).unwrap(),
            "a bind of the same filesystem is a mount point"
        );

        let err = remove_all_one_filesystem(&root).unwrap_err();
        let message = err.to_string();
        assert!(
            message
                == format!(
                    "cannot delete directory {}: it is a mount point",
                    tmpfs.display()
                )
                || message
                    == format!(
                        "cannot delete directory {}: it is a mount point",
                        bind.display()
                    ),
            "{message}"
        );
        assert_eq!(
            fs::read_to_string(host.path().join("precious")).unwrap(),
            "host data"
        );
        assert!(tmpfs.join("in-tmpfs").exists(), "the tmpfs is not emptied");
        assert!(!root.join("b/plain").exists(), "the rest is removed");

        drop(mounted);
        remove_all_one_filesystem(&root).unwrap();
        assert!(!root.exists());
        assert!(host.path().join("precious").exists());
    }

    #[test]
    fn a_mount_point_at_the_top_is_refused() {
        let err = remove_all_one_filesystem(Path::new("/proc")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot delete directory /proc: it is a mount point"
        );
    }
}
