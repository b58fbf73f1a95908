//! The `events.log` writer: the recorder hands each event's JSON line to a thread of its own
//! (`ringlet-events-log`), which appends whatever has queued up in one write and rotates the file
//! by size, so recording an event never waits for the disk on the agent's async core and the log
//! never grows without bound. The kubelet writes no such file; rotation follows its container
//! logs (`containerLogMaxSize`, `containerLogMaxFiles`: `events.log` is renamed to `events.log.1`,
//! `.1` to `.2`, …, and the oldest goes).

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

/// The size past which `events.log` is rotated: the kubelet's default `containerLogMaxSize`.
pub const EVENT_LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// How many files the event log keeps, the current one included: the kubelet's default
/// `containerLogMaxFiles`.
pub const EVENT_LOG_MAX_FILES: usize = 5;
/// Lines waiting for the writer before new ones are dropped (counted): a disk that stalls for good
/// must not grow the agent's memory.
const QUEUE_LINES: usize = 4096;
/// The writer thread's name.
const THREAD_NAME: &str = "ringlet-events-log";

/// How the event log is rotated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRotation {
    /// `events.log` is rotated before a write would take it past this size.
    pub max_bytes: u64,
    /// Files kept, the current one included (at least 1: then the file is truncated instead).
    pub max_files: usize,
}

impl Default for LogRotation {
    fn default() -> Self {
        Self {
            max_bytes: EVENT_LOG_MAX_BYTES,
            max_files: EVENT_LOG_MAX_FILES,
        }
    }
}

enum Op {
    Line(String),
    /// Answered once every line queued before it is written.
    Flush(SyncSender<()>),
}

/// The recorder's end of the writer thread. Dropping it (with the last recorder clone) lets the
/// thread write what is queued and end.
pub(super) struct EventLog {
    queue: SyncSender<Op>,
    dropped: AtomicU64,
}

impl EventLog {
    /// Starts the writer thread for `path`.
    pub(super) fn start(path: PathBuf, rotation: LogRotation) -> io::Result<Self> {
        let (queue, receiver) = mpsc::sync_channel(QUEUE_LINES);
        std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || Writer::new(path, rotation).run(&receiver))?;
        Ok(Self {
            queue,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues one line; never blocks. A full queue drops the line (counted, logged once per run
    /// of drops).
    pub(super) fn append(&self, line: String) {
        match self.queue.try_send(Op::Line(line)) {
            Ok(()) => {
                let dropped = self.dropped.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    tracing::warn!(
                        dropped,
                        "the event log writer caught up after dropping lines"
                    );
                }
            }
            Err(TrySendError::Full(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "the event log writer is {QUEUE_LINES} lines behind (a stalled disk?); \
                         dropping lines for events.log until it catches up"
                    );
                }
            }
            // The writer thread died; its panic was logged.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits until every line queued so far is written (or failed). Blocks the calling thread:
    /// for shutdown and tests, not for the async core.
    pub(super) fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        if self.queue.send(Op::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

struct Writer {
    path: PathBuf,
    rotation: LogRotation,
    file: Option<File>,
    size: u64,
    /// Whether the last write failed: the failure is logged once, the recovery once.
    failing: bool,
}

impl Writer {
    fn new(path: PathBuf, rotation: LogRotation) -> Self {
        Self {
            path,
            rotation,
            file: None,
            size: 0,
            failing: false,
        }
    }

    fn run(mut self, receiver: &Receiver<Op>) {
        while let Ok(first) = receiver.recv() {
            // Whatever queued up meanwhile goes out in the same write.
            let mut lines = Vec::new();
            let mut flushes = Vec::new();
            for op in std::iter::once(first).chain(receiver.try_iter()) {
                match op {
                    Op::Line(line) => lines.push(line),
                    Op::Flush(done) => flushes.push(done),
                }
            }
            let written = self.write(&lines);
            self.report(written);
            for done in flushes {
                let _ = done.send(());
            }
        }
    }

    fn report(&mut self, written: io::Result<()>) {
        match written {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(path = %self.path.display(), "appending to the event log works again");
            }
            Ok(()) => {}
            Err(error) => {
                // Reopened on the next write: the file may have been removed or its disk freed.
                self.file = None;
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(path = %self.path.display(), %error,
                        "cannot append to the event log; events are still logged and kept in memory");
                }
            }
        }
    }

    /// Appends `lines`, rotating first whenever the next line would take the file past the cap.
    fn write(&mut self, lines: &[String]) -> io::Result<()> {
        let mut chunk = Vec::new();
        for line in lines {
            let len = line.len() as u64 + 1;
            let size = self.open()?;
            if size + chunk.len() as u64 + len > self.rotation.max_bytes
                && size + chunk.len() as u64 > 0
            {
                self.append(&chunk)?;
                chunk.clear();
                self.rotate()?;
            }
            chunk.extend_from_slice(line.as_bytes());
            chunk.push(b'\n');
        }
        self.append(&chunk)
    }

    /// Opens the file if it is not open; returns its size.
    fn open(&mut self) -> io::Result<u64> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(self.size)
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.open()?;
        if let Some(file) = self.file.as_mut() {
            file.write_all(bytes)?;
            self.size += bytes.len() as u64;
        }
        Ok(())
    }

    /// `events.log` becomes `events.log.1`, `.1` becomes `.2`, …; the oldest beyond `max_files`
    /// goes.
    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        let kept = self.rotation.max_files.saturating_sub(1);
        if kept == 0 {
            File::create(&self.path)?;
            return Ok(());
        }
        remove_if_present(&rotated(&self.path, kept))?;
        for n in (1..kept).rev() {
            rename_if_present(&rotated(&self.path, n), &rotated(&self.path, n + 1))?;
        }
        rename_if_present(&self.path, &rotated(&self.path, 1))
    }
}

/// `events.log.<n>`.
pub fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn rename_if_present(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Issue 14 §1.7: `events.log` used to grow without bound.
    #[test]
    fn the_log_rotates_at_its_size_cap_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let rotation = LogRotation {
            max_bytes: 100,
            max_files: 3,
        };
        let log = EventLog::start(path.clone(), rotation).unwrap();
        // 30 lines of 10 bytes (with the newline): 10 per file.
        for i in 0..30 {
            log.append(format!("line {i:04}"));
            if i % 7 == 0 {
                // Batches of every size, split across rotations.
                log.flush();
            }
        }
        log.flush();
        for file in [path.clone(), rotated(&path, 1), rotated(&path, 2)] {
            let size = std::fs::metadata(&file).unwrap().len();
            assert!(
                size <= rotation.max_bytes,
                "{} is {size} bytes",
                file.display()
            );
        }
        assert!(!rotated(&path, 3).exists(), "only max_files files are kept");
        let kept: Vec<String> = [rotated(&path, 2), rotated(&path, 1), path.clone()]
            .iter()
            .flat_map(|f| lines(f))
            .collect();
        let expected: Vec<String> = (0..30).map(|i| format!("line {i:04}")).collect();
        assert_eq!(
            kept,
            expected[expected.len() - kept.len()..],
            "newest last, none lost in between"
        );
        assert_eq!(kept.last().unwrap(), "line 0029");
        assert_eq!(kept.len(), 30, "three files of ten lines hold all thirty");
    }

    #[test]
    fn an_existing_log_counts_towards_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        std::fs::write(&path, "x".repeat(95) + "\n").unwrap();
        let log = EventLog::start(
            path.clone(),
            LogRotation {
                max_bytes: 100,
                max_files: 2,
            },
        )
        .unwrap();
        log.append("after restart".to_owned());
        log.flush();
        assert_eq!(lines(&path), ["after restart"]);
        assert_eq!(lines(&rotated(&path, 1)).len(), 1);
    }

    #[test]
    fn one_file_means_truncating() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let log = EventLog::start(
            path.clone(),
            LogRotation {
                max_bytes: 20,
                max_files: 1,
            },
        )
        .unwrap();
        for i in 0..5 {
            log.append(format!("entry {i}"));
        }
        log.flush();
        assert!(std::fs::metadata(&path).unwrap().len() <= 20);
        assert_eq!(lines(&path).last().unwrap(), "entry 4");
        assert!(!rotated(&path, 1).exists());
    }

    #[test]
    fn an_unwritable_log_recovers_once_it_can_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-yet");
        let path = missing.join("events.log");
        let log = EventLog::start(path.clone(), LogRotation::default()).unwrap();
        log.append("lost".to_owned());
        log.flush();
        assert!(!path.exists());
        std::fs::create_dir(&missing).unwrap();
        log.append("kept".to_owned());
        log.flush();
        assert_eq!(lines(&path), ["kept"]);
    }
}
