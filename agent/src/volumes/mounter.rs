//! The mounts volumes need (the kubelet's `mount.Interface` as the emptyDir plugin uses it): a
//! tmpfs for memory-backed emptyDirs and for the secret and projected volumes, so secrets and tokens
//! never reach a disk, and its unmount when the pod goes. Behind a trait so the volume logic is
//! tested without privileges.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// Mounts and unmounts for volumes.
pub trait Mounter: Send + Sync {
    /// Mounts a fresh tmpfs on `path` (a directory), `size` bytes at most when given (else the
    /// kernel's default, half the memory).
    fn mount_tmpfs(&self, path: &Path, size: Option<u64>) -> io::Result<()>;

    /// Unmounts whatever is mounted on `path`.
    fn unmount(&self, path: &Path) -> io::Result<()>;

    /// Whether something is mounted on `path`.
    fn is_mount_point(&self, path: &Path) -> io::Result<bool>;
}

/// The host's mount table, through mount(2) and umount2(2).
pub struct SystemMounter;

impl Mounter for SystemMounter {
    fn mount_tmpfs(&self, path: &Path, size: Option<u64>) -> io::Result<()> {
        let options = size.map(|bytes| format!("size={bytes}"));
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::empty(),
            options.as_deref(),
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, path: &Path) -> io::Result<()> {
        match umount2(path, MntFlags::empty()) {
            // Still in use (a process of a container being torn down): detach it, the kernel frees
            // it with its last user.
            Err(Errno::EBUSY) => umount2(path, MntFlags::MNT_DETACH).map_err(io::Error::from),
            other => other.map_err(io::Error::from),
        }
    }

    fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
        is_mount_point(path)
    }
}

/// Whether `path` is on another filesystem than its parent (every tmpfs is its own device).
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let own = std::fs::symlink_metadata(path)?;
    let parent = path.parent().unwrap_or(path);
    let parent = std::fs::metadata(parent)?;
    Ok(own.dev() != parent.dev())
}

#[cfg(test)]
pub mod fake {
    //! A mount table in memory.

    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Mutex;

    use super::{Mounter, Path, io};

    /// Records mounts instead of making them.
    #[derive(Default)]
    pub struct FakeMounter {
        /// Mount point → size.
        pub mounts: Mutex<BTreeMap<PathBuf, Option<u64>>>,
    }

    impl FakeMounter {
        pub fn mounted(&self) -> BTreeMap<PathBuf, Option<u64>> {
            self.mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        }
    }

    impl Mounter for FakeMounter {
        fn mount_tmpfs(&self, path: &Path, size: Option<u64>) -> io::Result<()> {
            self.mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(path.to_owned(), size);
            Ok(())
        }

        fn unmount(&self, path: &Path) -> io::Result<()> {
            self.mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(path)
                .map(|_| ())
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
        }

        fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
            Ok(self
                .mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains_key(path))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_is_not_a_mount_point() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(!is_mount_point(&sub).unwrap());
        assert!(is_mount_point(Path::new("/proc")).unwrap());
    }
}
