//! The mounts volumes need (the kubelet's `mount.Interface` as the emptyDir plugin and the subPath
//! code use it): a tmpfs for memory-backed emptyDirs and for the secret and projected volumes, so
//! secrets and tokens never reach a disk; a bind mount of an opened subPath; their unmount when the
//! pod goes. Behind a trait so the volume logic is tested without privileges. Also where a file
//! sits in the mount tree ([`Placement`]), which tells a mount point from a plain directory.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, StatxFlags};

/// Mounts and unmounts for volumes.
pub trait Mounter: Send + Sync {
    /// Mounts a fresh tmpfs on `path` (a directory), `size` bytes at most when given (else the
    /// kernel's default, half the memory).
    fn mount_tmpfs(&self, path: &Path, size: Option<u64>) -> io::Result<()>;

    /// Bind-mounts `source` on `target` (not recursively). The subPath code passes
    /// `/proc/self/fd/<n>`, so what is mounted is the file the descriptor holds, whatever its
    /// path has become since.
    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()>;

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

    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()> {
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
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

/// Where a file sits: its filesystem, its mount and its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub dev: (u32, u32),
    /// The mount's id (`STATX_MNT_ID`, Linux 5.8); `None` when the kernel does not tell.
    pub mount: Option<u64>,
    pub ino: u64,
    pub file_type: FileType,
}

impl Placement {
    /// Of the file `fd` holds (any kind of descriptor, `O_PATH` too; a symlink is not followed).
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let stat = rustix::fs::statx(
            fd,
            "",
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::TYPE | StatxFlags::INO | StatxFlags::MNT_ID,
        )?;
        Ok(Self {
            dev: (stat.stx_dev_major, stat.stx_dev_minor),
            mount: (stat.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(stat.stx_mnt_id),
            ino: stat.stx_ino,
            file_type: FileType::from_raw_mode(u32::from(stat.stx_mode)),
        })
    }

    /// Of the file at `path`, a symlink itself rather than its target.
    pub fn at(path: &Path) -> io::Result<Self> {
        Self::open(path, OFlags::NOFOLLOW)
    }

    fn open(path: &Path, flags: OFlags) -> io::Result<Self> {
        let fd = rustix::fs::openat(
            CWD,
            path,
            flags | OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Self::of(fd.as_fd())
    }

    /// Whether both are on the same mount. A bind mount of a directory of the same filesystem keeps
    /// the device number, so the mount ids decide when the kernel gives them.
    pub fn same_mount(&self, other: &Self) -> bool {
        match (self.mount, other.mount) {
            (Some(a), Some(b)) => a == b && self.dev == other.dev,
            _ => self.dev == other.dev,
        }
    }

    /// Whether both are the same file.
    pub fn same_file(&self, other: &Self) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// Whether `path` is on another mount than its parent: a tmpfs, or a bind mount even of the
/// parent's own filesystem.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let own = Placement::at(path)?;
    let parent = path.parent().unwrap_or(path);
    // The parent as the kernel walks to `path`: through symlinks.
    let parent = Placement::open(parent, OFlags::empty())?;
    Ok(!own.same_mount(&parent))
}

#[cfg(test)]
pub mod fake {
    //! A mount table in memory.

    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::{Mutex, MutexGuard, PoisonError};

    use super::{Mounter, Path, io};

    /// Records mounts instead of making them.
    #[derive(Default)]
    pub struct FakeMounter {
        /// Mount point → size, for each tmpfs.
        pub mounts: Mutex<BTreeMap<PathBuf, Option<u64>>>,
        /// Bind target → the file its source named when it was mounted (for `/proc/self/fd/<n>`,
        /// the path the descriptor held).
        pub binds: Mutex<BTreeMap<PathBuf, PathBuf>>,
    }

    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    impl FakeMounter {
        pub fn mounted(&self) -> BTreeMap<PathBuf, Option<u64>> {
            lock(&self.mounts).clone()
        }

        pub fn bound(&self) -> BTreeMap<PathBuf, PathBuf> {
            lock(&self.binds).clone()
        }
    }

    impl Mounter for FakeMounter {
        fn mount_tmpfs(&self, path: &Path, size: Option<u64>) -> io::Result<()> {
            lock(&self.mounts).insert(path.to_owned(), size);
            Ok(())
        }

        fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()> {
            let file = std::fs::read_link(source).or_else(|_| std::fs::canonicalize(source))?;
            lock(&self.binds).insert(target.to_owned(), file);
            Ok(())
        }

        fn unmount(&self, path: &Path) -> io::Result<()> {
            let tmpfs = lock(&self.mounts).remove(path).is_some();
            let bind = lock(&self.binds).remove(path).is_some();
            if tmpfs || bind {
                Ok(())
            } else {
                Err(io::Error::from(io::ErrorKind::InvalidInput))
            }
        }

        fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
            Ok(lock(&self.mounts).contains_key(path) || lock(&self.binds).contains_key(path))
        }
    }
}

/// The real mounts of a privileged test, unmounted on drop (in reverse order) so that a failed
/// assertion leaves none behind.
#[cfg(test)]
#[derive(Default)]
pub struct MountGuard(pub Vec<std::path::PathBuf>);

#[cfg(test)]
impl Drop for MountGuard {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            let _ = umount2(path, MntFlags::MNT_DETACH);
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
        std::os::unix::fs::symlink("/proc", dir.path().join("link")).unwrap();
        assert!(
            !is_mount_point(&dir.path().join("link")).unwrap(),
            "a symlink to a mount point is a file of its directory"
        );
    }
}
