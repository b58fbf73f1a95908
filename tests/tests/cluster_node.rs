//! End-to-end: ringlet as a node of a real control plane (the kube-apiserver and etcd that `cargo
//! xtask cluster up` runs on loopback) with real pods on the lab's containerd. Nothing stands in for
//! the API server; what kube-controller-manager would do (sign CSRs, ready namespaces) the harness
//! does. Run as root, one test at a time.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ringlet_tests::cluster::{Cluster, require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{
    ClusterNode, ClusterNodeOptions, NodeCredentials, api_server_daemon,
};
use ringlet_tests::{
    CONTAINERD_SOCKET, container_labels, container_status, containers_of_namespace, lab_containerd,
    phase, restart_lab_containerd, task_running, wait_for,
};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);
/// How soon a status the agent knows must be on the API server (the issue's bound).
const STATUS_ON_API: Duration = Duration::from_secs(2);

/// A one-container busybox pod bound to `node`, with no service account token (projected volumes
/// are not served yet) and `extra` appended to the container.
fn api_pod(name: &str, node: &str, restart_policy: &str, command: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  restartPolicy: {restart_policy}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {command:?}]
{extra}"#
    )
}

/// Runs until SIGTERM, then exits 0.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn node_ready(node: &Value) -> bool {
    condition(node, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Waits until the node is Ready; returns the Node.
fn wait_ready(node: &ClusterNode) -> Result<Value> {
    wait_for("the node to be Ready", START, || {
        node.node_object().ok().filter(node_ready)
    })
}

fn running_and_ready(pod: &Value) -> bool {
    phase(pod) == "Running"
        && container_status(pod, "main").is_some_and(|c| c["ready"] == true)
        && pod["status"]["podIP"].is_string()
}

fn container_id(pod: &Value) -> Option<String> {
    container_status(pod, "main")?["containerID"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn a_node_registers_turns_ready_renews_its_lease_and_reports_the_runtime() -> Result<()> {
    let test = "a_node_registers_turns_ready_renews_its_lease_and_reports_the_runtime";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            node: Some("e2e-registers".to_owned()),
            args: vec![
                "--node-labels=example.com/rack=r1".to_owned(),
                "--register-with-taints=example.com/dedicated=e2e:NoSchedule".to_owned(),
            ],
            ..ClusterNodeOptions::default()
        },
    )?;
    let ready = wait_ready(&node)?;
    let labels = &ready["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], node.node());
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string());
    assert_eq!(labels["example.com/rack"], "r1");
    let taints = ready["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == "example.com/dedicated" && t["effect"] == "NoSchedule"),
        "{taints:?}"
    );
    let status = &ready["status"];
    assert_eq!(status["capacity"]["pods"], "110");
    for resource in ["cpu", "memory", "ephemeral-storage"] {
        assert!(
            status["capacity"][resource].is_string(),
            "capacity {resource}: {status}"
        );
        assert!(
            status["allocatable"][resource].is_string(),
            "allocatable {resource}"
        );
    }
    let address_types: BTreeSet<&str> = status["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["type"].as_str())
        .collect();
    assert_eq!(address_types, BTreeSet::from(["Hostname", "InternalIP"]));
    let info = &status["nodeInfo"];
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("containerd://")),
        "{info}"
    );
    for field in [
        "machineID",
        "bootID",
        "kernelVersion",
        "osImage",
        "kubeletVersion",
    ] {
        assert!(
            info[field].as_str().is_some_and(|v| !v.is_empty()),
            "nodeInfo.{field}: {info}"
        );
    }
    assert_eq!(
        status["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        node.agent().api_port
    );
    let images = status["images"].to_string();
    assert!(images.contains("busybox"), "{images}");
    for (kind, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ] {
        assert_eq!(
            condition(&ready, kind).map(|c| c["reason"].clone()),
            Some(Value::from(reason)),
            "{kind}"
        );
    }

    assert_lease_renews(&cluster, node.node(), &ready)?;
    Ok(())
}

/// The node's Lease is held by the node, owned by its Node, and renewed.
fn assert_lease_renews(cluster: &Cluster, name: &str, node: &Value) -> Result<()> {
    let lease = cluster.get_json(&["lease", name, "-n", "kube-node-lease"])?;
    assert_eq!(lease["spec"]["holderIdentity"], name);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    let owner = &lease["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["uid"], node["metadata"]["uid"]);
    let first_renewal = lease["spec"]["renewTime"].clone();
    wait_for("the lease to be renewed", Duration::from_secs(30), || {
        let lease = cluster
            .get_json(&["lease", name, "-n", "kube-node-lease"])
            .ok()?;
        (lease["spec"]["renewTime"] != first_renewal).then_some(())
    })?;

    Ok(())
}

#[test]
fn a_node_is_not_ready_while_its_runtime_is_down() -> Result<()> {
    let test = "a_node_is_not_ready_while_its_runtime_is_down";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    wait_ready(&node)?;
    // The runtime goes away: the node turns NotReady naming it, and Ready again when it is back.
    let containerd = lab_containerd();
    let command_line = containerd
        .command_line()?
        .context("the lab's containerd is not running")?;
    containerd.stop(Duration::from_secs(15))?;
    let not_ready = wait_for("the node to turn NotReady", START, || {
        let node = node.node_object().ok()?;
        let ready = condition(&node, "Ready")?;
        (ready["status"] == "False").then(|| ready.clone())
    });
    // Started again whatever the wait found, so a failure here does not leave the lab broken.
    restart_lab_containerd(&containerd, &command_line)?;
    let not_ready = not_ready?;
    assert_eq!(not_ready["reason"], "KubeletNotReady");
    let message = not_ready["message"].as_str().unwrap_or_default();
    assert!(message.contains("container runtime"), "{message}");
    wait_ready(&node)?;
    Ok(())
}

#[test]
fn api_pods_run_report_their_status_and_stop_when_deleted() -> Result<()> {
    let test = "api_pods_run_report_their_status_and_stop_when_deleted";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    node.apply(&api_pod("web", node.node(), "Always", SERVE, ""))?;
    // The agent's own view first, then the API server's within the bound.
    node.agent()
        .wait_pod_named("web", "running on the node", START, |pod| {
            container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
        })?;
    let api = node.wait_api_pod(
        "web",
        "Running and ready with an IP",
        STATUS_ON_API,
        running_and_ready,
    )?;
    let pod_ip = api["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        pod_ip.starts_with("10.88."),
        "a pod-network address: {pod_ip}"
    );
    assert!(api["status"]["hostIP"].is_string());
    assert_eq!(
        condition(&api, "Ready").map(|c| c["status"].clone()),
        Some(Value::from("True"))
    );
    assert!(
        !containers_of_namespace(&node.namespace)?.is_empty(),
        "the pod runs on the lab's containerd"
    );

    run(node
        .kubectl()
        .args(["delete", "pod", "web", "--wait=false"]))?;
    wait_for("the pod object to be gone", START, || {
        node.api_pod("web")
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .with_context(|| ringlet_tests::tail(&node.agent().log(), 40))?;
    wait_for("the pod's containers to be stopped", START, || {
        let ids = containers_of_namespace(&node.namespace).ok()?;
        ids.iter()
            .all(|id| task_running(id).is_ok_and(|running| !running))
            .then_some(())
    })?;
    Ok(())
}

#[test]
fn a_crash_loop_shows_its_restarts_and_back_off_through_the_api() -> Result<()> {
    let test = "a_crash_loop_shows_its_restarts_and_back_off_through_the_api";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    node.apply(&api_pod("crasher", node.node(), "Always", "exit 3", ""))?;
    let pod = node.wait_api_pod(
        "crasher",
        "in CrashLoopBackOff after restarts",
        Duration::from_mins(2),
        |pod| {
            container_status(pod, "main").is_some_and(|c| {
                c["restartCount"].as_u64().is_some_and(|n| n >= 2)
                    && c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
            })
        },
    )?;
    let main = container_status(&pod, "main").context("no status for main")?;
    assert_eq!(main["lastState"]["terminated"]["exitCode"], 3);
    // Every back-off is one event on the node; on the API server they are one Event, counted.
    let uid = pod["metadata"]["uid"].clone();
    let back_offs = || -> Result<Vec<Value>> {
        Ok(node
            .events_about("crasher")?
            .into_iter()
            .filter(|e| e["reason"] == "BackOff" && e["involvedObject"]["uid"] == uid)
            .collect())
    };
    let back_off = wait_for("an aggregated BackOff event", START, || {
        back_offs()
            .ok()?
            .into_iter()
            .find(|e| e["count"].as_u64().is_some_and(|n| n >= 2))
    })?;
    assert_eq!(
        back_off["involvedObject"]["fieldPath"],
        "spec.containers{main}"
    );
    assert_eq!(back_off["source"]["component"], "kubelet");
    assert_eq!(back_offs()?.len(), 1, "repeated back-offs are one Event");
    Ok(())
}

#[test]
fn kubectl_logs_and_exec_reach_the_node_through_the_api_server() -> Result<()> {
    let test = "kubectl_logs_and_exec_reach_the_node_through_the_api_server";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    // The API server connects to the node's Hostname address; `localhost` resolves to loopback.
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            node: Some("localhost".to_owned()),
            ..ClusterNodeOptions::default()
        },
    )?;
    let downward_env = r"    resources:
      limits:
        memory: 64Mi
    env:
    - name: NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: POD_UID
      valueFrom: {fieldRef: {fieldPath: metadata.uid}}
    - name: MEMORY_MI
      valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}
    - name: CPU_LIMIT
      valueFrom: {resourceFieldRef: {resource: limits.cpu}}
";
    node.apply(&api_pod(
        "talker",
        node.node(),
        "Always",
        &format!("echo hello-from-ringlet; {SERVE}"),
        downward_env,
    ))?;
    let pod = node.wait_api_pod("talker", "Running", START, running_and_ready)?;
    let logs = wait_for(
        "kubectl logs to show the line",
        Duration::from_secs(20),
        || {
            let out = node.kubectl().args(["logs", "talker"]).output().ok()?;
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            printed.contains("hello-from-ringlet").then_some(printed)
        },
    )?;
    assert_eq!(logs.trim(), "hello-from-ringlet");
    let exec = run(node
        .kubectl()
        .args(["exec", "talker", "--", "sh", "-c", "echo $((6*7))"]))?;
    assert_eq!(exec.trim(), "42");

    // The downward API in the environment: the node, the pod's IP and UID, its memory limit, and
    // for the unset CPU limit the node's allocatable CPUs.
    let env = run(node.kubectl().args([
        "exec",
        "talker",
        "--",
        "sh",
        "-c",
        "echo $NODE $POD_IP $POD_UID $MEMORY_MI $CPU_LIMIT",
    ]))?;
    let allocatable_cpu = node.node_object()?["status"]["allocatable"]["cpu"].clone();
    let expected = format!(
        "{} {} {} 64 {}",
        node.node(),
        pod["status"]["podIP"].as_str().unwrap_or_default(),
        pod["metadata"]["uid"].as_str().unwrap_or_default(),
        allocatable_cpu.as_str().unwrap_or_default()
    );
    assert_eq!(env.trim(), expected);
    Ok(())
}

#[test]
fn static_pods_get_mirror_pods_that_follow_the_manifest() -> Result<()> {
    let test = "static_pods_get_mirror_pods_that_follow_the_manifest";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: etcd-like
  namespace: {}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
"#,
        node.namespace
    );
    node.agent().write_manifest("static.yaml", &manifest)?;
    let mirror_name = format!("etcd-like-{}", node.node());
    let mirror = node.wait_api_pod(&mirror_name, "mirrored and Running", START, |pod| {
        pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string()
            && phase(pod) == "Running"
    })?;
    let owner = &mirror["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], node.node());
    assert_eq!(owner["controller"], true);
    let first_uid = mirror["metadata"]["uid"].clone();

    run(node
        .kubectl()
        .args(["delete", "pod", &mirror_name, "--wait=false"]))?;
    node.wait_api_pod(&mirror_name, "re-created", START, |pod| {
        pod["metadata"]["uid"] != first_uid && pod["metadata"]["deletionTimestamp"].is_null()
    })?;

    node.agent().remove_manifest("static.yaml")?;
    wait_for("the mirror pod to be deleted", START, || {
        node.api_pod(&mirror_name)
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })?;
    Ok(())
}

#[test]
fn tls_bootstrap_gets_the_node_a_client_certificate() -> Result<()> {
    let test = "tls_bootstrap_gets_the_node_a_client_certificate";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            credentials: NodeCredentials::Bootstrap,
            ..ClusterNodeOptions::default()
        },
    )?;
    // Only `system:node:<name>` may create this Node (NodeRestriction): its existence proves the
    // issued certificate is in use.
    wait_for("the bootstrapped node to register", START, || {
        node.node_object().ok()
    })?;
    let cert_dir = node.agent().root_dir().join("pki");
    let current = std::fs::read_link(cert_dir.join("kubelet-client-current.pem"))?;
    ensure!(
        current.to_string_lossy().starts_with("kubelet-client-"),
        "{}",
        current.display()
    );
    let log = node.agent().log();
    ensure!(log.contains("TLS bootstrap done"), "{log}");
    Ok(())
}

#[test]
fn an_agent_in_a_pod_joins_with_its_service_account() -> Result<()> {
    let test = "an_agent_in_a_pod_joins_with_its_service_account";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            credentials: NodeCredentials::InCluster,
            ..ClusterNodeOptions::default()
        },
    )?;
    wait_ready(&node)?;
    node.apply(&api_pod("web", node.node(), "Always", SERVE, ""))?;
    node.wait_api_pod(
        "web",
        "Running and ready with an IP",
        START,
        running_and_ready,
    )?;
    let log = node.agent().log();
    ensure!(
        log.contains("the bearer token in /var/run/secrets/kubernetes.io/serviceaccount/token"),
        "the agent should name the service account token it uses: {}",
        ringlet_tests::tail(&log, 40)
    );
    Ok(())
}

#[test]
fn a_pod_that_does_not_fit_fails_with_the_kubelets_reason() -> Result<()> {
    let test = "a_pod_that_does_not_fit_fails_with_the_kubelets_reason";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    wait_ready(&node)?;
    node.apply(&api_pod(
        "greedy",
        node.node(),
        "Always",
        SERVE,
        "    resources:\n      requests:\n        cpu: \"1000\"\n",
    ))?;
    let pod = node.wait_api_pod("greedy", "Failed", START, |pod| phase(pod) == "Failed")?;
    assert_eq!(pod["status"]["reason"], "OutOfcpu");
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Pod was rejected: Node didn't have enough resource: cpu"),
        "{message}"
    );
    ensure!(
        containers_of_namespace(&node.namespace)?.is_empty(),
        "a rejected pod must not start"
    );
    Ok(())
}

#[test]
fn pods_keep_running_through_an_api_server_outage_and_statuses_catch_up() -> Result<()> {
    let test = "pods_keep_running_through_an_api_server_outage_and_statuses_catch_up";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    node.apply(&api_pod("steady", node.node(), "Always", SERVE, ""))?;
    let before = node.wait_api_pod("steady", "Running", START, running_and_ready)?;
    let dead_container = container_id(&before).context("no container id")?;
    let ids_before = containers_of_namespace(&node.namespace)?;

    let api_server = api_server_daemon();
    let command_line = api_server
        .command_line()?
        .context("the API server is not running")?;
    api_server.stop(Duration::from_secs(30))?;
    let outage_started = Instant::now();
    // While the API server is away the pod's container dies; the agent restarts it on its own.
    let id = dead_container
        .strip_prefix("containerd://")
        .unwrap_or(&dead_container)
        .to_owned();
    let restarted_on_node = run(Command::new("ctr").args([
        "--address",
        CONTAINERD_SOCKET,
        "-n",
        "k8s.io",
        "tasks",
        "kill",
        "--signal",
        "SIGKILL",
        &id,
    ]))
    .and_then(|_| {
        node.agent()
            .wait_pod_named("steady", "restarted on the node", START, |pod| {
                container_status(pod, "main")
                    .is_some_and(|c| c["restartCount"] == 1 && c["state"]["running"].is_object())
            })
    });
    // The outage lasts 30 s, whatever happened meanwhile.
    std::thread::sleep(Duration::from_secs(30).saturating_sub(outage_started.elapsed()));
    let healthz = ringlet_tests::http_get(node.agent().healthz_port, "/healthz");
    api_server.start(
        std::path::Path::new(&command_line[0]),
        &command_line[1..],
        || cluster.readyz().is_ok(),
        Duration::from_mins(2),
    )?;
    restarted_on_node?;
    let (code, _) = healthz?;
    assert_eq!(
        code, 200,
        "the agent stays healthy while the API server is away"
    );

    node.apply(&api_pod("latecomer", node.node(), "Always", SERVE, ""))?;
    node.wait_api_pod(
        "latecomer",
        "Running",
        Duration::from_mins(2),
        running_and_ready,
    )?;
    let after = node.wait_api_pod(
        "steady",
        "restarted once, reported",
        Duration::from_mins(1),
        |pod| {
            running_and_ready(pod)
                && container_status(pod, "main").is_some_and(|c| c["restartCount"] == 1)
        },
    )?;
    ensure!(
        container_id(&after).as_ref() != Some(&dead_container),
        "the dead container was replaced, and reported"
    );
    let still_there: BTreeSet<String> = containers_of_namespace(&node.namespace)?
        .into_iter()
        .collect();
    let kept: Vec<&String> = ids_before
        .iter()
        .filter(|c| !dead_container.ends_with(c.as_str()))
        .collect();
    ensure!(
        kept.iter().all(|c| still_there.contains(*c)),
        "the sandbox was kept, nothing but the dead container was replaced: before {ids_before:?}, after {still_there:?}"
    );
    Ok(())
}

#[test]
fn a_killed_agent_adopts_its_containers_after_a_restart() -> Result<()> {
    let test = "a_killed_agent_adopts_its_containers_after_a_restart";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let mut node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    node.apply(&api_pod("survivor", node.node(), "Always", SERVE, ""))?;
    node.apply(&api_pod("doomed", node.node(), "Always", SERVE, ""))?;
    let before = node.wait_api_pod("survivor", "Running", START, running_and_ready)?;
    let doomed = node.wait_api_pod("doomed", "Running", START, running_and_ready)?;
    let doomed_uid = doomed["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let of_survivor = |ids: Vec<String>| -> Result<BTreeSet<String>> {
        Ok(ids
            .into_iter()
            .filter(|id| !pod_uid_of(id).is_ok_and(|uid| uid == doomed_uid))
            .collect())
    };
    let containers_before = of_survivor(containers_of_namespace(&node.namespace)?)?;

    node.agent_mut().kill()?;
    // Deleted while the agent is down: nothing tells it but the pod's absence after the restart.
    run(node
        .kubectl()
        .args(["delete", "pod", "doomed", "--grace-period=0", "--force"]))?;
    node.agent_mut().restart()?;
    wait_for("the deleted pod's containers to be stopped", START, || {
        let left = containers_of_namespace(&node.namespace).ok()?;
        let running = left
            .iter()
            .filter(|id| pod_uid_of(id).is_ok_and(|uid| uid == doomed_uid))
            .any(|id| task_running(id).unwrap_or(false));
        (!running).then_some(())
    })?;
    // The restarted agent sees the same pod running and changes nothing.
    node.agent()
        .wait_pod_named("survivor", "adopted", START, |pod| {
            container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
        })?;
    let after = node.wait_api_pod("survivor", "still Running", START, running_and_ready)?;
    assert_eq!(container_id(&after), container_id(&before));
    assert_eq!(
        container_status(&after, "main").map(|c| c["restartCount"].clone()),
        Some(Value::from(0))
    );
    let containers_after = of_survivor(containers_of_namespace(&node.namespace)?)?;
    assert_eq!(containers_after, containers_before, "nothing re-created");
    Ok(())
}

#[test]
fn a_node_registered_by_another_machine_is_taken_over_with_a_warning() -> Result<()> {
    let test = "a_node_registered_by_another_machine_is_taken_over_with_a_warning";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let mut node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let ours = wait_ready(&node)?["status"]["nodeInfo"]["machineID"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    node.agent_mut().stop()?;
    // Another machine registered under this name: its machineID is on the Node.
    let theirs = "0123456789abcdef0123456789abcdef";
    run(cluster.kubectl().args([
        "patch",
        "node",
        node.node(),
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"nodeInfo":{{"machineID":"{theirs}"}}}}}}"#),
    ]))?;
    node.agent_mut().restart()?;
    wait_for("this machine's ID back on the Node", START, || {
        let object = node.node_object().ok()?;
        (object["status"]["nodeInfo"]["machineID"] == ours.as_str() && node_ready(&object))
            .then_some(())
    })?;
    let log = node.agent().log();
    let warning = format!(
        "node {} was registered by another machine (machineID {theirs}, this one is {ours})",
        node.node()
    );
    ensure!(
        log.matches(warning.as_str()).count() == 1,
        "one warning naming both machines: {}",
        ringlet_tests::tail(&log, 40)
    );
    Ok(())
}

/// The pod UID label of a containerd container.
fn pod_uid_of(id: &str) -> Result<String> {
    container_labels(id)?["io.kubernetes.pod.uid"]
        .as_str()
        .map(str::to_owned)
        .context("no pod uid label")
}

#[test]
fn an_unusable_kubeconfig_stops_the_agent_with_the_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("absent.conf");
    let output = Command::new(ringlet_tests::ringlet_binary()?)
        .args([
            "--hostname-override",
            "e2e-bad-kubeconfig",
            "--root-dir",
            &dir.path().join("root").display().to_string(),
            "--kubeconfig",
            &missing.display().to_string(),
            "--events-socket",
            &dir.path().join("events.sock").display().to_string(),
        ])
        .output()?;
    ensure!(!output.status.success(), "the agent must not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr.contains("cannot use --kubeconfig") && stderr.contains("absent.conf"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn a_refused_identity_is_logged_with_the_user_and_the_verb() -> Result<()> {
    let test = "a_refused_identity_is_logged_with_the_user_and_the_verb";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    // A certificate for some other user: authenticated, but not a node.
    let ca = ringlet_tests::cluster::Ca::load(&cluster.dir)?;
    let (cert_pem, key_pem) = ca.client_certificate("e2e-stranger", None)?;
    let config = ringlet_tests::cluster::kubeconfig(
        &cluster.server,
        ca.pem(),
        "e2e-stranger",
        &ringlet_tests::cluster::Credentials::Certificate {
            cert_pem: &cert_pem,
            key_pem: &key_pem,
        },
    );
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("stranger.conf");
    std::fs::write(&kubeconfig, config)?;
    let node = ringlet_tests::Agent::start(
        test,
        ringlet_tests::AgentOptions {
            node: Some("e2e-refused".to_owned()),
            args: vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()],
            ..ringlet_tests::AgentOptions::default()
        },
    )?;
    let line = wait_for("the refusal in the log", START, || {
        node.log()
            .lines()
            .find(|l| l.contains("create node/e2e-refused"))
            .map(str::to_owned)
    })?;
    ensure!(
        line.contains("forbidden for the client certificate of user \"e2e-stranger\"")
            && line.contains("cannot create resource \"nodes\""),
        "{line}"
    );
    let (code, _) = ringlet_tests::http_get(node.healthz_port, "/healthz")?;
    if code != 200 {
        bail!("the agent must keep running: healthz answered {code}");
    }
    Ok(())
}
