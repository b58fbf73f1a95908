//! Mirror pods: the read-only copies on the API server through which a cluster sees the static pods
//! of this node (the kubelet's `pkg/kubelet/pod/mirror_client.go`, `tryReconcileMirrorPods` and the
//! orphan-mirror cleanup of `HandlePodCleanups`).
//!
//! A mirror is the static pod with `kubernetes.io/config.mirror` set to its config hash and the Node
//! as its controlling owner. It is created once the Node is registered, re-created when someone
//! deletes it, replaced when the manifest (and so the hash) changes, and deleted when the manifest
//! goes away. The work runs in its own task, woken when the pod sources change and every
//! [`RESYNC_PERIOD`], so a slow API server never holds up a pod's sync.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;

use super::manager::{PodManager, full_name, is_mirror_pod_of};
use crate::apiserver::{ApiClient, is_already_exists, is_conflict, is_not_found};
use crate::podconfig::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, is_static_pod};

/// How often mirrors are checked without a reason (the kubelet checks on every pod sync, at most a
/// minute apart).
const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// Keeps the mirror pods in line with the static pods.
pub struct MirrorPods {
    client: ApiClient,
    pods: PodManager,
    node_name: String,
    node: watch::Receiver<Option<Node>>,
    wake: Arc<Notify>,
}

impl MirrorPods {
    /// `node` carries the registered Node (its UID becomes the mirrors' owner); `wake` is notified
    /// whenever the pod sources changed.
    pub fn new(
        client: ApiClient,
        pods: PodManager,
        node_name: String,
        node: watch::Receiver<Option<Node>>,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            client,
            pods,
            node_name,
            node,
            wake,
        }
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(RESYNC_PERIOD);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.wake.notified() => {}
                changed = self.node.changed() => if changed.is_err() { return },
            }
            Box::pin(self.reconcile()).await;
        }
    }

    /// One pass: every static pod gets its mirror, every mirror without a static pod goes.
    async fn reconcile(&self) {
        let node = self.node.borrow().clone();
        let owner = node.as_ref().and_then(|node| {
            let uid = node.metadata.uid.clone()?;
            node.metadata.deletion_timestamp.is_none().then_some(uid)
        });
        for pod in self
            .pods
            .pods()
            .into_iter()
            .filter(|pod| is_static_pod(pod))
        {
            let existing = self.pods.mirror_by_name(&pod);
            let current = existing.as_ref().is_some_and(|mirror| {
                is_mirror_pod_of(mirror, &pod) && mirror.metadata.deletion_timestamp.is_none()
            });
            if current {
                continue;
            }
            if let Some(stale) = &existing {
                self.delete(stale, "it does not match the static pod").await;
            }
            // Without a registered Node there is no owner to name (the kubelet waits too).
            if let Some(node_uid) = &owner {
                self.create(&pod, node_uid).await;
            }
        }
        for (mirror, owner) in self.pods.mirrors() {
            let same_name_static = self
                .pods
                .pods()
                .into_iter()
                .any(|pod| is_static_pod(&pod) && full_name(&pod) == full_name(&mirror));
            if owner.is_none() && !same_name_static {
                self.delete(&mirror, "its static pod is gone").await;
            }
        }
    }

    async fn create(&self, static_pod: &Pod, node_uid: &str) {
        let mirror = mirror_of(static_pod, &self.node_name, node_uid);
        let (namespace, name) = full_name(static_pod);
        let api: Api<Pod> = Api::namespaced(self.client.client(), &namespace);
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "created the mirror pod"),
            // The watch has not shown it yet, or an older one is still being deleted.
            Err(err) if is_already_exists(&err) => {}
            Err(err) => tracing::warn!(
                "{}",
                self.client
                    .describe(&format!("create mirror pod {namespace}/{name}"), &err)
            ),
        }
    }

    /// Deletes a mirror with its UID as a precondition, so a newer mirror of the same name is safe.
    async fn delete(&self, mirror: &Pod, why: &str) {
        let (namespace, name) = full_name(mirror);
        let api: Api<Pod> = Api::namespaced(self.client.client(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: mirror.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "deleted the mirror pod: {why}");
            }
            Err(err) if is_not_found(&err) || is_conflict(&err) => {}
            Err(err) => tracing::warn!(
                "{}",
                self.client
                    .describe(&format!("delete mirror pod {namespace}/{name}"), &err)
            ),
        }
    }
}

/// The mirror of a static pod: its spec and metadata, the mirror annotation, the Node as owner.
fn mirror_of(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let meta = &static_pod.metadata;
    let mut annotations: BTreeMap<String, String> = meta.annotations.clone().unwrap_or_default();
    if let Some(hash) = annotations.get(CONFIG_HASH_ANNOTATION).cloned() {
        annotations.insert(CONFIG_MIRROR_ANNOTATION.to_owned(), hash);
    }
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node_name.to_owned(),
                uid: node_uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::podconfig::CONFIG_SOURCE_ANNOTATION;

    #[test]
    fn a_mirror_names_its_hash_and_its_node() {
        let static_pod = Pod {
            metadata: ObjectMeta {
                name: Some("etcd-n1".to_owned()),
                namespace: Some("kube-system".to_owned()),
                uid: Some("abc".to_owned()),
                resource_version: Some("7".to_owned()),
                annotations: Some(BTreeMap::from([
                    (CONFIG_HASH_ANNOTATION.to_owned(), "abc".to_owned()),
                    (CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let mirror = mirror_of(&static_pod, "n1", "node-uid");
        let annotations = mirror.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_MIRROR_ANNOTATION], "abc");
        assert_eq!(
            mirror.metadata.uid, None,
            "the API server assigns the mirror's UID"
        );
        assert_eq!(mirror.metadata.resource_version, None);
        let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "n1", "node-uid")
        );
        assert_eq!(owner.controller, Some(true));
        assert!(is_mirror_pod_of(&mirror, &static_pod));
    }
}
