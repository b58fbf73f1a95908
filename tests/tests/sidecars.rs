//! End-to-end: sidecars (init containers with `restartPolicy: Always`) of pods the API server binds
//! to a ringlet node, on the lab's containerd. The containers append what happens to them to one
//! log file in a host directory (a `hostPath` volume, which outlives the pod), so the order of
//! starts and stops is read from the log, not guessed from timestamps. Run as root, one test at a
//! time.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ringlet_tests::cluster::require_lab_and_cluster;
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{container_status, phase, wait_for};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);

/// The status of init container `name`.
fn init_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["initContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn is_running(status: Option<&Value>) -> bool {
    status.is_some_and(|c| c["state"]["running"].is_object())
}

fn restart_count(status: Option<&Value>) -> u64 {
    status.and_then(|c| c["restartCount"].as_u64()).unwrap_or(0)
}

fn container_id(status: Option<&Value>) -> String {
    status
        .and_then(|c| c["containerID"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn log_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The position of the `nth` (from 0) occurrence of `line` in `lines`.
fn position(lines: &[String], line: &str, nth: usize) -> Result<usize> {
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| *l == line)
        .nth(nth)
        .map(|(i, _)| i)
        .with_context(|| format!("{line:?} #{nth} missing from {lines:?}"))
}

/// The sidecar logs its start, becomes started (its startup probe looks for `/ctl/side-ready`)
/// two seconds later, exits 3 when the test creates `/ctl/side-exit`, and logs the stop signal.
const SIDECAR: &str = "echo side-start >> /ctl/log; \
    trap 'echo side-stop >> /ctl/log; exit 0' TERM; \
    sleep 2; touch /ctl/side-ready; echo side-ready >> /ctl/log; \
    while true; do \
      if [ -f /ctl/side-exit ]; then rm /ctl/side-exit; echo side-exit >> /ctl/log; exit 3; fi; \
      sleep 0.2 & wait $!; \
    done";

/// The app logs its start, and on the stop signal takes two seconds before it logs its stop and
/// exits: a sidecar signalled with it would log its own stop first.
const APP: &str = "echo app-start >> /ctl/log; \
    trap 'sleep 2; echo app-stop >> /ctl/log; exit 0' TERM; \
    while true; do sleep 0.2 & wait $!; done";

fn sidecar_pod(node: &str, dir: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: {node}
  restartPolicy: Always
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 20
  volumes:
  - name: ctl
    hostPath: {{path: {dir}, type: Directory}}
  initContainers:
  - name: side
    image: busybox
    imagePullPolicy: IfNotPresent
    restartPolicy: Always
    command: ["sh", "-c", {SIDECAR:?}]
    volumeMounts:
    - {{name: ctl, mountPath: /ctl}}
    startupProbe:
      exec:
        command: ["test", "-f", "/ctl/side-ready"]
      periodSeconds: 1
      failureThreshold: 30
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {APP:?}]
    volumeMounts:
    - {{name: ctl, mountPath: /ctl}}
"#,
        dir = dir.display()
    )
}

#[test]
fn a_sidecar_starts_before_the_app_restarts_alone_and_stops_after_it() -> Result<()> {
    let test = "a_sidecar_starts_before_the_app_restarts_alone_and_stops_after_it";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let dir = tempfile::Builder::new()
        .prefix("ringlet-sidecar-")
        .tempdir()?;
    node.apply(&sidecar_pod(node.node(), dir.path()))?;

    // The app starts only once the sidecar has started: after its startup probe succeeded.
    let api = node.wait_api_pod("web", "running with its sidecar", START, |p| {
        is_running(container_status(p, "app")) && is_running(init_status(p, "side"))
    })?;
    let lines = log_lines(dir.path());
    ensure!(
        position(&lines, "side-ready", 0)? < position(&lines, "app-start", 0)?,
        "the app started before its sidecar had started: {lines:?}"
    );
    let side = init_status(&api, "side");
    ensure!(
        side.is_some_and(|s| s["started"] == true),
        "the sidecar is not started: {side:?}"
    );
    let app_id = container_id(container_status(&api, "app"));
    ensure!(!app_id.is_empty(), "the app has no container id: {api}");

    // The sidecar exits: it is restarted, the app keeps running as it was.
    std::fs::write(dir.path().join("side-exit"), "")?;
    let api = node.wait_api_pod("web", "with its sidecar restarted", START, |p| {
        restart_count(init_status(p, "side")) == 1 && is_running(init_status(p, "side"))
    })?;
    let app = container_status(&api, "app");
    ensure!(
        is_running(app) && restart_count(app) == 0 && container_id(app) == app_id,
        "the app did not keep running through the sidecar's restart: {app:?}"
    );
    ensure!(phase(&api) == "Running", "phase {}", phase(&api));
    let lines = log_lines(dir.path());
    ensure!(
        position(&lines, "side-exit", 0)? < position(&lines, "side-start", 1)?,
        "{lines:?}"
    );
    ensure!(
        !lines.contains(&"app-stop".to_owned()),
        "the app was stopped: {lines:?}"
    );

    // On deletion the app stops first; the sidecar gets its stop signal only then.
    ringlet_tests::cluster::run(
        node.kubectl()
            .args(["delete", "pod", "web", "--wait=false"]),
    )?;
    wait_for("the pod to be gone", START, || {
        node.api_pod("web").ok()?.is_none().then_some(())
    })?;
    let lines = log_lines(dir.path());
    ensure!(
        position(&lines, "app-stop", 0)? < position(&lines, "side-stop", 0)?,
        "the sidecar stopped before the app: {lines:?}"
    );
    Ok(())
}
