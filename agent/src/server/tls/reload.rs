//! Rotation of the serving certificate and the client CA without a restart (the kubelet's
//! `dynamiccertificates` file watching for `tlsCertFile`/`clientCAFile`): an inotify watch on the
//! files' directories, plus a slow periodic check in case events are lost, compares each file's
//! identity and modification time with what was loaded and reloads what changed. A pair that does not
//! load is logged and the previous one keeps serving.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Files, ServingTls};
use crate::error_chain::error_chain;

/// The fallback check when no file event arrives (the watch failed, or events were lost).
const POLL_INTERVAL: Duration = Duration::from_mins(1);
/// How long to let a burst of writes settle (a certificate and its key are two writes) before reading.
const SETTLE: Duration = Duration::from_millis(100);

/// What identifies one version of a file: a rewrite changes the modification time, a rename-over (or
/// a Kubernetes secret volume's symlink swap) changes the inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = fs::metadata(path).ok()?;
    Some(Stamp {
        dev: metadata.dev(),
        ino: metadata.ino(),
        len: metadata.len(),
        mtime: metadata.mtime(),
        mtime_nsec: metadata.mtime_nsec(),
        ctime: metadata.ctime(),
        ctime_nsec: metadata.ctime_nsec(),
    })
}

/// The stamps of the files as last loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    cert: Option<Stamp>,
    key: Option<Stamp>,
    client_ca: Option<Stamp>,
}

impl Seen {
    /// Taken before the files are read, so a change racing with the read is seen by the next check.
    pub(super) fn of(files: &Files) -> Self {
        Self {
            cert: stamp(&files.cert),
            key: stamp(&files.key),
            client_ca: files.client_ca.as_deref().and_then(stamp),
        }
    }
}

/// Follows the files while alive; dropping it stops the watch.
#[derive(Debug)]
pub(crate) struct Watching {
    task: JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(super) fn watch(tls: ServingTls) -> Watching {
    let (wake_tx, wake_rx) = mpsc::channel(1);
    let watcher = start_watcher(&tls.shared.files, wake_tx);
    Watching {
        task: tokio::spawn(run(tls, watcher, wake_rx)),
    }
}

fn directories(files: &Files) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for file in [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        let dir = match file.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

fn start_watcher(files: &Files, wake: mpsc::Sender<()>) -> Option<RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        // Reads (including the reload's own) change nothing; errors may mean lost events.
        let relevant = event.is_err()
            || event.is_ok_and(|event| {
                !matches!(
                    event.kind,
                    EventKind::Access(
                        AccessKind::Open(_)
                            | AccessKind::Read
                            | AccessKind::Close(AccessMode::Read)
                    )
                )
            });
        if relevant {
            // Full means a check is already pending; it will see this change too.
            let _ = wake.try_send(());
        }
    };
    let dirs = directories(files);
    let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
        for dir in &dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        Ok(watcher)
    });
    match watcher {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(
                error = %error_chain(&error),
                ?dirs,
                "cannot watch the serving certificate files; checking them every {POLL_INTERVAL:?} instead"
            );
            None
        }
    }
}

async fn run(tls: ServingTls, _watcher: Option<RecommendedWatcher>, mut wake: mpsc::Receiver<()>) {
    let mut seen = tls.shared.initial;
    let mut poll =
        tokio::time::interval_at(tokio::time::Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(()) = wake.recv() => {
                tokio::time::sleep(SETTLE).await;
                while wake.try_recv().is_ok() {}
            }
            _ = poll.tick() => {}
        }
        let checking = tls.clone();
        // Stats, small reads and signature checks: kept off the executor the sync loop may share.
        match tokio::task::spawn_blocking(move || check(&checking, seen)).await {
            Ok(now) => seen = now,
            Err(error) => tracing::warn!(%error, "checking the serving certificate files"),
        }
    }
}

/// Reloads whatever changed since `seen`; returns the stamps now on disk.
pub(super) fn check(tls: &ServingTls, seen: Seen) -> Seen {
    let files = &tls.shared.files;
    let now = Seen::of(files);
    if now.cert != seen.cert || now.key != seen.key {
        match tls.reload_pair() {
            Ok(()) => {
                tracing::info!(cert = %files.cert.display(), "reloaded the serving certificate");
            }
            Err(error) => tracing::warn!(
                error = %error_chain(&error),
                "the serving certificate files changed but do not load; keeping the previous certificate"
            ),
        }
    }
    if now.client_ca != seen.client_ca {
        match tls.reload_client_ca() {
            Ok(()) => tracing::info!(client_ca = ?files.client_ca, "reloaded the client CA"),
            Err(error) => tracing::warn!(
                error = %error_chain(&error),
                "the client CA file changed but does not load; keeping the previous client CA"
            ),
        }
    }
    now
}
