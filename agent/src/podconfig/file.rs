//! The file source: static pod manifests in `--pod-manifest-path` (a directory, or one file). The
//! directory is watched with inotify (through `notify`) so a change is picked up at once, and rescanned
//! every `--file-check-frequency` as the safety net and to notice a directory that appears later.
//! A scan follows an inotify event after a short debounce, or at once when a writer finished a file
//! (closed it after writing, or renamed it into place); that early scan leaves files still being
//! written for the scan at the debounce's end, so it never reads a manifest half-written.
//! Each scan (listing, reading, decoding) runs on a blocking thread, off the agent's core; a file
//! larger or deeper than a manifest may be is refused by name and the others still run. A file whose
//! inode, size and times are as the last scan found them, last changed long enough ago, is not read
//! again.
//! Corresponds to the kubelet's `pkg/kubelet/config/file.go` (+ `file_linux.go`).

use std::collections::{HashMap, HashSet};
use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::manifest::{
    MAX_MANIFEST_BYTES, Origin, decode_pod, documents, drop_duplicates, normalize,
};
use super::report::{Problem, Reporter};
use super::{
    PodConfigError, PodSource, REASON_FAILED_TO_PARSE_MANIFEST, REASON_FAILED_VALIDATION, SourceSet,
};
use crate::error_chain::error_chain;
use crate::events::Recorder;

/// Editors and `cp` write a file in several steps; waiting this long after the first event lets one
/// rescan see the finished file instead of every intermediate state. A writer that finishes a file
/// sooner (it closes or renames it) ends the wait early.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// How long ago a file must have last changed for its [`Stamp`] to stand for its content. File
/// times are coarse on older kernels, so two writes of the same size in quick succession can leave
/// the same times behind; a file changed this long ago and changed again has a later ctime.
const STAMP_SETTLED_AFTER: Duration = Duration::from_secs(2);

pub(super) struct FileSource {
    path: PathBuf,
    node_name: String,
    reporter: Reporter,
    /// Whether the missing path was already logged, so it is said once, not on every rescan.
    missing_logged: bool,
    /// The files of the previous scan.
    cache: HashMap<PathBuf, ParsedFile>,
    /// The files and their digests behind the last set a scan returned: a rescan that finds the
    /// same returns no set, so the periodic safety net costs no copy and no merge of every pod.
    returned: Option<Vec<(PathBuf, String)>>,
}

impl FileSource {
    pub(super) fn new(path: PathBuf, node_name: String, recorder: Recorder) -> Self {
        Self {
            path,
            node_name,
            reporter: Reporter::new(recorder),
            missing_logged: false,
            cache: HashMap::new(),
            returned: None,
        }
    }

    /// Scans on every tick and shortly after every relevant inotify event; sends each scan's set.
    pub(super) async fn run(mut self, period: Duration, sets: mpsc::Sender<SourceSet>) {
        // Capacity 1 and `try_send` make the channel a "something changed" flag: a burst of events
        // costs one rescan, and the watcher thread never blocks.
        let (wake_tx, mut wake_rx) = mpsc::channel(1);
        let finished = FinishedFiles::default();
        let mut watch = Watch::new(self.path.clone(), wake_tx, finished.clone());
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The end of the debounce an early scan cut short while files were still being written.
        let mut pending: Option<tokio::time::Instant> = None;
        loop {
            // `Some(end of its debounce)` for an early scan.
            let early = tokio::select! {
                _ = ticker.tick() => None,
                () = sleep_until_some(pending) => None,
                Some(()) = wake_rx.recv() => {
                    let deadline = tokio::time::Instant::now() + DEBOUNCE;
                    debounce(&mut wake_rx, &finished, deadline).await.then_some(deadline)
                }
            };
            // The scan reads and decodes files: blocking and CPU-bound work that must not stall the
            // agent's single-threaded core (a pathological manifest may take a while even within
            // the limits). The source and its watch travel to a blocking thread and back.
            let finished = finished.clone();
            let scanned = tokio::task::spawn_blocking(move || {
                // Watch before scanning, so a change made during the scan still wakes us.
                watch.refresh();
                // Taken by every scan: a file finished before a full scan may be written again.
                let finished = finished.take();
                let (pods, deferred) = if early.is_some() {
                    self.scan_finished(&finished, SystemTime::now())
                } else {
                    (self.scan(), false)
                };
                (self, watch, pods, deferred)
            })
            .await;
            let pods = match scanned {
                Ok((source, refreshed, pods, deferred)) => {
                    self = source;
                    watch = refreshed;
                    // Files left for later are read at the end of the earliest debounce they cut.
                    pending = early
                        .filter(|_| deferred)
                        .map(|deadline| pending.map_or(deadline, |p| p.min(deadline)));
                    pods
                }
                Err(err) => {
                    tracing::error!(%err, "the pod manifest scan failed; the file source stops");
                    return;
                }
            };
            let Some(pods) = pods else { continue };
            let set = SourceSet {
                source: PodSource::File,
                pods,
            };
            if sets.send(set).await.is_err() {
                return;
            }
        }
    }

    /// The pods the manifests describe now, or `None` when the path cannot be read at all or no
    /// file changed since the last set (then the previous set stays). A missing path is an empty
    /// set, so the source still becomes ready.
    pub(super) fn scan(&mut self) -> Option<Vec<Pod>> {
        self.scan_at(SystemTime::now())
    }

    /// [`Self::scan`] as if the clock read `now` (which decides whose stamps are settled).
    fn scan_at(&mut self, now: SystemTime) -> Option<Vec<Pod>> {
        self.scan_with(now, |_| false).0
    }

    /// A scan before the debounce ended, because writers finished the files in `finished`: a file
    /// changed within the debounce and not among them may still be being written, so its previous
    /// content stands for now. Returns the set as [`Self::scan`] does, and whether a file was left
    /// for later.
    fn scan_finished(
        &mut self,
        finished: &HashSet<PathBuf>,
        now: SystemTime,
    ) -> (Option<Vec<Pod>>, bool) {
        self.scan_with(now, |file| {
            !finished.contains(file) && changed_within(file, DEBOUNCE, now)
        })
    }

    /// [`Self::scan_at`], leaving the files `in_progress` picks at their previous content; also
    /// returns whether it picked any.
    fn scan_with(
        &mut self,
        now: SystemTime,
        in_progress: impl Fn(&Path) -> bool,
    ) -> (Option<Vec<Pod>>, bool) {
        let metadata = match std::fs::metadata(&self.path) {
            Ok(metadata) => metadata,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if !self.missing_logged {
                    tracing::warn!(path = %self.path.display(), "pod manifest path does not exist; rescanning periodically");
                    self.missing_logged = true;
                }
                self.reporter.finish_scan(Vec::new());
                return (self.changed(Vec::new()).then(Vec::new), false);
            }
            Err(source) => {
                let err = PodConfigError::ReadManifest {
                    path: self.path.clone(),
                    source,
                };
                self.reporter
                    .finish_scan(vec![file_problem(&self.path, &err, "")]);
                // The reporter saw this failure instead of the last set's problems: the next scan
                // that reads the files returns its set and reports them again.
                self.returned = None;
                return (None, false);
            }
        };
        self.missing_logged = false;

        let files = if metadata.is_dir() {
            match manifest_files(&self.path) {
                Ok(files) => files,
                Err(err) => {
                    self.reporter
                        .finish_scan(vec![file_problem(&self.path, &err, "")]);
                    self.returned = None;
                    return (None, false);
                }
            }
        } else {
            vec![self.path.clone()]
        };

        let mut previous = std::mem::take(&mut self.cache);
        let mut deferred = false;
        for file in &files {
            if in_progress(file) {
                deferred = true;
                if let Some(parsed) = previous.remove(file) {
                    self.cache.insert(file.clone(), parsed);
                }
                continue;
            }
            let parsed = self.read_file(file, &mut previous, now);
            self.cache.insert(file.clone(), parsed);
        }
        let listing = self
            .cache
            .iter()
            .map(|(file, parsed)| (file.clone(), parsed.digest.clone()))
            .collect();
        if !self.changed(listing) {
            return (None, deferred);
        }
        let mut problems = Vec::new();
        let mut pods = Vec::new();
        for file in &files {
            let Some(parsed) = self.cache.get(file) else {
                continue;
            };
            pods.extend(parsed.pods.iter().map(|pod| (object(file), pod.clone())));
            problems.extend(parsed.problems.iter().cloned());
        }
        let pods = drop_duplicates(pods, &mut problems);
        self.reporter.finish_scan(problems);
        (Some(pods), deferred)
    }

    /// Whether `listing` (files and digests) differs from the one behind the last set returned;
    /// remembers it.
    fn changed(&mut self, mut listing: Vec<(PathBuf, String)>) -> bool {
        listing.sort_unstable();
        if self.returned.as_ref() == Some(&listing) {
            return false;
        }
        self.returned = Some(listing);
        true
    }

    /// Reads one manifest; a file with the settled stamp of the previous scan is not read again and
    /// content seen in the previous scan is not decoded again, which keeps a rescan of thousands of
    /// manifests cheap.
    fn read_file(
        &self,
        file: &Path,
        cache: &mut HashMap<PathBuf, ParsedFile>,
        now: SystemTime,
    ) -> ParsedFile {
        // Taken before the read: a change during the read leaves a later stamp for the next scan.
        let stamp = Stamp::settled(file, now);
        let previous = match cache.remove(file) {
            Some(parsed) if stamp.is_some() && parsed.stamp == stamp => return parsed,
            other => other,
        };
        let bytes = match read_capped(file) {
            Ok(bytes) => bytes,
            // Deleted between listing and reading: it is simply gone.
            Err(PodConfigError::ReadManifest { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return ParsedFile::default();
            }
            // The error stands in for the digest, so another failure is another listing.
            Err(err) => {
                let problem = file_problem(file, &err, "");
                return ParsedFile {
                    digest: format!("unreadable: {}", problem.message),
                    problems: vec![problem],
                    ..ParsedFile::default()
                };
            }
        };
        let digest = format!("{:x}", Sha256::digest(&bytes));
        if let Some(parsed) = previous
            && parsed.digest == digest
        {
            return ParsedFile { stamp, ..parsed };
        }
        let mut parsed = ParsedFile {
            digest,
            stamp,
            ..ParsedFile::default()
        };
        let decoded = std::str::from_utf8(&bytes)
            .map_err(PodConfigError::NotUtf8)
            .and_then(documents);
        let values = match decoded {
            Ok(values) => values,
            Err(err) => {
                parsed
                    .problems
                    .push(file_problem(file, &err, &parsed.digest));
                return parsed;
            }
        };
        for (index, value) in values {
            let pod = decode_pod(index, value);
            match pod.and_then(|pod| normalize(pod, Origin::File(file), &self.node_name)) {
                Ok(pod) => parsed.pods.push(pod),
                Err(err) => parsed
                    .problems
                    .push(file_problem(file, &err, &parsed.digest)),
            }
        }
        parsed
    }
}

/// The content of `file`, refused without reading it all when it is larger than a manifest may be.
fn read_capped(file: &Path) -> Result<Vec<u8>, PodConfigError> {
    let read_error = |source| PodConfigError::ReadManifest {
        path: file.to_path_buf(),
        source,
    };
    let opened = std::fs::File::open(file).map_err(read_error)?;
    let limit = u64::try_from(MAX_MANIFEST_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    // One byte past the limit tells a file at the limit from a larger one.
    opened
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() > MAX_MANIFEST_BYTES {
        let size = std::fs::metadata(file).map_or(limit + 1, |metadata| metadata.len());
        return Err(PodConfigError::TooLarge {
            size,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    Ok(bytes)
}

/// What tells that a file changed without reading it: which file it is, its size, and its
/// modification and status-change times. Any write or rename over it changes the ctime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    device: u64,
    inode: u64,
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    /// The stamp of `file` (through symlinks), when its last change is at least
    /// [`STAMP_SETTLED_AFTER`] before `now`; `None` when it is newer or cannot be read.
    fn settled(file: &Path, now: SystemTime) -> Option<Self> {
        let metadata = std::fs::metadata(file).ok()?;
        if now.duration_since(changed_at(&metadata)?).ok()? < STAMP_SETTLED_AFTER {
            return None;
        }
        Some(Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        })
    }
}

/// What one manifest file held the last time it was read.
#[derive(Clone, Debug, Default)]
struct ParsedFile {
    /// The content's SHA-256, or the read error of a file that could not be read.
    digest: String,
    /// The file's stamp when it was read, if it had settled by then.
    stamp: Option<Stamp>,
    pods: Vec<Pod>,
    problems: Vec<Problem>,
}

/// Waits out the debounce that an inotify wake started (until `deadline`), or less when a writer
/// finished a file meanwhile; returns whether it ended early.
async fn debounce(
    wake: &mut mpsc::Receiver<()>,
    finished: &FinishedFiles,
    deadline: tokio::time::Instant,
) -> bool {
    let early = loop {
        if finished.any() {
            break true;
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => break false,
            Some(()) = wake.recv() => {}
        }
    };
    // The scan that follows sees every change these wakes stood for.
    while wake.try_recv().is_ok() {}
    early
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When a file's status (content, name or mode) last changed: its ctime.
fn changed_at(metadata: &std::fs::Metadata) -> Option<SystemTime> {
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(metadata.ctime()).ok()?,
                u32::try_from(metadata.ctime_nsec()).ok()?,
            ),
    )
}

/// Whether `file`'s status changed less than `window` before `now` (a clock behind the file's time
/// counts as just now); a file that cannot be read counts as settled.
fn changed_within(file: &Path, window: Duration, now: SystemTime) -> bool {
    std::fs::metadata(file)
        .ok()
        .and_then(|metadata| changed_at(&metadata))
        .is_some_and(|at| now.duration_since(at).map_or(true, |since| since < window))
}

/// The files whose writers finished them since the last early scan (closed after writing, or
/// renamed into place), as the inotify watcher saw them. Cloneable; clones share the set.
#[derive(Clone, Default)]
struct FinishedFiles(std::sync::Arc<std::sync::Mutex<HashSet<PathBuf>>>);

impl FinishedFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, files: impl IntoIterator<Item = PathBuf>) {
        self.lock().extend(files);
    }

    fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    fn take(&self) -> HashSet<PathBuf> {
        std::mem::take(&mut *self.lock())
    }
}

/// The files an inotify event says a writer finished: written and closed, or renamed into place.
fn finished_by(event: &notify::Event) -> &[PathBuf] {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => &event.paths,
        // A rename within the directory names the old path, then the new one.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            event.paths.get(1..).unwrap_or_default()
        }
        _ => &[],
    }
}

fn object(file: &Path) -> String {
    format!("file/{}", file.display())
}

fn file_problem(file: &Path, err: &PodConfigError, digest: &str) -> Problem {
    let reason = match err {
        PodConfigError::InvalidPod { .. } => REASON_FAILED_VALIDATION,
        _ => REASON_FAILED_TO_PARSE_MANIFEST,
    };
    Problem {
        object: object(file),
        reason,
        message: format!("{}: {}", file.display(), error_chain(err)),
        identity: digest.to_owned(),
    }
}

/// The regular files of a manifest directory, sorted by name; dotfiles (editor swap files, atomic
/// write temporaries) and subdirectories are not manifests.
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, PodConfigError> {
    let list_error = |source| PodConfigError::ListManifests {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(list_error)? {
        let entry = entry.map_err(list_error)?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        // Follows symlinks, so a link to a manifest counts like the manifest.
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => files.push(path),
            Ok(_) => tracing::debug!(path = %path.display(), "not a regular file, not a manifest"),
            Err(err) => {
                tracing::debug!(path = %path.display(), %err, "manifest vanished while listing");
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The inotify watch on the manifest directory (or on a manifest file's parent directory, because
/// editors replace files by renaming, which a watch on the file itself would not follow).
struct Watch {
    path: PathBuf,
    wake: mpsc::Sender<()>,
    finished: FinishedFiles,
    /// The watcher and the identity (device, inode) of the directory it watches.
    current: Option<(RecommendedWatcher, (u64, u64))>,
}

impl Watch {
    fn new(path: PathBuf, wake: mpsc::Sender<()>, finished: FinishedFiles) -> Self {
        Self {
            path,
            wake,
            finished,
            current: None,
        }
    }

    /// (Re)creates the watcher when the watched directory appeared, vanished or was replaced.
    fn refresh(&mut self) {
        let (dir, only) = match std::fs::metadata(&self.path) {
            Ok(metadata) if metadata.is_dir() => (self.path.clone(), None),
            // A file, or nothing yet: watch the parent for changes to (or the creation of) the path.
            _ => match self.path.parent() {
                // A bare relative file name lives in the working directory.
                Some(parent) if parent.as_os_str().is_empty() => {
                    (PathBuf::from("."), Some(Path::new(".").join(&self.path)))
                }
                Some(parent) => (parent.to_path_buf(), Some(self.path.clone())),
                None => {
                    self.current = None;
                    return;
                }
            },
        };
        let Ok(dir_metadata) = std::fs::metadata(&dir) else {
            self.current = None;
            return;
        };
        let identity = (dir_metadata.dev(), dir_metadata.ino());
        if self.current.as_ref().is_some_and(|(_, id)| *id == identity) {
            return;
        }
        self.current = None;
        let wake = self.wake.clone();
        let finished = self.finished.clone();
        let handler = move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                // Its own reads during a rescan must not trigger another rescan.
                Ok(event) => {
                    !matches!(
                        event.kind,
                        EventKind::Access(
                            AccessKind::Open(_)
                                | AccessKind::Read
                                | AccessKind::Close(AccessMode::Read)
                        )
                    ) && only
                        .as_ref()
                        .is_none_or(|file| event.paths.iter().any(|p| p == file))
                }
                // An error (e.g. queue overflow) means events may be lost: rescan.
                Err(_) => true,
            };
            if relevant {
                if let Ok(event) = &event {
                    // Recorded before the wake, so the woken source finds it.
                    finished.add(finished_by(event).iter().cloned());
                }
                // Full means a rescan is already pending; that one will see this change too.
                let _ = wake.try_send(());
            }
        };
        let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
            watcher.watch(&dir, RecursiveMode::NonRecursive)?;
            Ok(watcher)
        });
        match watcher {
            Ok(watcher) => self.current = Some((watcher, identity)),
            Err(err) => tracing::warn!(
                path = %dir.display(),
                err = %error_chain(&err),
                "cannot watch the pod manifest directory; relying on the periodic rescan"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podconfig::storage::PodStorage;
    use crate::podconfig::{PodOperation, PodUpdate};

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    fn names<P: std::borrow::Borrow<Pod>>(pods: &[P]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.borrow().metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    fn source(path: &Path) -> (FileSource, Recorder) {
        let recorder = Recorder::new(None);
        let source = FileSource::new(path.to_path_buf(), "node1".to_owned(), recorder.clone());
        (source, recorder)
    }

    #[test]
    fn scans_yaml_and_json_files_and_skips_dotfiles_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let two_docs = format!("{}---\n{}", manifest("a", "i"), manifest("b", "i"));
        std::fs::write(dir.path().join("ab.yaml"), two_docs).unwrap();
        std::fs::write(
            dir.path().join("c.json"),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join(".swap.yaml"), manifest("hidden", "i")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/d.yaml"), manifest("d", "i")).unwrap();
        let (mut source, recorder) = source(dir.path());
        let pods = source.scan().unwrap();
        assert_eq!(names(&pods), ["a-node1", "b-node1", "c-node1"]);
        assert!(recorder.recent().is_empty());
    }

    #[test]
    fn a_single_manifest_file_can_be_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, manifest("web", "i")).unwrap();
        let (mut source, _) = source(&file);
        assert_eq!(names(&source.scan().unwrap()), ["web-node1"]);
    }

    #[test]
    fn a_broken_file_is_reported_once_and_the_good_one_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good.yaml"), manifest("good", "i")).unwrap();
        let broken = dir.path().join("broken.yaml");
        std::fs::write(&broken, "apiVersion: v1\nkind: Pod\nmetadata: [\n").unwrap();
        let (mut source, recorder) = source(dir.path());

        let mut storage = PodStorage::default();
        let updates = storage.merge(PodSource::File, source.scan().unwrap());
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].op, PodOperation::Add);
        assert_eq!(names(&updates[0].pods), ["good-node1"]);

        let events = recorder.recent();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].object, format!("file/{}", broken.display()));
        assert_eq!(events[0].reason, REASON_FAILED_TO_PARSE_MANIFEST);
        assert!(
            events[0].message.contains("broken.yaml"),
            "{}",
            events[0].message
        );

        // Rescanning the same broken content returns no set and does not repeat the event.
        assert_eq!(source.scan(), None);
        assert_eq!(recorder.recent().len(), 1);

        // Editing it into another broken state is a new problem.
        std::fs::write(
            &broken,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n",
        )
        .unwrap();
        source.scan().unwrap();
        let events = recorder.recent();
        assert_eq!(events.len(), 2);
        assert!(
            events[1].message.contains("Service"),
            "{}",
            events[1].message
        );
    }

    #[test]
    fn a_deeply_nested_manifest_is_refused_by_name_and_the_others_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
        let deep = dir.path().join("deep.json");
        let depth = 100_000;
        std::fs::write(
            &deep,
            format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth)),
        )
        .unwrap();
        std::fs::write(dir.path().join("z.yaml"), manifest("z", "i")).unwrap();
        let (mut source, recorder) = source(dir.path());
        assert_eq!(names(&source.scan().unwrap()), ["a-node1", "z-node1"]);
        let events = recorder.recent();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, REASON_FAILED_TO_PARSE_MANIFEST);
        assert_eq!(
            events[0].message,
            format!(
                "{}: manifest nests deeper than 128 levels (at line 1, column 641); no pod nests that deep",
                deep.display()
            )
        );
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
        let big = dir.path().join("big.yaml");
        let file = std::fs::File::create(&big).unwrap();
        // Sparse: 1 GiB on paper, nothing on disk.
        file.set_len(1 << 30).unwrap();
        let (mut source, recorder) = source(dir.path());
        assert_eq!(names(&source.scan().unwrap()), ["a-node1"]);
        let message = &recorder.recent()[0].message;
        assert!(
            message.starts_with(&format!("{}: manifest is 1073741824 bytes", big.display())),
            "{message}"
        );
        assert_eq!(source.scan(), None, "the same failure is no new set");

        file.set_len(1 << 31).unwrap();
        assert_eq!(
            source.scan().map(|pods| names(&pods).join(",")),
            Some("a-node1".to_owned()),
            "another failure is another set"
        );
        let events = recorder.recent();
        assert_eq!(events.len(), 2, "and it is reported");
        assert!(events[1].message.contains("2147483648 bytes"), "{events:?}");
    }

    #[test]
    fn after_the_path_could_not_be_read_the_same_manifests_are_a_set_again() {
        let dir = tempfile::tempdir().unwrap();
        let (parent, saved) = (dir.path().join("etc"), dir.path().join("etc.saved"));
        let manifests = parent.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        std::fs::write(manifests.join("a.yaml"), manifest("a", "i")).unwrap();
        let (mut source, recorder) = source(&manifests);
        assert_eq!(names(&source.scan().unwrap()), ["a-node1"]);

        // A regular file where the parent directory was: the path cannot be looked up (ENOTDIR).
        std::fs::rename(&parent, &saved).unwrap();
        std::fs::write(&parent, "").unwrap();
        assert_eq!(source.scan(), None);
        assert_eq!(recorder.recent().len(), 1, "the failure is reported");

        std::fs::remove_file(&parent).unwrap();
        std::fs::rename(&saved, &parent).unwrap();
        assert_eq!(
            source.scan().map(|pods| names(&pods).join(",")),
            Some("a-node1".to_owned()),
            "the same manifests are a set again"
        );
    }

    #[tokio::test]
    async fn the_running_source_sends_the_good_pods_beside_a_deep_manifest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), manifest("web", "i")).unwrap();
        let depth = 100_000;
        std::fs::write(
            dir.path().join("deep.yaml"),
            format!("a: {}1{}\n", "[".repeat(depth), "]".repeat(depth)),
        )
        .unwrap();
        let (source, recorder) = source(dir.path());
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        assert_eq!(names(&next_set(&mut rx).await.pods), ["web-node1"]);
        assert!(
            recorder.recent()[0]
                .message
                .contains("deeper than 128 levels")
        );
    }

    #[test]
    fn an_invalid_pod_is_a_validation_event() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:\n  containers: []\n",
        )
        .unwrap();
        let (mut source, recorder) = source(dir.path());
        assert!(source.scan().unwrap().is_empty());
        let events = recorder.recent();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, REASON_FAILED_VALIDATION);
        assert!(events[0].message.contains("at least one container"));
    }

    #[test]
    fn editing_a_manifest_replaces_the_pod_and_deleting_it_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, manifest("web", "nginx:1")).unwrap();
        let (mut source, _) = source(dir.path());
        let mut storage = PodStorage::default();
        let added = storage.merge(PodSource::File, source.scan().unwrap());
        let first_uid = added[0].pods[0].metadata.uid.clone();

        // Unchanged content is no new set.
        assert_eq!(source.scan(), None);

        std::fs::write(&file, manifest("web", "nginx:2")).unwrap();
        let updates = storage.merge(PodSource::File, source.scan().unwrap());
        let ops: Vec<PodOperation> = updates.iter().map(|u| u.op).collect();
        assert_eq!(ops, [PodOperation::Remove, PodOperation::Add]);
        assert_eq!(updates[0].pods[0].metadata.uid, first_uid);
        assert_ne!(updates[1].pods[0].metadata.uid, first_uid);

        std::fs::remove_file(&file).unwrap();
        let updates = storage.merge(PodSource::File, source.scan().unwrap());
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].op, PodOperation::Remove);
        assert_eq!(names(&updates[0].pods), ["web-node1"]);
    }

    fn image(pods: &[Pod]) -> Option<&str> {
        pods[0].spec.as_ref()?.containers[0].image.as_deref()
    }

    #[test]
    fn a_same_size_edit_of_a_file_read_long_after_its_last_change_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, manifest("web", "nginx:1")).unwrap();
        let (mut source, _) = source(dir.path());
        // The scans run as if a minute later: the stamp of the file counts as settled.
        let later = SystemTime::now() + Duration::from_mins(1);
        assert_eq!(image(&source.scan_at(later).unwrap()), Some("nginx:1"));
        assert_eq!(source.scan_at(later), None);

        std::fs::write(&file, manifest("web", "nginx:2")).unwrap();
        assert_eq!(image(&source.scan_at(later).unwrap()), Some("nginx:2"));
    }

    #[test]
    fn a_file_changed_just_now_has_no_stamp_to_trust_yet() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, manifest("web", "nginx:1")).unwrap();
        let now = SystemTime::now();
        assert_eq!(Stamp::settled(&file, now), None);
        assert!(Stamp::settled(&file, now + STAMP_SETTLED_AFTER).is_some());
        assert_eq!(Stamp::settled(&dir.path().join("gone.yaml"), now), None);
    }

    #[test]
    fn a_missing_directory_is_an_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, recorder) = source(&dir.path().join("nope"));
        assert_eq!(source.scan(), Some(Vec::new()));
        assert_eq!(source.scan(), None, "still missing: no new set");
        assert!(recorder.recent().is_empty());
    }

    #[test]
    fn a_duplicate_pod_name_across_files_keeps_the_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("web", "i:1")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), manifest("web", "i:2")).unwrap();
        let (mut source, recorder) = source(dir.path());
        let pods = source.scan().unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("i:1")
        );
        assert_eq!(recorder.recent().len(), 1);
        assert!(recorder.recent()[0].object.ends_with("b.yaml"));
    }

    #[test]
    fn an_early_scan_reads_finished_files_and_leaves_the_others_at_their_last_content() {
        let dir = tempfile::tempdir().unwrap();
        let (finished, in_progress, edited) = (
            dir.path().join("a.yaml"),
            dir.path().join("b.yaml"),
            dir.path().join("c.yaml"),
        );
        std::fs::write(&edited, manifest("c", "i:1")).unwrap();
        let (mut source, _) = source(dir.path());
        let later = SystemTime::now() + DEBOUNCE * 2;
        assert_eq!(names(&source.scan_at(later).unwrap()), ["c-node1"]);

        std::fs::write(&finished, manifest("a", "i")).unwrap();
        std::fs::write(&in_progress, manifest("b", "i")).unwrap();
        std::fs::write(&edited, manifest("c", "i:2")).unwrap();
        let (pods, deferred) =
            source.scan_finished(&HashSet::from([finished.clone()]), SystemTime::now());
        let pods = pods.unwrap();
        assert!(deferred, "b and c may still be being written");
        assert_eq!(names(&pods), ["a-node1", "c-node1"]);
        assert_eq!(image(&pods[1..]), Some("i:1"), "c keeps its last content");

        let pods = source.scan_at(SystemTime::now() + DEBOUNCE * 2).unwrap();
        assert_eq!(names(&pods), ["a-node1", "b-node1", "c-node1"]);
        assert_eq!(image(&pods[2..]), Some("i:2"));

        let (pods, deferred) =
            source.scan_finished(&HashSet::new(), SystemTime::now() + DEBOUNCE * 2);
        assert!(!deferred, "nothing changed within the debounce");
        assert!(pods.is_none(), "nor since the last set");
    }

    #[test]
    fn a_writer_finishes_a_file_by_closing_it_or_renaming_it_into_place() {
        use notify::event::{CreateKind, DataChange};
        let event = |kind, paths: &[&str]| notify::Event {
            kind,
            paths: paths.iter().map(PathBuf::from).collect(),
            attrs: notify::event::EventAttributes::default(),
        };
        let closed = event(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            &["/m/a.yaml"],
        );
        assert_eq!(finished_by(&closed), [PathBuf::from("/m/a.yaml")]);
        let moved_in = event(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            &["/m/a.yaml"],
        );
        assert_eq!(finished_by(&moved_in), [PathBuf::from("/m/a.yaml")]);
        let renamed = event(
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            &["/m/.a.swp", "/m/a.yaml"],
        );
        assert_eq!(finished_by(&renamed), [PathBuf::from("/m/a.yaml")]);
        for unfinished in [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
        ] {
            assert!(finished_by(&event(unfinished, &["/m/a.yaml"])).is_empty());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_debounce_ends_when_a_writer_finishes_a_file() {
        let (wake, mut woken) = mpsc::channel(1);
        let finished = FinishedFiles::default();
        let start = tokio::time::Instant::now();
        wake.try_send(()).unwrap();
        assert!(
            !debounce(&mut woken, &finished, start + DEBOUNCE).await,
            "nothing finished: the whole debounce"
        );
        assert_eq!(start.elapsed(), DEBOUNCE);
        assert!(woken.try_recv().is_err(), "the wakes it covered are taken");

        let start = tokio::time::Instant::now();
        finished.add([PathBuf::from("/m/a.yaml")]);
        wake.try_send(()).unwrap();
        assert!(debounce(&mut woken, &finished, start + DEBOUNCE).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(woken.try_recv().is_err());
        assert_eq!(finished.take(), HashSet::from([PathBuf::from("/m/a.yaml")]));
        assert!(!finished.any());
    }

    async fn next_set(rx: &mut mpsc::Receiver<SourceSet>) -> SourceSet {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a set within the timeout")
            .expect("the source is running")
    }

    #[tokio::test(start_paused = true)]
    async fn a_directory_that_appears_later_is_picked_up_by_the_periodic_rescan() {
        let dir = tempfile::tempdir().unwrap();
        // Not even the parent exists, so nothing can be watched yet.
        let manifests = dir.path().join("etc/manifests");
        let (source, _) = source(&manifests);
        let (tx, mut rx) = mpsc::channel(8);
        // Shorter than the 10 s wait in `next_set`, which also runs on the paused clock.
        let period = Duration::from_secs(5);
        tokio::spawn(source.run(period, tx));

        let first = next_set(&mut rx).await;
        assert!(first.pods.is_empty(), "a missing directory is an empty set");
        let start = tokio::time::Instant::now();

        std::fs::create_dir_all(&manifests).unwrap();
        std::fs::write(manifests.join("web.yaml"), manifest("web", "i")).unwrap();
        let set = next_set(&mut rx).await;
        assert_eq!(names(&set.pods), ["web-node1"]);
        assert!(start.elapsed() >= period);
    }

    #[tokio::test]
    async fn inotify_picks_up_a_new_file_without_waiting_for_the_rescan() {
        let dir = tempfile::tempdir().unwrap();
        let (source, _) = source(dir.path());
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        assert!(next_set(&mut rx).await.pods.is_empty());

        std::fs::write(dir.path().join("web.yaml"), manifest("web", "i")).unwrap();
        // A partially written file may be seen first; the next event brings the finished one.
        loop {
            let set = next_set(&mut rx).await;
            if !set.pods.is_empty() {
                assert_eq!(names(&set.pods), ["web-node1"]);
                break;
            }
        }

        std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
        // Events of the write may still be queued; the removal shows up after them.
        while !next_set(&mut rx).await.pods.is_empty() {}
    }

    #[tokio::test]
    async fn inotify_sees_a_missing_directory_appear() {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        let (source, _) = source(&manifests);
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        assert!(next_set(&mut rx).await.pods.is_empty());

        std::fs::create_dir(&manifests).unwrap();
        std::fs::write(manifests.join("web.yaml"), manifest("web", "i")).unwrap();
        while next_set(&mut rx).await.pods.is_empty() {}
    }

    #[tokio::test]
    async fn a_single_watched_file_replaced_by_rename_is_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, manifest("web", "i:1")).unwrap();
        let (source, _) = source(&file);
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        let first = next_set(&mut rx).await;
        let first_uid = first.pods[0].metadata.uid.clone();

        // Editors write a temporary file and rename it over the manifest.
        let temporary = dir.path().join(".web.yaml.swp");
        std::fs::write(&temporary, manifest("web", "i:2")).unwrap();
        std::fs::rename(&temporary, &file).unwrap();
        loop {
            let set = next_set(&mut rx).await;
            if set.pods[0].metadata.uid != first_uid {
                let image = set.pods[0].spec.as_ref().unwrap().containers[0]
                    .image
                    .clone();
                assert_eq!(image.as_deref(), Some("i:2"));
                break;
            }
        }
    }

    #[tokio::test]
    async fn the_merged_stream_removes_a_deleted_manifest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), manifest("web", "i")).unwrap();
        let (source, _) = source(dir.path());
        let (tx, mut rx) = mpsc::channel(8);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        let mut storage = PodStorage::default();
        let mut updates: Vec<PodUpdate> = Vec::new();
        updates.extend(storage.merge(PodSource::File, next_set(&mut rx).await.pods));
        std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
        while updates.len() < 2 {
            updates.extend(storage.merge(PodSource::File, next_set(&mut rx).await.pods));
        }
        let ops: Vec<PodOperation> = updates.iter().map(|u| u.op).collect();
        assert_eq!(ops, [PodOperation::Add, PodOperation::Remove]);
    }
}
