//! The filter and conversions in isolation, then the whole path in process: `serve` on a temporary
//! socket, the `ringlet events` client code reading from it, records published in between.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::server::{WatchFilter, staging_path};
use super::*;
use crate::cli::{
    ConnectFailure, EventWatch, EventsArgs, EventsError, OutputFormat, WatchItem, watch_events,
};

/// Guards every wait on real socket I/O; never reached when the code works.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn record(namespace: &str, pod: &str, container: &str, kind: LifecycleKind) -> LifecycleRecord {
    LifecycleRecord {
        pod_uid: PodUid::new(format!("uid-{namespace}-{pod}")),
        namespace: namespace.into(),
        pod_name: pod.into(),
        container_name: container.into(),
        container_id: Some(ContainerId::new(format!("id-{container}"))),
        kind,
        exit_code: (kind == LifecycleKind::Died).then_some(3),
        kernel_to_event: Some(Duration::from_micros(250)),
        observed_at: SystemTime::UNIX_EPOCH + Duration::new(1_795_311_571, 500),
    }
}

fn filter(namespace: &str, pod: &str) -> WatchFilter {
    WatchFilter {
        namespace: namespace.into(),
        pod: pod.into(),
    }
}

#[test]
fn empty_filter_matches_everything() {
    let any = filter("", "");
    assert!(any.matches(&record("default", "web", "c", LifecycleKind::Started)));
    assert!(any.matches(&record("kube-system", "dns", "c", LifecycleKind::Died)));
}

#[test]
fn filter_by_namespace_pod_or_both() {
    let web = record("default", "web", "c", LifecycleKind::Started);
    let other_ns = record("prod", "web", "c", LifecycleKind::Started);
    let other_pod = record("default", "db", "c", LifecycleKind::Started);

    let by_namespace = filter("default", "");
    assert!(by_namespace.matches(&web));
    assert!(by_namespace.matches(&other_pod));
    assert!(!by_namespace.matches(&other_ns));

    let by_pod = filter("", "web");
    assert!(by_pod.matches(&web));
    assert!(by_pod.matches(&other_ns));
    assert!(!by_pod.matches(&other_pod));

    let both = filter("default", "web");
    assert!(both.matches(&web));
    assert!(!both.matches(&other_ns));
    assert!(!both.matches(&other_pod));
}

#[test]
fn record_encodes_every_field() {
    let event = record("default", "web", "app", LifecycleKind::Died).to_proto();
    assert_eq!(event.pod_uid, "uid-default-web");
    assert_eq!(event.namespace, "default");
    assert_eq!(event.pod_name, "web");
    assert_eq!(event.container_name, "app");
    assert_eq!(event.container_id, "id-app");
    assert_eq!(event.kind(), pb::LifecycleKind::Died);
    assert_eq!((event.exit_code, event.has_exit_code), (3, true));
    assert_eq!(event.kernel_to_event_ns, 250_000);
    assert_eq!(event.observed_at_unix_ns, 1_795_311_571_000_000_500);
    assert_eq!(event.missed_events, 0);
}

#[test]
fn exit_code_zero_is_distinct_from_no_exit_code() {
    let mut died = record("default", "web", "app", LifecycleKind::Died);
    died.exit_code = Some(0);
    let event = died.to_proto();
    assert_eq!((event.exit_code, event.has_exit_code), (0, true));
    died.exit_code = None;
    assert!(!died.to_proto().has_exit_code);
}

#[test]
fn measured_latency_never_encodes_as_unmeasured() {
    let mut started = record("default", "web", "app", LifecycleKind::Started);
    started.kernel_to_event = Some(Duration::ZERO);
    assert_eq!(started.to_proto().kernel_to_event_ns, 1);
    started.kernel_to_event = None;
    assert_eq!(started.to_proto().kernel_to_event_ns, 0);
}

#[test]
fn unix_nanos_round_trips_both_sides_of_the_epoch() {
    for nanos in [0, 1, -1, 1_795_311_571_123_456_789, -86_400_000_000_123] {
        assert_eq!(unix_nanos(from_unix_nanos(nanos)), nanos);
    }
}

#[test]
fn zero_backlog_is_clamped_and_publishing_without_watchers_is_fine() {
    let broadcaster = EventBroadcaster::new(0);
    broadcaster.publish(record("default", "web", "c", LifecycleKind::Started));
    assert_eq!(broadcaster.watcher_count(), 0);
}

/// A `serve` task on a socket in its own temporary directory.
struct TestServer {
    _dir: tempfile::TempDir,
    path: PathBuf,
    broadcaster: EventBroadcaster,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), EventStreamError>>,
}

impl TestServer {
    async fn start(backlog: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("events.sock");
        Self::start_at(dir, path, backlog).await
    }

    async fn start_at(dir: tempfile::TempDir, path: PathBuf, backlog: usize) -> Self {
        let broadcaster = EventBroadcaster::new(backlog);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let path = path.clone();
            let broadcaster = broadcaster.clone();
            async move {
                serve(&path, broadcaster, async move {
                    let _ = stopped.await;
                })
                .await
            }
        });
        // The socket is bound when the task first runs; a stale file must be replaced first.
        tokio::time::timeout(IO_TIMEOUT, async {
            while !is_served(&path) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        Self {
            _dir: dir,
            path,
            broadcaster,
            stop,
            task,
        }
    }

    async fn watch(&self, namespace: Option<&str>, pod: Option<&str>) -> EventWatch {
        watch_events(&self.path, namespace, pod).await.unwrap()
    }

    async fn shut_down(self) -> Result<(), EventStreamError> {
        let _ = self.stop.send(());
        tokio::time::timeout(IO_TIMEOUT, self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

fn is_served(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

async fn next(watch: &mut EventWatch) -> WatchItem {
    tokio::time::timeout(IO_TIMEOUT, watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn client_receives_exactly_the_matching_records_in_order() {
    let server = TestServer::start(64).await;
    let mut watch = server.watch(Some("default"), Some("web")).await;

    let published = [
        record("default", "web", "app", LifecycleKind::Started),
        record("default", "db", "app", LifecycleKind::Started),
        record("prod", "web", "app", LifecycleKind::Started),
        record("default", "web", "app", LifecycleKind::Died),
        record("default", "web", "sidecar", LifecycleKind::OomKilled),
        record("prod", "web", "app", LifecycleKind::Removed),
        record("default", "web", "", LifecycleKind::PodSync),
        record("default", "web", "app", LifecycleKind::Removed),
    ];
    for record in &published {
        server.broadcaster.publish(record.clone());
    }
    let expected: Vec<_> = published
        .iter()
        .filter(|r| r.namespace == "default" && r.pod_name == "web")
        .cloned()
        .collect();
    for want in expected {
        assert_eq!(next(&mut watch).await, WatchItem::Event(want));
    }
    // Nothing else is queued: the next item is the one published now.
    let last = record("default", "web", "app", LifecycleKind::Started);
    server.broadcaster.publish(last.clone());
    assert_eq!(next(&mut watch).await, WatchItem::Event(last));
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn socket_is_owner_only_and_its_directory_is_created_private() {
    let server = TestServer::start(4).await;
    let socket = std::fs::symlink_metadata(&server.path).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);
    // Owned by whoever runs the agent (root in production): the same owner as a fresh file.
    let probe = tempfile::NamedTempFile::new().unwrap();
    assert_eq!(socket.uid(), probe.as_file().metadata().unwrap().uid());
    let dir = std::fs::metadata(server.path.parent().unwrap()).unwrap();
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn lagging_watcher_is_told_how_many_it_missed() {
    let server = TestServer::start(4).await;
    let mut watch = server.watch(None, None).await;
    // Published without yielding, so the watcher cannot read any before the backlog overflows.
    let published: Vec<_> = (0..10)
        .map(|i| {
            record(
                "default",
                &format!("pod-{i}"),
                "app",
                LifecycleKind::Started,
            )
        })
        .collect();
    for record in &published {
        server.broadcaster.publish(record.clone());
    }
    match next(&mut watch).await {
        WatchItem::Lost { missed, .. } => assert_eq!(missed, 6),
        other @ WatchItem::Event(_) => panic!("expected the loss first, got {other:?}"),
    }
    for want in &published[6..] {
        assert_eq!(next(&mut watch).await, WatchItem::Event(want.clone()));
    }
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn second_client_works_while_the_first_is_connected() {
    let server = TestServer::start(16).await;
    let mut first = server.watch(None, None).await;
    let started = record("default", "web", "app", LifecycleKind::Started);
    server.broadcaster.publish(started.clone());
    assert_eq!(next(&mut first).await, WatchItem::Event(started));

    let mut second = server.watch(Some("default"), None).await;
    assert_eq!(server.broadcaster.watcher_count(), 2);
    let died = record("default", "web", "app", LifecycleKind::Died);
    server.broadcaster.publish(died.clone());
    assert_eq!(next(&mut first).await, WatchItem::Event(died.clone()));
    assert_eq!(next(&mut second).await, WatchItem::Event(died));
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn watcher_is_dropped_when_the_client_goes_away() {
    let server = TestServer::start(16).await;
    let watch = server.watch(None, None).await;
    assert_eq!(server.broadcaster.watcher_count(), 1);
    drop(watch);
    tokio::time::timeout(IO_TIMEOUT, async {
        while server.broadcaster.watcher_count() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn stale_socket_and_leftover_staging_file_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    // What a crashed run leaves: socket files nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let staging = staging_path(dir.path(), path.file_name().unwrap());
    drop(std::os::unix::net::UnixListener::bind(&staging).unwrap());
    assert!(!is_served(&path));

    let server = TestServer::start_at(dir, path, 4).await;
    assert!(!staging.exists());
    let mut watch = server.watch(None, None).await;
    let started = record("default", "web", "app", LifecycleKind::Started);
    server.broadcaster.publish(started.clone());
    assert_eq!(next(&mut watch).await, WatchItem::Event(started));
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn live_socket_is_not_taken_over() {
    let server = TestServer::start(4).await;
    let err = serve(&server.path, EventBroadcaster::default(), async {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EventStreamError::AlreadyServing { path } if *path == server.path),
        "{err}"
    );
    // The running server is untouched.
    assert!(is_served(&server.path));
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn path_that_is_not_a_socket_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    std::fs::write(&path, "not a socket").unwrap();
    let err = serve(&path, EventBroadcaster::default(), async {})
        .await
        .unwrap_err();
    assert!(matches!(err, EventStreamError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

/// Collects what `print_events` writes and hands over each flushed line.
struct LineSink {
    buffer: Vec<u8>,
    lines: tokio::sync::mpsc::UnboundedSender<String>,
}

impl std::io::Write for LineSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let line = String::from_utf8(std::mem::take(&mut self.buffer)).unwrap();
        let _ = self.lines.send(line);
        Ok(())
    }
}

#[tokio::test]
async fn cli_prints_matching_events_until_shutdown_ends_the_stream() {
    let server = TestServer::start(16).await;
    let (lines, mut printed) = tokio::sync::mpsc::unbounded_channel();
    let args = EventsArgs {
        socket: server.path.clone(),
        namespace: None,
        pod: Some("web".into()),
        output: OutputFormat::Text,
    };
    let client = tokio::spawn(async move {
        let mut sink = LineSink {
            buffer: Vec::new(),
            lines,
        };
        crate::cli::print_events(args, &mut sink).await
    });
    tokio::time::timeout(IO_TIMEOUT, async {
        while server.broadcaster.watcher_count() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    server
        .broadcaster
        .publish(record("default", "db", "app", LifecycleKind::Died));
    server
        .broadcaster
        .publish(record("default", "web", "app", LifecycleKind::Died));
    let line = tokio::time::timeout(IO_TIMEOUT, printed.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        line,
        "2026-11-22T01:39:31.000000Z default/web app ContainerDied exit=3 latency=0.25ms\n"
    );

    let path = server.path.clone();
    server.shut_down().await.unwrap();
    tokio::time::timeout(IO_TIMEOUT, client)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(printed.try_recv().is_err(), "nothing else was printed");
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn missing_socket_says_the_agent_is_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    let Err(err) = watch_events(&path, None, None).await else {
        panic!("connected to a missing socket");
    };
    assert!(
        matches!(
            &err,
            EventsError::Connect {
                reason: ConnectFailure::Missing,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        format!("{err}: {}", std::error::Error::source(&err).unwrap()),
        format!(
            "cannot connect to ringlet's event socket {}: no such file (is ringlet running?)",
            path.display()
        )
    );
}

#[tokio::test]
async fn socket_nobody_serves_says_connection_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let Err(err) = watch_events(&path, None, None).await else {
        panic!("connected to a dead socket");
    };
    assert!(
        matches!(
            err,
            EventsError::Connect {
                reason: ConnectFailure::Refused,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn agent_that_never_answers_is_reported_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    // Connections queue in the backlog and nobody ever speaks HTTP/2 on them.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let Err(err) = watch_events(&path, None, None).await else {
        panic!("watching a silent socket succeeded");
    };
    assert!(matches!(err, EventsError::Unresponsive { .. }), "{err:?}");
}
