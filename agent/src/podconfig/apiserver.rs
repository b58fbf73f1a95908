//! The API server source: the pods bound to this node (`spec.nodeName=<node>`), listed and watched
//! through kube-rs's watcher (resourceVersion, bookmarks, a fresh list after `410 Gone`, back-off
//! while the API server is away). Like the kubelet's `pkg/kubelet/config/apiserver.go` (a reflector
//! feeding an `UndeltaStore`), every change sends the source's full current set to the merger, which
//! turns it into ADD / UPDATE / DELETE / REMOVE / RECONCILE. Nothing is sent before the first
//! complete list, so the source is not ready (and housekeeping kills nothing) until then.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

use super::{PodSource, SourceSet};
use crate::apiserver::ApiClient;

/// How long one watch request lasts on the server. Shorter than the client's silence limit, so an
/// idle watch is renewed before it could be mistaken for a dead connection.
const WATCH_TIMEOUT_SECONDS: u32 = 290;
/// The same failure is logged again only after this long, so an API server that is away for an hour
/// is one line a minute, not one per back-off step.
const REPEAT_LOG_AFTER: Duration = Duration::from_mins(1);

pub(super) struct ApiServerSource {
    client: ApiClient,
    node_name: String,
}

impl ApiServerSource {
    pub(super) fn new(client: ApiClient, node_name: String) -> Self {
        Self { client, node_name }
    }

    /// Watches until the merger goes away. The watcher re-lists on its own after an expired
    /// resourceVersion and backs off exponentially (up to a few minutes) while requests fail.
    pub(super) async fn run(self, sets: mpsc::Sender<SourceSet>) {
        let pods: Api<Pod> = Api::all(self.client.watch_client());
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={}", self.node_name))
            .timeout(WATCH_TIMEOUT_SECONDS);
        let mut stream = watcher::watcher(pods, config).default_backoff().boxed();
        let mut store = Store::default();
        let mut failures = FailureLog::default();
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    failures.recovered();
                    if let Some(pods) = store.apply(event)
                        && sets
                            .send(SourceSet {
                                source: PodSource::ApiServer,
                                pods,
                            })
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                Ok(None) => return,
                Err(err) => failures.failed(&self.client, &self.node_name, &err),
            }
        }
    }
}

/// The pods the watch has delivered, by UID, and the list being built during a (re)list.
#[derive(Default)]
struct Store {
    pods: BTreeMap<String, Pod>,
    listing: Option<BTreeMap<String, Pod>>,
    listed_once: bool,
}

impl Store {
    /// Applies one watch event; returns the full set to send when it changed what the agent knows.
    fn apply(&mut self, event: Event<Pod>) -> Option<Vec<Pod>> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                None
            }
            Event::InitApply(pod) => {
                if let (Some(listing), Some(uid)) = (self.listing.as_mut(), uid(&pod)) {
                    listing.insert(uid, pod);
                }
                None
            }
            Event::InitDone => {
                self.pods = self.listing.take().unwrap_or_default();
                self.listed_once = true;
                Some(self.snapshot())
            }
            Event::Apply(pod) => {
                let uid = uid(&pod)?;
                self.pods.insert(uid, pod);
                self.listed_once.then(|| self.snapshot())
            }
            Event::Delete(pod) => {
                let uid = uid(&pod)?;
                self.pods.remove(&uid)?;
                self.listed_once.then(|| self.snapshot())
            }
        }
    }

    fn snapshot(&self) -> Vec<Pod> {
        self.pods.values().cloned().collect()
    }
}

fn uid(pod: &Pod) -> Option<String> {
    pod.metadata.uid.clone().filter(|uid| !uid.is_empty())
}

/// Logs a watch failure once, then again only when it changes or a minute has passed.
#[derive(Default)]
struct FailureLog {
    last: Option<(String, tokio::time::Instant)>,
}

impl FailureLog {
    fn failed(&mut self, client: &ApiClient, node_name: &str, err: &watcher::Error) {
        let message =
            client.describe_watch(&format!("watch pods with spec.nodeName={node_name}"), err);
        let repeat = self
            .last
            .as_ref()
            .is_some_and(|(last, at)| *last == message && at.elapsed() < REPEAT_LOG_AFTER);
        if !repeat {
            tracing::warn!("{message}; retrying with back-off");
            self.last = Some((message, tokio::time::Instant::now()));
        }
    }

    fn recovered(&mut self) {
        if self.last.take().is_some() {
            tracing::info!("watching the pods bound to this node again");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn nothing_is_sent_before_the_first_complete_list() {
        let mut store = Store::default();
        assert_eq!(store.apply(Event::Init), None);
        assert_eq!(store.apply(Event::InitApply(pod("a", "web"))), None);
        assert_eq!(store.apply(Event::InitApply(pod("b", "db"))), None);
        let first = store.apply(Event::InitDone).unwrap();
        assert_eq!(names(&first), ["web", "db"]);
    }

    #[test]
    fn changes_after_the_list_send_the_whole_set() {
        let mut store = Store::default();
        store.apply(Event::Init);
        store.apply(Event::InitApply(pod("a", "web")));
        store.apply(Event::InitDone);
        let added = store.apply(Event::Apply(pod("b", "db"))).unwrap();
        assert_eq!(names(&added), ["web", "db"]);
        let removed = store.apply(Event::Delete(pod("a", "web"))).unwrap();
        assert_eq!(names(&removed), ["db"]);
        assert_eq!(
            store.apply(Event::Delete(pod("zz", "never-seen"))),
            None,
            "deleting an unknown pod changes nothing"
        );
    }

    #[test]
    fn a_relist_replaces_what_vanished_meanwhile() {
        let mut store = Store::default();
        store.apply(Event::Init);
        store.apply(Event::InitApply(pod("a", "web")));
        store.apply(Event::InitApply(pod("b", "db")));
        store.apply(Event::InitDone);
        // After a 410 Gone the watcher lists again; "a" was deleted while the watch was down.
        store.apply(Event::Init);
        store.apply(Event::InitApply(pod("b", "db")));
        let relisted = store.apply(Event::InitDone).unwrap();
        assert_eq!(names(&relisted), ["db"]);
    }
}
