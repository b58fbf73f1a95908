//! The CRI `RuntimeService` with containerd's answers (`pkg/cri/server` of containerd 1.6: the same
//! states, reasons, name reservations, idempotent stops and removals, and errors, `NotFound` for
//! unknown ids) over hollow containers: a start forks the container's process into its cgroup, a
//! stop signals it, and its exit (reaped by the server's reaper) is the container's exit. The
//! kubelet's caller is `pkg/kubelet/kuberuntime` through `cri-client`'s `remote_runtime.go`.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use nix::sys::signal::Signal;
use tonic::{Request, Response, Status};

use crate::cgroup::{self, CgroupError, ContainerCgroup, Driver, Hierarchies};
use crate::child::ChildArgs;
use crate::cri::v1 as cri;
use crate::cri::v1::runtime_service_server::RuntimeService;
use crate::image_ref::ImageRefError;
use crate::spawn;
use crate::state::{self, Container, Sandbox, Shared, unix_nanos};
use crate::stats::StatsContext;

/// The CRI API version the kubelet requires in `Version`.
const KUBE_API_VERSION: &str = "0.1.0";
/// What `Version` names the runtime; the agents prefix container ids with it.
pub const RUNTIME_NAME: &str = "ringlet-hollow";
/// Appended to the version so node status says what it is (`ringlet-hollow://0.1.0-scale-...`);
/// a semver pre-release, which the kubelet's version parser accepts.
const VERSION_SUFFIX: &str = "scale-harness-not-a-runtime";
/// containerd's log files: readable by the group, as the kubelet's log readers expect.
const LOG_FILE_MODE: u32 = 0o640;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("an error occurred when try to find container {id:?}: not found")]
    ContainerNotFound { id: String },
    #[error("an error occurred when try to find sandbox {id:?}: not found")]
    SandboxNotFound { id: String },
    /// containerd's `PodSandboxStatus` does not name the id.
    #[error("an error occurred when try to find sandbox: not found")]
    SandboxStatusNotFound,
    #[error("failed to find sandbox id {id:?}: not found")]
    CreateInUnknownSandbox { id: String },
    #[error("failed to get sandbox container task for {id:?}: not found")]
    CreateInStoppedSandbox { id: String },
    #[error("sandbox container {id:?} is not running")]
    SandboxNotRunning { id: String },
    #[error("sandbox config must include metadata")]
    NoSandboxMetadata,
    #[error("container config must include metadata")]
    NoContainerMetadata,
    #[error("the hollow runtime needs the sandbox's linux.cgroup_parent")]
    NoCgroupParent,
    #[error("failed to reserve sandbox name {name:?}: name {name:?} is reserved for {owner:?}")]
    SandboxNameReserved { name: String, owner: String },
    #[error("failed to reserve container name {name:?}: name {name:?} is reserved for {owner:?}")]
    ContainerNameReserved { name: String, owner: String },
    #[error("failed to resolve image {image:?}: not found")]
    ImageNotFound { image: String },
    #[error("failed to resolve image {image:?}")]
    InvalidImage {
        image: String,
        #[source]
        source: ImageRefError,
    },
    #[error("container is in {state} state")]
    WrongState { state: &'static str },
    #[error("container is not running")]
    NotRunning,
    #[error("failed to create and open log file {}", path.display())]
    LogFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to set up the container's cgroup")]
    Cgroup(#[source] CgroupError),
    #[error("failed to start the container's process")]
    Spawn(#[source] io::Error),
    #[error("failed to kill container {id:?}")]
    Kill {
        id: String,
        #[source]
        source: io::Error,
    },
    #[error("{call} is not supported by the hollow runtime (a scale harness, not a runtime)")]
    NotSupported { call: &'static str },
}

impl From<RuntimeError> for Status {
    fn from(e: RuntimeError) -> Self {
        let code = match &e {
            RuntimeError::ContainerNotFound { .. }
            | RuntimeError::SandboxNotFound { .. }
            | RuntimeError::SandboxStatusNotFound
            | RuntimeError::CreateInUnknownSandbox { .. }
            | RuntimeError::CreateInStoppedSandbox { .. }
            | RuntimeError::ImageNotFound { .. } => tonic::Code::NotFound,
            RuntimeError::NoCgroupParent => tonic::Code::InvalidArgument,
            RuntimeError::NotSupported { .. } => tonic::Code::Unimplemented,
            _ => tonic::Code::Unknown,
        };
        Status::new(code, error_chain(&e))
    }
}

/// `error: cause: cause`, as Go's wrapped errors read.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub struct HollowRuntime {
    pub state: Shared,
    pub hierarchies: Hierarchies,
    pub driver: Driver,
    /// Reported as the writable layers' filesystem.
    pub root: PathBuf,
    /// What containers run (`ringlet-hollow-child`).
    pub program: PathBuf,
}

/// The signal a stop sends first: the container's `stop_signal`, else SIGTERM (hollow images have
/// no `STOPSIGNAL`). Real-time signals, which have no fixed number, fall back to SIGTERM.
fn stop_signal(config: &cri::ContainerConfig) -> Signal {
    let Ok(requested) = cri::Signal::try_from(config.stop_signal) else {
        return Signal::SIGTERM;
    };
    let name = match requested {
        cri::Signal::RuntimeDefault => return Signal::SIGTERM,
        cri::Signal::Sigcld => "SIGCHLD",
        cri::Signal::Sigpoll => "SIGIO",
        cri::Signal::Sigiot => "SIGABRT",
        other => other.as_str_name(),
    };
    Signal::from_str(name).unwrap_or_else(|_| {
        tracing::warn!("stop signal {name} is not supported here; sending SIGTERM");
        Signal::SIGTERM
    })
}

fn open_log(path: &Path) -> Result<(), RuntimeError> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(LOG_FILE_MODE)
        .open(path)
        .map(drop)
        .map_err(|source| RuntimeError::LogFile {
            path: path.to_owned(),
            source,
        })
}

impl HollowRuntime {
    fn stats_context(&self) -> StatsContext<'_> {
        StatsContext {
            hierarchies: &self.hierarchies,
            driver: self.driver,
            root: &self.root,
            timestamp: unix_nanos(),
        }
    }

    /// Creates the log file, the cgroup and the process; undoes the cgroup on failure.
    fn start_process(
        &self,
        container: &Container,
        sandbox: &Sandbox,
    ) -> Result<(i32, ContainerCgroup), RuntimeError> {
        if let Some(path) = &container.log_path {
            open_log(path)?;
        }
        let relative = cgroup::parent_path(self.driver, sandbox.cgroup_parent())
            .map_err(RuntimeError::Cgroup)?
            .join(cgroup::container_leaf(self.driver, &container.id));
        let resources = container
            .config
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref());
        let cgroup = ContainerCgroup::create(&self.hierarchies, &relative, resources)
            .map_err(RuntimeError::Cgroup)?;
        let args = ChildArgs {
            log: container.log_path.clone(),
            tty: container.config.tty,
            words: container
                .config
                .command
                .iter()
                .chain(&container.config.args)
                .cloned()
                .collect(),
        };
        let spawned = cgroup
            .procs_files()
            .map_err(RuntimeError::Cgroup)
            .and_then(|procs| {
                spawn::spawn(&self.program, &args.to_args(), procs).map_err(RuntimeError::Spawn)
            });
        match spawned {
            Ok(pid) => Ok((pid, cgroup)),
            Err(e) => {
                if let Err(removing) = cgroup.remove() {
                    tracing::warn!(container = %container.id, "{removing}");
                }
                Err(e)
            }
        }
    }

    /// containerd's stop: nothing unless running; with a timeout, the stop signal (once) and a
    /// wait of up to `timeout`; then SIGKILL and a wait for the exit.
    async fn stop(&self, id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let exited = {
            let mut state = self.state.lock();
            let id = state
                .container_id(id)
                .ok_or_else(|| RuntimeError::ContainerNotFound { id: id.to_owned() })?;
            let Some(container) = state.containers.get_mut(&id) else {
                return Ok(());
            };
            let (cri::ContainerState::ContainerRunning, Some(pid)) =
                (container.state, container.pid)
            else {
                return Ok(());
            };
            if !timeout.is_zero() && !container.stop_signalled {
                container.stop_signalled = true;
                let signal = stop_signal(&container.config);
                tracing::debug!(container = %id, %signal, "stopping container");
                spawn::kill(pid, signal).map_err(|source| RuntimeError::Kill {
                    id: id.clone(),
                    source,
                })?;
            }
            container.wait_exit()
        };
        if !timeout.is_zero() && tokio::time::timeout(timeout, exited).await.is_ok() {
            return Ok(());
        }
        self.kill_and_wait(&[id.to_owned()]).await
    }

    /// SIGKILLs the running ones of `ids` and waits for their exits.
    async fn kill_and_wait(&self, ids: &[String]) -> Result<(), RuntimeError> {
        let waits = {
            let state = self.state.lock();
            let mut waits = Vec::new();
            for id in ids {
                let Some(id) = state.container_id(id) else {
                    continue;
                };
                let Some(container) = state.containers.get(&id) else {
                    continue;
                };
                if let (cri::ContainerState::ContainerRunning, Some(pid)) =
                    (container.state, container.pid)
                {
                    spawn::kill(pid, Signal::SIGKILL)
                        .map_err(|source| RuntimeError::Kill { id, source })?;
                    waits.push(container.wait_exit());
                }
            }
            waits
        };
        for exited in waits {
            exited.await;
        }
        Ok(())
    }

    /// containerd's `stopPodSandbox`: the sandbox is not ready, and every container of it is
    /// killed. Not ready first, so that no container of it starts meanwhile.
    async fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let containers: Vec<String> = {
            let mut state = self.state.lock();
            if let Some(sandbox) = state.sandboxes.get_mut(id) {
                sandbox.ready = false;
            }
            state.containers_of(id).map(|c| c.id.clone()).collect()
        };
        self.kill_and_wait(&containers).await
    }
}

fn image_of(spec: Option<&cri::ImageSpec>) -> &str {
    spec.map_or("", |s| s.image.as_str())
}

#[tonic::async_trait]
impl RuntimeService for HollowRuntime {
    async fn version(
        &self,
        _request: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(cri::VersionResponse {
            version: KUBE_API_VERSION.to_owned(),
            runtime_name: RUNTIME_NAME.to_owned(),
            runtime_version: format!("{}-{VERSION_SUFFIX}", env!("CARGO_PKG_VERSION")),
            runtime_api_version: "v1".to_owned(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        let request = request.into_inner();
        let config = request.config.unwrap_or_default();
        let metadata = config
            .metadata
            .as_ref()
            .ok_or(RuntimeError::NoSandboxMetadata)?;
        let parent = config
            .linux
            .as_ref()
            .map_or("", |l| l.cgroup_parent.as_str());
        if parent.is_empty() {
            return Err(RuntimeError::NoCgroupParent.into());
        }
        cgroup::parent_path(self.driver, parent).map_err(RuntimeError::Cgroup)?;
        let id = state::new_id();
        let name = state::sandbox_name(metadata);
        let mut state = self.state.lock();
        state.reserve_sandbox_name(&name, &id).map_err(|owner| {
            RuntimeError::SandboxNameReserved {
                name: name.clone(),
                owner,
            }
        })?;
        state.add_sandbox(Sandbox {
            id: id.clone(),
            name,
            config,
            runtime_handler: request.runtime_handler,
            ready: true,
            created_at: unix_nanos(),
        });
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        let requested = &request.get_ref().pod_sandbox_id;
        let id = self.state.lock().sandbox_id(requested).ok_or_else(|| {
            RuntimeError::SandboxNotFound {
                id: requested.clone(),
            }
        })?;
        self.stop_sandbox(&id).await?;
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        let Some(id) = self
            .state
            .lock()
            .sandbox_id(&request.get_ref().pod_sandbox_id)
        else {
            return Ok(Response::new(cri::RemovePodSandboxResponse {}));
        };
        self.stop_sandbox(&id).await?;
        let mut state = self.state.lock();
        let containers: Vec<String> = state.containers_of(&id).map(|c| c.id.clone()).collect();
        for container in containers {
            state.remove_container(&container);
        }
        state.remove_sandbox(&id);
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        let request = request.into_inner();
        let state = self.state.lock();
        let sandbox = state
            .sandbox_id(&request.pod_sandbox_id)
            .and_then(|id| state.sandboxes.get(&id))
            .ok_or(RuntimeError::SandboxStatusNotFound)?;
        let mut info = std::collections::HashMap::new();
        if request.verbose {
            // No "pid": a hollow sandbox has no process.
            let verbose = serde_json::json!({
                "runtimeHandler": sandbox.runtime_handler,
                "runtimeType": RUNTIME_NAME,
                "cgroupParent": sandbox.cgroup_parent(),
            });
            info.insert("info".to_owned(), verbose.to_string());
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(sandbox.status()),
            info,
            containers_statuses: Vec::new(),
            timestamp: 0,
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        let items = self
            .state
            .lock()
            .list_sandboxes(request.get_ref().filter.as_ref());
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        let request = request.into_inner();
        let config = request.config.unwrap_or_default();
        let metadata = config
            .metadata
            .as_ref()
            .ok_or(RuntimeError::NoContainerMetadata)?;
        let mut state = self.state.lock();
        let sandbox = state
            .sandbox_id(&request.pod_sandbox_id)
            .and_then(|id| state.sandboxes.get(&id))
            .ok_or_else(|| RuntimeError::CreateInUnknownSandbox {
                id: request.pod_sandbox_id.clone(),
            })?;
        if !sandbox.ready {
            return Err(RuntimeError::CreateInStoppedSandbox {
                id: sandbox.id.clone(),
            }
            .into());
        }
        let sandbox_id = sandbox.id.clone();
        let sandbox_metadata = request
            .sandbox_config
            .as_ref()
            .and_then(|c| c.metadata.clone())
            .unwrap_or_else(|| sandbox.metadata());
        let log_directory = request
            .sandbox_config
            .as_ref()
            .map_or(sandbox.config.log_directory.as_str(), |c| {
                c.log_directory.as_str()
            });
        // Like containerd, no log file without both a directory and a path.
        let log_path = (!log_directory.is_empty() && !config.log_path.is_empty())
            .then(|| Path::new(log_directory).join(&config.log_path));
        let image = image_of(config.image.as_ref());
        let image_id = match state.images.resolve(image) {
            Ok(Some(found)) => found.id.clone(),
            Ok(None) => {
                return Err(RuntimeError::ImageNotFound {
                    image: image.to_owned(),
                }
                .into());
            }
            Err(source) => {
                return Err(RuntimeError::InvalidImage {
                    image: image.to_owned(),
                    source,
                }
                .into());
            }
        };
        let id = state::new_id();
        let name = state::container_name(metadata, &sandbox_metadata);
        state.reserve_container_name(&name, &id).map_err(|owner| {
            RuntimeError::ContainerNameReserved {
                name: name.clone(),
                owner,
            }
        })?;
        state.add_container(Container::new(
            id.clone(),
            sandbox_id,
            name,
            config,
            log_path,
            image_id,
        ));
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        let requested = &request.get_ref().container_id;
        let mut state = self.state.lock();
        let container = state
            .container_id(requested)
            .and_then(|id| state.containers.get(&id))
            .ok_or_else(|| RuntimeError::ContainerNotFound {
                id: requested.clone(),
            })?;
        if container.state != cri::ContainerState::ContainerCreated {
            return Err(RuntimeError::WrongState {
                state: container.state.as_str_name(),
            }
            .into());
        }
        let id = container.id.clone();
        let started = match state.sandboxes.get(&container.sandbox_id) {
            None => Err(RuntimeError::SandboxNotFound {
                id: container.sandbox_id.clone(),
            }),
            Some(sandbox) if !sandbox.ready => Err(RuntimeError::SandboxNotRunning {
                id: sandbox.id.clone(),
            }),
            Some(sandbox) => self.start_process(container, sandbox),
        };
        match started {
            Ok((pid, cgroup)) => {
                state.started(&id, pid, cgroup);
                Ok(Response::new(cri::StartContainerResponse {}))
            }
            Err(e) => {
                if let Some(container) = state.containers.get_mut(&id) {
                    container.start_failed(error_chain(&e));
                }
                Err(e.into())
            }
        }
    }

    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        let request = request.into_inner();
        let timeout = Duration::from_secs(u64::try_from(request.timeout).unwrap_or(0));
        self.stop(&request.container_id, timeout).await?;
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        let Some(id) = self
            .state
            .lock()
            .container_id(&request.get_ref().container_id)
        else {
            return Ok(Response::new(cri::RemoveContainerResponse {}));
        };
        // containerd stops a running container forcibly first; again if a start came in between.
        loop {
            self.kill_and_wait(std::slice::from_ref(&id)).await?;
            let mut state = self.state.lock();
            let running = state
                .containers
                .get(&id)
                .is_some_and(|c| c.state == cri::ContainerState::ContainerRunning);
            if !running {
                state.remove_container(&id);
                return Ok(Response::new(cri::RemoveContainerResponse {}));
            }
        }
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        let containers = self
            .state
            .lock()
            .list_containers(request.get_ref().filter.as_ref());
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        let request = request.into_inner();
        let state = self.state.lock();
        let container = state
            .container_id(&request.container_id)
            .and_then(|id| state.containers.get(&id))
            .ok_or_else(|| RuntimeError::ContainerNotFound {
                id: request.container_id.clone(),
            })?;
        let mut info = std::collections::HashMap::new();
        if request.verbose {
            let verbose = serde_json::json!({
                "sandboxID": container.sandbox_id,
                "pid": container.pid.unwrap_or(0),
                "removing": false,
                "runtimeType": RUNTIME_NAME,
                "cgroup": container.cgroup.as_ref().map(|c| c.relative().display().to_string()),
            });
            info.insert("info".to_owned(), verbose.to_string());
        }
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(state.container_status(container)),
            info,
        }))
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        let requested = &request.get_ref().container_id;
        if self.state.lock().container_id(requested).is_none() {
            return Err(RuntimeError::ContainerNotFound {
                id: requested.clone(),
            }
            .into());
        }
        Err(RuntimeError::NotSupported { call: "ExecSync" }.into())
    }

    async fn reopen_container_log(
        &self,
        request: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        let requested = &request.get_ref().container_id;
        let state = self.state.lock();
        let container = state
            .container_id(requested)
            .and_then(|id| state.containers.get(&id))
            .ok_or_else(|| RuntimeError::ContainerNotFound {
                id: requested.clone(),
            })?;
        if container.state != cri::ContainerState::ContainerRunning {
            return Err(RuntimeError::NotRunning.into());
        }
        // The process opens the path for every line, so the new file is all it takes.
        if let Some(path) = &container.log_path {
            open_log(path)?;
        }
        Ok(Response::new(cri::ReopenContainerLogResponse {}))
    }

    async fn status(
        &self,
        request: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        let condition = |kind: &str| cri::RuntimeCondition {
            r#type: kind.to_owned(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        let mut info = std::collections::HashMap::new();
        if request.get_ref().verbose {
            let config = serde_json::json!({
                "harness": "ringlet-hollow is a scale harness, not a container runtime",
                "cgroupDriver": format!("{:?}", self.driver).to_lowercase(),
                "root": self.root,
            });
            info.insert("config".to_owned(), config.to_string());
        }
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![condition("RuntimeReady"), condition("NetworkReady")],
            }),
            info,
        }))
    }

    async fn container_stats(
        &self,
        request: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        let requested = &request.get_ref().container_id;
        let state = self.state.lock();
        let container = state
            .container_id(requested)
            .and_then(|id| state.containers.get(&id))
            .ok_or_else(|| RuntimeError::ContainerNotFound {
                id: requested.clone(),
            })?;
        Ok(Response::new(cri::ContainerStatsResponse {
            stats: Some(self.stats_context().container(container)),
        }))
    }

    async fn list_container_stats(
        &self,
        request: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        let store = self.state.lock();
        let context = self.stats_context();
        let stats = store
            .containers_for_stats(request.get_ref().filter.as_ref())
            .into_iter()
            .map(|c| context.container(c))
            .collect();
        Ok(Response::new(cri::ListContainerStatsResponse { stats }))
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        let requested = &request.get_ref().pod_sandbox_id;
        let state = self.state.lock();
        let sandbox = state
            .sandbox_id(requested)
            .and_then(|id| state.sandboxes.get(&id))
            .ok_or_else(|| RuntimeError::SandboxNotFound {
                id: requested.clone(),
            })?;
        let context = self.stats_context();
        let containers = state
            .containers_of(&sandbox.id)
            .map(|c| context.container(c))
            .collect();
        Ok(Response::new(cri::PodSandboxStatsResponse {
            stats: Some(context.sandbox(sandbox, containers)),
        }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        let store = self.state.lock();
        let context = self.stats_context();
        let stats = store
            .sandboxes_for_stats(request.get_ref().filter.as_ref())
            .into_iter()
            .map(|sandbox| {
                let containers = store
                    .containers_of(&sandbox.id)
                    .map(|c| context.container(c))
                    .collect();
                context.sandbox(sandbox, containers)
            })
            .collect();
        Ok(Response::new(cri::ListPodSandboxStatsResponse { stats }))
    }

    /// Accepted and ignored: there is no network to configure.
    async fn update_runtime_config(
        &self,
        request: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        let pod_cidr = request
            .get_ref()
            .runtime_config
            .as_ref()
            .and_then(|c| c.network_config.as_ref())
            .map_or("", |n| n.pod_cidr.as_str());
        tracing::info!(pod_cidr, "runtime config update ignored (no network)");
        Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
    }

    /// A stream that stays open and sends nothing: the hollow runtime publishes no events (the
    /// kubelet's evented PLEG then relies on its relist).
    async fn get_container_events(
        &self,
        _request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<cri::ContainerEventResponse>>, Status> {
        Ok(Response::new(Box::pin(tokio_stream::pending())))
    }

    async fn list_metric_descriptors(
        &self,
        _request: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        Ok(Response::new(cri::ListMetricDescriptorsResponse::default()))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _request: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        Ok(Response::new(cri::ListPodSandboxMetricsResponse::default()))
    }

    async fn runtime_config(
        &self,
        _request: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        let cgroup_driver = match self.driver {
            Driver::Systemd => cri::CgroupDriver::Systemd,
            Driver::Cgroupfs => cri::CgroupDriver::Cgroupfs,
        };
        Ok(Response::new(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: cgroup_driver as i32,
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_follow_the_config() {
        let config = |signal: cri::Signal| cri::ContainerConfig {
            stop_signal: signal as i32,
            ..Default::default()
        };
        assert_eq!(
            stop_signal(&config(cri::Signal::RuntimeDefault)),
            Signal::SIGTERM
        );
        assert_eq!(stop_signal(&config(cri::Signal::Sigquit)), Signal::SIGQUIT);
        assert_eq!(stop_signal(&config(cri::Signal::Sigusr1)), Signal::SIGUSR1);
        assert_eq!(stop_signal(&config(cri::Signal::Sigcld)), Signal::SIGCHLD);
        assert_eq!(stop_signal(&config(cri::Signal::Sigiot)), Signal::SIGABRT);
        assert_eq!(stop_signal(&config(cri::Signal::Sigrtmin)), Signal::SIGTERM);
        let unknown = cri::ContainerConfig {
            stop_signal: 1000,
            ..Default::default()
        };
        assert_eq!(stop_signal(&unknown), Signal::SIGTERM);
    }

    #[test]
    fn errors_carry_containerd_s_codes() {
        let status = Status::from(RuntimeError::ContainerNotFound {
            id: "abc".to_owned(),
        });
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(
            status.message(),
            "an error occurred when try to find container \"abc\": not found"
        );
        let status = Status::from(RuntimeError::NotSupported { call: "ExecSync" });
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(
            status
                .message()
                .contains("not supported by the hollow runtime")
        );
        let status = Status::from(RuntimeError::Spawn(io::Error::from_raw_os_error(2)));
        assert_eq!(status.code(), tonic::Code::Unknown);
        assert!(
            status
                .message()
                .starts_with("failed to start the container's process: No such file"),
            "{}",
            status.message()
        );
    }
}
