//! The words of an eviction (the kubelet's `evictionMessage`, `getThresholdMetInfo` and the
//! admission message in `pkg/kubelet/eviction/helpers.go` and `eviction_manager.go`): the pod
//! status reason `Evicted`, its message naming the starved resource, the threshold, what was
//! available and each container using more than it requested, and the `DisruptionTarget`
//! condition the evicted pod gets.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;

use super::signals::{PressureCondition, Signal, Threshold};
use super::thresholds::Observation;
use crate::nodestatus::{QuantityFormat, format_quantity};

/// The evicted pod's status reason and the event's (the kubelet's `Reason`).
pub const REASON: &str = "Evicted";
/// The `DisruptionTarget` condition's reason on an evicted pod.
pub const DISRUPTION_REASON: &str = "TerminationByKubelet";
/// The node event before the manager starts reclaiming.
pub const THRESHOLD_MET_EVENT: &str = "EvictionThresholdMet";

const NANOS: i128 = 1_000_000_000;

/// What one container of the pod uses, from the stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    /// Working set in bytes.
    pub memory: Option<i64>,
    /// Bytes of its writable layer and logs.
    pub disk: Option<i64>,
}

/// `amount` as apimachinery writes a quantity of that format.
pub fn quantity_text(amount: i64, binary: bool) -> String {
    let format = if binary {
        QuantityFormat::BinarySi
    } else {
        QuantityFormat::DecimalSi
    };
    format_quantity(i128::from(amount) * NANOS, format)
}

/// The eviction message for `pod`, evicted for `threshold` observed as `observed`, with its
/// containers' usage (`None` when the stats had nothing for the pod).
pub fn eviction_message(
    threshold: &Threshold,
    observed: Option<&Observation>,
    pod: &Pod,
    containers: Option<&[ContainerUsage]>,
) -> String {
    let signal = threshold.signal;
    let resource = signal.resource();
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some(observed) = observed {
        let quantity = threshold.value.amount(observed.capacity);
        let _ = write!(
            message,
            "Threshold quantity: {}, available: {}. ",
            quantity_text(quantity, threshold.value.is_binary()),
            quantity_text(observed.available, signal.is_bytes()),
        );
    }
    let specs = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for usage in containers.unwrap_or_default() {
        let used = match signal {
            Signal::MemoryAvailable => usage.memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => usage.disk,
            _ => None,
        };
        let (Some(used), Some(spec)) = (used, specs.iter().find(|c| c.name == usage.name)) else {
            continue;
        };
        let request = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| {
                let nanos = crate::cm::parse_quantity(&q.0).ok()?;
                Some((nanos, QuantityFormat::of(&q.0)))
            });
        let request_bytes = request.map_or(0, |(nanos, _)| nanos / NANOS);
        if i128::from(used) > request_bytes {
            let request_text = request.map_or_else(
                || "0".to_owned(),
                |(nanos, format)| format_quantity(nanos, format),
            );
            let _ = write!(
                message,
                "Container {} was using {}, request is {request_text}, has larger consumption \
                 of {resource}. ",
                usage.name,
                quantity_text(used, true),
            );
        }
    }
    message
}

/// Why a pod is refused while the node is under pressure.
pub fn admission_message(conditions: &BTreeSet<PressureCondition>) -> String {
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    format!("The node had condition: [{}]. ", names.join(" "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::eviction::signals::ThresholdValue;

    fn pod_with(containers: &[(&str, Option<&str>)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .map(|(name, request)| Container {
                        name: (*name).to_owned(),
                        resources: Some(ResourceRequirements {
                            requests: request.map(|r| {
                                BTreeMap::from([("memory".to_owned(), Quantity(r.to_owned()))])
                            }),
                            ..ResourceRequirements::default()
                        }),
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn usage(name: &str, memory: i64) -> ContainerUsage {
        ContainerUsage {
            name: name.to_owned(),
            memory: Some(memory),
            disk: None,
        }
    }

    #[test]
    fn the_memory_message_names_threshold_available_and_each_container_over_its_request() {
        let threshold = Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity {
                amount: 100 << 20,
                binary: true,
            },
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let observed = Observation {
            available: 98_580 << 10,
            capacity: 8 << 30,
        };
        let pod = pod_with(&[("hog", Some("100Mi")), ("quiet", Some("1Gi")), ("be", None)]);
        let message = eviction_message(
            &threshold,
            Some(&observed),
            &pod,
            Some(&[
                usage("hog", 512 << 20),
                usage("quiet", 10 << 20),
                usage("be", 1_000_000),
            ]),
        );
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: \
             98580Ki. Container hog was using 512Mi, request is 100Mi, has larger consumption of \
             memory. Container be was using 1000000, request is 0, has larger consumption of memory. "
        );
    }

    #[test]
    fn a_percentage_threshold_is_written_as_its_quantity_and_inodes_in_decimal() {
        let threshold = Threshold {
            signal: Signal::NodeFsInodesFree,
            value: ThresholdValue::Percentage(0.05),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let observed = Observation {
            available: 4000,
            capacity: 100_000,
        };
        assert_eq!(
            eviction_message(&threshold, Some(&observed), &Pod::default(), None),
            "The node was low on resource: inodes. Threshold quantity: 5000, available: 4k. "
        );
    }

    #[test]
    fn admission_names_every_condition() {
        let conditions = BTreeSet::from([PressureCondition::Disk, PressureCondition::Memory]);
        assert_eq!(
            admission_message(&conditions),
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
    }
}
