//! Reading CRI-format container log files (the kubelet's `pkg/kubelet/kuberuntime/logs`): each line of
//! the file is `<RFC 3339 timestamp> <stdout|stderr> <F|P>[:<more tags>] <content>`, where `P` marks a
//! fragment of a longer line that the runtime split and the next lines continue. [`read_logs`] turns
//! such a file into what `kubectl logs` shows: the contents, optionally timestamped, limited by
//! `tailLines` / `sinceSeconds` / `sinceTime` / `limitBytes`, and with `follow` kept open across
//! appends and log rotation until the container stops or the client goes away.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::num::ParseIntError;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use jiff::{SignedDuration, Timestamp};
use notify::Watcher;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, BufReader};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Bytes read per step when searching backwards for the start of the tail.
const TAIL_CHUNK: usize = 64 * 1024;
/// How much of a line is enough to see its timestamp, stream and tag.
const HEADER_MAX: usize = 96;
/// Output is handed to the client in pieces of about this size.
const OUTPUT_CHUNK: usize = 32 * 1024;
/// A raw line longer than this is dropped: runtimes split long lines (containerd at 16 KiB), so
/// only a corrupt file has one, and it must not grow memory without bound.
const MAX_LINE: u64 = 1024 * 1024;
/// A joined (`P` … `F`) message longer than this is handed out unfinished, for the same reason.
const MAX_JOINED: usize = 1024 * 1024;
/// While following with inotify: re-read at least this often anyway, in case an event was missed.
const WATCHED_POLL_PERIOD: Duration = Duration::from_secs(1);
/// While following without inotify (watch setup failed): how often to look for new data.
const UNWATCHED_POLL_PERIOD: Duration = Duration::from_millis(250);
/// While following: how often at most to ask whether the container still runs.
const STATE_CHECK_PERIOD: Duration = Duration::from_secs(1);

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
fn tail_start(file: &std::fs::File, lines: u64, chunk: usize) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let header_at = |buf: &[u8], begin: u64, start: u64| -> io::Result<bool> {
        let offset = usize::try_from(start - begin).unwrap_or(usize::MAX);
        if offset.saturating_add(HEADER_MAX) <= buf.len() {
            return Ok(ends_message(&buf[offset..offset + HEADER_MAX]));
        }
        let mut header = [0u8; HEADER_MAX];
        let n = file.read_at(&mut header, start)?;
        Ok(ends_message(&header[..n]))
    };
    // Counting down to the message before the tail: the tail starts right after it.
    let mut wanted = lines.saturating_add(1);
    let mut next_start = len;
    let mut end = len;
    let mut buf = vec![0u8; chunk.max(1)];
    while end > 0 {
        let begin = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - begin).unwrap_or(buf.len());
        file.read_exact_at(&mut buf[..n], begin)?;
        for i in (0..n).rev() {
            if buf[i] != b'\n' {
                continue;
            }
            let start = begin + i as u64 + 1;
            if start >= len {
                continue;
            }
            if header_at(&buf[..n], begin, start)? {
                wanted -= 1;
                if wanted == 0 {
                    return Ok(next_start);
                }
            }
            next_start = start;
        }
        end = begin;
    }
    if len > 0 && header_at(&buf[..0], 0, 0)? && wanted == 1 {
        return Ok(next_start);
    }
    Ok(0)
}

/// Streams a CRI log file as `kubectl logs` shows it. `still_running` is asked (at most once a
/// second, and only while following with nothing new to read) whether the container still runs;
/// once it says no, the rest of the file is read and the stream ends. Dropping the stream stops
/// everything, including the file watch. File reads go through tokio's blocking pool. A file
/// that cannot be opened gives one error item.
pub fn read_logs<F, Fut>(
    path: PathBuf,
    options: LogOptions,
    still_running: F,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let reader = LogReader {
        emitted: 0,
        path,
        options,
        still_running,
        file: None,
        identity: (0, 0),
        position: 0,
        line: Vec::new(),
        pending: None,
        watch: None,
        last_check: Instant::now(),
        rotated: false,
        ending: false,
        done: false,
    };
    futures::stream::unfold(reader, |mut reader| async move {
        let item = reader.next_chunk().await?;
        Some((item, reader))
    })
}

/// The start of a message whose fragments (`P` lines) are being joined.
struct Pending {
    stamp: Vec<u8>,
    time: Timestamp,
    content: Vec<u8>,
}

/// The inotify watch on the log's directory: it sees appends, and the new file after a rotation.
struct Watch {
    _watcher: notify::RecommendedWatcher,
    changed: Arc<Notify>,
}

impl Watch {
    fn new(dir: &Path) -> notify::Result<Self> {
        let changed = Arc::new(Notify::new());
        let signal = Arc::clone(&changed);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    signal.notify_one();
                }
            })?;
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(Self {
            _watcher: watcher,
            changed,
        })
    }
}

struct LogReader<F> {
    path: PathBuf,
    options: LogOptions,
    still_running: F,
    /// Bytes handed out so far, for `limit_bytes`.
    emitted: u64,
    file: Option<BufReader<tokio::fs::File>>,
    /// Device and inode of the open file, to notice when the path names a new file.
    identity: (u64, u64),
    position: u64,
    /// The raw line being read: an incomplete last line waits here for the rest.
    line: Vec<u8>,
    pending: Option<Pending>,
    watch: Option<Watch>,
    last_check: Instant,
    /// The path names a new file: finish the open one, then switch.
    rotated: bool,
    /// The container stopped: finish the file, then end.
    ending: bool,
    done: bool,
}

impl<F, Fut> LogReader<F>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
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
                Some(Err(io::Error::new(
                    error.kind(),
                    format!("reading container log {}: {error}", self.path.display()),
                )))
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
            let at_eof = self.read_available(&mut out).await?;
            if self.done || out.len() >= OUTPUT_CHUNK || (at_eof && !out.is_empty()) {
                return Ok(out);
            }
            if self.rotated {
                self.finish_line(&mut out);
                self.open(0).await?;
                self.rotated = false;
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
        let start = match self.options.tail_lines {
            Some(lines) => {
                let path = self.path.clone();
                tokio::task::spawn_blocking(move || {
                    tail_start(&std::fs::File::open(path)?, lines, TAIL_CHUNK)
                })
                .await
                .map_err(io::Error::other)??
            }
            None => 0,
        };
        self.open(start).await?;
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

    async fn open(&mut self, start: u64) -> io::Result<()> {
        let mut file = tokio::fs::File::open(&self.path).await?;
        let meta = file.metadata().await?;
        self.identity = (meta.dev(), meta.ino());
        file.seek(SeekFrom::Start(start)).await?;
        self.position = start;
        self.file = Some(BufReader::new(file));
        Ok(())
    }

    /// Reads whole lines into `out` until the end of the file, a full output chunk or the byte
    /// limit; returns whether it reached the end of the file.
    async fn read_available(&mut self, out: &mut BytesMut) -> io::Result<bool> {
        loop {
            let budget = MAX_LINE.saturating_sub(self.line.len() as u64).max(1);
            let Some(file) = self.file.as_mut() else {
                return Ok(true);
            };
            let n = file.take(budget).read_until(b'\n', &mut self.line).await?;
            self.position += n as u64;
            if n == 0 {
                return Ok(true);
            }
            if self.line.last() != Some(&b'\n') {
                if self.line.len() as u64 >= MAX_LINE {
                    tracing::warn!(path = %self.path.display(), "skipping an over-long log line");
                    self.line.clear();
                    continue;
                }
                // The writer is mid-line: the rest comes with a later read.
                return Ok(true);
            }
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
        match tokio::fs::metadata(&self.path).await {
            Ok(meta) if (meta.dev(), meta.ino()) != self.identity => self.rotated = true,
            Ok(meta) if meta.len() < self.position => {
                // Truncated in place: start over at its beginning.
                if let Some(file) = self.file.as_mut() {
                    file.seek(SeekFrom::Start(0)).await?;
                }
                self.position = 0;
                self.line.clear();
            }
            // Renamed away and not yet re-created, or unchanged: keep reading the open file.
            Ok(_) | Err(_) => {}
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
