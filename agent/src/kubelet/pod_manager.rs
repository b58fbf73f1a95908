//! The desired pods (the kubelet's `pkg/kubelet/pod.Manager`): what the sources say should run on this
//! node, by UID. It is the source of truth for "should this pod exist"; the runtime is the truth for
//! "what exists".

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::Pod;

use crate::container::PodUid;

/// Cloneable handle to the desired pods.
#[derive(Clone, Default)]
pub struct PodManager {
    pods: Arc<RwLock<HashMap<PodUid, Pod>>>,
}

/// The UID of a pod as the agent keys it; pods from the sources always carry one.
pub fn pod_uid(pod: &Pod) -> Option<PodUid> {
    pod.metadata.uid.as_deref().map(PodUid::from)
}

impl PodManager {
    /// Adds or replaces a pod.
    pub fn upsert(&self, pod: Pod) {
        if let Some(uid) = pod_uid(&pod) {
            self.pods
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(uid, pod);
        }
    }

    pub fn remove(&self, uid: &PodUid) -> Option<Pod> {
        self.pods
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid)
    }

    pub fn get(&self, uid: &PodUid) -> Option<Pod> {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// Every desired pod, ordered by namespace and name so listings are stable.
    pub fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }

    pub fn uids(&self) -> HashSet<PodUid> {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
