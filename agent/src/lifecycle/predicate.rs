//! The admission predicate: before a pod that was added to the node starts, decide whether it can
//! run here next to the pods already admitted — the OS it asks for, the node's free resources (pod
//! slots, cpu, memory, ephemeral storage, hugepages, extended resources), its node selector and
//! required node affinity, `spec.nodeName`, its host ports and the node's `NoExecute` taints.
//!
//! Corresponds to the kubelet's `pkg/kubelet/lifecycle/predicate.go` and the scheduler checks it
//! re-runs (`pkg/scheduler` `AdmissionCheck`: the `noderesources`, `nodeaffinity`, `nodename` and
//! `nodeports` plugins, then `tainttoleration`), with the pod requests of
//! `k8s.io/component-helpers/resource` (`PodRequests`) and the selector matching of
//! `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`. Reasons and messages are upstream's,
//! so `kubectl describe` reads the same as on a kubelet node.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cm::parse_quantity;
use crate::podconfig::is_static_pod;

/// Reason for a pod whose `kubernetes.io/os` label names another OS than the node's.
pub const REASON_POD_OS_SELECTOR_MISMATCH: &str = "PodOSSelectorNodeLabelDoesNotMatch";
/// Reason for a pod whose `spec.os.name` names another OS than the node's.
pub const REASON_POD_OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
/// Reason for a pod asking for `supplementalGroupsPolicy: Strict` on a node that cannot enforce it.
pub const REASON_SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED: &str =
    "SupplementalGroupsPolicyNotSupported";
/// Reason for a pod that could not be judged, here one with a malformed resource quantity.
pub const REASON_UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
/// Prefix of the reason for a resource the node has too little of: the resource name follows
/// (`OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`, `OutOfpods`, `OutOfexample.com/gpu`).
pub const INSUFFICIENT_RESOURCE_PREFIX: &str = "OutOf";

/// Why a pod was refused: the kubelet's reason and message, which end up in the pod's status
/// (the kubelet prefixes the message with "Pod was rejected: ") and in a Warning event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    fn new(reason: &str, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// Why a quantity the decision depends on could not be read. Upstream cannot meet these (the API
/// server validates quantities), but manifests reach this agent unvalidated. The parser's own
/// error is not kept: it only repeats the value, which the message already quotes.
#[derive(Debug, thiserror::Error)]
enum PredicateError {
    #[error("invalid {resource} quantity {value:?} in {place}")]
    InvalidQuantity {
        resource: String,
        value: String,
        place: String,
    },
    #[error("negative {resource} quantity {value:?} in {place}")]
    NegativeQuantity {
        resource: String,
        value: String,
        place: String,
    },
    #[error("invalid {resource} quantity {value:?} in the node's allocatable")]
    InvalidAllocatable { resource: String, value: String },
}

impl From<PredicateError> for Rejection {
    fn from(err: PredicateError) -> Self {
        Self::new(REASON_UNEXPECTED_ADMISSION_ERROR, err.to_string())
    }
}

/// A scheduler plugin's failure as the kubelet reports it: reason = plugin name, message =
/// `Predicate <name> failed: <description>`.
struct PredicateFailure {
    name: &'static str,
    description: &'static str,
}

impl PredicateFailure {
    fn rejection(&self) -> Rejection {
        Rejection::new(
            self.name,
            format!("Predicate {} failed: {}", self.name, self.description),
        )
    }
}

const NODE_AFFINITY: PredicateFailure = PredicateFailure {
    name: "NodeAffinity",
    description: "node(s) didn't match Pod's node affinity/selector",
};
const NODE_NAME: PredicateFailure = PredicateFailure {
    name: "NodeName",
    description: "node(s) didn't match the requested node name",
};
const NODE_PORTS: PredicateFailure = PredicateFailure {
    name: "NodePorts",
    description: "node(s) didn't have free ports for the requested pod ports",
};
const TAINT_TOLERATION: PredicateFailure = PredicateFailure {
    name: "TaintToleration",
    description: "node(s) had taints that the pod didn't tolerate",
};

const LABEL_OS: &str = "kubernetes.io/os";
/// The OS the kubelet compares against (`runtime.GOOS`); Go and Rust both call Linux "linux".
const NODE_OS: &str = std::env::consts::OS;

const CPU: &str = "cpu";
const MEMORY: &str = "memory";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
const PODS: &str = "pods";
const HUGEPAGES_PREFIX: &str = "hugepages-";
const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;

const BIND_ALL_HOST_IP: &str = "0.0.0.0";
const DEFAULT_PROTOCOL: &str = "TCP";

/// Resource amounts by resource name, in billionths of the base unit (what `parse_quantity` gives).
type ResourceList = BTreeMap<String, i128>;

/// Admits `pod` onto `node` next to `active_pods` (pods already admitted and not terminated; the
/// pod itself is skipped if it is listed, as the kubelet passes only the other pods).
///
/// Checks run in the kubelet's order and the first failure is the answer: the OS label and
/// `spec.os`, `supplementalGroupsPolicy: Strict` against `status.features`, the pod's resource
/// quantities (malformed or negative: `UnexpectedAdmissionError`), then the scheduler's checks —
/// pod slots and resources against `status.allocatable` minus the other pods' requests
/// (`OutOf<resource>`), node selector and required node affinity, `spec.nodeName`, host ports —
/// and last the node's `NoExecute` taints, which static pods skip. The node must carry its
/// allocatable: a resource missing from it counts as zero, so without `pods` nothing is admitted,
/// as upstream.
///
/// Left out, as they need state this pure check does not have: preempting pods to make room for a
/// critical pod (the kubelet's admission failure handler), device-plugin and DRA-backed resources,
/// the allocated sizes of resized pods (`status` resources) and re-reading the node when only the
/// affinity failed.
pub fn admit<P: Borrow<Pod>>(node: &Node, active_pods: &[P], pod: &Pod) -> Result<(), Rejection> {
    let no_spec;
    let spec = if let Some(spec) = &pod.spec {
        spec
    } else {
        no_spec = PodSpec::default();
        &no_spec
    };
    check_os(pod, spec)?;
    check_supplemental_groups_policy(node, spec)?;
    validate_requests(spec)?;

    let others: Vec<&Pod> = active_pods
        .iter()
        .map(Borrow::borrow)
        .filter(|other| !is_same_pod(other, pod))
        .collect();
    check_resources(node, &others, spec)?;
    if !matches_node_affinity(spec, node) {
        return Err(NODE_AFFINITY.rejection());
    }
    if !fits_node_name(spec, node) {
        return Err(NODE_NAME.rejection());
    }
    if !fits_host_ports(&others, spec) {
        return Err(NODE_PORTS.rejection());
    }
    // Static pods are not checked against taints: they are the node's own, and a NoExecute taint
    // (say, not-ready) must not keep the control plane pods from starting.
    if !is_static_pod(pod) && has_untolerated_no_execute_taint(node, spec) {
        return Err(TAINT_TOLERATION.rejection());
    }
    Ok(())
}

/// The pod's effective resource requests, in billionths of the base unit (as `parse_quantity`
/// gives them):
/// - regular containers and sidecars (init containers with `restartPolicy: Always`) run together,
///   so their requests add up;
/// - each other init container runs alone next to the sidecars started before it, so it needs its
///   own request plus theirs;
/// - the pod needs the larger of the two, per resource;
/// - pod-level requests (`spec.resources.requests`) replace that for cpu, memory and hugepages;
/// - `spec.overhead` (the runtime's own cost) comes on top.
///
/// Quantities that do not parse are left out here; `admit` rejects a pod that has any.
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, i128> {
    pod.spec
        .as_ref()
        .map(|spec| aggregate_requests(spec, |_| true))
        .unwrap_or_default()
}

/// `pod_requests` over the container requests that `keep` accepts by name.
fn aggregate_requests(spec: &PodSpec, keep: impl Fn(&str) -> bool) -> ResourceList {
    let requests_of = |container: &Container| parse_list(container_requests(container), &keep);
    let mut total = ResourceList::new();
    for container in &spec.containers {
        add_into(&mut total, &requests_of(container));
    }
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for container in spec.init_containers.iter().flatten() {
        let own = requests_of(container);
        let while_running = if is_sidecar(container) {
            add_into(&mut total, &own);
            add_into(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut with_sidecars = own;
            add_into(&mut with_sidecars, &sidecars);
            with_sidecars
        };
        max_into(&mut init_peak, &while_running);
    }
    max_into(&mut total, &init_peak);

    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    total.extend(parse_list(pod_level, is_pod_level_resource));
    add_into(&mut total, &parse_list(spec.overhead.as_ref(), |_| true));
    total
}

fn container_requests(container: &Container) -> Option<&BTreeMap<String, Quantity>> {
    container.resources.as_ref()?.requests.as_ref()
}

/// An init container that keeps running next to the regular containers.
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn is_pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

fn parse_list(
    list: Option<&BTreeMap<String, Quantity>>,
    keep: impl Fn(&str) -> bool,
) -> ResourceList {
    list.into_iter()
        .flatten()
        .filter(|(name, _)| keep(name))
        .filter_map(|(name, quantity)| Some((name.clone(), parse_quantity(&quantity.0).ok()?)))
        .collect()
}

fn add_into(total: &mut ResourceList, more: &ResourceList) {
    for (name, amount) in more {
        *total.entry(name.clone()).or_default() += amount;
    }
}

fn max_into(peak: &mut ResourceList, candidate: &ResourceList) {
    for (name, amount) in candidate {
        let entry = peak.entry(name.clone()).or_insert(*amount);
        *entry = (*entry).max(*amount);
    }
}

/// Every request quantity `pod_requests` reads must parse and not be negative: a pod the agent
/// cannot size is refused instead of being counted as asking for nothing.
fn validate_requests(spec: &PodSpec) -> Result<(), PredicateError> {
    for container in &spec.containers {
        validate_list(container_requests(container), || {
            format!("the requests of container {:?}", container.name)
        })?;
    }
    for container in spec.init_containers.iter().flatten() {
        validate_list(container_requests(container), || {
            format!("the requests of init container {:?}", container.name)
        })?;
    }
    validate_list(spec.overhead.as_ref(), || "spec.overhead".to_owned())?;
    validate_list(
        spec.resources.as_ref().and_then(|r| r.requests.as_ref()),
        || "spec.resources.requests".to_owned(),
    )
}

fn validate_list(
    list: Option<&BTreeMap<String, Quantity>>,
    place: impl Fn() -> String,
) -> Result<(), PredicateError> {
    for (resource, quantity) in list.into_iter().flatten() {
        match parse_quantity(&quantity.0) {
            Ok(nanos) if nanos < 0 => {
                return Err(PredicateError::NegativeQuantity {
                    resource: resource.clone(),
                    value: quantity.0.clone(),
                    place: place(),
                });
            }
            Ok(_) => {}
            Err(_) => {
                return Err(PredicateError::InvalidQuantity {
                    resource: resource.clone(),
                    value: quantity.0.clone(),
                    place: place(),
                });
            }
        }
    }
    Ok(())
}

fn is_same_pod(a: &Pod, b: &Pod) -> bool {
    matches!((&a.metadata.uid, &b.metadata.uid), (Some(x), Some(y)) if x == y)
}

fn check_os(pod: &Pod, spec: &PodSpec) -> Result<(), Rejection> {
    // The kubelet compares with its own OS rather than the node object's label, which a status
    // update may not have written yet.
    let os_label = pod.metadata.labels.as_ref().and_then(|l| l.get(LABEL_OS));
    if os_label.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection::new(
            REASON_POD_OS_SELECTOR_MISMATCH,
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        ));
    }
    if spec.os.as_ref().is_some_and(|os| os.name != NODE_OS) {
        return Err(Rejection::new(
            REASON_POD_OS_NOT_SUPPORTED,
            "Failed to admit pod as the OS field doesn't match node OS",
        ));
    }
    Ok(())
}

fn check_supplemental_groups_policy(node: &Node, spec: &PodSpec) -> Result<(), Rejection> {
    let strict = spec
        .security_context
        .as_ref()
        .and_then(|context| context.supplemental_groups_policy.as_deref())
        == Some("Strict");
    let supported = node
        .status
        .as_ref()
        .and_then(|status| status.features.as_ref())
        .and_then(|features| features.supplemental_groups_policy)
        == Some(true);
    if strict && !supported {
        return Err(Rejection::new(
            REASON_SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED,
            "SupplementalGroupsPolicy=Strict is not supported in this node",
        ));
    }
    Ok(())
}

/// The scheduler's resource fit: one more pod must fit `allocatable.pods`, and each resource the pod
/// requests must fit what `allocatable` leaves after the other pods' requests.
fn check_resources(node: &Node, others: &[&Pod], spec: &PodSpec) -> Result<(), Rejection> {
    let allocatable = node
        .status
        .as_ref()
        .and_then(|status| status.allocatable.as_ref());
    let capacity = |name: &str| -> Result<i128, PredicateError> {
        let Some(quantity) = allocatable.and_then(|list| list.get(name)) else {
            return Ok(0);
        };
        parse_quantity(&quantity.0)
            .map(|nanos| in_scheduler_units(name, nanos))
            .map_err(|_| PredicateError::InvalidAllocatable {
                resource: name.to_owned(),
                value: quantity.0.clone(),
            })
    };

    let used_pods = others.len() as i128;
    let allowed_pods = capacity(PODS)?;
    if used_pods + 1 > allowed_pods {
        return Err(insufficient(PODS, 1, used_pods, allowed_pods));
    }

    // Extended resources the node does not list at all are not checked: they may be cluster-level
    // resources the node knows nothing about (upstream's removeMissingExtendedResources).
    let listed = |name: &str| allocatable.is_some_and(|list| list.contains_key(name));
    let wanted = scheduler_amounts(&aggregate_requests(spec, |name| {
        !is_extended_resource_name(name) || listed(name)
    }));
    let mut used = BTreeMap::<String, i128>::new();
    for other in others {
        for (name, amount) in scheduler_amounts(&pod_requests(other)) {
            *used.entry(name).or_default() += amount;
        }
    }

    // Upstream walks the other resources in Go map order and reports the first failure; sorted
    // names make the answer the same on every run.
    let fixed = [CPU, MEMORY, EPHEMERAL_STORAGE];
    let others_by_name = wanted
        .keys()
        .map(String::as_str)
        .filter(|name| !fixed.contains(name));
    for name in fixed.into_iter().chain(others_by_name) {
        let requested = wanted.get(name).copied().unwrap_or(0);
        if requested <= 0 {
            continue;
        }
        let in_use = used.get(name).copied().unwrap_or(0);
        let available = capacity(name)?;
        if requested > available - in_use {
            return Err(insufficient(name, requested, in_use, available));
        }
    }
    Ok(())
}

fn insufficient(resource: &str, requested: i128, used: i128, capacity: i128) -> Rejection {
    Rejection::new(
        &format!("{INSUFFICIENT_RESOURCE_PREFIX}{resource}"),
        format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    )
}

/// The amounts the scheduler compares: cpu in millicores, everything else in whole units, both
/// rounded up (`Quantity.MilliValue` / `Value`). Resources it does not track (`pods` and unknown
/// unprefixed names) are dropped.
fn scheduler_amounts(requests: &ResourceList) -> BTreeMap<String, i128> {
    requests
        .iter()
        .filter(|(name, _)| {
            [CPU, MEMORY, EPHEMERAL_STORAGE].contains(&name.as_str())
                || is_scalar_resource_name(name)
        })
        .map(|(name, nanos)| (name.clone(), in_scheduler_units(name, *nanos)))
        .collect()
}

fn in_scheduler_units(name: &str, nanos: i128) -> i128 {
    let per_unit = if name == CPU {
        NANOS_PER_MILLI
    } else {
        NANOS_PER_UNIT
    };
    let whole = nanos / per_unit;
    if nanos % per_unit > 0 {
        whole + 1
    } else {
        whole
    }
}

/// Resources the scheduler counts besides cpu, memory and ephemeral storage: extended resources,
/// hugepages, `*kubernetes.io/` resources and attachable volumes.
fn is_scalar_resource_name(name: &str) -> bool {
    is_extended_resource_name(name)
        || name.starts_with(HUGEPAGES_PREFIX)
        || name.contains("kubernetes.io/")
        || name.starts_with("attachable-volumes-")
}

/// A resource outside the `kubernetes.io` namespace (`example.com/gpu`), named so that its quota
/// name `requests.<name>` is a qualified name.
fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    !native && !name.starts_with("requests.") && is_qualified_name(&format!("requests.{name}"))
}

/// `[prefix/]name`: the prefix a DNS subdomain, the name 1–63 alphanumerics with `-_.` inside.
fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn is_dns_subdomain(value: &str) -> bool {
    let is_lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    value.len() <= 253
        && value.split('.').all(|label| {
            label.starts_with(is_lower_alnum)
                && label.ends_with(is_lower_alnum)
                && label.chars().all(|c| is_lower_alnum(c) || c == '-')
        })
}

/// The node selector and the required node affinity must both match the node's labels.
fn matches_node_affinity(spec: &PodSpec, node: &Node) -> bool {
    let no_labels = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&no_labels);
    let selector_matches = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    if !selector_matches {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|affinity| affinity.node_affinity.as_ref())
        .and_then(|node_affinity| {
            node_affinity
                .required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let Some(required) = required else {
        return true;
    };
    // Terms are ORed; with no usable term nothing matches.
    let node_name = node
        .metadata
        .name
        .as_deref()
        .filter(|name| !name.is_empty());
    required
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, labels, node_name))
}

/// All of a term's requirements must match. An empty term selects nothing, and a term with a malformed
/// requirement (unknown operator, wrong number of values) matches no node, as upstream's parse
/// error does.
fn term_matches(
    term: &NodeSelectorTerm,
    labels: &BTreeMap<String, String>,
    node_name: Option<&str>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    // Every requirement is evaluated before the verdict so that a malformed one fails the term
    // even after another did not match.
    let labels_match = expressions.iter().try_fold(true, |all, requirement| {
        let matched = label_requirement_matches(requirement, labels)?;
        Some(all && matched)
    });
    let fields_match = fields.iter().try_fold(true, |all, requirement| {
        let matched = field_requirement_matches(requirement, node_name)?;
        Some(all && matched)
    });
    // Upstream only compares fields when the node has any (a name); a nameless node passes them.
    labels_match == Some(true) && fields_match.is_some_and(|matched| matched || node_name.is_none())
}

/// `None` when the requirement is malformed.
fn label_requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let values = requirement.values.as_deref().unwrap_or_default();
    let label = labels.get(&requirement.key);
    match requirement.operator.as_str() {
        "In" if !values.is_empty() => Some(label.is_some_and(|value| values.contains(value))),
        "NotIn" if !values.is_empty() => Some(label.is_none_or(|value| !values.contains(value))),
        "Exists" if values.is_empty() => Some(label.is_some()),
        "DoesNotExist" if values.is_empty() => Some(label.is_none()),
        operator @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return None;
            };
            let bound: i64 = bound.parse().ok()?;
            // A label that is missing or not an integer does not match.
            let value = label.and_then(|value| value.parse::<i64>().ok());
            Some(value.is_some_and(|value| {
                if operator == "Gt" {
                    value > bound
                } else {
                    value < bound
                }
            }))
        }
        _ => None,
    }
}

/// Field requirements select on `metadata.name` (any other field reads as empty), with `In` or
/// `NotIn` and exactly one value. `None` when the requirement is malformed.
fn field_requirement_matches(
    requirement: &NodeSelectorRequirement,
    node_name: Option<&str>,
) -> Option<bool> {
    let [value] = requirement.values.as_deref().unwrap_or_default() else {
        return None;
    };
    let field = if requirement.key == "metadata.name" {
        node_name.unwrap_or_default()
    } else {
        ""
    };
    match requirement.operator.as_str() {
        "In" => Some(field == value),
        "NotIn" => Some(field != value),
        _ => None,
    }
}

fn fits_node_name(spec: &PodSpec, node: &Node) -> bool {
    spec.node_name.as_deref().is_none_or(|wanted| {
        wanted.is_empty() || wanted == node.metadata.name.as_deref().unwrap_or_default()
    })
}

/// A host port as the scheduler keys it, with upstream's defaults filled in.
struct HostPort<'a> {
    ip: &'a str,
    protocol: &'a str,
    port: i32,
}

impl HostPort<'_> {
    /// A port bound on every address conflicts with the same port and protocol on any address.
    fn conflicts_with(&self, other: &HostPort<'_>) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == BIND_ALL_HOST_IP || other.ip == BIND_ALL_HOST_IP)
    }
}

/// The host ports of the containers that run for the pod's whole life: regular containers and
/// sidecars (other init containers have exited before those start).
fn host_ports(spec: &PodSpec) -> impl Iterator<Item = HostPort<'_>> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|container| is_sidecar(container));
    sidecars
        .chain(&spec.containers)
        .flat_map(|container| container.ports.iter().flatten())
        .filter_map(|port| {
            Some(HostPort {
                port: port.host_port.filter(|number| *number > 0)?,
                ip: port
                    .host_ip
                    .as_deref()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or(BIND_ALL_HOST_IP),
                protocol: port
                    .protocol
                    .as_deref()
                    .filter(|protocol| !protocol.is_empty())
                    .unwrap_or(DEFAULT_PROTOCOL),
            })
        })
}

fn fits_host_ports(others: &[&Pod], spec: &PodSpec) -> bool {
    let used: Vec<HostPort<'_>> = others
        .iter()
        .filter_map(|other| other.spec.as_ref())
        .flat_map(host_ports)
        .collect();
    host_ports(spec).all(|wanted| !used.iter().any(|taken| wanted.conflicts_with(taken)))
}

/// The kubelet only enforces `NoExecute` taints: `NoSchedule` ones are the scheduler's business,
/// and a pod bound here despite them (by `spec.nodeName`) is meant to run.
fn has_untolerated_no_execute_taint(node: &Node, spec: &PodSpec) -> bool {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    node.spec
        .as_ref()
        .and_then(|node_spec| node_spec.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|taint| taint.effect == "NoExecute")
        .any(|taint| {
            !tolerations
                .iter()
                .any(|toleration| tolerates(toleration, taint))
        })
}

/// An empty effect or key in the toleration matches any; `Exists` matches any value, `Equal` (or
/// no operator) the same value.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        // Lt and Gt need the alpha TaintTolerationComparisonOperators gate; without it upstream
        // lets them match nothing.
        _ => false,
    }
}

#[cfg(test)]
mod tests;
