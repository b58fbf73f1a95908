//! End-to-end: static pods from a manifest directory and a manifest URL, run by the real `ringlet`
//! binary on the lab's containerd. Run as root after `cargo xtask lab up`, one test at a time
//! (`--test-threads=1`: every agent cleans up every ringlet pod it does not know).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, Result};
use ringlet_tests::{
    Agent, AgentOptions, busybox_pod, container_status, containers_of_node, http_get,
    memory_hog_pod, phase, pod_cgroups_of, require_lab, run_once, tail, task_running, wait_for,
};
use serde_json::Value;

/// Upper bound for a pod to start on this machine (image present, sandbox ~0.1 s, containers ~0.1 s).
const START: Duration = Duration::from_mins(1);

fn running(pod: &Value, container: &str) -> bool {
    container_status(pod, container).is_some_and(|c| c["state"]["running"].is_object())
}

fn container_id(pod: &Value, container: &str) -> String {
    container_status(pod, container)
        .and_then(|c| c["containerID"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_static_pod_runs_on_the_pod_network_and_is_listed() -> Result<()> {
    if !require_lab("a_static_pod_runs_on_the_pod_network_and_is_listed") {
        return Ok(());
    }
    let agent = Agent::start("runs", AgentOptions::default())?;
    agent.write_manifest(
        "web.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo $POD_NAME > /tmp/name; exec sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
"#,
    )?;
    let pod = agent.wait_pod("web", "running", START, |p| {
        phase(p) == "Running" && running(p, "main")
    })?;
    assert_eq!(pod["metadata"]["namespace"], "default");
    assert_eq!(pod["spec"]["nodeName"], agent.node.as_str());
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    assert_eq!(condition(&pod, "Ready"), "True");
    assert_eq!(condition(&pod, "Initialized"), "True");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    let pod_ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        pod_ip.starts_with("10.88."),
        "pod IP {pod_ip:?} is not from the lab's CNI range"
    );
    assert!(container_id(&pod, "main").starts_with("containerd://"));
    let (code, body) = http_get(agent.healthz_port, "/healthz")?;
    assert_eq!((code, body.as_str()), (200, "ok"));
    Ok(())
}

#[test]
fn editing_a_manifest_replaces_the_pod_and_deleting_it_removes_it() -> Result<()> {
    if !require_lab("editing_a_manifest_replaces_the_pod_and_deleting_it_removes_it") {
        return Ok(());
    }
    let agent = Agent::start("edit", AgentOptions::default())?;
    agent.write_manifest("app.yaml", &busybox_pod("app", "Always", "exec sleep 3600"))?;
    let first = agent.wait_pod("app", "running", START, |p| running(p, "main"))?;
    let first_uid = first["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let first_container = container_id(&first, "main");

    agent.write_manifest("app.yaml", &busybox_pod("app", "Always", "exec sleep 3601"))?;
    let second = agent.wait_pod("app", "replaced and running", START, |p| {
        p["metadata"]["uid"] != first_uid.as_str() && running(p, "main")
    })?;
    assert_ne!(container_id(&second, "main"), first_container);
    let old_id = first_container
        .trim_start_matches("containerd://")
        .to_owned();
    wait_for("the old container to be removed", START, || {
        let left = containers_of_node(&agent.node).ok()?;
        (!left.contains(&old_id)).then_some(())
    })?;

    agent.remove_manifest("app.yaml")?;
    wait_for("the pod to leave /pods", START, || {
        agent.pod("app").is_none().then_some(())
    })?;
    wait_for(
        "every container and sandbox of the pod to be removed",
        START,
        || {
            containers_of_node(&agent.node)
                .ok()?
                .is_empty()
                .then_some(())
        },
    )?;
    Ok(())
}

/// A process in a pod's cgroup that no container or sandbox of the runtime owns (what an
/// interrupted runtime call can leave) must not keep the removed pod's cgroup and directory for
/// good: once the runtime reports nothing of the pod running, it is killed, as the kubelet does.
#[test]
fn a_process_of_no_container_left_in_a_removed_pods_cgroup_is_killed_and_the_pod_cleaned_up()
-> Result<()> {
    let test =
        "a_process_of_no_container_left_in_a_removed_pods_cgroup_is_killed_and_the_pod_cleaned_up";
    if !require_lab(test) {
        return Ok(());
    }
    let agent = Agent::start("stray", AgentOptions::default())?;
    agent.write_manifest("app.yaml", &busybox_pod("app", "Always", "exec sleep 3600"))?;
    let pod = agent.wait_pod("app", "running", START, |p| running(p, "main"))?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod_cgroup = match pod_cgroups_of(&uid).as_slice() {
        [one] => std::path::PathBuf::from(one),
        other => anyhow::bail!("expected one memory cgroup of pod {uid}, found {other:?}"),
    };
    let mut stray = StrayProcess(Command::new("sleep").arg("3600").spawn()?);
    std::fs::write(pod_cgroup.join("cgroup.procs"), stray.0.id().to_string())?;

    agent.remove_manifest("app.yaml")?;
    let pod_dir = agent.root_dir().join("pods").join(&uid);
    wait_for(
        "the pod's containers, cgroup and directory to go",
        START,
        || {
            let gone = containers_of_node(&agent.node).ok()?.is_empty()
                && pod_cgroups_of(&uid).is_empty()
                && !pod_dir.exists();
            gone.then_some(())
        },
    )
    .with_context(|| format!("agent log:\n{}", tail(&agent.log(), 60)))?;
    let status = wait_for("the stray process to be reaped", START, || {
        stray.0.try_wait().ok().flatten()
    })?;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the stray process was killed"
    );
    Ok(())
}

/// A process the test started, killed when the test ends however it ends.
struct StrayProcess(std::process::Child);

impl Drop for StrayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// kubeadm restarts a static pod by moving its manifest out of the directory and back. The pod is
/// added again with the same UID while it is still stopping (its `sleep` ignores SIGTERM, so the
/// stop takes the 2 s grace period): it must run again once stopped, keep its volume, and `/pods`
/// must name the container that really runs.
#[test]
fn a_manifest_moved_out_and_back_restarts_the_pod_with_its_volume() -> Result<()> {
    if !require_lab("a_manifest_moved_out_and_back_restarts_the_pod_with_its_volume") {
        return Ok(());
    }
    let agent = Agent::start("moved", AgentOptions::default())?;
    agent.write_manifest(
        "app.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: app
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo started >> /scratch/starts; exec sleep 3600"]
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
  volumes:
  - {name: scratch, emptyDir: {}}
"#,
    )?;
    let first = agent.wait_pod("app", "running", START, |p| running(p, "main"))?;
    let uid = first["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let first_container = container_id(&first, "main");

    let away = agent.dir.path().join("app.yaml.away");
    std::fs::rename(agent.manifests().join("app.yaml"), &away)?;
    wait_for("the pod to leave /pods", START, || {
        agent.pod("app").is_none().then_some(())
    })?;
    std::fs::rename(&away, agent.manifests().join("app.yaml"))?;

    let second = agent.wait_pod("app", "running again in a new container", START, |p| {
        running(p, "main") && container_id(p, "main") != first_container
    })?;
    assert_eq!(second["metadata"]["uid"], uid.as_str(), "the same pod");
    let second_id = container_id(&second, "main");
    assert!(
        task_running(second_id.trim_start_matches("containerd://"))?,
        "/pods names {second_id} running, containerd does not run it"
    );
    assert!(!task_running(
        first_container.trim_start_matches("containerd://")
    )?);
    let starts = agent
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch/starts");
    assert_eq!(
        std::fs::read_to_string(&starts)?,
        "started\nstarted\n",
        "both lives of the pod wrote to the same emptyDir"
    );
    Ok(())
}

#[test]
fn a_failing_container_is_restarted_with_back_off() -> Result<()> {
    if !require_lab("a_failing_container_is_restarted_with_back_off") {
        return Ok(());
    }
    let agent = Agent::start("crash", AgentOptions::default())?;
    agent.write_manifest("crash.yaml", &busybox_pod("crash", "Always", "exit 3"))?;
    // Between an exit and the next sync the status shows the exit itself; once the restart is held
    // back, the container waits in CrashLoopBackOff with the exit as its last state.
    let pod = agent.wait_pod("crash", "restarted and backing off", START, |p| {
        container_status(p, "main").is_some_and(|c| {
            c["restartCount"].as_u64() >= Some(1)
                && c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        })
    })?;
    let main = container_status(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(main["lastState"]["terminated"]["exitCode"], 3, "{main}");
    assert_eq!(main["lastState"]["terminated"]["reason"], "Error", "{main}");
    assert!(
        main["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("back-off ")),
        "{main}"
    );
    assert_eq!(phase(&pod), "Running");
    assert_eq!(condition(&pod, "Ready"), "False");
    Ok(())
}

#[test]
fn an_on_failure_pod_that_exits_zero_succeeds() -> Result<()> {
    if !require_lab("an_on_failure_pod_that_exits_zero_succeeds") {
        return Ok(());
    }
    let agent = Agent::start("onfailure", AgentOptions::default())?;
    agent.write_manifest("job.yaml", &busybox_pod("job", "OnFailure", "echo done"))?;
    let pod = agent.wait_pod("job", "Succeeded", START, |p| phase(p) == "Succeeded")?;
    let main = container_status(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(main["state"]["terminated"]["exitCode"], 0);
    assert_eq!(main["state"]["terminated"]["reason"], "Completed");
    assert_eq!(main["restartCount"], 0);
    Ok(())
}

#[test]
fn a_container_past_its_memory_limit_reports_oom_killed() -> Result<()> {
    if !require_lab("a_container_past_its_memory_limit_reports_oom_killed") {
        return Ok(());
    }
    let agent = Agent::start("oom", AgentOptions::default())?;
    agent.write_manifest("hog.yaml", &memory_hog_pod("hog"))?;
    let pod = agent.wait_pod("hog", "Failed", START, |p| phase(p) == "Failed")?;
    let main = container_status(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(main["state"]["terminated"]["reason"], "OOMKilled", "{main}");
    assert_eq!(main["state"]["terminated"]["exitCode"], 137);
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    Ok(())
}

#[test]
fn a_failed_init_container_fails_a_never_restart_pod() -> Result<()> {
    if !require_lab("a_failed_init_container_fails_a_never_restart_pod") {
        return Ok(());
    }
    let agent = Agent::start("initfail", AgentOptions::default())?;
    agent.write_manifest(
        "init.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: init
spec:
  hostNetwork: true
  restartPolicy: Never
  initContainers:
  - name: setup
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "exit 7"]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#,
    )?;
    let pod = agent.wait_pod("init", "Failed", START, |p| phase(p) == "Failed")?;
    let setup = pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|c| c["name"] == "setup"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(setup["state"]["terminated"]["exitCode"], 7);
    assert_eq!(condition(&pod, "Initialized"), "False");
    let main = container_status(&pod, "main").cloned().unwrap_or_default();
    assert!(
        main["state"]["running"].is_null() && main["state"]["terminated"].is_null(),
        "main must never have started: {main}"
    );
    Ok(())
}

#[test]
fn a_restarted_agent_adopts_running_containers() -> Result<()> {
    if !require_lab("a_restarted_agent_adopts_running_containers") {
        return Ok(());
    }
    let mut agent = Agent::start("restart", AgentOptions::default())?;
    agent.write_manifest(
        "keep.yaml",
        &busybox_pod("keep", "Always", "exec sleep 3600"),
    )?;
    let before = agent.wait_pod("keep", "running", START, |p| running(p, "main"))?;
    let containers_before = containers_of_node(&agent.node)?;
    agent.kill()?;
    agent.restart()?;
    let after = agent.wait_pod("keep", "running after the restart", START, |p| {
        running(p, "main") && phase(p) == "Running"
    })?;
    assert_eq!(container_id(&after, "main"), container_id(&before, "main"));
    assert_eq!(
        container_status(&after, "main").map(|c| c["restartCount"].clone()),
        Some(0.into())
    );
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    let mut containers_after = containers_of_node(&agent.node)?;
    let mut containers_before = containers_before;
    containers_after.sort();
    containers_before.sort();
    assert_eq!(
        containers_after, containers_before,
        "no container may be recreated"
    );
    Ok(())
}

#[test]
fn a_broken_manifest_does_not_affect_a_good_one() -> Result<()> {
    if !require_lab("a_broken_manifest_does_not_affect_a_good_one") {
        return Ok(());
    }
    let agent = Agent::start("broken", AgentOptions::default())?;
    agent.write_manifest(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [not, a, map\n",
    )?;
    agent.write_manifest(
        "good.yaml",
        &busybox_pod("good", "Always", "exec sleep 3600"),
    )?;
    agent.wait_pod("good", "running", START, |p| running(p, "main"))?;
    assert_eq!(agent.pods()?.len(), 1);
    let events = wait_for("an event naming the broken file", START, || {
        let log = std::fs::read_to_string(agent.root_dir().join("events.log")).ok()?;
        log.lines().any(|l| l.contains("bad.yaml")).then_some(log)
    })?;
    assert!(events.contains("Warning"));
    Ok(())
}

/// A one-file HTTP server on loopback that serves `body` until dropped.
struct ManifestServer {
    port: u16,
    body: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl ManifestServer {
    fn start(body: String) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let body = Arc::new(Mutex::new(body));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::spawn({
            let body = Arc::clone(&body);
            let stop = Arc::clone(&stop);
            move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nonblocking(false);
                            let mut request = [0u8; 4096];
                            let _ = stream.read(&mut request);
                            let text = body.lock().map(|b| b.clone()).unwrap_or_default();
                            let _ = write!(
                                stream,
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                                text.len()
                            );
                        }
                        Err(_) => thread::sleep(Duration::from_millis(20)),
                    }
                }
            }
        });
        Ok(Self {
            port,
            body,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ManifestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn the_manifest_url_source_runs_and_removes_pods() -> Result<()> {
    if !require_lab("the_manifest_url_source_runs_and_removes_pods") {
        return Ok(());
    }
    let server = ManifestServer::start(busybox_pod("remote", "Always", "exec sleep 3600"))?;
    let agent = Agent::start(
        "url",
        AgentOptions {
            manifest_url: Some(format!("http://127.0.0.1:{}/pods.yaml", server.port)),
            ..AgentOptions::default()
        },
    )?;
    let pod = agent.wait_pod("remote", "running", START, |p| running(p, "main"))?;
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "http"
    );
    if let Ok(mut body) = server.body.lock() {
        body.clear();
    }
    wait_for("the remote pod to be removed", START, || {
        agent.pod("remote").is_none().then_some(())
    })?;
    Ok(())
}

#[test]
fn run_once_starts_the_pods_and_reports_failures() -> Result<()> {
    if !require_lab("run_once_starts_the_pods_and_reports_failures") {
        return Ok(());
    }
    let node = "e2e-runonce";
    let good = busybox_pod("good", "Always", "exec sleep 3600");
    let (ok, stdout) = run_once(node, &[("good.yaml", good.clone())])?;
    assert!(ok, "runonce with a good pod must succeed: {stdout}");
    assert!(
        stdout.contains(&format!("default/good-{node}: running")),
        "{stdout}"
    );
    assert_eq!(
        containers_of_node(node)?.len(),
        2,
        "sandbox and container keep running"
    );

    let bad = busybox_pod("bad", "Never", "exit 4");
    let (ok, stdout) = run_once(node, &[("good.yaml", good), ("bad.yaml", bad)])?;
    assert!(!ok, "runonce with a failing pod must fail: {stdout}");
    assert!(
        stdout.contains(&format!("default/bad-{node}: failed")),
        "{stdout}"
    );
    assert!(stdout.contains("1 failed"), "{stdout}");

    // A normal agent for the same node with no manifests stops and removes what runonce left.
    let agent = Agent::start("runonce", AgentOptions::default())?;
    wait_for("the runonce pods to be cleaned up", START, || {
        containers_of_node(&agent.node)
            .ok()?
            .is_empty()
            .then_some(())
    })?;
    Ok(())
}
