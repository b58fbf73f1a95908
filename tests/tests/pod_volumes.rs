//! End-to-end: configMap, secret, projected (service account token, downward API), downwardAPI and
//! memory emptyDir volumes, `envFrom`, key references and service links, against the real control
//! plane (`cargo xtask cluster up`) and the lab's containerd; and what a standalone agent says about
//! pods that need an API server. Files are read inside the pods with `kubectl exec` (the node is
//! `localhost`, so the API server reaches it), mounts on the host from `/proc/self/mountinfo`. Run
//! as root, one test at a time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use ringlet_tests::cluster::{
    Cluster, output_with_input, require_lab_and_cluster, run, run_with_input,
};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{Agent, AgentOptions, container_status, phase, require_lab, wait_for};
use serde_json::{Value, json};

const START: Duration = Duration::from_mins(1);
/// Runs until SIGTERM, then exits 0.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// A node the API server can reach for `kubectl exec`, with `args`.
fn exec_node(test: &str, cluster: &Cluster, args: &[&str]) -> Result<ClusterNode> {
    ClusterNode::start(
        test,
        cluster,
        ClusterNodeOptions {
            node: Some("localhost".to_owned()),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..ClusterNodeOptions::default()
        },
    )
}

/// Creates or updates one object (JSON) in the node's namespace (the namespace outlives a test),
/// by server-side apply: no last-applied annotation, so objects can be large.
fn put(node: &ClusterNode, object: &Value) -> Result<()> {
    run_with_input(
        node.kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f", "-"]),
        &object.to_string(),
    )?;
    Ok(())
}

/// `sh -c script` in container `main` of `pod`; its stdout.
fn exec(node: &ClusterNode, pod: &str, script: &str) -> Result<String> {
    run(node
        .kubectl()
        .args(["exec", pod, "-c", "main", "--", "sh", "-c", script]))
}

fn running(pod: &Value) -> bool {
    phase(pod) == "Running" && container_status(pod, "main").is_some_and(|c| c["ready"] == true)
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A busybox pod bound to `node` that serves until stopped, with `extra` appended to its spec
/// (indented as `spec` fields) and `container` to its container.
fn pod_yaml(name: &str, node: &str, container: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
{container}{extra}"#
    )
}

/// (mount point, filesystem type, super options) of every mount of the host whose mount point
/// contains `needle`.
fn host_mounts(needle: &str) -> Result<Vec<(String, String, String)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fs_type = right.next()?;
            let options = right.nth(1).unwrap_or_default();
            mount_point.contains(needle).then(|| {
                (
                    mount_point.to_owned(),
                    fs_type.to_owned(),
                    options.to_owned(),
                )
            })
        })
        .collect())
}

/// Asks the API server (as the admin) whether `token` is valid for `audiences`; the review's status.
fn token_review(cluster: &Cluster, token: &str, audiences: &[&str]) -> Result<Value> {
    let mut spec = json!({ "token": token });
    if !audiences.is_empty() {
        spec["audiences"] = json!(audiences);
    }
    let review = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": spec,
    });
    let out = run_with_input(
        cluster.kubectl().args(["create", "-f", "-", "-o", "json"]),
        &review.to_string(),
    )?;
    let answer: Value = serde_json::from_str(&out)?;
    Ok(answer["status"].clone())
}

/// Waits for an event about `object` with `reason` whose message contains `text`; returns its
/// message.
fn wait_event(node: &ClusterNode, object: &str, reason: &str, text: &str) -> Result<String> {
    wait_for(
        &format!("a {reason} event about {object} saying {text:?}"),
        START,
        || {
            node.events_about(object)
                .ok()?
                .into_iter()
                .find(|e| {
                    e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(text))
                })
                .and_then(|e| e["message"].as_str().map(str::to_owned))
        },
    )
    .with_context(|| {
        format!(
            "agent log:\n{}",
            ringlet_tests::tail(&node.agent().log(), 40)
        )
    })
}

#[test]
#[allow(clippy::too_many_lines, reason = "one pod, every kind of volume")]
fn api_volumes_hold_their_objects_and_leave_with_the_pod() -> Result<()> {
    let test = "api_volumes_hold_their_objects_and_leave_with_the_pod";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster, &[])?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "data": {"a": "alpha", "b": "beta", "conf.yaml": "x: 1\n"},
        }),
    )?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
            "stringData": {"password": "s3cr3t", "user": "admin"},
        }),
    )?;
    let container = r"    resources: {limits: {memory: 64Mi}}
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: picked, mountPath: /etc/picked}
    - {name: sec, mountPath: /etc/sec}
    - {name: proj, mountPath: /etc/proj}
    - {name: info, mountPath: /etc/info}
    - {name: scratch, mountPath: /scratch}
";
    // Modes in decimal: 384 = 0600, 288 = 0440.
    let volumes = r#"  volumes:
  - name: cfg
    configMap: {name: settings}
  - name: picked
    configMap: {name: settings, items: [{key: a, path: sub/first, mode: 384}]}
  - name: sec
    secret: {secretName: creds, defaultMode: 288}
  - name: proj
    projected:
      sources:
      - serviceAccountToken: {audience: ringlet-e2e, expirationSeconds: 600, path: token}
      - downwardAPI:
          items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: name, fieldRef: {fieldPath: metadata.name}}
          - {path: mem, resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1Mi}}
      - configMap: {name: settings, items: [{key: b, path: cfg/b}]}
      - secret: {name: creds, items: [{key: user, path: user}]}
  - name: info
    downwardAPI: {items: [{path: note, fieldRef: {fieldPath: "metadata.annotations['note']"}}]}
  - name: scratch
    emptyDir: {medium: Memory, sizeLimit: 16Mi}
"#;
    let manifest = pod_yaml("reader", node.node(), container, volumes).replace(
        "  name: reader\n",
        "  name: reader\n  labels: {app: reader, tier: back-end}\n  annotations: {note: hi}\n",
    );
    node.apply(&manifest)?;
    let pod = node.wait_api_pod("reader", "Running", START, running)?;
    let uid = uid_of(&pod);

    let read = |path: &str| exec(&node, "reader", &format!("cat {path}"));
    let mode = |path: &str| exec(&node, "reader", &format!("stat -L -c %a {path}"));
    assert_eq!(read("/etc/cfg/a")?, "alpha");
    assert_eq!(read("/etc/cfg/conf.yaml")?, "x: 1\n");
    assert_eq!(
        mode("/etc/cfg/a")?.trim(),
        "644",
        "files are 0644 by default"
    );
    assert_eq!(exec(&node, "reader", "ls /etc/picked")?.trim(), "sub");
    assert_eq!(read("/etc/picked/sub/first")?, "alpha");
    assert_eq!(mode("/etc/picked/sub/first")?.trim(), "600");
    assert_eq!(read("/etc/sec/password")?, "s3cr3t");
    assert_eq!(mode("/etc/sec/password")?.trim(), "440");
    assert_eq!(
        read("/etc/proj/labels")?,
        "app=\"reader\"\ntier=\"back-end\""
    );
    assert_eq!(read("/etc/proj/name")?, "reader");
    assert_eq!(read("/etc/proj/mem")?, "64");
    assert_eq!(read("/etc/proj/cfg/b")?, "beta");
    assert_eq!(read("/etc/proj/user")?, "admin");
    assert_eq!(read("/etc/info/note")?, "hi");
    let link = exec(
        &node,
        "reader",
        "readlink /etc/cfg/a; readlink /etc/cfg/..data",
    )?;
    let mut link = link.lines();
    assert_eq!(link.next(), Some("..data/a"));
    assert!(
        link.next().is_some_and(|v| v.starts_with("..2")),
        "..data points at a timestamped directory"
    );
    let write = exec(&node, "reader", "touch /etc/cfg/x 2>/dev/null; echo $?")?;
    assert_ne!(write.trim(), "0", "configMap volumes are read-only");

    // Secrets, tokens and the memory emptyDir are on tmpfs of their own, in the pod and on the host;
    // nothing else of the pod is a mount.
    let in_pod = exec(&node, "reader", "cat /proc/mounts")?;
    let fs_type = |mount_point: &str| {
        in_pod
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(mount_point))
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
    };
    for tmpfs in ["/etc/sec", "/etc/proj", "/scratch"] {
        let entry = fs_type(tmpfs).unwrap_or_default();
        assert!(entry.contains(" tmpfs "), "{tmpfs}: {entry:?}");
    }
    let scratch = fs_type("/scratch").unwrap_or_default();
    assert!(scratch.contains("size=16384k"), "{scratch}");
    let mounts = host_mounts(&uid)?;
    let mut on_host: BTreeMap<String, String> = mounts
        .iter()
        .filter_map(|(point, fs, _)| {
            Some((point.rsplit_once("/volumes/")?.1.to_owned(), fs.clone()))
        })
        .collect();
    let api_access: Vec<String> = on_host
        .keys()
        .filter(|v| v.starts_with("kubernetes.io~projected/kube-api-access-"))
        .cloned()
        .collect();
    assert_eq!(
        api_access.len(),
        1,
        "the API server's token volume: {mounts:?}"
    );
    assert_eq!(on_host.remove(&api_access[0]).as_deref(), Some("tmpfs"));
    assert_eq!(
        on_host,
        BTreeMap::from([
            (
                "kubernetes.io~empty-dir/scratch".to_owned(),
                "tmpfs".to_owned()
            ),
            (
                "kubernetes.io~projected/proj".to_owned(),
                "tmpfs".to_owned()
            ),
            ("kubernetes.io~secret/sec".to_owned(), "tmpfs".to_owned()),
        ]),
        "{mounts:?}"
    );
    let sized = |suffix: &str| {
        mounts
            .iter()
            .find(|(point, _, _)| point.ends_with(suffix))
            .map(|(_, _, options)| options.clone())
            .unwrap_or_default()
    };
    assert!(sized("/scratch").contains("size=16384k"), "{mounts:?}");
    assert!(
        sized("/sec").contains("size=65536k"),
        "a secret volume is as large as the pod's memory limit: {mounts:?}"
    );

    // The token is the pod's service account's, for the audience asked, bound to the pod.
    let token = read("/etc/proj/token")?;
    assert_eq!(mode("/etc/proj/token")?.trim(), "644");
    let review = token_review(&cluster, &token, &["ringlet-e2e"])?;
    assert_eq!(review["authenticated"], true, "{review}");
    assert_eq!(
        review["user"]["username"],
        format!("system:serviceaccount:{}:default", node.namespace)
    );
    assert_eq!(
        review["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["reader"])
    );
    assert_eq!(
        review["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([uid])
    );
    assert_eq!(review["audiences"], json!(["ringlet-e2e"]));
    let wrong_audience = token_review(&cluster, &token, &["someone-else"])?;
    assert_ne!(wrong_audience["authenticated"], true, "{wrong_audience}");

    // Deleting the pod unmounts and removes its volumes.
    run(node
        .kubectl()
        .args(["delete", "pod", "reader", "--wait=false"]))?;
    let volumes_dir = node
        .agent()
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes");
    wait_for(
        "the pod's volumes to be unmounted and removed",
        START,
        || (host_mounts(&uid).ok()?.is_empty() && !volumes_dir.exists()).then_some(()),
    )
    .with_context(|| {
        format!(
            "agent log:\n{}",
            ringlet_tests::tail(&node.agent().log(), 40)
        )
    })?;
    Ok(())
}

/// A ConfigMap of two keys that always hold the same value, `v<n>:` and 64 KiB more.
fn pair(version: u32) -> Value {
    let value = format!("v{version}:{}", "x".repeat(64 * 1024));
    json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pair"},
        "data": {"a": value, "b": value},
    })
}

/// In the pod: enter `..data` (one version, however it is swapped meanwhile), compare the two
/// keys, count matches and mismatches, and note each version seen. The writer removes the old
/// version's directory right after a swap, so a reader still in it finds its files gone: the
/// version is read before the comparison, which then fails (exit 2) instead of being counted.
const PAIR_READER: &str = r#"n=0; bad=0; last=""
while true; do
  if cd /cfg/..data 2>/dev/null; then
    v=$(head -c 3 a 2>/dev/null)
    cmp -s a b; r=$?
    if [ $r = 0 ]; then
      n=$((n+1))
      if [ "$v" != "$last" ]; then echo "$v" >> /out/seen; last=$v; fi
    elif [ $r = 1 ]; then
      bad=$((bad+1)); echo "mismatch $(head -c 3 a) $(head -c 3 b)" >> /out/bad
    fi
    cd /
  fi
  echo "$n $bad" > /out/count.tmp; mv /out/count.tmp /out/count
done"#;

#[test]
fn an_updated_config_map_reaches_the_files_atomically_within_the_sync_period() -> Result<()> {
    let test = "an_updated_config_map_reaches_the_files_atomically";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let sync = Duration::from_secs(5);
    let node = exec_node(test, &cluster, &["--sync-frequency=5s"])?;
    put(&node, &pair(1))?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: pair-reader
spec:
  nodeName: {}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {PAIR_READER:?}]
    volumeMounts:
    - {{name: pair, mountPath: /cfg}}
    - {{name: out, mountPath: /out}}
  volumes:
  - name: pair
    configMap: {{name: pair}}
  - name: out
    emptyDir: {{}}
"#,
        node.node()
    );
    node.apply(&manifest)?;
    node.wait_api_pod("pair-reader", "Running", START, running)?;
    let count = || -> Option<(u64, u64)> {
        let out = exec(&node, "pair-reader", "cat /out/count").ok()?;
        let mut fields = out.split_whitespace().map(|f| f.parse().ok());
        Some((fields.next()??, fields.next()??))
    };
    wait_for("the reader to compare the keys", START, || {
        count().filter(|(n, _)| *n > 0)
    })?;
    for version in 2..=6 {
        put(&node, &pair(version))?;
        let updated = Instant::now();
        let seen = format!("v{version}:");
        // Within the sync period, plus the time to notice from outside.
        wait_for(
            &format!("the pod to see {seen}"),
            sync + Duration::from_secs(10),
            || {
                let seen_list = exec(&node, "pair-reader", "cat /out/seen").ok()?;
                seen_list.lines().any(|l| l == seen).then_some(())
            },
        )
        .with_context(|| {
            format!(
                "agent log:\n{}",
                ringlet_tests::tail(&node.agent().log(), 30)
            )
        })?;
        eprintln!("{seen} reached the pod after {:?}", updated.elapsed());
    }
    let (checks, mismatches) = count().context("reading the reader's count")?;
    let bad = exec(&node, "pair-reader", "cat /out/bad 2>/dev/null; true")?;
    assert_eq!(mismatches, 0, "the reader saw a half-updated set: {bad}");
    assert!(checks > 50, "the reader compared only {checks} times");
    let seen = exec(&node, "pair-reader", "cat /out/seen")?;
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        ["v1:", "v2:", "v3:", "v4:", "v5:", "v6:"],
        "every version, in order"
    );
    Ok(())
}

/// `KEY=value` lines of `env` in the pod.
fn env_of(node: &ClusterNode, pod: &str) -> Result<BTreeMap<String, String>> {
    let out = exec(node, pod, "env")?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

#[test]
#[allow(clippy::too_many_lines, reason = "every source of the environment")]
fn a_pod_gets_its_default_token_env_from_key_refs_and_service_links() -> Result<()> {
    let test = "a_pod_gets_its_default_token_env_from_key_refs_and_service_links";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = exec_node(test, &cluster, &[])?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config"},
            "data": {"LEVEL": "debug", "MODE": "fast"},
        }),
    )?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-secret"},
            "stringData": {"PASSWORD": "s3cr3t", "TOKEN": "t0k"},
        }),
    )?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "back-end"},
            "spec": {"ports": [
                {"name": "http", "port": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ]},
        }),
    )?;
    let service = cluster.get_json(&["service", "back-end", "-n", &node.namespace])?;
    let ip = service["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    ensure!(!ip.is_empty(), "the Service has no cluster IP: {service}");
    let kubernetes = cluster.get_json(&["service", "kubernetes", "-n", "default"])?;
    let kubernetes_ip = kubernetes["spec"]["clusterIP"].as_str().unwrap_or_default();

    let container = r#"    envFrom:
    - configMapRef: {name: app-config}
      prefix: CFG_
    - secretRef: {name: app-secret}
    - configMapRef: {name: absent, optional: true}
    env:
    - name: LEVEL_FROM_KEY
      valueFrom: {configMapKeyRef: {name: app-config, key: LEVEL}}
    - name: PASS
      valueFrom: {secretKeyRef: {name: app-secret, key: PASSWORD}}
    - name: OPTIONAL
      valueFrom: {configMapKeyRef: {name: absent, key: k, optional: true}}
    - name: URL
      value: "http://$(BACK_END_SERVICE_HOST):$(BACK_END_SERVICE_PORT)/$(CFG_MODE)"
    - name: CFG_MODE
      value: overridden
"#;
    // No automountServiceAccountToken: the API server adds kube-api-access-* to the pod.
    node.apply(&pod_yaml("env-reader", node.node(), container, ""))?;
    let no_links = pod_yaml("unlinked", node.node(), "", "  enableServiceLinks: false\n");
    node.apply(&no_links)?;
    let pod = node.wait_api_pod("env-reader", "Running", START, running)?;
    let projected: Vec<&Value> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("kube-api-access-"))
        })
        .collect();
    ensure!(
        projected.len() == 1,
        "the API server added no kube-api-access volume: {pod}"
    );

    let env = env_of(&node, "env-reader")?;
    let expect = |key: &str, value: &str| {
        assert_eq!(
            env.get(key).map(String::as_str),
            Some(value),
            "{key} in {env:?}"
        );
    };
    expect("CFG_LEVEL", "debug");
    expect("CFG_MODE", "overridden");
    expect("PASSWORD", "s3cr3t");
    expect("TOKEN", "t0k");
    expect("LEVEL_FROM_KEY", "debug");
    expect("PASS", "s3cr3t");
    assert!(
        !env.contains_key("OPTIONAL"),
        "a missing optional key is left out"
    );
    expect("BACK_END_SERVICE_HOST", &ip);
    expect("BACK_END_SERVICE_PORT", "8080");
    expect("BACK_END_SERVICE_PORT_HTTP", "8080");
    expect("BACK_END_SERVICE_PORT_DNS", "53");
    expect("BACK_END_PORT", &format!("tcp://{ip}:8080"));
    expect("BACK_END_PORT_8080_TCP", &format!("tcp://{ip}:8080"));
    expect("BACK_END_PORT_53_UDP_PROTO", "udp");
    expect("BACK_END_PORT_53_UDP_ADDR", &ip);
    expect("URL", &format!("http://{ip}:8080/fast"));
    expect("KUBERNETES_SERVICE_HOST", kubernetes_ip);
    expect("KUBERNETES_SERVICE_PORT", "443");

    node.wait_api_pod("unlinked", "Running", START, running)?;
    let unlinked = env_of(&node, "unlinked")?;
    assert!(
        !unlinked.contains_key("BACK_END_SERVICE_HOST"),
        "{unlinked:?}"
    );
    assert_eq!(
        unlinked.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
        Some(kubernetes_ip),
        "the kubernetes Service is always linked"
    );

    // The default service account volume: namespace, CA bundles and a token the API server takes.
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let read = |file: &str| exec(&node, "env-reader", &format!("cat {dir}/{file}"));
    assert_eq!(read("namespace")?, node.namespace);
    let ca = std::fs::read_to_string(cluster.ca_file())?;
    assert_eq!(read("ca.crt")?, ca);
    assert_eq!(read("service-ca.crt")?, ca);
    let review = token_review(&cluster, &read("token")?, &[])?;
    assert_eq!(review["authenticated"], true, "{review}");
    assert_eq!(
        review["user"]["username"],
        format!("system:serviceaccount:{}:default", node.namespace)
    );
    Ok(())
}

#[test]
#[allow(clippy::too_many_lines, reason = "every kind of bad input")]
fn bad_references_and_paths_give_the_kubelets_reasons() -> Result<()> {
    let test = "bad_references_and_paths_give_the_kubelets_reasons";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    // No safety relist during the test: a pod that never reached the runtime is retried, and
    // cleaned up once deleted, on the read of it the pod worker asks for.
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec!["--pleg-relist-period".to_owned(), "1h".to_owned()],
            ..ClusterNodeOptions::default()
        },
    )?;
    let ns = node.namespace.clone();
    // The namespace outlives a test run: the configMap must not exist yet.
    run(node
        .kubectl()
        .args(["delete", "configmap", "later", "--ignore-not-found"]))?;
    put(
        &node,
        &json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
            "stringData": {"user": "admin"},
        }),
    )?;

    // A missing configMap: FailedMount, nothing starts; once it exists, the pod runs.
    let missing = pod_yaml(
        "no-config",
        node.node(),
        "    volumeMounts: [{name: cfg, mountPath: /cfg}]\n",
        "  volumes:\n  - name: cfg\n    configMap: {name: later}\n",
    );
    node.apply(&missing)?;
    let message = wait_event(&node, "no-config", "FailedMount", "not found")?;
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"later\" not found"
    );
    let pod = node.api_pod("no-config")?.context("no-config is gone")?;
    assert_eq!(phase(&pod), "Pending");
    let waiting =
        &container_status(&pod, "main").context("no container status")?["state"]["waiting"];
    assert_eq!(waiting["reason"], "ContainerCreating", "{pod}");
    assert!(
        ringlet_tests::containers_of_namespace(&ns)?.is_empty(),
        "no sandbox or container before the volume is ready"
    );
    put(
        &node,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later"}, "data": {"k": "v"}}),
    )?;
    node.wait_api_pod(
        "no-config",
        "Running once the configMap exists",
        START,
        running,
    )?;

    // A secret key that does not exist, in the environment and in a volume.
    let env_key = pod_yaml(
        "no-env-key",
        node.node(),
        "    env:\n    - name: P\n      valueFrom: {secretKeyRef: {name: creds, key: nokey}}\n",
        "",
    );
    node.apply(&env_key)?;
    let pod = node.wait_api_pod("no-env-key", "CreateContainerConfigError", START, |p| {
        container_status(p, "main")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
    })?;
    let waiting =
        &container_status(&pod, "main").context("no container status")?["state"]["waiting"];
    assert_eq!(
        waiting["message"],
        format!("couldn't find key nokey in Secret {ns}/creds")
    );
    wait_event(
        &node,
        "no-env-key",
        "Failed",
        &format!("Error: couldn't find key nokey in Secret {ns}/creds"),
    )?;
    let volume_key = pod_yaml(
        "no-volume-key",
        node.node(),
        "    volumeMounts: [{name: s, mountPath: /s}]\n",
        "  volumes:\n  - name: s\n    secret: {secretName: creds, items: [{key: nokey, path: x}]}\n",
    );
    node.apply(&volume_key)?;
    let message = wait_event(&node, "no-volume-key", "FailedMount", "nokey")?;
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"s\" : references non-existent secret key: nokey"
    );
    // Deleted while it waits to retry: its directory goes, the service account token's tmpfs
    // with it.
    let waiting = node
        .api_pod("no-volume-key")?
        .context("no-volume-key is gone")?;
    let pod_dir = node.agent().root_dir().join("pods").join(uid_of(&waiting));
    ensure!(pod_dir.exists(), "no directory for no-volume-key");
    run(node
        .kubectl()
        .args(["delete", "pod", "no-volume-key", "--wait=false"]))?;
    wait_for("no-volume-key's directory to be removed", START, || {
        (!pod_dir.exists()).then_some(())
    })?;
    ensure!(
        node.api_pod("no-volume-key")?.is_none(),
        "no-volume-key's deletion did not complete"
    );

    // The API server refuses a path leaving the volume and two volumes of one name.
    let escape = pod_yaml(
        "escape",
        node.node(),
        "",
        "  volumes:\n  - name: s\n    secret: {secretName: creds, items: [{key: user, path: ../etc}]}\n",
    );
    let refused = output_with_input(node.kubectl().args(["apply", "-f", "-"]), &escape)?;
    ensure!(!refused.status.success(), "the API server took ../etc");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("must not contain '..'"), "{stderr}");
    let twice = pod_yaml(
        "twice",
        node.node(),
        "",
        "  volumes:\n  - {name: data, emptyDir: {}}\n  - {name: data, emptyDir: {}}\n",
    );
    let refused = output_with_input(node.kubectl().args(["apply", "-f", "-"]), &twice)?;
    ensure!(
        !refused.status.success(),
        "the API server took two volumes named data"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("Duplicate value"), "{stderr}");

    // What the API server does not validate reaches the agent as a static pod: the same checks
    // hold there, and nothing is written outside the volume.
    let agent = node.agent();
    agent.write_manifest(
        "escape.yaml",
        &static_pod(
            "escape",
            &ns,
            "  volumes:\n  - name: info\n    downwardAPI: {items: [{path: ../etc/escaped, fieldRef: {fieldPath: metadata.name}}]}\n",
        ),
    )?;
    agent.write_manifest(
        "twice.yaml",
        &static_pod(
            "twice",
            &ns,
            "  volumes:\n  - {name: data, emptyDir: {}}\n  - {name: data, emptyDir: {}}\n",
        ),
    )?;
    let escape_name = format!("escape-{}", node.node());
    let event = wait_logged_event(
        agent,
        "FailedMount",
        "MountVolume.SetUp failed for volume \"info\" : invalid path: must not contain '..': ../etc/escaped",
    )?;
    assert!(
        event["object"]
            .as_str()
            .is_some_and(|o| o.contains(&escape_name)),
        "{event}"
    );
    wait_logged_event(agent, "FailedValidation", "name \"data\" is used twice")?;
    let escape_pod = agent
        .pod_named(&escape_name)
        .context("the static pod escape is not on /pods")?;
    ensure!(phase(&escape_pod) == "Pending", "{escape_pod}");
    let pod_dir = agent.root_dir().join("pods").join(uid_of(&escape_pod));
    let plugin = pod_dir.join("volumes/kubernetes.io~downward-api");
    assert_eq!(
        std::fs::read_dir(plugin.join("info"))?.count(),
        0,
        "nothing in the volume"
    );
    for outside in [
        plugin.join("etc"),
        pod_dir.join("volumes/etc"),
        pod_dir.join("etc"),
    ] {
        assert!(!outside.exists(), "{} was written", outside.display());
    }
    assert!(
        agent.pod_named(&format!("twice-{}", node.node())).is_none(),
        "a static pod with two volumes of one name is refused"
    );
    Ok(())
}

/// A static pod manifest in namespace `ns` with `volumes` (spec fields).
fn static_pod(name: &str, ns: &str, volumes: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SERVE:?}]
{volumes}"#
    )
}

/// Waits until the agent's `events.log` (one JSON event a line) has an event with `reason` whose
/// message contains `text`; returns it.
fn wait_logged_event(agent: &Agent, reason: &str, text: &str) -> Result<Value> {
    let path: PathBuf = agent.root_dir().join("events.log");
    wait_for(
        &format!("a {reason} event saying {text:?} in events.log"),
        START,
        || {
            let log = std::fs::read_to_string(&path).ok()?;
            log.lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|e| {
                    e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(text))
                })
        },
    )
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 40)))
}

#[test]
fn without_an_api_server_api_backed_pods_fail_with_a_clear_reason() -> Result<()> {
    let test = "without_an_api_server_api_backed_pods_fail_with_a_clear_reason";
    if !require_lab(test) {
        return Ok(());
    }
    let agent = Agent::start("standalone-api-refs", AgentOptions::default())?;
    let container = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {SERVE:?}]\n{extra}"
        )
    };
    let manifests = [
        (
            "config-volume",
            "    volumeMounts: [{name: cfg, mountPath: /cfg}]\n  volumes:\n  - name: cfg\n    configMap: {name: settings}\n",
        ),
        (
            "token-volume",
            "    volumeMounts: [{name: t, mountPath: /t}]\n  volumes:\n  - name: t\n    projected: {sources: [{serviceAccountToken: {path: token}}]}\n",
        ),
        (
            "secret-env",
            "    env:\n    - name: P\n      valueFrom: {secretKeyRef: {name: creds, key: password}}\n",
        ),
        ("plain", ""),
    ];
    for (name, extra) in manifests {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &container(extra).replace("NAME", name),
        )?;
    }
    agent.wait_pod("plain", "running", START, |p| {
        container_status(p, "main").is_some_and(|c| c["state"]["running"].is_object())
    })?;
    let pod = agent.wait_pod("secret-env", "CreateContainerConfigError", START, |p| {
        container_status(p, "main")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
    })?;
    assert_eq!(
        container_status(&pod, "main").map(|c| c["state"]["waiting"]["message"].clone()),
        Some(json!(
            "couldn't get secret default/creds, no kubeClient defined"
        ))
    );
    wait_logged_event(
        &agent,
        "FailedMount",
        "MountVolume.SetUp failed for volume \"cfg\" : couldn't get configMap default/settings: no API server (the agent runs standalone)",
    )?;
    wait_logged_event(
        &agent,
        "FailedMount",
        "MountVolume.SetUp failed for volume \"t\" : cannot setup projected volume t because kube client is not configured",
    )?;
    for name in ["config-volume", "token-volume"] {
        let pod = agent.pod(name).context("the pod is not on /pods")?;
        assert_eq!(phase(&pod), "Pending", "{pod}");
        let reason =
            &container_status(&pod, "main").context("no status")?["state"]["waiting"]["reason"];
        assert_eq!(reason, "ContainerCreating", "{pod}");
    }
    let (code, _) = ringlet_tests::http_get(agent.healthz_port, "/healthz")?;
    assert_eq!(code, 200, "the agent is healthy");
    Ok(())
}
