//! End-to-end: what the kubelet's volume code guarantees about ownership and the host, against the
//! real control plane (`cargo xtask cluster up`) and the lab's containerd. A pod's `fsGroup` owns
//! its volumes and is one of its containers' groups, so a non-root container can write an emptyDir
//! and read a configMap of mode 0400; a `subPath` through a link a container planted is refused
//! before anything is created through it; a pod's teardown never empties a mount left below its
//! directory, nor the host directory a subPath pointed at. Files are checked inside the pods with
//! `kubectl exec` (the node is `localhost`) and on the host. Run as root, one test at a time.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ringlet_tests::cluster::{Cluster, require_lab_and_cluster, run, run_with_input};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{container_status, phase, wait_for};
use serde_json::{Value, json};

const START: Duration = Duration::from_mins(1);
/// Runs until SIGTERM, then exits 0.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// A node the API server can reach for `kubectl exec`, syncing its pods every 5 s.
fn exec_node(test: &str, cluster: &Cluster) -> Result<ClusterNode> {
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

/// `sh -c script` in `container` of `pod`; its stdout, trimmed.
fn exec(node: &ClusterNode, pod: &str, container: &str, script: &str) -> Result<String> {
    let out = run(node
        .kubectl()
        .args(["exec", pod, "-c", container, "--", "sh", "-c", script]))?;
    Ok(out.trim().to_owned())
}

fn ready(pod: &Value, container: &str) -> bool {
    container_status(pod, container).is_some_and(|c| c["ready"] == true)
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Mount points of the host below `dir`.
fn mounts_below(dir: &Path) -> Result<Vec<String>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .map(str::to_owned)
        .collect())
}

fn agent_log(node: &ClusterNode) -> String {
    format!(
        "agent log:\n{}",
        ringlet_tests::tail(&node.agent().log(), 40)
    )
}

/// The e2e specs' "when `FSGroup` is specified" and "as non-root with defaultMode and fsGroup set",
/// on one pod running as user 1001 with `fsGroup` 2000.
#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one pod, every kind of volume it owns"
)]
fn an_fs_group_owns_the_volumes_of_a_non_root_pod() -> Result<()> {
    let test = "an_fs_group_owns_the_volumes_of_a_non_root_pod";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster)?;
    run_with_input(
        node.kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f", "-"]),
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "data": {"a": "alpha"},
        })
        .to_string(),
    )?;
    // Modes in decimal: 256 = 0400.
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: owned
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  securityContext: {{fsGroup: 2000, runAsUser: 1001}}
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    - {{name: mem, mountPath: /mem}}
    - {{name: mem, mountPath: /test-volume, subPath: test-sub}}
    - {{name: cfg, mountPath: /cfg}}
    - {{name: private, mountPath: /private}}
  volumes:
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: mem, emptyDir: {{medium: Memory}}}}
  - {{name: cfg, configMap: {{name: settings}}}}
  - {{name: private, configMap: {{name: settings, defaultMode: 256}}}}
"#,
        node = node.node()
    );
    node.apply(&manifest)?;
    node.wait_api_pod("owned", "Running", START, |p| {
        phase(p) == "Running" && ready(p, "main")
    })?;
    let sh = |script: &str| exec(&node, "owned", "main", script);

    assert_eq!(sh("id -u")?, "1001");
    let groups = sh("id -G")?;
    assert!(
        groups.split_whitespace().any(|g| g == "2000"),
        "fsGroup is one of the container's groups: {groups}"
    );
    // emptyDir: group-owned, setgid, so what a non-root container writes belongs to the group.
    assert_eq!(sh("stat -c '%a %g' /scratch")?, "2777 2000");
    assert_eq!(
        sh("echo hi > /scratch/new && stat -c '%u %g' /scratch/new")?,
        "1001 2000"
    );
    assert_eq!(
        sh("mkdir /scratch/d && stat -c '%A %g' /scratch/d")?,
        "drwxr-sr-x 2000"
    );
    // On tmpfs, whose root is sticky.
    assert_eq!(sh("stat -c '%a %g' /mem")?, "3777 2000");
    assert_eq!(
        sh("stat -c '%A %u %g' /test-volume")?,
        "drwxrwsrwt 0 2000",
        "a missing subPath is made with the volume's mode (`dgtrwxrwxrwx`) and group"
    );
    // configMap: group read on top of the mode, so 0400 becomes 0440 and the group can read it.
    assert_eq!(sh("stat -L -c '%a %g' /cfg/a")?, "644 2000");
    assert_eq!(sh("stat -L -c '%A %g' /private/a")?, "-r--r----- 2000");
    assert_eq!(sh("cat /private/a")?, "alpha", "readable through the group");
    assert_eq!(sh("stat -L -c '%a %g' /cfg/..data")?, "2755 2000");
    // The service account token the API server added: 0600, then the group's read.
    assert_eq!(
        sh("stat -L -c '%a %g' /var/run/secrets/kubernetes.io/serviceaccount/token")?,
        "640 2000"
    );
    assert_ne!(
        sh("wc -c < /var/run/secrets/kubernetes.io/serviceaccount/token")?,
        "0",
        "the token is readable through the group"
    );

    // A later sync (another configMap version) leaves the emptyDir's modes to the pod.
    sh("chmod 700 /scratch/new")?;
    run_with_input(
        node.kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f", "-"]),
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "data": {"a": "beta"},
        })
        .to_string(),
    )?;
    wait_for("the new configMap version in the pod", START, || {
        (sh("cat /private/a").ok()? == "beta").then_some(())
    })
    .with_context(|| agent_log(&node))?;
    assert_eq!(sh("stat -L -c '%A %g' /private/a")?, "-r--r----- 2000");
    assert_eq!(sh("stat -c '%a' /scratch/new")?, "700");
    Ok(())
}

/// The CVE-2021-25741 class: an init container plants a link to a host directory in an emptyDir;
/// a container mounting a subPath through it is refused with a clear reason, and nothing is
/// created on the host. A subPath that stays in the volume is mounted (through a bind mount under
/// the pod's directory), and the bind goes with the pod.
#[test]
fn a_sub_path_through_a_planted_link_is_refused_and_creates_nothing_outside() -> Result<()> {
    let test = "a_sub_path_through_a_planted_link_is_refused";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster)?;
    let outside = tempfile::tempdir()?;
    fs::write(outside.path().join("host-file"), "host")?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: planted
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: plant
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "ln -s {outside} /data/escape && mkdir -p /data/inner && echo mine > /data/inner/file"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    volumeMounts: [{{name: data, mountPath: /x, subPath: escape/new}}]
  - name: fine
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    volumeMounts: [{{name: data, mountPath: /y, subPath: inner}}]
  volumes:
  - {{name: data, emptyDir: {{}}}}
"#,
        node = node.node(),
        outside = outside.path().display(),
    );
    node.apply(&manifest)?;
    let message = "container \"main\" mounts volume \"data\" with subPath \"escape/new\": resolves outside the volume";
    let pod = node.wait_api_pod("planted", "main refused", START, |p| {
        container_status(p, "main")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
            && ready(p, "fine")
    })?;
    let waiting = &container_status(&pod, "main").context("no status")?["state"]["waiting"];
    assert_eq!(waiting["message"], message, "{pod}");
    wait_for("the Failed event about main", START, || {
        node.events_about("planted")
            .ok()?
            .into_iter()
            .find(|e| e["reason"] == "Failed" && e["message"] == format!("Error: {message}"))
    })
    .with_context(|| agent_log(&node))?;
    let mut on_host: Vec<String> = fs::read_dir(outside.path())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    on_host.sort();
    assert_eq!(
        on_host,
        ["host-file"],
        "nothing was created through the link"
    );

    // The subPath inside the volume is a bind mount under the pod's directory.
    assert_eq!(exec(&node, "planted", "fine", "cat /y/file")?, "mine");
    let pod_dir = node.agent().root_dir().join("pods").join(uid_of(&pod));
    let binds = mounts_below(&pod_dir.join("volume-subpaths"))?;
    assert_eq!(
        binds,
        [pod_dir
            .join("volume-subpaths/data/fine/0")
            .display()
            .to_string()],
        "one bind, for the container that started"
    );

    run(node
        .kubectl()
        .args(["delete", "pod", "planted", "--wait=false"]))?;
    wait_for("the pod's directory and binds to go", START, || {
        (!pod_dir.exists() && mounts_below(&pod_dir).ok()?.is_empty()).then_some(())
    })
    .with_context(|| agent_log(&node))?;
    ensure!(
        outside.path().join("host-file").exists(),
        "the host directory was touched"
    );
    Ok(())
}

/// A tmpfs left mounted below a pod's emptyDir (as a container with bidirectional propagation can
/// leave one) and a hostPath mounted through a subPath: the pod's teardown unmounts its subPath
/// bind, stops at the tmpfs with an error naming it, and removes nothing in either; once the tmpfs
/// is unmounted, the retried teardown completes.
#[test]
fn a_teardown_never_empties_a_mount_below_the_pod() -> Result<()> {
    let test = "a_teardown_never_empties_a_mount_below_the_pod";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let host = tempfile::tempdir()?;
    fs::create_dir(host.path().join("keep"))?;
    fs::write(host.path().join("keep/precious"), "host data")?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: leaves-a-mount
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: host, mountPath: /keep, subPath: keep}}
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: host, hostPath: {{path: {host}, type: Directory}}}}
"#,
        node = node.node(),
        host = host.path().display(),
    );
    node.apply(&manifest)?;
    let pod = node.wait_api_pod("leaves-a-mount", "Running", START, |p| {
        phase(p) == "Running" && ready(p, "main")
    })?;
    let pod_dir = node.agent().root_dir().join("pods").join(uid_of(&pod));
    let below = pod_dir.join("volumes/kubernetes.io~empty-dir/data/mnt");
    fs::create_dir(&below)?;
    run(std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&below))?;
    // Unmounted however the test ends: the agent's root directory goes with the test.
    let guard = Unmount(below.clone());
    fs::write(below.join("precious"), "tmpfs data")?;

    run(node
        .kubectl()
        .args(["delete", "pod", "leaves-a-mount", "--wait=false"]))?;
    let refusal = format!(
        "cannot delete directory {}: it is a mount point",
        below.display()
    );
    wait_for("the teardown to stop at the tmpfs", START, || {
        node.agent().log().contains(&refusal).then_some(())
    })
    .with_context(|| agent_log(&node))?;
    assert_eq!(fs::read_to_string(below.join("precious"))?, "tmpfs data");
    assert_eq!(
        fs::read_to_string(host.path().join("keep/precious"))?,
        "host data"
    );
    assert_eq!(
        mounts_below(&pod_dir)?,
        [below.display().to_string()],
        "the subPath bind is unmounted, the tmpfs left alone"
    );

    drop(guard);
    wait_for("the retried teardown to remove the pod", START, || {
        (!pod_dir.exists()).then_some(())
    })
    .with_context(|| agent_log(&node))?;
    assert_eq!(
        fs::read_to_string(host.path().join("keep/precious"))?,
        "host data"
    );
    Ok(())
}

/// Unmounts a test's own mount on drop.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}
