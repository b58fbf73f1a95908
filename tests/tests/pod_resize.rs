//! End-to-end: in-place pod resize on a ringlet node, on the lab's containerd. The pod is resized
//! through the API server's `resize` subresource; its containers copy their own cgroup settings to
//! a host directory (a `hostPath` volume) every 200 ms, so what the runtime applied is read without
//! `kubectl exec`. The status reports the applied resources, `PodResizeInProgress` goes away once
//! they are, a `RestartContainer` policy restarts its container, and requests beyond the node are
//! `PodResizePending`/`Infeasible`. Run as root, one test at a time.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use ringlet_tests::cluster::{require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::container_status;
use serde_json::{Value, json};

const START: Duration = Duration::from_mins(1);

/// A container that copies its cgroup v1 (or v2) CPU quota and memory limit to `/ctl/<name>.*`.
fn container(name: &str, resources: &Value, restart_memory: bool) -> Value {
    let script = format!(
        "while true; do \
           cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max; \
           cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; \
         done | while read quota && read memory; do \
           echo $quota $memory > /ctl/{name}.tmp; mv /ctl/{name}.tmp /ctl/{name}; sleep 0.2; \
         done"
    );
    let mut c = json!({
        "name": name,
        "image": "busybox",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "resources": resources,
        "volumeMounts": [{"name": "ctl", "mountPath": "/ctl"}],
    });
    if restart_memory {
        c["resizePolicy"] = json!([
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        ]);
    }
    c
}

fn limits(cpu: &str, memory: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}})
}

fn pod(node: &str, dir: &Path) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "ctl", "hostPath": {"path": dir.display().to_string(), "type": "Directory"}}],
            "containers": [
                container("app", &limits("200m", "64Mi"), false),
                container("side", &limits("100m", "32Mi"), true),
            ],
        },
    })
    .to_string()
}

fn resize(node: &ClusterNode, containers: &Value) -> Result<()> {
    let patch = json!({"spec": {"containers": containers}});
    run(node.kubectl().args([
        "patch",
        "pod",
        "web",
        "--subresource=resize",
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]))?;
    Ok(())
}

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn resources_shown(pod: &Value, name: &str) -> Value {
    container_status(pod, name).map_or(Value::Null, |s| s["resources"].clone())
}

fn restarts(pod: &Value, name: &str) -> i64 {
    container_status(pod, name)
        .and_then(|s| s["restartCount"].as_i64())
        .unwrap_or(-1)
}

/// What the container last copied: its CPU quota and memory limit.
fn cgroup(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn wait_cgroup(dir: &Path, name: &str, want: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + START;
    while std::time::Instant::now() < deadline {
        if cgroup(dir, name) == want {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!(
        "{name}: cgroup settings {:?}, want {want:?}",
        cgroup(dir, name)
    )
}

fn settled(pod: &Value, app: &Value, side: &Value) -> bool {
    resources_shown(pod, "app") == *app
        && resources_shown(pod, "side") == *side
        && condition(pod, "PodResizeInProgress").is_none()
        && condition(pod, "PodResizePending").is_none()
        && container_status(pod, "side").is_some_and(|s| s["state"]["running"].is_object())
}

#[test]
fn running_containers_are_resized_in_place_or_restarted_per_their_policy() -> Result<()> {
    let test = "running_containers_are_resized_in_place_or_restarted_per_their_policy";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let dir = tempfile::Builder::new()
        .prefix("ringlet-resize-")
        .tempdir()?;
    node.apply(&pod(node.node(), dir.path()))?;
    let (app, side) = (limits("200m", "64Mi"), limits("100m", "32Mi"));
    node.wait_api_pod("web", "running with its resources shown", START, |p| {
        settled(p, &app, &side)
    })?;
    wait_cgroup(dir.path(), "app", &format!("20000 {}", 64 << 20))?;
    wait_cgroup(dir.path(), "side", &format!("10000 {}", 32 << 20))?;

    // Up for the app, in place; down for the side container, whose memory policy restarts it.
    let (app, side) = (limits("300m", "96Mi"), limits("50m", "16Mi"));
    resize(
        &node,
        &json!([{"name": "app", "resources": app}, {"name": "side", "resources": side}]),
    )?;
    let api = node.wait_api_pod("web", "resized", START, |p| settled(p, &app, &side))?;
    ensure!(restarts(&api, "app") == 0, "app restarted: {api}");
    ensure!(
        restarts(&api, "side") == 1,
        "side not restarted once: {api}"
    );
    wait_cgroup(dir.path(), "app", &format!("30000 {}", 96 << 20))?;
    wait_cgroup(dir.path(), "side", &format!("5000 {}", 16 << 20))?;

    // A resize beyond the node's capacity never reaches the agent: the API server's resize
    // admission (1.36) refuses it against the Node's allocatable, so `Infeasible` is covered by
    // the unit tests of `kuberuntime::resize` only.
    Ok(())
}
