//! Capacity and allocatable: the kubelet's `MachineInfo` setter (`pkg/kubelet/nodestatus`) with
//! cAdvisor's `CapacityFromMachineInfo` and the container manager's node-allocatable reservation
//! (`pkg/kubelet/cm/node_container_manager_linux.go`: system-reserved + kube-reserved + the hard
//! eviction thresholds on `memory.available` and `nodefs.available`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{NANOS, QuantityFormat, format_quantity};
use super::{NodeEvent, NodeFacts, NodeStatusError, node_system_info};
use crate::cm::parse_quantity;
use crate::events::EventType;

const CPU: &str = "cpu";
const MEMORY: &str = "memory";
const PODS: &str = "pods";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub(super) const HUGEPAGES_PREFIX: &str = "hugepages-";

/// The resources the Ready condition requires in capacity (ephemeral-storage because local storage
/// capacity isolation is always on here).
pub(super) const REQUIRED_CAPACITY: [&str; 4] = [CPU, MEMORY, PODS, EPHEMERAL_STORAGE];

/// Sets machine ids, capacity and allocatable. Capacity is updated key by key, never replaced, so
/// resources others advertise on the node (extended resources) stay.
pub(super) fn set_machine_info(
    status: &mut NodeStatus,
    facts: &NodeFacts<'_>,
    events: &mut Vec<NodeEvent>,
    errors: &mut Vec<NodeStatusError>,
) {
    let machine = facts.machine;
    let info = node_system_info(status);
    info.machine_id.clone_from(&machine.machine_id);
    info.system_uuid.clone_from(&machine.system_uuid);
    if !info.boot_id.is_empty() && info.boot_id != machine.boot_id {
        events.push(NodeEvent {
            event_type: EventType::Warning,
            reason: "Rebooted",
            message: format!(
                "Node {} has been rebooted, boot id: {}",
                facts.node_name, machine.boot_id
            ),
        });
    }
    info.boot_id.clone_from(&machine.boot_id);

    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    let mut set = |name: String, nanos: i128, format| {
        capacity.insert(name, Quantity(format_quantity(nanos, format)));
    };
    set(
        CPU.to_owned(),
        i128::from(machine.num_cores) * NANOS,
        QuantityFormat::DecimalSi,
    );
    set(
        MEMORY.to_owned(),
        i128::from(machine.memory_capacity_bytes) * NANOS,
        QuantityFormat::BinarySi,
    );
    for (size_kib, pages) in &machine.hugepages {
        let page_bytes = i128::from(*size_kib) * 1024;
        set(
            hugepage_resource_name(page_bytes),
            page_bytes * i128::from(*pages) * NANOS,
            QuantityFormat::BinarySi,
        );
    }
    let pods = if facts.pods_per_core > 0 {
        facts
            .max_pods
            .min(machine.num_cores.saturating_mul(facts.pods_per_core))
    } else {
        facts.max_pods
    };
    set(
        PODS.to_owned(),
        i128::from(pods) * NANOS,
        QuantityFormat::DecimalSi,
    );
    if let Some(bytes) = facts.ephemeral_storage_capacity_bytes {
        set(
            EPHEMERAL_STORAGE.to_owned(),
            i128::from(bytes) * NANOS,
            QuantityFormat::BinarySi,
        );
    }
    if machine.swap_capacity_bytes > 0 {
        let swap = node_system_info(status)
            .swap
            .get_or_insert_with(Default::default);
        swap.capacity = i64::try_from(machine.swap_capacity_bytes).ok();
    }

    let reservation = reservation(status.capacity.as_ref(), facts, errors);
    set_allocatable(status, &reservation);
}

/// `hugepages-<page size>`, the size written as a quantity: `hugepages-2Mi`, `hugepages-1Gi`.
pub(super) fn hugepage_resource_name(page_bytes: i128) -> String {
    format!(
        "{HUGEPAGES_PREFIX}{}",
        format_quantity(page_bytes * NANOS, QuantityFormat::BinarySi)
    )
}

/// Whether a resource is extended (a domain-prefixed name outside `kubernetes.io/`), the kind the
/// kubelet drops from allocatable once it is gone from capacity.
pub(super) fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// What node allocatable withholds from each resource, in billionths: system-reserved +
/// kube-reserved + the hard eviction threshold. The container manager only knows cpu, memory,
/// ephemeral-storage and huge pages, so pods and extended resources are never reserved.
fn reservation(
    capacity: Option<&BTreeMap<String, Quantity>>,
    facts: &NodeFacts<'_>,
    errors: &mut Vec<NodeStatusError>,
) -> BTreeMap<String, i128> {
    let mut reserved: BTreeMap<String, i128> = BTreeMap::new();
    let reservable = |name: &str| {
        [CPU, MEMORY, EPHEMERAL_STORAGE].contains(&name) || name.starts_with(HUGEPAGES_PREFIX)
    };
    for (setting, list) in [
        ("systemReserved", facts.system_reserved),
        ("kubeReserved", facts.kube_reserved),
    ] {
        for (name, value) in list.iter().filter(|(name, _)| reservable(name)) {
            match parse_quantity(value) {
                Ok(nanos) => *reserved.entry(name.clone()).or_default() += nanos,
                Err(_) => errors.push(NodeStatusError::InvalidQuantity {
                    setting,
                    resource: name.clone(),
                    value: value.clone(),
                }),
            }
        }
    }
    for (signal, resource) in [
        ("memory.available", MEMORY),
        ("nodefs.available", EPHEMERAL_STORAGE),
    ] {
        let Some(threshold) = facts.eviction_hard.get(signal) else {
            continue;
        };
        let capacity_nanos = capacity
            .and_then(|capacity| capacity.get(resource))
            .and_then(|quantity| parse_quantity(&quantity.0).ok())
            .unwrap_or(0);
        match threshold_nanos(threshold, capacity_nanos) {
            Some(nanos) => *reserved.entry(resource.to_owned()).or_default() += nanos,
            None => errors.push(NodeStatusError::InvalidQuantity {
                setting: "evictionHard",
                resource: signal.to_owned(),
                value: threshold.clone(),
            }),
        }
    }
    reserved.retain(|_, nanos| *nanos != 0);
    reserved
}

/// An eviction threshold as an amount: a quantity as written, or a percentage of capacity computed
/// as the kubelet does (a `float32` fraction of the capacity's whole units, truncated to whole
/// units). `None` when it is neither, or a percentage outside 0–100.
fn threshold_nanos(threshold: &str, capacity_nanos: i128) -> Option<i128> {
    let Some(percent) = threshold.strip_suffix('%') else {
        return parse_quantity(threshold).ok();
    };
    let fraction = percent.parse::<f32>().ok()? / 100.0;
    if !(0.0..=1.0).contains(&fraction) {
        return None;
    }
    // `Quantity.Value()` rounds up to whole units.
    let units = (capacity_nanos + NANOS - 1).div_euclid(NANOS);
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let amount = (units as f64 * f64::from(fraction)) as i128;
    Some(amount * NANOS)
}

/// Allocatable = capacity − reservation, floored at zero, then memory − every huge page pool.
fn set_allocatable(status: &mut NodeStatus, reservation: &BTreeMap<String, i128>) {
    let capacity = status.capacity.clone().unwrap_or_default();
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    allocatable.retain(|name, _| capacity.contains_key(name) || !is_extended_resource(name));
    for (name, quantity) in &capacity {
        let value = match (reservation.get(name), parse_quantity(&quantity.0)) {
            (Some(reserved), Ok(nanos)) => Quantity(format_quantity(
                (nanos - reserved).max(0),
                QuantityFormat::of(&quantity.0),
            )),
            // Nothing withheld: the capacity's own text, as a copied quantity keeps it.
            _ => quantity.clone(),
        };
        allocatable.insert(name.clone(), value);
    }
    let hugepages: i128 = capacity
        .iter()
        .filter(|(name, _)| name.starts_with(HUGEPAGES_PREFIX))
        .filter_map(|(_, quantity)| parse_quantity(&quantity.0).ok())
        .sum();
    if hugepages != 0
        && let Some(memory) = allocatable.get_mut(MEMORY)
        && let Ok(nanos) = parse_quantity(&memory.0)
    {
        *memory = Quantity(format_quantity(
            (nanos - hugepages).max(0),
            QuantityFormat::BinarySi,
        ));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{facts_with, machine};
    use super::*;

    fn quantities(list: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<&str, &str> {
        list.into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
            .collect()
    }

    fn run(facts: &NodeFacts<'_>, status: &mut NodeStatus) -> Vec<NodeStatusError> {
        let mut errors = Vec::new();
        set_machine_info(status, facts, &mut Vec::new(), &mut errors);
        errors
    }

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn capacity_reads_as_the_kubelet_writes_it() {
        let machine = machine();
        let facts = facts_with(&machine);
        let mut status = NodeStatus::default();
        assert!(run(&facts, &mut status).is_empty());
        assert_eq!(
            quantities(status.capacity.as_ref()),
            BTreeMap::from([
                ("cpu", "4"),
                ("memory", "8029064Ki"),
                ("pods", "110"),
                ("ephemeral-storage", "51474912Ki"),
                ("hugepages-2Mi", "32Mi"),
                ("hugepages-1Gi", "0"),
            ])
        );
        let info = status.node_info.as_ref().unwrap();
        assert_eq!(info.machine_id, "m-id");
        assert_eq!(info.boot_id, "boot-1");
        assert_eq!(info.swap, None);
    }

    #[test]
    fn allocatable_subtracts_reserved_eviction_and_hugepages() {
        let machine = machine();
        let system = map(&[("cpu", "100m"), ("memory", "512Mi"), ("pid", "1000")]);
        let kube = map(&[
            ("cpu", "0.4"),
            ("memory", "256Mi"),
            ("ephemeral-storage", "1Gi"),
        ]);
        let eviction = map(&[
            ("memory.available", "100Mi"),
            ("nodefs.available", "10%"),
            ("imagefs.available", "15%"),
        ]);
        let mut facts = facts_with(&machine);
        facts.system_reserved = &system;
        facts.kube_reserved = &kube;
        facts.eviction_hard = &eviction;
        let mut status = NodeStatus::default();
        assert!(run(&facts, &mut status).is_empty());
        // 50 GiB-ish minus 1Gi minus 10% computed as the kubelet does, with float32(0.1): the
        // threshold is 5271031067 bytes, 78 more than an exact tenth.
        assert_eq!(
            quantities(status.allocatable.as_ref()),
            BTreeMap::from([
                ("cpu", "3500m"),
                // 8029064Ki - (512 + 256 + 100)Mi reserved - 32Mi of huge pages.
                ("memory", "7107464Ki"),
                ("pods", "110"),
                ("ephemeral-storage", "46365536997"),
                ("hugepages-2Mi", "32Mi"),
                ("hugepages-1Gi", "0"),
            ])
        );
        assert_eq!(
            quantities(status.allocatable.as_ref())["memory"],
            "7107464Ki"
        );
    }

    #[test]
    fn allocatable_is_floored_at_zero_and_bad_settings_are_reported() {
        let machine = machine();
        let system = map(&[("cpu", "8"), ("memory", "lots")]);
        let eviction = map(&[("memory.available", "200%")]);
        let mut facts = facts_with(&machine);
        facts.system_reserved = &system;
        facts.eviction_hard = &eviction;
        let mut status = NodeStatus::default();
        let errors = run(&facts, &mut status);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(quantities(status.allocatable.as_ref())["cpu"], "0");
        assert!(
            errors[0].to_string().contains("systemReserved"),
            "{}",
            errors[0]
        );
        // Memory still loses its huge pages.
        assert_eq!(
            quantities(status.allocatable.as_ref())["memory"],
            "7996296Ki"
        );
    }

    #[test]
    fn pods_per_core_caps_pods_and_capacity_keeps_foreign_resources() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.pods_per_core = 10;
        let mut status = NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/gpu".to_owned(),
                Quantity("2".to_owned()),
            )])),
            allocatable: Some(BTreeMap::from([(
                "example.com/fpga".to_owned(),
                Quantity("1".to_owned()),
            )])),
            ..NodeStatus::default()
        };
        run(&facts, &mut status);
        let capacity = quantities(status.capacity.as_ref());
        assert_eq!(capacity["pods"], "40");
        assert_eq!(capacity["example.com/gpu"], "2");
        let allocatable = quantities(status.allocatable.as_ref());
        assert_eq!(allocatable["example.com/gpu"], "2");
        assert!(!allocatable.contains_key("example.com/fpga"));
    }

    #[test]
    fn a_new_boot_id_is_a_reboot_event() {
        let machine = machine();
        let facts = facts_with(&machine);
        let mut status = NodeStatus::default();
        let mut events = Vec::new();
        set_machine_info(&mut status, &facts, &mut events, &mut Vec::new());
        assert!(events.is_empty(), "first report is no reboot");
        node_system_info(&mut status).boot_id = "boot-0".to_owned();
        set_machine_info(&mut status, &facts, &mut events, &mut Vec::new());
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "Rebooted");
        assert_eq!(events[0].event_type, EventType::Warning);
        assert_eq!(
            events[0].message,
            "Node node-1 has been rebooted, boot id: boot-1"
        );
    }

    #[test]
    fn swap_capacity_is_reported_when_there_is_swap() {
        let mut machine = machine();
        machine.swap_capacity_bytes = 1 << 30;
        let facts = facts_with(&machine);
        let mut status = NodeStatus::default();
        run(&facts, &mut status);
        let swap = status.node_info.unwrap().swap.unwrap();
        assert_eq!(swap.capacity, Some(1 << 30));
    }
}
