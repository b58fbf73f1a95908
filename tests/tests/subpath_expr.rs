//! End-to-end: `subPathExpr`, the subPath a container's environment names (the e2e suite's
//! "Variable Expansion" subpath specs), against the real control plane (`cargo xtask cluster up`)
//! and the lab's containerd. A variable the container lacks or has empty, an absolute result and
//! one with `..` hold the container in `CreateContainerConfigError` with the kubelet's message; a
//! pod annotated afterwards starts on a later sync, and its subPath is the directory the expansion
//! names in the volume. Run as root, one test at a time.

use std::time::Duration;

use anyhow::{Context, Result};
use ringlet_tests::cluster::{require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{container_status, phase, wait_for};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);
/// Runs until SIGTERM, then exits 0.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// A node the API server can reach for `kubectl exec`, syncing its pods every 5 s.
fn exec_node(test: &str, cluster: &ringlet_tests::cluster::Cluster) -> Result<ClusterNode> {
    ClusterNode::start(
        test,
        cluster,
        ClusterNodeOptions {
            node: Some("localhost".to_owned()),
            args: vec!["--sync-frequency=5s".to_owned()],
            ..ClusterNodeOptions::default()
        },
    )
}

fn exec(node: &ClusterNode, pod: &str, script: &str) -> Result<String> {
    let out = run(node
        .kubectl()
        .args(["exec", pod, "-c", "main", "--", "sh", "-c", script]))?;
    Ok(out.trim().to_owned())
}

fn agent_log(node: &ClusterNode) -> String {
    format!(
        "agent log:\n{}",
        ringlet_tests::tail(&node.agent().log(), 40)
    )
}

/// The waiting message of `container` once it is held in `CreateContainerConfigError`.
fn config_error(node: &ClusterNode, pod: &str, container: &str) -> Result<String> {
    let held = |p: &Value| {
        container_status(p, container)
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
    };
    let pod_object = node
        .wait_api_pod(pod, &format!("{container} held"), START, held)
        .with_context(|| agent_log(node))?;
    let status = container_status(&pod_object, container).context("no status")?;
    Ok(status["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// "should verify that a failing subpath expansion can be modified during the lifecycle of a
/// container" and "should succeed in writing subpaths in container", on one pod.
#[test]
fn a_sub_path_expr_waits_for_its_variables_then_mounts_the_directory_they_name() -> Result<()> {
    let test = "a_sub_path_expr_waits_for_its_variables";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster)?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: expanded
  annotations: {{notmysubpath: mypath}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    env:
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: ANNOTATION, valueFrom: {{fieldRef: {{fieldPath: "metadata.annotations['mysubpath']"}}}}}}
    volumeMounts:
    - {{name: work, mountPath: /subpath_mount, subPathExpr: "$(ANNOTATION)/$(POD_NAME)"}}
    - {{name: work, mountPath: /volume_mount}}
  volumes:
  - {{name: work, emptyDir: {{}}}}
"#,
        node = node.node()
    );
    node.apply(&manifest)?;
    assert_eq!(
        config_error(&node, "expanded", "main")?,
        "missing value for ANNOTATION"
    );

    run(node
        .kubectl()
        .args(["annotate", "pod", "expanded", "mysubpath=mypath"]))?;
    node.wait_api_pod("expanded", "Running", START, |p| {
        phase(p) == "Running"
            && container_status(p, "main").is_some_and(|c| c["state"]["running"].is_object())
    })
    .with_context(|| agent_log(&node))?;
    exec(
        &node,
        "expanded",
        "touch /volume_mount/mypath/expanded/test.log",
    )?;
    exec(&node, "expanded", "test -f /subpath_mount/test.log")?;

    // A later value leaves the running container as it is; the pod goes with its bind.
    run(node.kubectl().args([
        "annotate",
        "--overwrite",
        "pod",
        "expanded",
        "mysubpath=mynewpath",
    ]))?;
    node.wait_api_pod("expanded", "Running", START, |p| phase(p) == "Running")?;
    exec(&node, "expanded", "test -f /subpath_mount/test.log")?;
    let pod = node.api_pod("expanded")?.context("the pod is gone")?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let pod_dir = node.agent().root_dir().join("pods").join(uid);
    assert!(pod_dir.join("volume-subpaths/work/main/0").exists());
    run(node
        .kubectl()
        .args(["delete", "pod", "expanded", "--wait=false"]))?;
    wait_for("the pod's directory to go", START, || {
        (!pod_dir.exists()).then_some(())
    })
    .with_context(|| agent_log(&node))?;
    Ok(())
}

/// "should fail substituting values in a volume subpath with absolute path" and "... with
/// backticks" (whose value is `..`), and a variable the container does not define at all.
#[test]
fn sub_path_exprs_the_kubelet_refuses_hold_the_container_with_its_message() -> Result<()> {
    let test = "sub_path_exprs_the_kubelet_refuses";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster)?;
    let container = |name: &str, value: &str| {
        format!(
            r#"  - name: {name}
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    env: [{{name: POD_NAME, value: {value:?}}}]
    volumeMounts: [{{name: work, mountPath: /logs, subPathExpr: "$(POD_NAME)$(UNDEFINED)"}}]
"#
        )
    };
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: refused}}\nspec:\n  nodeName: {node}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n{absolute}{up}  volumes:\n  - \
         {{name: work, emptyDir: {{}}}}\n",
        node = node.node(),
        absolute = container("absolute", "/tmp").replace("$(UNDEFINED)", ""),
        up = container("up", "..").replace("$(UNDEFINED)", ""),
    );
    node.apply(&manifest)?;
    assert_eq!(
        config_error(&node, "refused", "absolute")?,
        "error SubPath `/tmp` must not be an absolute path"
    );
    assert_eq!(
        config_error(&node, "refused", "up")?,
        "unable to provision SubPath `..`: must not contain '..'"
    );
    wait_for("the Failed event about the absolute subPath", START, || {
        node.events_about("refused").ok()?.into_iter().find(|e| {
            e["reason"] == "Failed"
                && e["message"] == "Error: error SubPath `/tmp` must not be an absolute path"
        })
    })
    .with_context(|| agent_log(&node))?;

    let undefined = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: undefined}}\nspec:\n  nodeName: {node}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n{main}  volumes:\n  - \
         {{name: work, emptyDir: {{}}}}\n",
        node = node.node(),
        main = container("main", "web"),
    );
    node.apply(&undefined)?;
    assert_eq!(
        config_error(&node, "undefined", "main")?,
        "missing value for UNDEFINED"
    );
    Ok(())
}
