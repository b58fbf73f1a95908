//! What the files of configMap, secret and downwardAPI volumes (and of those sources in a projected
//! volume) contain: the kubelet's `MakePayload` in `pkg/volume/configmap` and `pkg/volume/secret`, and
//! `CollectData` in `pkg/volume/downwardapi` with `pkg/fieldpath`. Pure functions from the objects
//! to a [`Payload`]; fetching and writing happen elsewhere.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::atomic_writer::{FileProjection, Payload};
use crate::kuberuntime::container::ConfigError;
use crate::kuberuntime::resource_field_value;

/// The mode of a file when neither the item nor the volume says (the API server's default).
pub const DEFAULT_MODE: i32 = 0o644;

/// Why a volume's files could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    #[error("configmap references non-existent config key: {key}")]
    MissingConfigMapKey { key: String },
    #[error("references non-existent secret key: {key}")]
    MissingSecretKey { key: String },
    #[error("invalid file mode {mode:#o}: must be between 0 and 0777")]
    InvalidMode { mode: i32 },
    #[error("unsupported fieldPath: {path}")]
    UnsupportedFieldPath { path: String },
    #[error("{message}")]
    ResourceField { message: String },
    /// Several of the above, as Go's error aggregate prints them.
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Several(Vec<ProjectionError>),
}

impl ProjectionError {
    /// One error for a list of them: itself when there is one.
    pub fn aggregate(mut errors: Vec<Self>) -> Option<Self> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(Self::Several(errors)),
        }
    }
}

fn file_mode(mode: i32) -> Result<u32, ProjectionError> {
    u32::try_from(mode)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or(ProjectionError::InvalidMode { mode })
}

/// `defaultMode`, or the API's default when a manifest that was never defaulted leaves it out.
fn default_mode(mode: Option<i32>) -> Result<u32, ProjectionError> {
    file_mode(mode.unwrap_or(DEFAULT_MODE))
}

/// Files from key/value data: every key under its own name when `items` is empty, else each item's
/// key at its path; a missing key is an error unless `optional`.
fn key_payload(
    items: Option<&[KeyToPath]>,
    data: &BTreeMap<&str, &[u8]>,
    default: Option<i32>,
    optional: bool,
    missing: impl Fn(&str) -> ProjectionError,
) -> Result<Payload, ProjectionError> {
    let default = default_mode(default)?;
    let items = items.unwrap_or_default();
    if items.is_empty() {
        return Ok(data
            .iter()
            .map(|(key, value)| {
                let file = FileProjection {
                    data: value.to_vec(),
                    mode: default,
                };
                ((*key).to_owned(), file)
            })
            .collect());
    }
    let mut payload = Payload::new();
    for item in items {
        let Some(value) = data.get(item.key.as_str()) else {
            if optional {
                continue;
            }
            return Err(missing(&item.key));
        };
        let mode = item.mode.map_or(Ok(default), file_mode)?;
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: value.to_vec(),
                mode,
            },
        );
    }
    Ok(payload)
}

/// The files of a ConfigMap (`data` and `binaryData`); `None` for an optional one that does not
/// exist.
pub fn config_map(
    items: Option<&[KeyToPath]>,
    config_map: Option<&ConfigMap>,
    default: Option<i32>,
    optional: bool,
) -> Result<Payload, ProjectionError> {
    let mut data: BTreeMap<&str, &[u8]> = BTreeMap::new();
    if let Some(cm) = config_map {
        for (key, value) in cm.binary_data.iter().flatten() {
            data.insert(key, &value.0);
        }
        for (key, value) in cm.data.iter().flatten() {
            data.insert(key, value.as_bytes());
        }
    }
    key_payload(items, &data, default, optional, |key| {
        ProjectionError::MissingConfigMapKey {
            key: key.to_owned(),
        }
    })
}

/// The files of a Secret; `None` for an optional one that does not exist.
pub fn secret(
    items: Option<&[KeyToPath]>,
    secret: Option<&Secret>,
    default: Option<i32>,
    optional: bool,
) -> Result<Payload, ProjectionError> {
    let data: BTreeMap<&str, &[u8]> = secret
        .iter()
        .flat_map(|s| s.data.iter().flatten())
        .map(|(key, value)| (key.as_str(), value.0.as_slice()))
        .collect();
    key_payload(items, &data, default, optional, |key| {
        ProjectionError::MissingSecretKey {
            key: key.to_owned(),
        }
    })
}

/// The file of a serviceAccountToken source: the token at its path, with the volume's mode.
pub fn token(path: &str, token: String, default: Option<i32>) -> Result<Payload, ProjectionError> {
    let file = FileProjection {
        data: token.into_bytes(),
        mode: default_mode(default)?,
    };
    Ok(Payload::from([(path.to_owned(), file)]))
}

/// The files of a downwardAPI volume or source: pod fields and container resources. Every item is
/// tried; the errors are reported together.
pub fn downward_api(
    items: Option<&[DownwardAPIVolumeFile]>,
    pod: &Pod,
    node_allocatable: &BTreeMap<String, Quantity>,
    default: Option<i32>,
) -> Result<Payload, ProjectionError> {
    let default = default_mode(default)?;
    let mut errors = Vec::new();
    let mut payload = Payload::new();
    for item in items.unwrap_or_default() {
        let mode = match item.mode.map_or(Ok(default), file_mode) {
            Ok(mode) => mode,
            Err(err) => {
                errors.push(err);
                continue;
            }
        };
        let value = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)
        } else if let Some(selector) = &item.resource_field_ref {
            let container = selector.container_name.as_deref().unwrap_or_default();
            resource_field_value(selector, pod, container, &item.path, node_allocatable).map_err(
                |err| ProjectionError::ResourceField {
                    message: resource_message(&err, container),
                },
            )
        } else {
            Ok(String::new())
        };
        match value {
            Ok(value) => {
                payload.insert(
                    item.path.clone(),
                    FileProjection {
                        data: value.into_bytes(),
                        mode,
                    },
                );
            }
            Err(err) => errors.push(err),
        }
    }
    match ProjectionError::aggregate(errors) {
        Some(err) => Err(err),
        None => Ok(payload),
    }
}

/// The kubelet's wording for a resource reference it cannot resolve in a volume.
fn resource_message(err: &ConfigError, container: &str) -> String {
    match err {
        ConfigError::UnsupportedResource { resource, .. } => {
            format!("unsupported container resource : {resource}")
        }
        ConfigError::UnknownContainer { .. } => {
            format!("container {container} not found")
        }
        other => other.to_string(),
    }
}

/// A pod field as a downward API volume file shows it (the kubelet's `ExtractFieldPathAsString`):
/// name, namespace, UID, one label or annotation (`metadata.labels['key']`, empty when absent) or
/// all of them as sorted `key="value"` lines.
pub fn field_value(pod: &Pod, path: &str) -> Result<String, ProjectionError> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")
            .map(str::to_owned)
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                labels.get(&key).cloned().unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations") {
                annotations.get(&key).cloned().unwrap_or_default()
            } else {
                return Err(ProjectionError::UnsupportedFieldPath {
                    path: path.to_owned(),
                });
            }
        }
    })
}

/// `key="value"` lines sorted by key, values quoted as Go's `%q` quotes them (`fieldpath.FormatMap`).
fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(key, value)| format!("{key}={}", go_quote(value)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A string quoted as Go's `strconv.Quote` does: `"` and `\` escaped, control characters as `\n`,
/// `\t`, ... or `\x..` / `\u....`, printable characters (any script) as they are.
fn go_quote(value: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                let _ = if (c as u32) > 0xffff {
                    write!(out, "\\U{:08x}", c as u32)
                } else {
                    write!(out, "\\u{:04x}", c as u32)
                };
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        Container, ObjectFieldSelector, PodSpec, ResourceFieldSelector, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.to_owned(),
            path: path.to_owned(),
            mode,
        }
    }

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "2".to_owned()),
            ])),
            binary_data: Some(BTreeMap::from([(
                "bin".to_owned(),
                ByteString(vec![0, 159]),
            )])),
            ..ConfigMap::default()
        }
    }

    fn text(payload: &Payload, path: &str) -> (Vec<u8>, u32) {
        let file = &payload[path];
        (file.data.clone(), file.mode)
    }

    #[test]
    fn every_key_is_a_file_without_items() {
        let payload = config_map(None, Some(&cm()), Some(0o400), false).unwrap();
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["a", "b", "bin"]);
        assert_eq!(text(&payload, "a"), (b"1".to_vec(), 0o400));
        assert_eq!(text(&payload, "bin"), (vec![0, 159], 0o400));
    }

    #[test]
    fn items_pick_keys_paths_and_modes() {
        let items = [
            item("a", "conf/first", Some(0o600)),
            item("b", "second", None),
        ];
        let payload = config_map(Some(&items), Some(&cm()), None, false).unwrap();
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["conf/first", "second"]);
        assert_eq!(text(&payload, "conf/first"), (b"1".to_vec(), 0o600));
        assert_eq!(text(&payload, "second"), (b"2".to_vec(), 0o644));
    }

    #[test]
    fn a_missing_key_fails_unless_optional() {
        let items = [item("nope", "x", None), item("a", "a", None)];
        let err = config_map(Some(&items), Some(&cm()), None, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "configmap references non-existent config key: nope"
        );
        let payload = config_map(Some(&items), Some(&cm()), None, true).unwrap();
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["a"]);
        let absent = config_map(Some(&items), None, None, true).unwrap();
        assert!(absent.is_empty(), "an optional object that is missing");

        let secret_object = Secret {
            data: Some(BTreeMap::from([(
                "token".to_owned(),
                ByteString(b"s3cr3t".to_vec()),
            )])),
            ..Secret::default()
        };
        let err = secret(
            Some(&[item("nokey", "x", None)]),
            Some(&secret_object),
            None,
            false,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "references non-existent secret key: nokey");
        let payload = secret(None, Some(&secret_object), Some(0o440), false).unwrap();
        assert_eq!(text(&payload, "token"), (b"s3cr3t".to_vec(), 0o440));
    }

    #[test]
    fn modes_outside_0777_are_refused() {
        let err = config_map(None, Some(&cm()), Some(0o1777), false).unwrap_err();
        assert_eq!(err, ProjectionError::InvalidMode { mode: 0o1777 });
        let err = config_map(Some(&[item("a", "a", Some(-1))]), Some(&cm()), None, false);
        assert!(err.is_err());
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                namespace: Some("shop".to_owned()),
                uid: Some("u-1".to_owned()),
                labels: Some(BTreeMap::from([
                    ("app".to_owned(), "web".to_owned()),
                    ("tier".to_owned(), "front \"end\"\n".to_owned()),
                ])),
                annotations: Some(BTreeMap::from([("note".to_owned(), "héllo\t".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".to_owned(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([(
                            "memory".to_owned(),
                            Quantity("64Mi".to_owned()),
                        )])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn field(path: &str, field_path: &str) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.to_owned(),
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".to_owned()),
                field_path: field_path.to_owned(),
            }),
            ..DownwardAPIVolumeFile::default()
        }
    }

    #[test]
    fn downward_api_files_hold_pod_fields_and_whole_maps() {
        let items = [
            field("name", "metadata.name"),
            field("ns", "metadata.namespace"),
            field("uid", "metadata.uid"),
            field("labels", "metadata.labels"),
            field("annotations", "metadata.annotations"),
            field("app", "metadata.labels['app']"),
            field("missing", "metadata.labels['nope']"),
            DownwardAPIVolumeFile {
                path: "mem".to_owned(),
                mode: Some(0o400),
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: Some("main".to_owned()),
                    divisor: Some(Quantity("1Mi".to_owned())),
                    resource: "limits.memory".to_owned(),
                }),
                ..DownwardAPIVolumeFile::default()
            },
        ];
        let payload = downward_api(Some(&items), &pod(), &BTreeMap::new(), None).unwrap();
        let read = |p: &str| String::from_utf8(payload[p].data.clone()).unwrap();
        assert_eq!(read("name"), "web");
        assert_eq!(read("ns"), "shop");
        assert_eq!(read("uid"), "u-1");
        assert_eq!(read("labels"), "app=\"web\"\ntier=\"front \\\"end\\\"\\n\"");
        assert_eq!(read("annotations"), "note=\"héllo\\t\"");
        assert_eq!(read("app"), "web");
        assert_eq!(read("missing"), "");
        assert_eq!(read("mem"), "64");
        assert_eq!(payload["mem"].mode, 0o400);
        assert_eq!(payload["name"].mode, 0o644);
    }

    #[test]
    fn downward_api_errors_are_reported_together() {
        let mut bad_resource = field("cpu", "x");
        bad_resource.field_ref = None;
        bad_resource.resource_field_ref = Some(ResourceFieldSelector {
            container_name: Some("main".to_owned()),
            divisor: None,
            resource: "limits.gpu".to_owned(),
        });
        let items = [field("ip", "status.podIP"), bad_resource];
        let err = downward_api(Some(&items), &pod(), &BTreeMap::new(), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "[unsupported fieldPath: status.podIP, unsupported container resource : limits.gpu]"
        );
        let single = downward_api(Some(&items[..1]), &pod(), &BTreeMap::new(), None).unwrap_err();
        assert_eq!(single.to_string(), "unsupported fieldPath: status.podIP");
    }

    #[test]
    fn quoting_follows_go() {
        assert_eq!(go_quote("plain"), "\"plain\"");
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("\u{1}\u{7f}"), "\"\\x01\\x7f\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
        assert_eq!(go_quote("日本"), "\"日本\"");
    }
}
