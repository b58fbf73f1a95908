//! The merger: remembers the last set of pods each source sent and turns a new full set into the
//! minimal, ordered notifications the sync loop needs. Corresponds to `podStorage.Merge` in the
//! kubelet's `pkg/kubelet/config/config.go`, incremental notification mode.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION, PodOperation, PodSource, PodUpdate};

#[derive(Default)]
pub(super) struct PodStorage {
    /// Per source that has delivered at least once: its pods in the order it sent them, shared with
    /// the updates that carried them.
    sources: HashMap<PodSource, Vec<Arc<Pod>>>,
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key))
}

/// Whether the desired state differs; `config.seen` is the merger's own bookkeeping, not desired
/// state, and status changes are reconciles, not updates.
fn differ_semantically(existing: &Pod, new: &Pod) -> bool {
    fn without_seen(pod: &Pod) -> BTreeMap<&str, &str> {
        pod.metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(key, _)| key.as_str() != CONFIG_SEEN_ANNOTATION)
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect()
    }
    existing.spec != new.spec
        || existing.metadata.labels != new.metadata.labels
        || existing.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || existing.metadata.deletion_grace_period_seconds
            != new.metadata.deletion_grace_period_seconds
        || without_seen(existing) != without_seen(new)
}

/// The current time in RFC 3339 (UTC, with the fraction of a second when there is one).
fn now_rfc3339() -> String {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    let nanos = i32::try_from(since_epoch.subsec_nanos()).unwrap_or_default();
    Timestamp::new(seconds, nanos)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

fn set_annotation(pod: &mut Pod, key: &str, value: String) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value);
}

impl PodStorage {
    /// Replaces `source`'s pods with `pods` and returns what changed, in the order the sync loop
    /// must apply it: REMOVE, ADD, UPDATE, DELETE, then RECONCILE. A source's first set always
    /// produces at least one (possibly empty) ADD, so the consumer learns the source has spoken.
    pub(super) fn merge(&mut self, source: PodSource, pods: Vec<Pod>) -> Vec<PodUpdate> {
        let first_set = !self.sources.contains_key(&source);
        let mut old: Vec<Option<Arc<Pod>>> = self
            .sources
            .remove(&source)
            .unwrap_or_default()
            .into_iter()
            .map(Some)
            .collect();
        let old_index: HashMap<String, usize> = old
            .iter()
            .enumerate()
            .filter_map(|(i, pod)| pod.as_ref().map(|pod| (uid(pod).to_owned(), i)))
            .collect();

        let (mut adds, mut updates, mut deletes, mut reconciles) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut current = Vec::with_capacity(pods.len());
        let mut seen_uids = HashSet::with_capacity(pods.len());
        for mut pod in pods {
            if uid(&pod).is_empty() || !seen_uids.insert(uid(&pod).to_owned()) {
                tracing::warn!(
                    %source,
                    pod = pod.metadata.name.as_deref().unwrap_or_default(),
                    uid = uid(&pod),
                    "ignoring a pod without a uid or with a uid already in this set"
                );
                continue;
            }
            set_annotation(&mut pod, CONFIG_SOURCE_ANNOTATION, source.to_string());
            let existing = old_index.get(uid(&pod)).and_then(|&i| old[i].take());
            let Some(mut existing) = existing else {
                set_annotation(&mut pod, CONFIG_SEEN_ANNOTATION, now_rfc3339());
                let pod = Arc::new(pod);
                adds.push(Arc::clone(&pod));
                current.push(pod);
                continue;
            };
            if differ_semantically(&existing, &pod) {
                if let Some(seen) = annotation(&existing, CONFIG_SEEN_ANNOTATION) {
                    set_annotation(&mut pod, CONFIG_SEEN_ANNOTATION, seen.clone());
                }
                let pod = Arc::new(pod);
                if pod.metadata.deletion_timestamp.is_some() {
                    deletes.push(Arc::clone(&pod));
                } else {
                    updates.push(Arc::clone(&pod));
                }
                current.push(pod);
            } else {
                if existing.status != pod.status {
                    Arc::make_mut(&mut existing).status = pod.status;
                    reconciles.push(Arc::clone(&existing));
                }
                current.push(existing);
            }
        }
        let removes: Vec<Arc<Pod>> = old.into_iter().flatten().collect();
        self.sources.insert(source, current);

        let signal_first_set =
            first_set && adds.is_empty() && updates.is_empty() && deletes.is_empty();
        let mut out = Vec::new();
        let mut emit = |op, pods: Vec<Arc<Pod>>, even_if_empty: bool| {
            if even_if_empty || !pods.is_empty() {
                out.push(PodUpdate { op, pods, source });
            }
        };
        emit(PodOperation::Remove, removes, false);
        emit(PodOperation::Add, adds, false);
        emit(PodOperation::Update, updates, false);
        emit(PodOperation::Delete, deletes, false);
        emit(PodOperation::Add, Vec::new(), signal_first_set);
        emit(PodOperation::Reconcile, reconciles, false);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(uid: &str, image: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("pod-{uid}")),
                namespace: Some("default".to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_owned(),
                    image: Some(image.to_owned()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOperation, Vec<&str>)> {
        updates
            .iter()
            .map(|u| (u.op, u.pods.iter().map(|pod| uid(pod)).collect()))
            .collect()
    }

    #[test]
    fn the_first_set_is_announced_even_when_empty() {
        let mut storage = PodStorage::default();
        let updates = storage.merge(PodSource::File, vec![]);
        assert_eq!(ops(&updates), vec![(PodOperation::Add, vec![])]);
        assert_eq!(updates[0].source, PodSource::File);
        assert!(storage.merge(PodSource::File, vec![]).is_empty());
        // Another source's first set is announced too.
        assert_eq!(storage.merge(PodSource::Http, vec![]).len(), 1);
    }

    #[test]
    fn add_update_remove_sequence() {
        let mut storage = PodStorage::default();
        let updates = storage.merge(PodSource::File, vec![pod("a", "i:1"), pod("b", "i:1")]);
        assert_eq!(ops(&updates), vec![(PodOperation::Add, vec!["a", "b"])]);
        let added = &updates[0].pods[0];
        let annotations = added.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION], "file");
        let seen = annotations[CONFIG_SEEN_ANNOTATION].clone();
        assert!(seen.parse::<Timestamp>().is_ok(), "{seen}");

        // The same set again: nothing to say.
        assert!(
            storage
                .merge(PodSource::File, vec![pod("a", "i:1"), pod("b", "i:1")])
                .is_empty()
        );

        let updates = storage.merge(PodSource::File, vec![pod("a", "i:2"), pod("c", "i:1")]);
        assert_eq!(
            ops(&updates),
            vec![
                (PodOperation::Remove, vec!["b"]),
                (PodOperation::Add, vec!["c"]),
                (PodOperation::Update, vec!["a"]),
            ]
        );
        let changed = &updates[2].pods[0];
        assert_eq!(
            changed.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("i:2")
        );
        assert_eq!(
            changed.metadata.annotations.as_ref().unwrap()[CONFIG_SEEN_ANNOTATION],
            seen,
            "config.seen stays the time the pod was first seen"
        );

        let updates = storage.merge(PodSource::File, vec![]);
        assert_eq!(ops(&updates), vec![(PodOperation::Remove, vec!["a", "c"])]);
    }

    #[test]
    fn label_and_annotation_changes_are_updates() {
        let mut storage = PodStorage::default();
        storage.merge(PodSource::Http, vec![pod("a", "i")]);
        let mut labelled = pod("a", "i");
        labelled.metadata.labels = Some(BTreeMap::from([("k".to_owned(), "v".to_owned())]));
        let updates = storage.merge(PodSource::Http, vec![labelled.clone()]);
        assert_eq!(ops(&updates), vec![(PodOperation::Update, vec!["a"])]);

        let mut annotated = labelled;
        set_annotation(&mut annotated, "team", "x".to_owned());
        let updates = storage.merge(PodSource::Http, vec![annotated.clone()]);
        assert_eq!(ops(&updates), vec![(PodOperation::Update, vec!["a"])]);

        // A source sending its own config.seen does not make the pod look changed.
        set_annotation(
            &mut annotated,
            CONFIG_SEEN_ANNOTATION,
            "whenever".to_owned(),
        );
        assert!(storage.merge(PodSource::Http, vec![annotated]).is_empty());
    }

    #[test]
    fn a_status_only_change_is_a_reconcile() {
        let mut storage = PodStorage::default();
        storage.merge(PodSource::ApiServer, vec![pod("a", "i")]);
        let mut running = pod("a", "i");
        running.status = Some(PodStatus {
            phase: Some("Running".to_owned()),
            ..PodStatus::default()
        });
        let updates = storage.merge(PodSource::ApiServer, vec![running]);
        assert_eq!(ops(&updates), vec![(PodOperation::Reconcile, vec!["a"])]);
        assert_eq!(
            updates[0].pods[0].status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
    }

    #[test]
    fn gaining_a_deletion_timestamp_is_a_delete() {
        let mut storage = PodStorage::default();
        storage.merge(PodSource::ApiServer, vec![pod("a", "i"), pod("b", "i")]);
        let mut deleted = pod("a", "i");
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        deleted.metadata.deletion_grace_period_seconds = Some(30);
        let updates = storage.merge(PodSource::ApiServer, vec![deleted, pod("b", "i")]);
        assert_eq!(ops(&updates), vec![(PodOperation::Delete, vec!["a"])]);
    }

    #[test]
    fn sources_are_kept_apart() {
        let mut storage = PodStorage::default();
        storage.merge(PodSource::File, vec![pod("a", "i")]);
        let updates = storage.merge(PodSource::Http, vec![pod("b", "i")]);
        assert_eq!(ops(&updates), vec![(PodOperation::Add, vec!["b"])]);
        assert_eq!(updates[0].source, PodSource::Http);
        let updates = storage.merge(PodSource::Http, vec![]);
        assert_eq!(ops(&updates), vec![(PodOperation::Remove, vec!["b"])]);
    }

    #[test]
    fn pods_without_uid_or_with_a_repeated_uid_are_ignored() {
        let mut storage = PodStorage::default();
        let mut no_uid = pod("x", "i");
        no_uid.metadata.uid = None;
        let updates = storage.merge(PodSource::File, vec![pod("a", "i"), no_uid, pod("a", "j")]);
        assert_eq!(ops(&updates), vec![(PodOperation::Add, vec!["a"])]);
        assert_eq!(
            updates[0].pods[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("i")
        );
    }
}
