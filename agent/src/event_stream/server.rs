//! The gRPC side of the event stream: the root-only unix socket (created atomically with mode
//! 0600, replacing a stale one from a crashed run) and the `EventService` that turns one broadcast
//! subscription into one filtered watch stream.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use futures::Stream;
use ringlet_proto::events::v1 as pb;
use ringlet_proto::events::v1::event_service_server::{EventService, EventServiceServer};
use tokio::net::UnixListener;
use tokio::sync::{broadcast, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::{EventBroadcaster, EventStreamError, LifecycleRecord, events_lost};

/// Serves the event API on the unix socket at `path` until `shutdown` completes, then ends every
/// open watch stream, waits for the connections to close and removes the socket file.
///
/// A missing directory is created with mode 0700; a socket file nobody serves any more is
/// replaced, but a socket another process still serves, or anything that is not a socket, is left
/// alone and reported.
pub async fn serve(
    path: &Path,
    broadcaster: EventBroadcaster,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EventStreamError> {
    let listener = bind(path)?;
    tracing::info!(path = %path.display(), "serving lifecycle events");
    let (stop, stopping) = watch::channel(false);
    let service = EventServiceServer::new(Watcher {
        broadcaster,
        stopping,
    });
    let result = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(service, UnixListenerStream::new(listener), async move {
            shutdown.await;
            // Watch streams never end on their own; without this the graceful shutdown would wait
            // for every watcher to hang up.
            let _ = stop.send(true);
        })
        .await;
    if let Err(err) = fs::remove_file(path)
        && err.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), %err, "cannot remove the event socket");
    }
    result.map_err(|source| EventStreamError::Serve {
        path: path.to_owned(),
        source,
    })
}

/// Binds the socket under a temporary name, restricts it to its owner and only then renames it
/// into place, so no client can ever connect before the mode is 0600.
fn bind(path: &Path) -> Result<UnixListener, EventStreamError> {
    let file_name = path
        .file_name()
        .ok_or_else(|| EventStreamError::InvalidPath {
            path: path.to_owned(),
        })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| EventStreamError::CreateDir {
                dir: dir.to_owned(),
                source,
            })?;
    }
    check_replaceable(path)?;

    let staging = staging_path(dir, file_name);
    // Left behind only by a run that crashed between bind and rename.
    match fs::remove_file(&staging) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(EventStreamError::RemoveLeftover {
                path: staging,
                source,
            });
        }
    }
    let listener = UnixListener::bind(&staging).map_err(|source| EventStreamError::Bind {
        path: staging.clone(),
        source,
    })?;
    let installed = fs::set_permissions(&staging, fs::Permissions::from_mode(0o600))
        .map_err(|source| EventStreamError::SetPermissions {
            path: staging.clone(),
            source,
        })
        .and_then(|()| {
            fs::rename(&staging, path).map_err(|source| EventStreamError::Install {
                from: staging.clone(),
                to: path.to_owned(),
                source,
            })
        });
    if let Err(err) = installed {
        let _ = fs::remove_file(&staging);
        return Err(err);
    }
    Ok(listener)
}

/// Whether whatever is at `path` may be replaced: nothing, or a socket nobody listens on.
fn check_replaceable(path: &Path) -> Result<(), EventStreamError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(EventStreamError::Inspect {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(EventStreamError::NotASocket {
            path: path.to_owned(),
        });
    }
    // A unix-socket connect never waits for the peer to accept, so this does not block.
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(EventStreamError::AlreadyServing {
            path: path.to_owned(),
        }),
        Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(source) => Err(EventStreamError::Probe {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Which events a watcher asked for; an empty field matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct WatchFilter {
    pub(super) namespace: String,
    pub(super) pod: String,
}

impl WatchFilter {
    pub(super) fn matches(&self, record: &LifecycleRecord) -> bool {
        (self.namespace.is_empty() || self.namespace == record.namespace)
            && (self.pod.is_empty() || self.pod == record.pod_name)
    }
}

impl From<pb::WatchRequest> for WatchFilter {
    fn from(request: pb::WatchRequest) -> Self {
        Self {
            namespace: request.namespace,
            pod: request.pod,
        }
    }
}

struct Watcher {
    broadcaster: EventBroadcaster,
    /// Becomes true when the server shuts down.
    stopping: watch::Receiver<bool>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::LifecycleEvent, Status>> + Send>>;

#[tonic::async_trait]
impl EventService for Watcher {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let filter = WatchFilter::from(request.into_inner());
        tracing::debug!(?filter, "event watcher connected");
        let state = (self.broadcaster.subscribe(), filter, self.stopping.clone());
        // The stream (and with it the subscription) is dropped as soon as the client goes away.
        let stream =
            futures::stream::unfold(state, |(mut events, filter, mut stopping)| async move {
                let event = next_event(&mut events, &filter, &mut stopping).await?;
                Some((Ok(event), (events, filter, stopping)))
            });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The next event the watcher wants, or `None` when the stream ends (server stopping, or every
/// publisher gone).
async fn next_event(
    events: &mut broadcast::Receiver<Arc<LifecycleRecord>>,
    filter: &WatchFilter,
    stopping: &mut watch::Receiver<bool>,
) -> Option<pb::LifecycleEvent> {
    loop {
        let received = tokio::select! {
            // Stopping wins over queued events, so a busy stream cannot hold up the shutdown.
            biased;
            // A dropped sender means the server is gone too.
            _ = stopping.wait_for(|stop| *stop) => return None,
            received = events.recv() => received,
        };
        match received {
            Ok(record) if filter.matches(&record) => return Some(record.to_proto()),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "event watcher fell behind");
                return Some(events_lost(missed, SystemTime::now()));
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// The temporary name the socket is bound under before it is moved into place.
pub(super) fn staging_path(dir: &Path, file_name: &OsStr) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(file_name);
    name.push(".new");
    dir.join(name)
}
