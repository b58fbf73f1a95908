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
        (Value::Object(old), Value::Object(new)) => diff_maps(&[], old, new),
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

/// Drops nulls, empty strings, lists and objects, as Go's `omitempty` leaves them out, so absent
/// and empty compare equal and diff to nothing.
fn normalize(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(text) if text.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().filter_map(normalize).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(fields) => {
            let fields: Map<String, Value> = fields
                .into_iter()
                .filter_map(|(key, value)| normalize(value).map(|value| (key, value)))
                .collect();
            (!fields.is_empty()).then_some(Value::Object(fields))
        }
        other => Some(other),
    }
}

/// The merge key of a list that is merged element by element, `None` for atomic lists.
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["status", "conditions" | "addresses"] => Some("type"),
        _ => None,
    }
}

/// apimachinery's `diffMaps`: new and changed keys with their new values (maps recursively),
/// removed keys as null.
fn diff_maps(
    path: &[&str],
    old: &Map<String, Value>,
    new: &Map<String, Value>,
) -> Map<String, Value> {
    let mut diff = Map::new();
    for (key, new_value) in new {
        let Some(old_value) = old.get(key) else {
            diff.insert(key.clone(), new_value.clone());
            continue;
        };
        let mut child = path.to_vec();
        child.push(key);
        match (old_value, new_value) {
            (Value::Object(old_fields), Value::Object(new_fields)) => {
                let nested = diff_maps(&child, old_fields, new_fields);
                if !nested.is_empty() {
                    diff.insert(key.clone(), Value::Object(nested));
                }
            }
            (Value::Array(old_items), Value::Array(new_items)) => match merge_key(&child) {
                Some(merge_key) => {
                    diff_merge_list(&child, key, merge_key, old_items, new_items, &mut diff);
                }
                None if old_items != new_items => {
                    diff.insert(key.clone(), new_value.clone());
                }
                None => {}
            },
            _ if old_value != new_value => {
                diff.insert(key.clone(), new_value.clone());
            }
            _ => {}
        }
    }
    for key in old.keys().filter(|key| !new.contains_key(*key)) {
        diff.insert(key.clone(), Value::Null);
    }
    diff
}

/// apimachinery's `diffListsOfMaps` with `SetElementOrder`: changed elements as their diff plus the
/// merge key, new elements whole, removed ones as delete directives after them, and the full order
/// of `new` whenever anything changed or moved.
fn diff_merge_list(
    path: &[&str],
    field: &str,
    merge_key: &str,
    old: &[Value],
    new: &[Value],
    out: &mut Map<String, Value>,
) {
    let key_of = |item: &Value| item.get(merge_key).cloned().unwrap_or(Value::Null);
    // Elements sharing a key (two InternalIPs) pair up in order of occurrence, as upstream's
    // walk over both lists sorted by key does.
    let occurrence = |list: &[Value], index: usize| {
        let key = key_of(&list[index]);
        list[..index]
            .iter()
            .filter(|item| key_of(item) == key)
            .count()
    };
    let mut entries = Vec::new();
    for (index, new_item) in new.iter().enumerate() {
        let key = key_of(new_item);
        match counterpart(old, merge_key, &key, occurrence(new, index)) {
            Some(old_item) => {
                if let (Value::Object(old_fields), Value::Object(new_fields)) = (old_item, new_item)
                {
                    let mut nested = diff_maps(path, old_fields, new_fields);
                    if !nested.is_empty() {
                        nested.insert(merge_key.to_owned(), key);
                        entries.push(Value::Object(nested));
                    }
                } else if old_item != new_item {
                    entries.push(new_item.clone());
                }
            }
            None => entries.push(new_item.clone()),
        }
    }
    for (index, old_item) in old.iter().enumerate() {
        let key = key_of(old_item);
        if counterpart(new, merge_key, &key, occurrence(old, index)).is_none() {
            entries.push(json!({"$patch": "delete", merge_key: key}));
        }
    }
    let same_order =
        old.len() == new.len() && old.iter().zip(new).all(|(a, b)| key_of(a) == key_of(b));
    if !entries.is_empty() || !same_order {
        let order = new
            .iter()
            .map(|item| json!({ merge_key: key_of(item) }))
            .collect();
        out.insert(format!("$setElementOrder/{field}"), Value::Array(order));
    }
    if !entries.is_empty() {
        out.insert(field.to_owned(), Value::Array(entries));
    }
}

/// The `nth` element of `list` whose merge key is `key`.
fn counterpart<'a>(
    list: &'a [Value],
    merge_key: &str,
    key: &Value,
    nth: usize,
) -> Option<&'a Value> {
    list.iter()
        .filter(|item| item.get(merge_key).unwrap_or(&Value::Null) == key)
        .nth(nth)
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
