//! End-to-end: node-pressure eviction on the shared control plane, with real pods on the lab's
//! containerd and this machine's real memory. A `memory.available` hard threshold is set relative
//! to the memory available when the test starts; a `BestEffort` pod and a Guaranteed bystander run,
//! then a Burstable hog (within its request) pushes the node below the threshold. The kubelet's
//! ranking picks the `BestEffort` pod (it uses more than it requests); it is evicted with the
//! kubelet's reason and message, the node reports `MemoryPressure`, and nothing else is touched
//! (the eviction gives back more than the hog took below the threshold). The machine is shared, so
//! every amount is measured, not assumed, and the pods go when the node is dropped, also on
//! failure. Run as root, one test at a time.

use std::time::Duration;

use anyhow::{Result, bail};
use ringlet_tests::cluster::require_lab_and_cluster;
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::phase;
use serde_json::Value;

const MI: u64 = 1 << 20;
const START: Duration = Duration::from_mins(1);
/// The threshold sits this far below the memory available at the start: room for the agent, the
/// sandboxes and the `BestEffort` pod.
const THRESHOLD_BELOW_START: u64 = 1024 * MI;
/// What the `BestEffort` pod holds; its eviction gives it back.
const BEST_EFFORT_MEMORY: u64 = 500 * MI;
/// How far the hog takes the node below the threshold (less than the `BestEffort` pod gives back).
const HOG_BELOW_THRESHOLD: u64 = 250 * MI;
/// A kernel notification or the 10 s poll, then a loaded machine.
const EVICTION: Duration = Duration::from_mins(1);
/// One monitoring period and then some, to see that no second pod is evicted.
const QUIET: Duration = Duration::from_secs(15);
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.55";

/// The node's available memory as the kubelet computes it: `MemTotal` minus the root memory
/// cgroup's working set (usage minus inactive file pages).
fn available_memory() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no MemTotal in /proc/meminfo"))?;
    let root = "/sys/fs/cgroup/memory";
    let usage: u64 = std::fs::read_to_string(format!("{root}/memory.usage_in_bytes"))?
        .trim()
        .parse()?;
    let stat = std::fs::read_to_string(format!("{root}/memory.stat"))?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no total_inactive_file in memory.stat"))?;
    Ok((total_kib * 1024).saturating_sub(usage.saturating_sub(inactive)))
}

fn memory_pod(node: &str, name: &str, total: u64, request: Option<u64>) -> String {
    let resources = request.map_or_else(String::new, |r| {
        format!(
            "\n    resources:\n      requests:\n        memory: {}Mi",
            r / MI
        )
    });
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: {name}
    image: {AGNHOST}
    imagePullPolicy: IfNotPresent
    args: ["stress", "--mem-total", "{total_mi}Mi", "--mem-alloc-size", "10Mi", "--mem-alloc-sleep", "20ms"]{resources}
"#,
        total_mi = total / MI
    )
}

fn bystander(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: bystander
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    resources:
      requests: {{cpu: 10m, memory: 32Mi}}
      limits: {{cpu: 10m, memory: 32Mi}}
"#
    )
}

fn memory_pressure(node: &Value) -> Option<&Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "MemoryPressure")
}

fn running(node: &ClusterNode, name: &str) -> Result<bool> {
    Ok(node
        .api_pod(name)?
        .is_some_and(|pod| phase(&pod) == "Running"))
}

#[test]
fn a_memory_hog_gets_the_best_effort_pod_evicted_and_nothing_else() -> Result<()> {
    let test = "a_memory_hog_gets_the_best_effort_pod_evicted_and_nothing_else";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let threshold = (available_memory()?.saturating_sub(THRESHOLD_BELOW_START)) / MI * MI;
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec![format!(
                "--eviction-hard=memory.available<{}Mi",
                threshold / MI
            )],
            ..ClusterNodeOptions::default()
        },
    )?;
    let name = node.node().to_owned();
    node.apply(&bystander(&name))?;
    node.apply(&memory_pod(&name, "best-effort", BEST_EFFORT_MEMORY, None))?;
    for pod in ["bystander", "best-effort"] {
        node.wait_api_pod(pod, "running", START, |p| phase(p) == "Running")?;
    }
    // The BestEffort pod has allocated when the node's memory has come down by about as much.
    let settled = ringlet_tests::wait_for("the BestEffort pod's memory", START, || {
        let available = available_memory().ok()?;
        (available < threshold + THRESHOLD_BELOW_START - BEST_EFFORT_MEMORY * 4 / 5)
            .then_some(available)
    })?;
    if settled <= threshold + HOG_BELOW_THRESHOLD {
        bail!(
            "the machine's memory moved too much while the test set up (available {} MiB, \
             threshold {} MiB): run it again on a quieter machine",
            settled / MI,
            threshold / MI
        );
    }
    let pressure = memory_pressure(&node.node_object()?).cloned();
    assert_eq!(
        pressure.as_ref().map(|c| c["status"].clone()),
        Some(Value::from("False")),
        "no pressure before the hog: {pressure:?}"
    );
    // Within its request, so the ranking puts it after the BestEffort pod.
    let hog_memory = settled - threshold + HOG_BELOW_THRESHOLD;
    node.apply(&memory_pod(
        &name,
        "hog",
        hog_memory,
        Some(hog_memory + 256 * MI),
    ))?;

    let evicted = node.wait_api_pod("best-effort", "evicted", EVICTION, |p| {
        phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
    })?;
    assert!(running(&node, "hog")?, "the hog is not touched");
    assert!(running(&node, "bystander")?, "the bystander is not touched");
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    let expected_start = format!(
        "The node was low on resource: memory. Threshold quantity: {}Mi, available: ",
        threshold / MI
    );
    assert!(message.starts_with(&expected_start), "{message}");
    assert!(
        message.contains("Container best-effort was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = evicted["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(disruption["reason"], "TerminationByKubelet", "{evicted}");
    let events = node.events_about("best-effort")?;
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Evicted" && e["type"] == "Warning" && e["message"] == message),
        "{events:?}"
    );
    let pressure = ringlet_tests::wait_for("MemoryPressure on the Node", EVICTION, || {
        let node = node.node_object().ok()?;
        let condition = memory_pressure(&node)?.clone();
        (condition["status"] == "True").then_some(condition)
    })?;
    assert_eq!(pressure["reason"], "KubeletHasInsufficientMemory");

    // One monitoring period later the hog and the bystander still run: the eviction gave back
    // more than the hog took below the threshold.
    std::thread::sleep(QUIET);
    assert!(running(&node, "hog")?, "the hog is not evicted next");
    assert!(running(&node, "bystander")?, "the bystander is not evicted");
    Ok(())
}
