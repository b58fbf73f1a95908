//! The `KubeletConfiguration` fields of what the node enforces on pods and containers, in one
//! section: `podPidsLimit`, `cpuCFSQuota`, `cpuCFSQuotaPeriod`, `seccompDefault` and node
//! allocatable enforcement (`enforceNodeAllocatable`, `systemReservedCgroup`, `kubeReservedCgroup`),
//! with the kubelet's defaults and the checks of its validation (`pkg/kubelet/apis/config/validation`).
//! Reading, defaulting, validating and rendering a field all happen here.

use std::time::Duration;

use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

use super::configz::go_duration;
use super::duration::parse_duration;
use super::file::FieldReader;

/// `enforceNodeAllocatable` keys (the kubelet's `pkg/kubelet/types` constants).
pub const ENFORCE_PODS: &str = "pods";
pub const ENFORCE_SYSTEM_RESERVED: &str = "system-reserved";
pub const ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE: &str = "system-reserved-compressible";
pub const ENFORCE_KUBE_RESERVED: &str = "kube-reserved";
pub const ENFORCE_KUBE_RESERVED_COMPRESSIBLE: &str = "kube-reserved-compressible";
pub const ENFORCE_NONE: &str = "none";

/// The kubelet's bounds of `cpuCFSQuotaPeriod`, inclusive.
const MIN_CFS_PERIOD: Duration = Duration::from_millis(1);
const MAX_CFS_PERIOD: Duration = Duration::from_secs(1);

/// What the node enforces on pods and containers, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSettings {
    /// `podPidsLimit` (default -1): the `pids.max` of every pod cgroup; 0 or less leaves pods
    /// unlimited.
    pub pod_pids_limit: i64,
    /// `cpuCFSQuota` (default true): CPU limits become a CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` (default 100ms, between 1ms and 1s): the CFS period of those quotas.
    pub cpu_cfs_quota_period: Duration,
    /// `seccompDefault` (default false): containers without a seccomp profile run with the
    /// runtime's default profile instead of unconfined.
    pub seccomp_default: bool,
    /// `enforceNodeAllocatable` (default `[pods]`): which cgroups get node allocatable limits.
    pub enforce_node_allocatable: Vec<String>,
    /// `systemReservedCgroup`: the cgroup `system-reserved` enforcement limits.
    pub system_reserved_cgroup: String,
    /// `kubeReservedCgroup`: the cgroup `kube-reserved` enforcement limits.
    pub kube_reserved_cgroup: String,
}

impl Default for ResourceSettings {
    fn default() -> Self {
        Self {
            pod_pids_limit: -1,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: Duration::from_millis(100),
            seccomp_default: false,
            enforce_node_allocatable: vec![ENFORCE_PODS.to_owned()],
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
        }
    }
}

impl ResourceSettings {
    /// Whether `enforceNodeAllocatable` names `key`.
    pub fn enforces(&self, key: &str) -> bool {
        self.enforce_node_allocatable.iter().any(|k| k == key)
    }

    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        [
            ("podPidsLimit", json!(self.pod_pids_limit)),
            ("cpuCFSQuota", json!(self.cpu_cfs_quota)),
            (
                "cpuCFSQuotaPeriod",
                json!(go_duration(self.cpu_cfs_quota_period)),
            ),
            ("seccompDefault", json!(self.seccomp_default)),
            (
                "enforceNodeAllocatable",
                json!(self.enforce_node_allocatable),
            ),
            ("systemReservedCgroup", json!(self.system_reserved_cgroup)),
            ("kubeReservedCgroup", json!(self.kube_reserved_cgroup)),
        ]
        .into_iter()
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone)]
pub(super) struct RawResourceSettings {
    pub pod_pids_limit: Option<i64>,
    pub cpu_cfs_quota: Option<bool>,
    pub cpu_cfs_quota_period: Option<Duration>,
    pub seccomp_default: Option<bool>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
}

impl RawResourceSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "podPidsLimit" => self.pod_pids_limit = reader.int(),
            "cpuCFSQuota" => self.cpu_cfs_quota = reader.bool(),
            "cpuCFSQuotaPeriod" => self.cpu_cfs_quota_period = read_period(reader),
            "seccompDefault" => self.seccomp_default = reader.bool(),
            // A list in the file: an explicit empty list enforces nothing, only a missing one is
            // defaulted.
            "enforceNodeAllocatable" => self.enforce_node_allocatable = reader.string_list(),
            "systemReservedCgroup" => self.system_reserved_cgroup = reader.string(),
            "kubeReservedCgroup" => self.kube_reserved_cgroup = reader.string(),
            _ => return false,
        }
        true
    }
}

/// `cpuCFSQuotaPeriod` is a pointer in v1beta1: an explicit `0s` is kept (and refused by
/// validation) instead of being defaulted like other durations.
fn read_period(reader: &mut FieldReader<'_>) -> Option<Duration> {
    match reader.value() {
        Yaml::Null => None,
        Yaml::String(text) => parse_duration(text).map_err(|e| reader.problem(e)).ok(),
        _ => {
            reader.problem("expected a duration string such as \"100ms\"");
            None
        }
    }
}

/// Parses `--enforce-node-allocatable`: comma-separated keys; an empty value enforces nothing.
pub(super) fn parse_enforcement_flag(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Applies the defaults and validates, appending every problem. `cgroups_per_qos` is needed
/// because every enforcement but `none` requires it.
pub(super) fn build(
    raw: RawResourceSettings,
    cgroups_per_qos: bool,
    problems: &mut Vec<String>,
) -> ResourceSettings {
    let defaults = ResourceSettings::default();
    let period = raw
        .cpu_cfs_quota_period
        .unwrap_or(defaults.cpu_cfs_quota_period);
    // ringlet has no feature gates: a custom period is accepted as with the kubelet's
    // CustomCPUCFSQuotaPeriod gate on.
    let period_ok = (MIN_CFS_PERIOD..=MAX_CFS_PERIOD).contains(&period);
    if !period_ok {
        problems.push(format!(
            "cpuCFSQuotaPeriod (--cpu-cfs-quota-period): {} must be between 1ms and 1sec, inclusive",
            go_duration(period)
        ));
    }
    let settings = ResourceSettings {
        pod_pids_limit: raw.pod_pids_limit.unwrap_or(defaults.pod_pids_limit),
        cpu_cfs_quota: raw.cpu_cfs_quota.unwrap_or(defaults.cpu_cfs_quota),
        cpu_cfs_quota_period: if period_ok {
            period
        } else {
            defaults.cpu_cfs_quota_period
        },
        seccomp_default: raw.seccomp_default.unwrap_or(defaults.seccomp_default),
        enforce_node_allocatable: raw
            .enforce_node_allocatable
            .unwrap_or(defaults.enforce_node_allocatable),
        system_reserved_cgroup: raw.system_reserved_cgroup.unwrap_or_default(),
        kube_reserved_cgroup: raw.kube_reserved_cgroup.unwrap_or_default(),
    };
    validate_enforcement(&settings, cgroups_per_qos, problems);
    settings
}

/// The kubelet's checks of `enforceNodeAllocatable`, with its messages.
fn validate_enforcement(
    settings: &ResourceSettings,
    cgroups_per_qos: bool,
    problems: &mut Vec<String>,
) {
    const FIELD: &str = "enforceNodeAllocatable (--enforce-node-allocatable)";
    for (full, compressible) in [
        (
            ENFORCE_SYSTEM_RESERVED,
            ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE,
        ),
        (ENFORCE_KUBE_RESERVED, ENFORCE_KUBE_RESERVED_COMPRESSIBLE),
    ] {
        if settings.enforces(full) && settings.enforces(compressible) {
            problems.push(format!(
                "{FIELD}: both {full:?} and {compressible:?} cannot be specified together"
            ));
        }
    }
    let keys = &settings.enforce_node_allocatable;
    for (index, key) in keys.iter().enumerate() {
        if keys[..index].contains(key) {
            problems.push(format!("{FIELD}: duplicated enforcement {key:?}"));
            continue;
        }
        match key.as_str() {
            ENFORCE_PODS => {}
            ENFORCE_SYSTEM_RESERVED | ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE => {
                if settings.system_reserved_cgroup.is_empty() {
                    problems.push(format!(
                        "systemReservedCgroup (--system-reserved-cgroup): must be specified when \
                         {ENFORCE_SYSTEM_RESERVED:?} or {ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE:?} \
                         is included in {FIELD}"
                    ));
                }
            }
            ENFORCE_KUBE_RESERVED | ENFORCE_KUBE_RESERVED_COMPRESSIBLE => {
                if settings.kube_reserved_cgroup.is_empty() {
                    problems.push(format!(
                        "kubeReservedCgroup (--kube-reserved-cgroup): must be specified when \
                         {ENFORCE_KUBE_RESERVED:?} or {ENFORCE_KUBE_RESERVED_COMPRESSIBLE:?} is \
                         included in {FIELD}"
                    ));
                }
            }
            ENFORCE_NONE => {
                if keys.len() > 1 {
                    problems.push(format!(
                        "{FIELD}: may not contain additional enforcements when {ENFORCE_NONE:?} \
                         is specified"
                    ));
                }
                continue;
            }
            other => {
                problems.push(format!(
                    "{FIELD}: option {other:?} is not valid; valid options are {ENFORCE_PODS:?}, \
                     {ENFORCE_SYSTEM_RESERVED:?}, {ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE:?}, \
                     {ENFORCE_KUBE_RESERVED:?}, {ENFORCE_KUBE_RESERVED_COMPRESSIBLE:?} or \
                     {ENFORCE_NONE:?}"
                ));
                continue;
            }
        }
        if !cgroups_per_qos {
            problems.push(format!(
                "cgroupsPerQOS (--cgroups-per-qos): must be true when {key:?} is contained in \
                 {FIELD}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(raw: RawResourceSettings, cgroups_per_qos: bool) -> (ResourceSettings, Vec<String>) {
        let mut problems = Vec::new();
        let settings = build(raw, cgroups_per_qos, &mut problems);
        (settings, problems)
    }

    fn enforcing(keys: &[&str]) -> RawResourceSettings {
        RawResourceSettings {
            enforce_node_allocatable: Some(keys.iter().map(|k| (*k).to_owned()).collect()),
            ..RawResourceSettings::default()
        }
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let (settings, problems) = built(RawResourceSettings::default(), true);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings, ResourceSettings::default());
        assert_eq!(settings.pod_pids_limit, -1);
        assert!(settings.cpu_cfs_quota);
        assert_eq!(settings.cpu_cfs_quota_period, Duration::from_millis(100));
        assert!(!settings.seccomp_default);
        assert!(settings.enforces(ENFORCE_PODS));
        assert!(!settings.enforces(ENFORCE_KUBE_RESERVED));
    }

    #[test]
    fn the_cfs_period_must_be_between_1ms_and_1s() {
        for ok in [1, 50, 1000] {
            let (settings, problems) = built(
                RawResourceSettings {
                    cpu_cfs_quota_period: Some(Duration::from_millis(ok)),
                    ..RawResourceSettings::default()
                },
                true,
            );
            assert!(problems.is_empty(), "{ok}ms: {problems:?}");
            assert_eq!(settings.cpu_cfs_quota_period, Duration::from_millis(ok));
        }
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            Duration::from_millis(1001),
        ] {
            let (_, problems) = built(
                RawResourceSettings {
                    cpu_cfs_quota_period: Some(bad),
                    ..RawResourceSettings::default()
                },
                true,
            );
            assert_eq!(problems.len(), 1, "{bad:?}: {problems:?}");
            assert!(
                problems[0].starts_with("cpuCFSQuotaPeriod (--cpu-cfs-quota-period): ")
                    && problems[0].ends_with("must be between 1ms and 1sec, inclusive"),
                "{problems:?}"
            );
        }
    }

    #[test]
    fn reserved_enforcement_needs_its_cgroup() {
        let (_, problems) = built(
            enforcing(&[ENFORCE_PODS, ENFORCE_SYSTEM_RESERVED, ENFORCE_KUBE_RESERVED]),
            true,
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with(
            "systemReservedCgroup (--system-reserved-cgroup): must be specified when \"system-reserved\""
        ));
        assert!(problems[1].starts_with(
            "kubeReservedCgroup (--kube-reserved-cgroup): must be specified when \"kube-reserved\""
        ));
        let (settings, problems) = built(
            RawResourceSettings {
                system_reserved_cgroup: Some("/system.slice".to_owned()),
                kube_reserved_cgroup: Some("/kube.slice".to_owned()),
                ..enforcing(&[
                    ENFORCE_PODS,
                    ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE,
                    ENFORCE_KUBE_RESERVED,
                ])
            },
            true,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert!(settings.enforces(ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE));
    }

    #[test]
    fn bad_enforcement_lists_are_refused_with_the_kubelets_reasons() {
        let cases: [(&[&str], bool, &str); 5] = [
            (&["pods", "pods"], true, "duplicated enforcement \"pods\""),
            (
                &["none", "pods"],
                true,
                "may not contain additional enforcements",
            ),
            (&["nodes"], true, "option \"nodes\" is not valid"),
            (
                &["pods"],
                false,
                "cgroupsPerQOS (--cgroups-per-qos): must be true",
            ),
            (
                &["kube-reserved", "kube-reserved-compressible"],
                true,
                "both \"kube-reserved\" and \"kube-reserved-compressible\" cannot be specified",
            ),
        ];
        for (keys, per_qos, expected) in cases {
            let (_, problems) = built(
                RawResourceSettings {
                    kube_reserved_cgroup: Some("/kube".to_owned()),
                    ..enforcing(keys)
                },
                per_qos,
            );
            assert!(
                problems.iter().any(|p| p.contains(expected)),
                "{keys:?}: {expected} missing from {problems:?}"
            );
        }
        // "none" alone, or nothing at all, is fine even without cgroupsPerQOS.
        for keys in [&["none"][..], &[]] {
            let (_, problems) = built(enforcing(keys), false);
            assert!(problems.is_empty(), "{keys:?}: {problems:?}");
        }
    }

    #[test]
    fn the_enforcement_flag_splits_on_commas() {
        assert_eq!(
            parse_enforcement_flag("pods, kube-reserved"),
            ["pods", "kube-reserved"]
        );
        assert!(parse_enforcement_flag("").is_empty());
    }
}
