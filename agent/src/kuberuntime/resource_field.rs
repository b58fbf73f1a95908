//! The downward API's `resourceFieldRef` in environment variables (the kubelet's
//! `containerResourceRuntimeValue` with `defaultPodLimitsForDownwardAPI`, and
//! `pkg/api/v1/resource` `ExtractContainerResourceValue`): a container's limit or request, divided
//! by the divisor and rounded up. A limit the container does not set (or sets to zero) for cpu,
//! memory or ephemeral storage reads as the node's allocatable amount, as with the kubelet.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::container::ConfigError;
use crate::cm::parse_quantity;

/// Resources whose missing limit defaults to the node's allocatable.
const DEFAULTED_LIMITS: &[&str] = &["cpu", "memory", "ephemeral-storage"];

/// The value of `selector` for the variable `var` of container `current` in `pod`.
pub fn resource_field_value(
    selector: &ResourceFieldSelector,
    pod: &Pod,
    current: &str,
    var: &str,
    node_allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, ConfigError> {
    let unsupported = || ConfigError::UnsupportedResource {
        container: current.to_owned(),
        var: var.to_owned(),
        resource: selector.resource.clone(),
    };
    let name = selector
        .container_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(current);
    let container = find_container(pod, name).ok_or_else(|| ConfigError::UnknownContainer {
        container: current.to_owned(),
        var: var.to_owned(),
        referenced: name.to_owned(),
    })?;
    let (kind, resource) = selector.resource.split_once('.').ok_or_else(unsupported)?;
    let supported = matches!(resource, "cpu" | "memory" | "ephemeral-storage")
        || resource.starts_with("hugepages-");
    if !supported || !matches!(kind, "limits" | "requests") {
        return Err(unsupported());
    }
    let resources = container.resources.as_ref();
    let from_spec = if kind == "limits" {
        resources.and_then(|r| r.limits.as_ref())
    } else {
        resources.and_then(|r| r.requests.as_ref())
    }
    .and_then(|list| list.get(resource))
    .map(|q| q.0.as_str());
    let invalid = |value: &str| ConfigError::InvalidQuantity {
        container: current.to_owned(),
        resource: "resourceFieldRef",
        value: value.to_owned(),
    };
    let parse = |value: &str| parse_quantity(value).map_err(|_| invalid(value));
    let mut amount = from_spec.map(parse).transpose()?.unwrap_or(0);
    if kind == "limits" && amount == 0 && DEFAULTED_LIMITS.contains(&resource) {
        amount = node_allocatable
            .get(resource)
            .map(|q| parse(&q.0))
            .transpose()?
            .unwrap_or(0);
    }
    let divisor = selector
        .divisor
        .as_ref()
        .map(|q| parse(&q.0))
        .transpose()?
        .filter(|d| *d != 0)
        .unwrap_or(1_000_000_000);
    if divisor < 0 {
        return Err(invalid(
            &selector
                .divisor
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_default(),
        ));
    }
    // Both in billionths of the unit: the quotient is the value in divisors, rounded up.
    let quotient = amount / divisor + i128::from(amount % divisor > 0);
    Ok(quotient.to_string())
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    use super::*;

    fn pod(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Pod {
        let list = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            )
        };
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".to_owned(),
                    resources: Some(ResourceRequirements {
                        limits: list(limits),
                        requests: list(requests),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn selector(resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            container_name: None,
            divisor: divisor.map(|d| Quantity(d.to_owned())),
            resource: resource.to_owned(),
        }
    }

    fn node() -> BTreeMap<String, Quantity> {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity("2".to_owned())),
            ("memory".to_owned(), Quantity("4Gi".to_owned())),
        ])
    }

    fn value(pod: &Pod, resource: &str, divisor: Option<&str>) -> String {
        resource_field_value(&selector(resource, divisor), pod, "main", "V", &node()).unwrap()
    }

    #[test]
    fn cpu_rounds_up_to_the_divisor() {
        let pod = pod(&[("cpu", "250m")], &[("cpu", "100m")]);
        assert_eq!(value(&pod, "limits.cpu", None), "1");
        assert_eq!(value(&pod, "limits.cpu", Some("1m")), "250");
        assert_eq!(value(&pod, "requests.cpu", Some("1m")), "100");
    }

    #[test]
    fn memory_in_the_divisors_unit() {
        let pod = pod(&[("memory", "64Mi")], &[]);
        assert_eq!(value(&pod, "limits.memory", None), "67108864");
        assert_eq!(value(&pod, "limits.memory", Some("1Mi")), "64");
        assert_eq!(value(&pod, "limits.memory", Some("1G")), "1");
    }

    #[test]
    fn a_missing_limit_is_the_nodes_allocatable_and_a_missing_request_is_zero() {
        let pod = pod(&[], &[]);
        assert_eq!(value(&pod, "limits.cpu", None), "2");
        assert_eq!(value(&pod, "limits.memory", Some("1Mi")), "4096");
        assert_eq!(value(&pod, "requests.memory", None), "0");
    }

    #[test]
    fn unknown_resources_and_containers_are_named() {
        let pod = pod(&[], &[]);
        let err = resource_field_value(&selector("limits.gpu", None), &pod, "main", "V", &node())
            .unwrap_err();
        assert!(err.to_string().contains("limits.gpu"), "{err}");
        let mut other = selector("limits.cpu", None);
        other.container_name = Some("sidecar".to_owned());
        let err = resource_field_value(&other, &pod, "main", "V", &node()).unwrap_err();
        assert!(err.to_string().contains("sidecar"), "{err}");
    }
}
