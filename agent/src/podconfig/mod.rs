//! Pod configuration: the sources that tell the agent which pods should run on this node (a manifest
//! directory, a manifest URL, the API server) and the merger that turns each source's full
//! current set into minimal, ordered ADD / UPDATE / REMOVE / RECONCILE / DELETE notifications.
//! Corresponds to the kubelet's `pkg/kubelet/config` (`PodConfig`, `podStorage` in incremental mode,
//! `sourceFile`, `sourceURL`, `applyDefaults`) and `SourcesReady`.

mod apiserver;
pub(crate) mod depth;
mod file;
mod http;
mod manifest;
#[cfg(test)]
mod proptests;
mod report;
mod storage;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::apiserver::ApiClient;
use crate::error_chain::error_chain;
use crate::events::{EventObject, EventType, Recorder};

use apiserver::ApiServerSource;
use file::FileSource;
use http::HttpSource;
use storage::PodStorage;

/// The annotation holding the hash (= UID) a static pod was given from its manifest.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// The annotation naming the source a pod came from (`file`, `http` or `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The annotation holding the RFC 3339 time the config layer first saw a pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// The annotation a mirror pod carries on the API server (never set by the sources here).
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Event reason for a manifest that cannot be read or decoded.
pub const REASON_FAILED_TO_PARSE_MANIFEST: &str = "FailedToParseManifest";
/// Event reason for a decoded pod that is rejected (invalid, or a duplicate name).
pub const REASON_FAILED_VALIDATION: &str = "FailedValidation";
/// Event reason for a manifest URL that cannot be fetched.
pub const REASON_FAILED_TO_FETCH_MANIFEST: &str = "FailedToFetchManifest";

/// Used when a check frequency of zero is configured: tokio intervals cannot tick every 0 s.
const DEFAULT_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// Sources block on a full channel, so a slow consumer slows the rescans down instead of piling up.
const SOURCE_CHANNEL_CAPACITY: usize = 8;
const UPDATE_CHANNEL_CAPACITY: usize = 64;

/// What a `PodUpdate` asks the sync loop to do with its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodOperation {
    /// Pods the agent has not seen before from this source.
    Add,
    /// Pods whose spec, labels or annotations changed.
    Update,
    /// Pods that vanished from their source: stop and forget them.
    Remove,
    /// Pods whose desired state is unchanged but whose status differs from what the source sent.
    Reconcile,
    /// Pods that gained a deletion timestamp: terminate them gracefully.
    Delete,
}

/// Where a pod came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodSource {
    File,
    Http,
    ApiServer,
}

impl PodSource {
    /// Bit in the `SourcesReady` mask.
    fn bit(self) -> u8 {
        match self {
            Self::File => 1,
            Self::Http => 2,
            Self::ApiServer => 4,
        }
    }
}

impl fmt::Display for PodSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::File => "file",
            Self::Http => "http",
            Self::ApiServer => "api",
        })
    }
}

/// One notification from the merger: an operation on some pods of one source. The pods are the
/// merger's own copies, shared: the pod manager and the pod workers keep them, not copies of them.
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    pub op: PodOperation,
    pub pods: Vec<Arc<Pod>>,
    pub source: PodSource,
}

/// Whether a pod came from a manifest (file or http) rather than the API server.
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|source| source != "api")
}

/// How the pod sources are configured (`--pod-manifest-path`, `--file-check-frequency`,
/// `--manifest-url`, `--manifest-url-header`, `--http-check-frequency`). An empty path or URL counts
/// as not configured, as in the kubelet.
#[derive(Clone, Debug)]
pub struct PodConfigOptions {
    pub node_name: String,
    pub manifest_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub manifest_url: Option<String>,
    pub manifest_url_headers: HashMap<String, Vec<String>>,
    pub http_check_frequency: Duration,
    /// The API server, whose pods bound to this node are the third source.
    pub api_server: Option<ApiClient>,
}

#[derive(Debug, thiserror::Error)]
pub enum PodConfigError {
    #[error("reading manifest {path}")]
    ReadManifest {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listing manifest directory {path}")]
    ListManifests {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("manifest is {size} bytes, more than the {limit} bytes a manifest may have")]
    TooLarge { size: u64, limit: usize },
    #[error(
        "manifest nests deeper than {limit} levels (at line {line}, column {column}); no pod nests that deep"
    )]
    TooDeep {
        limit: usize,
        line: usize,
        column: usize,
    },
    #[error("manifest is not valid UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("parsing yaml document {index}")]
    ParseYaml {
        index: usize,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("parsing json document {index}")]
    ParseJson {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "document {index}: expected apiVersion v1 and kind {expected}, found apiVersion {api_version:?} kind {kind:?}"
    )]
    WrongKind {
        index: usize,
        expected: &'static str,
        api_version: String,
        kind: String,
    },
    #[error("document {index}: decoding a v1 Pod")]
    DecodePod {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding pod {pod} to derive its uid")]
    EncodePod {
        pod: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("pod {pod} is invalid: {reason}")]
    InvalidPod { pod: String, reason: String },
    #[error("pod {pod} is defined more than once; keeping the one from {kept}")]
    DuplicatePod { pod: String, kept: String },
    #[error("manifest url {url:?} is not a valid uri")]
    InvalidUrl {
        url: String,
        #[source]
        source: ::http::uri::InvalidUri,
    },
    #[error(
        "manifest url {url:?}: scheme {scheme:?} is not supported yet (only http:// manifest urls are)"
    )]
    UnsupportedUrlScheme { url: String, scheme: String },
    #[error("manifest url header {name:?}: {reason}")]
    InvalidHeader { name: String, reason: String },
    #[error("building the request for {url}")]
    BuildRequest {
        url: String,
        #[source]
        source: ::http::Error,
    },
    #[error("fetching {url}")]
    Fetch {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("fetching {url}: no answer within {timeout:?}")]
    FetchTimeout { url: String, timeout: Duration },
    #[error("fetching {url}: status {status}")]
    HttpStatus {
        url: String,
        status: ::http::StatusCode,
    },
    #[error("reading the body from {url}")]
    ReadBody {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Checks that a `--manifest-url` can be polled, so configuration validation can reject it early.
pub fn validate_manifest_url(url: &str) -> Result<(), PodConfigError> {
    http::parse_url(url).map(|_| ())
}

/// Tells whether every configured source has delivered its first set of pods and the consumer has
/// received the updates that came of it. Until then the agent must not treat a running pod as
/// orphaned just because it has not heard of it yet (the kubelet's `SourcesReady`).
#[derive(Clone, Debug)]
pub struct SourcesReady {
    inner: Arc<ReadyInner>,
}

#[derive(Debug)]
struct ReadyInner {
    expected: u8,
    /// Sources whose first update the merger has put into the channel.
    seen: AtomicU8,
    /// Once ready, always ready, even while later updates wait in the channel.
    latched: AtomicBool,
    /// Only used to see whether the consumer has drained the channel.
    updates: mpsc::Sender<PodUpdate>,
}

impl SourcesReady {
    fn new(expected: &[PodSource], updates: mpsc::Sender<PodUpdate>) -> Self {
        Self {
            inner: Arc::new(ReadyInner {
                expected: expected.iter().fold(0, |mask, source| mask | source.bit()),
                seen: AtomicU8::new(0),
                latched: AtomicBool::new(false),
                updates,
            }),
        }
    }

    /// Called by the merger right after it sent a source's update, with no await in between, so on
    /// the agent's single-threaded runtime the consumer cannot receive it before this runs.
    fn mark_seen(&self, source: PodSource) {
        self.inner.seen.fetch_or(source.bit(), Ordering::SeqCst);
    }

    /// True once every configured source has delivered at least once and the consumer has received
    /// every update sent so far (so a housekeeping pass gated on this knows all first sets).
    pub fn all_ready(&self) -> bool {
        let inner = &self.inner;
        if inner.latched.load(Ordering::SeqCst) {
            return true;
        }
        let all_seen = inner.seen.load(Ordering::SeqCst) & inner.expected == inner.expected;
        let drained = inner.updates.capacity() == inner.updates.max_capacity();
        let ready = all_seen && drained;
        if ready {
            inner.latched.store(true, Ordering::SeqCst);
        }
        ready
    }
}

/// A source's full current set of pods.
#[derive(Debug)]
struct SourceSet {
    source: PodSource,
    pods: Vec<Pod>,
}

/// Starts the configured sources and the merger as tokio tasks (call it inside the agent's runtime).
/// The receiver yields the merged updates; it ends only if the runtime shuts down.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the agent hands over its recorder handle; every source keeps a clone of it"
)]
pub fn start(
    options: PodConfigOptions,
    recorder: Recorder,
) -> (mpsc::Receiver<PodUpdate>, SourcesReady) {
    let (set_tx, set_rx) = mpsc::channel(SOURCE_CHANNEL_CAPACITY);
    let (update_tx, update_rx) = mpsc::channel(UPDATE_CHANNEL_CAPACITY);
    let mut expected = Vec::new();

    if let Some(path) = options.manifest_path.filter(|p| !p.as_os_str().is_empty()) {
        expected.push(PodSource::File);
        let period = check_frequency(options.file_check_frequency, "file");
        let source = FileSource::new(path, options.node_name.clone(), recorder.clone());
        tokio::spawn(source.run(period, set_tx.clone()));
    }
    if let Some(url) = options.manifest_url.filter(|u| !u.is_empty()) {
        expected.push(PodSource::Http);
        let period = check_frequency(options.http_check_frequency, "http");
        match HttpSource::new(
            &url,
            &options.manifest_url_headers,
            options.node_name.clone(),
            recorder.clone(),
        ) {
            Ok(source) => {
                tokio::spawn(source.run(period, set_tx.clone()));
            }
            // The source stays not-ready, like an unreachable URL: pods it may have started before
            // a restart are not treated as orphans.
            Err(err) => recorder.event(
                EventType::Warning,
                EventObject::local(format!("http/{url}")),
                REASON_FAILED_TO_FETCH_MANIFEST,
                error_chain(&err),
            ),
        }
    }

    if let Some(client) = options.api_server {
        expected.push(PodSource::ApiServer);
        let source = ApiServerSource::new(client, options.node_name);
        tokio::spawn(source.run(set_tx.clone()));
    }

    let ready = SourcesReady::new(&expected, update_tx.clone());
    tokio::spawn(merge_loop(set_rx, set_tx, update_tx, ready.clone()));
    (update_rx, ready)
}

fn check_frequency(period: Duration, source: &str) -> Duration {
    if period.is_zero() {
        tracing::warn!(
            source,
            default = ?DEFAULT_CHECK_FREQUENCY,
            "check frequency of zero is not usable, using the default"
        );
        DEFAULT_CHECK_FREQUENCY
    } else {
        period
    }
}

/// `keep_open` holds the set channel open when no source is configured (or the http source could
/// not start), so the update channel stays open instead of looking like a shutdown to the consumer.
async fn merge_loop(
    mut sets: mpsc::Receiver<SourceSet>,
    keep_open: mpsc::Sender<SourceSet>,
    updates: mpsc::Sender<PodUpdate>,
    ready: SourcesReady,
) {
    let _keep_open = keep_open;
    let mut storage = PodStorage::default();
    while let Some(set) = sets.recv().await {
        let source = set.source;
        for update in storage.merge(source, set.pods) {
            if updates.send(update).await.is_err() {
                return;
            }
        }
        ready.mark_seen(source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn options(dir: &std::path::Path) -> PodConfigOptions {
        PodConfigOptions {
            node_name: "node1".to_owned(),
            manifest_path: Some(dir.to_path_buf()),
            file_check_frequency: Duration::from_secs(20),
            manifest_url: None,
            manifest_url_headers: HashMap::new(),
            http_check_frequency: Duration::from_secs(20),
            api_server: None,
        }
    }

    #[test]
    fn sources_display_as_the_kubelet_names_them() {
        assert_eq!(PodSource::File.to_string(), "file");
        assert_eq!(PodSource::Http.to_string(), "http");
        assert_eq!(PodSource::ApiServer.to_string(), "api");
    }

    fn update(source: PodSource) -> PodUpdate {
        PodUpdate {
            op: PodOperation::Add,
            pods: Vec::new(),
            source,
        }
    }

    #[tokio::test]
    async fn sources_ready_needs_every_configured_source_and_a_drained_channel() {
        let (tx, mut rx) = mpsc::channel(4);
        let ready = SourcesReady::new(&[PodSource::File, PodSource::Http], tx.clone());
        assert!(!ready.all_ready());

        tx.send(update(PodSource::File)).await.unwrap();
        ready.mark_seen(PodSource::File);
        rx.recv().await.unwrap();
        assert!(!ready.clone().all_ready(), "http has not delivered yet");

        tx.send(update(PodSource::Http)).await.unwrap();
        ready.mark_seen(PodSource::Http);
        assert!(
            !ready.all_ready(),
            "the consumer has not received http's update yet"
        );
        rx.recv().await.unwrap();
        assert!(ready.all_ready());

        tx.send(update(PodSource::Http)).await.unwrap();
        assert!(ready.all_ready(), "readiness is not lost by later updates");

        let (tx, _rx) = mpsc::channel(1);
        assert!(SourcesReady::new(&[], tx).all_ready());
    }

    #[test]
    fn https_manifest_urls_are_rejected_with_a_clear_error() {
        let err = validate_manifest_url("https://example.com/pods").unwrap_err();
        assert!(err.to_string().contains("not supported yet"), "{err}");
        assert!(validate_manifest_url("http://127.0.0.1:1/pods").is_ok());
        assert!(validate_manifest_url("not a url").is_err());
    }

    #[tokio::test]
    async fn start_adds_the_pods_of_a_manifest_directory_and_becomes_ready() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: nginx\n",
        )
        .unwrap();
        let recorder = Recorder::new(None);
        let (mut updates, ready) = start(options(dir.path()), recorder);
        assert!(!ready.all_ready());
        let update = tokio::time::timeout(Duration::from_secs(10), updates.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(update.op, PodOperation::Add);
        assert_eq!(update.source, PodSource::File);
        assert_eq!(update.pods.len(), 1);
        assert_eq!(update.pods[0].metadata.name.as_deref(), Some("web-node1"));
        assert!(is_static_pod(&update.pods[0]));
        assert!(ready.all_ready());
    }

    #[tokio::test]
    async fn an_unsupported_manifest_url_is_an_event_and_the_source_stays_not_ready() {
        let recorder = Recorder::new(None);
        let mut opts = options(std::path::Path::new("/nonexistent"));
        opts.manifest_path = None;
        opts.manifest_url = Some("https://example.com/pods".to_owned());
        let (_updates, ready) = start(opts, recorder.clone());
        let events = recorder.recent();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].object, "http/https://example.com/pods");
        assert!(events[0].message.contains("not supported yet"));
        assert!(!ready.all_ready());
    }
}
