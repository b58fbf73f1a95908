//! The `apiserver` source: the node's pods (`spec.nodeName=<node>`) watched in the API server
//! through kube-rs's watcher; every pod a watch event delivers is checked against the exits
//! waiting, at the moment the event arrives, and a deleted pod's exits are dropped. This is the
//! kubelet's report as the rest of the cluster sees it (its status update, after the status
//! manager's round trip). Watch failures are logged (once per change), counted and retried with
//! the watcher's back-off.

use std::path::Path;
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};

use super::ObserveError;
use super::health::Health;
use super::lag::{LagTracker, Listing, PodReport};
use crate::apiserver::{ApiClient, ApiClientOptions};
use crate::error_chain::error_chain;
use crate::pleg::monotonic_now_ns;

/// How long one watch request lasts on the server (renewed before an idle connection looks dead).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// The client for `kubeconfig`, else `KUBECONFIG`, else the pod's service account.
pub async fn client(kubeconfig: Option<&Path>) -> Result<ApiClient, ObserveError> {
    let from_env = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty());
    let path = kubeconfig
        .map(Path::to_path_buf)
        .or(from_env.map(Into::into));
    let client = match path {
        Some(path) => ApiClient::from_kubeconfig(&path, ApiClientOptions::default()).await,
        None => ApiClient::in_cluster(ApiClientOptions::default()),
    };
    client.map_err(|source| ObserveError::ApiServer { source })
}

/// Watches the node's pods forever, settling `tracker`'s exits with every pod delivered.
pub async fn run(
    client: ApiClient,
    node_name: String,
    tracker: Arc<LagTracker>,
    health: Arc<Health>,
) {
    let source = tracker.source();
    let pods: Api<Pod> = Api::all(client.watch_client());
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node_name}"))
        .timeout(WATCH_TIMEOUT_SECONDS);
    let mut stream = watcher::watcher(pods, config).default_backoff().boxed();
    let mut last_problem: Option<String> = None;
    loop {
        match stream.try_next().await {
            Ok(Some(event)) => {
                let seen_at = monotonic_now_ns();
                match &event {
                    Event::Apply(pod) | Event::InitApply(pod) => {
                        tracker.settle([&PodReport::from(pod)], Listing::Partial, seen_at);
                    }
                    Event::Delete(pod) => tracker.pod_deleted(&PodReport::from(pod)),
                    Event::Init | Event::InitDone => {
                        tracker.settle([], Listing::Partial, seen_at);
                    }
                }
                if last_problem.take().is_some() {
                    tracing::info!(source = source.label(), "the pod watch works again");
                }
                health.source_ok(source);
            }
            Ok(None) => return,
            Err(err) => {
                let problem = error_chain(&err);
                tracker.count_error();
                if last_problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(source = source.label(), node = %node_name,
                        "watching the node's pods (retrying): {problem}");
                }
                health.source_failed(source, problem.clone());
                last_problem = Some(problem);
            }
        }
    }
}
