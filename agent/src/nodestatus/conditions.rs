//! The node conditions the kubelet owns (`pkg/kubelet/nodestatus` `ReadyCondition` and the
//! `MemoryPressure`/`DiskPressure`/`PIDPressure` setters): reasons, messages, the heartbeat that
//! moves every round and the transition time that moves only when the status flips.

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::capacity::REQUIRED_CAPACITY;
use super::{NodeEvent, NodeFacts, NodeHealth};
use crate::events::EventType;

/// How long the runtime may go without a successful status check before the node is not ready
/// (the kubelet's `maxWaitForContainerRuntime`).
const MAX_WAIT_FOR_CONTAINER_RUNTIME: SignedDuration = SignedDuration::from_secs(30);

/// One pressure condition's wording, as upstream writes it.
struct Pressure {
    condition: &'static str,
    true_reason: &'static str,
    true_message: &'static str,
    true_event: &'static str,
    false_reason: &'static str,
    false_message: &'static str,
    false_event: &'static str,
}

const MEMORY_PRESSURE: Pressure = Pressure {
    condition: "MemoryPressure",
    true_reason: "KubeletHasInsufficientMemory",
    true_message: "kubelet has insufficient memory available",
    true_event: "NodeHasInsufficientMemory",
    false_reason: "KubeletHasSufficientMemory",
    false_message: "kubelet has sufficient memory available",
    false_event: "NodeHasSufficientMemory",
};

const DISK_PRESSURE: Pressure = Pressure {
    condition: "DiskPressure",
    true_reason: "KubeletHasDiskPressure",
    true_message: "kubelet has disk pressure",
    true_event: "NodeHasDiskPressure",
    false_reason: "KubeletHasNoDiskPressure",
    false_message: "kubelet has no disk pressure",
    false_event: "NodeHasNoDiskPressure",
};

const PID_PRESSURE: Pressure = Pressure {
    condition: "PIDPressure",
    true_reason: "KubeletHasInsufficientPID",
    true_message: "kubelet has insufficient PID available",
    true_event: "NodeHasInsufficientPID",
    false_reason: "KubeletHasSufficientPID",
    false_message: "kubelet has sufficient PID available",
    false_event: "NodeHasSufficientPID",
};

/// Sets the three pressure conditions, then Ready, in upstream's order (so a new node lists them
/// `MemoryPressure`, `DiskPressure`, `PIDPressure`, `Ready`).
pub(super) fn set_conditions(
    status: &mut NodeStatus,
    facts: &NodeFacts<'_>,
    now: Timestamp,
    events: &mut Vec<NodeEvent>,
) {
    let health = &facts.health;
    for (pressure, under) in [
        (&MEMORY_PRESSURE, health.memory_pressure),
        (&DISK_PRESSURE, health.disk_pressure),
        (&PID_PRESSURE, health.pid_pressure),
    ] {
        set_pressure(status, pressure, under, now, facts.node_name, events);
    }
    set_ready(status, health, now, facts.node_name, events);
}

fn condition_event(node_name: &str, reason: &'static str) -> NodeEvent {
    NodeEvent {
        event_type: EventType::Normal,
        reason,
        message: format!("Node {node_name} status is now: {reason}"),
    }
}

fn set_pressure(
    status: &mut NodeStatus,
    pressure: &Pressure,
    under: bool,
    now: Timestamp,
    node_name: &str,
    events: &mut Vec<NodeEvent>,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    // Upstream keeps the last condition of the type when there are several.
    let index = conditions
        .iter()
        .rposition(|c| c.type_ == pressure.condition)
        .unwrap_or_else(|| {
            conditions.push(NodeCondition {
                type_: pressure.condition.to_owned(),
                status: "Unknown".to_owned(),
                ..NodeCondition::default()
            });
            conditions.len() - 1
        });
    let condition = &mut conditions[index];
    condition.last_heartbeat_time = Some(Time(now));
    let (wanted, reason, message, event) = if under {
        (
            "True",
            pressure.true_reason,
            pressure.true_message,
            pressure.true_event,
        )
    } else {
        (
            "False",
            pressure.false_reason,
            pressure.false_message,
            pressure.false_event,
        )
    };
    // A new condition starts Unknown, so it always takes this branch once.
    if condition.status != wanted {
        wanted.clone_into(&mut condition.status);
        condition.reason = Some(reason.to_owned());
        condition.message = Some(message.to_owned());
        condition.last_transition_time = Some(Time(now));
        events.push(condition_event(node_name, event));
    }
}

fn set_ready(
    status: &mut NodeStatus,
    health: &NodeHealth,
    now: Timestamp,
    node_name: &str,
    events: &mut Vec<NodeEvent>,
) {
    let problems = readiness_problems(status, health, now);
    let (wanted, reason, message) = if problems.is_empty() {
        (
            "True",
            "KubeletReady",
            "kubelet is posting ready status".to_owned(),
        )
    } else {
        ("False", "KubeletNotReady", aggregate_message(&problems))
    };
    let mut condition = NodeCondition {
        type_: "Ready".to_owned(),
        status: wanted.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(existing) => {
            if existing.status == wanted {
                condition
                    .last_transition_time
                    .clone_from(&existing.last_transition_time);
            } else {
                // No event for a Ready condition seen for the first time, as upstream.
                events.push(condition_event(
                    node_name,
                    if wanted == "True" {
                        "NodeReady"
                    } else {
                        "NodeNotReady"
                    },
                ));
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
}

/// Why the node is not ready, in upstream's order: the runtime's errors (status check, PLEG, the
/// runtime's own condition), then the network, then a shutdown in progress, then missing capacity.
fn readiness_problems(status: &NodeStatus, health: &NodeHealth, now: Timestamp) -> Vec<String> {
    let mut problems = Vec::new();
    match health.last_runtime_sync {
        None => {
            problems.push("container runtime status check may not have completed yet".to_owned());
        }
        Some(synced) if synced + MAX_WAIT_FOR_CONTAINER_RUNTIME <= now => {
            problems.push("container runtime is down".to_owned());
        }
        Some(_) => {}
    }
    if let Some(pleg) = &health.pleg_error {
        problems.push(format!("PLEG is not healthy: {pleg}"));
    }
    problems.extend(health.runtime_error.clone());
    problems.extend(health.network_error.clone());
    problems.extend(health.shutdown_error.clone());
    let missing: Vec<&str> = REQUIRED_CAPACITY
        .into_iter()
        .filter(|name| {
            !status
                .capacity
                .as_ref()
                .is_some_and(|capacity| capacity.contains_key(*name))
        })
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    problems
}

/// apimachinery's error aggregate text: duplicates dropped, one message bare, several as
/// `[a, b]`.
fn aggregate_message(problems: &[String]) -> String {
    let mut distinct: Vec<&str> = Vec::new();
    for problem in problems {
        if !distinct.contains(&problem.as_str()) {
            distinct.push(problem);
        }
    }
    if let [only] = distinct[..] {
        only.to_owned()
    } else {
        format!("[{}]", distinct.join(", "))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::super::tests::{facts_with, machine};
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn full_capacity() -> NodeStatus {
        NodeStatus {
            capacity: Some(
                REQUIRED_CAPACITY
                    .iter()
                    .map(|name| ((*name).to_owned(), Quantity("1".to_owned())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..NodeStatus::default()
        }
    }

    fn find<'a>(status: &'a NodeStatus, kind: &str) -> &'a NodeCondition {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .unwrap()
    }

    fn reasons(events: &[NodeEvent]) -> Vec<&str> {
        events.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn a_new_node_gets_four_conditions_in_order_with_pressure_events_only() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.health.last_runtime_sync = Some(at(-5));
        let mut status = full_capacity();
        let mut events = Vec::new();
        set_conditions(&mut status, &facts, at(0), &mut events);
        let conditions = status.conditions.as_ref().unwrap();
        let kinds: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            kinds,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        let ready = find(&status, "Ready");
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("kubelet is posting ready status")
        );
        assert_eq!(ready.last_transition_time, Some(Time(at(0))));
        let memory = find(&status, "MemoryPressure");
        assert_eq!(memory.status, "False");
        assert_eq!(memory.reason.as_deref(), Some("KubeletHasSufficientMemory"));
        assert_eq!(
            memory.message.as_deref(),
            Some("kubelet has sufficient memory available")
        );
        assert_eq!(
            find(&status, "DiskPressure").reason.as_deref(),
            Some("KubeletHasNoDiskPressure")
        );
        assert_eq!(
            find(&status, "PIDPressure").message.as_deref(),
            Some("kubelet has sufficient PID available")
        );
        assert_eq!(
            reasons(&events),
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        assert_eq!(
            events[0].message,
            "Node node-1 status is now: NodeHasSufficientMemory"
        );
    }

    #[test]
    fn heartbeat_always_moves_transition_only_on_a_flip() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.health.last_runtime_sync = Some(at(0));
        let mut status = full_capacity();
        set_conditions(&mut status, &facts, at(0), &mut Vec::new());

        let mut events = Vec::new();
        set_conditions(&mut status, &facts, at(10), &mut events);
        assert!(events.is_empty(), "{:?}", reasons(&events));
        for condition in status.conditions.as_ref().unwrap() {
            assert_eq!(condition.last_heartbeat_time, Some(Time(at(10))));
            assert_eq!(condition.last_transition_time, Some(Time(at(0))));
        }

        facts.health.memory_pressure = true;
        facts.health.pleg_error =
            Some("pleg was last seen active 3m5s ago; threshold is 3m0s".to_owned());
        set_conditions(&mut status, &facts, at(20), &mut events);
        assert_eq!(
            reasons(&events),
            ["NodeHasInsufficientMemory", "NodeNotReady"]
        );
        let memory = find(&status, "MemoryPressure");
        assert_eq!(
            (memory.status.as_str(), memory.reason.as_deref()),
            ("True", Some("KubeletHasInsufficientMemory"))
        );
        assert_eq!(
            memory.message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(memory.last_transition_time, Some(Time(at(20))));
        let disk = find(&status, "DiskPressure");
        assert_eq!(disk.last_transition_time, Some(Time(at(0))));
        let ready = find(&status, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s")
        );
        assert_eq!(ready.last_transition_time, Some(Time(at(20))));

        events.clear();
        facts.health.pleg_error = None;
        set_conditions(&mut status, &facts, at(25), &mut events);
        assert_eq!(reasons(&events), ["NodeReady"]);
        assert_eq!(
            find(&status, "Ready").last_transition_time,
            Some(Time(at(25)))
        );
    }

    #[test]
    fn not_ready_lists_every_problem_in_upstream_order() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.health.last_runtime_sync = Some(at(-30));
        facts.health.pleg_error = Some("pleg has yet to be successful".to_owned());
        facts.health.runtime_error =
            Some("container runtime not ready: RuntimeReady=false reason:x message:y".to_owned());
        facts.health.network_error = Some("network state unknown".to_owned());
        facts.health.shutdown_error = Some("node is shutting down".to_owned());
        let mut status = NodeStatus::default();
        set_conditions(&mut status, &facts, at(0), &mut Vec::new());
        assert_eq!(
            find(&status, "Ready").message.as_deref(),
            Some(
                "[container runtime is down, PLEG is not healthy: pleg has yet to be successful, \
                 container runtime not ready: RuntimeReady=false reason:x message:y, \
                 network state unknown, node is shutting down, missing node capacity for \
                 resources: cpu, memory, pods, ephemeral-storage]"
            )
        );
    }

    #[test]
    fn a_runtime_never_checked_is_not_ready_and_duplicates_collapse() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.health.last_runtime_sync = None;
        let mut status = full_capacity();
        set_conditions(&mut status, &facts, at(0), &mut Vec::new());
        assert_eq!(
            find(&status, "Ready").message.as_deref(),
            Some("container runtime status check may not have completed yet")
        );
        assert_eq!(aggregate_message(&["a".to_owned(), "a".to_owned()]), "a");
        facts.health.last_runtime_sync = Some(at(-29));
        set_conditions(&mut status, &facts, at(0), &mut Vec::new());
        assert_eq!(find(&status, "Ready").status, "True");
    }

    #[test]
    fn an_existing_ready_condition_is_replaced_in_place() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.health.last_runtime_sync = Some(at(0));
        let mut status = full_capacity();
        status.conditions = Some(vec![
            NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                last_transition_time: Some(Time(at(-100))),
                ..NodeCondition::default()
            },
            NodeCondition {
                type_: "NetworkUnavailable".to_owned(),
                status: "False".to_owned(),
                ..NodeCondition::default()
            },
        ]);
        let mut events = Vec::new();
        set_conditions(&mut status, &facts, at(0), &mut events);
        let conditions = status.conditions.as_ref().unwrap();
        assert_eq!(conditions[0].type_, "Ready");
        assert_eq!(conditions[0].last_transition_time, Some(Time(at(-100))));
        assert_eq!(conditions[1].type_, "NetworkUnavailable");
        assert_eq!(conditions.len(), 5);
        assert!(!reasons(&events).contains(&"NodeReady"));
    }
}
