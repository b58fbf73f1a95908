//! The `Runtime` trait (the kubelet's `kubecontainer.Runtime`) and the runtime's view of pods and
//! containers. Times are Unix nanoseconds as the CRI reports them; 0 means "not set".

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use super::{ContainerId, PodUid, SandboxId};

/// State of one container as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// State of one pod sandbox as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// What `GetPods` reports for a container: enough to diff, not the full status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningContainer {
    pub id: ContainerId,
    pub name: String,
    pub state: ContainerState,
    /// The kubelet's hash of the container spec, from the container's annotations.
    pub hash: String,
    pub created_at: i64,
}

/// What `GetPods` reports for a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningSandbox {
    pub id: SandboxId,
    pub state: SandboxState,
    pub created_at: i64,
}

/// A pod as the runtime groups its sandboxes and containers (by the pod-UID label).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningPod {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<RunningSandbox>,
    pub containers: Vec<RunningContainer>,
}

impl RunningPod {
    /// Whether the runtime has neither a sandbox nor a container of the pod here.
    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

/// Full status of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    pub id: SandboxId,
    pub state: SandboxState,
    pub created_at: i64,
    /// The sandbox's attempt counter (incremented each time the sandbox is re-created).
    pub attempt: u32,
    pub ip: Option<String>,
    pub host_network: bool,
}

/// Full status of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    pub id: ContainerId,
    pub name: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The image as the pod spec names it.
    pub image: String,
    /// The image id the runtime resolved it to.
    pub image_ref: String,
    pub hash: String,
    pub restart_count: u32,
    /// Runtime reason for the last exit, e.g. `OOMKilled`, `Error`, `Completed`.
    pub reason: String,
    pub message: String,
}

#[cfg(test)]
impl ContainerStatus {
    /// A container of the unit tests: created and started at 1, no exit, no image, no hash.
    pub(crate) fn for_test(id: &str, name: &str, state: ContainerState) -> Self {
        ContainerStatus {
            id: ContainerId::new(id),
            name: name.to_owned(),
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code: 0,
            image: String::new(),
            image_ref: String::new(),
            hash: String::new(),
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// Everything the runtime knows about one pod: the input to status generation and to `sync_pod`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodStatus {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    /// Pod IPs of the newest ready sandbox (empty for host-network pods).
    pub ips: Vec<String>,
    /// Newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Newest first; exited instances of a container follow its current one.
    pub containers: Vec<ContainerStatus>,
}

impl PodStatus {
    /// The newest status of the container with this name.
    pub fn container(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The runtime view of every sandbox and container of the pod (what a targeted relist diffs).
    pub fn to_running_pod(&self) -> RunningPod {
        RunningPod {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            sandboxes: self
                .sandboxes
                .iter()
                .map(|s| RunningSandbox {
                    id: s.id.clone(),
                    state: s.state,
                    created_at: s.created_at,
                })
                .collect(),
            containers: self
                .containers
                .iter()
                .map(|c| RunningContainer {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    state: c.state,
                    hash: c.hash.clone(),
                    created_at: c.created_at,
                })
                .collect(),
        }
    }

    /// The live part of the pod in the shape `Runtime::kill_pod` takes: ready sandboxes and
    /// containers that have not exited (stopping stopped objects again would only cost CRI calls).
    pub fn live_part(&self) -> RunningPod {
        let mut running = self.to_running_pod();
        running.sandboxes.retain(|s| s.state == SandboxState::Ready);
        running
            .containers
            .retain(|c| c.state != ContainerState::Exited);
        running
    }

    /// Whether any container of the pod is running.
    pub fn has_running_containers(&self) -> bool {
        self.containers
            .iter()
            .any(|c| c.state == ContainerState::Running)
    }
}

/// One runtime condition (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The runtime's `Status` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    fn condition(&self, kind: &str) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// `None` when the runtime is ready, otherwise why not.
    pub fn runtime_not_ready(&self) -> Option<String> {
        match self.condition("RuntimeReady") {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "container runtime not ready: RuntimeReady=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => Some("container runtime not ready: <nil>".to_owned()),
        }
    }

    /// `None` when pod networking is ready, otherwise why not.
    pub fn network_not_ready(&self) -> Option<String> {
        match self.condition("NetworkReady") {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "container runtime network not ready: NetworkReady=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => Some("container runtime network not ready: <nil>".to_owned()),
        }
    }
}

/// The step of a pod sync a result belongs to (the kubelet's `SyncAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncAction {
    CreatePodSandbox,
    KillPodSandbox,
    ConfigPodSandbox,
    InitContainer,
    StartContainer,
    KillContainer,
    /// New cgroup settings applied to running containers (the kubelet's `ResizePodInPlace`).
    ResizePodInPlace,
}

/// Where an in-place resize of a pod stands, as the runtime manager knows it (what the kubelet's
/// allocation manager and status manager keep about a resize).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodResize {
    /// The resources applied to each running container, as its spec wrote them when they were.
    pub actuated: HashMap<ContainerId, ResourceRequirements>,
    /// Why the spec's resources cannot be applied: the `PodResizePending` reason and message.
    pub pending: Option<(String, String)>,
    /// The error of the last attempt to apply them (`PodResizeInProgress` with reason `Error`).
    pub error: Option<String>,
}

/// Why a step failed, in the kubelet's waiting-reason vocabulary (`CrashLoopBackOff`,
/// `ErrImageNeverPull`, `ImagePullBackOff`, `CreateContainerError`, `RunContainerError`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncFailure {
    pub reason: String,
    pub message: String,
}

/// Outcome of one step; `target` is a container name or the sandbox id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncResult {
    pub action: SyncAction,
    pub target: String,
    pub failure: Option<SyncFailure>,
}

/// Outcome of `Runtime::sync_pod`: every step attempted, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSyncResult {
    pub results: Vec<SyncResult>,
}

impl PodSyncResult {
    /// The first failed step, if any; the pod worker retries after its back-off period.
    pub fn first_failure(&self) -> Option<(&SyncResult, &SyncFailure)> {
        self.results
            .iter()
            .find_map(|r| r.failure.as_ref().map(|f| (r, f)))
    }
}

/// One image as the runtime's `ListImages` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size_bytes: u64,
}

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime call {call} failed: {message}")]
    Call { call: &'static str, message: String },
    #[error("runtime call {call} timed out after {timeout_ms} ms")]
    Timeout { call: &'static str, timeout_ms: u64 },
    #[error("runtime is unavailable at {endpoint}: {message}")]
    Unavailable { endpoint: String, message: String },
    #[error("{what} {id} not found in the runtime")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    Other(String),
}

/// The container runtime as the agent uses it. One implementation talks CRI
/// (`kuberuntime::KubeGenericRuntimeManager`); tests substitute fakes.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// The runtime's name and version as a node reports it, e.g. `containerd://1.6.20`.
    async fn version(&self) -> Result<String, RuntimeError>;

    /// The images on the node.
    async fn list_images(&self) -> Result<Vec<ImageInfo>, RuntimeError>;

    /// `RuntimeReady` / `NetworkReady` conditions.
    async fn status(&self) -> Result<RuntimeStatus, RuntimeError>;

    /// Sandboxes and containers grouped by pod; `all` includes exited ones.
    async fn get_pods(&self, all: bool) -> Result<Vec<RunningPod>, RuntimeError>;

    /// Full status of one pod (sandboxes and containers, exited ones included).
    async fn get_pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeError>;

    /// Full status of one pod known only by its uid (a kernel hint names a pod the caller has not
    /// listed yet): found by the pod-uid label, so it costs what `get_pod_status` does, not a
    /// listing of every pod. The name and namespace come from the runtime's labels; `None` when the
    /// runtime has no sandbox or container of the pod.
    async fn get_pod_status_by_uid(&self, uid: &PodUid) -> Result<Option<PodStatus>, RuntimeError>;

    /// The pid (initial pid namespace) of a container's init as the runtime reports it (CRI
    /// verbose `ContainerStatus`); `None` when the runtime does not say.
    async fn container_init_pid(&self, id: &ContainerId) -> Result<Option<u32>, RuntimeError> {
        let _ = id;
        Ok(None)
    }

    /// The pid (initial pid namespace) of a sandbox's init as the runtime reports it (CRI verbose
    /// `PodSandboxStatus`); `None` when the runtime does not say.
    async fn sandbox_init_pid(&self, id: &SandboxId) -> Result<Option<u32>, RuntimeError> {
        let _ = id;
        Ok(None)
    }

    /// Moves the pod's sandbox and containers one step towards the spec (the kubelet's
    /// `kubeGenericRuntimeManager.SyncPod`).
    async fn sync_pod(&self, pod: &Pod, status: &PodStatus) -> PodSyncResult;

    /// Where an in-place resize of the pod stands; `None` when the runtime keeps no record of it
    /// (the containers then count as running with the spec's resources).
    fn pod_resize(&self, uid: &PodUid) -> Option<PodResize> {
        let _ = uid;
        None
    }

    /// Stops every container and the sandbox of a pod, with the pod's grace period unless overridden.
    async fn kill_pod(
        &self,
        pod: Option<&Pod>,
        running: &RunningPod,
        grace_period_override: Option<i64>,
    ) -> Result<(), RuntimeError>;

    /// Removes dead containers beyond `max_per_pod_container` for every pod, and every container and
    /// sandbox of pods not in `active_pods` that is no longer running.
    async fn garbage_collect(
        &self,
        max_per_pod_container: usize,
        active_pods: &HashSet<PodUid>,
    ) -> Result<(), RuntimeError>;
}
