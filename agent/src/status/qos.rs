//! The pod's `QoS` class (the kubelet's `pkg/apis/core/v1/helper/qos.GetPodQOS`), used for
//! `status.qosClass`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// `Guaranteed`, `Burstable` or `BestEffort` over the pod's init and app containers. A request left
/// out where a limit is given counts as equal to the limit, as the API server's defaulting would make
/// it (static pods never pass through that defaulting). Quantities that do not parse count as zero;
/// validating them is the pod source's job.
pub(super) fn qos_class(spec: &PodSpec) -> &'static str {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for container in spec.containers.iter().chain(init) {
        let container_limits = positive(container, Resources::Limits);
        let mut container_requests = positive(container, Resources::Requests);
        for (name, value) in &container_limits {
            let declared = container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some_and(|r| r.contains_key(*name));
            if !declared {
                container_requests.insert(name, *value);
            }
        }
        if !QOS_RESOURCES
            .iter()
            .all(|name| container_limits.contains_key(name))
        {
            guaranteed = false;
        }
        for (name, value) in container_requests {
            *requests.entry(name).or_default() += value;
        }
        for (name, value) in container_limits {
            *limits.entry(name).or_default() += value;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests
            .iter()
            .all(|(name, request)| limits.get(name) == Some(request))
    {
        return "Guaranteed";
    }
    "Burstable"
}

#[derive(Clone, Copy)]
enum Resources {
    Requests,
    Limits,
}

/// The container's cpu and memory quantities of one kind that are greater than zero, in milli-units.
fn positive(container: &Container, kind: Resources) -> BTreeMap<&'static str, i128> {
    let Some(resources) = container.resources.as_ref() else {
        return BTreeMap::new();
    };
    let map = match kind {
        Resources::Requests => resources.requests.as_ref(),
        Resources::Limits => resources.limits.as_ref(),
    };
    let Some(map) = map else {
        return BTreeMap::new();
    };
    QOS_RESOURCES
        .iter()
        .filter_map(|name| {
            let value = map.get(*name).and_then(milli_value)?;
            (value > 0).then_some((*name, value))
        })
        .collect()
}

/// A quantity (`500m`, `1.5`, `128Mi`, `1e3`, `2G`) in milli-units, rounded up; `None` when it does
/// not parse or overflows.
fn milli_value(quantity: &Quantity) -> Option<i128> {
    let text = quantity.0.trim();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = digits.parse().ok()?;
    let mut denominator = 10_i128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let mut numerator = mantissa.checked_mul(1000)?;
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (10_i128.pow(12), 1),
        "P" => (10_i128.pow(15), 1),
        "E" => (10_i128.pow(18), 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let power: i32 = exp[1..].parse().ok()?;
            let scale = 10_i128.checked_pow(power.unsigned_abs())?;
            if power >= 0 { (scale, 1) } else { (1, scale) }
        }
        _ => return None,
    };
    numerator = numerator.checked_mul(mul)?;
    denominator = denominator.checked_mul(div)?;
    let value = (numerator + denominator - 1) / denominator;
    Some(if negative { -value } else { value })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        Container {
            name: "c".to_owned(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn spec(containers: Vec<Container>) -> PodSpec {
        PodSpec {
            containers,
            ..PodSpec::default()
        }
    }

    #[test]
    fn quantities_parse_to_milli_units() {
        let q = |s: &str| milli_value(&Quantity(s.to_owned()));
        assert_eq!(q("500m"), Some(500));
        assert_eq!(q("1"), Some(1000));
        assert_eq!(q("0.5"), Some(500));
        assert_eq!(q("1Ki"), Some(1_024_000));
        assert_eq!(q("1e3"), Some(1_000_000));
        assert_eq!(q("1G"), q("1000M"));
        assert_eq!(q("abc"), None);
        assert_eq!(q("1Qi"), None);
    }

    #[test]
    fn classes() {
        assert_eq!(qos_class(&spec(vec![Container::default()])), "BestEffort");
        assert_eq!(
            qos_class(&spec(vec![container(
                &[],
                &[("cpu", "1"), ("memory", "128Mi")]
            )])),
            "Guaranteed",
            "requests default to limits"
        );
        assert_eq!(
            qos_class(&spec(vec![container(
                &[("cpu", "1000m"), ("memory", "134217728")],
                &[("cpu", "1"), ("memory", "128Mi")]
            )])),
            "Guaranteed",
            "equal quantities in different notation"
        );
        assert_eq!(
            qos_class(&spec(vec![container(&[("cpu", "100m")], &[("cpu", "1")])])),
            "Burstable"
        );
        assert_eq!(
            qos_class(&spec(vec![
                container(&[], &[("cpu", "1"), ("memory", "1Gi")]),
                Container::default()
            ])),
            "Burstable",
            "one container without limits"
        );
    }
}
