//! End-to-end: probes and lifecycle hooks of pods the API server binds to a ringlet node, on the
//! lab's containerd. Each test controls its pod's servers from the host through the pod's
//! `emptyDir` (the agent lays it out under `<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir`),
//! so no test waits on a guess: readiness follows a file the test creates or removes, liveness a
//! file it deletes. `lifecycle.stopSignal` is tested on a static pod: this API server runs without
//! the `ContainerStopSignals` feature gate and drops the field. Run as root, one test at a time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use ringlet_tests::cluster::{require_lab_and_cluster, run};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::{Agent, AgentOptions, container_status, require_lab, wait_for};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);

/// A pod bound to `node` with `containers` (YAML list items at two spaces) and an `emptyDir`
/// named `ctl` (plus `volumes`, more list items), no service account token.
fn pod(name: &str, node: &str, grace: u32, containers: &str, volumes: &str) -> String {
    format!(
        r"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  restartPolicy: Always
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {grace}
  volumes:
  - name: ctl
    emptyDir: {{}}
{volumes}  containers:
{containers}"
    )
}

/// A busybox container running `command`, with `ctl` at `/ctl` and `extra` (YAML at four spaces).
fn container(name: &str, command: &str, extra: &str) -> String {
    format!(
        r#"  - name: {name}
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {command:?}]
    volumeMounts:
    - name: ctl
      mountPath: /ctl
{extra}"#
    )
}

/// Runs until SIGTERM, then exits 0.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_is(pod: &Value, kind: &str, status: &str) -> bool {
    condition(pod, kind).is_some_and(|c| c["status"] == status)
}

fn running(pod: &Value, name: &str) -> bool {
    container_status(pod, name).is_some_and(|c| c["state"]["running"].is_object())
}

fn ready(pod: &Value, name: &str) -> bool {
    container_status(pod, name).is_some_and(|c| c["ready"] == true)
}

fn restarts(pod: &Value, name: &str) -> u64 {
    container_status(pod, name)
        .and_then(|c| c["restartCount"].as_u64())
        .unwrap_or(0)
}

/// The host directory of the pod's `emptyDir` named `volume`.
fn empty_dir(node: &ClusterNode, pod: &Value, volume: &str) -> Result<PathBuf> {
    let uid = pod["metadata"]["uid"]
        .as_str()
        .context("the pod has no uid")?;
    let dir = node
        .agent()
        .root_dir()
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir")
        .join(volume);
    ensure!(dir.is_dir(), "{} is not there", dir.display());
    Ok(dir)
}

/// `(reason, message, count)` of the events about pod `name`.
fn events(node: &ClusterNode, name: &str) -> Result<Vec<(String, String, u64)>> {
    Ok(node
        .events_about(name)?
        .into_iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_owned(),
                e["message"].as_str().unwrap_or_default().to_owned(),
                e["count"].as_u64().unwrap_or(1),
            )
        })
        .collect())
}

/// Waits for an event about pod `name` with `reason` whose message satisfies `matches`.
fn wait_event(
    node: &ClusterNode,
    name: &str,
    reason: &str,
    matches: impl Fn(&str) -> bool,
) -> Result<(String, String, u64)> {
    wait_for(&format!("a {reason} event about {name}"), START, || {
        events(node, name)
            .ok()?
            .into_iter()
            .find(|(r, m, _)| r == reason && matches(m))
    })
    .with_context(|| format!("events: {:#?}", events(node, name).unwrap_or_default()))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// An RFC 3339 API time in Unix seconds.
fn api_seconds(time: &Value) -> Result<i64> {
    let text = time.as_str().context("not a time")?;
    let out = Command::new("date")
        .args(["-u", "-d", text, "+%s"])
        .output()
        .context("running date")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The agent's `/metrics/probes`.
fn probe_metrics(node: &ClusterNode) -> Result<String> {
    let (code, body) = ringlet_tests::http_get(node.agent().read_only_port, "/metrics/probes")?;
    ensure!(code == 200, "/metrics/probes answered {code}: {body}");
    Ok(body)
}

#[test]
fn a_readiness_http_probe_makes_the_pod_ready_only_while_its_server_answers() -> Result<()> {
    let test = "a_readiness_http_probe_makes_the_pod_ready_only_while_its_server_answers";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    // busybox httpd serves /ctl: /healthz answers 200 once the test creates the file, 404 before.
    let web = container(
        "web",
        "exec httpd -f -p 8080 -h /ctl",
        "    readinessProbe:
      httpGet:
        path: /healthz
        port: 8080
      periodSeconds: 1
      failureThreshold: 3
",
    );
    node.apply(&pod("web", node.node(), 5, &web, ""))?;
    let api = node.wait_api_pod("web", "running", START, |p| running(p, "web"))?;
    wait_event(&node, "web", "Unhealthy", |m| {
        m == "Readiness probe failed: HTTP probe failed with statuscode: 404"
    })?;
    let api = node.api_pod("web")?.unwrap_or(api);
    assert!(!ready(&api, "web"), "not ready while /healthz is missing");
    assert!(condition_is(&api, "Ready", "False"));
    assert!(condition_is(&api, "ContainersReady", "False"));

    let ctl = empty_dir(&node, &api, "ctl")?;
    std::fs::write(ctl.join("healthz"), "ok\n")?;
    let ready_pod = node.wait_api_pod("web", "Ready", START, |p| {
        ready(p, "web") && condition_is(p, "Ready", "True")
    })?;
    assert!(condition_is(&ready_pod, "ContainersReady", "True"));
    assert_eq!(
        container_status(&ready_pod, "web").map(|c| c["started"].clone()),
        Some(Value::Bool(true))
    );

    // The endpoint fails: NotReady within periodSeconds × failureThreshold (+ 1 s), as dated by
    // the condition's transition on the API server.
    let failed_at = unix_now();
    std::fs::remove_file(ctl.join("healthz"))?;
    let not_ready = node.wait_api_pod("web", "NotReady again", START, |p| {
        condition_is(p, "Ready", "False") && !ready(p, "web")
    })?;
    let transition =
        api_seconds(&condition(&not_ready, "Ready").context("no Ready")?["lastTransitionTime"])?;
    assert!(
        transition - failed_at <= 3 + 1,
        "Ready turned False {}s after the endpoint failed",
        transition - failed_at
    );
    assert_eq!(restarts(&not_ready, "web"), 0, "readiness never restarts");
    let metrics = probe_metrics(&node)?;
    for result in ["successful", "failed"] {
        assert!(
            metrics.lines().any(|l| l.starts_with("prober_probe_total{")
                && l.contains("container=\"web\"")
                && l.contains("probe_type=\"Readiness\"")
                && l.contains(&format!("result=\"{result}\""))),
            "{metrics}"
        );
    }
    assert!(
        metrics.contains("prober_probe_duration_seconds_bucket{container=\"web\""),
        "{metrics}"
    );
    Ok(())
}

#[test]
fn a_failing_liveness_exec_probe_restarts_the_container() -> Result<()> {
    let test = "a_failing_liveness_exec_probe_restarts_the_container";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    // Each container instance creates /ctl/alive; the test deletes it to make the probe fail.
    let main = container(
        "main",
        &format!("touch /ctl/alive; {SERVE}"),
        "    livenessProbe:
      exec:
        command: [cat, /ctl/alive]
      periodSeconds: 1
      failureThreshold: 2
",
    );
    node.apply(&pod("alive", node.node(), 5, &main, ""))?;
    let api = node.wait_api_pod("alive", "running", START, |p| running(p, "main"))?;
    let ctl = empty_dir(&node, &api, "ctl")?;
    wait_for("the container to create /ctl/alive", START, || {
        ctl.join("alive").exists().then_some(())
    })?;
    std::fs::remove_file(ctl.join("alive"))?;

    let restarted = node.wait_api_pod("alive", "restarted once and running", START, |p| {
        restarts(p, "main") == 1 && running(p, "main")
    })?;
    let status = container_status(&restarted, "main").context("no status")?;
    assert!(
        status["lastState"]["terminated"].is_object(),
        "the killed container is the last state: {status}"
    );
    wait_event(&node, "alive", "Unhealthy", |m| {
        m.starts_with("Liveness probe failed: cat: can't open '/ctl/alive': No such file")
    })?;
    wait_event(&node, "alive", "Killing", |m| {
        m == "Container main failed liveness probe, will be restarted"
    })?;
    // The new instance recreated the file: it stays up.
    let later = node.wait_api_pod("alive", "ready after the restart", START, |p| {
        ready(p, "main")
    })?;
    assert_eq!(restarts(&later, "main"), 1);
    Ok(())
}

#[test]
fn a_startup_probe_holds_liveness_back_until_it_succeeds() -> Result<()> {
    let test = "a_startup_probe_holds_liveness_back_until_it_succeeds";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    // Liveness would kill the container at its first failure; the same check in the startup probe
    // keeps it from running until the test creates /ctl/started.
    let main = container(
        "main",
        SERVE,
        "    startupProbe:
      exec:
        command: [cat, /ctl/started]
      periodSeconds: 1
      failureThreshold: 300
    livenessProbe:
      exec:
        command: [cat, /ctl/started]
      periodSeconds: 1
      failureThreshold: 1
",
    );
    node.apply(&pod("slow", node.node(), 5, &main, ""))?;
    let api = node.wait_api_pod("slow", "running", START, |p| running(p, "main"))?;
    wait_for("three failed startup probes", START, || {
        events(&node, "slow")
            .ok()?
            .into_iter()
            .find(|(r, m, count)| {
                r == "Unhealthy" && m.starts_with("Startup probe failed: ") && *count >= 3
            })
    })?;
    let held = node.api_pod("slow")?.unwrap_or(api);
    let status = container_status(&held, "main").context("no status")?;
    assert_eq!(status["started"], false, "{status}");
    assert_eq!(status["ready"], false, "{status}");
    assert_eq!(restarts(&held, "main"), 0);
    let all = events(&node, "slow")?;
    assert!(
        !all.iter().any(|(_, m, _)| m.starts_with("Liveness")),
        "liveness ran before startup succeeded: {all:#?}"
    );

    std::fs::write(empty_dir(&node, &held, "ctl")?.join("started"), "")?;
    let started = node.wait_api_pod("slow", "started and ready", START, |p| {
        container_status(p, "main").is_some_and(|c| c["started"] == true) && ready(p, "main")
    })?;
    assert_eq!(restarts(&started, "main"), 0);
    Ok(())
}

/// Builds the static gRPC health server (`tests/src/grpc_health.c`) into `dir`.
fn build_grpc_server(dir: &Path) -> Result<()> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/grpc_health.c");
    let status = Command::new("gcc")
        .args(["-O2", "-static", "-s", "-o"])
        .arg(dir.join("grpc_health"))
        .arg(&source)
        .status()
        .context("running gcc")?;
    ensure!(status.success(), "gcc failed on {}", source.display());
    Ok(())
}

#[test]
fn tcp_and_grpc_probes_reach_servers_in_the_pod() -> Result<()> {
    let test = "tcp_and_grpc_probes_reach_servers_in_the_pod";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let bin = tempfile::Builder::new().prefix("ringlet-grpc-").tempdir()?;
    build_grpc_server(bin.path())?;
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let tcp = container(
        "tcp",
        "exec nc -ll -p 9000 -e true",
        "    readinessProbe:
      tcpSocket:
        port: 9000
      periodSeconds: 1
",
    );
    // The gRPC server answers NOT_SERVING while /ctl/not-serving exists.
    let grpc = format!(
        "{}    - name: bin
      mountPath: /grpc
      readOnly: true
    readinessProbe:
      grpc:
        port: 9090
      periodSeconds: 1
      failureThreshold: 1
",
        container("grpc", "exec /grpc/grpc_health 9090 /ctl/not-serving", "")
    );
    let volumes = format!(
        "  - name: bin\n    hostPath:\n      path: {}\n      type: Directory\n",
        bin.path().display()
    );
    node.apply(&pod(
        "servers",
        node.node(),
        5,
        &format!("{tcp}{grpc}"),
        &volumes,
    ))?;
    let api = node.wait_api_pod("servers", "Ready", START, |p| {
        ready(p, "tcp") && ready(p, "grpc") && condition_is(p, "Ready", "True")
    })?;

    std::fs::write(empty_dir(&node, &api, "ctl")?.join("not-serving"), "")?;
    let degraded = node.wait_api_pod("servers", "NotReady", START, |p| {
        !ready(p, "grpc") && condition_is(p, "Ready", "False")
    })?;
    assert!(ready(&degraded, "tcp"), "the TCP probe still succeeds");
    wait_event(&node, "servers", "Unhealthy", |m| {
        m == "Readiness probe failed: service unhealthy (responded with \"NOT_SERVING\")"
    })?;
    Ok(())
}

#[test]
fn bad_probes_give_the_kubelets_results_and_events_without_hanging_the_agent() -> Result<()> {
    let test = "bad_probes_give_the_kubelets_results_and_events_without_hanging_the_agent";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let probe = |action: &str| {
        format!("    readinessProbe:\n{action}      periodSeconds: 2\n      timeoutSeconds: 1\n")
    };
    let containers = [
        // A port name the container does not declare.
        container(
            "noport",
            SERVE,
            &probe("      httpGet:\n        path: /\n        port: nope\n"),
        ),
        // An exec probe that hangs past its timeout.
        container(
            "hang",
            SERVE,
            &probe("      exec:\n        command: [sleep, \"30\"]\n"),
        ),
        // A server that accepts and never answers.
        container(
            "silent",
            "exec nc -ll -p 8081 -e sleep 3600",
            &probe("      httpGet:\n        path: /\n        port: 8081\n"),
        ),
        // A server that answers 10 MB.
        container(
            "big",
            "mkdir -p /www && dd if=/dev/zero of=/www/big bs=1M count=10 2>/dev/null && \
             exec httpd -f -p 8082 -h /www",
            &probe("      httpGet:\n        path: /big\n        port: 8082\n"),
        ),
    ]
    .concat();
    node.apply(&pod("bad", node.node(), 5, &containers, ""))?;
    node.wait_api_pod("bad", "the 10 MB answer ready", START, |p| ready(p, "big"))?;
    let pod_ip = node.api_pod("bad")?.context("the pod is gone")?["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    wait_event(&node, "bad", "Unhealthy", |m| {
        m == "Readiness probe errored and resulted in unknown state: strconv.Atoi: parsing \
              \"nope\": invalid syntax"
    })?;
    wait_event(&node, "bad", "Unhealthy", |m| {
        m == "Readiness probe failed: command \"sleep 30\" timed out"
    })?;
    wait_event(&node, "bad", "Unhealthy", |m| {
        m == format!(
            "Readiness probe failed: Get \"http://{pod_ip}:8081/\": context deadline exceeded \
             (Client.Timeout exceeded while awaiting headers)"
        )
    })?;
    let pod = node.api_pod("bad")?.context("the pod is gone")?;
    for name in ["noport", "hang", "silent"] {
        assert!(running(&pod, name) && !ready(&pod, name), "{name}: {pod}");
        assert_eq!(restarts(&pod, name), 0, "{name}");
    }
    assert!(ready(&pod, "big"));
    assert!(condition_is(&pod, "Ready", "False"));
    // The agent kept going: its health check and the node's heartbeat.
    let (code, body) = ringlet_tests::http_get(node.agent().healthz_port, "/healthz")?;
    assert_eq!(code, 200, "{body}");
    // The timed-out probe is counted as failed. Its series can be missing for a moment (seen
    // once in CI, not diagnosed: a restarted probe worker starts its series afresh), so wait for
    // the next result instead of reading once.
    let metrics = wait_for("the hang probe counted as failed", START, || {
        let metrics = probe_metrics(&node).ok()?;
        metrics
            .lines()
            .any(|l| l.contains("container=\"hang\"") && l.contains("result=\"failed\""))
            .then_some(metrics)
    })?;
    assert!(
        !metrics.contains("container=\"noport\""),
        "an errored probe is not counted: {metrics}"
    );
    Ok(())
}

/// The lines of the hook log the containers write into `ctl`.
fn log_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn post_start_and_pre_stop_hooks_run_around_a_restart_within_the_grace_period() -> Result<()> {
    let test = "post_start_and_pre_stop_hooks_run_around_a_restart_within_the_grace_period";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let grace = 4;
    let hooked = |name: &str, pre_stop: &str| {
        container(
            name,
            &format!(
                "trap 'echo {name} term >> /ctl/log; exit 0' TERM; while true; do sleep 1; done"
            ),
            &format!(
                "    lifecycle:
      postStart:
        exec:
          command: [sh, -c, \"echo {name} poststart >> /ctl/log\"]
      preStop:
        exec:
          command: [sh, -c, {pre_stop:?}]
"
            ),
        )
    };
    let containers = [
        hooked(
            "quick",
            "echo quick prestop >> /ctl/log; sleep 1; echo quick prestop-done >> /ctl/log",
        ),
        hooked(
            "slow",
            "echo slow prestop >> /ctl/log; sleep 600; echo slow prestop-done >> /ctl/log",
        ),
    ]
    .concat();
    node.apply(&pod("hooks", node.node(), grace, &containers, ""))?;
    let api = node.wait_api_pod("hooks", "running", START, |p| {
        running(p, "quick") && running(p, "slow")
    })?;
    let ctl = empty_dir(&node, &api, "ctl")?;
    wait_for("both postStart hooks", START, || {
        let lines = log_lines(&ctl);
        (lines.contains(&"quick poststart".to_owned())
            && lines.contains(&"slow poststart".to_owned()))
        .then_some(())
    })?;

    // A new image restarts both containers: preStop, stop signal, new container, postStart.
    let patched_at = std::time::Instant::now();
    run(node.kubectl().args([
        "patch",
        "pod",
        "hooks",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/containers/0/image","value":"busybox:1.35"},
            {"op":"replace","path":"/spec/containers/1/image","value":"busybox:1.35"}]"#,
    ]))?;
    node.wait_api_pod("hooks", "both restarted and running", START, |p| {
        restarts(p, "quick") == 1
            && restarts(p, "slow") == 1
            && running(p, "quick")
            && running(p, "slow")
    })?;
    let took = patched_at.elapsed();
    wait_for("both new postStart hooks", START, || {
        let lines = log_lines(&ctl);
        let count = |line: &str| lines.iter().filter(|l| *l == line).count();
        (count("quick poststart") == 2 && count("slow poststart") == 2).then_some(())
    })?;
    let lines = log_lines(&ctl);
    let at = |line: &str| {
        lines
            .iter()
            .position(|l| l == line)
            .with_context(|| format!("{line:?} missing from {lines:?}"))
    };
    // The quick hook finished before the stop signal; the slow one was cut off at the grace
    // period and the container still got its signal.
    ensure!(
        at("quick prestop")? < at("quick prestop-done")?,
        "{lines:?}"
    );
    ensure!(at("quick prestop-done")? < at("quick term")?, "{lines:?}");
    ensure!(at("slow prestop")? < at("slow term")?, "{lines:?}");
    ensure!(
        !lines.contains(&"slow prestop-done".to_owned()),
        "the slow hook ran past the grace period: {lines:?}"
    );
    // Bounded by the grace period (the slow hook) and the minimum 2 s the stop signal then gets,
    // plus the sync and restart around them.
    if took > Duration::from_secs(u64::from(grace) + 2 + 20) {
        bail!("the restart took {took:?} with a {grace}s grace period");
    }
    wait_event(&node, "hooks", "Killing", |m| {
        m == "Container slow definition changed, will be restarted"
    })?;
    Ok(())
}

#[test]
fn a_failing_post_start_hook_kills_the_container() -> Result<()> {
    let test = "a_failing_post_start_hook_kills_the_container";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let node = ClusterNode::start(test, &cluster, ClusterNodeOptions::default())?;
    let main = container(
        "main",
        SERVE,
        "    lifecycle:
      postStart:
        exec:
          command: [sh, -c, \"exit 7\"]
",
    );
    node.apply(&pod("badhook", node.node(), 5, &main, ""))?;
    wait_event(&node, "badhook", "FailedPostStartHook", |m| {
        m == "PostStartHook failed"
    })?;
    wait_event(&node, "badhook", "Killing", |m| m == "FailedPostStartHook")?;
    let pod = node.wait_api_pod("badhook", "restarted after the failed hook", START, |p| {
        restarts(p, "main") >= 1
    })?;
    let status = container_status(&pod, "main").context("no status")?;
    assert!(!status["ready"].as_bool().unwrap_or(true), "{status}");
    Ok(())
}

/// containerd's version (`ctr version`'s server version, e.g. `1.6.20~ds1`).
fn containerd_version() -> Result<String> {
    let out = Command::new("ctr")
        .args(["--address", ringlet_tests::CONTAINERD_SOCKET, "version"])
        .output()
        .context("running ctr version")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let server = text.split("Server:").nth(1).unwrap_or_default();
    server
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
        .context("no server version in ctr version")
}

#[test]
fn a_stop_signal_reaches_the_runtime_which_containerd_1_x_ignores() -> Result<()> {
    let test = "a_stop_signal_reaches_the_runtime_which_containerd_1_x_ignores";
    if !require_lab(test) {
        return Ok(());
    }
    let logs = tempfile::Builder::new()
        .prefix("ringlet-signal-")
        .tempdir()?;
    let agent = Agent::start("stopsignal", AgentOptions::default())?;
    agent.write_manifest(
        "signal.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: signal
spec:
  os: {{name: linux}}
  terminationGracePeriodSeconds: 10
  volumes:
  - name: log
    hostPath: {{path: {}, type: Directory}}
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'echo USR1 >> /log/signal; exit 0' USR1; trap 'echo TERM >> /log/signal; exit 0' TERM; echo up >> /log/signal; while true; do sleep 1; done"]
    volumeMounts:
    - {{name: log, mountPath: /log}}
    lifecycle:
      stopSignal: SIGUSR1
"#,
            logs.path().display()
        ),
    )?;
    let signal_log = logs.path().join("signal");
    wait_for("the container to run", START, || {
        std::fs::read_to_string(&signal_log)
            .ok()
            .filter(|s| s.contains("up"))
    })?;
    agent.remove_manifest("signal.yaml")?;
    let received = wait_for("the container to be signalled", START, || {
        let lines = std::fs::read_to_string(&signal_log).ok()?;
        lines.lines().nth(1).map(str::to_owned)
    })?;
    let version = containerd_version()?;
    eprintln!("containerd {version} stopped the container with {received}");
    // The agent asks for SIGUSR1 (ContainerConfig.stop_signal); containerd before 2.x does not know
    // the field and sends the image's STOPSIGNAL or SIGTERM.
    if version.starts_with("1.") {
        assert_eq!(received, "TERM", "containerd {version}");
    } else {
        assert!(received == "USR1" || received == "TERM", "{received}");
    }
    Ok(())
}
