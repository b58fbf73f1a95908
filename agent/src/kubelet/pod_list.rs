//! `/pods` encoded pod by pod: the JSON of each pod (its spec with the status manager's status) is
//! kept with the pod manager's and the status manager's versions it was made from, and a read
//! encodes again only the pods whose versions moved since the last one. Encoding a whole list took
//! 3.6 ms of every read at a hundred pods and 14.5 ms at three hundred (`bench/results/density.md`),
//! and every exit seen from outside waits for one read.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use crate::container::PodUid;
use crate::pod::{PodManager, VersionedPod};
use crate::status::StatusManager;

/// A `PodList` around the items (the fields `List<Pod>` of k8s-openapi writes).
const LIST_HEAD: &[u8] = br#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":["#;
const LIST_TAIL: &[u8] = b"]}";

/// What the last read made of each pod; readers share it.
#[derive(Default)]
pub struct PodListCache {
    encoded: Mutex<HashMap<PodUid, EncodedPod>>,
}

struct EncodedPod {
    pod_version: u64,
    status_version: Option<u64>,
    json: Vec<u8>,
}

impl EncodedPod {
    fn is_current(&self, pod_version: u64, status_version: Option<u64>) -> bool {
        self.pod_version == pod_version && self.status_version == status_version
    }
}

impl PodListCache {
    /// The desired pods with their statuses as a `PodList` in JSON, ordered by namespace and name.
    ///
    /// A status may move on between reading its version and its content; the pod is then encoded
    /// with the newer content under the older version, which the next read finds outdated and
    /// encodes again, so a current-looking entry is never older than what it claims.
    pub fn encode(&self, pods: &PodManager, status: &StatusManager) -> serde_json::Result<Vec<u8>> {
        let status_versions = status.versions();
        let mut encoded = self.encoded.lock().unwrap_or_else(PoisonError::into_inner);
        let listed = pods.versioned(|uid, version| {
            encoded
                .get(uid)
                .is_none_or(|e| !e.is_current(version, status_versions.get(uid).copied()))
        });
        let previous_len: usize = encoded.values().map(|e| e.json.len() + 1).sum();
        let mut list = Vec::with_capacity(LIST_HEAD.len() + previous_len + LIST_TAIL.len());
        list.extend_from_slice(LIST_HEAD);
        let mut kept = HashMap::with_capacity(listed.len());
        for VersionedPod { uid, version, pod } in listed {
            let entry = match (pod, encoded.remove(&uid)) {
                (Some(desired), _) => {
                    let mut pod = Pod::clone(&desired);
                    pod.status = status.get_pod_status(&uid);
                    EncodedPod {
                        pod_version: version,
                        status_version: status_versions.get(&uid).copied(),
                        json: serde_json::to_vec(&pod)?,
                    }
                }
                (None, Some(current)) => current,
                (None, None) => continue,
            };
            if !kept.is_empty() {
                list.push(b',');
            }
            list.extend_from_slice(&entry.json);
            kept.insert(uid, entry);
        }
        list.extend_from_slice(LIST_TAIL);
        *encoded = kept;
        Ok(list)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::List;
    use k8s_openapi::api::core::v1::{Pod, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
    use serde_json::Value;

    use super::*;
    use crate::kubelet::server_host::pods_with_status;

    fn pod(uid: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn phase(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.to_owned()),
            ..PodStatus::default()
        }
    }

    /// What `k8s-openapi` writes for the same pods, as a value (field order aside).
    fn whole_list(pods: &PodManager, status: &StatusManager) -> Value {
        serde_json::to_value(List {
            items: pods_with_status(pods, status),
            metadata: ListMeta::default(),
        })
        .unwrap()
    }

    fn read(cache: &PodListCache, pods: &PodManager, status: &StatusManager) -> Value {
        serde_json::from_slice(&cache.encode(pods, status).unwrap()).unwrap()
    }

    #[test]
    fn the_list_follows_every_change_of_spec_status_and_membership() {
        let (pods, status, cache) = (
            PodManager::default(),
            StatusManager::new(),
            PodListCache::default(),
        );
        assert_eq!(read(&cache, &pods, &status), whole_list(&pods, &status));

        pods.upsert(pod("b", "web-b"));
        pods.upsert(pod("a", "web-a"));
        assert_eq!(read(&cache, &pods, &status), whole_list(&pods, &status));

        status.set_pod_status(&pod("a", "web-a"), phase("Pending"));
        assert_eq!(read(&cache, &pods, &status), whole_list(&pods, &status));
        status.set_pod_status(&pod("a", "web-a"), phase("Running"));
        let listed = read(&cache, &pods, &status);
        assert_eq!(listed, whole_list(&pods, &status));
        assert_eq!(listed["items"][0]["status"]["phase"], "Running");

        let mut relabelled = pod("b", "web-b");
        relabelled.metadata.labels = Some([("tier".to_owned(), "web".to_owned())].into());
        pods.upsert(relabelled);
        let listed = read(&cache, &pods, &status);
        assert_eq!(listed, whole_list(&pods, &status));
        assert_eq!(listed["items"][1]["metadata"]["labels"]["tier"], "web");

        pods.remove(&PodUid::from("a"));
        let listed = read(&cache, &pods, &status);
        assert_eq!(listed, whole_list(&pods, &status));
        assert_eq!(listed["items"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn an_unchanged_pod_is_not_encoded_again() {
        let (pods, status, cache) = (
            PodManager::default(),
            StatusManager::new(),
            PodListCache::default(),
        );
        pods.upsert(pod("a", "web-a"));
        pods.upsert(pod("b", "web-b"));
        cache.encode(&pods, &status).unwrap();
        let buffer = |uid: &str| {
            cache.encoded.lock().unwrap()[&PodUid::from(uid)]
                .json
                .as_ptr()
        };
        let (a_before, b_before) = (buffer("a"), buffer("b"));

        status.set_pod_status(&pod("b", "web-b"), phase("Running"));
        cache.encode(&pods, &status).unwrap();
        assert_eq!(buffer("a"), a_before, "a kept its encoding");
        assert_ne!(buffer("b"), b_before, "b was encoded again");
    }
}
