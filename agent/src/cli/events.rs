//! `ringlet events`: connects to the running agent's event socket, streams its lifecycle events
//! (optionally only one namespace's or one pod's) and prints one line per event, as text for people
//! or as JSON objects for scripts.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use k8s_openapi::jiff::Timestamp;
use ringlet_proto::events::v1 as pb;
use ringlet_proto::events::v1::event_service_client::EventServiceClient;
use tokio::net::UnixStream;
use tonic::transport::Endpoint;
use tonic::{Code, Status};

use crate::container::{ContainerId, PodUid};
use crate::error_chain::error_chain;
use crate::event_stream::{
    DEFAULT_SOCKET_PATH, LifecycleKind, LifecycleRecord, from_unix_nanos, unix_nanos,
};

/// How long the agent has to accept the watch; it answers at once unless it is stuck.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The flags of `ringlet events`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "events",
    bin_name = "ringlet events",
    about = "Stream the container lifecycle events of the running ringlet agent"
)]
pub struct EventsArgs {
    /// The agent's event socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET_PATH)]
    pub socket: PathBuf,
    /// Only events of pods in this namespace.
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// Only events of pods with this name.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
    /// How to print each event.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// How `ringlet events` prints an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// `TIME NAMESPACE/POD CONTAINER KIND [exit=N] [latency=1.23ms]`
    Text,
    /// One JSON object per line.
    Json,
}

/// One item of the event stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    Event(LifecycleRecord),
    /// This watcher fell behind and `missed` events were dropped before it read them.
    Lost {
        missed: u64,
        observed_at: SystemTime,
    },
}

/// Why the agent could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    #[error("no such file (is ringlet running?)")]
    Missing,
    #[error("permission denied (the socket is root only)")]
    PermissionDenied,
    #[error("connection refused (is ringlet running?)")]
    Refused,
    #[error("connection failed")]
    Other {
        #[source]
        source: tonic::transport::Error,
    },
}

/// Why `ringlet events` failed.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("cannot connect to ringlet's event socket {}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        reason: ConnectFailure,
    },
    #[error("ringlet's event socket {} did not answer within {timeout:?} (is the agent stuck?)", socket.display())]
    Unresponsive { socket: PathBuf, timeout: Duration },
    #[error("starting the event watch failed: {code:?}: {message}")]
    Watch { code: Code, message: String },
    #[error("reading the event stream failed: {code:?}: {message}")]
    Stream { code: Code, message: String },
    #[error("the agent sent an event of unknown kind {kind}")]
    UnknownKind { kind: i32 },
    #[error("writing the events to stdout")]
    Write {
        #[source]
        source: io::Error,
    },
    #[error("starting the async runtime")]
    Runtime {
        #[source]
        source: io::Error,
    },
}

/// An open watch on the agent's event stream.
pub struct EventWatch {
    stream: tonic::Streaming<pb::LifecycleEvent>,
}

impl EventWatch {
    /// The next item, or `None` when the agent ended the stream (it is shutting down).
    pub async fn next(&mut self) -> Result<Option<WatchItem>, EventsError> {
        let event = self
            .stream
            .message()
            .await
            .map_err(|status| EventsError::Stream {
                code: status.code(),
                message: status.message().to_owned(),
            })?;
        event.map(decode).transpose()
    }
}

/// Connects to the agent's event socket and starts watching the events of pods in `namespace`
/// named `pod` (`None` matches all).
pub async fn watch_events(
    socket: &Path,
    namespace: Option<&str>,
    pod: Option<&str>,
) -> Result<EventWatch, EventsError> {
    let request = pb::WatchRequest {
        namespace: namespace.unwrap_or_default().to_owned(),
        pod: pod.unwrap_or_default().to_owned(),
    };
    // Only the start is bounded: once watching, hours without an event are normal.
    tokio::time::timeout(ANSWER_TIMEOUT, start_watch(socket, request))
        .await
        .map_err(|_| EventsError::Unresponsive {
            socket: socket.to_owned(),
            timeout: ANSWER_TIMEOUT,
        })?
}

async fn start_watch(socket: &Path, request: pb::WatchRequest) -> Result<EventWatch, EventsError> {
    let path = socket.to_owned();
    // The URI is required by the API but never resolved: every connection goes to the socket.
    let channel = Endpoint::from_static("http://ringlet-events.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| EventsError::Connect {
            socket: socket.to_owned(),
            reason: classify(source),
        })?;
    let stream = EventServiceClient::new(channel)
        .watch(request)
        .await
        .map_err(|status: Status| EventsError::Watch {
            code: status.code(),
            message: status.message().to_owned(),
        })?
        .into_inner();
    Ok(EventWatch { stream })
}

/// Names the usual reasons a local socket cannot be reached, found in the transport error's chain.
fn classify(err: tonic::transport::Error) -> ConnectFailure {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::NotFound => return ConnectFailure::Missing,
                io::ErrorKind::PermissionDenied => return ConnectFailure::PermissionDenied,
                io::ErrorKind::ConnectionRefused => return ConnectFailure::Refused,
                _ => {}
            }
        }
        cause = current.source();
    }
    ConnectFailure::Other { source: err }
}

fn decode(event: pb::LifecycleEvent) -> Result<WatchItem, EventsError> {
    let observed_at = from_unix_nanos(event.observed_at_unix_ns);
    let proto_kind = pb::LifecycleKind::try_from(event.kind)
        .map_err(|_| EventsError::UnknownKind { kind: event.kind })?;
    if proto_kind == pb::LifecycleKind::EventsLost {
        return Ok(WatchItem::Lost {
            missed: event.missed_events,
            observed_at,
        });
    }
    let kind = LifecycleKind::from_proto(proto_kind)
        .ok_or(EventsError::UnknownKind { kind: event.kind })?;
    Ok(WatchItem::Event(LifecycleRecord {
        pod_uid: PodUid::new(event.pod_uid),
        namespace: event.namespace,
        pod_name: event.pod_name,
        container_name: event.container_name,
        container_id: (!event.container_id.is_empty())
            .then(|| ContainerId::new(event.container_id)),
        kind,
        exit_code: event.has_exit_code.then_some(event.exit_code),
        kernel_to_event: (event.kernel_to_event_ns > 0)
            .then(|| Duration::from_nanos(event.kernel_to_event_ns)),
        observed_at,
    }))
}

/// RFC 3339 in UTC with `precision` fractional digits (at most 9).
fn format_time(time: SystemTime, precision: usize) -> String {
    match Timestamp::from_nanosecond(i128::from(unix_nanos(time))) {
        Ok(timestamp) => format!("{timestamp:.precision$}"),
        // Only for times thousands of years away; the raw number still says when.
        Err(_) => format!("@{}ns", unix_nanos(time)),
    }
}

/// Milliseconds with two decimals, the resolution the latency targets are stated in.
fn format_latency(latency: Duration) -> String {
    format!("{:.2}ms", latency.as_secs_f64() * 1000.0)
}

/// One line (no newline) for people:
/// `TIME NAMESPACE/POD CONTAINER KIND [exit=N] [latency=1.23ms]`, `-` for a pod-level event's
/// container.
pub fn format_text(item: &WatchItem) -> String {
    match item {
        WatchItem::Event(record) => {
            let container = if record.container_name.is_empty() {
                "-"
            } else {
                &record.container_name
            };
            let mut line = format!(
                "{} {}/{} {container} {}",
                format_time(record.observed_at, 6),
                record.namespace,
                record.pod_name,
                record.kind.as_str(),
            );
            // Writing to a String cannot fail.
            if let Some(code) = record.exit_code {
                let _ = write!(line, " exit={code}");
            }
            if let Some(latency) = record.kernel_to_event {
                let _ = write!(line, " latency={}", format_latency(latency));
            }
            line
        }
        WatchItem::Lost {
            missed,
            observed_at,
        } => format!(
            "{} - - EventsLost missed={missed} (this client read too slowly)",
            format_time(*observed_at, 6)
        ),
    }
}

/// One JSON object (no newline) for scripts; absent values are `null`.
pub fn format_json(item: &WatchItem) -> String {
    let value = match item {
        WatchItem::Event(record) => serde_json::json!({
            "time": format_time(record.observed_at, 9),
            "observed_at_unix_ns": unix_nanos(record.observed_at),
            "namespace": record.namespace,
            "pod": record.pod_name,
            "pod_uid": record.pod_uid.as_str(),
            "container": (!record.container_name.is_empty()).then_some(&record.container_name),
            "container_id": record.container_id.as_ref().map(ContainerId::as_str),
            "kind": record.kind.as_str(),
            "exit_code": record.exit_code,
            "kernel_to_event_ns": record
                .kernel_to_event
                .map(|latency| u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX)),
        }),
        WatchItem::Lost {
            missed,
            observed_at,
        } => serde_json::json!({
            "time": format_time(*observed_at, 9),
            "observed_at_unix_ns": unix_nanos(*observed_at),
            "kind": "EventsLost",
            "missed": missed,
        }),
    };
    value.to_string()
}

/// Runs `ringlet events` on its own single-threaded runtime; the exit code says whether it failed.
pub fn run_events(args: EventsArgs) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| EventsError::Runtime { source })
        .and_then(|runtime| runtime.block_on(print_events(args, &mut io::stdout().lock())));
    match result {
        Ok(()) => {
            eprintln!("ringlet events: the agent ended the event stream (it is shutting down)");
            ExitCode::SUCCESS
        }
        // The reader went away (`ringlet events | head`): nothing left to do.
        Err(EventsError::Write { source }) if source.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("ringlet events: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// Streams the events `args` asks for into `out`, one line each, until the agent ends the stream.
pub(crate) async fn print_events(
    args: EventsArgs,
    out: &mut impl Write,
) -> Result<(), EventsError> {
    let EventsArgs {
        socket,
        namespace,
        pod,
        output,
    } = args;
    let mut watch = watch_events(&socket, namespace.as_deref(), pod.as_deref()).await?;
    // From here on no event is missed: a script can wait for this line before it acts.
    eprintln!("ringlet events: watching {}", socket.display());
    while let Some(item) = watch.next().await? {
        let line = match output {
            OutputFormat::Text => format_text(&item),
            OutputFormat::Json => format_json(&item),
        };
        // Flushed per line so a pipe sees each event as it happens.
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|source| EventsError::Write { source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> LifecycleRecord {
        LifecycleRecord {
            pod_uid: PodUid::new("0f6c"),
            namespace: "default".into(),
            pod_name: "web".into(),
            container_name: "nginx".into(),
            container_id: Some(ContainerId::new("abc123")),
            kind: LifecycleKind::Died,
            exit_code: Some(137),
            kernel_to_event: Some(Duration::from_micros(1234)),
            // 2026-11-22T01:39:31.123456789Z
            observed_at: SystemTime::UNIX_EPOCH + Duration::new(1_795_311_571, 123_456_789),
        }
    }

    #[test]
    fn text_line_has_every_present_field() {
        assert_eq!(
            format_text(&WatchItem::Event(record())),
            "2026-11-22T01:39:31.123456Z default/web nginx ContainerDied exit=137 latency=1.23ms"
        );
    }

    #[test]
    fn text_line_leaves_out_absent_values() {
        let pod_sync = LifecycleRecord {
            container_name: String::new(),
            container_id: None,
            kind: LifecycleKind::PodSync,
            exit_code: None,
            kernel_to_event: None,
            ..record()
        };
        assert_eq!(
            format_text(&WatchItem::Event(pod_sync)),
            "2026-11-22T01:39:31.123456Z default/web - PodSync"
        );
    }

    #[test]
    fn text_line_reports_lost_events() {
        let lost = WatchItem::Lost {
            missed: 16,
            observed_at: record().observed_at,
        };
        assert_eq!(
            format_text(&lost),
            "2026-11-22T01:39:31.123456Z - - EventsLost missed=16 (this client read too slowly)"
        );
    }

    #[test]
    fn json_line_is_one_object_with_every_field() {
        let line = format_json(&WatchItem::Event(record()));
        assert!(!line.contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "time": "2026-11-22T01:39:31.123456789Z",
                "observed_at_unix_ns": 1_795_311_571_123_456_789_i64,
                "namespace": "default",
                "pod": "web",
                "pod_uid": "0f6c",
                "container": "nginx",
                "container_id": "abc123",
                "kind": "ContainerDied",
                "exit_code": 137,
                "kernel_to_event_ns": 1_234_000,
            })
        );
    }

    #[test]
    fn json_line_uses_null_for_absent_values() {
        let started = LifecycleRecord {
            container_name: String::new(),
            container_id: None,
            kind: LifecycleKind::Started,
            exit_code: None,
            kernel_to_event: None,
            ..record()
        };
        let value: serde_json::Value =
            serde_json::from_str(&format_json(&WatchItem::Event(started))).unwrap();
        assert_eq!(value["kind"], "ContainerStarted");
        for field in [
            "container",
            "container_id",
            "exit_code",
            "kernel_to_event_ns",
        ] {
            assert!(value[field].is_null(), "{field} should be null: {value}");
        }
    }

    #[test]
    fn json_line_reports_lost_events() {
        let lost = WatchItem::Lost {
            missed: 3,
            observed_at: record().observed_at,
        };
        let value: serde_json::Value = serde_json::from_str(&format_json(&lost)).unwrap();
        assert_eq!(value["kind"], "EventsLost");
        assert_eq!(value["missed"], 3);
    }

    #[test]
    fn decoding_rejects_unknown_kinds() {
        for kind in [0, 99] {
            let event = pb::LifecycleEvent {
                kind,
                ..pb::LifecycleEvent::default()
            };
            assert!(matches!(
                decode(event),
                Err(EventsError::UnknownKind { kind: k }) if k == kind
            ));
        }
    }

    #[test]
    fn flags_parse_with_defaults() {
        use clap::Parser;
        let args = EventsArgs::try_parse_from(["events"]).unwrap();
        assert_eq!(args.socket, Path::new(DEFAULT_SOCKET_PATH));
        assert_eq!(args.namespace, None);
        assert_eq!(args.pod, None);
        assert_eq!(args.output, OutputFormat::Text);

        let args = EventsArgs::try_parse_from([
            "events",
            "--socket",
            "/tmp/e.sock",
            "--namespace",
            "kube-system",
            "--pod",
            "dns",
            "--output",
            "json",
        ])
        .unwrap();
        assert_eq!(args.socket, Path::new("/tmp/e.sock"));
        assert_eq!(args.namespace.as_deref(), Some("kube-system"));
        assert_eq!(args.pod.as_deref(), Some("dns"));
        assert_eq!(args.output, OutputFormat::Json);

        assert!(EventsArgs::try_parse_from(["events", "--output", "yaml"]).is_err());
    }
}
