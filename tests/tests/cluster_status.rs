//! End-to-end: the pod status ringlet reports to a real control plane (the kube-apiserver and etcd
//! of `cargo xtask cluster up`), with real pods on the lab's containerd, where others write to it
//! too: readiness gates, whose conditions someone else sets through the status subresource and
//! whose `Ready` the node computes (the conformance spec `[sig-node] Pods should support pod
//! readiness gates [NodeConformance]`, `test/e2e/common/node/pods.go`). Run as root, one test at a
//! time.

use std::time::Duration;

use anyhow::Result;
use ringlet_tests::cluster::{require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{container_status, phase};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);
/// How soon `Ready` must follow a gate's condition: the conformance spec allows 10 s
/// (`maxReadyStatusUpdateTolerance`); the agent reacts to the watch event, so half of it leaves
/// room for a loaded machine and still fails an agent that waits for its next periodic sync.
const READY_FOLLOWS: Duration = Duration::from_secs(5);
const GATE_1: &str = "k8s.io/test-condition1";
const GATE_2: &str = "k8s.io/test-condition2";

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Whether the pod's `Ready` condition has `status` and `message` (`None`: no message).
fn ready_is(pod: &Value, status: &str, message: Option<&str>) -> bool {
    condition(pod, "Ready")
        .is_some_and(|ready| ready["status"] == status && ready["message"].as_str() == message)
}

/// Sets the gate's condition as a controller would: a strategic-merge patch of the status
/// subresource naming that one condition.
fn set_gate(node: &ClusterNode, gate: &str, status: &str) -> Result<()> {
    let patch = serde_json::json!({"status": {"conditions": [{"type": gate, "status": status}]}});
    run(node.kubectl().args([
        "patch",
        "pod",
        "gated",
        "--subresource=status",
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]))?;
    Ok(())
}

#[test]
fn ready_follows_the_readiness_gates_set_on_the_api_server() -> Result<()> {
    let test = "ready_follows_the_readiness_gates_set_on_the_api_server";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    node.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: gated
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  readinessGates:
  - conditionType: {GATE_1}
  - conditionType: {GATE_2}
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#,
        node = node.node()
    ))?;
    let missing = |gate: &str| {
        format!("corresponding condition of pod readiness gate \"{gate}\" does not exist.")
    };
    let both_missing = format!("{}, {}", missing(GATE_1), missing(GATE_2));
    let running = node.wait_api_pod("gated", "running, its gates closed", START, |pod| {
        phase(pod) == "Running"
            && container_status(pod, "main").is_some_and(|c| c["ready"] == true)
            && ready_is(pod, "False", Some(&both_missing))
    })?;
    assert_eq!(
        condition(&running, "Ready").map(|c| c["reason"].clone()),
        Some(Value::from("ReadinessGatesNotReady"))
    );
    assert_eq!(
        condition(&running, "ContainersReady").map(|c| c["status"].clone()),
        Some(Value::from("True"))
    );

    set_gate(&node, GATE_1, "True")?;
    node.wait_api_pod(
        "gated",
        "waiting for the second gate",
        READY_FOLLOWS,
        |pod| ready_is(pod, "False", Some(&missing(GATE_2))),
    )?;

    set_gate(&node, GATE_2, "True")?;
    let open = node.wait_api_pod("gated", "Ready", READY_FOLLOWS, |pod| {
        ready_is(pod, "True", None)
    })?;
    for gate in [GATE_1, GATE_2] {
        assert_eq!(
            condition(&open, gate).map(|c| c["status"].clone()),
            Some(Value::from("True")),
            "the agent keeps the conditions it does not own: {gate}"
        );
    }

    set_gate(&node, GATE_1, "False")?;
    let closed =
        format!("the status of pod readiness gate \"{GATE_1}\" is not \"True\", but False");
    node.wait_api_pod("gated", "not Ready again", READY_FOLLOWS, |pod| {
        ready_is(pod, "False", Some(&closed))
    })?;
    Ok(())
}
