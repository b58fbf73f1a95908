//! A fake CRI runtime for the component tests: serves the `runtime.v1` `RuntimeService` and
//! `ImageService` on a unix socket in a temporary directory, keeps sandboxes, containers and images
//! in memory, and lets a test steer it (process exits, outages, slow answers, injected errors).
//! It plays the part of `k8s.io/cri-api/pkg/apis/testing`'s `FakeRuntimeService` /
//! `FakeImageService` in the kubelet's `pkg/kubelet/kuberuntime` tests, but over a real socket.
//!
//! It answers like the lab's containerd 1.6.20 (probed, not guessed) where the agent depends on it:
//! error codes and messages, stop and remove idempotence (but `StopContainer`,
//! `StopPodSandbox` and the status calls answer `NotFound` for an unknown id), name reservation
//! until removal, containers killed with 137 when their sandbox stops or they are removed while
//! running, `ImageStatus` answering an empty response for an absent image, references normalised
//! (`busybox` is `docker.io/library/busybox:latest`), and images without repo digests (so
//! `image_ref` is the `sha256:` id), as images imported without a registry are.
//!
//! Stopping a container follows what its process does with SIGTERM, chosen per container name with
//! [`FakeCri::set_stop_behaviour`]: by default the process dies of the signal (143, as busybox
//! `sleep` in a shared pod PID namespace does); [`StopBehaviour::IgnoresSigterm`] makes
//! `StopContainer` wait the whole timeout (tokio time) and then report 137, as `sleep` does as PID 1
//! of its own PID namespace. A timeout of 0 kills at once (137).
//!
//! Not modelled: log files (containerd creates `<log_directory>/<log_path>`; the fake only reports
//! the path), the pause image, `ListContainerStats`, container events, and the order of list
//! results (creation order here, unspecified in containerd).

#![allow(
    dead_code,
    reason = "every test binary includes this module and uses a different part of it"
)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringlet_proto::runtime::v1 as cri;
use ringlet_proto::runtime::v1::image_service_server::{ImageService, ImageServiceServer};
use ringlet_proto::runtime::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::BoxFuture;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

/// What `Version` reports as `runtime_name`.
pub const RUNTIME_NAME: &str = "fake-containerd";

/// Every RPC the fake serves, by its wire name; `fail_next` and `calls` use these names.
pub const METHODS: &[&str] = &[
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "ExecSync",
    "Status",
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
];

/// Exit code of a process killed by SIGKILL (128 + 9).
pub const EXIT_SIGKILL: i32 = 137;
/// Exit code of a process killed by SIGTERM (128 + 15).
pub const EXIT_SIGTERM: i32 = 143;

/// How a container's process reacts to the SIGTERM `StopContainer` sends first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopBehaviour {
    /// No handler: the signal kills it at once, exit code 143.
    #[default]
    KilledBySigterm,
    /// A handler that exits with this code at once.
    ExitsWith(i32),
    /// The signal is ignored: the runtime waits the whole timeout, then SIGKILL, exit code 137.
    IgnoresSigterm,
}

/// A sandbox as the fake holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeSandbox {
    /// 64 hex digits.
    pub id: String,
    /// The config `RunPodSandbox` received, unchanged.
    pub config: cri::PodSandboxConfig,
    pub runtime_handler: String,
    pub state: cri::PodSandboxState,
    /// Unix nanoseconds.
    pub created_at: i64,
    /// `10.88.0.N` for a ready sandbox in its own network namespace, `None` for host network or
    /// once stopped (containerd forgets the address when the network namespace is gone).
    pub ip: Option<String>,
    /// The fake pid of the pause process.
    pub pid: u32,
}

impl FakeSandbox {
    /// The pod name from the metadata.
    pub fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
    }

    /// The pod uid from the metadata.
    pub fn uid(&self) -> &str {
        self.config.metadata.as_ref().map_or("", |m| m.uid.as_str())
    }

    /// `linux.cgroup_parent` of the config, empty when unset.
    pub fn cgroup_parent(&self) -> &str {
        self.config
            .linux
            .as_ref()
            .map_or("", |l| l.cgroup_parent.as_str())
    }

    fn host_network(&self) -> bool {
        namespace_network(&self.config) == cri::NamespaceMode::Node
    }

    fn to_summary(&self) -> cri::PodSandbox {
        cri::PodSandbox {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    fn to_status(&self) -> cri::PodSandboxStatus {
        let namespace_options = self
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        cri::PodSandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            network: Some(cri::PodSandboxNetworkStatus {
                ip: self.ip.clone().unwrap_or_default(),
                additional_ips: Vec::new(),
            }),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: namespace_options,
                }),
            }),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }
}

/// A container as the fake holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeContainer {
    /// 64 hex digits.
    pub id: String,
    pub sandbox_id: String,
    /// The config `CreateContainer` received, unchanged (command, args, envs, mounts, resources...).
    pub config: cri::ContainerConfig,
    pub state: cri::ContainerState,
    /// Unix nanoseconds; 0 when it has not happened.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// "Completed", "Error", "`OOMKilled`" or what the test gave `exit_container`.
    pub reason: String,
    pub message: String,
    /// `<sandbox log_directory>/<config log_path>`, empty when the config has no log path.
    pub log_path: String,
    /// The normalised reference of the image it was created from.
    pub image: String,
    /// `sha256:...` id of that image.
    pub image_id: String,
    /// `<sandbox cgroup_parent>/<id>`, as runc does with the cgroupfs driver.
    pub cgroups_path: String,
    /// The fake pid of its process; 0 unless running.
    pub pid: u32,
}

impl FakeContainer {
    /// The container name from the metadata.
    pub fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
    }

    /// The attempt from the metadata.
    pub fn attempt(&self) -> u32 {
        self.config.metadata.as_ref().map_or(0, |m| m.attempt)
    }

    /// The config's env as (key, value) pairs.
    pub fn envs(&self) -> Vec<(String, String)> {
        self.config
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect()
    }

    /// `linux.resources` of the config.
    pub fn resources(&self) -> Option<&cri::LinuxContainerResources> {
        self.config
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
    }

    fn to_summary(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.config.image.clone(),
            image_ref: self.image_id.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            image_id: String::new(),
        }
    }

    fn to_status(&self) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..cri::ImageSpec::default()
            }),
            image_ref: self.image_id.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            mounts: self.config.mounts.clone(),
            log_path: self.log_path.clone(),
            resources: self.resources().map(|r| cri::ContainerResources {
                linux: Some(r.clone()),
            }),
            image_id: String::new(),
        }
    }

    fn finish(&mut self, exit_code: i32, reason: &str) {
        self.state = cri::ContainerState::ContainerExited;
        self.exit_code = exit_code;
        reason.clone_into(&mut self.reason);
        self.finished_at = now_nanos();
        self.pid = 0;
    }
}

/// The reason containerd gives an exit it did not see as an OOM kill.
fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

#[derive(Default)]
struct State {
    sandboxes: Vec<FakeSandbox>,
    containers: Vec<FakeContainer>,
    /// Normalised references of present images.
    images: BTreeSet<String>,
    calls: Vec<String>,
    failures: HashMap<String, VecDeque<Status>>,
    unavailable: bool,
    delay: Duration,
    network_not_ready: bool,
    pulls_enabled: bool,
    /// `(username, password)` of every `PullImage`'s `auth`, in order (`None`: anonymous).
    pull_auths: Vec<Option<(String, String)>>,
    stop_behaviours: HashMap<String, StopBehaviour>,
    exec_results: HashMap<String, cri::ExecSyncResponse>,
    /// `(container name, timeout)` of every `StopContainer` of a running container, in order.
    stops: Vec<(String, i64)>,
    next_id: u64,
    next_ip: u32,
    next_pid: u32,
}

impl State {
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        let digest = Sha256::digest(format!("fake-cri-{}-{}", self.next_id, now_nanos()));
        hex(&digest)
    }

    fn new_pid(&mut self) -> u32 {
        self.next_pid += 1;
        1000 + self.next_pid
    }

    /// Finds by full id or unique prefix, as containerd's id index does.
    fn sandbox_index(&self, id: &str) -> Option<usize> {
        unique_prefix_match(self.sandboxes.iter().map(|s| s.id.as_str()), id)
    }

    fn container_index(&self, id: &str) -> Option<usize> {
        unique_prefix_match(self.containers.iter().map(|c| c.id.as_str()), id)
    }

    fn sandbox(&self, id: &str) -> Result<usize, Status> {
        self.sandbox_index(id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find sandbox \"{id}\": not found"
            ))
        })
    }

    fn container(&self, id: &str) -> Result<usize, Status> {
        self.container_index(id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container \"{id}\": not found"
            ))
        })
    }

    /// containerd stops a sandbox's containers with timeout 0 before tearing the sandbox down.
    fn stop_sandbox(&mut self, index: usize) {
        let sandbox_id = self.sandboxes[index].id.clone();
        for container in &mut self.containers {
            if container.sandbox_id == sandbox_id
                && container.state == cri::ContainerState::ContainerRunning
            {
                container.finish(EXIT_SIGKILL, exit_reason(EXIT_SIGKILL));
            }
        }
        let sandbox = &mut self.sandboxes[index];
        sandbox.state = cri::PodSandboxState::SandboxNotready;
        sandbox.ip = None;
        sandbox.pid = 0;
    }

    fn resolve_image(&self, reference: &str) -> Option<String> {
        let normalised = normalise_image(reference);
        if self.images.contains(&normalised) {
            return Some(normalised);
        }
        self.images
            .iter()
            .find(|present| image_id(present) == reference)
            .cloned()
    }

    fn image(reference: &str) -> cri::Image {
        cri::Image {
            id: image_id(reference),
            repo_tags: if reference.contains('@') {
                Vec::new()
            } else {
                vec![reference.to_owned()]
            },
            // Images imported into the lab's containerd have no repo digest.
            repo_digests: Vec::new(),
            size: 4_096_000,
            uid: None,
            username: String::new(),
            spec: Some(cri::ImageSpec {
                image: image_id(reference),
                ..cri::ImageSpec::default()
            }),
            pinned: false,
        }
    }
}

fn unique_prefix_match<'a>(ids: impl Iterator<Item = &'a str>, wanted: &str) -> Option<usize> {
    if wanted.is_empty() {
        return None;
    }
    let mut found = None;
    for (index, id) in ids.enumerate() {
        if id == wanted {
            return Some(index);
        }
        if id.starts_with(wanted) {
            if found.is_some() {
                return None;
            }
            found = Some(index);
        }
    }
    found
}

fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn namespace_network(config: &cri::PodSandboxConfig) -> cri::NamespaceMode {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .map_or(cri::NamespaceMode::Pod, cri::NamespaceOption::network)
}

/// Sandbox names as containerd builds them; a name stays reserved until the sandbox is removed.
fn sandbox_name(metadata: &cri::PodSandboxMetadata) -> String {
    format!(
        "{}_{}_{}_{}",
        metadata.name, metadata.namespace, metadata.uid, metadata.attempt
    )
}

fn container_name(container: &cri::ContainerMetadata, sandbox: &cri::PodSandboxMetadata) -> String {
    format!(
        "{}_{}_{}_{}_{}",
        container.name, sandbox.name, sandbox.namespace, sandbox.uid, container.attempt
    )
}

/// Normalises an image reference the way containerd's CRI does (docker reference rules):
/// `busybox` → `docker.io/library/busybox:latest`, `foo/bar:1` → `docker.io/foo/bar:1`,
/// `registry.local:5000/x` → `registry.local:5000/x:latest`. Ids (`sha256:...`) are kept.
pub fn normalise_image(reference: &str) -> String {
    if reference.starts_with("sha256:") {
        return reference.to_owned();
    }
    let (name, digest) = match reference.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (reference, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest.to_owned())
        }
        _ => ("docker.io", name.to_owned()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    let path = if domain == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    match digest {
        Some(digest) => format!("{domain}/{path}@{digest}"),
        None if path
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':')) =>
        {
            format!("{domain}/{path}")
        }
        None => format!("{domain}/{path}:latest"),
    }
}

/// The fake id of an image: `sha256:` and the hash of its normalised reference.
pub fn image_id(reference: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(reference.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

struct Inner {
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not turn every later call into a poison panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the call, then applies the test's delay, outage and injected failure, in that order.
    async fn enter(&self, method: &str) -> Result<(), Status> {
        let delay = {
            let mut state = self.lock();
            state.calls.push(method.to_owned());
            state.delay
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.lock();
        if state.unavailable {
            return Err(Status::unavailable(
                "connection error: desc = \"transport: error while dialing: dial unix: connect: connection refused\"",
            ));
        }
        if let Some(status) = state.failures.get_mut(method).and_then(VecDeque::pop_front) {
            return Err(status);
        }
        Ok(())
    }
}

/// The fake runtime; serving stops when it is dropped.
pub struct FakeCri {
    inner: Arc<Inner>,
    endpoint: String,
    shutdown: Option<oneshot::Sender<()>>,
    // Held for its Drop: removes the socket's directory.
    _dir: TempDir,
}

impl std::fmt::Debug for FakeCri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCri")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl FakeCri {
    /// Starts serving on `<tempdir>/cri.sock` with no sandboxes, containers or images, ready
    /// network and pulls disabled.
    ///
    /// # Panics
    /// Outside a tokio runtime, or if the socket cannot be created.
    pub fn start() -> FakeCri {
        let dir = tempfile::tempdir()
            .unwrap_or_else(|e| panic!("creating the fake CRI's temporary directory: {e}"));
        let socket = dir.path().join("cri.sock");
        let listener = UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("binding the fake CRI socket {}: {e}", socket.display()));
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
        });
        let (shutdown, stopped) = oneshot::channel::<()>();
        let services = BothServices {
            runtime: RuntimeServiceServer::new(Runtime(Arc::clone(&inner))),
            images: ImageServiceServer::new(Images(Arc::clone(&inner))),
        };
        tokio::spawn(async move {
            let incoming = UnixListenerStream::new(listener);
            let signal = async {
                // A dropped sender means the FakeCri is gone: stop as well.
                let _ = stopped.await;
            };
            let served = Server::builder()
                .serve_with_incoming_shutdown(services, incoming, signal)
                .await;
            if let Err(e) = served {
                eprintln!("fake CRI server failed: {e}");
            }
        });
        FakeCri {
            inner,
            endpoint: format!("unix://{}", socket.display()),
            shutdown: Some(shutdown),
            _dir: dir,
        }
    }

    /// `unix:///.../cri.sock`, the form the agent's `--container-runtime-endpoint` takes.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The socket's path.
    pub fn socket_path(&self) -> &Path {
        Path::new(self.endpoint.trim_start_matches("unix://"))
    }

    /// Simulates the container's process exiting on its own (a crash, `OOMKilled` with 137...).
    /// An empty reason becomes containerd's: "Completed" for 0, else "Error".
    ///
    /// # Panics
    /// If no running container has this id: that is a mistake in the test.
    pub fn exit_container(&self, id: &str, exit_code: i32, reason: &str) {
        let mut state = self.inner.lock();
        let Some(index) = state.container_index(id) else {
            panic!("exit_container: no container {id}");
        };
        let container = &mut state.containers[index];
        assert_eq!(
            container.state,
            cri::ContainerState::ContainerRunning,
            "exit_container: container {id} is not running"
        );
        let reason = if reason.is_empty() {
            exit_reason(exit_code)
        } else {
            reason
        };
        container.finish(exit_code, reason);
    }

    /// While true, every call answers `Unavailable` (containerd down or restarting).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.inner.lock().unavailable = unavailable;
    }

    /// Every call waits this long before answering (tokio time), to exercise the client's deadlines.
    /// `Duration::ZERO` turns it off.
    pub fn delay_calls(&self, delay: Duration) {
        self.inner.lock().delay = delay;
    }

    /// The next call of `method` (a wire name from [`METHODS`]) fails with this status. Several
    /// injections for one method are used up in order.
    ///
    /// # Panics
    /// If `method` is not an RPC the fake serves.
    pub fn fail_next(&self, method: &str, code: Code, message: &str) {
        assert!(
            METHODS.contains(&method),
            "fail_next: the fake serves no RPC named {method:?}"
        );
        self.inner
            .lock()
            .failures
            .entry(method.to_owned())
            .or_default()
            .push_back(Status::new(code, message));
    }

    /// Makes `Status` report `NetworkReady` false and `RunPodSandbox` of a pod-network sandbox fail,
    /// as containerd does without a CNI config.
    pub fn set_network_ready(&self, ready: bool) {
        self.inner.lock().network_not_ready = !ready;
    }

    /// Makes the image present (normalised like containerd).
    pub fn add_image(&self, reference: &str) {
        self.inner.lock().images.insert(normalise_image(reference));
    }

    /// Makes the image absent, whether given by reference or id.
    pub fn remove_image(&self, reference: &str) {
        let mut state = self.inner.lock();
        if let Some(present) = state.resolve_image(reference) {
            state.images.remove(&present);
        }
    }

    /// Normalised references of the present images, sorted.
    pub fn images(&self) -> Vec<String> {
        self.inner.lock().images.iter().cloned().collect()
    }

    /// When true, `PullImage` succeeds for any reference and makes it present; when false (the
    /// default) it fails like containerd with no registry reachable.
    pub fn enable_pulls(&self, enabled: bool) {
        self.inner.lock().pulls_enabled = enabled;
    }

    /// `(username, password)` that each `PullImage` carried, in order (`None`: anonymous).
    pub fn pull_auths(&self) -> Vec<Option<(String, String)>> {
        self.inner.lock().pull_auths.clone()
    }

    /// How processes of containers with this metadata name react to `StopContainer`'s SIGTERM.
    /// May be set before the container exists.
    pub fn set_stop_behaviour(&self, container_name: &str, behaviour: StopBehaviour) {
        self.inner
            .lock()
            .stop_behaviours
            .insert(container_name.to_owned(), behaviour);
    }

    /// What `ExecSync` answers in containers with this metadata name (default: exit 0, no output).
    pub fn set_exec_result(&self, container_name: &str, exit_code: i32, stdout: &str) {
        self.inner.lock().exec_results.insert(
            container_name.to_owned(),
            cri::ExecSyncResponse {
                stdout: stdout.as_bytes().to_vec(),
                stderr: Vec::new(),
                exit_code,
            },
        );
    }

    /// `(container name, timeout)` of every `StopContainer` of a running container, in order.
    pub fn stops(&self) -> Vec<(String, i64)> {
        self.inner.lock().stops.clone()
    }

    /// Wire names of the RPCs received so far, in order, including those answered with an error.
    pub fn calls(&self) -> Vec<String> {
        self.inner.lock().calls.clone()
    }

    /// How many times `method` was called.
    pub fn call_count(&self, method: &str) -> usize {
        self.inner
            .lock()
            .calls
            .iter()
            .filter(|c| *c == method)
            .count()
    }

    /// Forgets the calls received so far.
    pub fn clear_calls(&self) {
        self.inner.lock().calls.clear();
    }

    /// The sandboxes not yet removed, oldest first.
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        self.inner.lock().sandboxes.clone()
    }

    /// The containers not yet removed, oldest first.
    pub fn containers(&self) -> Vec<FakeContainer> {
        self.inner.lock().containers.clone()
    }

    /// The newest container with this metadata name, if any.
    pub fn container_named(&self, name: &str) -> Option<FakeContainer> {
        self.inner
            .lock()
            .containers
            .iter()
            .rev()
            .find(|c| c.name() == name)
            .cloned()
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Routes each request to the service its path names. The workspace builds tonic without its
/// `router` feature (which would pull in axum), so the two services are joined by hand.
#[derive(Clone)]
struct BothServices {
    runtime: RuntimeServiceServer<Runtime>,
    images: ImageServiceServer<Images>,
}

impl tower::Service<http::Request<tonic::body::Body>> for BothServices {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request
            .uri()
            .path()
            .starts_with("/runtime.v1.ImageService/")
        {
            self.images.call(request)
        } else {
            self.runtime.call(request)
        }
    }
}

struct Runtime(Arc<Inner>);

struct Images(Arc<Inner>);

type RpcResult<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl RuntimeService for Runtime {
    async fn version(
        &self,
        _request: Request<cri::VersionRequest>,
    ) -> RpcResult<cri::VersionResponse> {
        self.0.enter("Version").await?;
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".to_owned(),
            runtime_name: RUNTIME_NAME.to_owned(),
            runtime_version: "1.6.20-fake".to_owned(),
            runtime_api_version: "v1".to_owned(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> RpcResult<cri::RunPodSandboxResponse> {
        self.0.enter("RunPodSandbox").await?;
        let request = request.into_inner();
        let Some(config) = request.config else {
            return Err(Status::invalid_argument("sandbox config must not be nil"));
        };
        let Some(metadata) = config.metadata.as_ref() else {
            return Err(Status::invalid_argument(
                "sandbox config must include metadata",
            ));
        };
        let name = sandbox_name(metadata);
        let mut state = self.0.lock();
        if let Some(owner) = state
            .sandboxes
            .iter()
            .find(|s| s.config.metadata.as_ref().map(sandbox_name).as_ref() == Some(&name))
        {
            return Err(Status::unknown(format!(
                "failed to reserve sandbox name \"{name}\": name \"{name}\" is reserved for \"{}\"",
                owner.id
            )));
        }
        let id = state.new_id();
        let host_network = namespace_network(&config) == cri::NamespaceMode::Node;
        if host_network && !config.hostname.is_empty() {
            return Err(Status::unknown(
                "failed to create containerd task: failed to create shim task: OCI runtime create \
                 failed: runc create failed: unable to set hostname without a private UTS \
                 namespace: unknown",
            ));
        }
        if !host_network && state.network_not_ready {
            return Err(Status::unknown(format!(
                "failed to setup network for sandbox \"{id}\": cni plugin not initialized"
            )));
        }
        let ip = if host_network {
            None
        } else {
            state.next_ip += 1;
            // host-local hands out .2 onwards: .1 is the bridge.
            let n = state.next_ip + 1;
            Some(format!("10.88.{}.{}", n / 256, n % 256))
        };
        let pid = state.new_pid();
        state.sandboxes.push(FakeSandbox {
            id: id.clone(),
            config,
            runtime_handler: request.runtime_handler,
            state: cri::PodSandboxState::SandboxReady,
            created_at: now_nanos(),
            ip,
            pid,
        });
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> RpcResult<cri::StopPodSandboxResponse> {
        self.0.enter("StopPodSandbox").await?;
        let mut state = self.0.lock();
        let index = state.sandbox(&request.into_inner().pod_sandbox_id)?;
        state.stop_sandbox(index);
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> RpcResult<cri::RemovePodSandboxResponse> {
        self.0.enter("RemovePodSandbox").await?;
        let mut state = self.0.lock();
        // containerd answers success for a sandbox it does not know.
        if let Some(index) = state.sandbox_index(&request.into_inner().pod_sandbox_id) {
            state.stop_sandbox(index);
            let sandbox = state.sandboxes.remove(index);
            state.containers.retain(|c| c.sandbox_id != sandbox.id);
        }
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> RpcResult<cri::PodSandboxStatusResponse> {
        self.0.enter("PodSandboxStatus").await?;
        let request = request.into_inner();
        let state = self.0.lock();
        // containerd 1.6 leaves the id out of this one message.
        let Some(index) = state.sandbox_index(&request.pod_sandbox_id) else {
            return Err(Status::not_found(
                "an error occurred when try to find sandbox: not found",
            ));
        };
        let sandbox = &state.sandboxes[index];
        let mut info = HashMap::new();
        if request.verbose {
            let details = serde_json::json!({
                "pid": sandbox.pid,
                "runtimeSpec": {
                    "linux": { "cgroupsPath": format!("{}/{}", sandbox.cgroup_parent(), sandbox.id) }
                },
            });
            info.insert("info".to_owned(), details.to_string());
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(sandbox.to_status()),
            info,
            containers_statuses: Vec::new(),
            timestamp: 0,
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> RpcResult<cri::ListPodSandboxResponse> {
        self.0.enter("ListPodSandbox").await?;
        let filter = request.into_inner().filter.unwrap_or_default();
        let state = self.0.lock();
        let by_id = (!filter.id.is_empty()).then(|| state.sandbox_index(&filter.id));
        let items = state
            .sandboxes
            .iter()
            .enumerate()
            .filter(|(index, _)| by_id.is_none_or(|found| found == Some(*index)))
            .map(|(_, s)| s)
            .filter(|s| filter.state.is_none_or(|want| want.state() == s.state))
            .filter(|s| labels_match(&s.config.labels, &filter.label_selector))
            .map(FakeSandbox::to_summary)
            .collect();
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> RpcResult<cri::CreateContainerResponse> {
        self.0.enter("CreateContainer").await?;
        let request = request.into_inner();
        let Some(config) = request.config else {
            return Err(Status::invalid_argument("container config must not be nil"));
        };
        let Some(metadata) = config.metadata.clone() else {
            return Err(Status::invalid_argument(
                "container config must include metadata",
            ));
        };
        let mut state = self.0.lock();
        let Some(index) = state.sandbox_index(&request.pod_sandbox_id) else {
            return Err(Status::not_found(format!(
                "failed to find sandbox id \"{}\": not found",
                request.pod_sandbox_id
            )));
        };
        let sandbox = state.sandboxes[index].clone();
        // containerd looks up the pause task, which a stopped sandbox no longer has.
        if sandbox.state != cri::PodSandboxState::SandboxReady {
            return Err(Status::not_found(format!(
                "failed to get sandbox container task: no running task found: task {} not found: not found",
                sandbox.id
            )));
        }
        let sandbox_metadata = sandbox.config.metadata.clone().unwrap_or_default();
        let name = container_name(&metadata, &sandbox_metadata);
        if let Some(owner) = state.containers.iter().find(|c| {
            c.sandbox_id == sandbox.id
                && c.name() == metadata.name
                && c.attempt() == metadata.attempt
        }) {
            return Err(Status::unknown(format!(
                "failed to reserve container name \"{name}\": name \"{name}\" is reserved for \"{}\"",
                owner.id
            )));
        }
        let wanted = config.image.as_ref().map_or("", |i| i.image.as_str());
        let Some(image) = state.resolve_image(wanted) else {
            return Err(Status::not_found(format!(
                "failed to resolve image \"{wanted}\": not found"
            )));
        };
        let id = state.new_id();
        let log_path = if config.log_path.is_empty() {
            String::new()
        } else {
            Path::new(&sandbox.config.log_directory)
                .join(&config.log_path)
                .display()
                .to_string()
        };
        state.containers.push(FakeContainer {
            cgroups_path: format!("{}/{id}", sandbox.cgroup_parent()),
            id: id.clone(),
            sandbox_id: sandbox.id,
            config,
            state: cri::ContainerState::ContainerCreated,
            created_at: now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path,
            image_id: image_id(&image),
            image,
            pid: 0,
        });
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> RpcResult<cri::StartContainerResponse> {
        self.0.enter("StartContainer").await?;
        let id = request.into_inner().container_id;
        let mut state = self.0.lock();
        let index = state.container(&id)?;
        let current = state.containers[index].state;
        if current != cri::ContainerState::ContainerCreated {
            return Err(Status::unknown(format!(
                "failed to set starting state for container \"{id}\": container is in {} state",
                current.as_str_name()
            )));
        }
        let sandbox_ready = state
            .sandbox_index(&state.containers[index].sandbox_id)
            .is_some_and(|s| state.sandboxes[s].state == cri::PodSandboxState::SandboxReady);
        if !sandbox_ready {
            return Err(Status::unknown(format!(
                "failed to start container \"{id}\": sandbox container \"{}\" is not running",
                state.containers[index].sandbox_id
            )));
        }
        let pid = state.new_pid();
        let container = &mut state.containers[index];
        container.state = cri::ContainerState::ContainerRunning;
        container.started_at = now_nanos();
        container.pid = pid;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> RpcResult<cri::StopContainerResponse> {
        self.0.enter("StopContainer").await?;
        let request = request.into_inner();
        let behaviour = {
            let mut state = self.0.lock();
            let container = &state.containers[state.container(&request.container_id)?];
            // Stopping a created or exited container is a no-op in containerd.
            if container.state != cri::ContainerState::ContainerRunning {
                return Ok(Response::new(cri::StopContainerResponse {}));
            }
            let name = container.name().to_owned();
            let behaviour = state
                .stop_behaviours
                .get(&name)
                .copied()
                .unwrap_or_default();
            state.stops.push((name, request.timeout));
            behaviour
        };
        let exit_code = match behaviour {
            _ if request.timeout <= 0 => EXIT_SIGKILL,
            StopBehaviour::KilledBySigterm => EXIT_SIGTERM,
            StopBehaviour::ExitsWith(code) => code,
            StopBehaviour::IgnoresSigterm => {
                let timeout = u64::try_from(request.timeout).unwrap_or(0);
                tokio::time::sleep(Duration::from_secs(timeout)).await;
                EXIT_SIGKILL
            }
        };
        let mut state = self.0.lock();
        // The container may have exited or been removed while the SIGTERM grace period ran.
        if let Some(index) = state.container_index(&request.container_id) {
            let container = &mut state.containers[index];
            if container.state == cri::ContainerState::ContainerRunning {
                container.finish(exit_code, exit_reason(exit_code));
            }
        }
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> RpcResult<cri::RemoveContainerResponse> {
        self.0.enter("RemoveContainer").await?;
        let mut state = self.0.lock();
        // containerd kills a running container (timeout 0) before removing it, and answers
        // success for a container it does not know.
        if let Some(index) = state.container_index(&request.into_inner().container_id) {
            state.containers.remove(index);
        }
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> RpcResult<cri::ListContainersResponse> {
        self.0.enter("ListContainers").await?;
        let filter = request.into_inner().filter.unwrap_or_default();
        let state = self.0.lock();
        let by_id = (!filter.id.is_empty()).then(|| state.container_index(&filter.id));
        let sandbox = (!filter.pod_sandbox_id.is_empty()).then(|| {
            state
                .sandbox_index(&filter.pod_sandbox_id)
                .map(|index| state.sandboxes[index].id.clone())
        });
        let containers = state
            .containers
            .iter()
            .enumerate()
            .filter(|(index, _)| by_id.is_none_or(|found| found == Some(*index)))
            .map(|(_, c)| c)
            .filter(|c| {
                sandbox
                    .as_ref()
                    .is_none_or(|found| found.as_deref() == Some(c.sandbox_id.as_str()))
            })
            .filter(|c| filter.state.is_none_or(|want| want.state() == c.state))
            .filter(|c| labels_match(&c.config.labels, &filter.label_selector))
            .map(FakeContainer::to_summary)
            .collect();
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> RpcResult<cri::ContainerStatusResponse> {
        self.0.enter("ContainerStatus").await?;
        let request = request.into_inner();
        let state = self.0.lock();
        let container = &state.containers[state.container(&request.container_id)?];
        let mut info = HashMap::new();
        if request.verbose {
            let details = serde_json::json!({
                "sandboxID": container.sandbox_id,
                "pid": container.pid,
                "runtimeSpec": { "linux": { "cgroupsPath": container.cgroups_path } },
            });
            info.insert("info".to_owned(), details.to_string());
        }
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(container.to_status()),
            info,
        }))
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> RpcResult<cri::ExecSyncResponse> {
        self.0.enter("ExecSync").await?;
        let request = request.into_inner();
        let state = self.0.lock();
        let container = &state.containers[state.container(&request.container_id)?];
        if container.state != cri::ContainerState::ContainerRunning {
            return Err(Status::unknown(format!(
                "failed to exec in container: container is in {} state",
                container.state.as_str_name()
            )));
        }
        Ok(Response::new(
            state
                .exec_results
                .get(container.name())
                .cloned()
                .unwrap_or_default(),
        ))
    }

    async fn status(
        &self,
        _request: Request<cri::StatusRequest>,
    ) -> RpcResult<cri::StatusResponse> {
        self.0.enter("Status").await?;
        let network_ready = !self.0.lock().network_not_ready;
        let network = if network_ready {
            cri::RuntimeCondition {
                r#type: "NetworkReady".to_owned(),
                status: true,
                reason: String::new(),
                message: String::new(),
            }
        } else {
            cri::RuntimeCondition {
                r#type: "NetworkReady".to_owned(),
                status: false,
                reason: "NetworkPluginNotReady".to_owned(),
                message: "Network plugin returns error: cni plugin not initialized".to_owned(),
            }
        };
        let runtime = cri::RuntimeCondition {
            r#type: "RuntimeReady".to_owned(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info: HashMap::new(),
        }))
    }
}

#[tonic::async_trait]
impl ImageService for Images {
    async fn list_images(
        &self,
        request: Request<cri::ListImagesRequest>,
    ) -> RpcResult<cri::ListImagesResponse> {
        self.0.enter("ListImages").await?;
        let wanted = request
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        let state = self.0.lock();
        let images = match wanted {
            Some(wanted) => state
                .resolve_image(&wanted)
                .map(|present| State::image(&present))
                .into_iter()
                .collect(),
            None => state.images.iter().map(|r| State::image(r)).collect(),
        };
        Ok(Response::new(cri::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> RpcResult<cri::ImageStatusResponse> {
        self.0.enter("ImageStatus").await?;
        let wanted = request
            .into_inner()
            .image
            .map(|i| i.image)
            .unwrap_or_default();
        let state = self.0.lock();
        Ok(Response::new(cri::ImageStatusResponse {
            image: state
                .resolve_image(&wanted)
                .map(|present| State::image(&present)),
            info: HashMap::new(),
        }))
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> RpcResult<cri::PullImageResponse> {
        self.0.enter("PullImage").await?;
        let request = request.into_inner();
        let wanted = request.image.map(|i| i.image).unwrap_or_default();
        let normalised = normalise_image(&wanted);
        let mut state = self.0.lock();
        state
            .pull_auths
            .push(request.auth.map(|a| (a.username, a.password)));
        if !state.pulls_enabled {
            let host = normalised.split('/').next().unwrap_or_default();
            let registry = if host == "docker.io" {
                "registry-1.docker.io"
            } else {
                host
            };
            return Err(Status::unknown(format!(
                "failed to pull and unpack image \"{normalised}\": failed to resolve reference \
                 \"{normalised}\": failed to do request: dial tcp: lookup {registry}: no such host"
            )));
        }
        state.images.insert(normalised.clone());
        Ok(Response::new(cri::PullImageResponse {
            image_ref: image_id(&normalised),
        }))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> RpcResult<cri::RemoveImageResponse> {
        self.0.enter("RemoveImage").await?;
        let wanted = request
            .into_inner()
            .image
            .map(|i| i.image)
            .unwrap_or_default();
        let mut state = self.0.lock();
        if let Some(present) = state.resolve_image(&wanted) {
            state.images.remove(&present);
        }
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    /// The fake keeps no image bytes anywhere; nothing the component tests check reads this.
    async fn image_fs_info(
        &self,
        _request: Request<cri::ImageFsInfoRequest>,
    ) -> RpcResult<cri::ImageFsInfoResponse> {
        self.0.enter("ImageFsInfo").await?;
        Err(Status::unimplemented("ImageFsInfo is not faked"))
    }
}
