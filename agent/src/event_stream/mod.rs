//! Live lifecycle event inspection: the PLEG and the sync loop publish every container lifecycle
//! event to an [`EventBroadcaster`], and [`serve`] streams them to local clients (`ringlet events`)
//! over ringlet's own gRPC API (`ringlet.events.v1.EventService`) on a root-only unix socket. The
//! kubelet has no counterpart: upstream, PLEG events are only visible in verbose logs.
//!
//! Publishing never waits for watchers: each watcher has a bounded backlog, and one that falls
//! behind loses its oldest unread events and is told how many with an `EVENTS_LOST` event.

mod server;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ringlet_proto::events::v1 as pb;
use tokio::sync::broadcast;

use crate::container::{ContainerId, PodUid};

pub use server::serve;

/// Where the agent serves the event API unless told otherwise.
pub const DEFAULT_SOCKET_PATH: &str = "/run/ringlet/events.sock";

/// How many events a watcher may fall behind before it loses the oldest ones.
pub const DEFAULT_BACKLOG: usize = 4096;

/// The largest backlog [`EventBroadcaster::new`] allocates; the buffer is allocated up front.
pub const MAX_BACKLOG: usize = 1 << 20;

/// What happened to a container (or pod), as shown to watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LifecycleKind {
    Started,
    Died,
    Removed,
    OomKilled,
    /// The pod changed and was re-synced without a container transition.
    PodSync,
    /// The pod's status now shows a change the kernel reported.
    StatusUpdated,
    /// The runtime reported an exit published from the kernel first.
    RuntimeConfirmed,
}

impl LifecycleKind {
    /// The name `ringlet events` prints: the PLEG event names of the kubelet, and the container
    /// status reason for OOM kills.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "ContainerStarted",
            Self::Died => "ContainerDied",
            Self::Removed => "ContainerRemoved",
            Self::OomKilled => "OOMKilled",
            Self::PodSync => "PodSync",
            Self::StatusUpdated => "StatusUpdated",
            Self::RuntimeConfirmed => "RuntimeConfirmed",
        }
    }

    fn to_proto(self) -> pb::LifecycleKind {
        match self {
            Self::Started => pb::LifecycleKind::Started,
            Self::Died => pb::LifecycleKind::Died,
            Self::Removed => pb::LifecycleKind::Removed,
            Self::OomKilled => pb::LifecycleKind::OomKilled,
            Self::PodSync => pb::LifecycleKind::PodSync,
            Self::StatusUpdated => pb::LifecycleKind::StatusUpdated,
            Self::RuntimeConfirmed => pb::LifecycleKind::RuntimeConfirmed,
        }
    }

    /// The kind of a pod event; `None` for the kinds that are not one (unspecified, events lost).
    pub(crate) fn from_proto(kind: pb::LifecycleKind) -> Option<Self> {
        match kind {
            pb::LifecycleKind::Started => Some(Self::Started),
            pb::LifecycleKind::Died => Some(Self::Died),
            pb::LifecycleKind::Removed => Some(Self::Removed),
            pb::LifecycleKind::OomKilled => Some(Self::OomKilled),
            pb::LifecycleKind::PodSync => Some(Self::PodSync),
            pb::LifecycleKind::StatusUpdated => Some(Self::StatusUpdated),
            pb::LifecycleKind::RuntimeConfirmed => Some(Self::RuntimeConfirmed),
            pb::LifecycleKind::Unspecified | pb::LifecycleKind::EventsLost => None,
        }
    }
}

/// One lifecycle event with everything a watcher shows about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleRecord {
    pub pod_uid: PodUid,
    pub namespace: String,
    pub pod_name: String,
    /// The container's name in the pod spec; empty for pod-level events.
    pub container_name: String,
    pub container_id: Option<ContainerId>,
    pub kind: LifecycleKind,
    pub exit_code: Option<i32>,
    /// From the kernel seeing the transition to the PLEG emitting the event; `None` when the event
    /// did not come from a kernel hint.
    pub kernel_to_event: Option<Duration>,
    /// Wall-clock time the event was emitted.
    pub observed_at: SystemTime,
}

impl LifecycleRecord {
    fn to_proto(&self) -> pb::LifecycleEvent {
        pb::LifecycleEvent {
            pod_uid: self.pod_uid.to_string(),
            namespace: self.namespace.clone(),
            pod_name: self.pod_name.clone(),
            container_name: self.container_name.clone(),
            container_id: self
                .container_id
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            kind: self.kind.to_proto().into(),
            exit_code: self.exit_code.unwrap_or_default(),
            has_exit_code: self.exit_code.is_some(),
            // A measured latency of 0 would read as "not measured"; the kernel event always
            // precedes the PLEG event, so 1 ns is the honest lower bound.
            kernel_to_event_ns: self.kernel_to_event.map_or(0, |latency| {
                u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1)
            }),
            observed_at_unix_ns: unix_nanos(self.observed_at),
            missed_events: 0,
        }
    }
}

/// The event that tells a watcher it fell behind and missed `missed` events.
fn events_lost(missed: u64, observed_at: SystemTime) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        kind: pb::LifecycleKind::EventsLost.into(),
        observed_at_unix_ns: unix_nanos(observed_at),
        missed_events: missed,
        ..pb::LifecycleEvent::default()
    }
}

/// Nanoseconds since the Unix epoch, saturating far outside the representable range.
pub(crate) fn unix_nanos(time: SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |ns| -ns),
    }
}

/// The inverse of [`unix_nanos`].
pub(crate) fn from_unix_nanos(nanos: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// The publishing side of the event stream; cheap to clone, one per publisher. The backlog holds
/// shared records, not the records themselves: the channel allocates every slot up front, watched
/// or not, and at the default backlog slots of a pointer take 131 KiB where slots of a whole
/// record took 787 KiB (heaptrack).
#[derive(Clone, Debug)]
pub struct EventBroadcaster {
    sender: broadcast::Sender<Arc<LifecycleRecord>>,
}

impl EventBroadcaster {
    /// A broadcaster whose watchers may each fall `backlog` events behind (clamped to
    /// `1..=MAX_BACKLOG`) before they lose the oldest.
    pub fn new(backlog: usize) -> Self {
        let (sender, _) = broadcast::channel(backlog.clamp(1, MAX_BACKLOG));
        Self { sender }
    }

    /// Hands the record to every current watcher without waiting for any of them; with no watcher
    /// the record is dropped.
    pub fn publish(&self, record: LifecycleRecord) {
        // The only error is "nobody is watching", which is the normal case.
        let _ = self.sender.send(Arc::new(record));
    }

    /// How many watchers are connected.
    pub fn watcher_count(&self) -> usize {
        self.sender.receiver_count()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<LifecycleRecord>> {
        self.sender.subscribe()
    }
}

impl Default for EventBroadcaster {
    fn default() -> Self {
        Self::new(DEFAULT_BACKLOG)
    }
}

/// Why the event socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum EventStreamError {
    #[error("serving events on {}: the path has no file name", path.display())]
    InvalidPath { path: PathBuf },
    #[error("creating the event socket directory {}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("inspecting the existing event socket path {}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving events on {}: the path exists and is not a socket; remove it if it is stale", path.display())]
    NotASocket { path: PathBuf },
    #[error("serving events on {}: another process is already serving there (another ringlet?)", path.display())]
    AlreadyServing { path: PathBuf },
    #[error("probing whether the existing event socket {} is still served", path.display())]
    Probe {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing the leftover event socket {}", path.display())]
    RemoveLeftover {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the event socket {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("restricting the event socket {} to its owner", path.display())]
    SetPermissions {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("moving the event socket {} into place at {}", from.display(), to.display())]
    Install {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the event API on {}", path.display())]
    Serve {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}
