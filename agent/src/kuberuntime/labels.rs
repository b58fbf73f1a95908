//! The labels and annotations the agent puts on CRI sandboxes and containers, and reads back to know
//! which pod and spec a runtime object belongs to (the kubelet's `kuberuntime/labels.go` and the
//! container hash of `pkg/kubelet/container/helpers.go`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::BuildHasher;

use k8s_openapi::api::core::v1::{Container, ContainerPort, LifecycleHandler, Pod};
use sha2::{Digest, Sha256};

use crate::container::PodUid;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Marks objects ringlet created, with the pod's node name as the value: listings, garbage
/// collection and orphan cleanup only ever see this node agent's own sandboxes and containers, even
/// where several agents share one runtime.
pub const MANAGED: &str = "io.kubernetes.ringlet/node";

pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// The container's `preStop` handler (JSON), so a container whose pod spec is gone (deleted while
/// the agent was down) still gets its hook when it is stopped.
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// The container's ports (JSON), for a restored `preStop` `httpGet` that names its port.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";

/// Length of the hex container hash: 64 bits is plenty to detect a spec change.
const HASH_LEN: usize = 16;

/// The pod a runtime object belongs to, read from its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLabels {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
}

fn pod_meta(pod: &Pod) -> (&str, &str, &str) {
    let meta = &pod.metadata;
    (
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default(),
    )
}

/// Labels of a pod's sandbox on `node`: the pod's own labels plus the agent's identity keys.
pub fn sandbox_labels(pod: &Pod, node: &str) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let (name, namespace, uid) = pod_meta(pod);
    labels.insert(POD_NAME.to_owned(), name.to_owned());
    labels.insert(POD_NAMESPACE.to_owned(), namespace.to_owned());
    labels.insert(POD_UID.to_owned(), uid.to_owned());
    labels.insert(MANAGED.to_owned(), node.to_owned());
    labels
}

/// Annotations of a pod's sandbox: the pod's annotations, unchanged.
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Labels of a container on `node`: only identity keys, so label selectors on the runtime stay
/// cheap.
pub fn container_labels(pod: &Pod, container: &str, node: &str) -> HashMap<String, String> {
    let (name, namespace, uid) = pod_meta(pod);
    HashMap::from([
        (POD_NAME.to_owned(), name.to_owned()),
        (POD_NAMESPACE.to_owned(), namespace.to_owned()),
        (POD_UID.to_owned(), uid.to_owned()),
        (CONTAINER_NAME.to_owned(), container.to_owned()),
        (MANAGED.to_owned(), node.to_owned()),
    ])
}

/// Annotations of a container: what the agent needs after a restart to adopt it.
pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (CONTAINER_HASH.to_owned(), container_hash(container)),
        (RESTART_COUNT.to_owned(), restart_count.to_string()),
        (
            TERMINATION_MESSAGE_PATH.to_owned(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".to_owned()),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_owned(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".to_owned()),
        ),
    ]);
    if let Some(grace) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        annotations.insert(TERMINATION_GRACE_PERIOD.to_owned(), grace.to_string());
    }
    let pre_stop = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref());
    if let Some(json) = pre_stop.and_then(|h| serde_json::to_string(h).ok()) {
        annotations.insert(PRE_STOP_HANDLER.to_owned(), json);
    }
    if let Some(json) = container
        .ports
        .as_ref()
        .filter(|p| !p.is_empty())
        .and_then(|p| serde_json::to_string(p).ok())
    {
        annotations.insert(CONTAINER_PORTS.to_owned(), json);
    }
    annotations
}

/// The `preStop` handler and ports a container was created with, if it had a handler.
pub fn pre_stop_handler<S: BuildHasher>(
    annotations: &HashMap<String, String, S>,
) -> Option<(LifecycleHandler, Vec<ContainerPort>)> {
    let handler = serde_json::from_str(annotations.get(PRE_STOP_HANDLER)?).ok()?;
    let ports = annotations
        .get(CONTAINER_PORTS)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    Some((handler, ports))
}

/// A stable hash of the container spec. Equal specs hash equally across agent restarts (the JSON
/// serialisation of k8s-openapi types is deterministic: struct fields in declaration order, maps
/// sorted), so a restarted agent adopts unchanged containers and replaces changed ones. Resources
/// are left out: they change in place (an in-place resize), without a new container.
pub fn container_hash(container: &Container) -> String {
    let hashed = Container {
        resources: None,
        ..container.clone()
    };
    // Serialising a plain data struct cannot fail; an empty input would still hash consistently.
    let json = serde_json::to_vec(&hashed).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let mut hex = String::with_capacity(HASH_LEN);
    for byte in digest.iter().take(HASH_LEN / 2) {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Whether the object carries the agent's managed-by label.
pub fn is_managed<S: BuildHasher>(labels: &HashMap<String, String, S>) -> bool {
    labels.contains_key(MANAGED)
}

/// The pod an object belongs to; `None` for objects without the agent's labels.
pub fn pod_labels<S: BuildHasher>(labels: &HashMap<String, String, S>) -> Option<PodLabels> {
    if !is_managed(labels) {
        return None;
    }
    Some(PodLabels {
        uid: PodUid::new(labels.get(POD_UID)?.clone()),
        name: labels.get(POD_NAME).cloned().unwrap_or_default(),
        namespace: labels.get(POD_NAMESPACE).cloned().unwrap_or_default(),
    })
}

/// The restart count a container was created with (0 when absent or unreadable).
pub fn restart_count<S: BuildHasher>(annotations: &HashMap<String, String, S>) -> u32 {
    annotations
        .get(RESTART_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The pod grace period a container was created with.
pub fn termination_grace_period<S: BuildHasher>(
    annotations: &HashMap<String, String, S>,
) -> Option<i64> {
    annotations
        .get(TERMINATION_GRACE_PERIOD)
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                termination_grace_period_seconds: Some(5),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn container(image: &str) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    #[test]
    fn hash_is_stable_and_changes_with_the_spec() {
        let a = container_hash(&container("busybox"));
        assert_eq!(a.len(), HASH_LEN);
        assert_eq!(a, container_hash(&container("busybox")));
        assert_ne!(a, container_hash(&container("busybox:1.35")));
    }

    #[test]
    fn a_resize_keeps_the_hash() {
        let mut resized = container("busybox");
        resized.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(
                [(
                    "cpu".to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("200m".to_owned()),
                )]
                .into(),
            ),
            ..Default::default()
        });
        assert_eq!(
            container_hash(&container("busybox")),
            container_hash(&resized)
        );
    }

    #[test]
    fn sandbox_labels_identify_the_pod_and_keep_its_labels() {
        let labels = sandbox_labels(&pod(), "node1");
        assert_eq!(labels["app"], "web");
        assert_eq!(
            pod_labels(&labels),
            Some(PodLabels {
                uid: PodUid::from("u1"),
                name: "web".into(),
                namespace: "default".into()
            })
        );
    }

    #[test]
    fn objects_without_the_managed_label_are_not_ours() {
        let mut labels = container_labels(&pod(), "c", "node1");
        assert!(pod_labels(&labels).is_some());
        labels.remove(MANAGED);
        assert_eq!(pod_labels(&labels), None);
    }

    #[test]
    fn annotations_round_trip_restart_count_and_grace_period() {
        let annotations = container_annotations(&pod(), &container("busybox"), 3);
        assert_eq!(restart_count(&annotations), 3);
        assert_eq!(termination_grace_period(&annotations), Some(5));
        assert_eq!(
            annotations[CONTAINER_HASH],
            container_hash(&container("busybox"))
        );
        assert_eq!(restart_count(&HashMap::new()), 0);
        assert_eq!(pre_stop_handler(&annotations), None);
    }

    #[test]
    fn a_pre_stop_handler_and_ports_round_trip() {
        use k8s_openapi::api::core::v1::{HTTPGetAction, Lifecycle};
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

        let handler = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/drain".into()),
                port: IntOrString::String("http".into()),
                ..HTTPGetAction::default()
            }),
            ..LifecycleHandler::default()
        };
        let ports = vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..ContainerPort::default()
        }];
        let c = Container {
            lifecycle: Some(Lifecycle {
                pre_stop: Some(handler.clone()),
                ..Lifecycle::default()
            }),
            ports: Some(ports.clone()),
            ..container("busybox")
        };
        let annotations = container_annotations(&pod(), &c, 0);
        assert_eq!(pre_stop_handler(&annotations), Some((handler, ports)));
    }
}
