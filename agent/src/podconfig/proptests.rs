//! Property tests of the manifest path (issue 14 §3, "Fuzzing"): whatever text a manifest file or
//! URL holds, decoding, defaulting and validation return pods or errors and never panic; the depth
//! pre-scan reads JSON's nesting exactly and never far less nesting than the YAML parser builds; and
//! every pod that passes normalisation has what the rest of the agent relies on. A fixed number of
//! cases with a fixed seed source, so they run in every `cargo test`; a finding becomes a named
//! regression test below.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value};

use super::depth::deepest;
use super::manifest::{Origin, decode_pod, decode_pod_or_list, documents, normalize};

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Findings are kept as regression tests in this file, not in files beside it.
        failure_persistence: None,
        ..Config::default()
    }
}

/// The deepest nesting of a value (a scalar is 0, `[]` is 1).
fn value_depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(fields) => 1 + fields.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn scanned_depth(text: &str) -> usize {
    deepest(text)
}

/// Everything the file and http sources do with a manifest's text, for both kinds of origin.
fn decode_everything(text: &str) {
    let Ok(documents) = documents(text) else {
        return;
    };
    for (index, value) in documents {
        if let Ok(pod) = decode_pod(index, value.clone()) {
            check_normalized(
                pod.clone(),
                Origin::File(Path::new("/etc/manifests/m.yaml")),
            );
            check_normalized(pod, Origin::Http("http://manifests/pods"));
        }
        for pod in decode_pod_or_list(index, value).unwrap_or_default() {
            check_normalized(pod, Origin::Http("http://manifests/pods"));
        }
    }
}

/// A pod that normalises is bound to the node, named, defaulted and valid.
fn check_normalized(pod: k8s_openapi::api::core::v1::Pod, origin: Origin<'_>) {
    let Ok(pod) = normalize(pod, origin, "Node1") else {
        return;
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    assert!(name.ends_with("-node1"), "{name}");
    assert!(
        !pod.metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );
    assert!(!pod.metadata.uid.as_deref().unwrap_or_default().is_empty());
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("Node1"));
    assert!(!spec.containers.is_empty());
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        assert!(container.image_pull_policy.is_some());
        assert!(container.termination_message_path.is_some());
    }
}

/// Pieces of YAML and JSON syntax, so random text exercises the structure rather than plain words.
fn yamlish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("["),
        Just("]"),
        Just("{"),
        Just("}"),
        Just(","),
        Just(": "),
        Just(":"),
        Just("- "),
        Just("-"),
        Just("? "),
        Just("#"),
        Just(" #"),
        Just("\""),
        Just("'"),
        Just("\\"),
        Just("| "),
        Just(">-"),
        Just("&a "),
        Just("*a"),
        Just("!t "),
        Just("!<x> "),
        Just("\n"),
        Just("\n  "),
        Just("\n    "),
        Just(" "),
        Just("\t"),
        Just("a"),
        Just("1"),
        Just("null"),
        Just("---\n"),
        Just("...\n"),
        Just("%YAML 1.1\n"),
        Just("apiVersion: v1\n"),
        Just("kind: Pod\n"),
        Just("kind: PodList\n"),
        Just("metadata:\n  name: web\n"),
        Just("spec:\n  containers:\n  - name: c\n    image: i\n"),
        Just("items: "),
        Just("é"),
    ];
    proptest::collection::vec(piece, 0..48).prop_map(|pieces| pieces.concat())
}

/// Any JSON value, with strings made of the characters that matter to a scanner.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[\\[\\]{}\"'#:,\\\\ \n\ta-z0-9é-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(12, 96, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z\\[\\]{}\"#: ]{0,6}", inner, 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A pod manifest with random values where the defaulting and validation look.
fn pod_value() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        Just(Value::Null),
        Just(Value::from("")),
        Just(Value::from("web")),
        Just(Value::from("Web_1")),
        Just(Value::from("nginx:latest")),
        Just(Value::from("registry:5000/app@sha256:ab")),
        Just(Value::from("Always")),
        Just(Value::from("Never")),
        Just(Value::from("-")),
        Just(Value::from("a".repeat(300))),
        any::<i64>().prop_map(Value::from),
    ];
    let container = (text.clone(), text.clone(), text.clone(), text.clone()).prop_map(
        |(name, image, policy, path)| {
            serde_json::json!({
                "name": name, "image": image, "imagePullPolicy": policy,
                "terminationMessagePath": path,
            })
        },
    );
    let containers = proptest::collection::vec(container, 0..3);
    (
        text.clone(),
        text.clone(),
        text.clone(),
        containers.clone(),
        proptest::option::of(containers),
        text.clone(),
        text.clone(),
        proptest::option::of(any::<i64>()),
        json_value(),
    )
        .prop_map(
            |(name, namespace, uid, containers, init, restart, dns, grace, extra)| {
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace, "uid": uid, "x-extra": extra},
                    "spec": {
                        "containers": containers, "initContainers": init,
                        "restartPolicy": restart, "dnsPolicy": dns,
                        "terminationGracePeriodSeconds": grace,
                        "x-extra": extra,
                    },
                })
            },
        )
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn no_manifest_text_panics(text in yamlish()) {
        decode_everything(&text);
    }

    #[test]
    fn the_prescan_never_reads_far_less_nesting_than_the_yaml_parser_builds(text in yamlish()) {
        use serde::Deserialize;
        let mut deepest = 0;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            match Value::deserialize(document) {
                Ok(value) => deepest = deepest.max(value_depth(&value)),
                Err(_) => break,
            }
        }
        // Block sequences that share their parent's indentation are counted a level low; flow
        // collections, whose depth is what the parser pays for, are counted exactly.
        let scanned = scanned_depth(&text);
        prop_assert!(2 * scanned + 1 >= deepest, "scanned {scanned}, parsed {deepest}: {text:?}");
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn json_nesting_is_scanned_exactly_and_json_decodes_unchanged(value in json_value()) {
        for text in [value.to_string(), serde_json::to_string_pretty(&value).unwrap()] {
            prop_assert_eq!(scanned_depth(&text), value_depth(&value), "{}", text);
            // Top-level scalars take the YAML path (where `null` is an empty document).
            if value.is_array() || value.is_object() {
                let decoded = documents(&text).unwrap();
                prop_assert_eq!(decoded, vec![(1, value.clone())]);
            }
        }
    }

    #[test]
    fn no_pod_value_panics_and_normalised_pods_are_sound(pod in pod_value()) {
        let text = pod.to_string();
        decode_everything(&text);
        let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": [pod]});
        decode_everything(&list.to_string());
    }
}
