//! Atomic projection of a set of files into a volume directory (the kubelet's
//! `pkg/volume/util/atomic_writer.go`), so a reader never sees half of an update:
//!
//! ```text
//! <volume>/..2026_01_02_15_04_05.1234   the data of one version, written in full before it is used
//! <volume>/..data -> ..2026_01_02_15_04_05.1234   swapped by rename(2), which is atomic
//! <volume>/ca.crt -> ..data/ca.crt      what users see: links through ..data
//! <volume>/conf   -> ..data/conf        (one link per top-level name)
//! ```
//!
//! A write compares the payload with the current version and does nothing when they match; else it
//! writes a new timestamped directory, gives the whole volume the pod's `fsGroup` when it has one
//! (the plugins' `setPerms`, before anything is published), points `..data_tmp` at the new
//! directory and renames that over `..data`, adds links for new names, removes links for names that
//! went away, and removes the old version and any other timestamped directory a crash left behind. Paths are checked before anything is
//! written: relative, no `..` element, not starting with `..` (the writer's own names), at most 4096
//! characters with names of at most 255, so nothing lands outside the volume.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::ownership::{Ownership, OwnershipError};
use super::removeall::{RemoveError, remove_all_one_filesystem};

/// The link to the current version.
pub const DATA_DIR: &str = "..data";
/// The link that becomes `..data` by rename.
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;
/// Mode of the timestamped directory and the directories inside it: readable by every user.
const DIR_MODE: u32 = 0o755;

/// One file of a payload: its content and mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Files by path relative to the volume.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a payload was not written.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    #[error("invalid path: {why}: {path}")]
    InvalidPath { path: String, why: &'static str },
    #[error("invalid path: {path} is a file and a directory of another file")]
    FileAndDirectory { path: String },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Ownership(#[from] OwnershipError),
    #[error("removing the old version")]
    Remove(#[source] RemoveError),
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> AtomicWriteError {
    let path = path.to_owned();
    move |source| AtomicWriteError::Io {
        action,
        path,
        source,
    }
}

/// Checks one payload path and returns it cleaned (`a//b/./c` → `a/b/c`), as the kubelet's
/// `validatePath` and `filepath.Clean` do.
pub fn validate_path(path: &str) -> Result<String, AtomicWriteError> {
    let invalid = |why| AtomicWriteError::InvalidPath {
        path: path.to_owned(),
        why,
    };
    if path.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if path.starts_with('/') {
        return Err(invalid("must be relative path"));
    }
    if path.len() > MAX_PATH_LENGTH {
        return Err(invalid("must be less than or equal to 4096 characters"));
    }
    if path.contains('\0') {
        return Err(invalid("must not contain NUL"));
    }
    let mut elements = Vec::new();
    for element in path.split('/') {
        if element == ".." {
            return Err(invalid("must not contain '..'"));
        }
        if element.len() > MAX_FILE_NAME_LENGTH {
            return Err(invalid(
                "filenames must be less than or equal to 255 characters",
            ));
        }
        if !element.is_empty() && element != "." {
            elements.push(element);
        }
    }
    let Some(first) = elements.first() else {
        return Err(invalid("must not be empty"));
    };
    // The writer's own names (`..data`, timestamped directories) start with `..`.
    if first.starts_with("..") {
        return Err(invalid("must not start with '..'"));
    }
    Ok(elements.join("/"))
}

/// The payload with every path checked and cleaned; a path that is both a file and the directory
/// of another file is refused.
fn clean_payload(payload: &Payload) -> Result<BTreeMap<String, &FileProjection>, AtomicWriteError> {
    let mut clean = BTreeMap::new();
    for (path, file) in payload {
        clean.insert(validate_path(path)?, file);
    }
    for path in clean.keys() {
        let mut parent = Path::new(path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            if let Some(dir) = dir.to_str()
                && clean.contains_key(dir)
            {
                return Err(AtomicWriteError::FileAndDirectory {
                    path: dir.to_owned(),
                });
            }
            parent = dir.parent();
        }
    }
    Ok(clean)
}

/// Projects `payload` into `target` (which must exist), with `ownership` for the pod's `fsGroup`.
/// Returns whether a new version was written; an unchanged payload only makes sure the
/// user-visible links exist.
pub fn write(
    target: &Path,
    payload: &Payload,
    ownership: Option<Ownership>,
) -> Result<bool, AtomicWriteError> {
    let payload = clean_payload(payload)?;
    let data_dir = target.join(DATA_DIR);
    let old_version = match fs::read_link(&data_dir) {
        Ok(link) => Some(link),
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => return Err(io_error("reading the data link", &data_dir)(err)),
    };
    let mut to_remove = BTreeSet::new();
    let mut changed = true;
    if let Some(old) = &old_version {
        let old_dir = target.join(old);
        to_remove = paths_to_remove(&payload, &old_dir)?;
        changed = !to_remove.is_empty() || differs(&payload, &old_dir, ownership)?;
    }
    let mut new_version = None;
    if changed {
        let version = new_version_dir(target)?;
        let dir = target.join(&version);
        // This may be the volume's first version: the ownership is set on all of it, not only on
        // the new directory.
        let published = write_files(&payload, &dir)
            .and_then(|()| ownership.map_or(Ok(()), |o| Ok(o.apply(target)?)))
            .and_then(|()| publish(target, &version));
        if let Err(err) = published {
            let _ = remove_all_one_filesystem(&dir);
            return Err(err);
        }
        new_version = Some(version);
    }
    create_user_visible(target, &payload)?;
    remove_user_visible(target, &to_remove)?;
    if let Some(version) = new_version {
        remove_stale_versions(target, &version)?;
    }
    Ok(changed)
}

/// Whether any file of the payload is missing from `old_dir` or differs in content or mode (the
/// mode `ownership` gives it), or in group.
fn differs(
    payload: &BTreeMap<String, &FileProjection>,
    old_dir: &Path,
    ownership: Option<Ownership>,
) -> Result<bool, AtomicWriteError> {
    for (path, file) in payload {
        let full = old_dir.join(path);
        let metadata = match fs::symlink_metadata(&full) {
            Ok(metadata) => metadata,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(err) => return Err(io_error("reading", &full)(err)),
        };
        let mode = ownership.map_or(file.mode, |o| o.mode_of(file.mode, false));
        let group_differs = ownership.is_some_and(|o| metadata.gid() != o.gid);
        if !metadata.is_file() || metadata.permissions().mode() & 0o7777 != mode || group_differs {
            return Ok(true);
        }
        if fs::read(&full).map_err(io_error("reading", &full))? != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every path in `old_dir` (files and directories) the payload no longer has.
fn paths_to_remove(
    payload: &BTreeMap<String, &FileProjection>,
    old_dir: &Path,
) -> Result<BTreeSet<String>, AtomicWriteError> {
    let mut present = BTreeSet::new();
    match walk(old_dir, Path::new(""), &mut present) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(err) => return Err(io_error("reading the current version", old_dir)(err)),
    }
    let mut wanted = BTreeSet::new();
    for path in payload.keys() {
        let mut sub = Some(Path::new(path.as_str()));
        while let Some(p) = sub.filter(|p| !p.as_os_str().is_empty()) {
            wanted.insert(p.to_string_lossy().into_owned());
            sub = p.parent();
        }
    }
    Ok(present.difference(&wanted).cloned().collect())
}

fn walk(root: &Path, relative: &Path, out: &mut BTreeSet<String>) -> io::Result<()> {
    for entry in fs::read_dir(root.join(relative))? {
        let entry = entry?;
        let path = relative.join(entry.file_name());
        out.insert(path.to_string_lossy().into_owned());
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        }
    }
    Ok(())
}

/// Creates `..<UTC time>.<n>` in `target`, mode 0755.
fn new_version_dir(target: &Path) -> Result<String, AtomicWriteError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let stamp = jiff::Timestamp::now().strftime("..%Y_%m_%d_%H_%M_%S.");
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{stamp}{:09}", (std::process::id() ^ n.rotate_left(16)));
        let dir = target.join(&name);
        match fs::DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Ok(()) => {
                // The mode asked for is masked by the umask.
                fs::set_permissions(&dir, fs::Permissions::from_mode(DIR_MODE))
                    .map_err(io_error("setting the mode of", &dir))?;
                return Ok(name);
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(io_error("creating", &dir)(err)),
        }
    }
}

fn write_files(
    payload: &BTreeMap<String, &FileProjection>,
    dir: &Path,
) -> Result<(), AtomicWriteError> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(parent)
                .map_err(io_error("creating", parent))?;
        }
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&full)
            .map_err(io_error("creating", &full))?;
        out.write_all(&file.data)
            .map_err(io_error("writing", &full))?;
        // The mode asked for at creation is masked by the umask.
        fs::set_permissions(&full, fs::Permissions::from_mode(file.mode))
            .map_err(io_error("setting the mode of", &full))?;
    }
    Ok(())
}

/// Points `..data` at `version` through a rename, so the switch is atomic.
fn publish(target: &Path, version: &str) -> Result<(), AtomicWriteError> {
    let tmp = target.join(NEW_DATA_DIR);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_error("removing a stale", &tmp)(err)),
    }
    std::os::unix::fs::symlink(version, &tmp).map_err(io_error("creating", &tmp))?;
    let data_dir = target.join(DATA_DIR);
    fs::rename(&tmp, &data_dir).map_err(|source| {
        let _ = fs::remove_file(&tmp);
        AtomicWriteError::Io {
            action: "renaming the new data link to",
            path: data_dir,
            source,
        }
    })
}

/// `<target>/<top-level name>` → `..data/<top-level name>` for every name of the payload.
fn create_user_visible(
    target: &Path,
    payload: &BTreeMap<String, &FileProjection>,
) -> Result<(), AtomicWriteError> {
    let names: BTreeSet<&str> = payload
        .keys()
        .filter_map(|path| path.split('/').next())
        .collect();
    for name in names {
        let visible = target.join(name);
        match fs::symlink_metadata(&visible) {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let link = Path::new(DATA_DIR).join(name);
                std::os::unix::fs::symlink(&link, &visible)
                    .map_err(io_error("creating the link", &visible))?;
            }
            Err(err) => return Err(io_error("reading", &visible)(err)),
        }
    }
    Ok(())
}

/// Removes the links of top-level names that went away (deeper paths went with the old version).
fn remove_user_visible(target: &Path, paths: &BTreeSet<String>) -> Result<(), AtomicWriteError> {
    for path in paths.iter().filter(|p| !p.contains('/')) {
        let visible = target.join(path);
        match fs::remove_file(&visible) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_error("removing the link", &visible)(err)),
        }
    }
    Ok(())
}

/// Removes every timestamped directory but `current`: the version just replaced and any a crash
/// left behind.
fn remove_stale_versions(target: &Path, current: &str) -> Result<(), AtomicWriteError> {
    let entries = fs::read_dir(target).map_err(io_error("reading", target))?;
    for entry in entries {
        let entry = entry.map_err(io_error("reading", target))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if name.starts_with("..") && name != current && is_dir {
            remove_all_one_filesystem(&entry.path()).map_err(AtomicWriteError::Remove)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// A write without `fsGroup`.
    fn write(target: &Path, payload: &Payload) -> Result<bool, AtomicWriteError> {
        super::write(target, payload, None)
    }

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    fn payload(files: &[(&str, &str)]) -> Payload {
        files
            .iter()
            .map(|(path, data)| ((*path).to_owned(), file(data, 0o644)))
            .collect()
    }

    fn read(target: &Path, path: &str) -> String {
        fs::read_to_string(target.join(path)).unwrap()
    }

    fn versions(target: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(target)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn files_are_links_through_the_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path();
        assert!(write(target, &payload(&[("a", "1"), ("conf/b", "2")])).unwrap());
        assert_eq!(read(target, "a"), "1");
        assert_eq!(read(target, "conf/b"), "2");
        assert_eq!(
            fs::read_link(target.join("a")).unwrap(),
            Path::new("..data/a")
        );
        assert_eq!(
            fs::read_link(target.join("conf")).unwrap(),
            Path::new("..data/conf")
        );
        let version = fs::read_link(target.join(DATA_DIR)).unwrap();
        let name = version.to_str().unwrap();
        assert!(name.starts_with("..") && name.len() > 25, "{name}");
        assert_eq!(versions(target), [name]);
        let mode = |p: &str| fs::metadata(target.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("a"), 0o644);
        assert_eq!(mode(name), 0o755);
    }

    #[test]
    fn an_unchanged_payload_writes_nothing_and_a_change_replaces_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path();
        let first = payload(&[("a", "1"), ("gone", "x"), ("d/old", "y")]);
        write(target, &first).unwrap();
        let version = fs::read_link(target.join(DATA_DIR)).unwrap();
        assert!(!write(target, &first).unwrap());
        assert_eq!(fs::read_link(target.join(DATA_DIR)).unwrap(), version);

        let mut second = payload(&[("a", "2"), ("d/new", "z")]);
        assert!(write(target, &second).unwrap());
        assert_eq!(read(target, "a"), "2");
        assert_eq!(read(target, "d/new"), "z");
        assert!(fs::symlink_metadata(target.join("gone")).is_err());
        assert!(!target.join("d/old").exists());
        assert_eq!(versions(target).len(), 1, "the old version is removed");

        second.get_mut("a").unwrap().mode = 0o600;
        assert!(write(target, &second).unwrap(), "a mode change is a change");
        let mode = fs::metadata(target.join("a")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn versions_left_by_a_crash_are_removed_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path();
        fs::create_dir(target.join("..2020_01_01_00_00_00.123")).unwrap();
        std::os::unix::fs::symlink("nowhere", target.join(NEW_DATA_DIR)).unwrap();
        write(target, &payload(&[("a", "1")])).unwrap();
        assert_eq!(versions(target).len(), 1, "{:?}", versions(target));
        assert_eq!(read(target, "a"), "1");
    }

    #[test]
    fn paths_are_checked_like_the_kubelet() {
        for (path, why) in [
            ("", "must not be empty"),
            ("/etc/passwd", "must be relative path"),
            ("../etc", "must not contain '..'"),
            ("a/../../etc", "must not contain '..'"),
            ("..data", "must not start with '..'"),
            ("./..data/x", "must not start with '..'"),
            ("..hidden", "must not start with '..'"),
            (".", "must not be empty"),
        ] {
            match validate_path(path) {
                Err(AtomicWriteError::InvalidPath { why: got, .. }) => {
                    assert_eq!(got, why, "{path:?}");
                }
                other => panic!("{path:?}: {other:?}"),
            }
        }
        let long_name = "x".repeat(256);
        assert!(validate_path(&long_name).is_err());
        assert!(validate_path(&format!("{}/a", "d/".repeat(2100))).is_err());
        assert_eq!(validate_path("a//b/./c").unwrap(), "a/b/c");
        assert_eq!(validate_path(".hidden/..x").unwrap(), ".hidden/..x");
        assert_eq!(
            validate_path("../etc").unwrap_err().to_string(),
            "invalid path: must not contain '..': ../etc"
        );
    }

    #[test]
    fn a_bad_path_writes_nothing_inside_or_outside_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("volume");
        fs::create_dir(&target).unwrap();
        for bad in ["../escaped", "/tmp/escaped", "a/../../escaped"] {
            let err = write(&target, &payload(&[("fine", "1"), (bad, "x")])).unwrap_err();
            assert!(matches!(err, AtomicWriteError::InvalidPath { .. }), "{err}");
        }
        assert!(!dir.path().join("escaped").exists());
        assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
    }

    #[test]
    fn a_path_cannot_be_a_file_and_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let err = write(dir.path(), &payload(&[("a", "1"), ("a/b", "2")])).unwrap_err();
        assert!(
            matches!(err, AtomicWriteError::FileAndDirectory { .. }),
            "{err}"
        );
    }

    /// Needs root (a chown to any group). The kubelet's modes for a read-only volume with an
    /// `fsGroup`: files get group read, directories group search and setgid; the next write of the
    /// same payload sees those modes as its own and writes nothing.
    #[test]
    fn an_fs_group_owns_every_version_before_it_is_published() {
        if !rustix::process::geteuid().is_root() {
            crate::testing::skip(
                "an_fs_group_owns_every_version_before_it_is_published",
                "chown to another group needs root",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path();
        fs::set_permissions(target, fs::Permissions::from_mode(0o700)).unwrap();
        let ownership = Some(Ownership {
            gid: 4321,
            read_only: true,
        });
        let mut files = payload(&[("a", "1"), ("sub/b", "2")]);
        files.get_mut("sub/b").unwrap().mode = 0o400;
        assert!(super::write(target, &files, ownership).unwrap());
        let meta = |p: &str| fs::metadata(target.join(p)).unwrap();
        let owned = |p: &str| (meta(p).gid(), meta(p).permissions().mode() & 0o7777);
        assert_eq!(owned("a"), (4321, 0o644), "-rw-r--r--");
        assert_eq!(owned("sub/b"), (4321, 0o440), "-r--r-----");
        assert_eq!(owned("sub"), (4321, 0o2755));
        assert_eq!(owned(DATA_DIR), (4321, 0o2755));
        assert_eq!(owned("."), (4321, 0o2750), "the volume root too");
        assert!(
            !super::write(target, &files, ownership).unwrap(),
            "the modes the group added are no change"
        );
    }

    /// The property the writer exists for: a reader that enters `..data` sees the files of one
    /// version, never a mix, however writes and reads interleave.
    #[test]
    fn a_reader_never_sees_a_mix_of_two_versions() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().to_owned();
        let versioned = |n: usize| {
            let body = format!("{n:08}").repeat(4096);
            payload(&[("a", &body), ("b", &body), ("sub/c", &body)])
        };
        write(&target, &versioned(0)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (target, done) = (target.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let (mut checked, mut seen) = (0_u32, BTreeSet::new());
                while !done.load(Ordering::Relaxed) {
                    // Resolve ..data once, as a process that changes into it does.
                    let Ok(version) = fs::read_link(target.join(DATA_DIR)) else {
                        continue;
                    };
                    let base = target.join(version);
                    let read = |p: &str| fs::read_to_string(base.join(p)).ok();
                    let (Some(a), Some(b), Some(c)) = (read("a"), read("b"), read("sub/c")) else {
                        continue; // the version was removed while being read
                    };
                    assert_eq!(a, b, "a and b from one version");
                    assert_eq!(a, c, "a and sub/c from one version");
                    seen.insert(a[..8].to_owned());
                    checked += 1;
                }
                (checked, seen.len())
            })
        };
        for n in 1..=200 {
            write(&target, &versioned(n)).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let (checked, versions_seen) = reader.join().unwrap();
        assert!(checked > 0, "the reader read");
        assert!(versions_seen > 1, "the reader saw updates");
        assert_eq!(read(&target, "a")[..8], *"00000200");
    }
}
