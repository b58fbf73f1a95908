//! The certificate directory's layout (client-go's `certificate.FileStore`): each issued pair is
//! written once to `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem` (certificate, then key, mode 0600) and the
//! `<prefix>-current.pem` link is swapped to it atomically, so a reader always sees a whole pair and
//! the previous pairs stay on disk.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::CertificateError;

/// The client certificate's prefix in the certificate directory.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// The serving certificate's prefix (with `serverTLSBootstrap`).
pub const SERVER_PREFIX: &str = "kubelet-server";

/// The pairs of one kind in one directory.
#[derive(Clone, Debug)]
pub struct PairStore {
    dir: PathBuf,
    prefix: &'static str,
}

impl PairStore {
    pub fn new(dir: &Path, prefix: &'static str) -> Self {
        Self {
            dir: dir.to_owned(),
            prefix,
        }
    }

    /// `<dir>/<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current pair (PEM), `None` when there is none yet.
    pub fn current(&self) -> Result<Option<Vec<u8>>, CertificateError> {
        let path = self.current_path();
        match std::fs::read(&path) {
            Ok(pem) => Ok(Some(pem)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CertificateError::Io { path, source }),
        }
    }

    /// Writes a newly issued pair and makes it the current one; returns the link's path.
    pub fn write(&self, certificate: &[u8], key_pem: &str) -> Result<PathBuf, CertificateError> {
        create_dir(&self.dir)?;
        let stamp = jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S");
        let file_name = format!("{}-{stamp}.pem", self.prefix);
        let mut contents = certificate.to_vec();
        if !contents.ends_with(b"\n") {
            contents.push(b'\n');
        }
        contents.extend_from_slice(key_pem.as_bytes());
        write_private(&self.dir.join(&file_name), &contents)?;
        let current = self.current_path();
        let link_tmp = self.dir.join(format!("{}-current.pem.new", self.prefix));
        remove_file(&link_tmp)?;
        std::os::unix::fs::symlink(&file_name, &link_tmp).map_err(|source| {
            CertificateError::Io {
                path: link_tmp.clone(),
                source,
            }
        })?;
        std::fs::rename(&link_tmp, &current).map_err(|source| CertificateError::Io {
            path: current.clone(),
            source,
        })?;
        Ok(current)
    }
}

pub fn create_dir(dir: &Path) -> Result<(), CertificateError> {
    std::fs::create_dir_all(dir).map_err(|source| CertificateError::Io {
        path: dir.to_owned(),
        source,
    })
}

/// Removes a file that may not exist.
pub fn remove_file(path: &Path) -> Result<(), CertificateError> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(CertificateError::Io {
            path: path.to_owned(),
            source: err,
        }),
        _ => Ok(()),
    }
}

/// Writes a file only its owner can read, through a temporary file renamed into place.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), CertificateError> {
    let io = |source| CertificateError::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("writing");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn each_pair_gets_a_timestamped_file_behind_the_current_link() {
        let dir = tempfile::tempdir().unwrap();
        let store = PairStore::new(&dir.path().join("pki"), CLIENT_PREFIX);
        assert_eq!(store.current().unwrap(), None);
        let current = store.write(b"CERT1", "KEY1\n").unwrap();
        assert_eq!(current, dir.path().join("pki/kubelet-client-current.pem"));
        assert_eq!(store.current().unwrap().unwrap(), b"CERT1\nKEY1\n");
        let target = std::fs::read_link(&current).unwrap();
        let name = target.to_string_lossy().into_owned();
        // kubelet-client-YYYY-MM-DD-HH-MM-SS.pem, relative to the directory.
        assert!(name.starts_with("kubelet-client-2"), "{name}");
        assert_eq!(
            target.extension(),
            Some(std::ffi::OsStr::new("pem")),
            "{name}"
        );
        assert_eq!(
            name.len(),
            "kubelet-client-2026-01-01-00-00-00.pem".len(),
            "{name}"
        );
        let mode = std::fs::metadata(&current).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let server = PairStore::new(&dir.path().join("pki"), SERVER_PREFIX);
        server.write(b"SERVING\n", "SKEY\n").unwrap();
        assert_eq!(store.current().unwrap().unwrap(), b"CERT1\nKEY1\n");
        assert_eq!(server.current().unwrap().unwrap(), b"SERVING\nSKEY\n");

        store.write(b"CERT2\n", "KEY2\n").unwrap();
        assert_eq!(store.current().unwrap().unwrap(), b"CERT2\nKEY2\n");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("pki"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".new") || n.contains(".writing"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
