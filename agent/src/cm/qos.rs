//! A pod's `QoS` class from the cpu and memory requests and limits of its containers (the kubelet's
//! `pkg/apis/core/v1/helper/qos`), and the resource quantities it compares.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::CmError;

/// The pod's quality-of-service class, which decides its cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The name used in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Only these resources take part in the `QoS` decision.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Computes the pod's `QoS` class:
/// - `BestEffort` when no container (init containers included) requests or limits cpu or memory;
/// - `Guaranteed` when every container limits both cpu and memory and the summed requests equal the
///   summed limits (a missing request defaults to its limit, as API defaulting does);
/// - `Burstable` otherwise.
///
/// When pod-level resources (`spec.resources`) name cpu or memory they decide alone. Zero quantities
/// count as unset. Quantities that do not parse are ignored here: manifests are validated before
/// they reach the cgroup manager.
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = &pod.spec else {
        return QosClass::BestEffort;
    };
    if let Some(pod_level) = spec.resources.as_ref().filter(|r| names_qos_resource(r)) {
        return classify(std::iter::once(pod_level));
    }
    // A container without a resources stanza counts as one with no requests and no limits.
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.resources.as_ref().unwrap_or(&EMPTY_REQUIREMENTS));
    classify(containers)
}

static EMPTY_REQUIREMENTS: ResourceRequirements = ResourceRequirements {
    claims: None,
    limits: None,
    requests: None,
};

fn names_qos_resource(requirements: &ResourceRequirements) -> bool {
    [&requirements.requests, &requirements.limits]
        .into_iter()
        .flatten()
        .any(|list| {
            list.keys()
                .any(|name| QOS_RESOURCES.contains(&name.as_str()))
        })
}

fn classify<'a>(all: impl Iterator<Item = &'a ResourceRequirements>) -> QosClass {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    for requirements in all {
        let own_limits = positive_quantities(requirements.limits.as_ref());
        let mut own_requests = positive_quantities(requirements.requests.as_ref());
        for (name, limit) in &own_limits {
            let explicitly_requested = requirements
                .requests
                .as_ref()
                .is_some_and(|r| r.contains_key(*name));
            if !explicitly_requested {
                own_requests.insert(name, *limit);
            }
        }
        for (name, value) in &own_requests {
            *requests.entry(name).or_default() += value;
        }
        for (name, value) in &own_limits {
            *limits.entry(name).or_default() += value;
        }
        if !QOS_RESOURCES
            .iter()
            .all(|name| own_limits.contains_key(name))
        {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests
            .iter()
            .all(|(name, request)| limits.get(name) == Some(request))
    {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

fn positive_quantities(list: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<&str, i128> {
    list.into_iter()
        .flatten()
        .filter(|(name, _)| QOS_RESOURCES.contains(&name.as_str()))
        .filter_map(|(name, quantity)| {
            parse_quantity(&quantity.0)
                .ok()
                .filter(|nanos| *nanos > 0)
                .map(|nanos| (name.as_str(), nanos))
        })
        .collect()
}

/// Parses a Kubernetes resource quantity (`"100m"`, `"1.5"`, `"64Mi"`, `"1e3"`, `"2G"`) into
/// billionths of the base unit, rounding a finer fraction up as the API server does.
pub fn parse_quantity(value: &str) -> Result<i128, CmError> {
    let invalid = || CmError::InvalidQuantity {
        value: value.to_owned(),
    };
    let (negative, rest) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let (int_digits, frac_digits) = number.split_once('.').unwrap_or((number, ""));
    if (int_digits.is_empty() && frac_digits.is_empty()) || frac_digits.contains('.') {
        return Err(invalid());
    }

    // value = mantissa * 2^binary_exp * 10^decimal_exp, with the mantissa holding every digit.
    let (binary_exp, suffix_decimal_exp): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        other => {
            let exponent = other
                .strip_prefix(['e', 'E'])
                .filter(|e| !e.is_empty())
                .ok_or_else(invalid)?;
            (0, exponent.parse::<i32>().map_err(|_| invalid())?)
        }
    };
    let digits = format!("{int_digits}{frac_digits}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(invalid());
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| invalid())?
    };
    let frac_len = i32::try_from(frac_digits.len()).map_err(|_| invalid())?;
    let decimal_exp = suffix_decimal_exp + 9 - frac_len;

    let scaled = mantissa
        .checked_mul(1i128 << binary_exp)
        .ok_or_else(invalid)?;
    let nanos = if decimal_exp >= 0 {
        10i128
            .checked_pow(decimal_exp.unsigned_abs())
            .and_then(|factor| scaled.checked_mul(factor))
            .ok_or_else(invalid)?
    } else {
        match 10i128.checked_pow(decimal_exp.unsigned_abs()) {
            // Round up so a tiny positive quantity never becomes zero.
            Some(divisor) => (scaled + divisor - 1) / divisor,
            None => i128::from(scaled > 0),
        }
    };
    Ok(if negative { -nanos } else { nanos })
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let list = |entries: &[(&str, &str)]| {
            (!entries.is_empty()).then(|| {
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        ResourceRequirements {
            claims: None,
            requests: list(requests),
            limits: list(limits),
        }
    }

    fn container(resources: ResourceRequirements) -> Container {
        Container {
            name: "c".to_owned(),
            resources: Some(resources),
            ..Container::default()
        }
    }

    fn bare() -> Container {
        Container {
            name: "c".to_owned(),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    const FULL: &[(&str, &str)] = &[("cpu", "100m"), ("memory", "64Mi")];

    #[test]
    fn best_effort_without_cpu_or_memory() {
        assert_eq!(qos_class(&pod(vec![bare()], vec![])), QosClass::BestEffort);
        assert_eq!(qos_class(&Pod::default()), QosClass::BestEffort);
        let only_other = resources(&[("ephemeral-storage", "1Gi")], &[("nvidia.com/gpu", "1")]);
        assert_eq!(
            qos_class(&pod(vec![container(only_other)], vec![])),
            QosClass::BestEffort
        );
        let zeros = resources(&[("cpu", "0")], &[("memory", "0")]);
        assert_eq!(
            qos_class(&pod(vec![container(zeros)], vec![])),
            QosClass::BestEffort
        );
    }

    #[test]
    fn guaranteed_when_limits_equal_requests() {
        let equal = resources(FULL, FULL);
        assert_eq!(
            qos_class(&pod(vec![container(equal)], vec![])),
            QosClass::Guaranteed
        );
        // Requests default to limits.
        let limits_only = resources(&[], FULL);
        assert_eq!(
            qos_class(&pod(
                vec![container(limits_only.clone())],
                vec![container(limits_only)]
            )),
            QosClass::Guaranteed
        );
        // Equal values in different notations are equal.
        let notations = resources(&[("cpu", "0.1"), ("memory", "67108864")], FULL);
        assert_eq!(
            qos_class(&pod(vec![container(notations)], vec![])),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn burstable_cases() {
        let lower_request = resources(&[("cpu", "50m"), ("memory", "64Mi")], FULL);
        let only_cpu_limit = resources(&[], &[("cpu", "1")]);
        let requests_only = resources(FULL, &[]);
        for r in [lower_request, only_cpu_limit, requests_only] {
            assert_eq!(
                qos_class(&pod(vec![container(r)], vec![])),
                QosClass::Burstable
            );
        }
        // One guaranteed container next to a best-effort one.
        assert_eq!(
            qos_class(&pod(vec![container(resources(FULL, FULL)), bare()], vec![])),
            QosClass::Burstable
        );
        // A best-effort app container with a guaranteed-looking init container.
        assert_eq!(
            qos_class(&pod(vec![bare()], vec![container(resources(FULL, FULL))])),
            QosClass::Burstable
        );
        // An init container that only requests makes the whole pod burstable.
        assert_eq!(
            qos_class(&pod(
                vec![container(resources(FULL, FULL))],
                vec![container(resources(&[("cpu", "10m")], &[]))]
            )),
            QosClass::Burstable
        );
    }

    #[test]
    fn pod_level_resources_decide_alone() {
        let mut p = pod(vec![bare()], vec![]);
        if let Some(spec) = p.spec.as_mut() {
            spec.resources = Some(resources(&[], FULL));
        }
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        if let Some(spec) = p.spec.as_mut() {
            spec.resources = Some(resources(&[("memory", "1Gi")], &[]));
        }
        assert_eq!(qos_class(&p), QosClass::Burstable);
    }

    #[test]
    fn quantities() {
        let cases = [
            ("1", 1_000_000_000),
            ("100m", 100_000_000),
            ("0.1", 100_000_000),
            (".5", 500_000_000),
            ("1Ki", 1024 * 1_000_000_000),
            ("64Mi", 64 * (1 << 20) * 1_000_000_000),
            ("1.5Gi", 3 * (1 << 29) * 1_000_000_000),
            ("2k", 2_000 * 1_000_000_000),
            ("1e3", 1_000 * 1_000_000_000),
            ("1E3", 1_000 * 1_000_000_000),
            ("5e-3", 5_000_000),
            ("1E", 1_000_000_000_000_000_000 * 1_000_000_000),
            ("1n", 1),
            ("0.1n", 1),
            ("-2", -2_000_000_000),
            ("0", 0),
        ];
        for (input, nanos) in cases {
            assert_eq!(parse_quantity(input).ok(), Some(nanos), "{input}");
        }
        for bad in ["", "abc", "1.2.3", "1Xi", "1e", "m", "1 Gi", "1e999"] {
            assert!(
                matches!(parse_quantity(bad), Err(CmError::InvalidQuantity { .. })),
                "{bad:?} accepted"
            );
        }
    }
}
