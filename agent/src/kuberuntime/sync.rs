//! One pod sync and pod kills (the kubelet's `SyncPod`, `startContainer`, `killContainer`,
//! `killPodWithSyncResult`): carries out the actions `changes` decided, in the
//! kubelet's order, applying crash-loop and image-pull back-off and recording every step's outcome.
//! A started container's `postStart` hook runs before the sync moves on (a failure kills the
//! container); a stopped container's `preStop` hook runs before the stop signal, within the grace
//! period, and what it took is taken off the grace period. When a pod with sidecars stops, every
//! container runs its `preStop` hook at once, and the sidecars then wait for their turn
//! (`termination_order`) before they are signalled.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

use ringlet_proto::runtime::v1 as cri;
use tokio::time::Instant;

use super::changes::{PodActions, ProbeKill, ProbeVerdicts, compute_pod_actions, is_sidecar};
use super::container::{
    ContainerParams, EnvContext, ImageUser, container_config, ephemeral_container_spec,
    join_target_pid_namespace, make_env, run_as_non_root, termination_message_file,
    verify_run_as_non_root,
};
use super::sandbox::{host_network, namespace_options};
use super::termination_order::TerminationOrdering;
use super::{CriError, KubeGenericRuntimeManager, RuntimeHelper, etc_hosts, labels};
use crate::container::{
    ContainerId, ContainerState, PodStatus, PodSyncResult, PodUid, RunningPod, SyncAction,
    SyncFailure, SyncResult,
};
use crate::events::{EventObject, EventType};
use crate::lifecycle::{HookTarget, run_handler};
use crate::volumes::PodVolumes;

/// Grace period when neither the pod nor the caller gives one.
const DEFAULT_GRACE_SECONDS: i64 = 30;
/// Shortest grace period a normal stop gets (an explicit override may be shorter).
const MIN_GRACE_SECONDS: i64 = 2;
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

pub(super) fn failure(reason: &str, message: impl Into<String>) -> SyncFailure {
    SyncFailure {
        reason: reason.to_owned(),
        message: message.into(),
    }
}

pub(super) fn step(
    action: SyncAction,
    target: impl Into<String>,
    failure: Option<SyncFailure>,
) -> SyncResult {
    SyncResult {
        action,
        target: target.into(),
        failure,
    }
}

/// A Go-style duration (`10s`, `1m20s`, `5m0s`), as the kubelet's back-off messages print it.
pub(super) fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else {
        format!("{}m{}s", secs / 60, secs % 60)
    }
}

/// The tokio instant of a wall-clock time in Unix nanoseconds (0 or future → now).
fn instant_of(unix_nanos: i64) -> Instant {
    let now = Instant::now();
    let wall_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let Ok(at) = u128::try_from(unix_nanos) else {
        return now;
    };
    if at == 0 || at >= wall_now {
        return now;
    }
    let age = u64::try_from(wall_now - at).map_or(Duration::MAX, Duration::from_nanos);
    now.checked_sub(age).unwrap_or(now)
}

pub(super) fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub(super) fn pod_uid(pod: &Pod) -> PodUid {
    PodUid::new(pod.metadata.uid.clone().unwrap_or_default())
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

fn app_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
}

/// The grace period to stop a container with: an override as given; otherwise the probe's own
/// `terminationGracePeriodSeconds` when a probe condemned the container (`probe_grace`), the pod's,
/// the one the container was created with, or the default, at least [`MIN_GRACE_SECONDS`].
fn grace_period(
    pod: Option<&Pod>,
    annotated: Option<i64>,
    override_: Option<i64>,
    probe_grace: Option<i64>,
) -> i64 {
    if let Some(grace) = override_ {
        return grace.max(0);
    }
    probe_grace
        .or_else(|| {
            pod.and_then(|p| p.spec.as_ref())
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .or(annotated)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(MIN_GRACE_SECONDS)
}

/// The spec of the container `name` of `pod` (app or init).
fn container_spec<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    app_containers(pod)
        .iter()
        .chain(init_containers(pod))
        .find(|c| c.name == name)
}

/// The probe-level `terminationGracePeriodSeconds` of the probe that condemned the container.
fn probe_grace(container: Option<&Container>, probe: Option<ProbeKill>) -> Option<i64> {
    let container = container?;
    let spec = match probe? {
        ProbeKill::Liveness => container.liveness_probe.as_ref(),
        ProbeKill::Startup => container.startup_probe.as_ref(),
    };
    spec?.termination_grace_period_seconds
}

/// The CRI stop signal for `lifecycle.stopSignal` (`SIGRTMIN+1` is `SIGRTMINPLUS1` in the CRI).
pub(super) fn stop_signal(container: &Container) -> cri::Signal {
    let Some(name) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.stop_signal.as_deref())
    else {
        return cri::Signal::RuntimeDefault;
    };
    let cri_name = name.replace('+', "PLUS").replace('-', "MINUS");
    cri::Signal::from_str_name(&cri_name).unwrap_or(cri::Signal::RuntimeDefault)
}

/// The probe verdicts the rest of the agent keeps, as the pod's actions are decided on them.
struct HelperVerdicts<'a>(&'a dyn RuntimeHelper);

impl ProbeVerdicts for HelperVerdicts<'_> {
    fn restart_reason(&self, id: &ContainerId) -> Option<ProbeKill> {
        self.0.restart_reason(id)
    }

    fn startup_succeeded(&self, id: &ContainerId) -> bool {
        self.0.startup_succeeded(id)
    }
}

/// A container to stop and why.
struct KillRequest<'a> {
    /// The pod's spec; `None` when it is gone (the container's annotations stand in for it).
    pod: Option<&'a Pod>,
    id: &'a ContainerId,
    name: &'a str,
    /// The `Killing` event's message; empty for `Stopping container <name>`.
    message: &'a str,
    /// The probe that condemned the container, if one did.
    probe: Option<ProbeKill>,
    /// The grace period the container was created with, for a pod that is gone.
    annotated_grace: Option<i64>,
    grace_override: Option<i64>,
    /// The pod's IPs, when the caller knows them (for an `httpGet` preStop hook).
    pod_ips: Option<&'a [String]>,
    /// When the container stops with the rest of a pod that has sidecars: when its turn comes.
    ordering: Option<&'a TerminationOrdering>,
}

/// What a container start needs that is shared by every container of the sync.
struct StartContext<'a> {
    pod: &'a Pod,
    status: &'a PodStatus,
    sandbox_id: &'a str,
    sandbox_config: &'a cri::PodSandboxConfig,
    pod_ips: &'a [String],
    volumes: &'a PodVolumes,
    pod_dir: &'a Path,
}

impl KubeGenericRuntimeManager {
    pub(super) async fn sync(&self, pod: &Pod, status: &PodStatus) -> PodSyncResult {
        let mut result = PodSyncResult::default();
        let uid = pod_uid(pod);
        if uid.as_str().is_empty() || pod.metadata.name.is_none() {
            result.results.push(step(
                SyncAction::ConfigPodSandbox,
                pod_name(pod),
                Some(failure(
                    "CreatePodSandboxConfigError",
                    "pod has no metadata.uid or metadata.name",
                )),
            ));
            return result;
        }
        let mut actions = compute_pod_actions(pod, status, &HelperVerdicts(self.helper.as_ref()));
        let resize = self.resize_plan(pod, status).await;
        if !actions.kill_pod {
            actions.restart_for_resize(&resize.restarts);
        }
        tracing::debug!(
            pod = pod_name(pod),
            ?actions,
            ?resize,
            "computed pod actions"
        );

        if actions.kill_pod {
            if actions.create_sandbox && !status.sandboxes.is_empty() {
                self.event(
                    EventObject::pod(pod),
                    EventType::Normal,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.".to_owned(),
                );
            }
            let running = status.live_part();
            self.kill_pod_with_result(Some(pod), &running, None, &mut result)
                .await;
            if let Some(init) = &actions.init_failed {
                result.results.push(step(
                    SyncAction::InitContainer,
                    init.name.clone(),
                    Some(failure(
                        "RunInitContainerError",
                        format!(
                            "init container {:?} exited with {}",
                            init.name, init.exit_code
                        ),
                    )),
                ));
            }
            // A failed stop leaves the old sandbox up: never start a second one next to it.
            if !actions.create_sandbox || result.first_failure().is_some() {
                return result;
            }
            // Init containers run again in a new sandbox; old instances would look finished.
            self.purge_init_containers(pod, status).await;
        } else {
            for kill in &actions.containers_to_kill {
                let outcome = self
                    .kill_container(KillRequest {
                        pod: Some(pod),
                        id: &kill.id,
                        name: &kill.name,
                        message: &kill.message,
                        probe: kill.probe,
                        annotated_grace: None,
                        grace_override: None,
                        pod_ips: Some(&status.ips),
                        ordering: None,
                    })
                    .await;
                let failed = outcome.is_err();
                result.results.push(step(
                    SyncAction::KillContainer,
                    kill.name.clone(),
                    outcome
                        .err()
                        .map(|e| failure("KillContainerError", e.to_string())),
                ));
                if failed {
                    return result;
                }
            }
            self.resize_containers(pod, status, &resize, &mut result)
                .await;
        }

        if actions.init_containers_to_start.is_empty()
            && actions.containers_to_start.is_empty()
            && actions.ephemeral_containers_to_start.is_empty()
        {
            return result;
        }
        Box::pin(self.start_pod(pod, status, &actions, &mut result)).await;
        result
    }

    /// Creates the sandbox if needed and starts the ephemeral containers, the init containers,
    /// then the app containers, the actions name; a regular init container that cannot start stops
    /// the sync there. The ephemeral containers come first, as the kubelet starts them, so a pod
    /// stuck in its init sequence can still be debugged.
    async fn start_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        actions: &PodActions,
        result: &mut PodSyncResult,
    ) {
        let uid = pod_uid(pod);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let inits = actions
            .init_containers_to_start
            .iter()
            .filter_map(|&i| init_containers(pod).get(i))
            .map(|c| (SyncAction::InitContainer, c));
        let apps = actions
            .containers_to_start
            .iter()
            .filter_map(|&i| app_containers(pod).get(i))
            .map(|c| (SyncAction::StartContainer, c));
        let targets: Vec<(SyncAction, &Container)> = inits.chain(apps).collect();

        // The kubelet's volume manager prepared the volumes before this sync.
        let pod_dir = self.helper.pod_dir(&uid);
        let volumes = PodVolumes::of(pod, &pod_dir);

        let log_dir = self.helper.pod_log_dir(namespace, pod_name(pod), &uid);
        let config = match self
            .pod_sandbox_config(pod, actions.attempt, &log_dir)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                result.results.push(step(
                    SyncAction::ConfigPodSandbox,
                    pod_name(pod),
                    Some(failure("CreatePodSandboxConfigError", e.clone())),
                ));
                return;
            }
        };

        let (sandbox_id, pod_ips) = if actions.create_sandbox {
            match self.create_sandbox(pod, &config, &log_dir, result).await {
                Some(created) => created,
                None => return,
            }
        } else if let Some(id) = &actions.sandbox_id {
            (id.to_string(), status.ips.clone())
        } else {
            return;
        };
        let pod_ips = if host_network(pod) {
            self.helper.host_ip().into_iter().collect()
        } else {
            pod_ips
        };

        let ctx = StartContext {
            pod,
            status,
            sandbox_id: &sandbox_id,
            sandbox_config: &config,
            pod_ips: &pod_ips,
            volumes: &volumes,
            pod_dir: &pod_dir,
        };
        for &i in &actions.ephemeral_containers_to_start {
            if let Some(ephemeral) = ephemeral_containers(pod).get(i) {
                let outcome = self.start_ephemeral_container(&ctx, ephemeral).await;
                result.results.push(step(
                    SyncAction::StartContainer,
                    ephemeral.name.clone(),
                    outcome,
                ));
            }
        }
        for (action, container) in targets {
            let outcome = match self.crash_loop_backoff(pod, container, status) {
                Some(backoff) => Some(backoff),
                None => Box::pin(self.start_container(&ctx, container, None)).await,
            };
            // The init sequence cannot go past a regular init container that did not start; a
            // sidecar that did not start is retried while the rest goes on.
            let blocks =
                outcome.is_some() && action == SyncAction::InitContainer && !is_sidecar(container);
            result
                .results
                .push(step(action, container.name.clone(), outcome));
            if blocks {
                return;
            }
        }
    }

    /// `RunPodSandbox` + `PodSandboxStatus`; returns the sandbox id and its IPs.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        config: &cri::PodSandboxConfig,
        log_dir: &Path,
        result: &mut PodSyncResult,
    ) -> Option<(String, Vec<String>)> {
        if let Err(e) = tokio::fs::create_dir_all(log_dir).await {
            result.results.push(step(
                SyncAction::CreatePodSandbox,
                pod_name(pod),
                Some(failure(
                    "CreatePodSandboxError",
                    format!("creating the pod log directory {}: {e}", log_dir.display()),
                )),
            ));
            return None;
        }
        let id = match self
            .cri
            .run_pod_sandbox(config.clone(), &self.settings.runtime_handler)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {e}");
                self.event(
                    EventObject::pod(pod),
                    EventType::Warning,
                    "FailedCreatePodSandBox",
                    message.clone(),
                );
                result.results.push(step(
                    SyncAction::CreatePodSandbox,
                    pod_name(pod),
                    Some(failure("CreatePodSandboxError", message)),
                ));
                return None;
            }
        };
        result
            .results
            .push(step(SyncAction::CreatePodSandbox, id.clone(), None));
        match self.cri.pod_sandbox_status(&id).await {
            Ok(status) => {
                let ips = status
                    .network
                    .iter()
                    .flat_map(|n| {
                        std::iter::once(n.ip.clone())
                            .chain(n.additional_ips.iter().map(|p| p.ip.clone()))
                    })
                    .filter(|ip| !ip.is_empty())
                    .collect();
                Some((id, ips))
            }
            Err(e) => {
                result.results.push(step(
                    SyncAction::ConfigPodSandbox,
                    id,
                    Some(failure("CreatePodSandboxError", e.to_string())),
                ));
                None
            }
        }
    }

    /// `CrashLoopBackOff` when the container's last exit is too recent to restart it yet;
    /// otherwise records the restart so the next exit waits longer.
    fn crash_loop_backoff(
        &self,
        pod: &Pod,
        container: &Container,
        status: &PodStatus,
    ) -> Option<SyncFailure> {
        let last = status
            .container(&container.name)
            .filter(|c| c.state == ContainerState::Exited)?;
        // The kubelet keys the back-off by the container's name and image (its container hash
        // covers only those): a new image starts over at the initial delay.
        let key = format!(
            "{}/{}/{}",
            pod_uid(pod),
            container.name,
            container.image.as_deref().unwrap_or_default()
        );
        let exited = instant_of(last.finished_at);
        if let Some(delay) = self
            .crash_backoff
            .in_backoff_since(&key, exited, Instant::now())
        {
            self.event(
                EventObject::container(pod, &container.name),
                EventType::Warning,
                "BackOff",
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    container.name,
                    pod_name(pod)
                ),
            );
            return Some(failure(
                "CrashLoopBackOff",
                format!(
                    "back-off {} restarting failed container={} pod={}",
                    go_duration(delay),
                    container.name,
                    pod_name(pod)
                ),
            ));
        }
        self.crash_backoff.next(&key, exited);
        None
    }

    /// An ephemeral container: never restarted, so no back-off; with a `targetContainerName`, in
    /// the PID namespace of that container, which must exist (the kubelet's `getTargetID`).
    async fn start_ephemeral_container(
        &self,
        ctx: &StartContext<'_>,
        ephemeral: &EphemeralContainer,
    ) -> Option<SyncFailure> {
        let target = ephemeral
            .target_container_name
            .as_deref()
            .filter(|name| !name.is_empty());
        let target_id = match target.map(|name| (name, ctx.status.container(name))) {
            None => None,
            Some((_, Some(target))) => Some(target.id.clone()),
            Some((name, None)) => {
                let message = format!("unable to find target container {name}");
                self.event(
                    EventObject::container(ctx.pod, &ephemeral.name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {message}"),
                );
                return Some(failure("CreateContainerConfigError", message));
            }
        };
        let container = ephemeral_container_spec(ephemeral);
        Box::pin(self.start_container(ctx, &container, target_id.as_ref())).await
    }

    /// Image, config, `CreateContainer`, `StartContainer`. `None` on success. `pid_target`: the
    /// container whose PID namespace an ephemeral container joins.
    async fn start_container(
        &self,
        ctx: &StartContext<'_>,
        container: &Container,
        pid_target: Option<&ContainerId>,
    ) -> Option<SyncFailure> {
        let pod = ctx.pod;
        let object = || EventObject::container(pod, &container.name);
        let image_id = match self.ensure_image(pod, container, ctx.sandbox_config).await {
            Ok(id) => id,
            Err(f) => return Some(f),
        };
        let restart_count = ctx
            .status
            .container(&container.name)
            .map_or(0, |c| c.restart_count + 1);

        let mut config = match self
            .prepare_container_config(ctx, container, restart_count, &image_id)
            .await
        {
            Ok(config) => config,
            Err(message) => {
                self.event(
                    object(),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {message}"),
                );
                return Some(failure("CreateContainerConfigError", message));
            }
        };
        if let Some(target) = pid_target {
            join_target_pid_namespace(&mut config, target);
        }

        let id = match self
            .cri
            .create_container(ctx.sandbox_id, config, ctx.sandbox_config.clone())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let message = format!("Error: {e}");
                self.event(object(), EventType::Warning, "Failed", message.clone());
                return Some(failure("CreateContainerError", message));
            }
        };
        self.resizes.record(
            &pod_uid(pod),
            ContainerId::from(id.clone()),
            container.resources.clone().unwrap_or_default(),
        );
        self.event(
            object(),
            EventType::Normal,
            "Created",
            format!("Created container {}", container.name),
        );
        if let Err(e) = self.cri.start_container(&id).await {
            let message = format!("Error: {e}");
            self.event(object(), EventType::Warning, "Failed", message.clone());
            return Some(failure("RunContainerError", message));
        }
        self.event(
            object(),
            EventType::Normal,
            "Started",
            format!("Started container {}", container.name),
        );
        let post_start = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref());
        if let Some(handler) = post_start {
            return self
                .post_start(ctx, container, &ContainerId::from(id), handler)
                .await;
        }
        None
    }

    /// Runs the `postStart` hook of a container just started; on failure kills the container
    /// (the kubelet's `FailedPostStartHook`, `PostStartHookError`). The hook is bounded by the
    /// runtime request timeout, so a hook that never ends cannot hold the pod's worker forever.
    async fn post_start(
        &self,
        ctx: &StartContext<'_>,
        container: &Container,
        id: &ContainerId,
        handler: &k8s_openapi::api::core::v1::LifecycleHandler,
    ) -> Option<SyncFailure> {
        let pod = ctx.pod;
        let target = HookTarget {
            pod,
            container,
            id,
            pod_ip: ctx.pod_ips.first().map(String::as_str),
        };
        let limit = self.cri.timeout();
        let outcome = if handler.sleep.is_some() {
            run_handler(self, target, handler).await
        } else {
            tokio::time::timeout(limit, run_handler(self, target, handler))
                .await
                .unwrap_or_else(|_| {
                    Err(crate::lifecycle::HookError(format!(
                        "postStart hook of container {:?} did not finish within {}",
                        container.name,
                        go_duration(limit)
                    )))
                })
        };
        let Err(err) = outcome else {
            return None;
        };
        tracing::warn!(pod = pod_name(pod), container = %container.name, error = %err,
            "postStart hook failed");
        // As the kubelet: the event does not carry the hook's output, which may hold secrets.
        self.event(
            EventObject::container(pod, &container.name),
            EventType::Warning,
            "FailedPostStartHook",
            "PostStartHook failed".to_owned(),
        );
        let killed = self
            .kill_container(KillRequest {
                pod: Some(pod),
                id,
                name: &container.name,
                message: "FailedPostStartHook",
                probe: None,
                annotated_grace: None,
                grace_override: None,
                pod_ips: Some(ctx.pod_ips),
                ordering: None,
            })
            .await;
        if let Err(kill) = killed {
            tracing::warn!(pod = pod_name(pod), container = %container.name, error = %kill,
                "killing the container after its postStart hook failed");
        }
        Some(failure("PostStartHookError", err.0))
    }

    /// Directories, mounts and the CRI config of one container instance; errors are messages for
    /// `CreateContainerConfigError`.
    async fn prepare_container_config(
        &self,
        ctx: &StartContext<'_>,
        container: &Container,
        restart_count: u32,
        image_id: &str,
    ) -> Result<cri::ContainerConfig, String> {
        if run_as_non_root(ctx.pod, container) {
            let image = self
                .cri
                .image_status(image_id)
                .await
                .map_err(|e| format!("inspecting image {image_id}: {e}"))?
                .ok_or_else(|| format!("image {image_id} is not on the node"))?;
            verify_run_as_non_root(ctx.pod, container, &ImageUser::of(&image))?;
        }
        let log_dir = Path::new(&ctx.sandbox_config.log_directory).join(&container.name);
        tokio::fs::create_dir_all(&log_dir)
            .await
            .map_err(|e| format!("creating log directory {}: {e}", log_dir.display()))?;

        // The environment comes first, as the kubelet's: a subPathExpr is expanded with it.
        let sources = self.helper.env_sources(ctx.pod, container).await?;
        let host_ip = self.helper.host_ip();
        let node_allocatable = self.helper.node_allocatable();
        let env = EnvContext {
            pod: ctx.pod,
            pod_ips: ctx.pod_ips,
            host_ip: host_ip.as_deref(),
            node_name: self.helper.node_name(),
            node_allocatable: &node_allocatable,
            sources: &sources,
        };
        let environment = make_env(container, &env).map_err(|e| e.to_string())?;
        for skipped in &environment.skipped {
            self.event(
                EventObject::pod(ctx.pod),
                EventType::Warning,
                "InvalidEnvironmentVariableNames",
                skipped.message(),
            );
        }

        // subPaths are resolved (and created) on the host: blocking file work.
        let volumes = ctx.volumes.clone();
        let (mounted, vars) = (container.clone(), environment.vars.clone());
        let mut mounts = tokio::task::spawn_blocking(move || volumes.mounts_for(&mounted, &vars))
            .await
            .map_err(|e| format!("resolving the volume mounts: {e}"))?
            .map_err(|e| e.to_string())?;
        let message_path = container
            .termination_message_path
            .as_deref()
            .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
        if !message_path.is_empty() {
            let file = termination_message_file(ctx.pod_dir, &container.name, restart_count);
            let created = async {
                if let Some(dir) = file.parent() {
                    tokio::fs::create_dir_all(dir).await?;
                }
                tokio::fs::write(&file, b"").await?;
                // As the kubelet: any user the container runs as may write its message.
                tokio::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).await
            };
            created.await.map_err(|e| {
                format!("creating termination message file {}: {e}", file.display())
            })?;
            mounts.push(cri::Mount {
                container_path: message_path.to_owned(),
                host_path: file.to_string_lossy().into_owned(),
                ..cri::Mount::default()
            });
        }
        if etc_hosts::is_managed_for(container, ctx.pod_ips) {
            let (dir, pod, ips, domain) = (
                ctx.pod_dir.to_owned(),
                ctx.pod.clone(),
                ctx.pod_ips.to_vec(),
                self.settings.dns.cluster_domain().to_owned(),
            );
            let hosts =
                tokio::task::spawn_blocking(move || etc_hosts::ensure(&dir, &pod, &ips, &domain))
                    .await
                    .map_err(|e| format!("writing the pod's hosts file: {e}"))?
                    .map_err(|e| format!("writing the pod's hosts file: {e}"))?;
            mounts.push(cri::Mount {
                container_path: etc_hosts::CONTAINER_PATH.to_owned(),
                host_path: hosts.to_string_lossy().into_owned(),
                ..cri::Mount::default()
            });
        }

        container_config(
            ctx.pod,
            container,
            &env,
            ContainerParams {
                restart_count,
                envs: environment.vars,
                image_id,
                mounts,
                namespaces: namespace_options(ctx.pod),
                defaults: &self.settings.container,
                memory_capacity_bytes: self.settings.memory_capacity_bytes,
            },
        )
        .map(|mut config| {
            config.stop_signal = stop_signal(container).into();
            config
        })
        .map_err(|e| e.to_string())
    }

    /// Removes the pod's exited init containers so a new sandbox runs them all again.
    async fn purge_init_containers(&self, pod: &Pod, status: &PodStatus) {
        let inits = init_containers(pod);
        let stale = status
            .containers
            .iter()
            .filter(|c| c.state != ContainerState::Running)
            .filter(|c| inits.iter().any(|i| i.name == c.name));
        for c in stale {
            if let Err(e) = self.cri.remove_container(c.id.as_str()).await
                && !e.is_not_found()
            {
                tracing::warn!(pod = pod_name(pod), container = %c.name, error = %e,
                    "removing an old init container failed");
            }
        }
    }

    /// The `Killing` event, the `preStop` hook within the grace period, then `StopContainer` with
    /// what is left of the grace period; a container already gone counts as stopped.
    async fn kill_container(&self, kill: KillRequest<'_>) -> Result<(), CriError> {
        let pod = kill.pod;
        let spec = if let Some(pod) = pod {
            container_spec(pod, kill.name).cloned()
        } else {
            self.restore_pre_stop(kill.id, kill.name).await
        };
        let mut grace = grace_period(
            pod,
            kill.annotated_grace,
            kill.grace_override,
            probe_grace(spec.as_ref(), kill.probe),
        );
        if let Some(pod) = pod {
            let text = if kill.message.is_empty() {
                format!("Stopping container {}", kill.name)
            } else {
                kill.message.to_owned()
            };
            self.event(
                EventObject::container(pod, kill.name),
                EventType::Normal,
                "Killing",
                text,
            );
        }
        let pre_stop = spec
            .as_ref()
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref());
        if let (Some(handler), Some(container)) = (pre_stop, spec.as_ref())
            && grace > 0
        {
            grace -= self.pre_stop(&kill, pod, container, handler, grace).await;
        }
        if let Some(ordering) = kill.ordering
            && grace > 0
        {
            let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
            let waited = ordering.wait_for_turn(kill.name, limit).await;
            // Whole seconds, rounded down as the kubelet does.
            grace -= i64::try_from(waited.as_secs()).unwrap_or(i64::MAX);
        }
        grace = if kill.grace_override.is_some() {
            grace.max(0)
        } else {
            grace.max(MIN_GRACE_SECONDS)
        };
        match self.cri.stop_container(kill.id.as_str(), grace).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => {
                if let Some(ordering) = kill.ordering {
                    ordering.container_stopped(kill.name);
                }
                Ok(())
            }
        }
    }

    /// Runs a `preStop` hook for at most `grace` seconds (the kubelet's `executePreStopHook`);
    /// returns the whole seconds it took.
    async fn pre_stop(
        &self,
        kill: &KillRequest<'_>,
        pod: Option<&Pod>,
        container: &Container,
        handler: &k8s_openapi::api::core::v1::LifecycleHandler,
        grace: i64,
    ) -> i64 {
        let began = Instant::now();
        let placeholder = Pod::default();
        let hook_pod = pod.unwrap_or(&placeholder);
        let needs_ip = handler
            .http_get
            .as_ref()
            .is_some_and(|h| h.host.as_deref().is_none_or(str::is_empty));
        let known_ip = kill.pod_ips.and_then(|ips| ips.first()).cloned();
        let pod_ip = if !needs_ip {
            None
        } else if pod.is_some_and(host_network) {
            self.helper.host_ip()
        } else if known_ip.is_some() {
            known_ip
        } else {
            self.hook_pod_ip(pod).await
        };
        let target = HookTarget {
            pod: hook_pod,
            container,
            id: kill.id,
            pod_ip: pod_ip.as_deref(),
        };
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        match tokio::time::timeout(limit, run_handler(self, target, handler)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(container = kill.name, id = %kill.id, error = %err, "preStop hook failed");
                if let Some(pod) = pod {
                    // As the kubelet: the event does not carry the hook's output.
                    self.event(
                        EventObject::container(pod, kill.name),
                        EventType::Warning,
                        "FailedPreStopHook",
                        "PreStopHook failed".to_owned(),
                    );
                }
            }
            Err(_) => {
                tracing::info!(container = kill.name, id = %kill.id, grace,
                    "preStop hook did not complete within the grace period");
            }
        }
        i64::try_from(began.elapsed().as_secs()).unwrap_or(i64::MAX)
    }

    /// The pod IP an `httpGet` preStop hook goes to when the caller did not know it.
    async fn hook_pod_ip(&self, pod: Option<&Pod>) -> Option<String> {
        let pod = pod?;
        let status = self
            .pod_status(
                &pod_uid(pod),
                pod_name(pod),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            )
            .await
            .ok()?;
        status.ips.first().cloned()
    }

    /// Without the pod spec, the container's `preStop` hook and ports from its annotations.
    async fn restore_pre_stop(&self, id: &ContainerId, name: &str) -> Option<Container> {
        let status = self.cri.container_status(id.as_str()).await.ok()?;
        let (handler, ports) = labels::pre_stop_handler(&status.annotations)?;
        Some(Container {
            name: name.to_owned(),
            ports: (!ports.is_empty()).then_some(ports),
            lifecycle: Some(k8s_openapi::api::core::v1::Lifecycle {
                pre_stop: Some(handler),
                ..k8s_openapi::api::core::v1::Lifecycle::default()
            }),
            ..Container::default()
        })
    }

    /// Stops every live container (in parallel; the sidecars of a pod in their turn) and then every
    /// sandbox of the pod, recording each.
    async fn kill_pod_with_result(
        &self,
        pod: Option<&Pod>,
        running: &RunningPod,
        grace_override: Option<i64>,
        result: &mut PodSyncResult,
    ) {
        let live: Vec<_> = running
            .containers
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
            .collect();
        let names: Vec<&str> = live.iter().map(|c| c.name.as_str()).collect();
        let ordering = pod
            .filter(|p| init_containers(p).iter().any(is_sidecar))
            .map(|p| TerminationOrdering::new(p, &names));
        let ordering = ordering.as_ref();
        let kills = live.into_iter().map(|c| async move {
            let outcome = self
                .kill_container(KillRequest {
                    pod,
                    id: &c.id,
                    name: &c.name,
                    message: "",
                    probe: None,
                    annotated_grace: None,
                    grace_override,
                    pod_ips: None,
                    ordering,
                })
                .await;
            step(
                SyncAction::KillContainer,
                c.name.clone(),
                outcome
                    .err()
                    .map(|e| failure("KillContainerError", e.to_string())),
            )
        });
        result.results.extend(join_all(kills).await);
        for sandbox in &running.sandboxes {
            let outcome = match self.cri.stop_pod_sandbox(sandbox.id.as_str()).await {
                Err(e) if !e.is_not_found() => Some(failure("KillPodSandboxError", e.to_string())),
                _ => None,
            };
            result.results.push(step(
                SyncAction::KillPodSandbox,
                sandbox.id.to_string(),
                outcome,
            ));
        }
    }

    /// `Runtime::kill_pod`: stops everything of the pod; the first failure is returned.
    pub(super) async fn kill_running_pod(
        &self,
        pod: Option<&Pod>,
        running: &RunningPod,
        grace_override: Option<i64>,
    ) -> Result<(), CriError> {
        let mut result = PodSyncResult::default();
        let grace_override = match (pod, grace_override) {
            (None, None) => Some(self.annotated_grace(running).await),
            (_, grace) => grace,
        };
        self.kill_pod_with_result(pod, running, grace_override, &mut result)
            .await;
        match result.first_failure() {
            Some((failed, failure)) => Err(CriError::Call {
                call: match failed.action {
                    SyncAction::KillPodSandbox => "StopPodSandbox",
                    _ => "StopContainer",
                },
                code: tonic::Code::Unknown,
                message: failure.message.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Without the pod spec, the grace period its containers were created with (or the default).
    async fn annotated_grace(&self, running: &RunningPod) -> i64 {
        for c in running
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            if let Ok(status) = self.cri.container_status(c.id.as_str()).await
                && let Some(grace) = labels::termination_grace_period(&status.annotations)
            {
                return grace.max(MIN_GRACE_SECONDS);
            }
        }
        DEFAULT_GRACE_SECONDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(80)), "1m20s");
        assert_eq!(go_duration(Duration::from_mins(5)), "5m0s");
    }

    #[test]
    fn grace_period_prefers_override_then_pod_then_annotation() {
        let pod = Pod {
            spec: Some(PodSpec {
                termination_grace_period_seconds: Some(0),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert_eq!(grace_period(Some(&pod), Some(50), Some(0), Some(9)), 0);
        assert_eq!(
            grace_period(Some(&pod), Some(50), None, None),
            MIN_GRACE_SECONDS
        );
        assert_eq!(grace_period(None, Some(50), None, None), 50);
        assert_eq!(grace_period(None, None, None, None), DEFAULT_GRACE_SECONDS);
        assert_eq!(grace_period(Some(&pod), Some(50), None, Some(7)), 7);
    }

    #[test]
    fn probe_grace_periods_come_from_the_condemning_probe() {
        use k8s_openapi::api::core::v1::Probe;
        let container = Container {
            liveness_probe: Some(Probe {
                termination_grace_period_seconds: Some(4),
                ..Probe::default()
            }),
            ..Container::default()
        };
        assert_eq!(
            probe_grace(Some(&container), Some(ProbeKill::Liveness)),
            Some(4)
        );
        assert_eq!(
            probe_grace(Some(&container), Some(ProbeKill::Startup)),
            None
        );
        assert_eq!(probe_grace(Some(&container), None), None);
    }

    #[test]
    fn stop_signals_map_to_the_cri_enum() {
        use k8s_openapi::api::core::v1::Lifecycle;
        let with = |signal: &str| Container {
            lifecycle: Some(Lifecycle {
                stop_signal: Some(signal.into()),
                ..Lifecycle::default()
            }),
            ..Container::default()
        };
        assert_eq!(
            stop_signal(&Container::default()),
            cri::Signal::RuntimeDefault
        );
        assert_eq!(stop_signal(&with("SIGUSR1")), cri::Signal::Sigusr1);
        assert_eq!(stop_signal(&with("SIGRTMIN+1")), cri::Signal::Sigrtminplus1);
        assert_eq!(
            stop_signal(&with("SIGRTMAX-2")),
            cri::Signal::Sigrtmaxminus2
        );
        assert_eq!(stop_signal(&with("SIGNOPE")), cri::Signal::RuntimeDefault);
    }

    #[tokio::test(start_paused = true)]
    async fn wall_clock_times_map_to_instants_in_the_past() {
        let now_nanos = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        )
        .unwrap();
        let ten_s_ago = now_nanos - 10_000_000_000;
        let age = Instant::now() - instant_of(ten_s_ago);
        assert!(
            age >= Duration::from_secs(10) && age < Duration::from_secs(11),
            "{age:?}"
        );
        assert_eq!(instant_of(0), Instant::now());
    }
}
