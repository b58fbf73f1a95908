//! One file read piece by piece at chosen offsets through the engine: the container logs of
//! `/containerLogs` and the node logs of `/logs/`, which can be far bigger than memory and are
//! followed while they grow and rotate.
//!
//! Corresponds to the `os.File` reads of the kubelet's `pkg/kubelet/kuberuntime/logs` and of Go's
//! `http.FileServer`. On uring every open, read and `statx` is an `io_uring` operation; the open file
//! lives in a local task (tokio-uring files are `!Send`) and [`ReadFile`] sends it requests, so the
//! handle and the futures of its users stay `Send`. On epoll the reads are positional reads on
//! tokio's blocking pool.

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::engine::IoEngine;

/// What tells one file from another at the same path, and how long it is: enough to notice that a
/// log was rotated (a new file at the path) or truncated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub len: u64,
}

impl FileIdentity {
    fn from_metadata(meta: &std::fs::Metadata) -> Self {
        Self {
            device: meta.dev(),
            inode: meta.ino(),
            len: meta.len(),
        }
    }

    fn from_statx(statx: &libc::statx) -> Self {
        Self {
            device: libc::makedev(statx.stx_dev_major, statx.stx_dev_minor),
            inode: statx.stx_ino,
            len: statx.stx_size,
        }
    }
}

/// A file opened for reading at offsets. Dropping it closes the file.
pub struct ReadFile(Backend);

enum Backend {
    Uring(mpsc::UnboundedSender<UringRequest>),
    Epoll(Arc<std::fs::File>),
}

/// What the local task that owns a uring file is asked to do.
enum UringRequest {
    ReadAt {
        offset: u64,
        len: usize,
        reply: oneshot::Sender<io::Result<Bytes>>,
    },
    Identity {
        reply: oneshot::Sender<io::Result<FileIdentity>>,
    },
}

impl ReadFile {
    /// Opens `path` for reading. Must run inside [`block_on`](super::block_on).
    pub async fn open(path: &Path, engine: IoEngine) -> io::Result<Self> {
        match engine {
            IoEngine::Uring => {
                let (opened_tx, opened) = oneshot::channel();
                let (requests_tx, requests) = mpsc::unbounded_channel();
                tokio::task::spawn_local(serve_uring_file(path.to_path_buf(), opened_tx, requests));
                opened.await.map_err(|_| task_gone())??;
                Ok(Self(Backend::Uring(requests_tx)))
            }
            IoEngine::Epoll => {
                let path = path.to_path_buf();
                let file = blocking(move || std::fs::File::open(path)).await?;
                Ok(Self(Backend::Epoll(Arc::new(file))))
            }
        }
    }

    /// Up to `len` bytes from `offset`: fewer at the end of the file, none past it.
    pub async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        match &self.0 {
            Backend::Uring(requests) => {
                ask(requests, |reply| UringRequest::ReadAt {
                    offset,
                    len,
                    reply,
                })
                .await
            }
            Backend::Epoll(file) => {
                let file = Arc::clone(file);
                blocking(move || {
                    let mut buf = vec![0; len];
                    let n = file.read_at(&mut buf, offset)?;
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                })
                .await
            }
        }
    }

    /// Device, inode and current length of the open file.
    pub async fn identity(&self) -> io::Result<FileIdentity> {
        match &self.0 {
            Backend::Uring(requests) => {
                ask(requests, |reply| UringRequest::Identity { reply }).await
            }
            Backend::Epoll(file) => {
                let file = Arc::clone(file);
                blocking(move || {
                    file.metadata()
                        .map(|meta| FileIdentity::from_metadata(&meta))
                })
                .await
            }
        }
    }
}

/// Device, inode and length of the file `path` names now (following symlinks), without opening it.
/// Must run inside [`block_on`](super::block_on).
pub async fn identity_of(path: &Path, engine: IoEngine) -> io::Result<FileIdentity> {
    let path = path.to_path_buf();
    match engine {
        IoEngine::Uring => tokio::task::spawn_local(async move {
            tokio_uring::fs::statx(path)
                .await
                .map(|statx| FileIdentity::from_statx(&statx))
        })
        .await
        .map_err(|_| task_gone())?,
        IoEngine::Epoll => {
            blocking(move || std::fs::metadata(path).map(|meta| FileIdentity::from_metadata(&meta)))
                .await
        }
    }
}

/// The local task owning one uring file: opens it, reports the outcome, then answers requests in
/// order until every [`ReadFile`] handle is gone.
async fn serve_uring_file(
    path: PathBuf,
    opened: oneshot::Sender<io::Result<()>>,
    mut requests: mpsc::UnboundedReceiver<UringRequest>,
) {
    let file = match tokio_uring::fs::File::open(&path).await {
        Ok(file) => {
            let _ = opened.send(Ok(()));
            file
        }
        Err(error) => {
            let _ = opened.send(Err(error));
            return;
        }
    };
    while let Some(request) = requests.recv().await {
        match request {
            UringRequest::ReadAt { offset, len, reply } => {
                let (result, mut buf) = file.read_at(Vec::with_capacity(len), offset).await;
                let _ = reply.send(result.map(|n| {
                    buf.truncate(n);
                    Bytes::from(buf)
                }));
            }
            UringRequest::Identity { reply } => {
                let result = file.statx().await;
                let _ = reply.send(result.map(|statx| FileIdentity::from_statx(&statx)));
            }
        }
    }
}

/// Sends the file's task one request and waits for its answer.
async fn ask<T>(
    requests: &mpsc::UnboundedSender<UringRequest>,
    request: impl FnOnce(oneshot::Sender<io::Result<T>>) -> UringRequest,
) -> io::Result<T> {
    let (reply, answer) = oneshot::channel();
    requests.send(request(reply)).map_err(|_| task_gone())?;
    answer.await.map_err(|_| task_gone())?
}

async fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|join_error| {
            io::Error::other(format!("blocking file read failed: {join_error}"))
        })?
}

fn task_gone() -> io::Error {
    io::Error::other("the io_uring file task ended (the runtime is shutting down)")
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::io::block_on;

    #[test]
    fn reads_at_offsets_and_sees_growth_and_replacement_on_both_engines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let contents: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for engine in [IoEngine::Uring, IoEngine::Epoll] {
            // Each engine starts from the same file: the previous one appended and replaced it.
            std::fs::write(&path, &contents).unwrap();
            block_on(engine, async {
                let file = ReadFile::open(&path, engine).await.unwrap();
                let head = file.read_at(0, 10).await.unwrap();
                assert_eq!(head, contents[..10], "{engine}");
                let middle = file.read_at(70_000, 65_536).await.unwrap();
                assert_eq!(
                    middle,
                    contents[70_000..],
                    "{engine}: short read at the end"
                );
                assert!(
                    file.read_at(100_000, 10).await.unwrap().is_empty(),
                    "{engine}"
                );

                let before = file.identity().await.unwrap();
                assert_eq!(before.len, 100_000, "{engine}");
                assert_eq!(
                    identity_of(&path, engine).await.unwrap(),
                    before,
                    "{engine}"
                );

                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap()
                    .write_all(b"more")
                    .unwrap();
                assert_eq!(
                    file.read_at(100_000, 10).await.unwrap(),
                    b"more"[..],
                    "{engine}"
                );
                assert_eq!(file.identity().await.unwrap().len, 100_004, "{engine}");

                // A new file at the path: the open handle keeps the old one.
                std::fs::rename(&path, dir.path().join("log.1")).unwrap();
                std::fs::write(&path, b"new").unwrap();
                let replaced = identity_of(&path, engine).await.unwrap();
                assert_ne!(replaced.inode, before.inode, "{engine}");
                assert_eq!(replaced.len, 3, "{engine}");
                assert_eq!(
                    file.read_at(0, 10).await.unwrap(),
                    contents[..10],
                    "{engine}"
                );
            })
            .unwrap();
        }
    }

    #[test]
    fn a_missing_file_is_not_found_on_both_engines() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        for engine in [IoEngine::Uring, IoEngine::Epoll] {
            block_on(engine, async {
                let opened = ReadFile::open(&missing, engine).await;
                assert_eq!(opened.err().unwrap().kind(), io::ErrorKind::NotFound);
                let stat = identity_of(&missing, engine).await;
                assert_eq!(stat.unwrap_err().kind(), io::ErrorKind::NotFound);
            })
            .unwrap();
        }
    }

    /// The uring engine reads files with `io_uring` operations, not system calls: on a thread
    /// whose seccomp filter refuses `openat`, `pread64` and `statx`, the uring engine still reads
    /// a log file and cgroup files, while the epoll engine's reads are refused.
    #[test]
    fn uring_reads_files_that_file_system_calls_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, b"written before the filter").unwrap();
        let cgroup_file = PathBuf::from("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        assert!(cgroup_file.exists(), "{} is missing", cgroup_file.display());
        // The filter stays on the thread that installs it (and the threads it starts): a thread
        // of its own keeps it away from the other tests.
        std::thread::spawn(move || {
            refuse_file_system_calls();
            let refused = block_on(IoEngine::Epoll, ReadFile::open(&path, IoEngine::Epoll))
                .unwrap()
                .err()
                .expect("the filter refuses the epoll engine's openat");
            assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);

            block_on(IoEngine::Uring, async {
                let file = ReadFile::open(&path, IoEngine::Uring).await.unwrap();
                let read = file.read_at(0, 64).await.unwrap();
                assert_eq!(read, b"written before the filter"[..]);
                assert_eq!(file.identity().await.unwrap().len, 25);
                assert_eq!(identity_of(&path, IoEngine::Uring).await.unwrap().len, 25);
                let swept = crate::io::read_small_files(&[cgroup_file], IoEngine::Uring).await;
                let usage = String::from_utf8(swept[0].as_ref().unwrap().clone()).unwrap();
                assert!(usage.trim().parse::<u64>().is_ok(), "{usage:?}");
            })
            .unwrap();
        })
        .join()
        .unwrap();
    }

    fn refuse_file_system_calls() {
        use seccompiler::{SeccompAction, SeccompFilter};
        let refused = [libc::SYS_openat, libc::SYS_pread64, libc::SYS_statx]
            .into_iter()
            .map(|call| (call, Vec::new()))
            .collect();
        let filter = SeccompFilter::new(
            refused,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            std::env::consts::ARCH.try_into().unwrap(),
        )
        .unwrap();
        let program: seccompiler::BpfProgram = filter.try_into().unwrap();
        seccompiler::apply_filter(&program).unwrap();
    }
}
