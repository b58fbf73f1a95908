//! End-to-end: pods changed while they run on a ringlet node, on the lab's containerd: ephemeral
//! containers added through the `ephemeralcontainers` subresource, and an active deadline set.
//! What a container sees is written to a host directory (a `hostPath` volume), so it is read
//! without `kubectl exec`. Run as root, one test at a time.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use ringlet_tests::cluster::{require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{container_status, phase};
use serde_json::{Value, json};

const START: Duration = Duration::from_mins(1);

fn ephemeral_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["ephemeralContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn state<'a>(status: Option<&'a Value>, which: &str) -> Option<&'a Value> {
    status.map(|s| &s["state"][which]).filter(|s| s.is_object())
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default()
}

/// The app's PID 1 is `sleep 7777`, a command no other container's differs by.
fn pod(node: &str, dir: &Path, extra: &str) -> String {
    format!(
        r"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  {extra}
  volumes:
  - name: ctl
    hostPath: {{path: {dir}, type: Directory}}
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: [sleep, '7777']
",
        dir = dir.display()
    )
}

/// Adds an ephemeral container that writes its PID 1's command line to `/ctl/<name>` and a line
/// to `/ctl/runs` each time it runs, then sleeps `sleep` (or exits when empty).
fn add_ephemeral(node: &ClusterNode, name: &str, target: Option<&str>, sleep: &str) -> Result<()> {
    let script =
        format!("tr '\\0' ' ' < /proc/1/cmdline > /ctl/{name}; echo {name} >> /ctl/runs; {sleep}");
    let mut container = json!({
        "name": name,
        "image": "busybox",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "ctl", "mountPath": "/ctl"}],
    });
    if let Some(target) = target {
        container["targetContainerName"] = json!(target);
    }
    let patch = json!({"spec": {"ephemeralContainers": [container]}});
    run(node.kubectl().args([
        "patch",
        "pod",
        "web",
        "--subresource=ephemeralcontainers",
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]))?;
    Ok(())
}

#[test]
fn ephemeral_containers_start_once_in_their_targets_pid_namespace() -> Result<()> {
    let test = "ephemeral_containers_start_once_in_their_targets_pid_namespace";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let dir = tempfile::Builder::new()
        .prefix("ringlet-ephemeral-")
        .tempdir()?;
    node.apply(&pod(node.node(), dir.path(), ""))?;
    let api = node.wait_api_pod("web", "running", START, |p| {
        state(container_status(p, "app"), "running").is_some()
    })?;
    let app_id = container_status(&api, "app").map(|s| s["containerID"].clone());

    // One that targets the app sees the app's processes, and exits.
    add_ephemeral(&node, "dbg", Some("app"), "")?;
    let api = node.wait_api_pod("web", "with dbg done", START, |p| {
        state(ephemeral_status(p, "dbg"), "terminated").is_some()
    })?;
    let dbg = ephemeral_status(&api, "dbg");
    ensure!(
        state(dbg, "terminated").is_some_and(|t| t["exitCode"] == 0),
        "dbg: {dbg:?}"
    );
    ensure!(
        read(dir.path(), "dbg").trim() == "sleep 7777",
        "dbg saw PID 1 as {:?}",
        read(dir.path(), "dbg")
    );

    // Another, without a target, runs in a PID namespace of its own; the syncs that start it
    // leave the exited one alone, and neither touches the app.
    add_ephemeral(&node, "dbg2", None, "exec sleep 3600")?;
    let api = node.wait_api_pod("web", "with dbg2 running", START, |p| {
        state(ephemeral_status(p, "dbg2"), "running").is_some()
    })?;
    ensure!(
        !read(dir.path(), "dbg2").contains("7777"),
        "dbg2 saw the app's PID 1: {:?}",
        read(dir.path(), "dbg2")
    );
    ensure!(
        read(dir.path(), "runs") == "dbg\ndbg2\n",
        "runs: {:?}",
        read(dir.path(), "runs")
    );
    let dbg = ephemeral_status(&api, "dbg");
    ensure!(
        state(dbg, "terminated").is_some() && dbg.is_some_and(|d| d["restartCount"] == 0),
        "dbg was restarted: {dbg:?}"
    );
    let app = container_status(&api, "app");
    ensure!(
        phase(&api) == "Running"
            && state(app, "running").is_some()
            && app.map(|s| s["containerID"].clone()) == app_id,
        "the app did not keep running: {api}"
    );
    Ok(())
}

#[test]
fn a_pod_is_stopped_and_failed_at_an_active_deadline_set_while_it_runs() -> Result<()> {
    let test = "a_pod_is_stopped_and_failed_at_an_active_deadline_set_while_it_runs";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let dir = tempfile::Builder::new()
        .prefix("ringlet-deadline-")
        .tempdir()?;
    node.apply(&pod(node.node(), dir.path(), "restartPolicy: Always"))?;
    node.wait_api_pod("web", "running", START, |p| {
        state(container_status(p, "app"), "running").is_some()
    })?;

    // Set while the pod runs, ahead of it: nothing but the deadline itself syncs the pod then,
    // and the next resync (a minute at least after the last sync) is past the wait below.
    run(node.kubectl().args([
        "patch",
        "pod",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"activeDeadlineSeconds":10}}"#,
    ]))?;
    let api = node.wait_api_pod("web", "failed", Duration::from_secs(30), |p| {
        phase(p) == "Failed"
    })?;
    ensure!(
        api["status"]["reason"] == "DeadlineExceeded"
            && api["status"]["message"]
                == "Pod was active on the node longer than the specified deadline",
        "status: {}",
        api["status"]
    );
    node.wait_api_pod("web", "with its container stopped", START, |p| {
        state(container_status(p, "app"), "terminated").is_some()
    })?;
    let events = node.events_about("web")?;
    ensure!(
        events.iter().any(|e| e["reason"] == "DeadlineExceeded"),
        "no DeadlineExceeded event: {events:?}"
    );
    Ok(())
}
