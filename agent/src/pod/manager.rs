//! The desired pods (the kubelet's `pkg/kubelet/pod.Manager`): what the sources say should run on this
//! node, by UID, and the mirror pods the API server holds for the static ones. It is the source of
//! truth for "should this pod exist"; the runtime is the truth for "what exists".
//!
//! Mirror pods are kept apart: they never run, they only carry a static pod's status to the API
//! server. A mirror belongs to the static pod of the same namespace and name whose
//! `kubernetes.io/config.hash` equals the mirror's `kubernetes.io/config.mirror`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;

use crate::container::PodUid;
use crate::podconfig::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, is_static_pod};

/// Cloneable handle to the desired pods.
#[derive(Clone, Default)]
pub struct PodManager {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<PodUid, Desired>,
    /// Mirror pods by (namespace, name).
    mirrors: HashMap<(String, String), Arc<Pod>>,
    /// The version the next upsert gives its pod.
    next_version: u64,
}

struct Desired {
    /// Shared with the pod config's update that brought it and with the pod's worker.
    pod: Arc<Pod>,
    /// New on every upsert and never given to another pod, so equal versions mean the same object.
    version: u64,
}

/// A desired pod's UID and version, with the pod itself where the reader asked for it.
pub struct VersionedPod {
    pub uid: PodUid,
    pub version: u64,
    pub pod: Option<Arc<Pod>>,
}

/// The UID of a pod as the agent keys it; pods from the sources always carry one.
pub fn pod_uid(pod: &Pod) -> Option<PodUid> {
    pod.metadata.uid.as_deref().map(PodUid::from)
}

/// Whether the pod is a mirror pod (it carries `kubernetes.io/config.mirror`).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// Whether `mirror` is the mirror of `static_pod`: same namespace and name, and its mirror
/// annotation names the static pod's config hash (the kubelet's `IsMirrorPodOf`).
pub fn is_mirror_pod_of(mirror: &Pod, static_pod: &Pod) -> bool {
    full_name(mirror) == full_name(static_pod)
        && annotation(mirror, CONFIG_MIRROR_ANNOTATION).is_some()
        && annotation(mirror, CONFIG_MIRROR_ANNOTATION)
            == annotation(static_pod, CONFIG_HASH_ANNOTATION)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `(namespace, name)` of a pod.
pub fn full_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The order of [`full_name`], without copying the names.
fn by_full_name(a: &Pod, b: &Pod) -> std::cmp::Ordering {
    fn key(pod: &Pod) -> (&str, &str) {
        (
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        )
    }
    key(a).cmp(&key(b))
}

impl PodManager {
    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a pod; mirror pods go to the mirror table.
    pub fn upsert(&self, pod: impl Into<Arc<Pod>>) {
        let pod = pod.into();
        if is_mirror_pod(&pod) {
            self.write().mirrors.insert(full_name(&pod), pod);
        } else if let Some(uid) = pod_uid(&pod) {
            let mut inner = self.write();
            inner.next_version += 1;
            let version = inner.next_version;
            inner.pods.insert(uid, Desired { pod, version });
        }
    }

    /// Removes a pod (or, for a mirror pod, that mirror).
    pub fn remove_pod(&self, pod: &Pod) -> Option<Arc<Pod>> {
        if is_mirror_pod(pod) {
            let mut inner = self.write();
            let name = full_name(pod);
            // Only the mirror with this UID: a re-created mirror may already have replaced it.
            if inner.mirrors.get(&name).map(|mirror| pod_uid(mirror)) == Some(pod_uid(pod)) {
                return inner.mirrors.remove(&name);
            }
            return None;
        }
        self.remove(&pod_uid(pod)?)
    }

    pub fn remove(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.write().pods.remove(uid).map(|desired| desired.pod)
    }

    pub fn get(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.read()
            .pods
            .get(uid)
            .map(|desired| Arc::clone(&desired.pod))
    }

    /// Every desired pod, ordered by namespace and name so listings are stable.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        let mut pods: Vec<Arc<Pod>> = self
            .read()
            .pods
            .values()
            .map(|desired| Arc::clone(&desired.pod))
            .collect();
        pods.sort_by(|a, b| by_full_name(a, b));
        pods
    }

    /// Every desired pod's UID and version, ordered as [`Self::pods`], with a copy of the pod only
    /// where `wanted` asks for it (a reader keeping what it made of earlier versions copies only
    /// the pods that changed), all under one lock.
    pub fn versioned(&self, wanted: impl Fn(&PodUid, u64) -> bool) -> Vec<VersionedPod> {
        let inner = self.read();
        let mut desired: Vec<(&PodUid, &Desired)> = inner.pods.iter().collect();
        desired.sort_by(|(_, a), (_, b)| by_full_name(&a.pod, &b.pod));
        desired
            .into_iter()
            .map(|(uid, desired)| VersionedPod {
                uid: uid.clone(),
                version: desired.version,
                pod: wanted(uid, desired.version).then(|| Arc::clone(&desired.pod)),
            })
            .collect()
    }

    pub fn uids(&self) -> HashSet<PodUid> {
        self.read().pods.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mirror pod the API server holds under the static pod's namespace and name, whether or
    /// not its hash matches.
    pub fn mirror_by_name(&self, static_pod: &Pod) -> Option<Arc<Pod>> {
        self.read().mirrors.get(&full_name(static_pod)).cloned()
    }

    /// Every mirror pod, and the static pod it mirrors when one is desired.
    pub fn mirrors(&self) -> Vec<(Arc<Pod>, Option<Arc<Pod>>)> {
        let inner = self.read();
        inner
            .mirrors
            .values()
            .map(|mirror| {
                let owner = inner
                    .pods
                    .values()
                    .map(|desired| &desired.pod)
                    .find(|pod| is_static_pod(pod) && is_mirror_pod_of(mirror, pod))
                    .cloned();
                (mirror.clone(), owner)
            })
            .collect()
    }

    /// The static pod a mirror pod stands for, if it is desired.
    pub fn static_pod_of(&self, mirror: &Pod) -> Option<Arc<Pod>> {
        self.read()
            .pods
            .values()
            .map(|desired| &desired.pod)
            .find(|pod| is_static_pod(pod) && is_mirror_pod_of(mirror, pod))
            .cloned()
    }

    /// The object on the API server that carries the pod's status: the pod itself for an API pod,
    /// its mirror for a static pod (`None` while the mirror does not exist).
    pub fn status_object(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        let inner = self.read();
        let pod = &inner.pods.get(uid)?.pod;
        if !is_static_pod(pod) {
            return Some(Arc::clone(pod));
        }
        inner
            .mirrors
            .get(&full_name(pod))
            .filter(|mirror| is_mirror_pod_of(mirror, pod))
            .cloned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::podconfig::CONFIG_SOURCE_ANNOTATION;

    fn pod(uid: &str, name: &str, annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                name: Some(name.to_owned()),
                namespace: Some("kube-system".to_owned()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn static_pod(uid: &str, name: &str) -> Pod {
        pod(
            uid,
            name,
            &[
                (CONFIG_SOURCE_ANNOTATION, "file"),
                (CONFIG_HASH_ANNOTATION, uid),
            ],
        )
    }

    fn mirror(uid: &str, name: &str, hash: &str) -> Pod {
        pod(
            uid,
            name,
            &[
                (CONFIG_SOURCE_ANNOTATION, "api"),
                (CONFIG_MIRROR_ANNOTATION, hash),
            ],
        )
    }

    #[test]
    fn mirrors_are_kept_apart_and_carry_their_static_pods_status() {
        let pods = PodManager::default();
        pods.upsert(static_pod("s1", "etcd-n1"));
        assert!(
            pods.status_object(&PodUid::from("s1")).is_none(),
            "no mirror yet"
        );
        pods.upsert(mirror("m1", "etcd-n1", "s1"));
        assert_eq!(pods.len(), 1, "a mirror is not a desired pod");
        assert_eq!(
            pods.status_object(&PodUid::from("s1"))
                .and_then(|m| m.metadata.uid.clone()),
            Some("m1".to_owned())
        );
        assert_eq!(
            pods.static_pod_of(&mirror("m1", "etcd-n1", "s1"))
                .and_then(|p| p.metadata.uid.clone()),
            Some("s1".to_owned())
        );
        let api = pod("a1", "web", &[(CONFIG_SOURCE_ANNOTATION, "api")]);
        pods.upsert(api);
        assert_eq!(
            pods.status_object(&PodUid::from("a1"))
                .and_then(|p| p.metadata.uid.clone()),
            Some("a1".to_owned()),
            "an API pod carries its own status"
        );
    }

    #[test]
    fn a_mirror_of_an_older_manifest_does_not_count() {
        let pods = PodManager::default();
        pods.upsert(static_pod("s2", "etcd-n1"));
        pods.upsert(mirror("m1", "etcd-n1", "s1"));
        assert!(pods.status_object(&PodUid::from("s2")).is_none());
        assert!(pods.mirror_by_name(&static_pod("s2", "etcd-n1")).is_some());
        assert_eq!(pods.mirrors()[0].1, None, "the mirror is an orphan");
    }

    #[test]
    fn every_upsert_gives_a_new_version_and_only_wanted_pods_are_copied() {
        let pods = PodManager::default();
        pods.upsert(pod("b", "web-b", &[]));
        pods.upsert(pod("a", "web-a", &[]));
        let first = pods.versioned(|uid, _| uid.to_string() == "a");
        let names: Vec<_> = first.iter().map(|p| p.uid.to_string()).collect();
        assert_eq!(names, ["a", "b"], "ordered by namespace and name");
        assert!(first[0].pod.is_some() && first[1].pod.is_none());
        assert_ne!(first[0].version, first[1].version);

        pods.upsert(pod("b", "web-b", &[]));
        let second = pods.versioned(|_, _| false);
        assert_eq!(second[0].version, first[0].version, "a is unchanged");
        assert!(second[1].version > first[1].version, "b was upserted again");

        pods.remove(&PodUid::from("b"));
        pods.upsert(pod("b", "web-b", &[]));
        let third = pods.versioned(|_, _| false);
        assert!(
            third[1].version > second[1].version,
            "a re-added pod never reuses a version"
        );
    }

    #[test]
    fn removing_a_mirror_spares_its_replacement() {
        let pods = PodManager::default();
        pods.upsert(mirror("m2", "etcd-n1", "s1"));
        assert!(pods.remove_pod(&mirror("m1", "etcd-n1", "s1")).is_none());
        assert!(pods.remove_pod(&mirror("m2", "etcd-n1", "s1")).is_some());
        assert!(pods.mirrors().is_empty());
    }
}
