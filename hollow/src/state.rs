//! The runtime's in-memory state: sandboxes, containers, reserved names and images, and how each
//! reads as a CRI message (containerd's `pkg/cri/store` and its `toCRI*` conversions; the kubelet
//! reads these through `pkg/kubelet/kuberuntime`). Nothing is persisted: a restart forgets all.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use crate::cgroup::ContainerCgroup;
use crate::cri::v1 as cri;
use crate::image_service::Images;

/// containerd's reasons for an exited container, and for one that failed to start.
pub const REASON_COMPLETED: &str = "Completed";
pub const REASON_ERROR: &str = "Error";
pub const REASON_START_ERROR: &str = "StartError";
/// The exit code containerd gives a container that failed to start.
pub const START_ERROR_EXIT_CODE: i32 = 128;

/// The state, shared by the services and the reaper. Every change to a container's process (its
/// spawn, its reaping) happens under this one lock, so a pid is never signalled after its reaping.
#[derive(Clone, Default)]
pub struct Shared(Arc<Mutex<Store>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic under the lock leaves maps that are still consistent enough to serve.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
pub struct Store {
    pub sandboxes: BTreeMap<String, Sandbox>,
    pub containers: BTreeMap<String, Container>,
    pub images: Images,
    /// Running containers by pid.
    by_pid: HashMap<i32, String>,
    /// Reserved sandbox and container names → their ids (containerd's two name indexes).
    sandbox_names: HashMap<String, String>,
    container_names: HashMap<String, String>,
}

pub struct Sandbox {
    pub id: String,
    pub name: String,
    pub config: cri::PodSandboxConfig,
    pub runtime_handler: String,
    pub ready: bool,
    pub created_at: i64,
}

pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    /// Without its environment, which nothing reads back.
    pub config: cri::ContainerConfig,
    pub log_path: Option<PathBuf>,
    pub image_id: String,
    pub state: cri::ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub pid: Option<i32>,
    pub cgroup: Option<ContainerCgroup>,
    /// A stop with a timeout already sent the stop signal (containerd sends it once).
    pub stop_signalled: bool,
    exited: watch::Sender<bool>,
}

/// Unix nanoseconds now.
pub fn unix_nanos() -> i64 {
    i64::try_from(jiff::Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

/// A new 64-hex-digit id, as containerd generates them.
pub fn new_id() -> String {
    (0..4).fold(String::with_capacity(64), |mut id, _| {
        let _ = write!(id, "{:016x}", fastrand::u64(..));
        id
    })
}

/// The id `id` names: itself, or the only id it is a prefix of (containerd accepts truncated ids).
fn resolve<'a, V>(map: &'a BTreeMap<String, V>, id: &str) -> Option<&'a str> {
    if id.is_empty() {
        return None;
    }
    if let Some((key, _)) = map.get_key_value(id) {
        return Some(key);
    }
    let mut matches = map
        .range(id.to_owned()..)
        .take_while(|(key, _)| key.starts_with(id));
    match (matches.next(), matches.next()) {
        (Some((key, _)), None) => Some(key),
        _ => None,
    }
}

fn labels_match(
    selector: &std::collections::HashMap<String, String>,
    labels: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// containerd's sandbox name: `<name>_<namespace>_<uid>_<attempt>`.
pub fn sandbox_name(metadata: &cri::PodSandboxMetadata) -> String {
    format!(
        "{}_{}_{}_{}",
        metadata.name, metadata.namespace, metadata.uid, metadata.attempt
    )
}

/// containerd's container name: `<container>_<pod>_<namespace>_<uid>_<attempt>`.
pub fn container_name(
    container: &cri::ContainerMetadata,
    sandbox: &cri::PodSandboxMetadata,
) -> String {
    format!(
        "{}_{}_{}_{}_{}",
        container.name, sandbox.name, sandbox.namespace, sandbox.uid, container.attempt
    )
}

impl Store {
    pub fn sandbox_id(&self, id: &str) -> Option<String> {
        resolve(&self.sandboxes, id).map(str::to_owned)
    }

    pub fn container_id(&self, id: &str) -> Option<String> {
        resolve(&self.containers, id).map(str::to_owned)
    }

    /// Reserves a sandbox name; `Err` holds the id that has it.
    pub fn reserve_sandbox_name(&mut self, name: &str, id: &str) -> Result<(), String> {
        reserve(&mut self.sandbox_names, name, id)
    }

    pub fn reserve_container_name(&mut self, name: &str, id: &str) -> Result<(), String> {
        reserve(&mut self.container_names, name, id)
    }

    pub fn add_sandbox(&mut self, sandbox: Sandbox) {
        self.sandboxes.insert(sandbox.id.clone(), sandbox);
    }

    pub fn add_container(&mut self, container: Container) {
        self.containers.insert(container.id.clone(), container);
    }

    pub fn remove_sandbox(&mut self, id: &str) {
        if let Some(sandbox) = self.sandboxes.remove(id) {
            self.sandbox_names.remove(&sandbox.name);
        }
    }

    pub fn remove_container(&mut self, id: &str) {
        let Some(container) = self.containers.remove(id) else {
            return;
        };
        self.container_names.remove(&container.name);
        if let Some(pid) = container.pid {
            self.by_pid.remove(&pid);
        }
    }

    /// Records that the container's process started.
    pub fn started(&mut self, id: &str, pid: i32, cgroup: ContainerCgroup) {
        if let Some(container) = self.containers.get_mut(id) {
            container.state = cri::ContainerState::ContainerRunning;
            container.started_at = unix_nanos();
            container.pid = Some(pid);
            container.cgroup = Some(cgroup);
            self.by_pid.insert(pid, id.to_owned());
        }
    }

    /// Records a process's exit: the container is exited with `code`, its cgroup removed (as
    /// containerd deletes the task once it exits), and stops waiting for it return.
    pub fn exited(&mut self, pid: i32, code: i32) {
        let Some(id) = self.by_pid.remove(&pid) else {
            return;
        };
        let Some(container) = self.containers.get_mut(&id) else {
            return;
        };
        container.state = cri::ContainerState::ContainerExited;
        container.finished_at = unix_nanos();
        container.exit_code = code;
        container.pid = None;
        if let Some(cgroup) = container.cgroup.take()
            && let Err(e) = cgroup.remove()
        {
            tracing::warn!(container = %id, "{e}");
        }
        container.exited.send_replace(true);
    }

    /// Containers of a sandbox.
    pub fn containers_of<'a>(&'a self, sandbox_id: &'a str) -> impl Iterator<Item = &'a Container> {
        self.containers
            .values()
            .filter(move |c| c.sandbox_id == sandbox_id)
    }

    pub fn list_sandboxes(&self, filter: Option<&cri::PodSandboxFilter>) -> Vec<cri::PodSandbox> {
        let id = filter.map(|f| self.sandbox_id(&f.id).unwrap_or_else(|| f.id.clone()));
        self.sandboxes
            .values()
            .filter(|s| {
                let Some(filter) = filter else { return true };
                id.as_deref().is_none_or(|id| id.is_empty() || *id == s.id)
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|want| want.state == s.state() as i32)
                    && labels_match(&filter.label_selector, &s.config.labels)
            })
            .map(Sandbox::to_cri)
            .collect()
    }

    pub fn list_containers(&self, filter: Option<&cri::ContainerFilter>) -> Vec<cri::Container> {
        let id = filter.map(|f| self.container_id(&f.id).unwrap_or_else(|| f.id.clone()));
        let sandbox = filter.map(|f| {
            self.sandbox_id(&f.pod_sandbox_id)
                .unwrap_or_else(|| f.pod_sandbox_id.clone())
        });
        self.containers
            .values()
            .filter(|c| {
                let Some(filter) = filter else { return true };
                id.as_deref().is_none_or(|id| id.is_empty() || *id == c.id)
                    && sandbox
                        .as_deref()
                        .is_none_or(|id| id.is_empty() || *id == c.sandbox_id)
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|want| want.state == c.state as i32)
                    && labels_match(&filter.label_selector, &c.config.labels)
            })
            .map(Container::to_cri)
            .collect()
    }

    /// Containers matching a stats filter (id, sandbox and labels, like `ListContainers`).
    pub fn containers_for_stats(
        &self,
        filter: Option<&crate::cri::v1::ContainerStatsFilter>,
    ) -> Vec<&Container> {
        let id = filter.map(|f| self.container_id(&f.id).unwrap_or_else(|| f.id.clone()));
        let sandbox = filter.map(|f| {
            self.sandbox_id(&f.pod_sandbox_id)
                .unwrap_or_else(|| f.pod_sandbox_id.clone())
        });
        self.containers
            .values()
            .filter(|c| {
                let Some(filter) = filter else { return true };
                id.as_deref().is_none_or(|id| id.is_empty() || *id == c.id)
                    && sandbox
                        .as_deref()
                        .is_none_or(|id| id.is_empty() || *id == c.sandbox_id)
                    && labels_match(&filter.label_selector, &c.config.labels)
            })
            .collect()
    }

    /// Ready sandboxes matching a stats filter (containerd has no stats for the others).
    pub fn sandboxes_for_stats(
        &self,
        filter: Option<&cri::PodSandboxStatsFilter>,
    ) -> Vec<&Sandbox> {
        let id = filter.map(|f| self.sandbox_id(&f.id).unwrap_or_else(|| f.id.clone()));
        self.sandboxes
            .values()
            .filter(|s| {
                s.ready
                    && filter.is_none_or(|filter| {
                        id.as_deref().is_none_or(|id| id.is_empty() || *id == s.id)
                            && labels_match(&filter.label_selector, &s.config.labels)
                    })
            })
            .collect()
    }

    /// The status containerd reports: the image as its first tag and the reference as its first
    /// repo digest when the image is known, start and finish times only in the states that have
    /// them, and "Completed" / "Error" for an exit without another reason.
    pub fn container_status(&self, container: &Container) -> cri::ContainerStatus {
        let image = self.images.get(&container.image_id);
        let spec = image
            .and_then(|i| i.repo_tags.first())
            .map(|tag| cri::ImageSpec {
                image: tag.clone(),
                ..Default::default()
            })
            .or_else(|| container.config.image.clone());
        let image_ref = image
            .and_then(|i| i.repo_digests.first().cloned())
            .unwrap_or_else(|| container.image_id.clone());
        let state = container.state;
        let mut reason = container.reason.clone();
        if state == cri::ContainerState::ContainerExited && reason.is_empty() {
            if container.exit_code == 0 {
                REASON_COMPLETED
            } else {
                REASON_ERROR
            }
            .clone_into(&mut reason);
        }
        let (started_at, finished_at) = match state {
            cri::ContainerState::ContainerRunning => (container.started_at, 0),
            cri::ContainerState::ContainerExited | cri::ContainerState::ContainerUnknown => {
                (container.started_at, container.finished_at)
            }
            cri::ContainerState::ContainerCreated => (0, 0),
        };
        cri::ContainerStatus {
            id: container.id.clone(),
            metadata: container.config.metadata.clone(),
            state: state as i32,
            created_at: container.created_at,
            started_at,
            finished_at,
            exit_code: container.exit_code,
            image: spec,
            image_ref,
            reason,
            message: container.message.clone(),
            labels: container.config.labels.clone(),
            annotations: container.config.annotations.clone(),
            mounts: container.config.mounts.clone(),
            log_path: container
                .log_path
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            resources: container
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|linux| cri::ContainerResources { linux: Some(linux) }),
            image_id: container.image_id.clone(),
        }
    }
}

fn reserve(names: &mut HashMap<String, String>, name: &str, id: &str) -> Result<(), String> {
    if let Some(owner) = names.get(name) {
        return Err(owner.clone());
    }
    names.insert(name.to_owned(), id.to_owned());
    Ok(())
}

impl Sandbox {
    pub fn state(&self) -> cri::PodSandboxState {
        if self.ready {
            cri::PodSandboxState::SandboxReady
        } else {
            cri::PodSandboxState::SandboxNotready
        }
    }

    pub fn metadata(&self) -> cri::PodSandboxMetadata {
        self.config.metadata.clone().unwrap_or_default()
    }

    /// The `cgroup_parent` the agent gave.
    pub fn cgroup_parent(&self) -> &str {
        self.config
            .linux
            .as_ref()
            .map_or("", |l| l.cgroup_parent.as_str())
    }

    fn namespace_options(&self) -> cri::NamespaceOption {
        self.config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default()
    }

    fn to_cri(&self) -> cri::PodSandbox {
        cri::PodSandbox {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state() as i32,
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    /// containerd's status: the namespaces the config asked for, and no IP (the hollow runtime
    /// has no network; the agent reports the host's IP for host-network pods as it does anyway).
    pub fn status(&self) -> cri::PodSandboxStatus {
        let options = self.namespace_options();
        cri::PodSandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state() as i32,
            created_at: self.created_at,
            network: Some(cri::PodSandboxNetworkStatus::default()),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: Some(cri::NamespaceOption {
                        network: options.network,
                        pid: options.pid,
                        ipc: options.ipc,
                        target_id: String::new(),
                    }),
                }),
            }),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }
}

impl Container {
    /// A created container.
    pub fn new(
        id: String,
        sandbox_id: String,
        name: String,
        mut config: cri::ContainerConfig,
        log_path: Option<PathBuf>,
        image_id: String,
    ) -> Self {
        config.envs.clear();
        Self {
            id,
            sandbox_id,
            name,
            config,
            log_path,
            image_id,
            state: cri::ContainerState::ContainerCreated,
            created_at: unix_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: None,
            cgroup: None,
            stop_signalled: false,
            exited: watch::Sender::new(false),
        }
    }

    /// Resolves once the container's process has exited (at once if it has).
    pub fn wait_exit(&self) -> impl Future<Output = ()> + use<> {
        let mut exited = self.exited.subscribe();
        async move {
            // An error means the container was removed, which only happens after its exit.
            let _ = exited.wait_for(|exited| *exited).await;
        }
    }

    /// Marks a failed start as containerd does: exited with code 128, reason `StartError`.
    pub fn start_failed(&mut self, message: String) {
        self.state = cri::ContainerState::ContainerExited;
        self.finished_at = unix_nanos();
        self.exit_code = START_ERROR_EXIT_CODE;
        REASON_START_ERROR.clone_into(&mut self.reason);
        self.message = message;
        self.exited.send_replace(true);
    }

    fn to_cri(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.config.image.clone(),
            image_ref: self.image_id.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            image_id: self.image_id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, ready: bool, app: &str) -> Sandbox {
        Sandbox {
            id: id.to_owned(),
            name: format!("name-{id}"),
            config: cri::PodSandboxConfig {
                labels: [("app".to_owned(), app.to_owned())].into(),
                ..Default::default()
            },
            runtime_handler: String::new(),
            ready,
            created_at: 1,
        }
    }

    fn container(id: &str, sandbox: &str, state: cri::ContainerState) -> Container {
        let mut c = Container::new(
            id.to_owned(),
            sandbox.to_owned(),
            format!("name-{id}"),
            cri::ContainerConfig {
                labels: [("c".to_owned(), id.to_owned())].into(),
                envs: vec![cri::KeyValue::default()],
                ..Default::default()
            },
            None,
            "sha256:image".to_owned(),
        );
        c.state = state;
        c
    }

    #[test]
    fn ids_resolve_from_unique_prefixes() {
        let mut store = Store::default();
        store.add_sandbox(sandbox("abc1", true, "a"));
        store.add_sandbox(sandbox("abc2", true, "a"));
        store.add_sandbox(sandbox("abd", true, "a"));
        assert_eq!(store.sandbox_id("abc1").as_deref(), Some("abc1"));
        assert_eq!(store.sandbox_id("abd").as_deref(), Some("abd"));
        assert_eq!(store.sandbox_id("abc"), None, "ambiguous");
        assert_eq!(store.sandbox_id("ab"), None, "ambiguous");
        assert_eq!(store.sandbox_id("abc2").as_deref(), Some("abc2"));
        assert_eq!(store.sandbox_id("x"), None);
        assert_eq!(store.sandbox_id(""), None);
    }

    #[test]
    fn names_are_reserved_until_removal() {
        let mut store = Store::default();
        assert_eq!(store.reserve_sandbox_name("p_ns_uid_0", "s1"), Ok(()));
        assert_eq!(
            store.reserve_sandbox_name("p_ns_uid_0", "s2"),
            Err("s1".to_owned())
        );
        let mut s = sandbox("s1", true, "a");
        s.name = "p_ns_uid_0".to_owned();
        store.add_sandbox(s);
        store.remove_sandbox("s1");
        assert_eq!(store.reserve_sandbox_name("p_ns_uid_0", "s2"), Ok(()));
    }

    #[test]
    fn filters_combine_with_and() {
        let mut store = Store::default();
        store.add_sandbox(sandbox("s1", true, "a"));
        store.add_sandbox(sandbox("s2", false, "b"));
        store.add_container(container("c1", "s1", cri::ContainerState::ContainerRunning));
        store.add_container(container("c2", "s1", cri::ContainerState::ContainerExited));
        store.add_container(container("c3", "s2", cri::ContainerState::ContainerRunning));
        let ids = |filter: cri::ContainerFilter| -> Vec<String> {
            store
                .list_containers(Some(&filter))
                .into_iter()
                .map(|c| c.id)
                .collect()
        };
        assert_eq!(store.list_containers(None).len(), 3);
        assert_eq!(
            ids(cri::ContainerFilter {
                pod_sandbox_id: "s1".to_owned(),
                ..Default::default()
            }),
            ["c1", "c2"]
        );
        assert_eq!(
            ids(cri::ContainerFilter {
                state: Some(cri::ContainerStateValue { state: 1 }),
                ..Default::default()
            }),
            ["c1", "c3"]
        );
        assert_eq!(
            ids(cri::ContainerFilter {
                pod_sandbox_id: "s2".to_owned(),
                state: Some(cri::ContainerStateValue { state: 2 }),
                ..Default::default()
            }),
            Vec::<String>::new()
        );
        assert_eq!(
            ids(cri::ContainerFilter {
                id: "c3".to_owned(),
                label_selector: [("c".to_owned(), "c3".to_owned())].into(),
                ..Default::default()
            }),
            ["c3"]
        );
        assert_eq!(
            ids(cri::ContainerFilter {
                id: "unknown".to_owned(),
                ..Default::default()
            }),
            Vec::<String>::new()
        );
        let sandboxes = |filter: cri::PodSandboxFilter| -> Vec<String> {
            store
                .list_sandboxes(Some(&filter))
                .into_iter()
                .map(|s| s.id)
                .collect()
        };
        assert_eq!(
            sandboxes(cri::PodSandboxFilter {
                state: Some(cri::PodSandboxStateValue { state: 1 }),
                ..Default::default()
            }),
            ["s2"]
        );
        assert_eq!(
            sandboxes(cri::PodSandboxFilter {
                label_selector: [("app".to_owned(), "a".to_owned())].into(),
                ..Default::default()
            }),
            ["s1"]
        );
        let stats: Vec<&str> = store
            .sandboxes_for_stats(None)
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(stats, ["s1"], "only ready sandboxes have stats");
    }

    #[test]
    fn exits_read_as_containerd_reports_them() {
        let mut store = Store::default();
        let mut c = container("c1", "s1", cri::ContainerState::ContainerCreated);
        assert!(c.config.envs.is_empty(), "the environment is not kept");
        c.pid = Some(42);
        store.add_container(c);
        let created = store.container_status(&store.containers["c1"]);
        assert_eq!(created.started_at, 0);
        assert_eq!(created.reason, "");
        store.by_pid.insert(42, "c1".to_owned());
        store.containers.get_mut("c1").unwrap().state = cri::ContainerState::ContainerRunning;
        store.containers.get_mut("c1").unwrap().started_at = 5;
        store.exited(42, 0);
        let status = store.container_status(&store.containers["c1"]);
        assert_eq!(status.state, cri::ContainerState::ContainerExited as i32);
        assert_eq!(status.reason, REASON_COMPLETED);
        assert_eq!(status.started_at, 5);
        assert!(status.finished_at >= status.created_at);
        // Unknown image: the config's spec and the image id stand in.
        assert_eq!(status.image_ref, "sha256:image");
        store.containers.get_mut("c1").unwrap().exit_code = 1;
        assert_eq!(
            store.container_status(&store.containers["c1"]).reason,
            REASON_ERROR
        );
        // A second exit for the same pid is ignored.
        store.exited(42, 9);
        assert_eq!(store.containers["c1"].exit_code, 1);
    }
}
