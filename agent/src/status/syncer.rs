//! Writing pod statuses to the API server (the API half of the kubelet's `status.manager`:
//! `syncBatch`, `syncPod`, `mergePodStatus`, `canBeDeleted`).
//!
//! A changed status is patched at once; every [`SYNC_PERIOD`] every pod is looked at again and
//! patched when the API server's copy has drifted from it. The patch is the two-way strategic merge
//! patch from the API's status to the merged one, with the pod's UID in it as a precondition (the API
//! server refuses it for a re-created pod of the same name). The API's status is the watched copy
//! when it already shows this syncer's last write, else a fresh read (see [`StatusSyncer::api_pod`]).
//! A static pod's status goes to its mirror pod. A pod being deleted is deleted for good (grace 0,
//! UID precondition) once its terminal status is on the API server and the agent has finished with
//! it, which ends its graceful deletion.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Map, Value, json};
use tokio::time::MissedTickBehavior;

use super::{StatusManager, is_kubelet_condition, is_shared_condition};
use crate::apiserver::strategic_merge::{diff_maps, normalize};
use crate::apiserver::{ApiClient, is_conflict, is_not_found};
use crate::container::PodUid;
use crate::pod::{PodManager, full_name, is_mirror_pod};

/// How often every status is compared with the API server's (the kubelet's `syncPeriod`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

/// Whether the agent is done with a pod: its containers are stopped and what it held on the node
/// is released (the kubelet's `PodDeletionSafetyProvider`).
pub trait PodDeletionSafety: Send + Sync {
    fn pod_is_finished(&self, uid: &PodUid) -> bool;
}

/// Patches statuses as they change; see the module docs.
pub struct StatusSyncer<S> {
    client: ApiClient,
    status: StatusManager,
    pods: PodManager,
    safety: S,
    /// What was last written for each pod, by status UID.
    synced: HashMap<PodUid, Written>,
}

/// One pod's last write.
struct Written {
    /// The version of the agent's status that was written.
    version: u64,
    /// The status as the API server answered the write: its copy right after it.
    status: Option<ApiPodStatus>,
}

impl<S: PodDeletionSafety> StatusSyncer<S> {
    pub fn new(client: ApiClient, status: StatusManager, pods: PodManager, safety: S) -> Self {
        Self {
            client,
            status,
            pods,
            safety,
            synced: HashMap::new(),
        }
    }

    pub async fn run(mut self) {
        let changed = self.status.changed();
        let mut tick = tokio::time::interval(SYNC_PERIOD);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let all = tokio::select! {
                () = changed.notified() => false,
                _ = tick.tick() => true,
            };
            self.sync_batch(all).await;
        }
    }

    /// `all`: every pod is checked against the API server's copy, not only changed ones.
    async fn sync_batch(&mut self, all: bool) {
        let snapshot = self.status.snapshot();
        if all {
            let live: Vec<PodUid> = snapshot
                .iter()
                .filter_map(|(uid, _, _)| self.pods.status_object(uid))
                .filter_map(|target| target.metadata.uid.clone().map(PodUid::from))
                .collect();
            self.synced.retain(|uid, _| live.contains(uid));
        }
        for (uid, status, version) in snapshot {
            let Some(pod) = self.pods.get(&uid) else {
                continue;
            };
            // A static pod without its mirror yet waits for the mirror.
            let Some(target) = self.pods.status_object(&uid) else {
                continue;
            };
            let Some(target_uid) = target.metadata.uid.clone().map(PodUid::from) else {
                continue;
            };
            let behind = self
                .synced
                .get(&target_uid)
                .is_none_or(|written| written.version < version);
            let deletable = self.can_be_deleted(&pod, &target, &uid);
            let drifted = all && !status_equal(target.status.as_ref(), &status);
            if !(behind || deletable || drifted) {
                continue;
            }
            let written = self.synced.get(&target_uid).and_then(|w| w.status.as_ref());
            if let Some(patched) = self.sync_pod(&target, written, &status).await {
                self.synced.insert(
                    target_uid,
                    Written {
                        version,
                        status: patched.status.clone(),
                    },
                );
                if self.can_be_deleted(&pod, &patched, &uid) {
                    self.delete(&patched).await;
                }
            }
        }
    }

    /// Patches the status against the API server's copy of `target` (`written`: what it answered
    /// this syncer's last write with); returns the pod as the API server has it afterwards.
    async fn sync_pod(
        &self,
        target: &Pod,
        written: Option<&ApiPodStatus>,
        status: &ApiPodStatus,
    ) -> Option<Pod> {
        let (namespace, name) = full_name(target);
        let api: Api<Pod> = Api::namespaced(self.client.client(), &namespace);
        let base = self.api_pod(&api, target, written).await?;
        let merged = merge_pod_status(base.status.as_ref(), status);
        let uid = base.metadata.uid.clone().unwrap_or_default();
        let patch = status_patch(base.status.as_ref(), &merged, &uid);
        if patch == json!({"metadata": {"uid": uid}}) {
            return Some(base.into_owned());
        }
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(pod) => Some(pod),
            Err(err) if is_not_found(&err) => None,
            Err(err) => {
                tracing::warn!(
                    "{}",
                    self.client
                        .describe(&format!("patch the status of pod {namespace}/{name}"), &err)
                );
                None
            }
        }
    }

    /// The copy of `target` to diff the status against. The kubelet reads the pod before every
    /// patch; the watched copy serves instead when it shows this syncer's last write (`written`),
    /// or when there was none: the API server's status then differs from it only by what others
    /// wrote since, which the merge keeps (their conditions) or the periodic drift check repairs.
    /// A watched copy still behind the last write lacks what that write set, so a patch from it
    /// would neither clear those fields (a condition's message, a pod IP) nor send a value that
    /// went back to what the old copy says (Ready False again): then the pod is read afresh, its
    /// UID checked. That read is rare (a pod's status seldom changes again before the watch
    /// brings back the last write, milliseconds later), so the common patch costs one request.
    /// `None` when the pod is gone or was re-created.
    async fn api_pod<'a>(
        &self,
        api: &Api<Pod>,
        target: &'a Pod,
        written: Option<&ApiPodStatus>,
    ) -> Option<Cow<'a, Pod>> {
        if written.is_none_or(|written| target.status.as_ref() == Some(written)) {
            return Some(Cow::Borrowed(target));
        }
        let (namespace, name) = full_name(target);
        match api.get(&name).await {
            Ok(pod) if pod.metadata.uid == target.metadata.uid => Some(Cow::Owned(pod)),
            Ok(_) => {
                tracing::debug!(
                    pod = %format!("{namespace}/{name}"),
                    "pod was deleted and re-created; not patching the status of the old one"
                );
                None
            }
            Err(err) if is_not_found(&err) => None,
            Err(err) => {
                tracing::warn!(
                    "{}",
                    self.client
                        .describe(&format!("get pod {namespace}/{name}"), &err)
                );
                None
            }
        }
    }

    /// The kubelet's `canBeDeleted`: being deleted, not a mirror, terminal on the API server, and
    /// finished on the node.
    fn can_be_deleted(&self, pod: &Pod, api_pod: &Pod, uid: &PodUid) -> bool {
        pod.metadata.deletion_timestamp.is_some()
            && !is_mirror_pod(api_pod)
            && api_pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(is_terminal)
            && self.safety.pod_is_finished(uid)
    }

    async fn delete(&self, pod: &Pod) {
        let (namespace, name) = full_name(pod);
        let api: Api<Pod> = Api::namespaced(self.client.client(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "pod fully terminated and removed from the API server");
            }
            Err(err) if is_not_found(&err) || is_conflict(&err) => {}
            Err(err) => tracing::warn!(
                "{}",
                self.client
                    .describe(&format!("delete pod {namespace}/{name}"), &err)
            ),
        }
    }
}

fn is_terminal(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed")
}

/// The status to send (the kubelet's `mergePodStatus`): the kubelet's conditions from `ours`, every
/// other condition as the API server has it, except that ours of a condition it shares (an
/// eviction's `DisruptionTarget`) replaces theirs when our phase is terminal; a terminal phase on
/// the API server is never undone; a terminal pod is never Ready.
fn merge_pod_status(api: Option<&ApiPodStatus>, ours: &ApiPodStatus) -> ApiPodStatus {
    let mut merged = ours.clone();
    let owned = |c: &&k8s_openapi::api::core::v1::PodCondition| is_kubelet_condition(&c.type_);
    let mut conditions: Vec<_> = api
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| !owned(c))
        .cloned()
        .collect();
    conditions.extend(
        ours.conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(owned)
            .cloned(),
    );
    // A condition the kubelet shares with others replaces theirs once the pod is terminal.
    if ours.phase.as_deref().is_some_and(is_terminal) {
        for shared in ours
            .conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|c| is_shared_condition(&c.type_))
        {
            conditions.retain(|c| c.type_ != shared.type_);
            conditions.push(shared.clone());
        }
    }
    merged.conditions = Some(conditions);
    if let Some(api_phase) = api.and_then(|s| s.phase.as_deref())
        && is_terminal(api_phase)
        && merged.phase.as_deref() != Some(api_phase)
    {
        merged.phase = Some(api_phase.to_owned());
        merged
            .reason
            .clone_from(&api.and_then(|s| s.reason.clone()));
        merged
            .message
            .clone_from(&api.and_then(|s| s.message.clone()));
    }
    if merged.phase.as_deref().is_some_and(is_terminal) {
        for condition in merged.conditions.iter_mut().flatten() {
            if matches!(condition.type_.as_str(), "Ready" | "ContainersReady")
                && condition.status == "True"
            {
                "False".clone_into(&mut condition.status);
                condition.reason = Some("PodCompleted".to_owned());
            }
        }
    }
    merged
}

/// Whether the API server's status says what ours says, as far as the kubelet owns it.
fn status_equal(api: Option<&ApiPodStatus>, ours: &ApiPodStatus) -> bool {
    let merged = merge_pod_status(api, ours);
    // Condition order carries no meaning.
    let comparable = |status: Option<&ApiPodStatus>| {
        let mut status = status.cloned();
        if let Some(conditions) = status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
        serde_json::to_value(status).ok().and_then(normalize)
    };
    comparable(api) == comparable(Some(&merged))
}

/// The merge key of a pod status list that merges element by element.
fn pod_merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["status", "conditions"] => Some("type"),
        ["status", "podIPs" | "hostIPs"] => Some("ip"),
        _ => None,
    }
}

/// The kubelet's `PatchPodStatus`: the two-way strategic merge patch from `{status: old}` to
/// `{metadata: {uid}, status: new}`; the UID makes the API server refuse the patch for another pod.
fn status_patch(old: Option<&ApiPodStatus>, new: &ApiPodStatus, uid: &str) -> Value {
    let as_doc = |status: Option<&ApiPodStatus>| {
        normalize(json!({ "status": status }))
            .and_then(|doc| doc.as_object().cloned())
            .unwrap_or_default()
    };
    let mut patch = diff_maps(&[], &as_doc(old), &as_doc(Some(new)), pod_merge_key);
    let mut metadata = Map::new();
    metadata.insert("uid".to_owned(), Value::String(uid.to_owned()));
    patch.insert("metadata".to_owned(), Value::Object(metadata));
    Value::Object(patch)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use k8s_openapi::api::core::v1::{PodCondition, PodIP};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// An API server that serves one pod: a GET answers `stored`; a PATCH is recorded and makes
    /// `stored` the next scripted status, as if the server had applied it.
    #[derive(Default)]
    struct FakeApi {
        stored: Pod,
        after_patches: VecDeque<ApiPodStatus>,
        /// Method and path of every request, and the body of each PATCH.
        requests: Vec<(String, String)>,
        patches: Vec<Value>,
    }

    const POD_PATH: &str = "/api/v1/namespaces/ns/pods/web";

    fn client(fake: &Arc<Mutex<FakeApi>>) -> ApiClient {
        let fake = Arc::clone(fake);
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let fake = Arc::clone(&fake);
            async move {
                let method = request.method().to_string();
                let path = request.uri().path().to_owned();
                let body = request.into_body().collect().await?.to_bytes();
                let mut fake = fake.lock().unwrap();
                fake.requests.push((method.clone(), path.clone()));
                if method == "PATCH" && path == format!("{POD_PATH}/status") {
                    fake.patches.push(serde_json::from_slice(&body)?);
                    if let Some(status) = fake.after_patches.pop_front() {
                        fake.stored.status = Some(status);
                    }
                } else if !(method == "GET" && path == POD_PATH) {
                    return Err(format!("unexpected request {method} {path}").into());
                }
                let answer = serde_json::to_vec(&fake.stored)?;
                Ok::<_, tower::BoxError>(http::Response::new(Full::new(Bytes::from(answer))))
            }
        });
        ApiClient::with_client(kube::Client::new(service, "ns"))
    }

    struct NeverFinished;

    impl PodDeletionSafety for NeverFinished {
        fn pod_is_finished(&self, _uid: &PodUid) -> bool {
            false
        }
    }

    fn web(uid: &str, status: ApiPodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                namespace: Some("ns".to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            status: Some(status),
            ..Pod::default()
        }
    }

    fn ready(status: &str, message: Option<&str>) -> PodCondition {
        PodCondition {
            message: message.map(str::to_owned),
            ..condition("Ready", status)
        }
    }

    /// A syncer whose pod the watch delivered with `watched` as its status, the API server
    /// holding `stored`.
    fn syncer(
        watched: &ApiPodStatus,
        stored: Pod,
    ) -> (StatusSyncer<NeverFinished>, Arc<Mutex<FakeApi>>, Pod) {
        let fake = Arc::new(Mutex::new(FakeApi {
            stored,
            ..FakeApi::default()
        }));
        let pods = PodManager::default();
        let pod = web("u1", watched.clone());
        pods.upsert(pod.clone());
        let syncer = StatusSyncer::new(client(&fake), StatusManager::new(), pods, NeverFinished);
        (syncer, fake, pod)
    }

    fn requests(fake: &Arc<Mutex<FakeApi>>) -> Vec<String> {
        let fake = fake.lock().unwrap();
        fake.requests
            .iter()
            .map(|(method, _)| method.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_patch_is_diffed_against_a_fresh_read_while_the_watch_is_behind_the_last_write() {
        let scheduled = status("Pending", &[condition("PodScheduled", "True")], &[]);
        let unready = status(
            "Running",
            &[
                condition("PodScheduled", "True"),
                ready("False", Some("containers with unready status: [a]")),
            ],
            &["10.88.0.5"],
        );
        let now_ready = status(
            "Running",
            &[condition("PodScheduled", "True"), ready("True", None)],
            &["10.88.0.5"],
        );
        let (mut syncer, fake, pod) = syncer(&scheduled, web("u1", scheduled.clone()));
        fake.lock()
            .unwrap()
            .after_patches
            .extend([unready.clone(), now_ready.clone()]);

        syncer.status.set_pod_status(&pod, unready.clone());
        syncer.sync_batch(false).await;
        assert_eq!(requests(&fake), ["PATCH"], "nothing written yet: no read");

        // The watch has not delivered that write yet: the pod manager still has `scheduled`.
        syncer.status.set_pod_status(&pod, now_ready);
        syncer.sync_batch(false).await;
        assert_eq!(requests(&fake), ["PATCH", "GET", "PATCH"]);
        let fake = fake.lock().unwrap();
        let sent = &fake.patches[1];
        assert_eq!(sent["metadata"]["uid"], "u1");
        let sent_ready = sent["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(sent_ready["status"], "True");
        assert!(
            sent_ready.as_object().unwrap().contains_key("message")
                && sent_ready["message"].is_null(),
            "the message the last write set is cleared: {sent}"
        );
    }

    #[tokio::test]
    async fn the_watched_copy_is_enough_once_it_shows_the_last_write() {
        let unready = status(
            "Running",
            &[ready("False", Some("containers with unready status: [a]"))],
            &[],
        );
        let now_ready = status("Running", &[ready("True", None)], &[]);
        let (mut syncer, fake, pod) = syncer(&unready, web("u1", unready.clone()));
        fake.lock()
            .unwrap()
            .after_patches
            .extend([unready.clone(), now_ready.clone()]);
        let mut first = unready.clone();
        first.message = Some("first".to_owned());
        syncer.status.set_pod_status(&pod, first);
        syncer.sync_batch(false).await;
        // The watch delivers what the API server answered that write with.
        syncer.pods.upsert(web("u1", unready));
        syncer.status.set_pod_status(&pod, now_ready);
        syncer.sync_batch(false).await;
        assert_eq!(requests(&fake), ["PATCH", "PATCH"]);
        let sent = &fake.lock().unwrap().patches[1];
        assert!(
            sent["status"]["conditions"][0]["message"].is_null(),
            "{sent}"
        );
    }

    #[tokio::test]
    async fn a_re_created_pod_does_not_get_the_old_ones_status() {
        let first = status("Running", &[ready("False", None)], &[]);
        let (mut syncer, fake, pod) = syncer(&first, web("u1", first.clone()));
        let mut written = first.clone();
        written.message = Some("written".to_owned());
        fake.lock().unwrap().after_patches.push_back(written);
        syncer
            .status
            .set_pod_status(&pod, status("Running", &[], &[]));
        syncer.sync_batch(false).await;
        // Deleted and created again with the same name before the watch said so.
        fake.lock().unwrap().stored = web("u2", first);
        syncer
            .status
            .set_pod_status(&pod, status("Running", &[ready("True", None)], &[]));
        syncer.sync_batch(false).await;
        assert_eq!(requests(&fake), ["PATCH", "GET"]);
    }

    fn condition(kind: &str, status: &str) -> PodCondition {
        PodCondition {
            type_: kind.to_owned(),
            status: status.to_owned(),
            ..PodCondition::default()
        }
    }

    fn status(phase: &str, conditions: &[PodCondition], ips: &[&str]) -> ApiPodStatus {
        ApiPodStatus {
            phase: Some(phase.to_owned()),
            conditions: Some(conditions.to_vec()),
            pod_ips: Some(
                ips.iter()
                    .map(|ip| PodIP {
                        ip: (*ip).to_owned(),
                    })
                    .collect(),
            ),
            pod_ip: ips.first().map(|ip| (*ip).to_owned()),
            ..ApiPodStatus::default()
        }
    }

    #[test]
    fn foreign_conditions_survive_and_ours_win() {
        let api = status(
            "Pending",
            &[
                condition("PodScheduled", "True"),
                condition("example.com/gate", "False"),
            ],
            &[],
        );
        let ours = status(
            "Running",
            &[
                condition("PodScheduled", "True"),
                condition("Ready", "True"),
            ],
            &["10.88.0.5"],
        );
        let merged = merge_pod_status(Some(&api), &ours);
        let types: Vec<&str> = merged
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["example.com/gate", "PodScheduled", "Ready"]);
        assert_eq!(merged.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn a_shared_condition_is_sent_with_a_terminal_phase_only() {
        let api = status("Running", &[condition("DisruptionTarget", "False")], &[]);
        let evicted = status("Failed", &[condition("DisruptionTarget", "True")], &[]);
        let merged = merge_pod_status(Some(&api), &evicted);
        let conditions = merged.conditions.unwrap();
        assert_eq!(conditions.len(), 1, "{conditions:?}");
        assert_eq!(conditions[0].status, "True");
        let running = status("Running", &[condition("DisruptionTarget", "True")], &[]);
        let merged = merge_pod_status(Some(&api), &running);
        assert_eq!(merged.conditions.unwrap()[0].status, "False");
    }

    #[test]
    fn a_terminal_phase_on_the_api_server_is_kept_and_is_never_ready() {
        let api = status("Failed", &[], &[]);
        let ours = status("Running", &[condition("Ready", "True")], &[]);
        let merged = merge_pod_status(Some(&api), &ours);
        assert_eq!(merged.phase.as_deref(), Some("Failed"));
        assert_eq!(merged.conditions.unwrap()[0].status, "False");
    }

    #[test]
    fn the_patch_carries_the_uid_and_only_what_changed() {
        let api = status("Pending", &[condition("PodScheduled", "True")], &[]);
        let ours = status(
            "Running",
            &[
                condition("PodScheduled", "True"),
                condition("Ready", "True"),
            ],
            &["10.88.0.5"],
        );
        let patch = status_patch(Some(&api), &ours, "u1");
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["status"]["phase"], "Running");
        assert_eq!(patch["status"]["podIP"], "10.88.0.5");
        assert_eq!(patch["status"]["podIPs"], json!([{"ip": "10.88.0.5"}]));
        assert_eq!(
            patch["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}]),
            "an unchanged condition is not sent"
        );
        assert_eq!(
            status_patch(Some(&ours), &ours, "u1"),
            json!({"metadata": {"uid": "u1"}}),
            "nothing changed: only the precondition"
        );
    }

    #[test]
    fn a_cleared_field_is_sent_as_null() {
        let mut api = status("Pending", &[], &[]);
        api.message = Some("waiting".to_owned());
        let ours = status("Running", &[], &[]);
        let patch = status_patch(Some(&api), &ours, "u1");
        assert_eq!(patch["status"]["message"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("message"));
    }

    #[test]
    fn drift_is_judged_on_what_the_kubelet_owns() {
        let ours = status("Running", &[condition("Ready", "True")], &[]);
        let mut api = ours.clone();
        api.conditions
            .get_or_insert_with(Vec::new)
            .push(condition("example.com/gate", "True"));
        assert!(
            status_equal(Some(&api), &ours),
            "a foreign condition is not drift"
        );
        api.phase = Some("Pending".to_owned());
        assert!(!status_equal(Some(&api), &ours));
    }
}
