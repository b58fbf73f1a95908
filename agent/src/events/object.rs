//! What an event is about: a typed reference to an API object (a pod, one of its containers, the
//! node), the kubelet's `v1.ObjectReference` built by client-go's `tools/reference` and by
//! `pkg/kubelet/container/ref.go` (`GenerateContainerRef`), or a thing that is no API object (a
//! manifest file or URL of the file/http pod sources), which is logged but never sent.

use std::fmt;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

/// The field path of a container the pod spec does not name (`ImplicitContainerPrefix`).
const IMPLICIT_CONTAINER_PREFIX: &str = "implicitly required container ";

/// The subject of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventObject {
    /// An object of the API: the event also goes to the API server once the recorder is connected.
    Api(InvolvedObject),
    /// Not an API object, e.g. `file//etc/kubernetes/manifests/web.yaml` or `http/<url>`: the API
    /// server has nothing to attach such an event to, so it stays in the log, the ring and
    /// `events.log`.
    Local(String),
}

/// `involvedObject` of a core/v1 Event. Empty strings are fields left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InvolvedObject {
    pub kind: String,
    pub api_version: String,
    /// Empty for cluster-scoped objects (the node); the event then lands in `default`.
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// `spec.containers{name}` and the like when the event is about one container of a pod.
    pub field_path: String,
}

impl EventObject {
    /// The pod itself.
    pub fn pod(pod: &Pod) -> Self {
        Self::Api(pod_reference(pod, String::new()))
    }

    /// One container of `pod`, by name: init, app or ephemeral, as the kubelet points
    /// `kubectl describe pod` at it.
    pub fn container(pod: &Pod, container: &str) -> Self {
        Self::Api(pod_reference(pod, container_field_path(pod, container)))
    }

    /// The node (kind `Node`, no namespace and, like the kubelet's `nodeRef`, no UID).
    pub fn node(name: &str) -> Self {
        Self::Api(InvolvedObject {
            kind: "Node".to_owned(),
            api_version: "v1".to_owned(),
            name: name.to_owned(),
            ..InvolvedObject::default()
        })
    }

    /// Something that is not an API object; `what` is shown as it is.
    pub fn local(what: impl Into<String>) -> Self {
        Self::Local(what.into())
    }
}

impl InvolvedObject {
    /// The reference as the API carries it.
    pub fn to_reference(&self) -> ObjectReference {
        let field = |value: &str| (!value.is_empty()).then(|| value.to_owned());
        ObjectReference {
            kind: field(&self.kind),
            api_version: field(&self.api_version),
            namespace: field(&self.namespace),
            name: field(&self.name),
            uid: field(&self.uid),
            resource_version: field(&self.resource_version),
            field_path: field(&self.field_path),
        }
    }
}

/// The names `events.log` and the agent's log have always used: `pod/<ns>/<name>` (for a container
/// too, the container is in the message), `node/<name>`, or the local name as given.
impl fmt::Display for EventObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Api(object) if object.kind == "Pod" => {
                write!(f, "pod/{}/{}", object.namespace, object.name)
            }
            Self::Api(object) if object.namespace.is_empty() => {
                write!(f, "{}/{}", object.kind.to_lowercase(), object.name)
            }
            Self::Api(object) => write!(
                f,
                "{}/{}/{}",
                object.kind.to_lowercase(),
                object.namespace,
                object.name
            ),
            Self::Local(what) => f.write_str(what),
        }
    }
}

fn pod_reference(pod: &Pod, field_path: String) -> InvolvedObject {
    let meta = &pod.metadata;
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    InvolvedObject {
        kind: "Pod".to_owned(),
        api_version: "v1".to_owned(),
        namespace: text(&meta.namespace),
        name: text(&meta.name),
        uid: text(&meta.uid),
        resource_version: text(&meta.resource_version),
        field_path,
    }
}

/// `spec.containers{name}`, `spec.initContainers{name}` or `spec.ephemeralContainers{name}`
/// (`[i]` for an unnamed one), or the implicit form for a container the spec does not have.
fn container_field_path(pod: &Pod, name: &str) -> String {
    let Some(spec) = &pod.spec else {
        return format!("{IMPLICIT_CONTAINER_PREFIX}{name}");
    };
    let lists: [(&str, Vec<&str>); 3] = [
        (
            "containers",
            spec.containers.iter().map(|c| c.name.as_str()).collect(),
        ),
        (
            "initContainers",
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect(),
        ),
        (
            "ephemeralContainers",
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect(),
        ),
    ];
    for (list, names) in lists {
        if let Some(i) = names.iter().position(|n| *n == name) {
            return if name.is_empty() {
                format!("spec.{list}[{i}]")
            } else {
                format!("spec.{list}{{{name}}}")
            };
        }
    }
    format!("{IMPLICIT_CONTAINER_PREFIX}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "7" },
            "spec": {
                "initContainers": [{ "name": "setup" }],
                "containers": [{ "name": "app" }, { "name": "" }],
                "ephemeralContainers": [{ "name": "debug" }],
            },
        }))
        .unwrap()
    }

    fn reference(object: &EventObject) -> &InvolvedObject {
        match object {
            EventObject::Api(reference) => reference,
            EventObject::Local(what) => panic!("not an API object: {what}"),
        }
    }

    #[test]
    fn a_pod_reference_carries_kind_uid_and_resource_version() {
        let object = EventObject::pod(&pod());
        let reference = reference(&object);
        assert_eq!(reference.kind, "Pod");
        assert_eq!(reference.api_version, "v1");
        assert_eq!(reference.uid, "u-1");
        assert_eq!(reference.resource_version, "7");
        assert_eq!(reference.field_path, "");
        assert_eq!(reference.to_reference().field_path, None);
        assert_eq!(object.to_string(), "pod/shop/web");
    }

    #[test]
    fn container_references_name_the_list_the_container_is_in() {
        let path = |name: &str| {
            reference(&EventObject::container(&pod(), name))
                .field_path
                .clone()
        };
        assert_eq!(path("app"), "spec.containers{app}");
        assert_eq!(path(""), "spec.containers[1]");
        assert_eq!(path("setup"), "spec.initContainers{setup}");
        assert_eq!(path("debug"), "spec.ephemeralContainers{debug}");
        assert_eq!(path("gone"), "implicitly required container gone");
        // The log keeps naming the pod: the container is in the message.
        assert_eq!(
            EventObject::container(&pod(), "app").to_string(),
            "pod/shop/web"
        );
    }

    #[test]
    fn node_and_local_objects() {
        let node = EventObject::node("n1");
        assert_eq!(reference(&node).kind, "Node");
        assert_eq!(reference(&node).namespace, "");
        assert_eq!(reference(&node).uid, "");
        assert_eq!(node.to_string(), "node/n1");
        assert_eq!(
            EventObject::local("file//m/a.yaml").to_string(),
            "file//m/a.yaml"
        );
    }
}
