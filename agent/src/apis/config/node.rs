//! The `KubeletConfiguration` fields of a node that joins a cluster, in one section: registration
//! (`registerNode`, `registerWithTaints`), status reporting (`nodeStatusUpdateFrequency`,
//! `nodeStatusReportFrequency`, `nodeStatusMaxImages`), the lease (`nodeLeaseDurationSeconds`), what
//! is kept back from allocatable (`systemReserved`, `kubeReserved`, `evictionHard`) and the API
//! client's and event recorder's rate limits. Reading, defaulting, validating and rendering a field
//! all happen here, so adding one touches this file and its flag.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

use super::configz::go_duration;
use super::file::FieldReader;

/// The taint effects a node can carry.
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// The kubelet's default hard eviction thresholds (`evictionHard`), which also come off allocatable.
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
];

/// The cluster-facing settings, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// `registerNode` (default true): create or adopt the Node object.
    pub register_node: bool,
    /// `registerWithTaints`: taints the Node is registered with.
    pub register_with_taints: Vec<TaintSetting>,
    /// `nodeStatusUpdateFrequency` (default 10s): how often the status is computed and posted when
    /// it changed.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (default 5m): how often an unchanged status is posted anyway.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (default 40); the lease is renewed every quarter of it.
    pub node_lease_duration_seconds: u32,
    /// `nodeStatusMaxImages` (default 50; -1 reports every image).
    pub node_status_max_images: i32,
    /// `eventRecordQPS` (default 50; 0 for no limit) and `eventBurst` (default 100).
    pub event_record_qps: u32,
    pub event_burst: u32,
    /// `kubeAPIQPS` (default 50) and `kubeAPIBurst` (default 100).
    pub kube_api_qps: u32,
    pub kube_api_burst: u32,
    /// `systemReserved` and `kubeReserved`: resource name -> quantity kept from pods.
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    /// `evictionHard`: signal -> threshold (quantity or percentage).
    pub eviction_hard: BTreeMap<String, String>,
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            register_node: true,
            register_with_taints: Vec::new(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_mins(5),
            node_lease_duration_seconds: 40,
            node_status_max_images: 50,
            event_record_qps: 50,
            event_burst: 100,
            kube_api_qps: 50,
            kube_api_burst: 100,
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            eviction_hard: DEFAULT_EVICTION_HARD
                .iter()
                .map(|(signal, value)| ((*signal).to_owned(), (*value).to_owned()))
                .collect(),
        }
    }
}

/// A taint to register with (`key`, optional `value`, `effect`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaintSetting {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

impl TaintSetting {
    /// The API object.
    pub fn to_taint(&self) -> Taint {
        Taint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.clone(),
            time_added: None,
        }
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone)]
pub(super) struct RawNodeSettings {
    pub register_node: Option<bool>,
    pub register_with_taints: Option<Vec<TaintSetting>>,
    pub node_status_update_frequency: Option<Duration>,
    pub node_status_report_frequency: Option<Duration>,
    pub node_lease_duration_seconds: Option<i64>,
    pub node_status_max_images: Option<i64>,
    pub event_record_qps: Option<i64>,
    pub event_burst: Option<i64>,
    pub kube_api_qps: Option<i64>,
    pub kube_api_burst: Option<i64>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
}

impl RawNodeSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "registerNode" => self.register_node = reader.bool(),
            "registerWithTaints" => self.register_with_taints = read_taints(reader),
            "nodeStatusUpdateFrequency" => self.node_status_update_frequency = reader.duration(),
            "nodeStatusReportFrequency" => self.node_status_report_frequency = reader.duration(),
            "nodeLeaseDurationSeconds" => {
                self.node_lease_duration_seconds = reader.int().filter(|n| *n != 0);
            }
            "nodeStatusMaxImages" => self.node_status_max_images = reader.int(),
            "eventRecordQPS" => self.event_record_qps = reader.int(),
            "eventBurst" => self.event_burst = reader.int().filter(|n| *n != 0),
            "kubeAPIQPS" => self.kube_api_qps = reader.int().filter(|n| *n != 0),
            "kubeAPIBurst" => self.kube_api_burst = reader.int().filter(|n| *n != 0),
            "systemReserved" => self.system_reserved = reader.string_map(),
            "kubeReserved" => self.kube_reserved = reader.string_map(),
            "evictionHard" => self.eviction_hard = reader.string_map(),
            _ => return false,
        }
        true
    }
}

fn read_taints(reader: &mut FieldReader<'_>) -> Option<Vec<TaintSetting>> {
    let value = reader.value();
    let Yaml::Sequence(items) = value else {
        if !matches!(value, Yaml::Null) {
            reader.problem("expected a list of taints ({key, value, effect})");
        }
        return None;
    };
    let mut taints = Vec::with_capacity(items.len());
    for item in items {
        let field = |name: &str| item.get(name).and_then(Yaml::as_str).map(str::to_owned);
        match (field("key"), field("effect")) {
            (Some(key), Some(effect)) => taints.push(TaintSetting {
                key,
                value: field("value").filter(|v| !v.is_empty()),
                effect,
            }),
            _ => reader.problem("every taint needs a string key and effect"),
        }
    }
    Some(taints)
}

/// Parses `--register-with-taints`: `key=value:Effect` or `key:Effect`, comma-separated.
pub(super) fn parse_taint_flag(text: &str) -> Result<Vec<TaintSetting>, String> {
    text.split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let part = part.trim();
            let (key_value, effect) = part
                .rsplit_once(':')
                .ok_or_else(|| format!("{part:?} must be key=value:Effect or key:Effect"))?;
            let (key, value) = match key_value.split_once('=') {
                Some((key, value)) => (key, Some(value.to_owned())),
                None => (key_value, None),
            };
            Ok(TaintSetting {
                key: key.to_owned(),
                value: value.filter(|v| !v.is_empty()),
                effect: effect.to_owned(),
            })
        })
        .collect()
}

fn validate_eviction_hard(thresholds: &BTreeMap<String, String>, problems: &mut Vec<String>) {
    for (signal, threshold) in thresholds {
        let valid = match threshold.strip_suffix('%') {
            Some(percent) => percent
                .parse::<f64>()
                .is_ok_and(|p| (0.0..=100.0).contains(&p)),
            None => crate::cm::parse_quantity(threshold).is_ok(),
        };
        if !valid {
            problems.push(format!(
                "evictionHard: {signal}: {threshold:?} must be a quantity or a percentage"
            ));
        }
    }
}

fn validate_taints(taints: &[TaintSetting], problems: &mut Vec<String>) {
    let field = "registerWithTaints (--register-with-taints)";
    for taint in taints {
        if !TAINT_EFFECTS.contains(&taint.effect.as_str()) {
            problems.push(format!(
                "{field}: taint {:?} has effect {:?}; must be one of {}",
                taint.key,
                taint.effect,
                TAINT_EFFECTS.join(", ")
            ));
        }
        if taint.key.is_empty() {
            problems.push(format!("{field}: a taint key must not be empty"));
        }
    }
}

/// Applies the defaults and validates, appending every problem.
pub(super) fn build(raw: RawNodeSettings, problems: &mut Vec<String>) -> NodeSettings {
    let defaults = NodeSettings::default();
    let mut problem = |field: &str, message: String| problems.push(format!("{field}: {message}"));
    let mut non_negative = |value: Option<i64>, default: u32, field: &str| match value {
        None => default,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| i32::try_from(*n).is_ok())
            .unwrap_or_else(|| {
                problem(field, format!("{n} must be between 0 and {}", i32::MAX));
                default
            }),
    };
    let node_lease_duration_seconds = non_negative(
        raw.node_lease_duration_seconds,
        defaults.node_lease_duration_seconds,
        "nodeLeaseDurationSeconds",
    );
    let event_record_qps = non_negative(
        raw.event_record_qps,
        defaults.event_record_qps,
        "eventRecordQPS",
    );
    let event_burst = non_negative(raw.event_burst, defaults.event_burst, "eventBurst");
    let kube_api_qps = non_negative(raw.kube_api_qps, defaults.kube_api_qps, "kubeAPIQPS");
    let kube_api_burst = non_negative(raw.kube_api_burst, defaults.kube_api_burst, "kubeAPIBurst");
    let node_status_max_images = match raw.node_status_max_images {
        None => defaults.node_status_max_images,
        Some(n) if n >= -1 => i32::try_from(n).unwrap_or(i32::MAX),
        Some(n) => {
            problem(
                "nodeStatusMaxImages",
                format!("{n} must be -1 (every image) or more"),
            );
            defaults.node_status_max_images
        }
    };
    let mut quantities = |value: Option<BTreeMap<String, String>>, field: &str| {
        let map = value.unwrap_or_default();
        for (name, quantity) in &map {
            if crate::cm::parse_quantity(quantity).is_err() {
                problem(
                    field,
                    format!("{name}: {quantity:?} is not a resource quantity"),
                );
            }
        }
        map
    };
    let system_reserved = quantities(raw.system_reserved, "systemReserved");
    let kube_reserved = quantities(raw.kube_reserved, "kubeReserved");
    let eviction_hard = raw.eviction_hard.unwrap_or(defaults.eviction_hard);
    validate_eviction_hard(&eviction_hard, problems);
    let register_with_taints = raw.register_with_taints.unwrap_or_default();
    validate_taints(&register_with_taints, problems);
    let update = raw
        .node_status_update_frequency
        .unwrap_or(defaults.node_status_update_frequency);
    // Unset, it follows an explicitly set update frequency, as in the kubelet's defaulting.
    let report =
        raw.node_status_report_frequency
            .unwrap_or(if raw.node_status_update_frequency.is_some() {
                update
            } else {
                defaults.node_status_report_frequency
            });
    NodeSettings {
        register_node: raw.register_node.unwrap_or(defaults.register_node),
        register_with_taints,
        node_status_update_frequency: update,
        node_status_report_frequency: report,
        node_lease_duration_seconds,
        node_status_max_images,
        event_record_qps,
        event_burst,
        kube_api_qps,
        kube_api_burst,
        system_reserved,
        kube_reserved,
        eviction_hard,
    }
}

impl NodeSettings {
    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        [
            ("registerNode", json!(self.register_node)),
            ("registerWithTaints", json!(self.register_with_taints)),
            (
                "nodeStatusUpdateFrequency",
                json!(go_duration(self.node_status_update_frequency)),
            ),
            (
                "nodeStatusReportFrequency",
                json!(go_duration(self.node_status_report_frequency)),
            ),
            (
                "nodeLeaseDurationSeconds",
                json!(self.node_lease_duration_seconds),
            ),
            ("nodeStatusMaxImages", json!(self.node_status_max_images)),
            ("eventRecordQPS", json!(self.event_record_qps)),
            ("eventBurst", json!(self.event_burst)),
            ("kubeAPIQPS", json!(self.kube_api_qps)),
            ("kubeAPIBurst", json!(self.kube_api_burst)),
            ("systemReserved", json!(self.system_reserved)),
            ("kubeReserved", json!(self.kube_reserved)),
            ("evictionHard", json!(self.eviction_hard)),
        ]
        .into_iter()
    }

    /// How often the lease is renewed: a quarter of its duration (the kubelet's
    /// `renewIntervalFraction`).
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.node_lease_duration_seconds)) / 4
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn taint_flags_parse_with_and_without_values() {
        let taints =
            parse_taint_flag("dedicated=gpu:NoSchedule, node.kubernetes.io/x:NoExecute").unwrap();
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].key, "dedicated");
        assert_eq!(taints[0].value.as_deref(), Some("gpu"));
        assert_eq!(taints[0].effect, "NoSchedule");
        assert_eq!(taints[1].key, "node.kubernetes.io/x");
        assert_eq!(taints[1].value, None);
        assert!(
            parse_taint_flag("no-effect")
                .unwrap_err()
                .contains("key=value:Effect")
        );
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let mut problems = Vec::new();
        let settings = build(RawNodeSettings::default(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings, NodeSettings::default());
        assert_eq!(settings.lease_renew_interval(), Duration::from_secs(10));
        assert_eq!(settings.eviction_hard["memory.available"], "100Mi");
    }

    #[test]
    fn bad_values_are_named() {
        let mut problems = Vec::new();
        build(
            RawNodeSettings {
                register_with_taints: Some(parse_taint_flag("a=b:Sometimes").unwrap()),
                node_status_max_images: Some(-2),
                kube_api_qps: Some(-1),
                system_reserved: Some(BTreeMap::from([("cpu".to_owned(), "lots".to_owned())])),
                eviction_hard: Some(BTreeMap::from([(
                    "memory.available".to_owned(),
                    "150%".to_owned(),
                )])),
                ..RawNodeSettings::default()
            },
            &mut problems,
        );
        let text = problems.join("\n");
        for expected in [
            "effect \"Sometimes\"",
            "nodeStatusMaxImages: -2",
            "kubeAPIQPS: -1",
            "systemReserved: cpu: \"lots\"",
            "evictionHard: memory.available: \"150%\"",
        ] {
            assert!(text.contains(expected), "{expected} missing from {text}");
        }
    }

    #[test]
    fn an_unset_report_period_follows_a_set_update_period() {
        let update_only = build(
            RawNodeSettings {
                node_status_update_frequency: Some(Duration::from_secs(20)),
                ..RawNodeSettings::default()
            },
            &mut Vec::new(),
        );
        assert_eq!(
            update_only.node_status_report_frequency,
            Duration::from_secs(20)
        );
        let both = build(
            RawNodeSettings {
                node_status_update_frequency: Some(Duration::from_secs(20)),
                node_status_report_frequency: Some(Duration::from_mins(1)),
                ..RawNodeSettings::default()
            },
            &mut Vec::new(),
        );
        assert_eq!(both.node_status_report_frequency, Duration::from_mins(1));
    }
}
