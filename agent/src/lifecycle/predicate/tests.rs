use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, Node, NodeAffinity, NodeFeatures, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, NodeStatus, Pod, PodOS,
    PodSecurityContext, PodSpec, ResourceRequirements, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

/// No pod admitted yet.
const NO_PODS: &[Pod] = &[];
const NODE: &str = "node-a";
const GI: i128 = 1 << 30;
const NANOS: i128 = 1_000_000_000;

fn quantities(entries: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    entries
        .iter()
        .map(|(name, value)| ((*name).to_owned(), Quantity((*value).to_owned())))
        .collect()
}

fn strings(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn container(name: &str, requests: &[(&str, &str)]) -> Container {
    Container {
        name: name.to_owned(),
        resources: (!requests.is_empty()).then(|| ResourceRequirements {
            requests: Some(quantities(requests)),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

fn sidecar(name: &str, requests: &[(&str, &str)]) -> Container {
    Container {
        restart_policy: Some("Always".to_owned()),
        ..container(name, requests)
    }
}

fn with_host_port(mut container: Container, port: i32, ip: &str, protocol: &str) -> Container {
    container
        .ports
        .get_or_insert_with(Vec::new)
        .push(ContainerPort {
            container_port: 8080,
            host_port: Some(port),
            host_ip: (!ip.is_empty()).then(|| ip.to_owned()),
            protocol: (!protocol.is_empty()).then(|| protocol.to_owned()),
            ..ContainerPort::default()
        });
    container
}

fn pod(name: &str, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers,
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn requesting(name: &str, requests: &[(&str, &str)]) -> Pod {
    pod(name, vec![container("app", requests)])
}

fn edit(mut pod: Pod, change: impl FnOnce(&mut PodSpec)) -> Pod {
    change(pod.spec.as_mut().unwrap());
    pod
}

fn node(allocatable: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_owned()),
            labels: Some(strings(&[
                ("kubernetes.io/hostname", NODE),
                ("zone", "a"),
                ("generation", "5"),
            ])),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(quantities(allocatable)),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

fn roomy_node() -> Node {
    node(&[
        ("pods", "110"),
        ("cpu", "4"),
        ("memory", "8Gi"),
        ("ephemeral-storage", "100Gi"),
        ("hugepages-2Mi", "64Mi"),
        ("example.com/gpu", "2"),
    ])
}

fn tainted(mut node: Node, taints: Vec<Taint>) -> Node {
    node.spec = Some(NodeSpec {
        taints: Some(taints),
        ..NodeSpec::default()
    });
    node
}

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        value: (!value.is_empty()).then(|| value.to_owned()),
        effect: effect.to_owned(),
        ..Taint::default()
    }
}

fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
    let optional = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Toleration {
        key: optional(key),
        operator: optional(operator),
        value: optional(value),
        effect: optional(effect),
        ..Toleration::default()
    }
}

fn rejected(node: &Node, active: &[Pod], pod: &Pod) -> Rejection {
    match admit(node, active, pod) {
        Ok(()) => panic!("pod {:?} was admitted", pod.metadata.name),
        Err(rejection) => rejection,
    }
}

fn assert_rejected(node: &Node, active: &[Pod], pod: &Pod, reason: &str, message: &str) {
    assert_eq!(
        rejected(node, active, pod),
        Rejection {
            reason: reason.to_owned(),
            message: message.to_owned()
        }
    );
}

fn requests(entries: &[(&str, i128)]) -> BTreeMap<String, i128> {
    entries
        .iter()
        .map(|(name, nanos)| ((*name).to_owned(), *nanos))
        .collect()
}

// --- a pod that fits ---

#[test]
fn a_pod_that_fits_is_admitted() {
    let active = vec![
        requesting("web", &[("cpu", "1"), ("memory", "1Gi")]),
        pod(
            "proxy",
            vec![with_host_port(container("envoy", &[]), 80, "", "")],
        ),
    ];
    let candidate = edit(
        pod(
            "api",
            vec![with_host_port(
                container(
                    "app",
                    &[
                        ("cpu", "3"),
                        ("memory", "7Gi"),
                        ("ephemeral-storage", "1Gi"),
                        ("hugepages-2Mi", "64Mi"),
                        ("example.com/gpu", "2"),
                    ],
                ),
                443,
                "",
                "",
            )],
        ),
        |spec| {
            spec.node_name = Some(NODE.to_owned());
            spec.node_selector = Some(strings(&[("zone", "a")]));
        },
    );
    let node = tainted(roomy_node(), vec![taint("dedicated", "db", "NoSchedule")]);
    assert_eq!(admit(&node, &active, &candidate), Ok(()));
}

#[test]
fn a_pod_requesting_nothing_needs_only_a_pod_slot() {
    let node = node(&[("pods", "1")]);
    assert_eq!(
        admit(&node, NO_PODS, &pod("idle", vec![container("app", &[])])),
        Ok(())
    );
}

#[test]
fn a_pod_without_a_spec_only_takes_a_slot() {
    let node = node(&[("pods", "1")]);
    let bare = Pod {
        spec: None,
        ..pod("bare", Vec::new())
    };
    assert_eq!(admit(&node, NO_PODS, &bare), Ok(()));
    assert_rejected(
        &node,
        &[requesting("other", &[])],
        &bare,
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1",
    );
}

// --- resources ---

#[test]
fn too_many_pods_is_out_of_pods() {
    let node = node(&[("pods", "2"), ("cpu", "4")]);
    let active = vec![requesting("a", &[]), requesting("b", &[])];
    assert_rejected(
        &node,
        &active,
        &requesting("c", &[]),
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
    );
    assert_eq!(admit(&node, &active[..1], &requesting("c", &[])), Ok(()));
}

#[test]
fn a_node_without_allocatable_pods_admits_nothing() {
    assert_rejected(
        &node(&[("cpu", "4")]),
        &[],
        &requesting("c", &[]),
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 0, capacity: 0",
    );
}

#[test]
fn the_pod_itself_among_the_active_pods_is_not_counted() {
    let node = node(&[("pods", "1"), ("cpu", "1")]);
    let candidate = requesting("c", &[("cpu", "1")]);
    assert_eq!(
        admit(&node, std::slice::from_ref(&candidate), &candidate),
        Ok(())
    );
}

#[test]
fn cpu_is_compared_in_millicores() {
    let node = roomy_node();
    let active = vec![
        requesting("a", &[("cpu", "1500m")]),
        requesting("b", &[("cpu", "2")]),
    ];
    assert_rejected(
        &node,
        &active,
        &requesting("c", &[("cpu", "600m")]),
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 600, used: 3500, capacity: 4000",
    );
    // Exactly the rest fits.
    assert_eq!(
        admit(&node, &active, &requesting("c", &[("cpu", "500m")])),
        Ok(())
    );
}

#[test]
fn fractions_of_a_millicore_round_up() {
    let node = node(&[("pods", "10"), ("cpu", "1m")]);
    assert_rejected(
        &node,
        &[requesting("a", &[("cpu", "100u")])],
        &requesting("c", &[("cpu", "100u")]),
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 1, used: 1, capacity: 1",
    );
}

#[test]
fn memory_is_compared_in_bytes() {
    let node = roomy_node();
    let active = vec![requesting("a", &[("memory", "6Gi")])];
    assert_rejected(
        &node,
        &active,
        &requesting("c", &[("memory", "3Gi")]),
        "OutOfmemory",
        "Node didn't have enough resource: memory, requested: 3221225472, used: 6442450944, capacity: 8589934592",
    );
    assert_eq!(
        admit(&node, &active, &requesting("c", &[("memory", "2Gi")])),
        Ok(())
    );
}

#[test]
fn ephemeral_storage_is_checked() {
    let node = node(&[("pods", "10"), ("ephemeral-storage", "10G")]);
    assert_rejected(
        &node,
        &[requesting("a", &[("ephemeral-storage", "8G")])],
        &requesting("c", &[("ephemeral-storage", "3G")]),
        "OutOfephemeral-storage",
        "Node didn't have enough resource: ephemeral-storage, requested: 3000000000, used: 8000000000, capacity: 10000000000",
    );
}

#[test]
fn hugepages_are_checked_even_when_the_node_has_none() {
    let node = roomy_node();
    assert_rejected(
        &node,
        &[],
        &requesting("c", &[("hugepages-2Mi", "128Mi")]),
        "OutOfhugepages-2Mi",
        "Node didn't have enough resource: hugepages-2Mi, requested: 134217728, used: 0, capacity: 67108864",
    );
    // hugepages are not extended resources: a size the node does not list has a capacity of 0.
    assert_rejected(
        &node,
        &[],
        &requesting("c", &[("hugepages-1Gi", "1Gi")]),
        "OutOfhugepages-1Gi",
        "Node didn't have enough resource: hugepages-1Gi, requested: 1073741824, used: 0, capacity: 0",
    );
}

#[test]
fn extended_resources_are_checked_when_the_node_lists_them() {
    let node = roomy_node();
    assert_rejected(
        &node,
        &[requesting("a", &[("example.com/gpu", "1")])],
        &requesting("c", &[("example.com/gpu", "2")]),
        "OutOfexample.com/gpu",
        "Node didn't have enough resource: example.com/gpu, requested: 2, used: 1, capacity: 2",
    );
}

#[test]
fn extended_resources_the_node_does_not_list_are_ignored() {
    let node = roomy_node();
    let candidate = pod("c", vec![container("app", &[("vendor.io/fpga", "4")])]);
    let candidate = edit(candidate, |spec| {
        spec.init_containers = Some(vec![container("init", &[("vendor.io/fpga", "8")])]);
    });
    assert_eq!(admit(&node, NO_PODS, &candidate), Ok(()));
    // A resource listed with zero is still listed.
    let mut zero = roomy_node();
    zero.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert("vendor.io/fpga".to_owned(), Quantity("0".to_owned()));
    assert_rejected(
        &zero,
        &[],
        &candidate,
        "OutOfvendor.io/fpga",
        "Node didn't have enough resource: vendor.io/fpga, requested: 8, used: 0, capacity: 0",
    );
}

#[test]
fn resources_the_scheduler_does_not_track_are_ignored() {
    let node = node(&[("pods", "10")]);
    // "pods" in a container's requests and unprefixed unknown names are not counted.
    let candidate = requesting("c", &[("pods", "5"), ("storage", "1Gi")]);
    assert_eq!(admit(&node, NO_PODS, &candidate), Ok(()));
    // A *kubernetes.io/ resource is, though it is not an extended resource.
    assert_rejected(
        &node,
        &[],
        &requesting("c", &[("example.kubernetes.io/thing", "1")]),
        "OutOfexample.kubernetes.io/thing",
        "Node didn't have enough resource: example.kubernetes.io/thing, requested: 1, used: 0, capacity: 0",
    );
}

#[test]
fn the_first_insufficient_resource_is_reported() {
    let small = node(&[("pods", "1"), ("cpu", "1"), ("memory", "1Gi")]);
    let greedy = requesting(
        "c",
        &[("cpu", "2"), ("memory", "2Gi"), ("example.com/gpu", "1")],
    );
    assert_eq!(
        rejected(&small, &[requesting("a", &[])], &greedy).reason,
        "OutOfpods"
    );
    assert_eq!(rejected(&small, &[], &greedy).reason, "OutOfcpu");
    let no_cpu = requesting("c", &[("memory", "2Gi"), ("ephemeral-storage", "1")]);
    assert_eq!(rejected(&small, &[], &no_cpu).reason, "OutOfmemory");
    let scalars = requesting("c", &[("b.example.com/x", "1"), ("a.example.com/y", "1")]);
    let listing = node_with(
        &small,
        &[("a.example.com/y", "0"), ("b.example.com/x", "0")],
    );
    assert_eq!(
        rejected(&listing, &[], &scalars).reason,
        "OutOfa.example.com/y"
    );
}

fn node_with(node: &Node, extra: &[(&str, &str)]) -> Node {
    let mut node = node.clone();
    let allocatable = node.status.as_mut().unwrap().allocatable.as_mut().unwrap();
    allocatable.extend(quantities(extra));
    node
}

#[test]
fn used_counts_init_containers_sidecars_and_overhead_of_active_pods() {
    let node = node(&[("pods", "10"), ("cpu", "4")]);
    // 1 (app) + 0.5 (sidecar) + 0.25 (overhead) = 1.75; the 1.2 init container is smaller.
    let active = edit(requesting("a", &[("cpu", "1")]), |spec| {
        spec.init_containers = Some(vec![
            container("setup", &[("cpu", "1200m")]),
            sidecar("mesh", &[("cpu", "500m")]),
        ]);
        spec.overhead = Some(quantities(&[("cpu", "250m")]));
    });
    assert_rejected(
        &node,
        &[active],
        &requesting("c", &[("cpu", "2300m")]),
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 2300, used: 1750, capacity: 4000",
    );
}

#[test]
fn the_candidates_init_containers_count() {
    let node = node(&[("pods", "10"), ("cpu", "2")]);
    let candidate = edit(requesting("c", &[("cpu", "100m")]), |spec| {
        spec.init_containers = Some(vec![container("migrate", &[("cpu", "3")])]);
    });
    assert_rejected(
        &node,
        &[],
        &candidate,
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000",
    );
}

// --- malformed quantities ---

#[test]
fn a_malformed_request_is_rejected_not_ignored() {
    let node = roomy_node();
    let rejection = rejected(&node, &[], &requesting("c", &[("cpu", "lots")]));
    assert_eq!(rejection.reason, "UnexpectedAdmissionError");
    assert_eq!(
        rejection.message,
        r#"invalid cpu quantity "lots" in the requests of container "app""#
    );

    let init = edit(requesting("c", &[]), |spec| {
        spec.init_containers = Some(vec![container("setup", &[("memory", "1Qi")])]);
    });
    assert_eq!(
        rejected(&node, &[], &init).message,
        r#"invalid memory quantity "1Qi" in the requests of init container "setup""#
    );

    let overhead = edit(requesting("c", &[]), |spec| {
        spec.overhead = Some(quantities(&[("cpu", "1..5")]));
    });
    assert_eq!(
        rejected(&node, &[], &overhead).message,
        r#"invalid cpu quantity "1..5" in spec.overhead"#
    );

    let pod_level = edit(requesting("c", &[]), |spec| {
        spec.resources = Some(ResourceRequirements {
            requests: Some(quantities(&[("memory", "")])),
            ..ResourceRequirements::default()
        });
    });
    assert_eq!(
        rejected(&node, &[], &pod_level).message,
        r#"invalid memory quantity "" in spec.resources.requests"#
    );
}

#[test]
fn a_negative_request_is_rejected() {
    assert_rejected(
        &roomy_node(),
        &[],
        &requesting("c", &[("cpu", "-1")]),
        "UnexpectedAdmissionError",
        r#"negative cpu quantity "-1" in the requests of container "app""#,
    );
}

#[test]
fn a_malformed_allocatable_is_rejected_when_it_matters() {
    let bad_cpu = node(&[("pods", "10"), ("cpu", "four")]);
    assert_rejected(
        &bad_cpu,
        &[],
        &requesting("c", &[("cpu", "1")]),
        "UnexpectedAdmissionError",
        r#"invalid cpu quantity "four" in the node's allocatable"#,
    );
    assert_eq!(
        admit(&bad_cpu, NO_PODS, &requesting("c", &[("memory", "0")])),
        Ok(())
    );
    assert_eq!(
        rejected(&node(&[("pods", "ten")]), &[], &requesting("c", &[])).message,
        r#"invalid pods quantity "ten" in the node's allocatable"#
    );
}

#[test]
fn an_active_pod_with_a_malformed_request_counts_what_parses() {
    let node = node(&[("pods", "10"), ("cpu", "2")]);
    let broken = requesting("a", &[("cpu", "1"), ("memory", "oops")]);
    assert_rejected(
        &node,
        &[broken],
        &requesting("c", &[("cpu", "1500m")]),
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000",
    );
}

// --- pod_requests ---

#[test]
fn requests_of_regular_containers_add_up() {
    let pod = pod(
        "p",
        vec![
            container("a", &[("cpu", "100m"), ("memory", "64Mi")]),
            container("b", &[("cpu", "250m")]),
            container("c", &[]),
        ],
    );
    assert_eq!(
        pod_requests(&pod),
        requests(&[("cpu", 350_000_000), ("memory", (64 << 20) * NANOS)])
    );
}

#[test]
fn an_init_container_larger_than_the_rest_sets_the_request_per_resource() {
    // Upstream's example: init 2 cpu/1G and 2 cpu/3G, containers 2+1 cpu, 1G+1G: 3 cpu, 3G.
    let pod = edit(
        pod(
            "p",
            vec![
                container("c1", &[("cpu", "2"), ("memory", "1G")]),
                container("c2", &[("cpu", "1"), ("memory", "1G")]),
            ],
        ),
        |spec| {
            spec.init_containers = Some(vec![
                container("i1", &[("cpu", "2"), ("memory", "1G")]),
                container("i2", &[("cpu", "2"), ("memory", "3G")]),
            ]);
        },
    );
    assert_eq!(
        pod_requests(&pod),
        requests(&[("cpu", 3 * NANOS), ("memory", 3_000_000_000 * NANOS)])
    );
}

#[test]
fn an_init_container_runs_next_to_the_sidecars_started_before_it() {
    let pod = edit(requesting("p", &[("cpu", "1")]), |spec| {
        spec.init_containers = Some(vec![
            container("before", &[("cpu", "1800m")]),
            sidecar("mesh", &[("cpu", "500m"), ("memory", "1Gi")]),
            container("after", &[("cpu", "2")]),
        ]);
    });
    // "after" needs 2 + 0.5 = 2.5 cpu; running, the pod needs 1 + 0.5; "before" runs alone (1.8).
    assert_eq!(
        pod_requests(&pod),
        requests(&[("cpu", 2_500_000_000), ("memory", GI * NANOS)])
    );
}

#[test]
fn sidecars_add_to_the_running_pod() {
    let pod = edit(requesting("p", &[("cpu", "1")]), |spec| {
        spec.init_containers = Some(vec![
            sidecar("a", &[("cpu", "500m")]),
            sidecar("b", &[("cpu", "250m")]),
            container("small", &[("cpu", "100m")]),
        ]);
    });
    assert_eq!(pod_requests(&pod), requests(&[("cpu", 1_750_000_000)]));
}

#[test]
fn overhead_comes_on_top_of_the_init_peak() {
    let pod = edit(requesting("p", &[("cpu", "1")]), |spec| {
        spec.init_containers = Some(vec![container("init", &[("cpu", "2")])]);
        spec.overhead = Some(quantities(&[("cpu", "100m"), ("memory", "120Mi")]));
    });
    assert_eq!(
        pod_requests(&pod),
        requests(&[("cpu", 2_100_000_000), ("memory", (120 << 20) * NANOS)])
    );
}

#[test]
fn pod_level_requests_replace_cpu_memory_and_hugepages_only() {
    let pod = edit(
        requesting(
            "p",
            &[
                ("cpu", "1"),
                ("memory", "1Gi"),
                ("ephemeral-storage", "1Gi"),
            ],
        ),
        |spec| {
            spec.resources = Some(ResourceRequirements {
                requests: Some(quantities(&[
                    ("cpu", "500m"),
                    ("hugepages-2Mi", "4Mi"),
                    ("ephemeral-storage", "5Gi"),
                ])),
                ..ResourceRequirements::default()
            });
            spec.overhead = Some(quantities(&[("cpu", "100m")]));
        },
    );
    assert_eq!(
        pod_requests(&pod),
        requests(&[
            ("cpu", 600_000_000),
            ("memory", GI * NANOS),
            ("ephemeral-storage", GI * NANOS),
            ("hugepages-2Mi", (4 << 20) * NANOS),
        ])
    );
}

#[test]
fn pod_requests_skip_what_does_not_parse() {
    assert_eq!(
        pod_requests(&requesting("p", &[("cpu", "x"), ("memory", "1")])),
        requests(&[("memory", NANOS)])
    );
    let bare = Pod {
        spec: None,
        ..pod("p", Vec::new())
    };
    assert!(pod_requests(&bare).is_empty());
}

// --- node affinity ---

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

fn labels_term(expressions: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(expressions),
        match_fields: None,
    }
}

fn fields_term(fields: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(fields),
    }
}

fn with_affinity(terms: Vec<NodeSelectorTerm>) -> Pod {
    edit(requesting("c", &[]), |spec| {
        spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
    })
}

fn affinity_matches(terms: Vec<NodeSelectorTerm>) -> bool {
    match admit(&roomy_node(), NO_PODS, &with_affinity(terms)) {
        Ok(()) => true,
        Err(rejection) => {
            assert_eq!(
                rejection,
                Rejection {
                    reason: "NodeAffinity".to_owned(),
                    message: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".to_owned(),
                }
            );
            false
        }
    }
}

fn expression_matches(key: &str, operator: &str, values: &[&str]) -> bool {
    affinity_matches(vec![labels_term(vec![requirement(key, operator, values)])])
}

#[test]
fn node_selector_needs_every_label() {
    let node = roomy_node();
    let selecting = |selector: &[(&str, &str)]| {
        edit(requesting("c", &[]), |spec| {
            spec.node_selector = Some(strings(selector));
        })
    };
    assert_eq!(
        admit(
            &node,
            NO_PODS,
            &selecting(&[("zone", "a"), ("generation", "5")])
        ),
        Ok(())
    );
    assert_rejected(
        &node,
        &[],
        &selecting(&[("zone", "b")]),
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
    );
    assert_eq!(
        rejected(&node, &[], &selecting(&[("zone", "a"), ("gpu", "")])).reason,
        "NodeAffinity"
    );
}

#[test]
fn in_and_not_in() {
    assert!(expression_matches("zone", "In", &["b", "a"]));
    assert!(!expression_matches("zone", "In", &["b"]));
    assert!(!expression_matches("missing", "In", &["a"]));
    assert!(expression_matches("zone", "NotIn", &["b"]));
    assert!(!expression_matches("zone", "NotIn", &["a", "b"]));
    assert!(expression_matches("missing", "NotIn", &["a"]));
}

#[test]
fn exists_and_does_not_exist() {
    assert!(expression_matches("zone", "Exists", &[]));
    assert!(!expression_matches("missing", "Exists", &[]));
    assert!(expression_matches("missing", "DoesNotExist", &[]));
    assert!(!expression_matches("zone", "DoesNotExist", &[]));
}

#[test]
fn gt_and_lt_compare_integers() {
    // The node's "generation" label is 5.
    assert!(expression_matches("generation", "Gt", &["4"]));
    assert!(!expression_matches("generation", "Gt", &["5"]));
    assert!(expression_matches("generation", "Lt", &["6"]));
    assert!(!expression_matches("generation", "Lt", &["5"]));
    assert!(expression_matches("generation", "Gt", &["-1"]));
    // A label that is missing or not an integer matches neither.
    assert!(!expression_matches("missing", "Gt", &["1"]));
    assert!(!expression_matches("zone", "Lt", &["100"]));
}

#[test]
fn malformed_requirements_match_nothing() {
    assert!(!expression_matches("zone", "In", &[]));
    assert!(!expression_matches("missing", "NotIn", &[]));
    assert!(!expression_matches("zone", "Exists", &["a"]));
    assert!(!expression_matches("missing", "DoesNotExist", &["a"]));
    assert!(!expression_matches("generation", "Gt", &["1", "2"]));
    assert!(!expression_matches("generation", "Gt", &["one"]));
    assert!(!expression_matches("zone", "Equals", &["a"]));
    // A malformed requirement fails its term even next to one that does not match anyway, but
    // not the other terms.
    let broken = labels_term(vec![
        requirement("zone", "Exists", &[]),
        requirement("zone", "In", &[]),
    ]);
    assert!(!affinity_matches(vec![broken.clone()]));
    assert!(affinity_matches(vec![
        broken,
        labels_term(vec![requirement("zone", "In", &["a"])])
    ]));
}

#[test]
fn terms_are_ored_and_expressions_anded() {
    let zone_a = requirement("zone", "In", &["a"]);
    let zone_b = requirement("zone", "In", &["b"]);
    let has_generation = requirement("generation", "Exists", &[]);
    assert!(affinity_matches(vec![labels_term(vec![
        zone_a.clone(),
        has_generation.clone()
    ])]));
    assert!(!affinity_matches(vec![labels_term(vec![
        zone_b.clone(),
        has_generation
    ])]));
    assert!(affinity_matches(vec![
        labels_term(vec![zone_b.clone()]),
        labels_term(vec![zone_a])
    ]));
    assert!(!affinity_matches(vec![labels_term(vec![zone_b])]));
}

#[test]
fn empty_terms_select_nothing() {
    assert!(!affinity_matches(Vec::new()));
    assert!(!affinity_matches(vec![NodeSelectorTerm::default()]));
    assert!(affinity_matches(vec![
        NodeSelectorTerm::default(),
        labels_term(vec![requirement("zone", "Exists", &[])])
    ]));
}

#[test]
fn match_fields_select_the_node_name() {
    let field = |operator: &str, values: &[&str]| {
        affinity_matches(vec![fields_term(vec![requirement(
            "metadata.name",
            operator,
            values,
        )])])
    };
    assert!(field("In", &[NODE]));
    assert!(!field("In", &["node-b"]));
    assert!(field("NotIn", &["node-b"]));
    assert!(!field("NotIn", &[NODE]));
    // Exactly one value, and only In / NotIn.
    assert!(!field("In", &[NODE, "node-b"]));
    assert!(!field("Exists", &[]));
    // Labels and fields of one term are ANDed.
    assert!(!affinity_matches(vec![NodeSelectorTerm {
        match_expressions: Some(vec![requirement("zone", "In", &["b"])]),
        match_fields: Some(vec![requirement("metadata.name", "In", &[NODE])]),
    }]));
}

#[test]
fn selector_and_affinity_must_both_match() {
    let candidate = edit(
        with_affinity(vec![labels_term(vec![requirement("zone", "In", &["a"])])]),
        |spec| spec.node_selector = Some(strings(&[("zone", "b")])),
    );
    assert_eq!(
        rejected(&roomy_node(), &[], &candidate).reason,
        "NodeAffinity"
    );
}

// --- node name, host ports, taints ---

#[test]
fn a_pod_bound_to_another_node_is_rejected() {
    let node = roomy_node();
    let bound = |name: &str| {
        edit(requesting("c", &[]), |spec| {
            spec.node_name = Some(name.to_owned());
        })
    };
    assert_rejected(
        &node,
        &[],
        &bound("node-b"),
        "NodeName",
        "Predicate NodeName failed: node(s) didn't match the requested node name",
    );
    assert_eq!(admit(&node, NO_PODS, &bound(NODE)), Ok(()));
    assert_eq!(admit(&node, NO_PODS, &bound("")), Ok(()));
}

fn ports_fit(taken: (&str, &str), wanted: (&str, &str)) -> bool {
    let active = pod(
        "a",
        vec![with_host_port(container("a", &[]), 80, taken.0, taken.1)],
    );
    let candidate = pod(
        "c",
        vec![with_host_port(container("c", &[]), 80, wanted.0, wanted.1)],
    );
    match admit(&roomy_node(), &[active], &candidate) {
        Ok(()) => true,
        Err(rejection) => {
            assert_eq!(
                rejection,
                Rejection {
                    reason: "NodePorts".to_owned(),
                    message: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".to_owned(),
                }
            );
            false
        }
    }
}

#[test]
fn host_ports_conflict_on_the_same_address_and_protocol() {
    // Empty host IP means 0.0.0.0 and empty protocol TCP.
    assert!(!ports_fit(("", ""), ("", "")));
    assert!(!ports_fit(("0.0.0.0", "TCP"), ("", "")));
    assert!(ports_fit(("", "UDP"), ("", "")));
    assert!(ports_fit(("", "TCP"), ("", "SCTP")));
    assert!(ports_fit(("10.0.0.1", ""), ("10.0.0.2", "")));
    assert!(!ports_fit(("10.0.0.1", ""), ("10.0.0.1", "TCP")));
    // Binding every address collides with any address, either way round.
    assert!(!ports_fit(("10.0.0.1", ""), ("", "")));
    assert!(!ports_fit(("", ""), ("10.0.0.1", "")));
}

#[test]
fn other_port_numbers_and_zero_host_ports_do_not_conflict() {
    let active = pod("a", vec![with_host_port(container("a", &[]), 80, "", "")]);
    let other = pod("c", vec![with_host_port(container("c", &[]), 81, "", "")]);
    assert_eq!(
        admit(&roomy_node(), std::slice::from_ref(&active), &other),
        Ok(())
    );
    let container_only = pod("c", vec![with_host_port(container("c", &[]), 0, "", "")]);
    let zero = pod("z", vec![with_host_port(container("z", &[]), 0, "", "")]);
    assert_eq!(admit(&roomy_node(), &[zero], &container_only), Ok(()));
}

#[test]
fn sidecar_host_ports_count_and_other_init_containers_do_not() {
    let node = roomy_node();
    let active = edit(requesting("a", &[]), |spec| {
        spec.init_containers = Some(vec![
            with_host_port(sidecar("mesh", &[]), 15000, "", ""),
            with_host_port(container("setup", &[]), 9000, "", ""),
        ]);
    });
    let wants = |port: i32| pod("c", vec![with_host_port(container("c", &[]), port, "", "")]);
    assert_eq!(
        rejected(&node, std::slice::from_ref(&active), &wants(15000)).reason,
        "NodePorts"
    );
    assert_eq!(
        admit(&node, std::slice::from_ref(&active), &wants(9000)),
        Ok(())
    );
    let sidecar_wants = edit(requesting("c", &[]), |spec| {
        spec.init_containers = Some(vec![with_host_port(sidecar("mesh", &[]), 15000, "", "")]);
    });
    assert_eq!(
        rejected(&node, &[active], &sidecar_wants).reason,
        "NodePorts"
    );
}

#[test]
fn an_untolerated_no_execute_taint_rejects() {
    let node = tainted(
        roomy_node(),
        vec![taint("node.kubernetes.io/unreachable", "", "NoExecute")],
    );
    assert_rejected(
        &node,
        &[],
        &requesting("c", &[]),
        "TaintToleration",
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate",
    );
    let tolerating = edit(requesting("c", &[]), |spec| {
        spec.tolerations = Some(vec![toleration(
            "node.kubernetes.io/unreachable",
            "Exists",
            "",
            "NoExecute",
        )]);
    });
    assert_eq!(admit(&node, NO_PODS, &tolerating), Ok(()));
}

#[test]
fn no_schedule_and_prefer_no_schedule_taints_are_ignored() {
    let node = tainted(
        roomy_node(),
        vec![
            taint("dedicated", "db", "NoSchedule"),
            taint("spot", "", "PreferNoSchedule"),
        ],
    );
    assert_eq!(admit(&node, NO_PODS, &requesting("c", &[])), Ok(()));
}

#[test]
fn every_no_execute_taint_must_be_tolerated() {
    let node = tainted(
        roomy_node(),
        vec![taint("a", "1", "NoExecute"), taint("b", "2", "NoExecute")],
    );
    let tolerating = |tolerations: Vec<Toleration>| {
        edit(requesting("c", &[]), |spec| {
            spec.tolerations = Some(tolerations);
        })
    };
    let only_a = tolerating(vec![toleration("a", "Equal", "1", "NoExecute")]);
    assert_eq!(rejected(&node, &[], &only_a).reason, "TaintToleration");
    let both = tolerating(vec![
        toleration("a", "Equal", "1", "NoExecute"),
        toleration("b", "", "2", ""),
    ]);
    assert_eq!(admit(&node, NO_PODS, &both), Ok(()));
}

#[test]
fn static_pods_skip_the_taint_check() {
    let node = tainted(
        roomy_node(),
        vec![taint("node.kubernetes.io/not-ready", "", "NoExecute")],
    );
    let mut manifest = requesting("etcd", &[]);
    manifest.metadata.annotations = Some(strings(&[("kubernetes.io/config.source", "file")]));
    assert_eq!(admit(&node, NO_PODS, &manifest), Ok(()));
    let mut from_api = requesting("web", &[]);
    from_api.metadata.annotations = Some(strings(&[("kubernetes.io/config.source", "api")]));
    assert_eq!(rejected(&node, &[], &from_api).reason, "TaintToleration");
}

#[test]
fn toleration_matching() {
    let t = taint("key", "value", "NoExecute");
    // Exists with an empty key tolerates everything.
    assert!(tolerates(&toleration("", "Exists", "", ""), &t));
    assert!(tolerates(&toleration("key", "Exists", "", ""), &t));
    assert!(!tolerates(&toleration("other", "Exists", "", ""), &t));
    // Equal, and no operator, compare the value.
    assert!(tolerates(&toleration("key", "Equal", "value", ""), &t));
    assert!(tolerates(&toleration("key", "", "value", ""), &t));
    assert!(!tolerates(&toleration("key", "Equal", "other", ""), &t));
    assert!(!tolerates(&toleration("key", "Equal", "", ""), &t));
    let no_value = taint("key", "", "NoExecute");
    assert!(tolerates(&toleration("key", "Equal", "", ""), &no_value));
    // An empty effect matches every effect; a set one only its own.
    assert!(tolerates(&toleration("key", "Exists", "", "NoExecute"), &t));
    assert!(!tolerates(
        &toleration("key", "Exists", "", "NoSchedule"),
        &t
    ));
    // Comparison operators are behind an alpha gate, and unknown ones match nothing.
    assert!(!tolerates(
        &toleration("key", "Gt", "1", ""),
        &taint("key", "2", "NoExecute")
    ));
    assert!(!tolerates(&toleration("key", "Sometimes", "value", ""), &t));
}

// --- OS and supplemental groups ---

#[test]
fn a_pod_for_another_os_is_rejected() {
    let node = roomy_node();
    let mut labelled = requesting("c", &[]);
    labelled.metadata.labels = Some(strings(&[("kubernetes.io/os", "windows")]));
    assert_rejected(
        &node,
        &[],
        &labelled,
        "PodOSSelectorNodeLabelDoesNotMatch",
        "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
    );
    labelled.metadata.labels = Some(strings(&[("kubernetes.io/os", "linux")]));
    assert_eq!(admit(&node, NO_PODS, &labelled), Ok(()));

    let for_os = |name: &str| {
        edit(requesting("c", &[]), |spec| {
            spec.os = Some(PodOS {
                name: name.to_owned(),
            });
        })
    };
    assert_rejected(
        &node,
        &[],
        &for_os("windows"),
        "PodOSNotSupported",
        "Failed to admit pod as the OS field doesn't match node OS",
    );
    assert_eq!(admit(&node, NO_PODS, &for_os("linux")), Ok(()));
}

#[test]
fn strict_supplemental_groups_need_node_support() {
    let strict = edit(requesting("c", &[]), |spec| {
        spec.security_context = Some(PodSecurityContext {
            supplemental_groups_policy: Some("Strict".to_owned()),
            ..PodSecurityContext::default()
        });
    });
    assert_rejected(
        &roomy_node(),
        &[],
        &strict,
        "SupplementalGroupsPolicyNotSupported",
        "SupplementalGroupsPolicy=Strict is not supported in this node",
    );
    let mut supporting = roomy_node();
    supporting.status.as_mut().unwrap().features = Some(NodeFeatures {
        supplemental_groups_policy: Some(true),
    });
    assert_eq!(admit(&supporting, NO_PODS, &strict), Ok(()));
    let merge = edit(strict, |spec| {
        spec.security_context
            .as_mut()
            .unwrap()
            .supplemental_groups_policy = Some("Merge".to_owned());
    });
    assert_eq!(admit(&roomy_node(), NO_PODS, &merge), Ok(()));
}

// --- order ---

#[test]
fn checks_run_in_upstream_order() {
    let node = tainted(
        node(&[("pods", "10"), ("cpu", "1")]),
        vec![taint("maintenance", "", "NoExecute")],
    );
    let active = pod("a", vec![with_host_port(container("a", &[]), 80, "", "")]);
    let everything_wrong = edit(
        pod(
            "c",
            vec![with_host_port(container("c", &[("cpu", "2")]), 80, "", "")],
        ),
        |spec| {
            spec.node_selector = Some(strings(&[("zone", "b")]));
            spec.node_name = Some("node-b".to_owned());
        },
    );
    let mut steps = Vec::new();
    let mut candidate = everything_wrong;
    loop {
        let reason = match admit(&node, std::slice::from_ref(&active), &candidate) {
            Ok(()) => break,
            Err(rejection) => rejection.reason,
        };
        let spec = candidate.spec.as_mut().unwrap();
        match reason.as_str() {
            "OutOfcpu" => spec.containers[0].resources = None,
            "NodeAffinity" => spec.node_selector = None,
            "NodeName" => spec.node_name = None,
            "NodePorts" => spec.containers[0].ports = None,
            "TaintToleration" => {
                spec.tolerations = Some(vec![toleration("", "Exists", "", "")]);
            }
            other => panic!("unexpected reason {other}"),
        }
        steps.push(reason);
    }
    assert_eq!(
        steps,
        [
            "OutOfcpu",
            "NodeAffinity",
            "NodeName",
            "NodePorts",
            "TaintToleration"
        ]
    );
}

#[test]
fn os_checks_come_before_resources() {
    let mut candidate = requesting("c", &[("cpu", "100")]);
    candidate.metadata.labels = Some(strings(&[("kubernetes.io/os", "windows")]));
    assert_eq!(
        rejected(&roomy_node(), &[], &candidate).reason,
        "PodOSSelectorNodeLabelDoesNotMatch"
    );
}

// --- resource names ---

#[test]
fn extended_resource_names() {
    assert!(is_extended_resource_name("example.com/gpu"));
    assert!(is_extended_resource_name("nvidia.com/gpu"));
    assert!(!is_extended_resource_name("cpu"));
    assert!(!is_extended_resource_name("hugepages-2Mi"));
    assert!(!is_extended_resource_name("kubernetes.io/something"));
    assert!(!is_extended_resource_name(
        "example.kubernetes.io/something"
    ));
    assert!(!is_extended_resource_name("requests.example.com/gpu"));
    assert!(!is_extended_resource_name("Example.com/gpu"));
    assert!(!is_extended_resource_name("example.com/-gpu"));
    assert!(!is_extended_resource_name("example.com/a/b"));
}
