//! Component tests of the whole standalone core (the kubelet's `pkg/kubelet` `Run`/`syncLoop` with
//! the file pod source, pod workers, PLEG, status manager and housekeeping) without root: static pod
//! manifests in a temporary directory, pod cgroups off (`cgroupsPerQOS` false), and the CRI runtime
//! manager on the fake CRI server. The tests watch only what an operator could: the runtime's
//! objects, the `/pods` view and the `/healthz` checks. Waits poll observable state with an upper
//! bound; they are not sleeps.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use ringlet::apis::config::{CgroupDriver, NodeSettings};
use ringlet::cm::PodContainerManager;
use ringlet::container::Runtime;
use ringlet::event_stream::EventBroadcaster;
use ringlet::events::Recorder;
use ringlet::io::{self, IoEngine};
use ringlet::kubelet::{
    ApiParts, HOUSEKEEPING_PERIOD, Kubelet, KubeletDeps, KubeletSettings, NodeHelper,
    NodeStatusSettings, ProbeDeps,
};
use ringlet::kuberuntime::{CriClient, KubeGenericRuntimeManager, RuntimeSettings};
use ringlet::lifecycle::SysctlAllowlist;
use ringlet::metrics::Metrics;
use ringlet::podconfig::{self, PodConfigOptions};
use ringlet::prober::ProbeResults;
use ringlet::server::{self, ServerHost};
use ringlet::stats::{CgroupLayout, StatsProvider, StatsSettings};
use ringlet_proto::runtime::v1 as cri;
use support::fake_cri::{FakeCri, RUNTIME_NAME};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const NODE: &str = "test-node";
/// The name the file source gives the static pod `web` on this node.
const POD_NAME: &str = "web-test-node";
const POLL: Duration = Duration::from_millis(20);
const WAIT_LIMIT: Duration = Duration::from_secs(20);

const MANIFEST: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    imagePullPolicy: IfNotPresent
    command: [sleep, \"3600\"]
";

/// A running agent core on the fake runtime; the sync loop is stopped when it is dropped.
struct Agent {
    fake: FakeCri,
    host: Arc<dyn ServerHost>,
    root: TempDir,
    kubelet: JoinHandle<()>,
    recorder: Recorder,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kubelet.abort();
    }
}

impl Agent {
    /// Builds the core as `main` does and runs it. `before_run` sees the fake before the sync loop
    /// starts (e.g. to take the runtime down).
    fn start(before_run: impl FnOnce(&FakeCri)) -> Self {
        Self::start_with(HOUSEKEEPING_PERIOD, before_run)
    }

    /// [`Agent::start`] with housekeeping ticking every `housekeeping_period`.
    #[allow(
        clippy::too_many_lines,
        reason = "the agent's whole assembly, step by step"
    )]
    fn start_with(housekeeping_period: Duration, before_run: impl FnOnce(&FakeCri)) -> Self {
        let fake = FakeCri::start();
        fake.add_image("busybox");
        let root = tempfile::tempdir()
            .unwrap_or_else(|e| panic!("creating the agent's root directory: {e}"));
        let manifests = root.path().join("manifests");
        for dir in [manifests.clone(), root.path().join("pods")] {
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }

        let recorder = Recorder::new(None);
        let events = recorder.clone();
        let pod_cgroups = Arc::new(
            PodContainerManager::new("/", CgroupDriver::Cgroupfs, false)
                .unwrap_or_else(|e| panic!("creating the pod cgroup manager: {e}")),
        );
        let (published_node, node) = tokio::sync::watch::channel(None);
        let (probe_results, probe_updates) = ProbeResults::new();
        let helper = Arc::new(NodeHelper {
            node,
            node_name: NODE.to_owned(),
            host_ip: "192.0.2.10".to_owned(),
            root_dir: root.path().to_owned(),
            pod_log_root: root.path().join("logs"),
            pod_cgroups: Arc::clone(&pod_cgroups),
            objects: None,
            probe_results: probe_results.clone(),
        });
        let cri = CriClient::new(&fake.endpoint(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("creating the CRI client: {e}"));
        let manager = Arc::new(KubeGenericRuntimeManager::new(
            cri,
            helper,
            recorder.clone(),
            RuntimeSettings::default(),
        ));
        let runtime: Arc<dyn Runtime> = manager.clone();
        let (updates, sources_ready) = podconfig::start(
            PodConfigOptions {
                node_name: NODE.to_owned(),
                manifest_path: Some(manifests),
                file_check_frequency: Duration::from_secs(1),
                manifest_url: None,
                manifest_url_headers: std::collections::HashMap::new(),
                http_check_frequency: Duration::from_secs(20),
                api_server: None,
            },
            recorder.clone(),
        );
        let kubelet = Kubelet::new(
            KubeletSettings {
                node: NodeStatusSettings {
                    node_name: NODE.to_owned(),
                    hostname: NODE.to_owned(),
                    node_ips: Vec::new(),
                    labels: BTreeMap::new(),
                    taints: Vec::new(),
                    node: NodeSettings::default(),
                    max_pods: 110,
                    pods_per_core: 0,
                    kubelet_port: 10250,
                    root_dir: root.path().to_owned(),
                },
                root_dir: root.path().to_owned(),
                sync_frequency: Duration::from_secs(10),
                max_dead_containers_per_container: 1,
                pleg_relist_period: Some(Duration::from_millis(100)),
                housekeeping_period,
                sysctls: SysctlAllowlist::default(),
            },
            KubeletDeps {
                runtime,
                pod_cgroups: Arc::clone(&pod_cgroups),
                recorder,
                pleg_hints: None,
                metrics: Metrics::new().unwrap_or_else(|e| panic!("creating metrics: {e}")),
                broadcaster: EventBroadcaster::default(),
                api: None,
                objects: None,
                node: published_node,
                probes: ProbeDeps {
                    results: probe_results,
                    updates: probe_updates,
                    runner: manager.clone(),
                },
            },
        );
        let stats = StatsProvider::new(StatsSettings::new(
            NODE,
            CgroupLayout::V2 {
                root: root.path().join("cgroup"),
            },
        ));
        let host: Arc<dyn ServerHost> = kubelet.server_host(ApiParts {
            streaming: manager,
            stats,
            configz: serde_json::Value::Null,
            node_log_dir: root.path().join("log"),
            io_engine: IoEngine::Epoll,
        });
        before_run(&fake);
        let kubelet = tokio::spawn(kubelet.run(updates, sources_ready));
        Self {
            fake,
            host,
            root,
            kubelet,
            recorder: events,
        }
    }

    fn manifest(&self) -> PathBuf {
        self.root.path().join("manifests").join("web.yaml")
    }

    fn write_manifest(&self) {
        write_atomically(&self.manifest(), MANIFEST);
    }

    /// `(reason, message)` of the events recorded so far.
    fn events(&self) -> Vec<(String, String)> {
        self.recorder
            .recent()
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect()
    }

    /// The static pod's `Ready` condition status in `/pods`.
    fn ready_condition(&self) -> Option<String> {
        self.pod()?
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
    }

    /// The pods as `/pods` shows them; `None` when it is not a `PodList`.
    fn listed_pods(&self) -> Option<Vec<Pod>> {
        let json = self.host.pod_list_json().ok()?;
        let list: List<Pod> = serde_json::from_slice(&json).ok()?;
        Some(list.items)
    }

    /// The static pod as `/pods` shows it.
    fn pod(&self) -> Option<Pod> {
        self.listed_pods()?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(POD_NAME))
    }

    /// The `app` container's status as `/pods` shows it, once the pod is Running.
    fn running_app(&self) -> Option<ContainerStatus> {
        let status = self.pod()?.status?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        status
            .container_statuses?
            .into_iter()
            .find(|c| c.name == "app")
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    }

    fn health(&self, check: &str) -> Result<(), String> {
        self.host
            .health_checks()
            .into_iter()
            .find(|c| c.name == check)
            .unwrap_or_else(|| panic!("no health check named {check}"))
            .result
    }

    /// Waits until the pod runs with its container running, in the fake and in `/pods`.
    async fn wait_running(&self) -> ContainerStatus {
        let status = wait_for("the pod to be Running in /pods", || self.running_app()).await;
        let sandboxes = self.fake.sandboxes();
        assert_eq!(sandboxes.len(), 1, "one sandbox: {sandboxes:?}");
        assert_eq!(sandboxes[0].state, cri::PodSandboxState::SandboxReady);
        assert_eq!(sandboxes[0].name(), POD_NAME);
        let app = self
            .fake
            .container_named("app")
            .unwrap_or_else(|| panic!("no app container in the fake"));
        assert_eq!(app.state, cri::ContainerState::ContainerRunning);
        assert_eq!(app.sandbox_id, sandboxes[0].id);
        status
    }
}

/// Serves the agent's `/healthz` on a free loopback port for as long as the test runs; the test runs
/// inside `io::block_on(engine, ..)`, as the agent does.
fn serve_healthz(host: Arc<dyn ServerHost>, engine: IoEngine) -> SocketAddr {
    let listener = server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), engine)
        .unwrap_or_else(|e| panic!("binding the healthz listener: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("reading the healthz address: {e}"));
    io::spawn_connection(server::serve_healthz(
        listener,
        host,
        std::future::pending(),
    ));
    addr
}

/// One plain HTTP/1.1 GET: the status code and the raw answer.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("sending GET {path}: {e}"));
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .await
        .unwrap_or_else(|e| panic!("reading the answer to GET {path}: {e}"));
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    (code, answer)
}

/// Writes through a temporary file and a rename, so the file source never reads half a manifest.
fn write_atomically(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap_or_else(|e| panic!("writing {}: {e}", partial.display()));
    std::fs::rename(&partial, path)
        .unwrap_or_else(|e| panic!("renaming to {}: {e}", path.display()));
}

/// Polls `probe` every 20 ms until it gives a value; fails the test after 20 s.
async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT_LIMIT:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn a_manifest_becomes_a_running_pod_and_its_removal_cleans_up() {
    let agent = Agent::start(|_| {});
    agent.write_manifest();

    let app = agent.wait_running().await;
    assert_eq!(app.restart_count, 0);
    let runtime_container = format!("{RUNTIME_NAME}://{}", agent.fake.containers()[0].id);
    assert_eq!(
        app.container_id.as_deref(),
        Some(runtime_container.as_str()),
        "/pods names the runtime's container, after the runtime"
    );
    assert_eq!(agent.health("syncloop"), Ok(()));
    assert_eq!(agent.health("pleg"), Ok(()));

    std::fs::remove_file(agent.manifest()).unwrap_or_else(|e| panic!("removing the manifest: {e}"));
    wait_for("the pod to leave /pods", || {
        agent.pod().is_none().then_some(())
    })
    .await;
    wait_for("the runtime to be empty", || {
        (agent.fake.sandboxes().is_empty() && agent.fake.containers().is_empty()).then_some(())
    })
    .await;
    assert!(
        agent.fake.call_count("StopContainer") >= 1 && agent.fake.call_count("StopPodSandbox") >= 1,
        "the pod was stopped before it was removed: {:?}",
        agent.fake.calls()
    );
}

/// The removed pod's containers and sandbox are removed when it finishes terminating: with the
/// housekeeping tick an hour away, nothing else would remove them within the test's wait.
#[tokio::test]
async fn a_removed_pod_leaves_the_runtime_without_waiting_for_the_housekeeping_tick() {
    let agent = Agent::start_with(Duration::from_hours(1), |_| {});
    agent.write_manifest();
    agent.wait_running().await;

    std::fs::remove_file(agent.manifest()).unwrap_or_else(|e| panic!("removing the manifest: {e}"));
    wait_for("the runtime to be empty", || {
        (agent.fake.sandboxes().is_empty() && agent.fake.containers().is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_crashed_container_is_restarted_and_counted() {
    let agent = Agent::start(|_| {});
    agent.write_manifest();
    agent.wait_running().await;
    let first = agent
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no app container"));

    agent.fake.exit_container(&first.id, 1, "");
    let app = wait_for("restartCount 1 with app running again", || {
        agent.running_app().filter(|c| c.restart_count == 1)
    })
    .await;
    let second = agent
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no app container"));
    assert_ne!(second.id, first.id, "a new container was created");
    assert_eq!(second.attempt(), 1);
    assert_eq!(second.state, cri::ContainerState::ContainerRunning);
    let last = app
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .unwrap_or_else(|| panic!("lastState.terminated is set: {app:?}"));
    assert_eq!(last.exit_code, 1);
    assert_eq!(
        agent.fake.sandboxes().len(),
        1,
        "the restart reuses the sandbox"
    );
}

#[test]
fn pods_wait_for_an_unavailable_runtime() {
    io::block_on(
        IoEngine::Uring,
        pods_wait_for_an_unavailable_runtime_on(IoEngine::Uring),
    )
    .unwrap_or_else(|e| panic!("running the test on io_uring: {e}"));
}

async fn pods_wait_for_an_unavailable_runtime_on(engine: IoEngine) {
    let agent = Agent::start(|fake| fake.set_unavailable(true));
    let healthz = serve_healthz(Arc::clone(&agent.host), engine);
    agent.write_manifest();

    // The PLEG keeps relisting while the runtime is down: five failed relists give the file source
    // and the sync loop ample time to have acted, had they been going to.
    wait_for("the runtime's Status and five relists to be tried", || {
        (agent.fake.call_count("Status") >= 1 && agent.fake.call_count("ListPodSandbox") >= 5)
            .then_some(())
    })
    .await;
    assert!(
        agent.health("syncloop").is_err(),
        "the sync loop is not going round while the runtime is down"
    );
    let (code, answer) = http_get(healthz, "/healthz").await;
    assert_eq!(code, 500, "{answer}");
    assert!(answer.contains("[-]syncloop failed"), "{answer}");
    assert!(
        agent.pod().and_then(|p| p.status).is_none(),
        "the pod is not synced: {:?}",
        agent.pod()
    );
    assert_eq!(agent.fake.call_count("RunPodSandbox"), 0);
    assert!(agent.fake.sandboxes().is_empty());

    agent.fake.set_unavailable(false);
    agent.wait_running().await;
    wait_for("a healthy sync loop", || {
        agent.health("syncloop").is_ok().then_some(())
    })
    .await;
    let (code, answer) = http_get(healthz, "/healthz/syncloop").await;
    assert_eq!(code, 200, "{answer}");
}

#[tokio::test]
async fn a_runtime_outage_leaves_a_running_pod_as_it_was() {
    let agent = Agent::start(|_| {});
    agent.write_manifest();
    agent.wait_running().await;
    let before = agent.fake.container_named("app");

    // Down long enough for the runtime-status poll (every 5 s) to see it, so the sync loop stops.
    agent.fake.set_unavailable(true);
    let polled = agent.fake.call_count("Status");
    wait_for("a failed runtime-status poll", || {
        (agent.fake.call_count("Status") > polled).then_some(())
    })
    .await;
    agent.fake.set_unavailable(false);
    let polled = agent.fake.call_count("Status");
    let listed = agent.fake.call_count("ListPodSandbox");
    wait_for("a good runtime-status poll and five relists", || {
        (agent.fake.call_count("Status") > polled
            && agent.fake.call_count("ListPodSandbox") >= listed + 5)
            .then_some(())
    })
    .await;
    wait_for("a healthy sync loop", || {
        agent.health("syncloop").is_ok().then_some(())
    })
    .await;

    assert_eq!(
        agent.fake.call_count("RunPodSandbox"),
        1,
        "no second sandbox"
    );
    assert_eq!(
        agent.fake.call_count("CreateContainer"),
        1,
        "no second container"
    );
    assert_eq!(agent.fake.call_count("StopContainer"), 0);
    assert_eq!(agent.fake.container_named("app"), before);
    let app = agent
        .running_app()
        .unwrap_or_else(|| panic!("the pod is still Running: {:?}", agent.pod()));
    assert_eq!(app.restart_count, 0);
}

#[tokio::test]
async fn a_finished_never_pod_succeeds_and_is_not_restarted() {
    let agent = Agent::start(|_| {});
    write_atomically(
        &agent.manifest(),
        &MANIFEST.replace("restartPolicy: Always", "restartPolicy: Never"),
    );
    agent.wait_running().await;
    let app = agent
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no app container"));

    agent.fake.exit_container(&app.id, 0, "");
    let status = wait_for("phase Succeeded in /pods", || {
        agent
            .pod()
            .and_then(|p| p.status)
            .filter(|s| s.phase.as_deref() == Some("Succeeded"))
    })
    .await;
    let app_status = status
        .container_statuses
        .as_deref()
        .and_then(|c| c.iter().find(|c| c.name == "app"))
        .unwrap_or_else(|| panic!("app in /pods: {status:?}"));
    let terminated = app_status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .unwrap_or_else(|| panic!("app is terminated: {app_status:?}"));
    assert_eq!(terminated.exit_code, 0);
    assert_eq!(terminated.reason.as_deref(), Some("Completed"));
    assert_eq!(app_status.restart_count, 0);
    assert_eq!(
        agent.fake.call_count("CreateContainer"),
        1,
        "never restarted"
    );

    // A pod in a terminal phase is torn down, as the kubelet does: its sandbox is stopped.
    wait_for("the finished pod's sandbox to stop", || {
        agent
            .fake
            .sandboxes()
            .iter()
            .all(|s| s.state == cri::PodSandboxState::SandboxNotready)
            .then_some(())
    })
    .await;
    assert_eq!(
        agent.fake.call_count("CreateContainer"),
        1,
        "never restarted"
    );
    assert_eq!(agent.fake.call_count("RunPodSandbox"), 1, "no new sandbox");
    assert_eq!(
        agent
            .pod()
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Succeeded"),
        "the phase stays"
    );
}

#[tokio::test]
async fn an_edited_manifest_replaces_the_pod() {
    let agent = Agent::start(|_| {});
    agent.write_manifest();
    agent.wait_running().await;
    let old_uid = agent
        .pod()
        .and_then(|p| p.metadata.uid)
        .unwrap_or_else(|| panic!("the pod has a uid"));

    write_atomically(&agent.manifest(), &MANIFEST.replace("\"3600\"", "\"7200\""));
    let new_uid = wait_for("the edited pod in /pods", || {
        agent
            .pod()
            .and_then(|p| p.metadata.uid)
            .filter(|uid| *uid != old_uid)
    })
    .await;
    wait_for("only the edited pod's objects in the runtime", || {
        let sandboxes = agent.fake.sandboxes();
        let containers = agent.fake.containers();
        let only_new = sandboxes.len() == 1
            && sandboxes[0].uid() == new_uid
            && sandboxes[0].state == cri::PodSandboxState::SandboxReady
            && containers.len() == 1
            && containers[0].state == cri::ContainerState::ContainerRunning
            && containers[0].config.command == ["sleep", "7200"];
        only_new.then_some(())
    })
    .await;
    assert_eq!(
        agent.listed_pods().map(|pods| pods.len()),
        Some(1),
        "one pod in /pods"
    );
    agent.wait_running().await;
}

/// [`MANIFEST`] with `probes` (YAML at the container's indentation) added to the container.
fn manifest_with(probes: &str) -> String {
    format!("{MANIFEST}{probes}")
}

#[tokio::test]
async fn a_readiness_probe_decides_ready_and_the_ready_condition() {
    let agent = Agent::start(|fake| fake.set_exec_result("app", 1, "not yet"));
    write_atomically(
        &agent.manifest(),
        &manifest_with(
            "    readinessProbe:\n      exec:\n        command: [check]\n      periodSeconds: 1\n",
        ),
    );
    let app = agent.wait_running().await;
    assert!(!app.ready, "not ready before the probe succeeds: {app:?}");
    assert_eq!(app.started, Some(true));
    wait_for("an Unhealthy event from the failing probe", || {
        agent
            .events()
            .contains(&(
                "Unhealthy".to_owned(),
                "Readiness probe failed: not yet".to_owned(),
            ))
            .then_some(())
    })
    .await;
    assert_eq!(agent.ready_condition().as_deref(), Some("False"));

    agent.fake.set_exec_result("app", 0, "");
    wait_for("the container ready and the pod Ready", || {
        (agent.running_app()?.ready && agent.ready_condition()? == "True").then_some(())
    })
    .await;

    agent.fake.set_exec_result("app", 1, "gone");
    wait_for("the pod NotReady again after three failures", || {
        (agent.ready_condition()? == "False").then_some(())
    })
    .await;
    assert!(!agent.running_app().is_some_and(|c| c.ready));
    assert_eq!(
        agent.fake.call_count("StopContainer"),
        0,
        "readiness never restarts a container"
    );
}

#[tokio::test]
async fn a_failing_liveness_probe_restarts_the_container() {
    let agent = Agent::start(|_| {});
    write_atomically(
        &agent.manifest(),
        &manifest_with(
            "    livenessProbe:\n      exec:\n        command: [check]\n      periodSeconds: 1\n      \
             failureThreshold: 2\n",
        ),
    );
    agent.wait_running().await;
    let first = agent
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no app container"));

    agent.fake.set_exec_result("app", 1, "stuck");
    let app = wait_for("restartCount 1 with app running again", || {
        agent.running_app().filter(|c| c.restart_count == 1)
    })
    .await;
    assert!(app.ready, "a liveness probe alone does not gate readiness");
    let second = agent
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no app container"));
    assert_ne!(second.id, first.id, "a new container was created");
    let events = agent.events();
    assert!(
        events.contains(&(
            "Unhealthy".to_owned(),
            "Liveness probe failed: stuck".to_owned()
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "Killing".to_owned(),
            "Container app failed liveness probe, will be restarted".to_owned()
        )),
        "{events:?}"
    );
    let unhealthy = events.iter().position(|e| e.0 == "Unhealthy");
    let killing = events.iter().position(|e| e.0 == "Killing");
    assert!(unhealthy < killing, "Unhealthy comes first: {events:?}");
}

#[tokio::test]
async fn a_startup_probe_gates_readiness_and_liveness() {
    let agent = Agent::start(|fake| fake.set_exec_result("app", 1, "starting"));
    write_atomically(
        &agent.manifest(),
        &manifest_with(
            "    startupProbe:\n      exec:\n        command: [check]\n      periodSeconds: 1\n      \
             failureThreshold: 1000\n    livenessProbe:\n      exec:\n        command: [check]\n      \
             periodSeconds: 1\n      failureThreshold: 1\n",
        ),
    );
    let app = agent.wait_running().await;
    assert_eq!(
        app.started,
        Some(false),
        "not started before the startup probe succeeds"
    );
    assert!(!app.ready);
    // The same failing command would kill the container at once if liveness ran before startup.
    wait_for("three failed startup probes", || {
        let failures = agent
            .events()
            .iter()
            .filter(|e| e.1 == "Startup probe failed: starting")
            .count();
        (failures >= 3).then_some(())
    })
    .await;
    assert!(
        !agent.events().iter().any(|e| e.1.starts_with("Liveness")),
        "liveness waited for startup: {:?}",
        agent.events()
    );
    assert_eq!(agent.fake.call_count("StopContainer"), 0);

    agent.fake.set_exec_result("app", 0, "");
    wait_for("the container started and ready", || {
        agent
            .running_app()
            .filter(|c| c.started == Some(true) && c.ready)
    })
    .await;
}
