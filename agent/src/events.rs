//! The agent's event log (the kubelet's `record.EventRecorder` without an API server): every event is
//! logged, kept in a bounded in-memory ring for the HTTP API, and appended as a JSON line to
//! `<root-dir>/events.log` so operators and tests can read what happened.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// How many events the in-memory ring keeps.
const RING_CAPACITY: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// One recorded event, in the shape of a `v1.Event`'s essentials.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Unix milliseconds.
    pub time_ms: u128,
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// What the event is about, e.g. `pod/default/web-node1` or `file//etc/kubernetes/manifests/x.yaml`.
    pub object: String,
    pub reason: String,
    pub message: String,
}

struct Inner {
    ring: Mutex<VecDeque<Event>>,
    log_path: Option<PathBuf>,
}

/// Cloneable handle to the event log.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl Recorder {
    /// A recorder that also appends to `log_path` when given.
    pub fn new(log_path: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                ring: Mutex::new(VecDeque::with_capacity(RING_CAPACITY)),
                log_path,
            }),
        }
    }

    /// Records an event about `object`.
    pub fn event(
        &self,
        event_type: EventType,
        object: impl Into<String>,
        reason: &str,
        message: impl Into<String>,
    ) {
        let event = Event {
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
            event_type,
            object: object.into(),
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
        if let Some(path) = &self.inner.log_path {
            let appended = serde_json::to_string(&event)
                .map_err(std::io::Error::from)
                .and_then(|line| {
                    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
                    writeln!(file, "{line}")
                });
            if let Err(err) = appended {
                tracing::warn!(path = %path.display(), %err, "cannot append to the event log");
            }
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

    /// The most recent events, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        let ring = self
            .inner
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_in_order_and_appended_to_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let recorder = Recorder::new(Some(path.clone()));
        recorder.event(
            EventType::Warning,
            "file//x.yaml",
            "FailedToParse",
            "bad yaml",
        );
        recorder.event(EventType::Normal, "pod/default/a", "Started", "ok");
        let recent = recorder.recent();
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0].reason, "FailedToParse");
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains("\"reason\":\"Started\""));
    }

    #[test]
    fn the_ring_is_bounded() {
        let recorder = Recorder::new(None);
        for i in 0..RING_CAPACITY + 5 {
            recorder.event(EventType::Normal, "pod/a/b", "R", i.to_string());
        }
        let recent = recorder.recent();
        assert_eq!(recent.len(), RING_CAPACITY);
        assert_eq!(recent[0].message, "5");
    }
}
