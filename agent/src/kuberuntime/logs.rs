//! Reading CRI-format container log files (the kubelet's `pkg/kubelet/kuberuntime/logs`): each line of
//! the file is `<RFC 3339 timestamp> <stdout|stderr> <F|P>[:<more tags>] <content>`, where `P` marks a
//! fragment of a longer line that the runtime split and the next lines continue. [`read_logs`] turns
//! such a file into what `kubectl logs` shows: the contents, optionally timestamped, limited by
//! `tailLines` / `sinceSeconds` / `sinceTime` / `limitBytes`, and with `follow` kept open across
//! appends and log rotation until the container stops or the client goes away. After a rotation
//! (the file renamed away, a new one at the path: see `crate::logs`) the renamed file is read until
//! the runtime has closed it, so the lines it wrote there while switching files are not lost.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::num::ParseIntError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use jiff::{SignedDuration, Timestamp};
use notify::Watcher;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::io::{IoEngine, ReadFile, identity_of};

/// Bytes read per step when searching backwards for the start of the tail.
const TAIL_CHUNK: usize = 64 * 1024;
/// Bytes read per step going forward.
const READ_CHUNK: usize = 64 * 1024;
/// How much of a line is enough to see its timestamp, stream and tag.
const HEADER_MAX: usize = 96;
/// Output is handed to the client in pieces of about this size.
const OUTPUT_CHUNK: usize = 32 * 1024;
/// A raw line longer than this is dropped: runtimes split long lines (containerd at 16 KiB), so
/// only a corrupt file has one, and it must not grow memory without bound.
const MAX_LINE: usize = 1024 * 1024;
/// A joined (`P` … `F`) message longer than this is handed out unfinished, for the same reason.
const MAX_JOINED: usize = 1024 * 1024;
/// While following with inotify: re-read at least this often anyway, in case an event was missed.
const WATCHED_POLL_PERIOD: Duration = Duration::from_secs(1);
/// While following without inotify (watch setup failed): how often to look for new data.
const UNWATCHED_POLL_PERIOD: Duration = Duration::from_millis(250);
/// While following: how often at most to ask whether the container still runs.
const STATE_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// After a rotation: how long to keep reading the renamed file when its writer is not seen closing
/// it (no inotify, or a runtime that keeps it open). Shorter than the shortest rotation interval
/// (3s), so the file after it is not skipped.
const ROTATION_GRACE: Duration = Duration::from_secs(2);
/// How many recent closes of written files in the log's directory the watch remembers.
const CLOSES_KEPT: usize = 64;

/// Why the query of a container-logs request is unacceptable.
#[derive(Debug, thiserror::Error)]
pub enum LogOptionsError {
    #[error("invalid value {value:?} for query parameter {param}: expected true or false")]
    Bool { param: &'static str, value: String },
    #[error("invalid value {value:?} for query parameter {param}: expected an integer")]
    Number {
        param: &'static str,
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error("invalid value {value:?} for query parameter {param}: must be at least {min}")]
    TooSmall {
        param: &'static str,
        value: String,
        min: i64,
    },
    #[error("invalid value {value:?} for query parameter sinceTime: expected an RFC 3339 time")]
    Time {
        value: String,
        #[source]
        source: jiff::Error,
    },
    #[error("at most one of the query parameters sinceSeconds and sinceTime may be given")]
    SinceConflict,
}

/// What part of a container's log to serve, from the query of `/containerLogs/...` (the names of
/// `v1.PodLogOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `follow`: keep the response open and stream what the container writes next.
    pub follow: bool,
    /// `previous`: the caller serves the previous instance of the container; reading is the same.
    pub previous: bool,
    /// `tailLines`: only the last N lines (complete lines: joined fragments count once).
    pub tail_lines: Option<u64>,
    /// `limitBytes`: stop after exactly this many bytes of output.
    pub limit_bytes: Option<u64>,
    /// `timestamps`: prefix every line with its RFC 3339 timestamp and a space.
    pub timestamps: bool,
    /// `sinceSeconds` (relative to `now`) or `sinceTime`: skip lines logged before this.
    pub since: Option<Timestamp>,
}

impl LogOptions {
    /// Parses a request's query string. Unknown parameters (such as `container`) are ignored; of a
    /// repeated parameter the first value counts, as in the kubelet.
    pub fn from_query(query: Option<&str>, now: Timestamp) -> Result<Self, LogOptionsError> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        let since_seconds = get("sinceSeconds")
            .map(|v| parse_at_least("sinceSeconds", v, 1))
            .transpose()?;
        let since_time = get("sinceTime")
            .map(|v| {
                v.parse::<Timestamp>()
                    .map_err(|source| LogOptionsError::Time {
                        value: v.to_owned(),
                        source,
                    })
            })
            .transpose()?;
        let since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => return Err(LogOptionsError::SinceConflict),
            (Some(seconds), None) => Some(
                now.checked_sub(SignedDuration::from_secs(
                    i64::try_from(seconds).unwrap_or(i64::MAX),
                ))
                .unwrap_or(Timestamp::MIN),
            ),
            (None, time) => time,
        };
        Ok(Self {
            follow: get("follow").map(|v| parse_bool("follow", v)).transpose()? == Some(true),
            previous: get("previous")
                .map(|v| parse_bool("previous", v))
                .transpose()?
                == Some(true),
            timestamps: get("timestamps")
                .map(|v| parse_bool("timestamps", v))
                .transpose()?
                == Some(true),
            tail_lines: get("tailLines")
                .map(|v| parse_at_least("tailLines", v, 0))
                .transpose()?,
            limit_bytes: get("limitBytes")
                .map(|v| parse_at_least("limitBytes", v, 1))
                .transpose()?,
            since,
        })
    }
}

/// A present parameter with no value (`?follow`) means true, like the API server's conversion.
fn parse_bool(param: &'static str, value: &str) -> Result<bool, LogOptionsError> {
    match value.to_ascii_lowercase().as_str() {
        "" | "1" | "t" | "true" => Ok(true),
        "0" | "f" | "false" => Ok(false),
        _ => Err(LogOptionsError::Bool {
            param,
            value: value.to_owned(),
        }),
    }
}

fn parse_at_least(param: &'static str, value: &str, min: i64) -> Result<u64, LogOptionsError> {
    let number: i64 = value.parse().map_err(|source| LogOptionsError::Number {
        param,
        value: value.to_owned(),
        source,
    })?;
    u64::try_from(number)
        .ok()
        .filter(|_| number >= min)
        .ok_or_else(|| LogOptionsError::TooSmall {
            param,
            value: value.to_owned(),
            min,
        })
}

/// One parsed line of a CRI log file.
#[derive(Debug, PartialEq, Eq)]
struct Line<'a> {
    /// The timestamp as written, for `timestamps` output.
    stamp: &'a [u8],
    time: Timestamp,
    partial: bool,
    content: &'a [u8],
}

/// Parses one line (without its newline); the error says what is wrong, for the log.
fn parse_line(line: &[u8]) -> Result<Line<'_>, &'static str> {
    let (stamp, rest) = split_field(line).ok_or("no stream after the timestamp")?;
    let time = std::str::from_utf8(stamp)
        .ok()
        .and_then(|s| s.parse::<Timestamp>().ok())
        .ok_or("the timestamp is not RFC 3339")?;
    let (stream, rest) = split_field(rest).ok_or("no tag after the stream")?;
    if stream != b"stdout" && stream != b"stderr" {
        return Err("the stream is neither stdout nor stderr");
    }
    // "<tag>" alone at the end of the line is an empty message.
    let (tags, content) = split_field(rest).unwrap_or((rest, b""));
    let partial = match tags.split(|b| *b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return Err("the tag is neither F nor P"),
    };
    Ok(Line {
        stamp,
        time,
        partial,
        content,
    })
}

fn split_field(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = bytes.iter().position(|b| *b == b' ')?;
    Some((&bytes[..space], &bytes[space + 1..]))
}

/// Whether the line starting with `header` ends a message (`F`), judged from its first bytes only.
fn ends_message(header: &[u8]) -> bool {
    let line = header.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut fields = line.splitn(4, |b| *b == b' ');
    let (Some(_), Some(stream), Some(tags)) = (fields.next(), fields.next(), fields.next()) else {
        return false;
    };
    (stream == b"stdout" || stream == b"stderr")
        && tags.split(|b| *b == b':').next() == Some(b"F".as_slice())
}

/// The offset where the last `lines` complete messages of the file begin, reading backwards
/// `chunk` bytes at a time so a big file costs only its tail. The cut is always just after the end
/// of a message, never inside a joined one.
async fn tail_start(file: &ReadFile, lines: u64, chunk: usize) -> io::Result<u64> {
    let len = file.identity().await?.len;
    // Counting down to the message before the tail: the tail starts right after it.
    let mut wanted = lines.saturating_add(1);
    let mut next_start = len;
    let mut end = len;
    let chunk = chunk.max(1) as u64;
    while end > 0 {
        let begin = end.saturating_sub(chunk);
        let buf = read_exact_at(file, begin, end - begin).await?;
        for i in (0..buf.len()).rev() {
            if buf[i] != b'\n' {
                continue;
            }
            let start = begin + i as u64 + 1;
            if start >= len {
                continue;
            }
            if starts_message_end(file, &buf, begin, start).await? {
                wanted -= 1;
                if wanted == 0 {
                    return Ok(next_start);
                }
            }
            next_start = start;
        }
        end = begin;
    }
    // The first line has no newline before it.
    if len > 0 && wanted == 1 && starts_message_end(file, &[], 0, 0).await? {
        return Ok(next_start);
    }
    Ok(0)
}

/// Whether the line at offset `start` ends a message; `buf` holds the file from offset `begin` and
/// is used when it covers the line's header.
async fn starts_message_end(
    file: &ReadFile,
    buf: &[u8],
    begin: u64,
    start: u64,
) -> io::Result<bool> {
    let offset = usize::try_from(start - begin).unwrap_or(usize::MAX);
    if offset.saturating_add(HEADER_MAX) <= buf.len() {
        return Ok(ends_message(&buf[offset..offset + HEADER_MAX]));
    }
    let header = file.read_at(start, HEADER_MAX).await?;
    Ok(ends_message(&header))
}

/// Exactly `len` bytes from `offset`, which the caller knows the file has.
async fn read_exact_at(file: &ReadFile, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let piece = file
            .read_at(offset + buf.len() as u64, len - buf.len())
            .await?;
        if piece.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while its tail was being read",
            ));
        }
        buf.extend_from_slice(&piece);
    }
    Ok(buf)
}

/// Streams a CRI log file as `kubectl logs` shows it. `still_running` is asked (at most once a
/// second, and only while following with nothing new to read) whether the container still runs;
/// once it says no, the rest of the file is read and the stream ends. Dropping the stream stops
/// everything, including the file watch. File reads go through `engine`; the stream must be polled
/// inside its [`block_on`](crate::io::block_on). The file is opened on the first poll: one that
/// cannot be opened gives one error item (see [`open_logs`] to learn that before answering).
pub fn read_logs<F, Fut>(
    path: PathBuf,
    options: LogOptions,
    engine: IoEngine,
    still_running: F,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    LogReader::new(path, options, engine, still_running).into_stream()
}

/// [`read_logs`], but the file is opened (and the tail found) first, so a missing or unreadable
/// log is an error the caller can answer with a status code instead of a broken body.
pub async fn open_logs<F, Fut>(
    path: PathBuf,
    options: LogOptions,
    engine: IoEngine,
    still_running: F,
) -> io::Result<impl Stream<Item = io::Result<Bytes>> + Send + 'static>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let mut reader = LogReader::new(path, options, engine, still_running);
    if let Err(error) = reader.open_first().await {
        return Err(reader.context(&error));
    }
    Ok(reader.into_stream())
}

/// The start of a message whose fragments (`P` lines) are being joined.
struct Pending {
    stamp: Vec<u8>,
    time: Timestamp,
    content: Vec<u8>,
}

/// The inotify watch on the log's directory: it sees appends, the new file after a rotation, and
/// writers closing files (the runtime done with a rotated file).
struct Watch {
    _watcher: notify::RecommendedWatcher,
    changed: Arc<Notify>,
    /// The latest files in the directory that a writer closed, oldest first.
    closed: Arc<Mutex<VecDeque<PathBuf>>>,
}

impl Watch {
    fn new(dir: &Path) -> notify::Result<Self> {
        let changed = Arc::new(Notify::new());
        let closed = Arc::new(Mutex::new(VecDeque::new()));
        let signal = Arc::clone(&changed);
        let record = Arc::clone(&closed);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else {
                    return;
                };
                if matches!(
                    event.kind,
                    notify::EventKind::Access(notify::event::AccessKind::Close(
                        notify::event::AccessMode::Write
                    ))
                ) {
                    let mut recent = record.lock().unwrap_or_else(PoisonError::into_inner);
                    for path in event.paths {
                        if recent.len() == CLOSES_KEPT {
                            recent.pop_front();
                        }
                        recent.push_back(path);
                    }
                }
                signal.notify_one();
            })?;
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(Self {
            _watcher: watcher,
            changed,
            closed,
        })
    }

    /// Whether a writer closed `path` since the watch began.
    fn was_closed(&self, path: &Path) -> bool {
        self.closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|closed| closed == path)
    }
}

/// A rotation noticed while following: the open file was renamed away and a new file is at the
/// path. The open file is read on until its writer is done with it.
struct Rotation {
    noticed: Instant,
    /// The open file's new name, when found: the watch tells when the runtime closes it.
    renamed_to: Option<PathBuf>,
}

struct LogReader<F> {
    path: PathBuf,
    options: LogOptions,
    still_running: F,
    engine: IoEngine,
    /// Bytes handed out so far, for `limit_bytes`.
    emitted: u64,
    file: Option<ReadFile>,
    /// Device and inode of the open file, to notice when the path names a new file.
    identity: (u64, u64),
    /// The file offset up to which the file has been read into `unsplit`.
    position: u64,
    /// Bytes read from the file and not yet split into lines.
    unsplit: Bytes,
    /// The raw line being read: an incomplete last line waits here for the rest.
    line: Vec<u8>,
    pending: Option<Pending>,
    watch: Option<Watch>,
    last_check: Instant,
    /// The path names a new file: finish the open one, then switch.
    rotation: Option<Rotation>,
    /// The container stopped: finish the file, then end.
    ending: bool,
    done: bool,
}

impl<F, Fut> LogReader<F>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    fn new(path: PathBuf, options: LogOptions, engine: IoEngine, still_running: F) -> Self {
        Self {
            emitted: 0,
            path,
            options,
            still_running,
            engine,
            file: None,
            identity: (0, 0),
            position: 0,
            unsplit: Bytes::new(),
            line: Vec::new(),
            pending: None,
            watch: None,
            last_check: Instant::now(),
            rotation: None,
            ending: false,
            done: false,
        }
    }

    fn into_stream(self) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
        futures::stream::unfold(self, |mut reader| async move {
            let item = reader.next_chunk().await?;
            Some((item, reader))
        })
    }

    /// The error with the file it concerns (I/O errors alone do not name it).
    fn context(&self, error: &io::Error) -> io::Error {
        io::Error::new(
            error.kind(),
            format!("reading container log {}: {error}", self.path.display()),
        )
    }

    async fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        if self.done {
            return None;
        }
        match self.fill().await {
            Ok(out) if out.is_empty() => {
                self.done = true;
                None
            }
            Ok(out) => {
                self.emitted += out.len() as u64;
                Some(Ok(out.freeze()))
            }
            Err(error) => {
                self.done = true;
                Some(Err(self.context(&error)))
            }
        }
    }

    /// The next piece of output; empty once the log is finished.
    async fn fill(&mut self) -> io::Result<BytesMut> {
        if self.file.is_none() {
            self.open_first().await?;
        }
        let mut out = BytesMut::new();
        loop {
            // Decided before reading: once the writer is done, this read takes its last lines.
            let switch = self.rotation_settled();
            let at_eof = self.read_available(&mut out).await?;
            if self.done || out.len() >= OUTPUT_CHUNK || (at_eof && !out.is_empty()) {
                return Ok(out);
            }
            if switch {
                self.finish_line(&mut out);
                self.open().await?;
                self.rotation = None;
                continue;
            }
            if !self.options.follow || self.ending {
                self.finish_line(&mut out);
                self.flush_pending(&mut out);
                self.apply_limit(&mut out);
                self.done = true;
                return Ok(out);
            }
            self.wait().await?;
        }
    }

    async fn open_first(&mut self) -> io::Result<()> {
        self.open().await?;
        if let (Some(lines), Some(file)) = (self.options.tail_lines, &self.file) {
            self.position = tail_start(file, lines, TAIL_CHUNK).await?;
        }
        if self.options.follow {
            let dir = self.path.parent().unwrap_or(Path::new("/"));
            match Watch::new(dir) {
                Ok(watch) => self.watch = Some(watch),
                Err(error) => tracing::debug!(
                    %error,
                    dir = %dir.display(),
                    "cannot watch the log directory; polling it instead"
                ),
            }
        }
        Ok(())
    }

    /// Whether the file renamed by a rotation is finished: its writer closed it, the container
    /// stopped, or the grace period is over.
    fn rotation_settled(&self) -> bool {
        let Some(rotation) = &self.rotation else {
            return false;
        };
        self.ending
            || rotation.noticed.elapsed() >= ROTATION_GRACE
            || rotation
                .renamed_to
                .as_deref()
                .zip(self.watch.as_ref())
                .is_some_and(|(path, watch)| watch.was_closed(path))
    }

    /// Opens the file at the path (again, after a rotation) and reads it from its start.
    async fn open(&mut self) -> io::Result<()> {
        let file = ReadFile::open(&self.path, self.engine).await?;
        let identity = file.identity().await?;
        self.identity = (identity.device, identity.inode);
        self.position = 0;
        self.unsplit.clear();
        self.file = Some(file);
        Ok(())
    }

    /// Reads whole lines into `out` until the end of the file, a full output chunk or the byte
    /// limit; returns whether it reached the end of the file.
    async fn read_available(&mut self, out: &mut BytesMut) -> io::Result<bool> {
        loop {
            if self.unsplit.is_empty() {
                let Some(file) = self.file.as_ref() else {
                    return Ok(true);
                };
                let read = file.read_at(self.position, READ_CHUNK).await?;
                if read.is_empty() {
                    // At the end; an incomplete line waits in `line` for the writer to finish it.
                    return Ok(true);
                }
                self.position += read.len() as u64;
                self.unsplit = read;
            }
            let budget = MAX_LINE.saturating_sub(self.line.len()).max(1);
            let window = self.unsplit.len().min(budget);
            let Some(newline) = self.unsplit[..window].iter().position(|b| *b == b'\n') else {
                self.line.extend_from_slice(&self.unsplit.split_to(window));
                if self.line.len() >= MAX_LINE {
                    tracing::warn!(path = %self.path.display(), "skipping an over-long log line");
                    self.line.clear();
                }
                continue;
            };
            self.line
                .extend_from_slice(&self.unsplit.split_to(newline + 1));
            let line = std::mem::take(&mut self.line);
            self.process(&line[..line.len() - 1], out);
            self.line = line;
            self.line.clear();
            if self.apply_limit(out) || out.len() >= OUTPUT_CHUNK {
                return Ok(false);
            }
        }
    }

    /// Treats an unterminated last line as complete (the file will not grow any more).
    fn finish_line(&mut self, out: &mut BytesMut) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process(&line, out);
        }
    }

    fn process(&mut self, raw: &[u8], out: &mut BytesMut) {
        let line = match parse_line(raw) {
            Ok(line) => line,
            Err(reason) => {
                tracing::debug!(path = %self.path.display(), reason, "skipping a malformed log line");
                return;
            }
        };
        let pending = match self.pending.take() {
            Some(mut pending) => {
                pending.content.extend_from_slice(line.content);
                pending
            }
            None => Pending {
                stamp: line.stamp.to_vec(),
                time: line.time,
                content: line.content.to_vec(),
            },
        };
        if !line.partial {
            self.emit(&pending, true, out);
        } else if pending.content.len() >= MAX_JOINED {
            self.emit(&pending, false, out);
        } else {
            self.pending = Some(pending);
        }
    }

    fn flush_pending(&mut self, out: &mut BytesMut) {
        if let Some(pending) = self.pending.take() {
            self.emit(&pending, false, out);
        }
    }

    fn emit(&self, message: &Pending, newline: bool, out: &mut BytesMut) {
        if self.options.since.is_some_and(|since| message.time < since) {
            return;
        }
        if self.options.timestamps {
            out.extend_from_slice(&message.stamp);
            out.extend_from_slice(b" ");
        }
        out.extend_from_slice(&message.content);
        if newline {
            out.extend_from_slice(b"\n");
        }
    }

    /// Cuts `out` (the output not yet handed out) at the byte limit; returns whether the limit is
    /// reached, which ends the log.
    fn apply_limit(&mut self, out: &mut BytesMut) -> bool {
        let Some(limit) = self.options.limit_bytes else {
            return false;
        };
        let allowed = limit.saturating_sub(self.emitted);
        if out.len() as u64 >= allowed {
            out.truncate(usize::try_from(allowed).unwrap_or(usize::MAX));
            self.done = true;
            return true;
        }
        false
    }

    /// Waits until there may be something new: a change in the directory or the poll period. Then
    /// notices rotation (a new file at the path), truncation, and the container stopping.
    async fn wait(&mut self) -> io::Result<()> {
        let period = if self.watch.is_some() {
            WATCHED_POLL_PERIOD
        } else {
            UNWATCHED_POLL_PERIOD
        };
        match &self.watch {
            Some(watch) => {
                tokio::select! {
                    () = watch.changed.notified() => {}
                    () = tokio::time::sleep(period) => {}
                }
            }
            None => tokio::time::sleep(period).await,
        }
        match identity_of(&self.path, self.engine).await {
            Ok(now) if (now.device, now.inode) != self.identity => {
                if self.rotation.is_none() {
                    self.rotation = Some(Rotation {
                        noticed: Instant::now(),
                        renamed_to: renamed_to(&self.path, self.identity, self.engine).await,
                    });
                }
            }
            Ok(now) => {
                // The open file is at the path again (a rotation undone because the runtime
                // refused to reopen): nothing to switch to.
                self.rotation = None;
                if now.len < self.position {
                    // Truncated in place: start over at its beginning.
                    self.position = 0;
                    self.unsplit.clear();
                    self.line.clear();
                }
            }
            // Renamed away and not yet re-created: keep reading the open file.
            Err(_) => {}
        }
        if self.last_check.elapsed() >= STATE_CHECK_PERIOD {
            self.last_check = Instant::now();
            if !(self.still_running)().await {
                self.ending = true;
            }
        }
        Ok(())
    }
}

/// The name the file with `identity` (device, inode) has now, looked for among `<log>.*` next to
/// `log`.
async fn renamed_to(log: &Path, identity: (u64, u64), engine: IoEngine) -> Option<PathBuf> {
    let dir = log.parent()?;
    let mut prefix = log.file_name()?.as_encoded_bytes().to_vec();
    prefix.push(b'.');
    let mut entries = tokio::fs::read_dir(dir).await.ok()?;
    while let Ok(Some(entry)) = entries.next_entry().await {
        if !entry.file_name().as_encoded_bytes().starts_with(&prefix) {
            continue;
        }
        let path = entry.path();
        if identity_of(&path, engine)
            .await
            .is_ok_and(|found| (found.device, found.inode) == identity)
        {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::StreamExt;

    use super::*;
    use crate::io::testing::on_both_engines;

    const T1: &str = "2026-11-22T10:00:01.000000001Z";
    const T2: &str = "2026-11-22T10:00:02.5Z";
    const T3: &str = "2026-11-22T11:00:03+01:00";

    fn now() -> Timestamp {
        "2026-11-22T10:00:10Z".parse().unwrap()
    }

    /// `count` full lines `line 0` … `line <count - 1>`.
    fn numbered(count: usize) -> String {
        let mut text = String::new();
        for i in 0..count {
            let _ = writeln!(text, "{T1} stdout F line {i}");
        }
        text
    }

    fn log_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn append(path: &Path, text: &str) {
        let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    async fn read_all(path: &Path, options: LogOptions, engine: IoEngine) -> String {
        let chunks: Vec<io::Result<Bytes>> =
            read_logs(path.to_owned(), options, engine, || async { true })
                .collect()
                .await;
        let mut text = Vec::new();
        for chunk in chunks {
            text.extend_from_slice(&chunk.unwrap());
        }
        String::from_utf8(text).unwrap()
    }

    async fn next_text<S: Stream<Item = io::Result<Bytes>> + Unpin>(stream: &mut S) -> String {
        String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap()
    }

    #[test]
    fn lines_parse_into_time_stream_tag_and_content() {
        let line = parse_line(b"2026-11-22T10:00:01.000000001Z stdout F hello world").unwrap();
        assert_eq!(line.stamp, b"2026-11-22T10:00:01.000000001Z");
        assert_eq!(line.time, T1.parse::<Timestamp>().unwrap());
        assert!(!line.partial);
        assert_eq!(line.content, b"hello world");
        let partial = parse_line(b"2026-11-22T10:00:01Z stderr P:x  spaced ").unwrap();
        assert!(partial.partial);
        assert_eq!(partial.content, b" spaced ");
        assert_eq!(
            parse_line(b"2026-11-22T10:00:01Z stdout F")
                .unwrap()
                .content,
            b""
        );
        for bad in [
            &b""[..],
            b"garbage",
            b"yesterday stdout F x",
            b"2026-11-22T10:00:01Z stdin F x",
            b"2026-11-22T10:00:01Z stdout X x",
            b"2026-11-22T10:00:01Z stdout",
        ] {
            assert!(parse_line(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn query_defaults_and_values() {
        assert_eq!(
            LogOptions::from_query(None, now()).unwrap(),
            LogOptions::default()
        );
        let options = LogOptions::from_query(
            Some("follow=true&previous=1&timestamps&tailLines=5&limitBytes=100&sinceSeconds=10&container=app"),
            now(),
        )
        .unwrap();
        assert_eq!(
            options,
            LogOptions {
                follow: true,
                previous: true,
                tail_lines: Some(5),
                limit_bytes: Some(100),
                timestamps: true,
                since: Some("2026-11-22T10:00:00Z".parse().unwrap()),
            }
        );
        let options = LogOptions::from_query(
            Some("sinceTime=2026-11-22T09%3A00%3A00Z&follow=false"),
            now(),
        )
        .unwrap();
        assert_eq!(options.since, Some("2026-11-22T09:00:00Z".parse().unwrap()));
        assert!(!options.follow);
        assert_eq!(
            LogOptions::from_query(Some("tailLines=0"), now())
                .unwrap()
                .tail_lines,
            Some(0)
        );
    }

    #[test]
    fn bad_query_values_name_the_parameter_and_value() {
        let cases = [
            (
                "tailLines=-1",
                "invalid value \"-1\" for query parameter tailLines: must be at least 0",
            ),
            (
                "limitBytes=0",
                "invalid value \"0\" for query parameter limitBytes: must be at least 1",
            ),
            (
                "limitBytes=ten",
                "invalid value \"ten\" for query parameter limitBytes: expected an integer",
            ),
            (
                "sinceSeconds=-5",
                "invalid value \"-5\" for query parameter sinceSeconds: must be at least 1",
            ),
            (
                "follow=yes",
                "invalid value \"yes\" for query parameter follow: expected true or false",
            ),
            (
                "sinceTime=yesterday",
                "invalid value \"yesterday\" for query parameter sinceTime: expected an RFC 3339 time",
            ),
            (
                "sinceSeconds=5&sinceTime=2026-11-22T09:00:00Z",
                "at most one of the query parameters sinceSeconds and sinceTime may be given",
            ),
        ];
        for (query, message) in cases {
            let err = LogOptions::from_query(Some(query), now()).unwrap_err();
            assert_eq!(err.to_string(), message, "{query}");
        }
    }

    async fn partial_lines_are_joined_and_malformed_lines_skipped(engine: IoEngine) {
        let (_dir, path) = log_file(&format!(
            "{T1} stdout P hel\n{T1} stdout P lo \nnot a log line\n{T2} stderr F world\n{T3} stdout F next\n"
        ));
        assert_eq!(
            read_all(&path, LogOptions::default(), engine).await,
            "hello world\nnext\n"
        );
    }

    async fn timestamps_prefix_each_joined_line_with_its_first_fragments_time(engine: IoEngine) {
        let (_dir, path) = log_file(&format!(
            "{T1} stdout P a\n{T2} stdout F b\n{T3} stdout F c\n"
        ));
        let options = LogOptions {
            timestamps: true,
            ..LogOptions::default()
        };
        assert_eq!(
            read_all(&path, options, engine).await,
            format!("{T1} ab\n{T3} c\n")
        );
    }

    async fn since_skips_older_lines(engine: IoEngine) {
        let (_dir, path) = log_file(&format!(
            "{T1} stdout F one\n{T2} stdout F two\n{T3} stdout F three\n"
        ));
        let options = LogOptions {
            since: Some("2026-11-22T10:00:02Z".parse().unwrap()),
            ..LogOptions::default()
        };
        assert_eq!(read_all(&path, options, engine).await, "two\nthree\n");
    }

    async fn limit_bytes_stops_exactly_at_the_limit(engine: IoEngine) {
        let text = numbered(5000);
        let (_dir, path) = log_file(&text);
        let full = read_all(&path, LogOptions::default(), engine).await;
        // Across output chunks, and inside a line.
        for limit in [1, 7, 40_000, 40_001] {
            let options = LogOptions {
                limit_bytes: Some(limit),
                ..LogOptions::default()
            };
            let out = read_all(&path, options, engine).await;
            assert_eq!(out.len() as u64, limit);
            assert!(full.starts_with(&out));
        }
    }

    async fn an_unterminated_last_line_is_shown_when_not_following(engine: IoEngine) {
        let (_dir, path) = log_file(&format!("{T1} stdout F one\n{T2} stdout F two"));
        assert_eq!(
            read_all(&path, LogOptions::default(), engine).await,
            "one\ntwo\n"
        );
    }

    async fn tail_reads_backwards_in_chunks_and_never_splits_a_joined_line(engine: IoEngine) {
        let mut text = numbered(300);
        let _ = write!(
            text,
            "{T1} stdout P first half, \n{T1} stdout F second half\ngarbage\n{T1} stdout F last\n"
        );
        let (_dir, path) = log_file(&text);
        assert!(text.len() > 64 * 10, "the file spans many chunks");
        let file = ReadFile::open(&path, engine).await.unwrap();
        for chunk in [1, 7, 64, TAIL_CHUNK] {
            let start = tail_start(&file, 2, chunk).await.unwrap();
            assert_eq!(
                &text[usize::try_from(start).unwrap()..],
                format!(
                    "{T1} stdout P first half, \n{T1} stdout F second half\ngarbage\n{T1} stdout F last\n"
                ),
                "{engine}, chunk {chunk}"
            );
            let start = tail_start(&file, 0, chunk).await.unwrap();
            assert_eq!(start, text.len() as u64);
            assert_eq!(tail_start(&file, 10_000, chunk).await.unwrap(), 0);
            assert_eq!(tail_start(&file, 302, chunk).await.unwrap(), 0);
            let start = tail_start(&file, 301, chunk).await.unwrap();
            assert!(
                text[usize::try_from(start).unwrap()..]
                    .starts_with(&format!("{T1} stdout F line 1\n"))
            );
        }
    }

    async fn tail_of_a_file_bigger_than_a_read_chunk(engine: IoEngine) {
        let text = numbered(20_000);
        assert!(text.len() > 4 * TAIL_CHUNK);
        let (_dir, path) = log_file(&text);
        let options = LogOptions {
            tail_lines: Some(3),
            ..LogOptions::default()
        };
        assert_eq!(
            read_all(&path, options, engine).await,
            "line 19997\nline 19998\nline 19999\n"
        );
        let options = LogOptions {
            tail_lines: Some(0),
            ..LogOptions::default()
        };
        assert_eq!(read_all(&path, options, engine).await, "");
    }

    async fn a_missing_file_is_one_error_naming_it(engine: IoEngine) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let mut stream = Box::pin(read_logs(path, LogOptions::default(), engine, || async {
            true
        }));
        let err = stream.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("0.log"), "{err}");
        assert!(stream.next().await.is_none());
    }

    async fn open_logs_reports_a_missing_file_before_streaming(engine: IoEngine) {
        let dir = tempfile::tempdir().unwrap();
        let missing = open_logs(
            dir.path().join("0.log"),
            LogOptions::default(),
            engine,
            || async { true },
        )
        .await;
        let Err(err) = missing else {
            panic!("a missing log cannot be opened");
        };
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("0.log"), "{err}");

        let (_dir, path) = log_file(&format!("{T1} stdout F one\n{T2} stdout F two\n"));
        let options = LogOptions {
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        let stream = open_logs(path, options, engine, || async { true })
            .await
            .unwrap();
        let chunks: Vec<_> = stream.collect().await;
        assert_eq!(chunks.len(), 1);
        assert_eq!(&chunks[0].as_ref().unwrap()[..], b"two\n");
    }

    fn follow_options() -> LogOptions {
        LogOptions {
            follow: true,
            ..LogOptions::default()
        }
    }

    /// A liveness predicate the test flips.
    fn alive_flag() -> (
        Arc<AtomicBool>,
        impl FnMut() -> futures::future::Ready<bool> + Send + 'static,
    ) {
        let alive = Arc::new(AtomicBool::new(true));
        let check = Arc::clone(&alive);
        (alive, move || {
            futures::future::ready(check.load(Ordering::SeqCst))
        })
    }

    async fn follow_reads_appends_across_rotation_until_the_container_stops(engine: IoEngine) {
        let (dir, path) = log_file(&format!("{T1} stdout F one\n"));
        let (alive, still_running) = alive_flag();
        let mut stream = Box::pin(read_logs(
            path.clone(),
            follow_options(),
            engine,
            still_running,
        ));
        assert_eq!(next_text(&mut stream).await, "one\n");

        append(&path, &format!("{T1} stdout P tw"));
        append(&path, &format!("o\n{T2} stdout F !\n"));
        assert_eq!(next_text(&mut stream).await, "two!\n");

        // What the runtime writes just before rotating is still read from the old file.
        append(&path, &format!("{T2} stdout F before rotation\n"));
        std::fs::rename(&path, dir.path().join("0.log.20261122-100003")).unwrap();
        std::fs::write(&path, format!("{T3} stdout F after rotation\n")).unwrap();
        assert_eq!(next_text(&mut stream).await, "before rotation\n");
        assert_eq!(next_text(&mut stream).await, "after rotation\n");

        append(&path, &format!("{T3} stdout F last words\n"));
        alive.store(false, Ordering::SeqCst);
        let mut rest = String::new();
        while let Some(chunk) = stream.next().await {
            rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        assert_eq!(
            rest, "last words\n",
            "the stream drains the file, then ends"
        );
    }

    async fn follow_reads_a_rotated_file_until_its_writer_closes_it(engine: IoEngine) {
        let (dir, path) = log_file(&format!("{T1} stdout F one\n"));
        let (_alive, still_running) = alive_flag();
        let mut stream = Box::pin(read_logs(
            path.clone(),
            follow_options(),
            engine,
            still_running,
        ));
        assert_eq!(next_text(&mut stream).await, "one\n");

        // The runtime's writer stays open across the rotation, as containerd's does until it has
        // written what it still held for the old file.
        let mut writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::fs::rename(&path, dir.path().join("0.log.20261122-100003")).unwrap();
        std::fs::write(&path, format!("{T3} stdout F after rotation\n")).unwrap();
        let early = tokio::time::timeout(ROTATION_GRACE * 3 / 4, stream.next()).await;
        assert!(
            early.is_err(),
            "the new file waits while the old one is still written: {early:?}"
        );
        writer
            .write_all(format!("{T2} stdout F late line\n").as_bytes())
            .unwrap();
        drop(writer);
        assert_eq!(next_text(&mut stream).await, "late line\n");
        assert_eq!(next_text(&mut stream).await, "after rotation\n");
    }

    async fn follow_stays_with_a_file_whose_rotation_was_undone(engine: IoEngine) {
        let (dir, path) = log_file(&format!("{T1} stdout F one\n"));
        let (_alive, still_running) = alive_flag();
        let mut stream = Box::pin(read_logs(
            path.clone(),
            follow_options(),
            engine,
            still_running,
        ));
        assert_eq!(next_text(&mut stream).await, "one\n");
        let rotated = dir.path().join("0.log.20261122-100003");
        std::fs::rename(&path, &rotated).unwrap();
        std::fs::write(&path, format!("{T3} stdout F never kept\n")).unwrap();
        let early = tokio::time::timeout(ROTATION_GRACE * 3 / 4, stream.next()).await;
        assert!(early.is_err(), "{early:?}");
        // The rotation is undone: the old file gets its name back, replacing the new one.
        std::fs::rename(&rotated, &path).unwrap();
        let waited = tokio::time::timeout(ROTATION_GRACE * 2, stream.next()).await;
        assert!(waited.is_err(), "nothing is read again: {waited:?}");
        append(&path, &format!("{T3} stdout F two\n"));
        assert_eq!(next_text(&mut stream).await, "two\n");
    }

    async fn follow_ends_when_the_container_stops_even_without_new_output(engine: IoEngine) {
        let (_dir, path) = log_file(&format!("{T1} stdout P unfinished\n"));
        let (alive, still_running) = alive_flag();
        let mut stream = Box::pin(read_logs(path, follow_options(), engine, still_running));
        let waiting = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
        assert!(waiting.is_err(), "nothing to show while the container runs");
        alive.store(false, Ordering::SeqCst);
        assert_eq!(
            next_text(&mut stream).await,
            "unfinished",
            "a pending fragment is shown once the container stops"
        );
        assert!(stream.next().await.is_none());
    }

    async fn follow_stops_at_the_byte_limit(engine: IoEngine) {
        let (_dir, path) = log_file(&format!("{T1} stdout F 12345\n"));
        let (_alive, still_running) = alive_flag();
        let options = LogOptions {
            limit_bytes: Some(9),
            ..follow_options()
        };
        let mut stream = Box::pin(read_logs(path.clone(), options, engine, still_running));
        assert_eq!(next_text(&mut stream).await, "12345\n");
        append(&path, &format!("{T1} stdout F abcdef\n"));
        assert_eq!(next_text(&mut stream).await, "abc");
        assert!(stream.next().await.is_none());
    }

    on_both_engines! {
        Real: [
            partial_lines_are_joined_and_malformed_lines_skipped,
            timestamps_prefix_each_joined_line_with_its_first_fragments_time,
            since_skips_older_lines,
            limit_bytes_stops_exactly_at_the_limit,
            an_unterminated_last_line_is_shown_when_not_following,
            tail_of_a_file_bigger_than_a_read_chunk,
            a_missing_file_is_one_error_naming_it,
            open_logs_reports_a_missing_file_before_streaming,
            tail_reads_backwards_in_chunks_and_never_splits_a_joined_line,
        ],
        Paused: [
            follow_reads_appends_across_rotation_until_the_container_stops,
            follow_reads_a_rotated_file_until_its_writer_closes_it,
            follow_stays_with_a_file_whose_rotation_was_undone,
            follow_ends_when_the_container_stops_even_without_new_output,
            follow_stops_at_the_byte_limit,
        ],
    }
}
