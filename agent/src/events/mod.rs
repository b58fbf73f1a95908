//! The agent's event recorder (the kubelet's `record.EventRecorder`, client-go `tools/record`):
//! every event is logged, kept in a bounded in-memory ring for the HTTP API, appended as a JSON
//! line to `<root-dir>/events.log` (so standalone mode, without an API server, keeps a record),
//! and, once [`Recorder::connect`] has run, sent to the API server as a core/v1 Event, aggregated,
//! deduplicated and rate-limited like client-go's recorder (`correlator`, `sink`), so a crash
//! loop cannot flood the API server.
//!
//! Exported for the agent's wiring:
//! - [`Recorder::new`]`(log_path)` makes the recorder; clone it for every component.
//! - [`Recorder::connect`]`(&self, client, node_name, qps, burst)` starts the API sink on the
//!   current tokio runtime (call it once, inside the runtime, when the API client exists; pass the
//!   kubelet configuration's `eventRecordQPS` and `eventBurst`). Events recorded before it are
//!   logged only.
//! - [`Recorder::event`]`(type, object, reason, message)` never waits for the API server: it hands
//!   API events to the sink through a channel of [`QUEUE_CAPACITY`] and drops them (counted, see
//!   [`Recorder::dropped_events`]) when the sink is that far behind. It does not wait for the disk
//!   either: `events.log` is written by a thread of its own and rotated by size (`log_file`).
//! - [`Recorder::flush_log`] waits until every event recorded so far is in `events.log` (at
//!   shutdown; it blocks the calling thread).
//! - [`EventObject`] says what an event is about: [`EventObject::pod`],
//!   [`EventObject::container`] (fieldPath `spec.containers{name}`), [`EventObject::node`], or
//!   [`EventObject::local`] for things that are no API object (manifest files and URLs), which
//!   are never sent.

mod correlator;
mod log_file;
mod object;
mod sink;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::mpsc;

pub use log_file::{EVENT_LOG_MAX_BYTES, EVENT_LOG_MAX_FILES, LogRotation};
pub use object::{EventObject, InvolvedObject};

use log_file::EventLog;

use crate::apiserver::ApiClient;
use sink::{ApiWriter, EventWriter, Pending, RequestLimiter, Sink};

/// How many events the in-memory ring keeps.
const RING_CAPACITY: usize = 1024;
/// How many events wait for the API sink before new ones are dropped (client-go's
/// `maxQueuedEvents`).
pub const QUEUE_CAPACITY: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("starting the event sink: not inside a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    #[error("starting the event sink: the recorder is already connected to an API server")]
    AlreadyConnected,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The type as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// One recorded event, in the shape of a `v1.Event`'s essentials.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Unix milliseconds.
    pub time_ms: u128,
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// What the event is about ([`EventObject`]'s display), e.g. `pod/default/web-node1` or
    /// `file//etc/kubernetes/manifests/x.yaml`.
    pub object: String,
    pub reason: String,
    pub message: String,
}

struct Inner {
    ring: Mutex<VecDeque<Event>>,
    log: Option<EventLog>,
    /// The sink's queue, once connected.
    queue: OnceLock<mpsc::Sender<Pending>>,
    /// Events the full queue turned away, in all.
    dropped: AtomicU64,
    /// Events turned away since the queue last accepted one: the first opens a warning, the next
    /// accepted event closes it with the count.
    dropping: AtomicU64,
}

/// Cloneable handle to the event recorder.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl Recorder {
    /// A recorder that also appends to `log_path` when given, rotated at the default size
    /// ([`EVENT_LOG_MAX_BYTES`], [`EVENT_LOG_MAX_FILES`]).
    pub fn new(log_path: Option<PathBuf>) -> Self {
        Self::with_log_rotation(log_path, LogRotation::default())
    }

    /// A recorder that also appends to `log_path` when given, rotated as `rotation` says. When the
    /// writer thread cannot start, the recorder runs without the file (logged).
    pub fn with_log_rotation(log_path: Option<PathBuf>, rotation: LogRotation) -> Self {
        let log = log_path.and_then(|path| match EventLog::start(path.clone(), rotation) {
            Ok(log) => Some(log),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error,
                    "cannot start the event log writer; events are not written to the file");
                None
            }
        });
        Self {
            inner: Arc::new(Inner {
                ring: Mutex::new(VecDeque::with_capacity(RING_CAPACITY)),
                log,
                queue: OnceLock::new(),
                dropped: AtomicU64::new(0),
                dropping: AtomicU64::new(0),
            }),
        }
    }

    /// Starts sending events about API objects to the API server as node `node_name` (the source
    /// host and reporting instance), at most `qps` requests per second with bursts of `burst`
    /// (`eventRecordQPS`, 0 for no limit, and `eventBurst`). Spawns the sink task on the current
    /// tokio runtime; it lives as long as the runtime and the recorder's clones.
    pub fn connect(
        &self,
        client: ApiClient,
        node_name: &str,
        qps: u32,
        burst: u32,
    ) -> Result<(), EventsError> {
        self.start_sink(
            ApiWriter::new(client),
            node_name,
            RequestLimiter::new(qps, burst),
        )
    }

    fn start_sink<W>(
        &self,
        writer: W,
        node_name: &str,
        limiter: RequestLimiter,
    ) -> Result<(), EventsError>
    where
        W: EventWriter + Send + Sync + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().map_err(EventsError::NoRuntime)?;
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        self.inner
            .queue
            .set(queue)
            .map_err(|_| EventsError::AlreadyConnected)?;
        let sink = Sink::new(writer, node_name.to_owned(), limiter);
        runtime.spawn(sink.run(receiver));
        Ok(())
    }

    /// Records an event about `object`. Never waits for the API server.
    pub fn event(
        &self,
        event_type: EventType,
        object: EventObject,
        reason: &str,
        message: impl Into<String>,
    ) {
        let now = Timestamp::now();
        let event = Event {
            time_ms: u128::try_from(now.as_millisecond()).unwrap_or_default(),
            event_type,
            object: object.to_string(),
            reason: reason.to_owned(),
            message: message.into(),
        };
        match event_type {
            EventType::Normal => {
                tracing::info!(object = %event.object, reason, "{}", event.message);
            }
            EventType::Warning => {
                tracing::warn!(object = %event.object, reason, "{}", event.message);
            }
        }
        if let Some(log) = &self.inner.log {
            match serde_json::to_string(&event) {
                Ok(line) => log.append(line),
                Err(error) => tracing::warn!(%error, "cannot encode an event for the event log"),
            }
        }
        if let (EventObject::Api(involved), Some(queue)) = (object, self.inner.queue.get()) {
            self.enqueue(
                queue,
                Pending {
                    object: involved,
                    event_type,
                    reason: event.reason.clone(),
                    message: event.message.clone(),
                    time: now,
                },
            );
        }
        let mut ring = self
            .inner
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if ring.len() == RING_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    fn enqueue(&self, queue: &mpsc::Sender<Pending>, pending: Pending) {
        match queue.try_send(pending) {
            Ok(()) => {
                let dropped = self.inner.dropping.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    tracing::warn!(
                        dropped,
                        "the event queue to the API server accepts events again after dropping \
                         {dropped}"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Full(pending)) => {
                let total = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if self.inner.dropping.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        dropped_total = total,
                        reason = pending.reason,
                        "too many queued events ({QUEUE_CAPACITY}), dropping events for the API \
                         server until the queue drains"
                    );
                }
            }
            // The sink ended with the runtime: the agent is shutting down.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// The most recent events, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        let ring = self
            .inner
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.iter().cloned().collect()
    }

    /// Waits until every event recorded so far is written to `events.log`. Blocks the calling
    /// thread (call it at shutdown, or from `spawn_blocking`).
    pub fn flush_log(&self) {
        if let Some(log) = &self.inner.log {
            log.flush();
        }
    }

    /// How many events the full queue to the API server has turned away since the start.
    pub fn dropped_events(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::sink::scripted::ScriptedWriter;
    use super::*;

    fn pod_object(name: &str) -> EventObject {
        EventObject::Api(InvolvedObject {
            kind: "Pod".to_owned(),
            api_version: "v1".to_owned(),
            namespace: "default".to_owned(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            ..InvolvedObject::default()
        })
    }

    #[test]
    fn events_are_kept_in_order_and_appended_to_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let recorder = Recorder::new(Some(path.clone()));
        recorder.event(
            EventType::Warning,
            EventObject::local("file//x.yaml"),
            "FailedToParse",
            "bad yaml",
        );
        recorder.event(EventType::Normal, pod_object("a"), "Started", "ok");
        recorder.flush_log();
        let recent = recorder.recent();
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0].reason, "FailedToParse");
        assert_eq!(recent[0].object, "file//x.yaml");
        assert_eq!(recent[1].object, "pod/default/a");
        let text = std::fs::read_to_string(path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let mut keys: Vec<&String> = lines[1].as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["message", "object", "reason", "time_ms", "type"]);
        assert_eq!(lines[1]["object"], "pod/default/a");
        assert_eq!(lines[1]["type"], "Normal");
    }

    #[test]
    fn the_event_log_file_is_rotated_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let rotation = LogRotation {
            max_bytes: 1024,
            max_files: 2,
        };
        let recorder = Recorder::with_log_rotation(Some(path.clone()), rotation);
        for i in 0..100 {
            recorder.event(
                EventType::Normal,
                pod_object("a"),
                "Started",
                format!("n{i}"),
            );
        }
        recorder.flush_log();
        assert!(std::fs::metadata(&path).unwrap().len() <= rotation.max_bytes);
        let previous = log_file::rotated(&path, 1);
        assert!(std::fs::metadata(&previous).unwrap().len() <= rotation.max_bytes);
        assert!(!log_file::rotated(&path, 2).exists());
        let last = std::fs::read_to_string(&path).unwrap();
        let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert_eq!(last["message"], "n99");
    }

    #[test]
    fn the_ring_is_bounded() {
        let recorder = Recorder::new(None);
        for i in 0..RING_CAPACITY + 5 {
            recorder.event(EventType::Normal, pod_object("b"), "R", i.to_string());
        }
        let recent = recorder.recent();
        assert_eq!(recent.len(), RING_CAPACITY);
        assert_eq!(recent[0].message, "5");
    }

    #[test]
    fn the_sink_needs_a_runtime() {
        let recorder = Recorder::new(None);
        let started =
            recorder.start_sink(ScriptedWriter::default(), "n1", RequestLimiter::new(0, 0));
        assert!(
            matches!(started, Err(EventsError::NoRuntime(_))),
            "{started:?}"
        );
    }

    #[tokio::test]
    async fn api_events_reach_the_sink_and_local_ones_do_not() {
        let recorder = Recorder::new(None);
        recorder.event(EventType::Normal, pod_object("early"), "Started", "before");
        let writer = ScriptedWriter::default();
        recorder
            .start_sink(writer.clone(), "n1", RequestLimiter::new(0, 0))
            .unwrap();
        let again = recorder.start_sink(writer.clone(), "n1", RequestLimiter::new(0, 0));
        assert!(matches!(again, Err(EventsError::AlreadyConnected)));

        recorder.event(
            EventType::Warning,
            EventObject::local("file//m/x.yaml"),
            "FailedToParse",
            "bad",
        );
        recorder.event(EventType::Normal, pod_object("web"), "Started", "ok");
        let stored = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let stored = writer.stored();
                if !stored.is_empty() {
                    return stored;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        // Neither the event from before the connection nor the local one was sent.
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].involved_object.name.as_deref(), Some("web"));
        assert_eq!(stored[0].reason.as_deref(), Some("Started"));
        assert_eq!(recorder.recent().len(), 3);
    }

    #[tokio::test]
    async fn a_full_queue_drops_events_and_counts_them() {
        let recorder = Recorder::new(None);
        let writer = ScriptedWriter::default();
        recorder
            .start_sink(writer.clone(), "n1", RequestLimiter::new(0, 0))
            .unwrap();
        // The sink task cannot run before this test yields, so the queue only fills.
        for i in 0..QUEUE_CAPACITY + 5 {
            recorder.event(EventType::Warning, pod_object(&format!("p{i}")), "R", "m");
        }
        assert_eq!(recorder.dropped_events(), 5);
        assert_eq!(recorder.recent().len(), QUEUE_CAPACITY + 5);
        for _ in 0..3 {
            recorder.event(EventType::Normal, EventObject::local("file//x"), "R", "m");
        }
        assert_eq!(recorder.dropped_events(), 5);
    }
}
