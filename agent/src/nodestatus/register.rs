//! Registration: the Node this agent creates (the kubelet's `initialNode`) and what it reconciles
//! on a Node of the same name that already exists (`tryRegisterWithAPIServer`: the attach-detach
//! annotation, the default labels, missing capacity, huge page sizes).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::capacity::HUGEPAGES_PREFIX;
use super::{NodeFacts, StatusUpdate, set_node_status};
use crate::cm::parse_quantity;

/// Tells the attach/detach controller, not the node agent, to attach this node's volumes.
const CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_OS: &str = "kubernetes.io/os";
const LABEL_ARCH: &str = "kubernetes.io/arch";
const LABEL_BETA_OS: &str = "beta.kubernetes.io/os";
const LABEL_BETA_ARCH: &str = "beta.kubernetes.io/arch";

/// The labels registration keeps in line with the initial node on an existing Node (when the
/// initial node has them); `--node-labels` are not among them, as upstream.
const DEFAULT_LABELS: [&str; 12] = [
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    "node.kubernetes.io/windows-build",
    LABEL_BETA_OS,
    LABEL_BETA_ARCH,
];

/// The Node to create: the name, the hostname/os/arch labels (stable and beta) overridden by
/// `extra_labels` (`--node-labels`), `taints` (`--register-with-taints`, left out when empty), the
/// controller-managed attach-detach annotation and the full status of a first round.
pub fn initial_node(
    facts: &NodeFacts<'_>,
    extra_labels: &BTreeMap<String, String>,
    taints: &[Taint],
    now: Timestamp,
) -> (Node, StatusUpdate) {
    let os = facts.machine.operating_system.as_str();
    let arch = facts.machine.architecture.as_str();
    let mut labels: BTreeMap<String, String> = [
        (LABEL_HOSTNAME, facts.hostname),
        (LABEL_OS, os),
        (LABEL_ARCH, arch),
        (LABEL_BETA_OS, os),
        (LABEL_BETA_ARCH, arch),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .collect();
    labels.extend(extra_labels.clone());
    let mut node = Node {
        metadata: ObjectMeta {
            name: Some(facts.node_name.to_owned()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_MANAGED_ATTACH_DETACH.to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then(|| taints.to_vec()),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus::default()),
    };
    let update = set_node_status(&mut node, facts, now);
    (node, update)
}

/// What registration changes on a Node of this name that already exists, given the Node it wanted
/// to create: `Some(updated existing node)` to patch with
/// [`node_status_patch`](super::node_status_patch)`(existing, updated)`, `None` when it is already
/// in line. Taints, other labels and annotations of an existing Node are left alone, as upstream.
pub fn reconcile_existing(existing: &Node, wanted: &Node) -> Option<Node> {
    let mut node = existing.clone();
    let mut changed = reconcile_attach_detach(&mut node, wanted);
    changed |= reconcile_default_labels(&mut node, wanted);
    changed |= reconcile_resources(&mut node, wanted);
    changed.then_some(node)
}

fn reconcile_attach_detach(node: &mut Node, wanted: &Node) -> bool {
    let get = |node: &Node| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(CONTROLLER_MANAGED_ATTACH_DETACH))
            .cloned()
    };
    let wanted_value = get(wanted);
    if get(node) == wanted_value {
        return false;
    }
    let annotations = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match wanted_value {
        Some(value) => annotations.insert(CONTROLLER_MANAGED_ATTACH_DETACH.to_owned(), value),
        None => annotations.remove(CONTROLLER_MANAGED_ATTACH_DETACH),
    };
    true
}

fn reconcile_default_labels(node: &mut Node, wanted: &Node) -> bool {
    let Some(wanted_labels) = &wanted.metadata.labels else {
        return false;
    };
    let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for name in DEFAULT_LABELS {
        let Some(value) = wanted_labels.get(name) else {
            continue;
        };
        if labels.get(name) != Some(value) {
            labels.insert(name.to_owned(), value.clone());
            changed = true;
        }
        // An empty default is not written.
        if value.is_empty() {
            labels.remove(name);
        }
    }
    changed
}

/// Fills missing capacity/allocatable from the wanted node and brings huge page sizes in line:
/// sizes the machine offers are added or updated, sizes it no longer offers are removed.
fn reconcile_resources(node: &mut Node, wanted: &Node) -> bool {
    let empty = NodeStatus::default();
    let wanted_status = wanted.status.as_ref().unwrap_or(&empty);
    let status = node.status.get_or_insert_with(NodeStatus::default);
    let mut changed = false;
    for (list, wanted_list) in [
        (&mut status.capacity, &wanted_status.capacity),
        (&mut status.allocatable, &wanted_status.allocatable),
    ] {
        if list.is_none() {
            changed |= wanted_list.is_some();
            *list = Some(wanted_list.clone().unwrap_or_default());
        }
    }
    let wanted_capacity = wanted_status.capacity.clone().unwrap_or_default();
    let wanted_allocatable = wanted_status.allocatable.clone().unwrap_or_default();
    let zero = Quantity("0".to_owned());
    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    let mut offered = BTreeSet::new();
    for (name, wanted_size) in wanted_capacity
        .iter()
        .filter(|(name, _)| name.starts_with(HUGEPAGES_PREFIX))
    {
        offered.insert(name.clone());
        let known = capacity.contains_key(name);
        if !known || !same_value(capacity.get(name), Some(wanted_size)) {
            capacity.insert(name.clone(), wanted_size.clone());
            changed = true;
        }
        let wanted_free = wanted_allocatable.get(name).unwrap_or(&zero);
        if !known || !same_value(allocatable.get(name), Some(wanted_free)) {
            allocatable.insert(name.clone(), wanted_free.clone());
            changed = true;
        }
    }
    let dropped: Vec<String> = capacity
        .keys()
        .filter(|name| name.starts_with(HUGEPAGES_PREFIX) && !offered.contains(*name))
        .cloned()
        .collect();
    for name in dropped {
        capacity.remove(&name);
        allocatable.remove(&name);
        changed = true;
    }
    changed
}

/// Quantities compared by value; a missing one counts as zero, as a Go zero `Quantity` does.
fn same_value(a: Option<&Quantity>, b: Option<&Quantity>) -> bool {
    let value = |q: Option<&Quantity>| q.map_or(Ok(0), |q| parse_quantity(&q.0));
    match (value(a), value(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{facts_with, machine};
    use super::*;

    fn labels(node: &Node) -> BTreeMap<&str, &str> {
        node.metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    fn wanted() -> Node {
        let machine = machine();
        let facts = facts_with(&machine);
        initial_node(&facts, &BTreeMap::new(), &[], Timestamp::UNIX_EPOCH).0
    }

    #[test]
    fn the_initial_node_has_default_labels_overridden_by_node_labels_and_taints() {
        let machine = machine();
        let facts = facts_with(&machine);
        let extra = BTreeMap::from([
            ("node-role.kubernetes.io/worker".to_owned(), String::new()),
            (LABEL_HOSTNAME.to_owned(), "custom".to_owned()),
        ]);
        let taint = Taint {
            key: "dedicated".to_owned(),
            value: Some("infra".to_owned()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        };
        let (node, update) = initial_node(
            &facts,
            &extra,
            std::slice::from_ref(&taint),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(node.metadata.name.as_deref(), Some("node-1"));
        assert_eq!(
            labels(&node),
            BTreeMap::from([
                ("beta.kubernetes.io/arch", "amd64"),
                ("beta.kubernetes.io/os", "linux"),
                ("kubernetes.io/arch", "amd64"),
                ("kubernetes.io/hostname", "custom"),
                ("kubernetes.io/os", "linux"),
                ("node-role.kubernetes.io/worker", ""),
            ])
        );
        assert_eq!(node.spec.as_ref().unwrap().taints, Some(vec![taint]));
        assert_eq!(
            node.metadata.annotations.as_ref().unwrap()[CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
        let status = node.status.unwrap();
        assert_eq!(status.conditions.unwrap().len(), 4);
        assert_eq!(status.capacity.unwrap()["cpu"].0, "4");
        // The pressure conditions are new, so each reports its state once.
        assert_eq!(update.events.len(), 3);
    }

    #[test]
    fn no_taints_leaves_spec_taints_out() {
        assert_eq!(wanted().spec.unwrap().taints, None);
    }

    #[test]
    fn an_existing_node_in_line_needs_nothing() {
        let wanted = wanted();
        assert!(reconcile_existing(&wanted, &wanted).is_none());
    }

    #[test]
    fn default_labels_and_annotation_are_restored_other_labels_kept() {
        let wanted = wanted();
        let mut existing = wanted.clone();
        let labels = existing.metadata.labels.as_mut().unwrap();
        labels.insert(LABEL_HOSTNAME.to_owned(), "old-name".to_owned());
        labels.remove(LABEL_ARCH);
        labels.insert("team".to_owned(), "a".to_owned());
        existing.metadata.annotations = None;
        let updated = reconcile_existing(&existing, &wanted).unwrap();
        let got = labels_of(&updated);
        assert_eq!(got[LABEL_HOSTNAME], "node-1.example");
        assert_eq!(got[LABEL_ARCH], "amd64");
        assert_eq!(got["team"], "a");
        assert_eq!(
            updated.metadata.annotations.unwrap()[CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
    }

    fn labels_of(node: &Node) -> BTreeMap<String, String> {
        node.metadata.labels.clone().unwrap()
    }

    #[test]
    fn hugepage_sizes_follow_the_machine() {
        let wanted = wanted();
        let mut existing = wanted.clone();
        let status = existing.status.as_mut().unwrap();
        let capacity = status.capacity.as_mut().unwrap();
        capacity.insert("hugepages-2Mi".to_owned(), Quantity("2Mi".to_owned()));
        capacity.remove("hugepages-1Gi");
        capacity.insert("hugepages-32Mi".to_owned(), Quantity("0".to_owned()));
        status
            .allocatable
            .as_mut()
            .unwrap()
            .insert("hugepages-32Mi".to_owned(), Quantity("0".to_owned()));
        let updated = reconcile_existing(&existing, &wanted).unwrap();
        let status = updated.status.unwrap();
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["hugepages-2Mi"].0, "32Mi");
        assert_eq!(capacity["hugepages-1Gi"].0, "0");
        assert!(!capacity.contains_key("hugepages-32Mi"));
        assert!(!status.allocatable.unwrap().contains_key("hugepages-32Mi"));
    }

    #[test]
    fn missing_capacity_is_filled_but_equal_values_in_other_units_are_kept() {
        let wanted = wanted();
        let mut existing = wanted.clone();
        existing.status.as_mut().unwrap().capacity = None;
        let updated = reconcile_existing(&existing, &wanted).unwrap();
        assert_eq!(
            updated.status.as_ref().unwrap().capacity,
            wanted.status.as_ref().unwrap().capacity
        );

        let mut existing = wanted.clone();
        existing
            .status
            .as_mut()
            .unwrap()
            .capacity
            .as_mut()
            .unwrap()
            .insert("hugepages-2Mi".to_owned(), Quantity("32768Ki".to_owned()));
        assert!(reconcile_existing(&existing, &wanted).is_none());
    }
}
