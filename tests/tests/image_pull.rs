//! End-to-end: image pulls as the kubelet does them, from the lab's private registry (`cargo xtask
//! lab up --registry`: TLS with the lab's CA, htpasswd basic auth) through the lab's containerd,
//! for pods of the real control plane. A private image is pulled with the pod's pull secret or
//! the node's docker config, and refused without valid credentials (`ErrImagePull`, then
//! `ImagePullBackOff`); an `Always` pull that fails never falls back to the image on the node.
//! Pulls limited to one at a time all complete, and a pull over the registry rate fails with
//! `pull QPS exceeded`.
//! Run as root, one test at a time.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ringlet_tests::cluster::{Cluster, require_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::registry::{
    PRIVATE_IMAGE, PRIVATE_IMAGE_SOURCE, REGISTRY_HOST, REGISTRY_PASSWORD, REGISTRY_USER,
};
use ringlet_tests::{container_status, k8s_ctr, require_lab, require_registry, wait_for};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);
/// Long enough for a failed pull, the pod worker's 10 s retry and the doubled back-off after it.
const BACK_OFF_SEEN: Duration = Duration::from_secs(90);
/// The pull secret the tests create with `kubectl create secret docker-registry`.
const SECRET: &str = "lab-registry";

/// The lab, the registry and the control plane, or SKIP (a failure under CI).
fn require(test: &str) -> Option<Cluster> {
    if !require_lab(test) || !require_registry(test) {
        return None;
    }
    require_cluster(test)
}

/// Removes the private image from the node, so the next pod has to pull it. Its blobs stay (the
/// lab's busybox shares them); the registry still has to accept the credentials for the manifest.
fn remove_private_image() -> Result<()> {
    let out = k8s_ctr(&["images", "rm", PRIVATE_IMAGE])?;
    if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("not found") {
        bail!(
            "ctr images rm {PRIVATE_IMAGE}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Puts the private image on the node without a pull, as an earlier pull would have left it.
fn tag_private_image() -> Result<()> {
    let out = k8s_ctr(&[
        "images",
        "tag",
        "--force",
        PRIVATE_IMAGE_SOURCE,
        PRIVATE_IMAGE,
    ])?;
    if !out.status.success() {
        bail!(
            "ctr images tag: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `kubectl create secret docker-registry` in the test's namespace, as a user would (replacing
/// the one an earlier run left: the namespace outlives the test).
fn create_pull_secret(node: &ClusterNode, name: &str, password: &str) -> Result<()> {
    run(node
        .kubectl()
        .args(["delete", "secret", name, "--ignore-not-found"]))?;
    run(node.kubectl().args([
        "create",
        "secret",
        "docker-registry",
        name,
        &format!("--docker-server={REGISTRY_HOST}"),
        &format!("--docker-username={REGISTRY_USER}"),
        &format!("--docker-password={password}"),
    ]))?;
    Ok(())
}

/// A pod of the private image bound to the test's node, pulling it under `policy` with the
/// `secrets` named as its `imagePullSecrets`.
fn private_pod(name: &str, node: &str, policy: &str, secrets: &[&str]) -> String {
    let pull_secrets = if secrets.is_empty() {
        String::new()
    } else {
        format!(
            "  imagePullSecrets:\n  - name: {}\n",
            secrets.join("\n  - name: ")
        )
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
{pull_secrets}  containers:
  - name: main
    image: {PRIVATE_IMAGE}
    imagePullPolicy: {policy}
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#
    )
}

fn running(pod: &Value) -> bool {
    container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
}

fn waiting(pod: &Value) -> Option<(String, String)> {
    let waiting = &container_status(pod, "main")?["state"]["waiting"];
    Some((
        waiting["reason"].as_str()?.to_owned(),
        waiting["message"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// What [`follow_until_back_off`] saw of one pod.
struct Followed {
    /// The container's waiting reasons, in order of first appearance.
    reasons: Vec<String>,
    /// The `ImagePullBackOff` message.
    back_off_message: String,
}

impl Followed {
    /// Whether the pull failed first (`ErrImagePull`) and then backed off, and nothing else
    /// happened but the wait for the sandbox (`ContainerCreating`).
    fn err_image_pull_then_back_off(&self) -> bool {
        let pulls: Vec<&str> = self
            .reasons
            .iter()
            .map(String::as_str)
            .filter(|r| *r != "ContainerCreating")
            .collect();
        pulls == ["ErrImagePull", "ImagePullBackOff"]
    }
}

/// Follows the `pods`' containers (all at once, so no pod's first failure goes unseen) until each
/// waits in `ImagePullBackOff`; fails if any of them ever runs.
fn follow_until_back_off(node: &ClusterNode, pods: &[&str]) -> Result<Vec<Followed>> {
    let mut reasons: Vec<Vec<String>> = vec![Vec::new(); pods.len()];
    let mut ran: Vec<&str> = Vec::new();
    let messages = wait_for("the pods in ImagePullBackOff", BACK_OFF_SEEN, || {
        let mut messages = Vec::new();
        for (pod, seen) in pods.iter().zip(reasons.iter_mut()) {
            let current = node.api_pod(pod).ok().flatten();
            if current.as_ref().is_some_and(running) && !ran.contains(pod) {
                ran.push(pod);
            }
            let Some((reason, message)) = current.as_ref().and_then(waiting) else {
                continue;
            };
            if !seen.contains(&reason) {
                seen.push(reason.clone());
            }
            if reason == "ImagePullBackOff" {
                messages.push(message);
            }
        }
        (messages.len() == pods.len()).then_some(messages)
    })
    .with_context(|| {
        format!(
            "reasons seen: {reasons:?}; agent log:\n{}",
            ringlet_tests::tail(&node.agent().log(), 40)
        )
    })?;
    if !ran.is_empty() {
        bail!("pods {ran:?} ran the image although its pull failed");
    }
    Ok(reasons
        .into_iter()
        .zip(messages)
        .map(|(reasons, back_off_message)| Followed {
            reasons,
            back_off_message,
        })
        .collect())
}

/// (reason, message) of the events about `pod`.
fn events(node: &ClusterNode, pod: &str) -> Result<Vec<(String, String)>> {
    Ok(node
        .events_about(pod)?
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_owned(),
                e["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

fn has_event(events: &[(String, String)], reason: &str, check: impl Fn(&str) -> bool) -> bool {
    events.iter().any(|(r, m)| r == reason && check(m))
}

/// Checks that the pod ran after pulling the private image, with the kubelet's events.
fn check_pulled(node: &ClusterNode, pod: &str) -> Result<()> {
    node.wait_api_pod(pod, "running", START, running)?;
    let events = wait_for("the Pulled event", START, || {
        let events = events(node, pod).ok()?;
        has_event(&events, "Pulled", |_| true).then_some(events)
    })?;
    assert!(
        has_event(&events, "Pulling", |m| m
            == format!("Pulling image \"{PRIVATE_IMAGE}\"")),
        "{events:#?}"
    );
    let prefix = format!("Successfully pulled image \"{PRIVATE_IMAGE}\" in ");
    assert!(
        has_event(&events, "Pulled", |m| m.starts_with(&prefix)
            && m.contains(" including waiting). Image size: ")
            && m.ends_with(" bytes.")),
        "{events:#?}"
    );
    Ok(())
}

#[test]
fn a_private_image_is_pulled_with_the_pods_pull_secret() -> Result<()> {
    let test = "a_private_image_is_pulled_with_the_pods_pull_secret";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    remove_private_image()?;
    create_pull_secret(&node, SECRET, REGISTRY_PASSWORD)?;
    node.apply(&private_pod("private", node.node(), "Always", &[SECRET]))?;
    check_pulled(&node, "private")
}

#[test]
fn a_private_image_without_valid_credentials_is_err_image_pull_then_back_off() -> Result<()> {
    let test = "a_private_image_without_valid_credentials_is_err_image_pull_then_back_off";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    remove_private_image()?;
    create_pull_secret(&node, "wrong-password", "not-the-password")?;
    // One pod names a secret that does not exist, the other one with a wrong password.
    node.apply(&private_pod(
        "missing-secret",
        node.node(),
        "IfNotPresent",
        &["no-such-secret"],
    ))?;
    node.apply(&private_pod(
        "wrong-secret",
        node.node(),
        "IfNotPresent",
        &["wrong-password"],
    ))?;
    let pods = ["missing-secret", "wrong-secret"];
    let followed = follow_until_back_off(&node, &pods)?;
    for (pod, seen) in pods.iter().zip(&followed) {
        assert!(
            seen.err_image_pull_then_back_off(),
            "{pod}: {:?}",
            seen.reasons
        );
        // The back-off still says why the pull failed: the registry refused the credentials.
        let prefix = format!("Back-off pulling image \"{PRIVATE_IMAGE}\": ErrImagePull: ");
        let message = &seen.back_off_message;
        assert!(
            message.starts_with(&prefix) && message.contains("401 Unauthorized"),
            "{pod}: {message}"
        );
        let events = events(&node, pod)?;
        assert!(
            has_event(&events, "Failed", |m| m.starts_with(&format!(
                "Failed to pull image \"{PRIVATE_IMAGE}\": "
            ))),
            "{pod}: {events:#?}"
        );
        assert!(
            has_event(&events, "Failed", |m| m == "Error: ErrImagePull"),
            "{pod}: {events:#?}"
        );
    }
    let events = events(&node, "missing-secret")?;
    assert!(
        has_event(&events, "FailedToRetrieveImagePullSecret", |m| m
            == "Unable to retrieve some image pull secrets (no-such-secret); attempting to \
                pull the image may not succeed."),
        "{events:#?}"
    );
    Ok(())
}

#[test]
fn an_always_pull_that_fails_does_not_fall_back_to_the_image_on_the_node() -> Result<()> {
    let test = "an_always_pull_that_fails_does_not_fall_back_to_the_image_on_the_node";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    tag_private_image()?;
    node.apply(&private_pod("always", node.node(), "Always", &[]))?;
    let followed = follow_until_back_off(&node, &["always"])?;
    assert!(
        followed[0].err_image_pull_then_back_off(),
        "{:?}",
        followed[0].reasons
    );
    let message = &followed[0].back_off_message;
    assert!(message.contains("401 Unauthorized"), "{message}");
    let listed = k8s_ctr(&["images", "ls", "--quiet"])?;
    let present: BTreeSet<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        present.contains(PRIVATE_IMAGE),
        "the image was on the node all along"
    );
    Ok(())
}

#[test]
fn the_nodes_docker_config_supplies_credentials_to_pods_without_secrets() -> Result<()> {
    let test = "the_nodes_docker_config_supplies_credentials_to_pods_without_secrets";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    remove_private_image()?;
    // The kubelet reads `config.json` from its root dir first.
    let auth = BASE64.encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
    let config =
        serde_json::json!({ "auths": { format!("https://{REGISTRY_HOST}"): { "auth": auth } } });
    let path = node.agent().root_dir().join("config.json");
    std::fs::write(&path, config.to_string())
        .with_context(|| format!("writing {}", path.display()))?;
    node.apply(&private_pod(
        "node-config",
        node.node(),
        "IfNotPresent",
        &[],
    ))?;
    check_pulled(&node, "node-config")
}

#[test]
fn with_one_pull_at_a_time_pods_pulling_at_once_all_start() -> Result<()> {
    let test = "with_one_pull_at_a_time_pods_pulling_at_once_all_start";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    let config = tempfile::NamedTempFile::new()?;
    std::fs::write(
        config.path(),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         serializeImagePulls: false\nmaxParallelImagePulls: 1\nregistryPullQPS: 0\n",
    )?;
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec!["--config".to_owned(), config.path().display().to_string()],
            ..ClusterNodeOptions::default()
        },
    )?;
    remove_private_image()?;
    create_pull_secret(&node, SECRET, REGISTRY_PASSWORD)?;
    // Both pull under `Always`: the second pull waits for the first one's slot.
    for pod in ["first", "second"] {
        node.apply(&private_pod(pod, node.node(), "Always", &[SECRET]))?;
    }
    check_pulled(&node, "first")?;
    check_pulled(&node, "second")
}

#[test]
fn a_pull_over_the_registry_rate_is_err_image_pull() -> Result<()> {
    let test = "a_pull_over_the_registry_rate_is_err_image_pull";
    let Some(cluster) = require(test) else {
        return Ok(());
    };
    // With a zero burst the kubelet's token bucket never holds a token: every pull is over the
    // rate, whenever it comes.
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec![
                "--registry-qps=1".to_owned(),
                "--registry-burst=0".to_owned(),
            ],
            ..ClusterNodeOptions::default()
        },
    )?;
    node.apply(&private_pod("over-rate", node.node(), "Always", &[]))?;
    // The back-off after it is any failed pull's (the tests above follow it).
    let pod = node.wait_api_pod("over-rate", "in ErrImagePull", START, |pod| {
        waiting(pod).is_some_and(|(reason, _)| reason == "ErrImagePull")
    })?;
    assert_eq!(
        waiting(&pod).map(|(_, message)| message).as_deref(),
        Some("pull QPS exceeded")
    );
    let events = wait_for("the Failed event", START, || {
        let events = events(&node, "over-rate").ok()?;
        has_event(&events, "Failed", |m| {
            m == format!("Failed to pull image \"{PRIVATE_IMAGE}\": pull QPS exceeded")
        })
        .then_some(events)
    })?;
    assert!(
        !has_event(&events, "Pulled", |_| true),
        "nothing was pulled: {events:#?}"
    );
    Ok(())
}
