//! The observe-mode manifests of `deploy/daemonset/` against the real API server of the shared
//! control plane (`cargo xtask cluster up`): `kubectl apply --dry-run=server` accepts every object
//! (schema, defaulting and admission run; nothing is stored), the `DaemonSet` the server would store
//! has what observe mode needs on a node, and its pod template, bound with `spec.nodeName` (no
//! scheduler or `DaemonSet` controller runs here) to a node the upstream kubelet registered, runs
//! there, turns healthy, and measures from the API server how long that kubelet takes to report a
//! container's exit.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use ringlet_tests::cluster::{Cluster, run, run_with_input};
use ringlet_tests::kubelet_host::{
    HostGuard, LabKubelet, POD_REMOVAL_TIMEOUT, Registration, containers_in_containerd,
    require_upstream_kubelet, unmount_below, wait_for_empty_containerd,
};
use ringlet_tests::{
    LAB_DIR, free_port, http_get, metric_value, node_lock, require_cluster, require_ringlet_image,
    tail, task, wait_for,
};
use serde_json::{Value, json};

const NAMESPACE: &str = "ringlet-system";
/// The node the upstream kubelet registers as.
const KUBELET_NODE: &str = "e2e-observe-kubelet";
/// Where the pod whose container exit observe mode measures runs.
const WORKLOAD_NAMESPACE: &str = "e2e-observe-workload";
/// The port `ringlet observe` serves `/metrics` and `/healthz` on.
const OBSERVE_PORT: u16 = 10290;

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset")
}

/// The one item of `list` of kind `kind`.
fn item<'a>(list: &'a Value, kind: &str) -> Result<&'a Value> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|item| item["kind"] == kind)
        .ok_or_else(|| anyhow!("the dry run returned no {kind}: {list:#}"))
}

/// The observe container mounts each host path it needs at the same path, read-only where it only
/// reads.
fn assert_host_mounts(pod: &Value, container: &Value) -> Result<()> {
    let host_paths: Vec<(&str, &str)> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    let mounts: Vec<(&str, &str, bool)> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["name"].as_str()?,
                m["mountPath"].as_str()?,
                m["readOnly"] == true,
            ))
        })
        .collect();
    for (host_path, read_only) in [
        ("/sys/fs/bpf", false),
        ("/sys/kernel/btf", true),
        ("/run/containerd/containerd.sock", false),
        ("/sys/fs/cgroup", true),
    ] {
        let (volume, _) = host_paths
            .iter()
            .find(|(_, path)| *path == host_path)
            .ok_or_else(|| anyhow!("no hostPath volume of {host_path}: {host_paths:?}"))?;
        assert!(
            mounts.contains(&(volume, host_path, read_only)),
            "{host_path} mounted at the same path{}: {mounts:?}",
            if read_only { ", read-only" } else { "" }
        );
    }
    Ok(())
}

#[test]
fn the_observe_daemonset_passes_a_server_side_dry_run() -> Result<()> {
    let Some(cluster) = require_cluster("the_observe_daemonset_passes_a_server_side_dry_run")
    else {
        return Ok(());
    };
    let dir = manifests();
    // Namespaced objects are dry-run against their namespace, so it must exist. It is created for
    // real and kept, as every namespace of these tests is: without kube-controller-manager's
    // namespace controller a deleted namespace stays Terminating for good.
    run(cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(dir.join("00-namespace.yaml")))?;
    let out = run(cluster
        .kubectl()
        .args(["apply", "--dry-run=server", "-o", "json", "-f"])
        .arg(&dir))?;
    let list: Value = serde_json::from_str(&out).context("parsing the dry run's objects")?;
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Service"
        ]
    );

    let role = item(&list, "ClusterRole")?;
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        "the observe pods read pods and nothing else"
    );

    let daemon_set = item(&list, "DaemonSet")?;
    let pod = &daemon_set["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["serviceAccountName"], "ringlet-observe");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let annotations = &daemon_set["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "10290");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    let container = &pod["containers"][0];
    assert_eq!(container["args"][0], "observe");
    assert!(
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|env| env["name"] == "NODE_NAME"
                && env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "NODE_NAME from spec.nodeName: {:#}",
        container["env"]
    );
    let liveness = &container["livenessProbe"]["httpGet"];
    assert_eq!(liveness["path"], "/healthz");
    assert_eq!(liveness["port"], "metrics");
    assert_eq!(container["ports"][0]["containerPort"], 10290);
    for resources in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][resources][resource].is_string(),
                "resources.{resources}.{resource} is set: {:#}",
                container["resources"]
            );
        }
    }
    let security = &container["securityContext"];
    assert_eq!(
        security["capabilities"],
        json!({"drop": ["ALL"], "add": ["BPF", "PERFMON", "SYS_RESOURCE"]})
    );
    assert_ne!(security["privileged"], true);

    assert_host_mounts(pod, container)?;

    // A dry run stores nothing.
    let stored = run(cluster.kubectl().args([
        "get",
        "daemonsets,serviceaccounts,services",
        "-o",
        "name",
        "-n",
        NAMESPACE,
    ]))?;
    assert!(
        !stored.contains("ringlet-observe"),
        "the dry run stored objects: {stored}"
    );
    Ok(())
}

/// The RBAC objects of `10-rbac.yaml`, created for real; deleted again on drop.
struct ObserveRbac<'a> {
    cluster: &'a Cluster,
}

impl<'a> ObserveRbac<'a> {
    fn create(cluster: &'a Cluster) -> Result<Self> {
        // The pod's service-account volume projects the namespace's root CA config maps.
        cluster.prepare_namespace(NAMESPACE)?;
        run(cluster
            .kubectl()
            .args(["apply", "-f"])
            .arg(manifests().join("10-rbac.yaml")))?;
        Ok(Self { cluster })
    }
}

impl Drop for ObserveRbac<'_> {
    fn drop(&mut self) {
        let _ = run(self
            .cluster
            .kubectl()
            .args(["delete", "--ignore-not-found", "-f"])
            .arg(manifests().join("10-rbac.yaml")));
    }
}

/// The `DaemonSet`'s pod template as a Pod bound to `node`, on the host network with the API server
/// named by address: the control plane listens on loopback only and no kube-proxy routes the
/// `kubernetes` Service's cluster IP here.
fn observe_pod(cluster: &Cluster, name: &str, node: &str) -> Result<Value> {
    let out = run(cluster
        .kubectl()
        .args(["create", "--dry-run=client", "-o", "json", "-f"])
        .arg(manifests().join("20-daemonset.yaml")))?;
    let daemon_set: Value = serde_json::from_str(&out).context("parsing the DaemonSet")?;
    let template = &daemon_set["spec"]["template"];
    let mut spec = template["spec"].clone();
    spec["nodeName"] = json!(node);
    spec["hostNetwork"] = json!(true);
    let env = spec["containers"][0]["env"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("the observe container of 20-daemonset.yaml has no env"))?;
    env.extend([
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": ringlet_tests::cluster::API_SERVER_PORT.to_string()}),
    ]);
    drop_capabilities_the_host_lacks(&mut spec["containers"][0]["securityContext"])?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
        },
        "spec": spec,
    }))
}

/// Removes from the container's added capabilities those outside this host's own bounding set:
/// runc cannot grant them (this VM's bounding set lacks `SYS_RESOURCE`, which a node normally has).
fn drop_capabilities_the_host_lacks(security_context: &mut Value) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let bounding = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .context("no CapBnd in /proc/self/status")?;
    let number = |name: &str| match name {
        "BPF" => Some(39),
        "PERFMON" => Some(38),
        "SYS_RESOURCE" => Some(24),
        _ => None,
    };
    if let Some(added) = security_context["capabilities"]["add"].as_array_mut() {
        added.retain(|cap| {
            let keep = cap
                .as_str()
                .and_then(number)
                .is_none_or(|bit| bounding & (1 << bit) != 0);
            if !keep {
                eprintln!("this host's bounding set lacks {cap}: the test pod does without it");
            }
            keep
        });
    }
    Ok(())
}

/// Deletes the observe pod on drop and waits (bounded) until its node has let it go.
struct ObservePod<'a> {
    cluster: &'a Cluster,
    name: String,
}

impl Drop for ObservePod<'_> {
    fn drop(&mut self) {
        let _ = run(self.cluster.kubectl().args([
            "delete",
            "pod",
            &self.name,
            "-n",
            NAMESPACE,
            "--ignore-not-found",
            "--timeout=60s",
        ]));
    }
}

/// The upstream kubelet registered as node `node` of the test's API server, on the lab's
/// containerd. Dropping it deletes the pods bound to it and waits (bounded) until containerd holds
/// none, stops it, deletes its node object and kubeconfig, unmounts what it mounted and puts the
/// host back (then the node lock goes).
struct KubeletNode<'a> {
    cluster: &'a Cluster,
    name: String,
    child: Child,
    config: LabKubelet,
    _dir: tempfile::TempDir,
    _host: HostGuard,
    _lock: node_lock::NodeLock,
}

impl<'a> KubeletNode<'a> {
    fn start(cluster: &'a Cluster, kubelet: &Path, name: &str) -> Result<Self> {
        let lock = node_lock::node_lock()?;
        wait_for_empty_containerd()?;
        let host = HostGuard::take()?;
        let dir = tempfile::Builder::new()
            .prefix("deploy-kubelet-")
            .tempdir_in(LAB_DIR)?;
        let config = LabKubelet {
            manifests: dir.path().join("manifests"),
            run_dir: dir.path().to_path_buf(),
            root_dir: dir.path().join("root"),
            read_only_port: free_port()?,
            port: free_port()?,
            healthz_port: free_port()?,
            registration: Some(Registration {
                kubeconfig: cluster.node_kubeconfig(name)?,
                client_ca_file: cluster.ca_file(),
            }),
            evented_pleg: false,
        };
        let child = config.spawn(kubelet, name)?;
        let node = Self {
            cluster,
            name: name.to_owned(),
            child,
            config,
            _dir: dir,
            _host: host,
            _lock: lock,
        };
        wait_for("the kubelet's node Ready", Duration::from_mins(2), || {
            let object = cluster.get_json(&["node", name]).ok()?;
            condition_true(&object, "Ready").then_some(())
        })
        .with_context(|| format!("kubelet log:\n{}", node.log_tail()))?;
        Ok(node)
    }

    fn log_tail(&self) -> String {
        tail(
            &fs::read_to_string(self.config.log_path()).unwrap_or_default(),
            40,
        )
    }
}

impl Drop for KubeletNode<'_> {
    fn drop(&mut self) {
        let selector = format!("spec.nodeName={}", self.name);
        let _ = run(self.cluster.kubectl().args([
            "delete",
            "pods",
            "--all-namespaces",
            "--field-selector",
            &selector,
            "--timeout=60s",
        ]));
        if let Err(err) = wait_for(
            "the kubelet to remove its pods' containers",
            POD_REMOVAL_TIMEOUT,
            || containers_in_containerd().ok()?.is_empty().then_some(()),
        ) {
            eprintln!("{err:#}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ =
            run(self
                .cluster
                .kubectl()
                .args(["delete", "node", &self.name, "--ignore-not-found"]));
        if let Some(registration) = &self.config.registration {
            let _ = fs::remove_file(&registration.kubeconfig);
        }
        if let Err(err) = unmount_below(&self.config.root_dir) {
            eprintln!(
                "unmounting below {}: {err:#}",
                self.config.root_dir.display()
            );
        }
    }
}

/// Whether `object`'s status has condition `kind` True.
fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// A busybox pod bound to `node` whose container sleeps (host network, restarted when it dies).
fn sleeper_pod(name: &str, namespace: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    })
}

/// One sample of observe mode's `/metrics`, 0 when it is not there yet.
fn observe_metric<T: std::str::FromStr + Default>(series: &str) -> Result<T> {
    let (status, body) = http_get(OBSERVE_PORT, "/metrics")?;
    ensure!(status == 200, "observe mode's /metrics answered {status}");
    Ok(metric_value(&body, series).unwrap_or_default())
}

#[test]
fn the_daemonset_pod_template_runs_observe_mode_next_to_the_upstream_kubelet() -> Result<()> {
    let test = "the_daemonset_pod_template_runs_observe_mode_next_to_the_upstream_kubelet";
    let Some(cluster) = require_cluster(test) else {
        return Ok(());
    };
    let Some(kubelet) = require_upstream_kubelet(test) else {
        return Ok(());
    };
    if !require_ringlet_image(test) {
        return Ok(());
    }
    let node = KubeletNode::start(&cluster, &kubelet, KUBELET_NODE)?;
    run(cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(manifests().join("00-namespace.yaml")))?;
    let _rbac = ObserveRbac::create(&cluster)?;
    let name = format!("ringlet-observe-{KUBELET_NODE}");
    let pod = observe_pod(&cluster, &name, KUBELET_NODE)?;
    let _pod = ObservePod {
        cluster: &cluster,
        name: name.clone(),
    };
    run_with_input(
        cluster.kubectl().args(["create", "-f", "-"]),
        &pod.to_string(),
    )?;
    wait_for(
        "the observe pod Running and Ready",
        Duration::from_mins(1),
        || {
            let pod = cluster.get_json(&["pod", &name, "-n", NAMESPACE]).ok()?;
            (pod["status"]["phase"] == "Running" && condition_true(&pod, "Ready")).then_some(())
        },
    )
    .with_context(|| format!("kubelet log:\n{}", node.log_tail()))?;
    let (status, body) = http_get(OBSERVE_PORT, "/healthz")?;
    assert_eq!((status, body.trim()), (200, "ok"));

    // Its source as deployed, the API server: a container of another pod on the node dies, and
    // observe mode measures until the pod's status there shows it.
    cluster.prepare_namespace(WORKLOAD_NAMESPACE)?;
    run_with_input(
        cluster.kubectl().args(["create", "-f", "-"]),
        &sleeper_pod("sleeper", WORKLOAD_NAMESPACE, KUBELET_NODE).to_string(),
    )?;
    let container = wait_for("the sleeper pod Running", Duration::from_mins(1), || {
        let pod = cluster
            .get_json(&["pod", "sleeper", "-n", WORKLOAD_NAMESPACE])
            .ok()?;
        let status = &pod["status"]["containerStatuses"][0];
        status["state"]["running"].is_object().then(|| {
            let id = status["containerID"].as_str().unwrap_or_default();
            id.split_once("://").map_or(id, |(_, id)| id).to_owned()
        })
    })
    .with_context(|| format!("kubelet log:\n{}", node.log_tail()))?;
    let lag_count = "ringlet_observed_kubelet_status_lag_seconds_count{source=\"apiserver\"}";
    let lag_sum = "ringlet_observed_kubelet_status_lag_seconds_sum{source=\"apiserver\"}";
    ensure!(
        observe_metric::<u64>(lag_count)? == 0,
        "observe mode measured an exit before any"
    );
    let (pid, _) = task(&container)?.context("the sleeper's container has no task")?;
    ensure!(
        ringlet_tests::daemon::signal(pid, libc::SIGKILL),
        "killing the sleeper's pid {pid}"
    );
    wait_for(
        "observe mode's measurement from the API server",
        Duration::from_mins(1),
        || (observe_metric::<u64>(lag_count).ok()? >= 1).then_some(()),
    )?;
    assert_eq!(
        observe_metric::<u64>(lag_count)?,
        1,
        "one exit, one measurement"
    );
    let lag: f64 = observe_metric(lag_sum)?;
    eprintln!("the upstream kubelet's status in the API server showed the exit after {lag:.3} s");
    assert!(
        lag > 0.0 && lag < 60.0,
        "the kubelet reported the exit {lag} s after the kernel saw it"
    );
    Ok(())
}
