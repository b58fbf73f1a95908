//! The file side of container log rotation (the file operations of the kubelet's
//! `pkg/kubelet/logs/container_log_manager.go`): a log's rotated files are `<log>.<timestamp>`
//! (gzipped to `<log>.<timestamp>.gz` at the next rotation); rotating removes what an interrupted
//! rotation left behind and the oldest files beyond the limit, compresses the rest, and renames the
//! live file aside. Every function here blocks: callers run them on the blocking pool.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use jiff::Zoned;

/// Suffix of a compressed rotated file.
const COMPRESS_SUFFIX: &str = ".gz";
/// Suffix of a file being compressed: one that is still there was interrupted.
const TMP_SUFFIX: &str = ".tmp";
/// A rotated file's suffix, the local time of its rotation as the kubelet writes it (Go's
/// `20060102-150405`): names sort oldest first.
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

/// Why a rotation step failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("listing the rotated files of {log}")]
    List {
        log: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("compressing {path} into {into}")]
    Compress {
        path: PathBuf,
        into: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("renaming {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Rotates `log` at `now`: removes leftovers of interrupted rotations, keeps at most
/// `max_files - 2` older rotated files (the live file and the one rotated now make up the rest),
/// removing the oldest first so a reader of a newer one is not cut short, compresses those kept,
/// and renames `log` to `<log>.<now>`, which stays uncompressed until the next rotation so the
/// runtime's last writes and readers still following it are not lost. Returns that name: the
/// caller asks the runtime to reopen the log, and renames it back if the runtime refuses.
pub fn rotate(log: &Path, max_files: usize, now: &Zoned) -> Result<PathBuf, FileError> {
    let rotated = rotated_files(log)?;
    let (in_use, unused) = partition_unused(rotated);
    for path in &unused {
        remove(path)?;
    }
    let keep = max_files.saturating_sub(2);
    let excess = in_use.len().saturating_sub(keep);
    for path in &in_use[..excess] {
        remove(path)?;
    }
    for path in &in_use[excess..] {
        if !has_suffix(path, COMPRESS_SUFFIX) {
            compress(path)?;
        }
    }
    let target = rotated_name(log, now);
    rename(log, &target)?;
    Ok(target)
}

/// Renames `from` to `to` (replacing `to`).
pub fn rename(from: &Path, to: &Path) -> Result<(), FileError> {
    fs::rename(from, to).map_err(|source| FileError::Rename {
        from: from.to_owned(),
        to: to.to_owned(),
        source,
    })
}

/// `<log>.<now>`.
fn rotated_name(log: &Path, now: &Zoned) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".");
    name.push(now.strftime(TIMESTAMP_FORMAT).to_string());
    PathBuf::from(name)
}

fn has_suffix(path: &Path, suffix: &str) -> bool {
    path.as_os_str()
        .as_encoded_bytes()
        .ends_with(suffix.as_bytes())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Every `<log>.*` next to `log`, sorted by name (oldest first).
fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, FileError> {
    let error = |source| FileError::List {
        log: log.to_owned(),
        source,
    };
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Ok(Vec::new());
    };
    let mut prefix = name.as_encoded_bytes().to_vec();
    prefix.push(b'.');
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(error)? {
        let entry = entry.map_err(error)?;
        if entry.file_name().as_encoded_bytes().starts_with(&prefix) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Splits rotated files into those in use and leftovers: temporary files of an interrupted
/// compression, and uncompressed files whose compressed copy was finished but which were not
/// removed yet.
fn partition_unused(files: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let compressed: Vec<PathBuf> = files
        .iter()
        .filter(|path| has_suffix(path, COMPRESS_SUFFIX))
        .cloned()
        .collect();
    files.into_iter().partition(|path| {
        !has_suffix(path, TMP_SUFFIX)
            && (has_suffix(path, COMPRESS_SUFFIX)
                || !compressed.contains(&with_suffix(path, COMPRESS_SUFFIX)))
    })
}

fn remove(path: &Path) -> Result<(), FileError> {
    fs::remove_file(path).map_err(|source| FileError::Remove {
        path: path.to_owned(),
        source,
    })
}

/// Gzips `path` into `<path>.gz` through `<path>.tmp` (so a crash never leaves a truncated `.gz`
/// that looks finished), with the original's permissions, then removes the original.
fn compress(path: &Path) -> Result<(), FileError> {
    let compressed = with_suffix(path, COMPRESS_SUFFIX);
    let tmp = with_suffix(path, TMP_SUFFIX);
    let error = |source| FileError::Compress {
        path: path.to_owned(),
        into: compressed.clone(),
        source,
    };
    let written = write_compressed(path, &tmp);
    if let Err(source) = written {
        // Best effort: the next rotation removes a leftover temporary file anyway.
        let _ = fs::remove_file(&tmp);
        return Err(error(source));
    }
    rename(&tmp, &compressed)?;
    remove(path)
}

fn write_compressed(path: &Path, tmp: &Path) -> io::Result<()> {
    let mut source = fs::File::open(path)?;
    let mode = source.metadata()?.permissions().mode();
    let target = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)?;
    let mut encoder = GzEncoder::new(target, Compression::default());
    io::copy(&mut source, &mut encoder)?;
    encoder.finish()?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;

    use super::*;

    fn at(time: &str) -> Zoned {
        time.parse().unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        GzDecoder::new(fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn the_rotated_name_is_the_local_time_in_the_kubelets_format() {
        let log = Path::new("/var/log/pods/ns_p_u/app/0.log");
        assert_eq!(
            rotated_name(log, &at("2026-03-04T05:06:07.89+01:00[Europe/Paris]")),
            Path::new("/var/log/pods/ns_p_u/app/0.log.20260304-050607")
        );
        assert_eq!(
            rotated_name(log, &at("2026-12-31T23:59:59[UTC]")),
            Path::new("/var/log/pods/ns_p_u/app/0.log.20261231-235959")
        );
    }

    #[test]
    fn a_first_rotation_renames_the_live_file_and_compresses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        fs::write(&log, "live\n").unwrap();
        fs::write(dir.path().join("1.log"), "another instance\n").unwrap();
        let rotated = rotate(&log, 5, &at("2026-03-04T05:06:07[UTC]")).unwrap();
        assert_eq!(rotated, dir.path().join("0.log.20260304-050607"));
        assert_eq!(fs::read_to_string(&rotated).unwrap(), "live\n");
        assert_eq!(names(dir.path()), ["0.log.20260304-050607", "1.log"]);
    }

    #[test]
    fn older_rotated_files_are_compressed_and_the_oldest_beyond_the_limit_removed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        fs::write(&log, "live\n").unwrap();
        fs::write(dir.path().join("0.log.20260101-000000.gz"), "oldest").unwrap();
        fs::write(dir.path().join("0.log.20260101-000010.gz"), "older").unwrap();
        fs::write(dir.path().join("0.log.20260101-000020"), "previous\n").unwrap();
        fs::set_permissions(
            dir.path().join("0.log.20260101-000020"),
            fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        // Four files in all: the live one, the one rotated now and two older ones.
        rotate(&log, 4, &at("2026-01-01T00:00:30[UTC]")).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "0.log.20260101-000010.gz",
                "0.log.20260101-000020.gz",
                "0.log.20260101-000030",
            ]
        );
        let compressed = dir.path().join("0.log.20260101-000020.gz");
        assert_eq!(gunzip(&compressed), "previous\n");
        assert_eq!(
            fs::metadata(&compressed).unwrap().permissions().mode() & 0o777,
            0o640,
            "the compressed file keeps the original's permissions"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("0.log.20260101-000010.gz")).unwrap(),
            "older",
            "an already compressed file is left as it is"
        );
    }

    #[test]
    fn two_files_keep_only_the_live_one_and_the_one_just_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        fs::write(&log, "live\n").unwrap();
        fs::write(dir.path().join("0.log.20260101-000000.gz"), "old").unwrap();
        fs::write(dir.path().join("0.log.20260101-000010"), "previous\n").unwrap();
        rotate(&log, 2, &at("2026-01-01T00:00:20[UTC]")).unwrap();
        assert_eq!(names(dir.path()), ["0.log.20260101-000020"]);
    }

    #[test]
    fn leftovers_of_an_interrupted_rotation_are_removed_first() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        fs::write(&log, "live\n").unwrap();
        // Compressed, but the crash came before the original was removed.
        fs::write(dir.path().join("0.log.20260101-000000"), "done\n").unwrap();
        fs::write(dir.path().join("0.log.20260101-000000.gz"), "gz").unwrap();
        // A compression cut short.
        fs::write(dir.path().join("0.log.20260101-000010.tmp"), "half").unwrap();
        fs::write(dir.path().join("0.log.20260101-000010"), "previous\n").unwrap();
        rotate(&log, 5, &at("2026-01-01T00:00:20[UTC]")).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "0.log.20260101-000000.gz",
                "0.log.20260101-000010.gz",
                "0.log.20260101-000020",
            ]
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("0.log.20260101-000000.gz")).unwrap(),
            "gz"
        );
        assert_eq!(
            gunzip(&dir.path().join("0.log.20260101-000010.gz")),
            "previous\n"
        );
    }

    #[test]
    fn a_missing_live_file_fails_the_rename_and_names_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let err = rotate(&log, 5, &at("2026-01-01T00:00:20[UTC]")).unwrap_err();
        let FileError::Rename { from, to, source } = err else {
            panic!("expected a rename error, got {err:?}");
        };
        assert_eq!(from, log);
        assert_eq!(to, dir.path().join("0.log.20260101-000020"));
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}
