//! The two-way strategic merge patch apimachinery computes (`strategicpatch.CreateTwoWayMergePatch`)
//! for the objects the agent patches (node status, pod status): maps are diffed key by key (a
//! removed key becomes `null`), lists the API declares merge-by-key are diffed element by element
//! with `$setElementOrder` and `$patch: delete` directives, other lists are replaced whole. Which
//! lists merge, and by which key, the caller says through a [`MergeKeys`] table.

use serde_json::{Map, Value, json};

/// The merge key of the list at a path (`["status", "conditions"]` -> `"type"`), `None` for lists
/// that are replaced whole.
pub type MergeKeys = fn(&[&str]) -> Option<&'static str>;

/// One merge-by-key list being diffed: its field name, its merge key, and the table for the lists
/// nested in its elements.
#[derive(Clone, Copy)]
struct ListDiff<'a> {
    field: &'a str,
    list_key: &'static str,
    merge_key: MergeKeys,
}

/// Drops nulls, empty strings, lists and objects, as Go's `omitempty` leaves them out, so absent
/// and empty compare equal and diff to nothing.
pub fn normalize(value: Value) -> Option<Value> {
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

/// apimachinery's `diffMaps`: new and changed keys with their new values (maps recursively),
/// removed keys as null.
pub fn diff_maps(
    path: &[&str],
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    merge_key: MergeKeys,
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
                let nested = diff_maps(&child, old_fields, new_fields, merge_key);
                if !nested.is_empty() {
                    diff.insert(key.clone(), Value::Object(nested));
                }
            }
            (Value::Array(old_items), Value::Array(new_items)) => match merge_key(&child) {
                Some(list_key) => diff_merge_list(
                    &child,
                    ListDiff {
                        field: key,
                        list_key,
                        merge_key,
                    },
                    old_items,
                    new_items,
                    &mut diff,
                ),
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
    list: ListDiff<'_>,
    old: &[Value],
    new: &[Value],
    out: &mut Map<String, Value>,
) {
    let ListDiff {
        field,
        list_key: merge_key,
        merge_key: merge_keys,
    } = list;
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
                    let mut nested = diff_maps(path, old_fields, new_fields, merge_keys);
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
