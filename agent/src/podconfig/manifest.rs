//! Static pod manifests: decoding YAML/JSON documents into `v1 Pod`s, the normalisation the
//! kubelet's file and http sources apply (`applyDefaults` in `pkg/kubelet/config/common.go`: node-
//! suffixed name, default namespace, bound to this node, UID derived from the manifest, config
//! annotations) plus the API defaults the agent relies on, and the essential validation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Toleration};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::report::Problem;
use super::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, PodConfigError, PodSource};
use crate::error_chain::error_chain;

/// The largest manifest (file or URL body) decoded. A pod is at most about 1.5 MiB (what etcd
/// stores), so this leaves room for a list of several, and bounds the parsers' linear work.
pub(super) const MAX_MANIFEST_BYTES: usize = 16 * 1024 * 1024;
/// The deepest nesting a manifest may have. A pod nests about 10 levels (a list item's affinity
/// term); 128 is also where both parsers' own recursion limits stop, so nothing they would accept is
/// refused. The limit is checked by a linear pre-scan before the YAML parser runs, whose cost grows
/// with the size times the depth of flow collections (see [`super::depth`]).
pub(super) const MAX_NESTING_DEPTH: usize = 128;

const DEFAULT_NAMESPACE: &str = "default";
const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Where a static pod's manifest came from; part of its UID.
#[derive(Clone, Copy, Debug)]
pub(super) enum Origin<'a> {
    File(&'a Path),
    Http(&'a str),
}

/// Splits a manifest into documents: a stream of JSON values when it starts like JSON, YAML
/// documents separated by `---` otherwise (and when JSON-looking text turns out to be YAML flow
/// style). Empty documents are skipped; indexes count from 1 and include them, so they match what a
/// reader of the file counts.
///
/// A manifest over [`MAX_MANIFEST_BYTES`] or nested deeper than [`MAX_NESTING_DEPTH`] is refused
/// before any parser sees it. This is CPU-bound work: call it off the agent's core.
pub(super) fn documents(text: &str) -> Result<Vec<(usize, serde_json::Value)>, PodConfigError> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(PodConfigError::TooLarge {
            size: u64::try_from(text.len()).unwrap_or(u64::MAX),
            limit: MAX_MANIFEST_BYTES,
        });
    }
    if let Some(at) = super::depth::too_deep(text, MAX_NESTING_DEPTH) {
        return Err(PodConfigError::TooDeep {
            limit: MAX_NESTING_DEPTH,
            line: at.line,
            column: at.column,
        });
    }
    if text.trim_start().starts_with(['{', '[']) {
        let json = json_documents(text);
        if json.is_ok() {
            return json;
        }
        // JSON's error is the precise one for text that starts like JSON.
        return yaml_documents(text).or(json);
    }
    yaml_documents(text)
}

fn json_documents(text: &str) -> Result<Vec<(usize, serde_json::Value)>, PodConfigError> {
    let stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    stream
        .enumerate()
        .map(|(i, value)| {
            value
                .map(|value| (i + 1, value))
                .map_err(|source| PodConfigError::ParseJson {
                    index: i + 1,
                    source,
                })
        })
        .collect()
}

fn yaml_documents(text: &str) -> Result<Vec<(usize, serde_json::Value)>, PodConfigError> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(document).map_err(|source| {
            PodConfigError::ParseYaml {
                index: i + 1,
                source,
            }
        })?;
        if !value.is_null() {
            out.push((i + 1, value));
        }
    }
    Ok(out)
}

fn string_field(value: &serde_json::Value, field: &str) -> String {
    value
        .get(field)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Decodes one document that must be a `v1 Pod`.
pub(super) fn decode_pod(index: usize, value: serde_json::Value) -> Result<Pod, PodConfigError> {
    let api_version = string_field(&value, "apiVersion");
    let kind = string_field(&value, "kind");
    if api_version != "v1" || kind != "Pod" {
        return Err(PodConfigError::WrongKind {
            index,
            expected: "Pod",
            api_version,
            kind,
        });
    }
    serde_json::from_value(value).map_err(|source| PodConfigError::DecodePod { index, source })
}

/// Decodes one document that must be a `v1 Pod` or a `v1 PodList` (as a manifest URL may serve).
pub(super) fn decode_pod_or_list(
    index: usize,
    mut value: serde_json::Value,
) -> Result<Vec<Pod>, PodConfigError> {
    let api_version = string_field(&value, "apiVersion");
    let kind = string_field(&value, "kind");
    if api_version != "v1" || kind != "PodList" {
        return decode_pod(index, value).map(|pod| vec![pod]);
    }
    let items = match value.get_mut("items").map(serde_json::Value::take) {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(items) => serde_json::from_value::<Vec<serde_json::Value>>(items)
            .map_err(|source| PodConfigError::DecodePod { index, source })?,
    };
    items
        .into_iter()
        .map(|mut item| {
            // List items usually leave out apiVersion/kind; the list already says what they are.
            if let Some(object) = item.as_object_mut() {
                object.entry("apiVersion").or_insert_with(|| "v1".into());
                object.entry("kind").or_insert_with(|| "Pod".into());
            }
            decode_pod(index, item)
        })
        .collect()
}

/// A UID-shaped string (8-4-4-4-12 hex) from a SHA-256 over the manifest's pod, the node and the
/// origin: stable across restarts, new whenever the manifest's content changes.
fn static_pod_uid(
    pod: &Pod,
    origin: Origin<'_>,
    node_name: &str,
) -> Result<String, PodConfigError> {
    let encoded = serde_json::to_vec(pod).map_err(|source| PodConfigError::EncodePod {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    let mut hasher = Sha256::new();
    hasher.update(&encoded);
    hasher.update(b"\0host:");
    hasher.update(node_name.as_bytes());
    match origin {
        Origin::File(path) => {
            hasher.update(b"\0file:");
            hasher.update(path.as_os_str().as_encoded_bytes());
        }
        Origin::Http(url) => {
            hasher.update(b"\0url:");
            hasher.update(url.as_bytes());
        }
    }
    let digest = hasher.finalize();
    let hex = digest[..16]
        .iter()
        .fold(String::with_capacity(32), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        });
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// Turns a manifest's pod into the static pod the agent runs, or says why it cannot run.
pub(super) fn normalize(
    mut pod: Pod,
    origin: Origin<'_>,
    node_name: &str,
) -> Result<Pod, PodConfigError> {
    let original_name = pod.metadata.name.clone().unwrap_or_default();
    if original_name.is_empty() {
        return Err(PodConfigError::InvalidPod {
            pod: "<unnamed>".to_owned(),
            reason: "metadata.name is required".to_owned(),
        });
    }
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        pod.metadata.uid = Some(static_pod_uid(&pod, origin, node_name)?);
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();

    pod.metadata.name = Some(format!("{original_name}-{}", node_name.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.to_owned(), uid);
    let source = match origin {
        Origin::File(_) => PodSource::File,
        Origin::Http(_) => PodSource::Http,
    };
    annotations.insert(CONFIG_SOURCE_ANNOTATION.to_owned(), source.to_string());

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_owned());
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_owned());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_owned());
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        default_container(container);
    }
    if matches!(origin, Origin::File(_)) {
        // Node problems (NoExecute taints) must not evict what the node itself is told to run.
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        let tolerate_no_execute = Toleration {
            operator: Some("Exists".to_owned()),
            effect: Some("NoExecute".to_owned()),
            ..Toleration::default()
        };
        if !tolerations.contains(&tolerate_no_execute) {
            tolerations.push(tolerate_no_execute);
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_owned());

    validate(&pod)?;
    Ok(pod)
}

fn default_container(container: &mut Container) {
    if container
        .image_pull_policy
        .as_deref()
        .is_none_or(str::is_empty)
    {
        let policy = if image_tag_is_latest(container.image.as_deref().unwrap_or_default()) {
            "Always"
        } else {
            "IfNotPresent"
        };
        container.image_pull_policy = Some(policy.to_owned());
    }
    container
        .termination_message_path
        .get_or_insert_with(|| DEFAULT_TERMINATION_MESSAGE_PATH.to_owned());
    container
        .termination_message_policy
        .get_or_insert_with(|| "File".to_owned());
}

/// True for `:latest` and for an image with neither tag nor digest (which means `latest`).
fn image_tag_is_latest(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last_component = image.rsplit('/').next().unwrap_or(image);
    match last_component.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

fn is_dns1123_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty() && value.len() <= 253 && value.split('.').all(is_dns1123_label)
}

fn check_one_of(errors: &mut Vec<String>, field: &str, value: Option<&str>, allowed: &[&str]) {
    if let Some(value) = value
        && !allowed.contains(&value)
    {
        errors.push(format!("{field} {value:?} is not one of {allowed:?}"));
    }
}

/// The checks without which the rest of the agent cannot run the pod; every failure is reported.
fn validate(pod: &Pod) -> Result<(), PodConfigError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut errors = Vec::new();
    if !is_dns1123_subdomain(name) {
        errors.push(format!(
            "name {name:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)"
        ));
    }
    if !is_dns1123_label(namespace) {
        errors.push(format!(
            "namespace {namespace:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)"
        ));
    }
    if let Some(spec) = &pod.spec {
        if spec.containers.is_empty() {
            errors.push("spec.containers must have at least one container".to_owned());
        }
        let mut container_names = HashSet::new();
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| ("spec.initContainers", c))
            .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
        for (i, (field, container)) in all.enumerate() {
            let cname = container.name.as_str();
            if !is_dns1123_label(cname) {
                errors.push(format!(
                    "{field}: container name {cname:?} is not a DNS-1123 label"
                ));
            } else if !container_names.insert(cname) {
                errors.push(format!("{field}: container name {cname:?} is used twice"));
            }
            if container
                .image
                .as_deref()
                .is_none_or(|image| image.trim().is_empty())
            {
                errors.push(format!("{field}: container {cname:?} (#{i}) has no image"));
            }
            check_one_of(
                &mut errors,
                &format!("{field}: container {cname:?} imagePullPolicy"),
                container.image_pull_policy.as_deref(),
                &["Always", "IfNotPresent", "Never"],
            );
        }
        let mut volume_names = HashSet::new();
        for volume in spec.volumes.iter().flatten() {
            let vname = volume.name.as_str();
            if !is_dns1123_label(vname) {
                errors.push(format!(
                    "spec.volumes: name {vname:?} is not a DNS-1123 label"
                ));
            } else if !volume_names.insert(vname) {
                errors.push(format!("spec.volumes: name {vname:?} is used twice"));
            }
        }
        check_one_of(
            &mut errors,
            "spec.restartPolicy",
            spec.restart_policy.as_deref(),
            &["Always", "OnFailure", "Never"],
        );
        check_one_of(
            &mut errors,
            "spec.dnsPolicy",
            spec.dns_policy.as_deref(),
            &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
        );
        if spec.termination_grace_period_seconds.is_some_and(|s| s < 0) {
            errors.push("spec.terminationGracePeriodSeconds must not be negative".to_owned());
        }
    } else {
        errors.push("spec is required".to_owned());
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(PodConfigError::InvalidPod {
            pod: format!("{namespace}/{name}"),
            reason: errors.join("; "),
        })
    }
}

/// Keeps the first pod of each namespace/name and turns every later one into a problem; pods are
/// given in a stable order (files sorted by name, documents in order) so the same one always wins.
pub(super) fn drop_duplicates(pods: Vec<(String, Pod)>, problems: &mut Vec<Problem>) -> Vec<Pod> {
    let mut kept: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(pods.len());
    for (object, pod) in pods {
        let full_name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some(first) = kept.get(&full_name) {
            let err = PodConfigError::DuplicatePod {
                pod: full_name,
                kept: first.clone(),
            };
            problems.push(Problem {
                identity: pod.metadata.uid.clone().unwrap_or_default(),
                object,
                reason: super::REASON_FAILED_VALIDATION,
                message: error_chain(&err),
            });
            continue;
        }
        kept.insert(full_name, object);
        out.push(pod);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_example_manifest_is_a_valid_static_pod() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/pods");
        let mut checked = 0;
        for entry in std::fs::read_dir(&examples).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (index, value) in documents(&text).unwrap() {
                let pod =
                    decode_pod(index, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                normalize(pod, Origin::File(&path), "node1")
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                checked += 1;
            }
        }
        assert!(
            checked >= 3,
            "only {checked} example pods found in {}",
            examples.display()
        );
    }

    use super::*;

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    image: nginx:1.27\n  - name: side\n    image: busybox\n";

    fn decode_all(text: &str) -> Vec<Result<Pod, PodConfigError>> {
        documents(text)
            .unwrap()
            .into_iter()
            .map(|(index, value)| decode_pod(index, value))
            .collect()
    }

    fn web() -> Pod {
        decode_all(WEB).pop().unwrap().unwrap()
    }

    #[test]
    fn static_pods_are_named_bound_and_annotated() {
        let path = Path::new("/etc/manifests/web.yaml");
        let pod = normalize(web(), Origin::File(path), "Node1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node1"));
        let uid = pod.metadata.uid.clone().unwrap();
        let shape: Vec<usize> = uid.split('-').map(str::len).collect();
        assert_eq!(shape, [8, 4, 4, 4, 12]);
        assert!(uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()));
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION], "file");
        assert!(!annotations.contains_key(super::super::CONFIG_MIRROR_ANNOTATION));
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Pending")
        );
    }

    #[test]
    fn defaults_the_fields_the_agent_relies_on() {
        let pod = normalize(web(), Origin::Http("http://x/pods"), "node1").unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert_eq!(
            spec.containers[1].image_pull_policy.as_deref(),
            Some("Always")
        );
        assert_eq!(
            spec.containers[0].termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        // Only file pods get the NoExecute toleration, as in the kubelet.
        assert!(spec.tolerations.is_none());
        assert_eq!(
            pod.metadata.annotations.unwrap()[CONFIG_SOURCE_ANNOTATION],
            "http"
        );
    }

    #[test]
    fn explicit_values_are_kept() {
        let text = WEB.replace(
            "image: busybox",
            "image: busybox\n    imagePullPolicy: Never",
        ) + "  restartPolicy: Never\n";
        let pod = decode_all(&text).pop().unwrap().unwrap();
        let spec = normalize(pod, Origin::File(Path::new("/m/a")), "n")
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.containers[1].image_pull_policy.as_deref(),
            Some("Never")
        );
    }

    #[test]
    fn latest_means_an_explicit_latest_tag_or_no_tag_at_all() {
        assert!(image_tag_is_latest("nginx"));
        assert!(image_tag_is_latest("nginx:latest"));
        assert!(image_tag_is_latest("registry:5000/team/app"));
        assert!(!image_tag_is_latest("registry:5000/team/app:v1"));
        assert!(!image_tag_is_latest("nginx@sha256:abcd"));
    }

    #[test]
    fn the_uid_is_stable_for_the_same_manifest_and_changes_with_it() {
        let path = Path::new("/etc/manifests/web.yaml");
        let first = normalize(web(), Origin::File(path), "node1").unwrap();
        let again = normalize(web(), Origin::File(path), "node1").unwrap();
        assert_eq!(first.metadata.uid, again.metadata.uid);

        let edited_text = WEB.replace("nginx:1.27", "nginx:1.28");
        let edited = decode_all(&edited_text).pop().unwrap().unwrap();
        let edited = normalize(edited, Origin::File(path), "node1").unwrap();
        assert_ne!(first.metadata.uid, edited.metadata.uid);

        let other_node = normalize(web(), Origin::File(path), "node2").unwrap();
        assert_ne!(first.metadata.uid, other_node.metadata.uid);
        let other_file =
            normalize(web(), Origin::File(Path::new("/etc/m/b.yaml")), "node1").unwrap();
        assert_ne!(first.metadata.uid, other_file.metadata.uid);
        let from_url = normalize(web(), Origin::Http("http://x/pods"), "node1").unwrap();
        assert_ne!(first.metadata.uid, from_url.metadata.uid);
    }

    #[test]
    fn an_explicit_uid_is_kept() {
        let text = WEB.replace("name: web\nspec", "name: web\n  uid: fixed-uid\nspec");
        let pod = decode_all(&text).pop().unwrap().unwrap();
        let pod = normalize(pod, Origin::File(Path::new("/m/a")), "n").unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("fixed-uid"));
    }

    #[test]
    fn yaml_may_hold_several_documents_and_empty_ones_are_skipped() {
        let text = format!(
            "---\n{WEB}---\n{}\n---\n",
            WEB.replace("name: web\nspec", "name: db\nspec")
        );
        let pods = decode_all(&text);
        assert_eq!(pods.len(), 2);
        assert_eq!(
            pods[1].as_ref().unwrap().metadata.name.as_deref(),
            Some("db")
        );
    }

    #[test]
    fn json_manifests_are_decoded() {
        let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}}
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
        let pods = decode_all(text);
        assert_eq!(pods.len(), 2);
        assert_eq!(
            pods[1].as_ref().unwrap().metadata.name.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn yaml_flow_style_is_not_mistaken_for_broken_json() {
        let pods = decode_all("{apiVersion: v1, kind: Pod, metadata: {name: a}}");
        assert_eq!(
            pods[0].as_ref().unwrap().metadata.name.as_deref(),
            Some("a")
        );
        let err = documents("{\"apiVersion\": \"v1\",").unwrap_err();
        assert!(matches!(err, PodConfigError::ParseJson { .. }), "{err}");
    }

    #[test]
    fn other_kinds_are_rejected_per_document() {
        let text =
            format!("{WEB}---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n");
        let pods = decode_all(&text);
        assert!(pods[0].is_ok());
        let err = pods[1].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("document 2") && err.contains("Deployment"),
            "{err}"
        );
    }

    #[test]
    fn a_yaml_syntax_error_names_the_document() {
        let err = documents("a: [1, 2\n").unwrap_err();
        assert!(
            matches!(err, PodConfigError::ParseYaml { index: 1, .. }),
            "{err}"
        );
    }

    fn nested_json(depth: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
    }

    #[test]
    fn a_hundred_thousand_levels_are_refused_before_parsing() {
        // The reported case: ~500 KB of nested objects kept the agent busy for a minute in the
        // YAML fallback. The pre-scan names the limit and where it was passed.
        let err = documents(&nested_json(100_000)).unwrap_err();
        assert!(
            matches!(
                err,
                PodConfigError::TooDeep {
                    limit: MAX_NESTING_DEPTH,
                    line: 1,
                    column: 641,
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "manifest nests deeper than 128 levels (at line 1, column 641); no pod nests that deep"
        );
        // The same in YAML flow style, and in block style.
        let flow = format!("a: {}1{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            documents(&flow),
            Err(PodConfigError::TooDeep { line: 1, .. })
        ));
        let block = format!("{}1\n", "- ".repeat(100_000));
        assert!(matches!(
            documents(&block),
            Err(PodConfigError::TooDeep { .. })
        ));
    }

    #[test]
    fn nesting_up_to_the_limit_still_reaches_the_parser() {
        // At the limit the parsers decide (serde_json accepts 127 levels around a value).
        let (_, value) = documents(&nested_json(100)).unwrap().pop().unwrap();
        assert!(value.get("a").is_some());
        // One past the limit is the pre-scan's refusal, not a parser's.
        assert!(matches!(
            documents(&nested_json(MAX_NESTING_DEPTH + 1)),
            Err(PodConfigError::TooDeep { .. })
        ));
    }

    #[test]
    fn a_manifest_over_the_size_limit_is_refused() {
        let padding = "#".repeat(MAX_MANIFEST_BYTES);
        let text = format!("{WEB}{padding}\n");
        let err = documents(&text).unwrap_err();
        assert!(
            matches!(err, PodConfigError::TooLarge { limit: MAX_MANIFEST_BYTES, size } if size == u64::try_from(text.len()).unwrap()),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("more than the 16777216 bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_pod_list_is_accepted_where_lists_are_allowed() {
        let text = r#"{"apiVersion":"v1","kind":"PodList","items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}},
            {"metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}]}"#;
        let (index, value) = documents(text).unwrap().pop().unwrap();
        let pods = decode_pod_or_list(index, value.clone()).unwrap();
        assert_eq!(pods.len(), 2);
        assert!(decode_pod(index, value).is_err());
    }

    fn invalid_reason(text: &str) -> String {
        let pod = decode_all(text).pop().unwrap().unwrap();
        match normalize(pod, Origin::File(Path::new("/m/a")), "node1") {
            Err(PodConfigError::InvalidPod { reason, .. }) => reason,
            other => panic!("expected an invalid pod, got {other:?}"),
        }
    }

    #[test]
    fn invalid_pods_are_rejected_with_the_reason() {
        let no_containers =
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers: []\n";
        assert!(invalid_reason(no_containers).contains("at least one container"));

        let twice = WEB.replace("name: side", "name: web");
        assert!(invalid_reason(&twice).contains("\"web\" is used twice"));

        let no_image = WEB.replace("image: busybox", "image: \"\"");
        assert!(invalid_reason(&no_image).contains("has no image"));

        let bad_name = WEB.replace("name: web\nspec", "name: Web_1\nspec");
        assert!(invalid_reason(&bad_name).contains("DNS-1123 subdomain"));

        let volumes = format!(
            "{WEB}  volumes:\n  - name: v\n    emptyDir: {{}}\n  - name: v\n    emptyDir: {{}}\n"
        );
        assert!(invalid_reason(&volumes).contains("\"v\" is used twice"));

        let unnamed =
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: c\n    image: i\n";
        let pod = decode_all(unnamed).pop().unwrap().unwrap();
        let err = normalize(pod, Origin::File(Path::new("/m/a")), "n").unwrap_err();
        assert!(
            err.to_string().contains("metadata.name is required"),
            "{err}"
        );
    }

    #[test]
    fn the_first_of_two_pods_with_one_name_wins() {
        let a = normalize(web(), Origin::File(Path::new("/m/a")), "n").unwrap();
        let b = normalize(web(), Origin::File(Path::new("/m/b")), "n").unwrap();
        let mut problems = Vec::new();
        let kept = drop_duplicates(
            vec![
                ("file//m/a".to_owned(), a.clone()),
                ("file//m/b".to_owned(), b),
            ],
            &mut problems,
        );
        assert_eq!(kept, vec![a]);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].object, "file//m/b");
        assert!(problems[0].message.contains("file//m/a"));
    }
}
