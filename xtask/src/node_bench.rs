//! What the benches share that run ringlet and the upstream kubelet as nodes of the shared control
//! plane (`cargo xtask cluster up`): which agent, starting it as node `bench-<agent>` on the lab's
//! containerd, keeping the kubelet alone there (it stops every container it does not know), a
//! watch that timestamps what the API server shows of a node's pods and of the node itself, and
//! removing what a side leaves (pods, containers, node objects, files). Used by `bench cluster`,
//! `bench scale` and `bench pressure`.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, ListParams, WatchEvent, WatchParams};
use ringlet_tests::cluster::Cluster;
use ringlet_tests::kubelet_host::{LabKubelet, Registration};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::benchkit::{self, Agent, free_port, percentile, pins_in_use, runtime_containers};
use crate::kubelet_host::find_kubelet;
use crate::{cluster, cmd, lab, workspace_root};

pub(crate) const WATCH_POLL: Duration = Duration::from_millis(50);
const NODE_READY_TIMEOUT: Duration = Duration::from_mins(2);
/// The kubelet removes a deleted pod's sandbox at its next container GC, once a minute.
const RUNTIME_CLEANUP_TIMEOUT: Duration = Duration::from_mins(3);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Ringlet,
    Kubelet,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Ringlet => "ringlet",
            Self::Kubelet => "kubelet",
        }
    }

    pub(crate) fn node(self) -> String {
        format!("bench-{}", self.name())
    }
}

/// What a bench of node agents starts from: the lab and the control plane up (the API server
/// restarted with its audit log when an older `up` started it without), the bench's namespace,
/// the ringlet binary under test, the upstream kubelet and its version (or why there is none),
/// and an admin client on a runtime of the bench's own.
pub(crate) struct NodeBench {
    pub(crate) root: PathBuf,
    pub(crate) ringlet: PathBuf,
    pub(crate) kubelet: Result<(PathBuf, String), String>,
    pub(crate) control_plane: Cluster,
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) client: kube::Client,
}

impl NodeBench {
    /// Prepares a bench whose pods live in `namespace`, on ringlet `binary` (else a fresh release
    /// build).
    pub(crate) fn prepare(namespace: &str, binary: Option<&Path>) -> Result<Self> {
        lab::up()?;
        cluster::up(false)?;
        let root = workspace_root();
        let ringlet = benchkit::ringlet_binary(&root, binary)?;
        let kubelet = find_kubelet();
        let control_plane = Cluster::local();
        control_plane.prepare_namespace(namespace)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = runtime.block_on(admin_client(&control_plane))?;
        Ok(Self {
            root,
            ringlet,
            kubelet,
            control_plane,
            runtime,
            client,
        })
    }
}

/// Median, p99 and the samples themselves (sorted), in milliseconds.
#[derive(Serialize)]
pub(crate) struct Stats {
    pub(crate) median_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) samples: usize,
    pub(crate) samples_ms: Vec<f64>,
}

impl Stats {
    pub(crate) fn of(mut samples_ms: Vec<f64>) -> Self {
        samples_ms.sort_by(f64::total_cmp);
        Self {
            median_ms: percentile(&samples_ms, 50.0),
            p99_ms: percentile(&samples_ms, 99.0),
            samples: samples_ms.len(),
            samples_ms,
        }
    }
}

/// An agent binary under test.
pub(crate) struct AgentBinary {
    pub(crate) kind: Kind,
    pub(crate) path: PathBuf,
}

/// What keeps the upstream kubelet from running: containers in containerd (it would stop them;
/// those of the bench's own pods, in namespace `bench_pods`, left out), another agent process or
/// ringlet's eBPF pins.
pub(crate) fn other_agents(bench_pods: Option<&str>) -> Result<Option<String>> {
    let all = cmd::output(lab::ctr().args(["containers", "ls", "-q"]))?;
    let ours: HashSet<String> = match bench_pods {
        Some(namespace) => runtime_containers(namespace)?.into_iter().collect(),
        None => HashSet::new(),
    };
    let count = all
        .lines()
        .map(str::trim)
        .filter(|id| !id.is_empty() && !ours.contains(*id))
        .count();
    if count > 0 {
        return Ok(Some(format!(
            "containerd holds {count} containers of other pods"
        )));
    }
    Ok(pins_in_use().or_else(|| agent_processes(None)))
}

/// Other ringlet and kubelet processes than `except`, described; `None` when there are none.
pub(crate) fn agent_processes(except: Option<u32>) -> Option<String> {
    let found: Vec<String> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            (Some(pid) != except && (comm == "ringlet" || comm == "kubelet"))
                .then(|| format!("{comm} {pid}"))
        })
        .collect();
    (!found.is_empty()).then(|| format!("another agent runs ({})", found.join(", ")))
}

/// While the upstream kubelet runs: notices another agent starting (its pins at once, its process
/// within a second), which would lose its pods to the kubelet within seconds.
struct Sentinel {
    stop: Arc<AtomicBool>,
    found: Arc<Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sentinel {
    const PERIOD: Duration = Duration::from_millis(100);
    /// The process scan runs every this many periods; a pin check is one `readdir`.
    const SCAN_EVERY: u32 = 10;

    fn start(kubelet: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let found = Arc::new(Mutex::new(None));
        let thread = std::thread::spawn({
            let (stop, found) = (Arc::clone(&stop), Arc::clone(&found));
            move || {
                let mut tick = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let seen = pins_in_use().or_else(|| {
                        tick.is_multiple_of(Self::SCAN_EVERY)
                            .then(|| agent_processes(Some(kubelet)))
                            .flatten()
                    });
                    if let Some(seen) = seen {
                        *found.lock().unwrap_or_else(PoisonError::into_inner) = Some(seen);
                        return;
                    }
                    tick = tick.wrapping_add(1);
                    std::thread::sleep(Self::PERIOD);
                }
            }
        });
        Self {
            stop,
            found,
            thread: Some(thread),
        }
    }

    fn found(&self) -> Option<String> {
        self.found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The agent under test, with a [`Sentinel`] when it is the upstream kubelet.
pub(crate) struct Subject {
    pub(crate) agent: Agent,
    kind: Kind,
    sentinel: Option<Sentinel>,
}

impl Subject {
    pub(crate) fn new(agent: Agent, kind: Kind) -> Self {
        let sentinel = (kind == Kind::Kubelet).then(|| Sentinel::start(agent.pid()));
        Self {
            agent,
            kind,
            sentinel,
        }
    }

    /// Fails when the agent exited, or when another agent appeared next to the kubelet.
    pub(crate) fn alive(&mut self) -> Result<()> {
        self.agent.exited()?;
        if let Some(other) = self.intruder() {
            bail!(
                "{other} next to the upstream kubelet, which would stop its pods: stopping the kubelet"
            );
        }
        Ok(())
    }

    pub(crate) fn intruder(&self) -> Option<String> {
        self.sentinel.as_ref().and_then(Sentinel::found)
    }

    pub(crate) fn log(&self) -> &Path {
        &self.agent.log
    }
}

pub(crate) async fn admin_client(control_plane: &Cluster) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&control_plane.admin_kubeconfig)
        .with_context(|| format!("reading {}", control_plane.admin_kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// Where and how a node agent runs: its directories, node, credentials and, when `flags` is
/// set, flags that replace the lab's eviction flags (ringlet, whose flags may not repeat) or
/// override its configuration file (the kubelet, where a flag wins over the file).
pub(crate) struct AgentSetup<'a> {
    pub(crate) run_dir: &'a Path,
    pub(crate) root_dir: &'a Path,
    pub(crate) node: &'a str,
    pub(crate) kubeconfig: &'a Path,
    pub(crate) control_plane: &'a Cluster,
    pub(crate) flags: Option<&'a [String]>,
}

/// Starts `binary` as node `setup.node`, its output going to `log` in the run directory.
pub(crate) fn spawn_agent(binary: &AgentBinary, setup: &AgentSetup, log: &str) -> Result<Agent> {
    let AgentSetup {
        run_dir,
        root_dir,
        node,
        kubeconfig,
        control_plane,
        flags,
    } = *setup;
    let (read_only_port, api_port, healthz_port) = (free_port()?, free_port()?, free_port()?);
    let runtime_endpoint = format!("unix://{}", ringlet_tests::CONTAINERD_SOCKET);
    let mut command = match binary.kind {
        Kind::Ringlet => {
            let mut command = Command::new(&binary.path);
            command
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["--hostname-override", node])
                .arg("--root-dir")
                .arg(root_dir)
                .arg("--client-ca-file")
                .arg(control_plane.ca_file())
                .args(["--read-only-port", &read_only_port.to_string()])
                .args(["--port", &api_port.to_string()])
                .args(["--healthz-port", &healthz_port.to_string()])
                .args(["--address", "127.0.0.1"]);
            match flags {
                Some(flags) => command.args(ringlet_tests::LAB_IMAGE_GC_OFF).args(flags),
                None => command.args(ringlet_tests::LAB_AGENT_FLAGS),
            };
            command
                .args(["--container-runtime-endpoint", &runtime_endpoint])
                .arg("--events-socket")
                .arg(run_dir.join("events.sock"));
            command
        }
        Kind::Kubelet => LabKubelet {
            manifests: run_dir.join("manifests"),
            run_dir: run_dir.to_path_buf(),
            root_dir: root_dir.to_path_buf(),
            read_only_port,
            port: api_port,
            healthz_port,
            registration: Some(Registration {
                kubeconfig: kubeconfig.to_path_buf(),
                client_ca_file: control_plane.ca_file(),
            }),
            evented_pleg: false,
        }
        .command(&binary.path, node)
        .map(|mut command| {
            command.args(flags.unwrap_or_default());
            command
        })?,
    };
    Agent::spawn(&mut command, run_dir.join(log))
}

/// Waits until the API server shows `node` Ready (polled every [`WATCH_POLL`]), at most
/// [`NODE_READY_TIMEOUT`] after `started`; returns the node as it was then.
pub(crate) async fn wait_node_ready(
    nodes: &Api<Node>,
    agent: &mut Subject,
    node: &str,
    started: Instant,
) -> Result<Node> {
    let deadline = started + NODE_READY_TIMEOUT;
    loop {
        agent.alive()?;
        if let Some(ready) = nodes.get_opt(node).await?.filter(node_ready) {
            return Ok(ready);
        }
        if Instant::now() > deadline {
            bail!(
                "node {node} not Ready within {NODE_READY_TIMEOUT:?}; see {}",
                agent.log().display()
            );
        }
        tokio::time::sleep(WATCH_POLL).await;
    }
}

pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until containerd holds none of the bench pods' containers (sandboxes included).
pub(crate) async fn wait_runtime_clean(agent: &mut Subject, namespace: &str) -> Result<()> {
    let deadline = Instant::now() + RUNTIME_CLEANUP_TIMEOUT;
    loop {
        agent.alive()?;
        let left = runtime_containers(namespace)?;
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} containers of the deleted pods still in containerd after {RUNTIME_CLEANUP_TIMEOUT:?}; see {}",
                left.len(),
                agent.log().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When the watch first saw a pod Running and Ready, evicted (phase Failed, reason Evicted), and
/// gone.
#[derive(Default, Clone)]
pub(crate) struct Seen {
    pub(crate) ready: Option<Instant>,
    pub(crate) evicted: Option<Instant>,
    pub(crate) gone: Option<Instant>,
    /// The first container's restart count and whether all containers ran, as last seen.
    state: Option<(i32, bool)>,
    /// When [`Seen::state`] changed (an exit, then the restart, show here), oldest first.
    pub(crate) changes: Vec<Instant>,
}

/// A watch on the pods bound to one node, following them from before the first create; every
/// event is timestamped as it arrives.
pub(crate) struct PodWatch {
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl PodWatch {
    /// Returns once the API server has accepted the watch: nothing created afterwards is missed.
    pub(crate) async fn start(api: Api<Pod>, node: &str) -> Result<Self> {
        let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
        let task = watch_from_now(api, &format!("spec.nodeName={node}"), {
            let seen = Arc::clone(&seen);
            move |pod, gone, now| record(&seen, &pod, gone, now)
        })
        .await?;
        Ok(Self { seen, task })
    }

    /// Polls what the watch has seen until `check` accepts it; fails when the agent or the watch
    /// ends, or after `timeout`.
    pub(crate) async fn wait<T>(
        &mut self,
        agent: &mut Subject,
        what: &str,
        timeout: Duration,
        check: impl Fn(&HashMap<String, Seen>) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = check(&self.seen.lock().unwrap_or_else(PoisonError::into_inner));
            if let Some(found) = found {
                return Ok(found);
            }
            agent.alive()?;
            if self.task.is_finished() {
                (&mut self.task).await??;
                bail!("the pod watch ended");
            }
            if Instant::now() > deadline {
                bail!(
                    "no {what} within {timeout:?}; see {}",
                    agent.log().display()
                );
            }
            tokio::time::sleep(WATCH_POLL).await;
        }
    }
}

impl PodWatch {
    /// What the watch has seen of pod `name` so far.
    pub(crate) fn seen(&self, name: &str) -> Option<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches the objects of `api` that match field selector `selector` from the current version on,
/// calling `on_event` with each object, whether it was deleted, and when the event arrived. Returns
/// once the API server has accepted the watch: nothing that changes afterwards is missed.
pub(crate) async fn watch_from_now<K>(
    api: Api<K>,
    selector: &str,
    on_event: impl FnMut(K, bool, Instant) + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<()>>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let list = api.list(&ListParams::default().fields(selector)).await?;
    let version = list
        .metadata
        .resource_version
        .context("the list has no resourceVersion")?;
    let params = WatchParams::default().fields(selector);
    let stream = api.watch(&params, &version).await?.boxed();
    Ok(tokio::spawn(follow(api, params, version, stream, on_event)))
}

async fn follow<K>(
    api: Api<K>,
    params: WatchParams,
    mut version: String,
    mut stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    mut on_event: impl FnMut(K, bool, Instant),
) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    loop {
        while let Some(event) = stream.try_next().await? {
            let now = Instant::now();
            let (object, gone) = match event {
                WatchEvent::Added(object) | WatchEvent::Modified(object) => (object, false),
                WatchEvent::Deleted(object) => (object, true),
                WatchEvent::Bookmark(bookmark) => {
                    version = bookmark.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(status) => bail!("the watch failed: {status:?}"),
            };
            if let Some(v) = &object.meta().resource_version {
                version.clone_from(v);
            }
            on_event(object, gone, now);
        }
        // The API server ends every watch after a few minutes: go on from the last version seen.
        stream = api.watch(&params, &version).await?.boxed();
    }
}

/// What a [`PodWatch`] keeps of one event.
fn record(seen: &Mutex<HashMap<String, Seen>>, pod: &Pod, gone: bool, now: Instant) {
    let Some(name) = pod.metadata.name.clone() else {
        return;
    };
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = seen.entry(name).or_default();
    if gone {
        entry.gone.get_or_insert(now);
        return;
    }
    if running_and_ready(pod) {
        entry.ready.get_or_insert(now);
    }
    if evicted(pod) {
        entry.evicted.get_or_insert(now);
    }
    let state = Some(container_state(pod));
    if entry.state.is_some() && entry.state != state {
        entry.changes.push(now);
    }
    entry.state = state;
}

/// Phase Failed with reason Evicted: what both agents write for a pod they evicted.
fn evicted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
    })
}

/// The first container's restart count and whether every container runs.
fn container_state(pod: &Pod) -> (i32, bool) {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let wanted = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let running = statuses.len() == wanted
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    (statuses.first().map_or(0, |c| c.restart_count), running)
}

/// Force-deletes the pods bound to `node` (none after a run that went through) and waits until
/// the agent has removed their containers.
pub(crate) async fn remove_pods(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    agent: &mut Subject,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("spec.nodeName={node}");
    let left = pods.list(&ListParams::default().fields(&selector)).await?;
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for pod in &left.items {
        if let Some(name) = &pod.metadata.name {
            ignore_not_found(pods.delete(name, &force).await.map(drop))?;
        }
    }
    if left.items.is_empty() && runtime_containers(namespace)?.is_empty() {
        return Ok(());
    }
    println!("removing {} pods left on {node}", left.items.len());
    let deadline = Instant::now() + RUNTIME_CLEANUP_TIMEOUT;
    loop {
        let containers = runtime_containers(namespace)?;
        if containers.is_empty() {
            return Ok(());
        }
        agent.alive()?;
        if Instant::now() > deadline {
            bail!(
                "{} containers of namespace {namespace} still in containerd after {RUNTIME_CLEANUP_TIMEOUT:?}: {}",
                containers.len(),
                containers.join(" ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ends an agent's turn however it went: stops the kubelet at once when another agent appeared
/// next to it (every second it runs then may cost that agent its pods), removes the pods of
/// `namespace` bound to the agent's node and their containers, and stops the agent. Only a running
/// agent stops its containers, and the kubelet only once it is alone again: when the agent ended
/// before its pods were removed, `respawn` starts it again to remove them.
pub(crate) fn remove_pods_and_stop(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    namespace: &str,
    node: &str,
    agent: &mut Subject,
    respawn: impl FnOnce() -> Result<Agent>,
) -> Result<()> {
    let kind = agent.kind;
    if agent.intruder().is_some() {
        agent.agent.stop();
    }
    let mut removed = runtime.block_on(remove_pods(client, namespace, node, agent));
    if removed.is_err() && agent.agent.exited().is_err() {
        println!(
            "{} ended before its pods were removed: starting it again to remove them",
            kind.name()
        );
        removed = (|| {
            if kind == Kind::Kubelet {
                benchkit::wait_until_quiet(|| other_agents(Some(namespace)))?;
            }
            let mut again = Subject::new(respawn()?, kind);
            let removed = runtime.block_on(remove_pods(client, namespace, node, &mut again));
            again.agent.stop();
            removed
        })();
    }
    agent.agent.stop();
    removed
}

/// Deletes the Node, its Lease and `CSINode` (the upstream kubelet makes one; without
/// kube-controller-manager nothing collects it), and the events about the node and the bench pods.
pub(crate) async fn remove_node_objects(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> Result<()> {
    let gone = DeleteParams::default();
    ignore_not_found(
        Api::<Node>::all(client.clone())
            .delete(node, &gone)
            .await
            .map(drop),
    )?;
    ignore_not_found(
        Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
            .delete(node, &gone)
            .await
            .map(drop),
    )?;
    ignore_not_found(
        Api::<CSINode>::all(client.clone())
            .delete(node, &gone)
            .await
            .map(drop),
    )?;
    Api::<Event>::namespaced(client.clone(), "default")
        .delete_collection(
            &gone,
            &ListParams::default().fields(&format!("involvedObject.name={node}")),
        )
        .await?;
    Api::<Event>::namespaced(client.clone(), namespace)
        .delete_collection(&gone, &ListParams::default())
        .await?;
    Ok(())
}

fn ignore_not_found(result: kube::Result<()>) -> Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => Ok(other?),
    }
}

/// Removes the agent's root dir, the rest of its state in the run dir and its node kubeconfig (if
/// it has one); the log and the kubelet's configuration stay. What is mounted below the root dir
/// is unmounted first (the upstream kubelet bind-mounts its root dir onto itself, shared, and
/// leaves it), so the removal never reaches into a mount.
pub(crate) fn remove_files(
    root_dir: &Path,
    run_dir: &Path,
    kubeconfig: Option<&Path>,
) -> Result<()> {
    benchkit::unmount_below(root_dir)?;
    let manifests = run_dir.join("manifests");
    for dir in [
        root_dir.to_path_buf(),
        run_dir.join("pki"),
        run_dir.join("pod-logs"),
        run_dir.join("volume-plugins"),
        manifests,
    ] {
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    let Some(kubeconfig) = kubeconfig else {
        return Ok(());
    };
    match fs::remove_file(kubeconfig) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", kubeconfig.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, reason: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": { "phase": phase, "reason": reason },
        }))
        .unwrap()
    }

    #[test]
    fn the_watch_records_the_first_eviction_and_the_deletion() {
        let seen = Mutex::new(HashMap::new());
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        record(&seen, &pod("Running", None), false, at(0));
        record(&seen, &pod("Failed", Some("Error")), false, at(5));
        assert!(
            seen.lock().unwrap()["p"].evicted.is_none(),
            "failed, not evicted"
        );
        record(&seen, &pod("Failed", Some("Evicted")), false, at(10));
        record(&seen, &pod("Failed", Some("Evicted")), false, at(20));
        record(&seen, &pod("Failed", Some("Evicted")), true, at(30));
        let seen = &seen.lock().unwrap()["p"];
        assert_eq!(seen.evicted, Some(at(10)));
        assert_eq!(seen.gone, Some(at(30)));
        assert!(seen.ready.is_none());
    }
}
