//! Whether a status round changed anything worth posting (the kubelet's `nodeStatusHasChanged`),
//! and the body that posts it: the two-way strategic merge patch `component-helpers`'
//! `PatchNodeStatus` sends to `PATCH /api/v1/nodes/<name>/status`.
//!
//! Strategic, not JSON merge patch, because `status.conditions` is merged by `type` on the server:
//! conditions other components own (`NetworkUnavailable` from the CNI, a node-problem-detector's) are
//! left alone even when this agent read the node before they wrote. A JSON merge patch would
//! replace the whole list. `status.addresses` is also declared merge-by-`type` in the API, which is
//! wrong for two `InternalIP`s, so a changed address list is sent whole with a `$patch: replace`
//! marker, as upstream does. `images`, `volumesInUse` and the other lists are atomic.

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use serde_json::{Map, Value, json};

use super::NodeStatusError;
use crate::apiserver::strategic_merge::{diff_maps, normalize};
use crate::cm::parse_quantity;

/// The `Content-Type` of a [`node_status_patch`] body.
pub const STRATEGIC_MERGE_PATCH_CONTENT_TYPE: &str = "application/strategic-merge-patch+json";

/// Whether `new` differs from `old` in anything but the conditions' heartbeat times. Conditions are
/// compared by type whatever their order; quantities by value (`1Gi` equals `1024Mi`); absent and
/// empty are the same, as in apimachinery's semantic equality.
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let (Ok(old), Ok(new)) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        // Serializing API types does not fail; if it ever did, posting is the safe answer.
        return true;
    };
    comparable(old) != comparable(new)
}

/// The status in a form where equal means semantically equal: heartbeats dropped, conditions
/// sorted by type, quantities as numbers, empty values gone.
fn comparable(mut status: Value) -> Option<Value> {
    if let Some(object) = status.as_object_mut() {
        if let Some(Value::Array(conditions)) = object.get_mut("conditions") {
            for condition in conditions.iter_mut() {
                if let Some(condition) = condition.as_object_mut() {
                    condition.remove("lastHeartbeatTime");
                }
            }
            // Stable, like upstream's sort.SliceStable by type.
            conditions.sort_by(|a, b| a["type"].as_str().cmp(&b["type"].as_str()));
        }
        for list in ["capacity", "allocatable"] {
            if let Some(Value::Object(quantities)) = object.get_mut(list) {
                for value in quantities.values_mut() {
                    if let Some(nanos) = value.as_str().and_then(|text| parse_quantity(text).ok()) {
                        *value = Value::String(nanos.to_string());
                    }
                }
            }
        }
    }
    normalize(status)
}

/// The strategic merge patch from `old` to `new` over the node's labels, annotations and status
/// (the parts the kubelet changes; the status subresource ignores spec). `{}` when nothing changed.
/// Conditions carry `$setElementOrder/conditions` with every type in `new`'s order, and a
/// condition that is gone is sent as `{"$patch": "delete", "type": ...}`.
pub fn node_status_patch(old: &Node, new: &Node) -> Result<Value, NodeStatusError> {
    let old_doc = patchable(old)?;
    let mut new_doc = patchable(new)?;
    let old_addresses = old_doc.pointer("/status/addresses").cloned();
    let new_addresses = new_doc.pointer("/status/addresses").cloned();
    let replace_addresses = old_addresses.is_some() && old_addresses != new_addresses;
    if replace_addresses {
        // Diff as if unchanged, then send the new list whole.
        set_addresses(&mut new_doc, old_addresses);
    }
    let mut patch = match (&old_doc, &new_doc) {
        (Value::Object(old), Value::Object(new)) => diff_maps(&[], old, new, merge_key),
        _ => Map::new(),
    };
    if replace_addresses {
        let mut list = match new_addresses {
            Some(Value::Array(list)) => list,
            _ => Vec::new(),
        };
        list.push(json!({"$patch": "replace"}));
        let status = patch
            .entry("status")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(status) = status.as_object_mut() {
            status.insert("addresses".to_owned(), Value::Array(list));
        }
    }
    Ok(Value::Object(patch))
}

/// `{"metadata": {"labels", "annotations"}, "status"}` of a node, normalized.
fn patchable(node: &Node) -> Result<Value, NodeStatusError> {
    let doc = json!({
        "metadata": {
            "labels": node.metadata.labels,
            "annotations": node.metadata.annotations,
        },
        "status": serde_json::to_value(&node.status).map_err(NodeStatusError::Serialize)?,
    });
    Ok(normalize(doc).unwrap_or_else(|| Value::Object(Map::new())))
}

fn set_addresses(doc: &mut Value, addresses: Option<Value>) {
    if let Some(status) = doc.get_mut("status").and_then(Value::as_object_mut) {
        match addresses {
            Some(addresses) => status.insert("addresses".to_owned(), addresses),
            None => status.remove("addresses"),
        };
    }
}

/// The merge key of a list that is merged element by element, `None` for atomic lists.
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["status", "conditions" | "addresses"] => Some("type"),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn time(seconds: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + seconds).unwrap())
    }

    fn condition(kind: &str, status: &str, heartbeat: i64, transition: i64) -> NodeCondition {
        NodeCondition {
            type_: kind.to_owned(),
            status: status.to_owned(),
            reason: Some(format!("{kind}{status}")),
            message: Some("m".to_owned()),
            last_heartbeat_time: Some(time(heartbeat)),
            last_transition_time: Some(time(transition)),
        }
    }

    fn address(kind: &str, value: &str) -> NodeAddress {
        NodeAddress {
            type_: kind.to_owned(),
            address: value.to_owned(),
        }
    }

    fn node(conditions: Vec<NodeCondition>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(conditions),
                addresses: Some(vec![
                    address("InternalIP", "10.0.0.5"),
                    address("Hostname", "n1"),
                ]),
                capacity: Some(BTreeMap::from([(
                    "memory".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn status(node: &Node) -> &NodeStatus {
        node.status.as_ref().unwrap()
    }

    #[test]
    fn heartbeats_alone_are_no_change() {
        let old = node(vec![
            condition("MemoryPressure", "False", 0, 0),
            condition("Ready", "True", 0, 0),
        ]);
        let new = node(vec![
            condition("Ready", "True", 10, 0),
            condition("MemoryPressure", "False", 10, 0),
        ]);
        assert!(!status_changed(status(&old), status(&new)));
        let mut same_memory = new.clone();
        same_memory.status.as_mut().unwrap().capacity = Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("1024Mi".to_owned()),
        )]));
        same_memory.status.as_mut().unwrap().images = Some(Vec::new());
        assert!(!status_changed(status(&old), status(&same_memory)));
    }

    #[test]
    fn a_transition_a_new_condition_or_a_new_value_is_a_change() {
        let old = node(vec![condition("Ready", "True", 0, 0)]);
        let flipped = node(vec![condition("Ready", "False", 10, 10)]);
        assert!(status_changed(status(&old), status(&flipped)));
        let more = node(vec![
            condition("Ready", "True", 0, 0),
            condition("PIDPressure", "False", 0, 0),
        ]);
        assert!(status_changed(status(&old), status(&more)));
        let mut bigger = old.clone();
        bigger.status.as_mut().unwrap().capacity = Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("2Gi".to_owned()),
        )]));
        assert!(status_changed(status(&old), status(&bigger)));
    }

    #[test]
    fn a_heartbeat_patch_names_conditions_by_type_with_their_order() {
        let old = node(vec![
            condition("MemoryPressure", "False", 0, 0),
            condition("Ready", "True", 0, 0),
        ]);
        let new = node(vec![
            condition("MemoryPressure", "False", 10, 0),
            condition("Ready", "False", 10, 10),
        ]);
        let patch = node_status_patch(&old, &new).unwrap();
        assert_eq!(
            patch,
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "Ready"}],
                "conditions": [
                    {"type": "MemoryPressure", "lastHeartbeatTime": "2023-11-14T22:13:30Z"},
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ReadyFalse",
                        "lastHeartbeatTime": "2023-11-14T22:13:30Z",
                        "lastTransitionTime": "2023-11-14T22:13:30Z",
                    },
                ],
            }})
        );
    }

    #[test]
    fn nothing_changed_is_an_empty_patch() {
        let old = node(vec![condition("Ready", "True", 0, 0)]);
        assert_eq!(node_status_patch(&old, &old.clone()).unwrap(), json!({}));
    }

    #[test]
    fn removed_conditions_and_resources_are_deleted_and_labels_merge() {
        let mut old = node(vec![
            condition("Ready", "True", 0, 0),
            condition("OutOfDisk", "False", 0, 0),
        ]);
        old.metadata.labels = Some(BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("gone".to_owned(), "x".to_owned()),
        ]));
        let mut new = node(vec![condition("Ready", "True", 0, 0)]);
        new.metadata.labels = Some(BTreeMap::from([("a".to_owned(), "2".to_owned())]));
        new.status.as_mut().unwrap().capacity = Some(BTreeMap::from([(
            "cpu".to_owned(),
            Quantity("4".to_owned()),
        )]));
        let patch = node_status_patch(&old, &new).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {"labels": {"a": "2", "gone": null}},
                "status": {
                    "$setElementOrder/conditions": [{"type": "Ready"}],
                    "conditions": [{"$patch": "delete", "type": "OutOfDisk"}],
                    "capacity": {"cpu": "4", "memory": null},
                },
            })
        );
    }

    #[test]
    fn changed_addresses_replace_the_whole_list() {
        let old = node(vec![]);
        let mut new = old.clone();
        new.status.as_mut().unwrap().addresses = Some(vec![
            address("InternalIP", "10.0.0.6"),
            address("InternalIP", "fd00::6"),
            address("Hostname", "n1"),
        ]);
        let patch = node_status_patch(&old, &new).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "10.0.0.6"},
                {"type": "InternalIP", "address": "fd00::6"},
                {"type": "Hostname", "address": "n1"},
                {"$patch": "replace"},
            ]}})
        );
        // A first address list is simply added.
        let mut bare = old.clone();
        bare.status.as_mut().unwrap().addresses = None;
        let patch = node_status_patch(&bare, &new).unwrap();
        assert_eq!(patch["status"]["addresses"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn unchanged_dual_stack_addresses_are_no_patch() {
        let mut old = node(vec![]);
        old.status.as_mut().unwrap().addresses = Some(vec![
            address("InternalIP", "10.0.0.6"),
            address("InternalIP", "fd00::6"),
            address("Hostname", "n1"),
        ]);
        assert_eq!(node_status_patch(&old, &old.clone()).unwrap(), json!({}));
    }

    #[test]
    fn images_are_atomic() {
        use k8s_openapi::api::core::v1::ContainerImage;
        let image = |name: &str| ContainerImage {
            names: Some(vec![name.to_owned()]),
            size_bytes: Some(1),
        };
        let mut old = node(vec![]);
        old.status.as_mut().unwrap().images = Some(vec![image("a"), image("b")]);
        let mut new = old.clone();
        new.status.as_mut().unwrap().images = Some(vec![image("b")]);
        let patch = node_status_patch(&old, &new).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"images": [{"names": ["b"], "sizeBytes": 1}]}})
        );
    }

    #[test]
    fn a_reordered_list_sends_only_the_order() {
        let old = node(vec![
            condition("Ready", "True", 0, 0),
            condition("DiskPressure", "False", 0, 0),
        ]);
        let new = node(vec![
            condition("DiskPressure", "False", 0, 0),
            condition("Ready", "True", 0, 0),
        ]);
        assert_eq!(
            node_status_patch(&old, &new).unwrap(),
            json!({"status": {"$setElementOrder/conditions": [{"type": "DiskPressure"}, {"type": "Ready"}]}})
        );
    }
}
