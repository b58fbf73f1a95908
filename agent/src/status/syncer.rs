//! Writing pod statuses to the API server (the API half of the kubelet's `status.manager`:
//! `syncBatch`, `syncPod`, `mergePodStatus`, `canBeDeleted`).
//!
//! A changed status is patched at once; every [`SYNC_PERIOD`] every pod is looked at again and
//! patched when the API server's copy has drifted from it. The patch is the two-way strategic merge
//! patch from the API's status to the merged one, with the pod's UID in it as a precondition (the API
//! server refuses it for a re-created pod of the same name). A static pod's status goes to its mirror
//! pod. A pod being deleted is deleted for good (grace 0, UID precondition) once its terminal status
//! is on the API server and the agent has finished with it, which ends its graceful deletion.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Map, Value, json};
use tokio::time::MissedTickBehavior;

use super::StatusManager;
use crate::apiserver::strategic_merge::{diff_maps, normalize};
use crate::apiserver::{ApiClient, is_conflict, is_not_found};
use crate::container::PodUid;
use crate::pod::{PodManager, full_name, is_mirror_pod};

/// How often every status is compared with the API server's (the kubelet's `syncPeriod`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

/// The pod conditions the kubelet owns; the API server's others (readiness gates, disruption
/// targets) are kept as they are.
const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodResizeInProgress",
    "PodResizePending",
];

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
    /// The version of each pod's status last written, by status UID.
    synced: HashMap<PodUid, u64>,
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
            let behind = self.synced.get(&target_uid).is_none_or(|v| *v < version);
            let deletable = self.can_be_deleted(&pod, &target, &uid);
            let drifted = all && !status_equal(target.status.as_ref(), &status);
            if !(behind || deletable || drifted) {
                continue;
            }
            if let Some(patched) = self.sync_pod(&target, &status).await {
                self.synced.insert(target_uid, version);
                if self.can_be_deleted(&pod, &patched, &uid) {
                    self.delete(&patched).await;
                }
            }
        }
    }

    /// Patches the status; returns the pod as the API server has it afterwards.
    async fn sync_pod(&self, target: &Pod, status: &ApiPodStatus) -> Option<Pod> {
        let (namespace, name) = full_name(target);
        let merged = merge_pod_status(target.status.as_ref(), status);
        let uid = target.metadata.uid.clone().unwrap_or_default();
        let patch = status_patch(target.status.as_ref(), &merged, &uid);
        if patch == json!({"metadata": {"uid": uid}}) {
            return Some(target.clone());
        }
        let api: Api<Pod> = Api::namespaced(self.client.client(), &namespace);
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
/// other condition as the API server has it; a terminal phase on the API server is never undone;
/// a terminal pod is never Ready.
fn merge_pod_status(api: Option<&ApiPodStatus>, ours: &ApiPodStatus) -> ApiPodStatus {
    let mut merged = ours.clone();
    let owned = |c: &&k8s_openapi::api::core::v1::PodCondition| {
        KUBELET_CONDITIONS.contains(&c.type_.as_str())
    };
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
    use k8s_openapi::api::core::v1::{PodCondition, PodIP};

    use super::*;

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
