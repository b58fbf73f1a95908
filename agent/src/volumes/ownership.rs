//! A volume's files for the pod's `fsGroup` (the kubelet's `SetVolumeOwnership` in
//! `pkg/volume/volume_linux.go`, as the emptyDir, configMap, secret, downwardAPI and projected
//! plugins call it): every file and directory gets the group, group read (and write unless the
//! volume is read-only), directories also group search and the setgid bit, so what the containers
//! create there later belongs to the group too. The root comes last, after everything below it.
//! Symlinks are left alone: changing one would change its target, which may be a file the payload
//! gave its own mode. These plugins pass no `fsGroupChangePolicy` upstream, so every call walks
//! the whole volume, as the kubelet's does.
//!
//! The walk holds a descriptor for each file it changes, opened without following symlinks, so a
//! container writing into the volume meanwhile cannot turn a name into a link that sends a chown
//! elsewhere on the host.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags};

/// What a writable volume's files get.
const RW_MASK: u32 = 0o660;
/// What a read-only volume's files get.
const RO_MASK: u32 = 0o440;
/// What directories get besides: search by the group.
const EXEC_MASK: u32 = 0o110;
const SET_GID: u32 = 0o2000;
/// Permission and special bits of a mode.
const MODE_BITS: u32 = 0o7777;

/// Why a volume's ownership could not be set.
#[derive(Debug, thiserror::Error)]
#[error("setting the group of {path} for fsGroup")]
pub struct OwnershipError {
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// The ownership the pod's `fsGroup` asks of one volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    pub gid: u32,
    /// Whether the plugin reports the volume read-only (configMap, secret, downwardAPI and
    /// projected do, emptyDir does not): its files get group read only.
    pub read_only: bool,
}

impl Ownership {
    /// The mode a file of `mode` ends with: its bits, plus the group's.
    pub fn mode_of(self, mode: u32, is_dir: bool) -> u32 {
        let mut mask = if self.read_only { RO_MASK } else { RW_MASK };
        if is_dir {
            mask |= SET_GID | EXEC_MASK;
        }
        (mode & MODE_BITS) | mask
    }

    /// Gives everything under `root`, and `root` itself last, the group and its modes.
    pub fn apply(self, root: &Path) -> Result<(), OwnershipError> {
        let error = |source| OwnershipError {
            path: root.to_owned(),
            source,
        };
        let fd = rustix::fs::openat(CWD, root, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| error(e.into()))?;
        self.apply_fd(fd.as_fd(), root)
    }

    /// `fd` (an `O_PATH` descriptor of `path`, a symlink never followed): its children first when it
    /// is a directory, then itself.
    fn apply_fd(self, fd: BorrowedFd<'_>, path: &Path) -> Result<(), OwnershipError> {
        let error = |source: io::Error| OwnershipError {
            path: path.to_owned(),
            source,
        };
        let stat = rustix::fs::fstat(fd).map_err(|e| error(e.into()))?;
        let file_type = FileType::from_raw_mode(stat.st_mode);
        if file_type == FileType::Symlink {
            return Ok(());
        }
        let is_dir = file_type == FileType::Directory;
        if is_dir {
            // Reopened through the descriptor, so it is the directory that was just looked at.
            let dir = rustix::fs::openat(
                fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| error(e.into()))?;
            for name in entries(&dir).map_err(error)? {
                let child = rustix::fs::openat(
                    &dir,
                    name.as_c_str(),
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                );
                let child_path = path.join(OsStr::from_bytes(name.to_bytes()));
                match child {
                    Ok(child) => self.apply_fd(child.as_fd(), &child_path)?,
                    // Removed by a container since the listing: nothing to change.
                    Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => {
                        return Err(OwnershipError {
                            path: child_path,
                            source: e.into(),
                        });
                    }
                }
            }
        }
        // The group first: a chown clears the set-id bits of an executable, which the chmod then
        // puts back from the mode read before it.
        rustix::fs::chownat(
            fd,
            "",
            None,
            Some(Gid::from_raw(self.gid)),
            AtFlags::EMPTY_PATH,
        )
        .map_err(|e| error(e.into()))?;
        let mode = self.mode_of(stat.st_mode, is_dir);
        // An `O_PATH` descriptor takes no fchmod; its `/proc/self/fd` link is the file itself.
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        rustix::fs::chmodat(CWD, &by_fd, Mode::from_raw_mode(mode), AtFlags::empty())
            .map_err(|e| error(e.into()))
    }
}

/// The names in a directory, `.` and `..` left out.
pub(super) fn entries(dir: &OwnedFd) -> io::Result<Vec<std::ffi::CString>> {
    let mut names = Vec::new();
    let mut listing = Dir::read_from(dir)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name: &CStr = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    const RW: Ownership = Ownership {
        gid: 1234,
        read_only: false,
    };
    const RO: Ownership = Ownership {
        gid: 1234,
        read_only: true,
    };

    #[test]
    fn modes_follow_the_kubelets_masks() {
        // Files of read-only volumes: the e2e specs' `-rw-r--r--` and `-r--r-----`.
        assert_eq!(RO.mode_of(0o644, false), 0o644);
        assert_eq!(RO.mode_of(0o400, false), 0o440);
        assert_eq!(RO.mode_of(0o600, false), 0o640, "a token with fsGroup");
        assert_eq!(RO.mode_of(0o440, false), 0o440);
        // Writable volumes give the group write too.
        assert_eq!(RW.mode_of(0o644, false), 0o664);
        assert_eq!(RW.mode_of(0o600, false), 0o660);
        // Directories: group search and setgid; the tmpfs root's sticky bit stays.
        assert_eq!(RW.mode_of(0o777, true), 0o2777);
        assert_eq!(RW.mode_of(0o1777, true), 0o3777);
        assert_eq!(RO.mode_of(0o755, true), 0o2755);
        assert_eq!(RO.mode_of(0o700, true), 0o2750);
        // A setuid executable keeps its bit; the file type never leaks into the mode.
        assert_eq!(RW.mode_of(0o104_755, false), 0o4775);
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & MODE_BITS
    }

    /// Needs root (a chown to any group).
    #[test]
    fn every_file_gets_the_group_and_links_are_left_alone() {
        if !rustix::process::geteuid().is_root() {
            crate::testing::skip(
                "every_file_gets_the_group_and_links_are_left_alone",
                "chown to another group needs root",
            );
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        fs::write(&secret, "x").unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("volume");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        fs::create_dir(root.join("sub")).unwrap();
        fs::set_permissions(root.join("sub"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("sub/file"), "y").unwrap();
        fs::set_permissions(root.join("sub/file"), fs::Permissions::from_mode(0o400)).unwrap();
        std::os::unix::fs::symlink(&secret, root.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape-dir")).unwrap();

        RW.apply(&root).unwrap();
        let gid = |p: &Path| fs::symlink_metadata(p).unwrap().gid();
        assert_eq!((gid(&root), mode(&root)), (1234, 0o2777));
        let sub = root.join("sub");
        assert_eq!((gid(&sub), mode(&sub)), (1234, 0o2775));
        let file = root.join("sub/file");
        assert_eq!((gid(&file), mode(&file)), (1234, 0o660));
        assert_ne!(gid(&secret), 1234, "a link's target is not changed");
        assert_eq!(mode(&secret), 0o600);
        assert_ne!(gid(outside.path()), 1234, "nor is a linked directory");
        assert_ne!(gid(&root.join("escape")), 1234, "nor the link itself");
    }
}
