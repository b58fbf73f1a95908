//! The task that writes events to the API server: client-go's `recordToSink` / `recordEvent`
//! (`tools/record/event.go`) over the `EventSinkImpl` of `kubernetes/typed/core/v1/event_expansion.go`,
//! as the kubelet's `makeEventRecorder` (`cmd/kubelet/app/server.go`) starts it.
//!
//! One event at a time, in order: it is made into a core/v1 Event (source `kubelet` + node name),
//! correlated (aggregation, dedup, spam filter), then created, or patched when it repeats an
//! earlier one (a patch that finds the event gone falls back to create). A transport error is
//! retried up to 12 tries 10 s apart (the first wait randomized so that nodes that lost the API
//! server together do not come back in step); an answer of the API server (forbidden, invalid, …)
//! is final. Every request waits for the client-side token bucket (`eventRecordQPS`,
//! `eventBurst`). While the task waits, new events queue in the recorder's bounded channel.

use std::future::Future;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::EventType;
use super::correlator::{Correlated, EventCorrelator, event_name, random_u64};
use super::object::InvolvedObject;
use crate::apiserver::ApiClient;

/// The source component, reporting controller (`kubelet`).
const COMPONENT: &str = "kubelet";
/// Where events about cluster-scoped objects (the node) go (`metav1.NamespaceDefault`).
const DEFAULT_NAMESPACE: &str = "default";
/// `maxTriesPerEvent`.
const MAX_TRIES: u32 = 12;
/// `defaultSleepDuration`.
const RETRY_PERIOD: Duration = Duration::from_secs(10);
/// The status cause of a write into a namespace being deleted (`v1.NamespaceTerminatingCause`).
const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

/// An event on its way to the API server, as the recorder saw it.
#[derive(Debug)]
pub(super) struct Pending {
    pub object: InvolvedObject,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub time: Timestamp,
}

/// Why a write failed, in the classes that decide whether it is tried again.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// The event to patch does not exist (any more): create it instead.
    #[error("{0}")]
    NotFound(String),
    /// The API server refused the event; asking again gets the same answer. `quiet` for the
    /// expected refusals (already exists, namespace terminating) that upstream logs at V(5).
    #[error("{message}")]
    Rejected { message: String, quiet: bool },
    /// The request could not be built; it would be built the same next time.
    #[error("{0}")]
    Request(String),
    /// The API server was not reached or its answer not understood: worth another try.
    #[error("{0}")]
    Transport(String),
}

/// The two calls the sink makes; the API server's in the agent, a script in tests.
pub(super) trait EventWriter {
    fn create(
        &self,
        event: &KubeEvent,
    ) -> impl Future<Output = Result<KubeEvent, WriteError>> + Send;

    fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> impl Future<Output = Result<KubeEvent, WriteError>> + Send;
}

/// Writes core/v1 Events with the agent's API client.
pub(super) struct ApiWriter {
    client: ApiClient,
}

impl ApiWriter {
    pub(super) fn new(client: ApiClient) -> Self {
        Self { client }
    }

    fn classify(&self, action: &str, err: &kube::Error) -> WriteError {
        let message = self.client.describe(action, err);
        match err {
            kube::Error::Api(status) if status.is_not_found() => WriteError::NotFound(message),
            kube::Error::Api(status) => WriteError::Rejected {
                quiet: status.is_already_exists()
                    || status.details.as_ref().is_some_and(|details| {
                        details
                            .causes
                            .iter()
                            .any(|cause| cause.reason == NAMESPACE_TERMINATING)
                    }),
                message,
            },
            kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => {
                WriteError::Request(message)
            }
            _ => WriteError::Transport(message),
        }
    }
}

impl EventWriter for ApiWriter {
    async fn create(&self, event: &KubeEvent) -> Result<KubeEvent, WriteError> {
        let namespace = event.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<KubeEvent> = Api::namespaced(self.client.client(), namespace);
        api.create(&PostParams::default(), event)
            .await
            .map_err(|err| {
                let name = event.metadata.name.as_deref().unwrap_or_default();
                self.classify(&format!("create event {namespace}/{name}"), &err)
            })
    }

    async fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<KubeEvent, WriteError> {
        let api: Api<KubeEvent> = Api::namespaced(self.client.client(), namespace);
        api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(|err| self.classify(&format!("patch event {namespace}/{name}"), &err))
    }
}

/// The client-side token bucket on the sink's requests (client-go's `flowcontrol` limiter that the
/// kubelet puts on its event client with `eventRecordQPS` / `eventBurst`). Waits, never refuses.
pub(super) struct RequestLimiter {
    /// Tokens per second and bucket size; `None` when unlimited (`eventRecordQPS` 0).
    rate: Option<(f64, f64)>,
    tokens: f64,
    last: Instant,
}

impl RequestLimiter {
    pub(super) fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: (qps > 0).then(|| (f64::from(qps), burst)),
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token, waiting for one to be refilled when the bucket is empty.
    async fn acquire(&mut self) {
        let Some((qps, burst)) = self.rate else {
            return;
        };
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * qps).min(burst) - 1.0;
        self.last = now;
        if self.tokens < 0.0 {
            // The debt is what the refill pays back while this request waits.
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / qps)).await;
        }
    }
}

/// The task's state: the correlator's caches and the token bucket.
pub(super) struct Sink<W> {
    writer: W,
    node_name: String,
    correlator: EventCorrelator,
    limiter: RequestLimiter,
}

impl<W: EventWriter> Sink<W> {
    pub(super) fn new(writer: W, node_name: String, limiter: RequestLimiter) -> Self {
        Self {
            writer,
            node_name,
            correlator: EventCorrelator::default(),
            limiter,
        }
    }

    /// Writes the queued events until every sender is gone.
    pub(super) async fn run(mut self, mut queue: mpsc::Receiver<Pending>) {
        while let Some(pending) = queue.recv().await {
            self.record(pending).await;
        }
    }

    async fn record(&mut self, pending: Pending) {
        // The correlator's clock is the time the event happened: an event that waited in the queue
        // while the API server was away still falls in its own aggregation window and budget.
        let now = pending.time;
        let event = make_event(pending, &self.node_name);
        let first_name = event_id(&event);
        let Some(correlated) = self.correlator.correlate(event, now) else {
            tracing::debug!(
                event = first_name,
                "event dropped by the spam filter (too many about its object)"
            );
            return;
        };
        let id = event_id(&correlated.event);
        for attempt in 1..=MAX_TRIES {
            let err = match self.write(&correlated).await {
                Ok(()) => return,
                Err(WriteError::Transport(message)) => message,
                Err(WriteError::Rejected {
                    message,
                    quiet: true,
                }) => {
                    tracing::debug!(
                        event = id,
                        "server rejected event (will not retry): {message}"
                    );
                    return;
                }
                Err(final_error) => {
                    tracing::warn!(
                        event = id,
                        "event not written (will not retry): {final_error}"
                    );
                    return;
                }
            };
            if attempt == MAX_TRIES {
                tracing::warn!(
                    event = id,
                    tries = MAX_TRIES,
                    "dropping an event that could not be sent to the API server: {err}"
                );
                return;
            }
            if attempt == 1 {
                tracing::warn!(
                    event = id,
                    "cannot write event (retrying up to {MAX_TRIES} times): {err}"
                );
            } else {
                tracing::debug!(event = id, attempt, "cannot write event: {err}");
            }
            let delay = if attempt == 1 {
                RETRY_PERIOD.mul_f64(unit_random())
            } else {
                RETRY_PERIOD
            };
            tokio::time::sleep(delay).await;
        }
    }

    /// One try: patch a repeated event (create it when it is gone), create a new one; the API
    /// server's answer updates the correlator.
    async fn write(&mut self, correlated: &Correlated) -> Result<(), WriteError> {
        let event = &correlated.event;
        let repeated = event.count.unwrap_or_default() > 1;
        if let Some(patch) = correlated.patch.as_ref().filter(|_| repeated) {
            self.limiter.acquire().await;
            let namespace = event.metadata.namespace.as_deref().unwrap_or_default();
            let name = event.metadata.name.as_deref().unwrap_or_default();
            match self.writer.patch(namespace, name, patch).await {
                // Deleted or expired (events live an hour) on the server: create it again.
                Err(WriteError::NotFound(_)) => {}
                result => {
                    self.correlator.update_state(&result?);
                    return Ok(());
                }
            }
        }
        let mut event = event.clone();
        event.metadata.resource_version = None;
        self.limiter.acquire().await;
        let created = self.writer.create(&event).await.map_err(|err| match err {
            // Creating is not patching: a missing namespace is a refusal like any other.
            WriteError::NotFound(message) => WriteError::Rejected {
                message,
                quiet: false,
            },
            other => other,
        })?;
        self.correlator.update_state(&created);
        Ok(())
    }
}

/// `makeEvent` + `generateEvent`: the core/v1 Event for `pending`, reported by the kubelet of
/// `node_name`.
fn make_event(pending: Pending, node_name: &str) -> KubeEvent {
    let time = Time(pending.time);
    let namespace = if pending.object.namespace.is_empty() {
        DEFAULT_NAMESPACE.to_owned()
    } else {
        pending.object.namespace.clone()
    };
    KubeEvent {
        metadata: ObjectMeta {
            name: Some(event_name(&pending.object.name, pending.time)),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: pending.object.to_reference(),
        reason: Some(pending.reason),
        message: Some(pending.message),
        first_timestamp: Some(time.clone()),
        last_timestamp: Some(time),
        count: Some(1),
        type_: Some(pending.event_type.as_str().to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: Some(node_name.to_owned()),
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        reporting_instance: Some(node_name.to_owned()),
        ..KubeEvent::default()
    }
}

/// `<namespace>/<name>` for log lines.
fn event_id(event: &KubeEvent) -> String {
    format!(
        "{}/{}",
        event.metadata.namespace.as_deref().unwrap_or_default(),
        event.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A number in [0, 1).
fn unit_random() -> f64 {
    // The top 53 bits fill an f64's mantissa exactly.
    #[allow(clippy::cast_precision_loss, reason = "53 bits convert exactly")]
    let fraction = (random_u64() >> 11) as f64 / (1_u64 << 53) as f64;
    fraction
}

/// A stand-in API server for events: stores what it is sent, answers like the real one (404 for a
/// patch of a missing event, 409 for a second create), and fails on cue.
#[cfg(test)]
pub(super) mod scripted {
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use super::{EventWriter, KubeEvent, Time, Value, WriteError};

    #[derive(Clone, Debug)]
    pub(in crate::events) enum Call {
        Create(Box<KubeEvent>),
        Patch { name: String, patch: Value },
    }

    #[derive(Default)]
    struct State {
        stored: BTreeMap<(String, String), KubeEvent>,
        failures: VecDeque<WriteError>,
        calls: Vec<(tokio::time::Instant, Call)>,
        version: u64,
    }

    #[derive(Clone, Default)]
    pub(in crate::events) struct ScriptedWriter {
        state: Arc<Mutex<State>>,
    }

    impl ScriptedWriter {
        /// The next requests fail with these, in order.
        pub(in crate::events) fn fail_with(&self, failures: impl IntoIterator<Item = WriteError>) {
            self.state.lock().unwrap().failures.extend(failures);
        }

        pub(in crate::events) fn calls(&self) -> Vec<Call> {
            let state = self.state.lock().unwrap();
            state.calls.iter().map(|(_, call)| call.clone()).collect()
        }

        pub(in crate::events) fn call_times(&self) -> Vec<tokio::time::Instant> {
            let state = self.state.lock().unwrap();
            state.calls.iter().map(|(at, _)| *at).collect()
        }

        pub(in crate::events) fn stored(&self) -> Vec<KubeEvent> {
            self.state
                .lock()
                .unwrap()
                .stored
                .values()
                .cloned()
                .collect()
        }

        pub(in crate::events) fn delete_all(&self) {
            self.state.lock().unwrap().stored.clear();
        }

        fn answer(
            &self,
            call: Call,
            store: impl FnOnce(&mut State) -> Result<KubeEvent, WriteError>,
        ) -> Result<KubeEvent, WriteError> {
            let mut state = self.state.lock().unwrap();
            state.calls.push((tokio::time::Instant::now(), call));
            if let Some(failure) = state.failures.pop_front() {
                return Err(failure);
            }
            state.version += 1;
            store(&mut state)
        }
    }

    fn key(namespace: &str, name: &str) -> (String, String) {
        (namespace.to_owned(), name.to_owned())
    }

    impl EventWriter for ScriptedWriter {
        async fn create(&self, event: &KubeEvent) -> Result<KubeEvent, WriteError> {
            self.answer(Call::Create(Box::new(event.clone())), |state| {
                let meta = &event.metadata;
                let key = key(
                    meta.namespace.as_deref().unwrap(),
                    meta.name.as_deref().unwrap(),
                );
                if state.stored.contains_key(&key) {
                    return Err(WriteError::Rejected {
                        message: "already exists".to_owned(),
                        quiet: true,
                    });
                }
                let mut stored = event.clone();
                stored.metadata.resource_version = Some(state.version.to_string());
                state.stored.insert(key, stored.clone());
                Ok(stored)
            })
        }

        async fn patch(
            &self,
            namespace: &str,
            name: &str,
            patch: &Value,
        ) -> Result<KubeEvent, WriteError> {
            let call = Call::Patch {
                name: name.to_owned(),
                patch: patch.clone(),
            };
            self.answer(call, |state| {
                let version = state.version.to_string();
                let stored = state
                    .stored
                    .get_mut(&key(namespace, name))
                    .ok_or_else(|| WriteError::NotFound(format!("event {name} not found")))?;
                stored.count = patch["count"].as_i64().map(|c| i32::try_from(c).unwrap());
                stored.message = patch["message"].as_str().map(str::to_owned);
                let last = patch["lastTimestamp"].as_str().unwrap();
                stored.last_timestamp = Some(Time(last.parse().unwrap()));
                stored.metadata.resource_version = Some(version);
                Ok(stored.clone())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scripted::{Call, ScriptedWriter};
    use super::*;

    fn pod(name: &str) -> InvolvedObject {
        InvolvedObject {
            kind: "Pod".to_owned(),
            api_version: "v1".to_owned(),
            namespace: "shop".to_owned(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            field_path: "spec.containers{app}".to_owned(),
            ..InvolvedObject::default()
        }
    }

    fn pending(object: InvolvedObject, reason: &str, message: &str) -> Pending {
        Pending {
            object,
            event_type: EventType::Warning,
            reason: reason.to_owned(),
            message: message.to_owned(),
            time: Timestamp::now(),
        }
    }

    fn sink(writer: &ScriptedWriter) -> Sink<ScriptedWriter> {
        Sink::new(writer.clone(), "n1".to_owned(), RequestLimiter::new(0, 0))
    }

    fn transport() -> WriteError {
        WriteError::Transport("connection refused".to_owned())
    }

    #[test]
    fn events_are_made_like_the_kubelets() {
        let time = Timestamp::from_second(1_800_000_000).unwrap();
        let mut node = pending(
            InvolvedObject {
                kind: "Node".to_owned(),
                api_version: "v1".to_owned(),
                name: "n1".to_owned(),
                ..InvolvedObject::default()
            },
            "NodeReady",
            "ready",
        );
        node.time = time;
        node.event_type = EventType::Normal;
        let event = make_event(node, "n1");
        assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            event.metadata.name,
            Some(format!("n1.{:x}", time.as_nanosecond()))
        );
        assert_eq!(event.involved_object.namespace, None);
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        assert_eq!(event.count, Some(1));
        assert_eq!(event.first_timestamp, Some(Time(time)));
        assert_eq!(event.last_timestamp, Some(Time(time)));
        let source = event.source.unwrap();
        assert_eq!(source.component.as_deref(), Some("kubelet"));
        assert_eq!(source.host.as_deref(), Some("n1"));
        assert_eq!(event.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(event.reporting_instance.as_deref(), Some("n1"));

        let container = make_event(pending(pod("web"), "BackOff", "m"), "n1");
        assert_eq!(container.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            container.involved_object.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        assert_eq!(container.involved_object.uid.as_deref(), Some("uid-web"));
    }

    #[tokio::test]
    async fn a_repeated_event_is_created_once_and_patched_up_to_the_spam_limit() {
        let writer = ScriptedWriter::default();
        let mut sink = sink(&writer);
        for _ in 0..30 {
            sink.record(pending(pod("web"), "BackOff", "back-off"))
                .await;
        }
        let stored = writer.stored();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].count, Some(25));
        let calls = writer.calls();
        assert_eq!(calls.len(), 25);
        assert!(matches!(calls[0], Call::Create(_)));
        let name = stored[0].metadata.name.clone().unwrap();
        for call in &calls[1..] {
            assert!(
                matches!(call, Call::Patch { name: patched, .. } if *patched == name),
                "{call:?}"
            );
        }
        let Some(Call::Patch { patch, .. }) = calls.last() else {
            panic!("{calls:?}");
        };
        assert_eq!(patch["count"], 25);
        assert_eq!(patch["message"], "back-off");
    }

    #[tokio::test]
    async fn a_patch_of_a_vanished_event_creates_it_again_with_its_count() {
        let writer = ScriptedWriter::default();
        let mut sink = sink(&writer);
        sink.record(pending(pod("web"), "BackOff", "m")).await;
        writer.delete_all();
        sink.record(pending(pod("web"), "BackOff", "m")).await;
        let calls = writer.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(matches!(calls[1], Call::Patch { .. }));
        let Call::Create(recreated) = &calls[2] else {
            panic!("{calls:?}");
        };
        assert_eq!(recreated.count, Some(2));
        assert_eq!(recreated.metadata.resource_version, None);
        assert_eq!(writer.stored()[0].count, Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn transport_errors_are_retried_ten_seconds_apart() {
        let writer = ScriptedWriter::default();
        writer.fail_with([transport(), transport()]);
        let mut sink = sink(&writer);
        let start = Instant::now();
        sink.record(pending(pod("web"), "BackOff", "m")).await;
        assert_eq!(writer.calls().len(), 3);
        assert_eq!(writer.stored().len(), 1);
        let times = writer.call_times();
        // The first wait is randomized below the period, the next ones are the period.
        assert!(times[1] - start < RETRY_PERIOD, "{:?}", times[1] - start);
        assert_eq!(times[2] - times[1], RETRY_PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_is_dropped_after_twelve_tries() {
        let writer = ScriptedWriter::default();
        writer.fail_with(std::iter::repeat_with(transport).take(20));
        let mut sink = sink(&writer);
        sink.record(pending(pod("web"), "BackOff", "m")).await;
        assert_eq!(writer.calls().len(), 12);
        // The next event is tried on its own (and fails until the script runs out).
        sink.record(pending(pod("web"), "Failed", "m")).await;
        assert_eq!(writer.calls().len(), 12 + 9);
        assert_eq!(writer.stored().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_retried() {
        let writer = ScriptedWriter::default();
        writer.fail_with([WriteError::Rejected {
            message: "forbidden".to_owned(),
            quiet: false,
        }]);
        let mut sink = sink(&writer);
        sink.record(pending(pod("web"), "BackOff", "m")).await;
        assert_eq!(writer.calls().len(), 1);
        writer.fail_with([WriteError::Request("bad".to_owned())]);
        sink.record(pending(pod("web"), "Failed", "m")).await;
        assert_eq!(writer.calls().len(), 2);
        assert!(writer.stored().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_the_client_side_rate() {
        let writer = ScriptedWriter::default();
        let mut sink = Sink::new(writer.clone(), "n1".to_owned(), RequestLimiter::new(2, 3));
        let start = Instant::now();
        for i in 0..5 {
            sink.record(pending(pod(&format!("p{i}")), "BackOff", "m"))
                .await;
        }
        let offsets: Vec<Duration> = writer.call_times().iter().map(|t| *t - start).collect();
        let ms = Duration::from_millis;
        assert_eq!(offsets, [ms(0), ms(0), ms(0), ms(500), ms(1000)]);
    }
}
