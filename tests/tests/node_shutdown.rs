//! End-to-end: graceful node shutdown on the shared control plane, with real pods on the lab's
//! containerd. The lab has no logind, so the agent runs with the lab-only
//! `--lab-node-shutdown-signal` and the test sends it `SIGUSR1` in place of logind's
//! `PrepareForShutdown(true)`. With `shutdownGracePeriod: 20s` and
//! `shutdownGracePeriodCriticalPods: 8s`, an ordinary pod (which takes 3 s to stop) is stopped
//! first and a `system-node-critical` pod only once it has; both end `Failed` with the kubelet's
//! reason, message and `DisruptionTarget` condition, the Node turns `NotReady` ("node is shutting
//! down"), and a pod that arrives afterwards is refused with reason `NodeShutdown`. Run as root,
//! one test at a time.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::jiff::Timestamp;
use ringlet_tests::cluster::require_lab_and_cluster;
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::phase;
use serde_json::Value;

const START: Duration = Duration::from_secs(30);
/// The ordinary group's stop (3 s), then the critical one's, on a loaded machine.
const SHUTDOWN: Duration = Duration::from_secs(30);
const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
shutdownGracePeriod: 20s
shutdownGracePeriodCriticalPods: 8s
";
const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// A pod whose container takes `stop_seconds` to stop after SIGTERM.
fn pod(node: &str, name: &str, priority_class: Option<&str>, stop_seconds: u32) -> String {
    let priority = priority_class.map_or_else(String::new, |class| {
        format!("\n  priorityClassName: {class}")
    });
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}{priority}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'sleep {stop_seconds}; exit 0' TERM; while true; do sleep 1; done"]
"#
    )
}

fn timestamp(value: &Value) -> Result<Timestamp> {
    value
        .as_str()
        .context("no timestamp")?
        .parse()
        .context("not an RFC 3339 timestamp")
}

fn disruption_target(pod: &Value) -> Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .unwrap_or_default()
}

fn ready_condition(node: &Value) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default()
}

/// Failed with the shutdown's reason and condition, and its container stopped (the status turns
/// Failed when the stop starts).
fn stopped_by_shutdown(pod: &Value) -> bool {
    phase(pod) == "Failed"
        && pod["status"]["reason"] == "Terminated"
        && disruption_target(pod)["status"] == "True"
        && finished_at(pod).is_string()
}

fn finished_at(pod: &Value) -> &Value {
    &pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
}

#[test]
fn a_shutdown_stops_ordinary_pods_before_critical_ones_and_the_node_turns_not_ready() -> Result<()>
{
    let test = "a_shutdown_stops_ordinary_pods_before_critical_ones_and_the_node_turns_not_ready";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let config_dir = tempfile::tempdir()?;
    let config = config_dir.path().join("kubelet.yaml");
    std::fs::write(&config, CONFIG)?;
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec![
                "--config".to_owned(),
                config.display().to_string(),
                "--lab-node-shutdown-signal".to_owned(),
            ],
            ..ClusterNodeOptions::default()
        },
    )?;
    let name = node.node().to_owned();
    node.apply(&pod(&name, "ordinary", None, 3))?;
    node.apply(&pod(&name, "critical", Some("system-node-critical"), 1))?;
    for pod in ["ordinary", "critical"] {
        node.wait_api_pod(pod, "running", START, |p| phase(p) == "Running")?;
    }
    let critical = node.api_pod("critical")?.unwrap_or_default();
    assert!(
        critical["spec"]["priority"].as_i64() >= Some(2_000_000_000),
        "the priority class makes the pod critical: {}",
        critical["spec"]
    );

    let pid = node.agent().pid().context("the agent is not running")?;
    assert!(
        ringlet_tests::daemon::signal(pid, libc::SIGUSR1),
        "cannot signal the agent"
    );

    let not_ready = ringlet_tests::wait_for("the Node NotReady", SHUTDOWN, || {
        let ready = ready_condition(&node.node_object().ok()?);
        (ready["status"] == "False").then_some(ready)
    })?;
    assert_eq!(not_ready["reason"], "KubeletNotReady");
    assert_eq!(not_ready["message"], "node is shutting down");

    let ordinary = node.wait_api_pod("ordinary", "stopped by the shutdown", SHUTDOWN, |p| {
        stopped_by_shutdown(p)
    })?;
    let critical = node.wait_api_pod("critical", "stopped by the shutdown", SHUTDOWN, |p| {
        stopped_by_shutdown(p)
    })?;
    for pod in [&ordinary, &critical] {
        assert_eq!(pod["status"]["message"], MESSAGE, "{pod}");
        let disruption = disruption_target(pod);
        assert_eq!(disruption["reason"], "TerminationByKubelet", "{pod}");
        assert_eq!(disruption["message"], MESSAGE, "{pod}");
    }

    // The critical pod was stopped only once the ordinary one had stopped (3 s after its
    // SIGTERM), not together with it.
    let ordinary_stopped_at = timestamp(finished_at(&ordinary))?;
    let ordinary_stopping_at = timestamp(&disruption_target(&ordinary)["lastTransitionTime"])?;
    let critical_stopping_at = timestamp(&disruption_target(&critical)["lastTransitionTime"])?;
    assert!(
        critical_stopping_at >= ordinary_stopped_at,
        "the critical pod was stopped at {critical_stopping_at}, before the ordinary one stopped \
         at {ordinary_stopped_at}"
    );
    assert!(
        critical_stopping_at.duration_since(ordinary_stopping_at)
            >= k8s_openapi::jiff::SignedDuration::from_secs(3),
        "the ordinary pod was stopped at {ordinary_stopping_at}, the critical one at \
         {critical_stopping_at}"
    );

    // A shutting-down node takes no new pods.
    node.apply(&pod(&name, "late", None, 0))?;
    let late = node.wait_api_pod("late", "rejected", START, |p| phase(p) == "Failed")?;
    assert_eq!(late["status"]["reason"], "NodeShutdown", "{late}");
    assert_eq!(
        late["status"]["message"],
        "Pod was rejected: Pod was rejected as the node is shutting down."
    );
    Ok(())
}
