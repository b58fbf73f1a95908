//! The API status of a pod from the runtime's view of it (the kubelet's `generateAPIPodStatus`,
//! `convertToAPIContainerStatuses`, `getPhase` and the condition generators of
//! `pkg/kubelet/status/generate.go`), and whether a pod's readiness gates changed on the API server
//! (`NeedToReconcilePodReadiness`). The conditions the kubelet does not own come from the pod as
//! the API server has it, so the readiness gates are judged on what others set there. Ephemeral
//! containers have statuses of the same shape, which count for neither the phase nor the
//! conditions.

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus as ApiContainerStatus, HostIP,
    Pod, PodCondition, PodIP, PodSpec, PodStatus as ApiPodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::reason_cache::ReasonCache;
use super::resize::{container_resources, resize_conditions};
use super::{api_container_id, is_kubelet_condition, parse_api_container_id};
use crate::cm::qos_class;
use crate::container::{
    ContainerId, ContainerState, ContainerStatus, PodResize, PodStatus, PodUid, SandboxState,
};
use crate::kuberuntime::container::ephemeral_container_spec;

const PENDING: &str = "Pending";
const RUNNING: &str = "Running";
pub(super) const SUCCEEDED: &str = "Succeeded";
pub(super) const FAILED: &str = "Failed";

const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
const INITIALIZED: &str = "Initialized";
const READY: &str = "Ready";
const CONTAINERS_READY: &str = "ContainersReady";
const POD_SCHEDULED: &str = "PodScheduled";

/// What the prober says about a running container (the kubelet's `probeManager.UpdatePodStatus`).
pub trait ProbeView {
    /// Whether the container has started: its startup probe succeeded, or it has none.
    fn started(&self, pod: &PodUid, container: &str, id: &ContainerId) -> bool;
    /// Whether the started container is ready: its readiness probe succeeded, or it has none.
    fn ready(&self, pod: &PodUid, container: &str, id: &ContainerId) -> bool;
}

/// No probes: every running container is started and ready (run-once mode, tests).
pub struct NoProbes;

impl ProbeView for NoProbes {
    fn started(&self, _pod: &PodUid, _container: &str, _id: &ContainerId) -> bool {
        true
    }

    fn ready(&self, _pod: &PodUid, _container: &str, _id: &ContainerId) -> bool {
        true
    }
}

/// What status generation takes besides the pod and the runtime's view of it.
pub struct StatusInputs<'a> {
    /// Start failures, shown as waiting reasons.
    pub reasons: &'a ReasonCache,
    /// The previously generated status, whose start time, terminal phase and condition
    /// transition times are kept.
    pub previous: Option<&'a ApiPodStatus>,
    /// The node's IP; host-network pods report it as their pod IP.
    pub host_ip: &'a str,
    /// The pod has been stopped for good (deleted, or it finished), so containers that are all
    /// stopped make a terminal phase even under `restartPolicy: Always`.
    pub pod_is_terminal: bool,
    /// Readiness and startup of running containers.
    pub probes: &'a dyn ProbeView,
    /// The runtime's name as its `Version` call reported it, the scheme of the container ids;
    /// `None` until it answered, and the container statuses have no id meanwhile.
    pub runtime_name: Option<&'a str>,
    /// Where an in-place resize stands, as the runtime manager keeps it; `None` without a record.
    pub resize: Option<&'a PodResize>,
}

/// The API status of `pod` given what the runtime reports for it.
pub fn generate_api_pod_status(
    pod: &Pod,
    runtime: &PodStatus,
    inputs: &StatusInputs<'_>,
) -> ApiPodStatus {
    generate_at(pod, runtime, inputs, wall_clock_now())
}

/// The wall-clock time (jiff's own `now` needs a feature k8s-openapi does not enable).
pub fn wall_clock_now() -> Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs())
        .ok()
        .and_then(|secs| Timestamp::from_second(secs).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn generate_at(
    pod: &Pod,
    runtime: &PodStatus,
    inputs: &StatusInputs<'_>,
    now: Timestamp,
) -> ApiPodStatus {
    let StatusInputs {
        reasons,
        previous,
        host_ip,
        pod_is_terminal,
        probes,
        runtime_name,
        resize,
    } = *inputs;
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let uid = PodUid::new(pod.metadata.uid.clone().unwrap_or_default());
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    let context = StatusContext {
        spec,
        uid: &uid,
        runtime,
        reasons,
        deleting,
        probes,
        runtime_name,
        resize,
    };
    let init_statuses: Vec<ApiContainerStatus> = init_specs
        .iter()
        .map(|c| context.container_status(c, ContainerKind::Init))
        .collect();
    let app_statuses: Vec<ApiContainerStatus> = spec
        .containers
        .iter()
        .map(|c| context.container_status(c, ContainerKind::App))
        .collect();

    // Static pods keep their phase when stopped (the kubelet's TerminatePod leaves them alone).
    let terminal = pod_is_terminal && !crate::podconfig::is_static_pod(pod);
    let mut phase = get_phase(spec, &init_statuses, &app_statuses, terminal);
    // A terminal phase is final: containers of a finished pod may be removed, which must not bring
    // the pod back to Pending.
    if let Some(old) = previous.and_then(|p| p.phase.as_deref())
        && (old == SUCCEEDED || old == FAILED)
    {
        phase = old;
    }

    let generation = pod.metadata.generation;
    let now_time = Time(truncate(now));
    // Conditions owned by others (readiness gates) are theirs to set on the API server: they are
    // kept as the watched pod has them, and the readiness gates are judged on them.
    let foreign = foreign_conditions(pod);
    let mut conditions = vec![
        ready_to_start_condition(spec, runtime),
        initialized_condition(spec, &init_statuses, &app_statuses, phase),
        ready_condition(spec, &init_statuses, &app_statuses, phase, &foreign),
        containers_ready_condition(spec, &init_statuses, &app_statuses, phase),
        PodCondition {
            type_: POD_SCHEDULED.to_owned(),
            status: "True".to_owned(),
            ..PodCondition::default()
        },
    ];
    conditions.extend(resize_conditions(spec, runtime, resize));
    for condition in &mut conditions {
        condition.observed_generation = generation;
        let old = previous
            .and_then(|p| p.conditions.as_deref())
            .and_then(|all| all.iter().find(|c| c.type_ == condition.type_));
        condition.last_transition_time = match old {
            Some(old) if old.status == condition.status && old.last_transition_time.is_some() => {
                old.last_transition_time.clone()
            }
            _ => Some(now_time.clone()),
        };
    }
    conditions.extend(foreign);

    let host_ips = (!host_ip.is_empty()).then(|| {
        vec![HostIP {
            ip: host_ip.to_owned(),
        }]
    });
    let pod_ips: Vec<String> = if spec.host_network == Some(true) {
        host_ips.iter().flatten().map(|h| h.ip.clone()).collect()
    } else {
        runtime.ips.clone()
    };

    ApiPodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        host_ip: (!host_ip.is_empty()).then(|| host_ip.to_owned()),
        host_ips,
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.into_iter().map(|ip| PodIP { ip }).collect()),
        // After an agent restart the API server's start time stands: the pod did not start
        // again, and its active deadline counts from it.
        start_time: previous
            .and_then(|p| p.start_time.clone())
            .or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()))
            .or(Some(now_time)),
        qos_class: Some(qos_class(pod).as_str().to_owned()),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(app_statuses),
        ephemeral_container_statuses: context.ephemeral_statuses(),
        observed_generation: generation,
        ..ApiPodStatus::default()
    }
}

/// `status` with container `id`'s readiness set to `ready` and the `Ready` and `ContainersReady`
/// conditions recomputed (the kubelet's `SetContainerReadiness`), so a probe's verdict shows
/// without waiting for a pod sync; `None` when the container is not in the status or is already
/// so.
pub(super) fn with_container_readiness(
    pod: &Pod,
    status: &ApiPodStatus,
    id: &ContainerId,
    ready: bool,
) -> Option<ApiPodStatus> {
    let mut updated = status.clone();
    let container = find_by_id(&mut updated, id)?;
    if container.ready == ready {
        return None;
    }
    container.ready = ready;
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let phase = updated.phase.clone().unwrap_or_default();
    let init = updated.init_container_statuses.clone().unwrap_or_default();
    let app = updated.container_statuses.clone().unwrap_or_default();
    let now = Time(truncate(wall_clock_now()));
    let fresh = [
        ready_condition(spec, &init, &app, &phase, &foreign_conditions(pod)),
        containers_ready_condition(spec, &init, &app, &phase),
    ];
    let conditions = updated.conditions.get_or_insert_with(Vec::new);
    for mut condition in fresh {
        if let Some(old) = conditions.iter_mut().find(|c| c.type_ == condition.type_) {
            condition.observed_generation = old.observed_generation;
            condition.last_transition_time = if old.status == condition.status {
                old.last_transition_time.clone()
            } else {
                Some(now.clone())
            };
            *old = condition;
        } else {
            condition.observed_generation = pod.metadata.generation;
            condition.last_transition_time = Some(now.clone());
            conditions.push(condition);
        }
    }
    Some(updated)
}

/// `status` with container `id` marked started or not (the kubelet's `SetContainerStartup`);
/// `None` when the container is not in the status or is already so.
pub(super) fn with_container_startup(
    status: &ApiPodStatus,
    id: &ContainerId,
    started: bool,
) -> Option<ApiPodStatus> {
    let mut updated = status.clone();
    let container = find_by_id(&mut updated, id)?;
    if container.started == Some(started) {
        return None;
    }
    container.started = Some(started);
    Some(updated)
}

fn find_by_id<'a>(
    status: &'a mut ApiPodStatus,
    id: &ContainerId,
) -> Option<&'a mut ApiContainerStatus> {
    status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten())
        .find(|c| {
            c.container_id
                .as_deref()
                .and_then(parse_api_container_id)
                .as_ref()
                == Some(id)
        })
}

/// The pod's conditions on the API server (as watched) that the kubelet does not own.
fn foreign_conditions(pod: &Pod) -> Vec<PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| !is_kubelet_condition(&c.type_))
        .cloned()
        .collect()
}

/// Whether the `Ready` condition the API server has for the pod is not what its readiness gates
/// and container statuses there make it (the kubelet's `NeedToReconcilePodReadiness`): someone set
/// a gate's condition, and the pod wants a sync so `Ready` follows. Only pods with readiness gates
/// and a `Ready` condition already reported ask for it.
pub fn needs_readiness_reconcile(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if spec.readiness_gates.as_ref().is_none_or(Vec::is_empty) {
        return false;
    }
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let Some(current) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == READY)
    else {
        return false;
    };
    let wanted = ready_condition(
        spec,
        status
            .init_container_statuses
            .as_deref()
            .unwrap_or_default(),
        status.container_statuses.as_deref().unwrap_or_default(),
        status.phase.as_deref().unwrap_or_default(),
        status.conditions.as_deref().unwrap_or_default(),
    );
    current.status != wanted.status || current.message != wanted.message
}

/// API times travel with second precision; truncating keeps regenerated statuses comparable.
fn truncate(time: Timestamp) -> Timestamp {
    Timestamp::from_second(time.as_second()).unwrap_or(time)
}

/// A CRI time (Unix nanoseconds, 0 = unset) as an API time.
fn api_time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    Timestamp::from_second(nanos.div_euclid(1_000_000_000))
        .ok()
        .map(Time)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ContainerKind {
    Init,
    App,
    /// Started once, never restarted, never probed: neither started nor ready.
    Ephemeral,
}

struct StatusContext<'a> {
    spec: &'a PodSpec,
    uid: &'a PodUid,
    runtime: &'a PodStatus,
    reasons: &'a ReasonCache,
    deleting: bool,
    probes: &'a dyn ProbeView,
    runtime_name: Option<&'a str>,
    resize: Option<&'a PodResize>,
}

impl StatusContext<'_> {
    /// The ephemeral containers' statuses; `None` for a pod without any.
    fn ephemeral_statuses(&self) -> Option<Vec<ApiContainerStatus>> {
        let ephemeral = self.spec.ephemeral_containers.as_deref()?;
        (!ephemeral.is_empty()).then(|| {
            ephemeral
                .iter()
                .map(ephemeral_container_spec)
                .map(|c| self.container_status(&c, ContainerKind::Ephemeral))
                .collect()
        })
    }

    fn container_status(&self, container: &Container, kind: ContainerKind) -> ApiContainerStatus {
        // Before it first runs, every container of a pod with init containers (init containers
        // included) waits with `PodInitializing`, those of other pods with `ContainerCreating`.
        let waiting_reason = if self
            .spec
            .init_containers
            .as_ref()
            .is_some_and(|i| !i.is_empty())
        {
            "PodInitializing"
        } else {
            "ContainerCreating"
        };
        let mut instances = self
            .runtime
            .containers
            .iter()
            .filter(|c| c.name == container.name);
        let newest = instances.next();
        let mut status = match newest {
            Some(current) => {
                let mut status = convert(current, self.runtime_name);
                if let Some(previous) = instances.next() {
                    status.last_state = convert(previous, self.runtime_name).state;
                }
                if status.image.is_empty() {
                    status.image = container.image.clone().unwrap_or_default();
                }
                status
            }
            None => ApiContainerStatus {
                name: container.name.clone(),
                image: container.image.clone().unwrap_or_default(),
                state: Some(ApiContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(waiting_reason.to_owned()),
                        message: None,
                    }),
                    ..ApiContainerState::default()
                }),
                ..ApiContainerStatus::default()
            },
        };

        let succeeded_init = kind == ContainerKind::Init
            && !is_sidecar(container)
            && terminated(status.state.as_ref()).is_some_and(|t| t.exit_code == 0);
        let to_start = if kind == ContainerKind::Ephemeral {
            newest.is_none() && !self.deleting
        } else {
            self.should_restart(container, newest)
        };
        if !succeeded_init
            && to_start
            && let Some(failure) = self.reasons.get(self.uid, &container.name)
        {
            if terminated(status.state.as_ref()).is_some() {
                status.last_state = status.state.take();
            }
            status.state = Some(ApiContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(failure.reason),
                    message: (!failure.message.is_empty()).then_some(failure.message),
                }),
                ..ApiContainerState::default()
            });
        }

        if kind == ContainerKind::Ephemeral {
            return status;
        }
        let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
        let resources = container_resources(
            container,
            newest.filter(|_| running).map(|c| &c.id),
            self.resize,
        );
        // What the node admitted for the container (the kubelet's allocated resources): the
        // requests of what is applied, the spec's once a resize went through.
        status.allocated_resources = resources.requests.clone().filter(|r| !r.is_empty());
        status.resources = Some(resources);
        let regular_init = kind == ContainerKind::Init && !is_sidecar(container);
        // A running container has started once its startup probe (if any) succeeded, and is
        // ready once started and its readiness probe (if any) succeeded; a regular init container
        // is ready once it has completed.
        let started = running
            && (regular_init
                || newest.is_some_and(|c| self.probes.started(self.uid, &container.name, &c.id)));
        status.started = Some(started);
        status.ready = if regular_init {
            terminated(status.state.as_ref()).is_some_and(|t| t.exit_code == 0)
        } else {
            started && newest.is_some_and(|c| self.probes.ready(self.uid, &container.name, &c.id))
        };
        status
    }

    /// Whether the next sync would (re)start the container (the kubelet's
    /// `ShouldContainerBeRestarted`).
    fn should_restart(&self, container: &Container, newest: Option<&ContainerStatus>) -> bool {
        if self.deleting {
            return false;
        }
        let Some(newest) = newest else {
            return true;
        };
        match newest.state {
            ContainerState::Running => false,
            ContainerState::Created | ContainerState::Unknown => true,
            ContainerState::Exited => {
                if is_sidecar(container) {
                    return true;
                }
                match self.spec.restart_policy.as_deref() {
                    Some("Never") => false,
                    Some("OnFailure") => newest.exit_code != 0,
                    _ => true,
                }
            }
        }
    }
}

fn convert(status: &ContainerStatus, runtime_name: Option<&str>) -> ApiContainerStatus {
    let container_id = runtime_name.map(|name| api_container_id(name, &status.id));
    let state = match status.state {
        ContainerState::Running => ApiContainerState {
            running: Some(ContainerStateRunning {
                started_at: api_time(status.started_at),
            }),
            ..ApiContainerState::default()
        },
        ContainerState::Exited => {
            let reason = if !status.reason.is_empty() {
                status.reason.clone()
            } else if status.exit_code == 0 {
                "Completed".to_owned()
            } else {
                "Error".to_owned()
            };
            ApiContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: status.exit_code,
                    reason: Some(reason),
                    message: (!status.message.is_empty()).then(|| status.message.clone()),
                    started_at: api_time(status.started_at),
                    finished_at: api_time(status.finished_at),
                    container_id: container_id.clone(),
                    signal: None,
                }),
                ..ApiContainerState::default()
            }
        }
        // Created but not started, or unknown to the runtime: waiting to run, reason unknown.
        ContainerState::Created | ContainerState::Unknown => ApiContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..ApiContainerState::default()
        },
    };
    ApiContainerStatus {
        name: status.name.clone(),
        image: status.image.clone(),
        image_id: status.image_ref.clone(),
        container_id,
        restart_count: i32::try_from(status.restart_count).unwrap_or(i32::MAX),
        state: Some(state),
        ..ApiContainerStatus::default()
    }
}

/// An init container with `restartPolicy: Always` keeps running beside the app containers.
pub(super) fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

pub(super) fn terminated(state: Option<&ApiContainerState>) -> Option<&ContainerStateTerminated> {
    state.and_then(|s| s.terminated.as_ref())
}

fn find<'a>(statuses: &'a [ApiContainerStatus], name: &str) -> Option<&'a ApiContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn has_any_app_container_started(app: &[ApiContainerStatus]) -> bool {
    app.iter().any(|s| {
        let state = s.state.as_ref();
        state.is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            || terminated(s.last_state.as_ref()).is_some()
    })
}

/// The pod phase over its container statuses and restart policy (the kubelet's `getPhase`).
fn get_phase(
    spec: &PodSpec,
    init: &[ApiContainerStatus],
    app: &[ApiContainerStatus],
    pod_is_terminal: bool,
) -> &'static str {
    let mut pending_init = 0;
    let mut failed_init = 0;
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for container in spec.init_containers.as_deref().unwrap_or_default() {
        let status = find(init, &container.name);
        if is_sidecar(container) {
            // A sidecar counts with the regular containers, except that a stopped one does not
            // count at all: it is restarted, or stopped with the pod.
            let Some(status) = status else {
                unknown += 1;
                continue;
            };
            let state = status.state.as_ref();
            let ran =
                terminated(state).is_some() || terminated(status.last_state.as_ref()).is_some();
            if state.is_some_and(|s| s.running.is_some()) {
                if status.started != Some(true) {
                    pending_init += 1;
                }
                running += 1;
            } else if !ran {
                pending_init += 1;
                if state.is_some_and(|s| s.waiting.is_some()) {
                    waiting += 1;
                } else {
                    unknown += 1;
                }
            }
            continue;
        }
        let Some(status) = status else {
            pending_init += 1;
            continue;
        };
        let state = status.state.as_ref();
        if let Some(t) = terminated(state) {
            if t.exit_code != 0 {
                pending_init += 1;
                failed_init += 1;
            }
        } else if state.is_some_and(|s| s.waiting.is_some())
            && let Some(last) = terminated(status.last_state.as_ref())
        {
            if last.exit_code != 0 {
                pending_init += 1;
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }

    for container in &spec.containers {
        let Some(status) = find(app, &container.name) else {
            unknown += 1;
            continue;
        };
        let state = status.state.as_ref();
        if state.is_some_and(|s| s.running.is_some()) {
            running += 1;
        } else if let Some(t) = terminated(state) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.is_some_and(|s| s.waiting.is_some()) {
            if terminated(status.last_state.as_ref()).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }

    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    if failed_init > 0 && policy == "Never" {
        return FAILED;
    }
    if (pending_init > 0 && !has_any_app_container_started(app)) || waiting > 0 {
        return PENDING;
    }
    if running > 0 && unknown == 0 {
        return RUNNING;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if policy == "Always" && !pod_is_terminal {
            return RUNNING;
        }
        if stopped == succeeded {
            return SUCCEEDED;
        }
        if policy == "Never" || pod_is_terminal {
            return FAILED;
        }
        return RUNNING;
    }
    // A stopped pod whose containers never all ran (or are gone) has failed.
    if pod_is_terminal && running == 0 {
        return FAILED;
    }
    PENDING
}

fn condition(
    type_: &str,
    ready: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if ready { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        ..PodCondition::default()
    }
}

/// True once the newest sandbox is ready with its network (the kubelet's
/// `GeneratePodReadyToStartContainersCondition`).
fn ready_to_start_condition(spec: &PodSpec, runtime: &PodStatus) -> PodCondition {
    let ready_sandboxes = runtime
        .sandboxes
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    let ready = runtime.sandboxes.first().is_some_and(|newest| {
        newest.state == SandboxState::Ready
            && ready_sandboxes == 1
            && (spec.host_network == Some(true) || newest.host_network || !runtime.ips.is_empty())
    });
    condition(POD_READY_TO_START_CONTAINERS, ready, None, None)
}

fn names_message(prefix: &str, names: &[&str]) -> Option<String> {
    (!names.is_empty()).then(|| format!("{prefix}: [{}]", names.join(" ")))
}

fn join_messages(messages: [Option<String>; 2]) -> Option<String> {
    let parts: Vec<String> = messages.into_iter().flatten().collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn initialized_condition(
    spec: &PodSpec,
    init: &[ApiContainerStatus],
    app: &[ApiContainerStatus],
    phase: &str,
) -> PodCondition {
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for container in init_specs {
        let Some(status) = find(init, &container.name) else {
            unknown.push(container.name.as_str());
            continue;
        };
        let done = if is_sidecar(container) {
            status.started == Some(true)
        } else {
            terminated(status.state.as_ref()).is_some_and(|t| t.exit_code == 0)
        };
        if !done {
            incomplete.push(container.name.as_str());
        }
    }
    if phase == SUCCEEDED && unknown.is_empty() {
        return condition(INITIALIZED, true, Some("PodCompleted"), None);
    }
    if has_any_app_container_started(app) {
        return condition(INITIALIZED, true, None, None);
    }
    match join_messages([
        names_message("containers with unknown status", &unknown),
        names_message("containers with incomplete status", &incomplete),
    ]) {
        Some(message) => condition(
            INITIALIZED,
            false,
            Some("ContainersNotInitialized"),
            Some(message),
        ),
        None => condition(INITIALIZED, true, None, None),
    }
}

fn containers_ready_condition(
    spec: &PodSpec,
    init: &[ApiContainerStatus],
    app: &[ApiContainerStatus],
    phase: &str,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec
        .init_containers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|c| is_sidecar(c))
        .map(|c| (c, init));
    let apps = spec.containers.iter().map(|c| (c, app));
    for (container, statuses) in sidecars.chain(apps) {
        match find(statuses, &container.name) {
            None => unknown.push(container.name.as_str()),
            Some(status) if !status.ready => unready.push(container.name.as_str()),
            Some(_) => {}
        }
    }
    if phase == SUCCEEDED && unknown.is_empty() {
        return condition(CONTAINERS_READY, false, Some("PodCompleted"), None);
    }
    match join_messages([
        names_message("containers with unknown status", &unknown),
        names_message("containers with unready status", &unready),
    ]) {
        Some(message) => condition(
            CONTAINERS_READY,
            false,
            Some("ContainersNotReady"),
            Some(message),
        ),
        None => condition(CONTAINERS_READY, true, None, None),
    }
}

/// `Ready` (the kubelet's `GeneratePodReadyCondition`): the containers are ready and every readiness
/// gate names a condition among `conditions` that is True.
fn ready_condition(
    spec: &PodSpec,
    init: &[ApiContainerStatus],
    app: &[ApiContainerStatus],
    phase: &str,
    conditions: &[PodCondition],
) -> PodCondition {
    let containers_ready = containers_ready_condition(spec, init, app, phase);
    if containers_ready.status != "True" {
        return PodCondition {
            type_: READY.to_owned(),
            ..containers_ready
        };
    }
    let unready: Vec<String> = spec
        .readiness_gates
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(
            |gate| match conditions.iter().find(|c| c.type_ == gate.condition_type) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{}\" does not exist.",
                    gate.condition_type
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                    gate.condition_type, c.status
                )),
                Some(_) => None,
            },
        )
        .collect();
    if unready.is_empty() {
        condition(READY, true, None, None)
    } else {
        condition(
            READY,
            false,
            Some("ReadinessGatesNotReady"),
            Some(unready.join(", ")),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::container::{
        PodSyncResult, SandboxId, SandboxStatus, SyncAction, SyncFailure, SyncResult,
    };
    use k8s_openapi::api::core::v1::PodReadinessGate;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const SEC: i64 = 1_000_000_000;

    fn spec_container(name: &str) -> Container {
        Container {
            name: name.to_owned(),
            image: Some("busybox".to_owned()),
            ..Container::default()
        }
    }

    fn pod(policy: &str, init: &[&str], app: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some("uid-1".to_owned()),
                name: Some("web".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.to_owned()),
                init_containers: (!init.is_empty())
                    .then(|| init.iter().map(|n| spec_container(n)).collect()),
                containers: app.iter().map(|n| spec_container(n)).collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn running(id: &str, name: &str, restarts: u32) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            name: name.to_owned(),
            state: ContainerState::Running,
            created_at: 10 * SEC,
            started_at: 11 * SEC,
            finished_at: 0,
            exit_code: 0,
            image: "docker.io/library/busybox:latest".to_owned(),
            image_ref: "sha256:abc".to_owned(),
            hash: String::new(),
            restart_count: restarts,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn exited(id: &str, name: &str, code: i32, restarts: u32) -> ContainerStatus {
        ContainerStatus {
            state: ContainerState::Exited,
            finished_at: 12 * SEC + 500,
            exit_code: code,
            ..running(id, name, restarts)
        }
    }

    fn runtime(containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            uid: "uid-1".into(),
            name: "web".to_owned(),
            namespace: "default".to_owned(),
            ips: vec!["10.1.0.5".to_owned()],
            sandboxes: vec![SandboxStatus {
                id: SandboxId::new("sb"),
                state: SandboxState::Ready,
                created_at: 5 * SEC,
                attempt: 0,
                ip: Some("10.1.0.5".to_owned()),
                host_network: false,
            }],
            containers,
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn inputs<'a>(
        reasons: &'a ReasonCache,
        previous: Option<&'a ApiPodStatus>,
    ) -> StatusInputs<'a> {
        StatusInputs {
            reasons,
            previous,
            host_ip: "192.168.1.10",
            pod_is_terminal: false,
            probes: &NoProbes,
            runtime_name: Some("containerd"),
            resize: None,
        }
    }

    fn generate(pod: &Pod, rt: &PodStatus, reasons: &ReasonCache) -> ApiPodStatus {
        generate_at(pod, rt, &inputs(reasons, None), at(1_000))
    }

    fn fail_start(reasons: &ReasonCache, name: &str, reason: &str) {
        reasons.update(
            &PodUid::from("uid-1"),
            &PodSyncResult {
                results: vec![SyncResult {
                    action: SyncAction::StartContainer,
                    target: name.to_owned(),
                    failure: Some(SyncFailure {
                        reason: reason.to_owned(),
                        message: format!("{reason} for {name}"),
                    }),
                }],
            },
        );
    }

    fn cond<'a>(status: &'a ApiPodStatus, type_: &str) -> &'a PodCondition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap()
    }

    fn app_state(status: &ApiPodStatus, i: usize) -> &ApiContainerState {
        status.container_statuses.as_ref().unwrap()[i]
            .state
            .as_ref()
            .unwrap()
    }

    #[test]
    fn phase_rules_over_restart_policy() {
        let reasons = ReasonCache::new();
        let phase = |policy: &str, containers: Vec<ContainerStatus>| {
            generate(
                &pod(policy, &[], &["a", "b"]),
                &runtime(containers),
                &reasons,
            )
            .phase
            .unwrap()
        };
        assert_eq!(phase("Always", vec![]), "Pending");
        assert_eq!(
            phase("Always", vec![running("1", "a", 0)]),
            "Pending",
            "b not created yet"
        );
        assert_eq!(
            phase("Always", vec![running("1", "a", 0), running("2", "b", 0)]),
            "Running"
        );
        assert_eq!(
            phase("Never", vec![running("1", "a", 0), exited("2", "b", 1, 0)]),
            "Running"
        );
        let done = || vec![exited("1", "a", 0, 0), exited("2", "b", 0, 0)];
        assert_eq!(phase("Always", done()), "Running", "Always restarts them");
        assert_eq!(phase("OnFailure", done()), "Succeeded");
        assert_eq!(phase("Never", done()), "Succeeded");
        let failed = || vec![exited("1", "a", 0, 0), exited("2", "b", 2, 0)];
        assert_eq!(phase("Always", failed()), "Running");
        assert_eq!(
            phase("OnFailure", failed()),
            "Running",
            "b is being restarted"
        );
        assert_eq!(phase("Never", failed()), "Failed");
    }

    #[test]
    fn waiting_states_before_start() {
        let reasons = ReasonCache::new();
        let status = generate(&pod("Always", &[], &["a"]), &runtime(vec![]), &reasons);
        let waiting = app_state(&status, 0).waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.image, "busybox");
        assert_eq!(cs.started, Some(false));
        assert!(!cs.ready);

        fail_start(&reasons, "a", "ErrImageNeverPull");
        let status = generate(&pod("Always", &[], &["a"]), &runtime(vec![]), &reasons);
        let waiting = app_state(&status, 0).waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ErrImageNeverPull"));
        assert_eq!(waiting.message.as_deref(), Some("ErrImageNeverPull for a"));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn running_container_status() {
        let reasons = ReasonCache::new();
        let status = generate(
            &pod("Always", &[], &["a"]),
            &runtime(vec![running("c1", "a", 2), exited("c0", "a", 1, 1)]),
            &reasons,
        );
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!(cs.image, "docker.io/library/busybox:latest");
        assert_eq!(cs.image_id, "sha256:abc");
        assert_eq!(cs.restart_count, 2);
        assert!(cs.ready);
        assert_eq!(cs.started, Some(true));
        let state = cs.state.as_ref().unwrap();
        assert_eq!(
            state.running.as_ref().unwrap().started_at,
            Some(Time(at(11)))
        );
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(last.exit_code, 1);
        assert_eq!(last.container_id.as_deref(), Some("containerd://c0"));
        assert_eq!(cond(&status, READY).status, "True");
        assert_eq!(cond(&status, CONTAINERS_READY).status, "True");
        assert_eq!(cond(&status, POD_READY_TO_START_CONTAINERS).status, "True");
    }

    /// Probe verdicts for tests: which containers (by runtime id) have started and are ready.
    struct Verdicts {
        started: &'static [&'static str],
        ready: &'static [&'static str],
    }

    impl ProbeView for Verdicts {
        fn started(&self, _pod: &PodUid, _container: &str, id: &ContainerId) -> bool {
            self.started.contains(&id.as_str())
        }

        fn ready(&self, _pod: &PodUid, _container: &str, id: &ContainerId) -> bool {
            self.ready.contains(&id.as_str())
        }
    }

    #[test]
    fn probes_decide_started_and_ready_of_running_containers() {
        let reasons = ReasonCache::new();
        let p = pod("Always", &[], &["a", "b", "c"]);
        let rt = runtime(vec![
            running("ca", "a", 0),
            running("cb", "b", 0),
            running("cc", "c", 0),
        ]);
        // a: started and ready; b: started, not ready; c: not started (so not ready either).
        let verdicts = Verdicts {
            started: &["ca", "cb"],
            ready: &["ca", "cc"],
        };
        let status = generate_at(
            &p,
            &rt,
            &StatusInputs {
                probes: &verdicts,
                ..inputs(&reasons, None)
            },
            at(1_000),
        );
        let flags: Vec<(Option<bool>, bool)> = status
            .container_statuses
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.started, c.ready))
            .collect();
        assert_eq!(
            flags,
            [
                (Some(true), true),
                (Some(true), false),
                (Some(false), false)
            ]
        );
        let containers_ready = cond(&status, CONTAINERS_READY);
        assert_eq!(containers_ready.status, "False");
        assert_eq!(
            containers_ready.message.as_deref(),
            Some("containers with unready status: [b c]")
        );
        assert_eq!(cond(&status, READY).status, "False");
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn a_readiness_verdict_updates_the_status_and_its_conditions_at_once() {
        let reasons = ReasonCache::new();
        let p = pod("Always", &[], &["a"]);
        let not_ready = Verdicts {
            started: &["ca"],
            ready: &[],
        };
        let status = generate_at(
            &p,
            &runtime(vec![running("ca", "a", 0)]),
            &StatusInputs {
                probes: &not_ready,
                ..inputs(&reasons, None)
            },
            at(1_000),
        );
        assert_eq!(cond(&status, READY).status, "False");
        let id = ContainerId::from("ca");
        let ready = with_container_readiness(&p, &status, &id, true).unwrap();
        assert!(ready.container_statuses.as_ref().unwrap()[0].ready);
        assert_eq!(cond(&ready, READY).status, "True");
        assert_eq!(cond(&ready, CONTAINERS_READY).status, "True");
        assert_ne!(
            cond(&ready, READY).last_transition_time,
            cond(&status, READY).last_transition_time,
            "the transition is dated"
        );
        assert_eq!(
            cond(&ready, POD_SCHEDULED),
            cond(&status, POD_SCHEDULED),
            "other conditions are left alone"
        );
        assert!(with_container_readiness(&p, &ready, &id, true).is_none());
        assert!(with_container_readiness(&p, &ready, &ContainerId::from("x"), false).is_none());
        let not_started = with_container_startup(&ready, &id, false).unwrap();
        assert_eq!(
            not_started.container_statuses.as_ref().unwrap()[0].started,
            Some(false)
        );
    }

    #[test]
    fn oom_killed_container() {
        let reasons = ReasonCache::new();
        let mut oom = exited("c1", "a", 137, 0);
        oom.reason = "OOMKilled".to_owned();
        let status = generate(&pod("Never", &[], &["a"]), &runtime(vec![oom]), &reasons);
        let t = app_state(&status, 0).terminated.as_ref().unwrap();
        assert_eq!(t.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(t.exit_code, 137);
        assert_eq!(t.started_at, Some(Time(at(11))));
        assert_eq!(t.finished_at, Some(Time(at(12))));
        assert_eq!(t.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!(status.phase.as_deref(), Some("Failed"));

        let status = generate(
            &pod("Never", &[], &["a"]),
            &runtime(vec![exited("c1", "a", 0, 0)]),
            &reasons,
        );
        let t = app_state(&status, 0).terminated.as_ref().unwrap();
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        assert_eq!(
            cond(&status, CONTAINERS_READY).reason.as_deref(),
            Some("PodCompleted")
        );
        assert_eq!(cond(&status, READY).reason.as_deref(), Some("PodCompleted"));
        let initialized = cond(&status, INITIALIZED);
        assert_eq!(initialized.status, "True");
        assert_eq!(initialized.reason.as_deref(), Some("PodCompleted"));
    }

    #[test]
    fn crash_loop_back_off_waits_with_last_state() {
        let reasons = ReasonCache::new();
        fail_start(&reasons, "a", "CrashLoopBackOff");
        let status = generate(
            &pod("Always", &[], &["a"]),
            &runtime(vec![exited("c3", "a", 1, 3), exited("c2", "a", 1, 2)]),
            &reasons,
        );
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        let waiting = cs.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            last.container_id.as_deref(),
            Some("containerd://c3"),
            "the newest exited instance becomes the last state"
        );
        assert_eq!(last.reason.as_deref(), Some("Error"));
        assert_eq!(cs.restart_count, 3);
        assert!(!cs.ready);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let ready = cond(&status, CONTAINERS_READY);
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a]")
        );

        // With restartPolicy Never the container is not restarted, so the failure is not shown.
        let status = generate(
            &pod("Never", &[], &["a"]),
            &runtime(vec![exited("c3", "a", 1, 3)]),
            &reasons,
        );
        assert!(app_state(&status, 0).terminated.is_some());
    }

    #[test]
    fn failed_init_container_phase_by_restart_policy() {
        let reasons = ReasonCache::new();
        let rt = runtime(vec![exited("i1", "init", 1, 0)]);
        for (policy, phase) in [
            ("Never", "Failed"),
            ("Always", "Pending"),
            ("OnFailure", "Pending"),
        ] {
            let status = generate(&pod(policy, &["init"], &["app"]), &rt, &reasons);
            assert_eq!(
                status.phase.as_deref(),
                Some(phase),
                "restartPolicy {policy}"
            );
            let waiting = app_state(&status, 0).waiting.as_ref().unwrap();
            assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
            let init = cond(&status, INITIALIZED);
            assert_eq!(init.status, "False");
            assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
            assert_eq!(
                init.message.as_deref(),
                Some("containers with incomplete status: [init]")
            );
        }

        // Crash-looping init container: waiting with the failure as last state is still a failure.
        fail_start(&reasons, "init", "CrashLoopBackOff");
        let status = generate(&pod("Always", &["init"], &["app"]), &rt, &reasons);
        let init_status = &status.init_container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            init_status
                .state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("CrashLoopBackOff")
        );
        assert_eq!(status.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn containers_of_a_pod_with_init_containers_wait_with_pod_initializing_until_they_run() {
        let reasons = ReasonCache::new();
        let p = pod("Always", &["init1", "init2"], &["app"]);
        let status = generate(&p, &runtime(vec![running("i1", "init1", 0)]), &reasons);
        let init = status.init_container_statuses.as_ref().unwrap();
        assert!(init[0].state.as_ref().unwrap().running.is_some());
        let waiting = init[1].state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
        let waiting = app_state(&status, 0).waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
        let status = generate(&p, &runtime(vec![]), &reasons);
        let first = status.init_container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap();
        assert_eq!(
            first.waiting.as_ref().unwrap().reason.as_deref(),
            Some("PodInitializing"),
            "the first init container too"
        );
    }

    fn sidecar_pod(policy: &str) -> Pod {
        let mut p = pod(policy, &["side"], &["app"]);
        let init = p.spec.as_mut().unwrap().init_containers.as_mut().unwrap();
        init[0].restart_policy = Some("Always".to_owned());
        p
    }

    fn phase_of(p: &Pod, containers: Vec<ContainerStatus>, probes: &dyn ProbeView) -> String {
        let reasons = ReasonCache::new();
        let status = generate_at(
            p,
            &runtime(containers),
            &StatusInputs {
                probes,
                ..inputs(&reasons, None)
            },
            at(1_000),
        );
        status.phase.unwrap()
    }

    #[test]
    fn a_sidecar_counts_for_the_phase_while_it_runs_and_not_once_it_stopped() {
        let all = Verdicts {
            started: &["s1", "a1"],
            ready: &[],
        };
        let p = sidecar_pod("Never");
        let not_started = Verdicts {
            started: &[],
            ready: &[],
        };
        assert_eq!(
            phase_of(&p, vec![running("s1", "side", 0)], &not_started),
            "Pending"
        );
        assert_eq!(
            phase_of(&p, vec![running("s1", "side", 0)], &all),
            "Pending",
            "app not created yet"
        );
        let app_done = || exited("a1", "app", 0, 0);
        assert_eq!(
            phase_of(&p, vec![app_done(), running("s1", "side", 0)], &all),
            "Running",
            "the sidecar still runs"
        );
        assert_eq!(
            phase_of(&p, vec![app_done(), exited("s1", "side", 137, 0)], &all),
            "Succeeded",
            "a sidecar stopped with the pod does not fail it"
        );
        let crash_looping = vec![
            running("a1", "app", 0),
            exited("s2", "side", 1, 1),
            exited("s1", "side", 1, 0),
        ];
        assert_eq!(
            phase_of(&sidecar_pod("Always"), crash_looping, &all),
            "Running",
            "a restarting sidecar does not make a running pod pending"
        );
    }

    #[test]
    fn completed_init_container_lets_the_pod_run() {
        let reasons = ReasonCache::new();
        let status = generate(
            &pod("Always", &["init"], &["app"]),
            &runtime(vec![running("a1", "app", 0), exited("i1", "init", 0, 0)]),
            &reasons,
        );
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&status, INITIALIZED).status, "True");
        let init_status = &status.init_container_statuses.as_ref().unwrap()[0];
        assert!(init_status.ready, "a completed init container is ready");
        assert_eq!(init_status.started, Some(false));

        let status = generate(
            &pod("Always", &["init"], &["app"]),
            &runtime(vec![running("i1", "init", 0)]),
            &reasons,
        );
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let waiting = app_state(&status, 0).waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
    }

    #[test]
    fn pod_ips_for_host_network_and_sandbox_network() {
        let reasons = ReasonCache::new();
        let mut host = pod("Always", &[], &["a"]);
        host.spec.as_mut().unwrap().host_network = Some(true);
        let mut rt = runtime(vec![running("c", "a", 0)]);
        rt.ips.clear();
        rt.sandboxes[0].ip = None;
        rt.sandboxes[0].host_network = true;
        let status = generate(&host, &rt, &reasons);
        assert_eq!(status.pod_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "192.168.1.10");
        assert_eq!(status.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(status.host_ips.as_ref().unwrap()[0].ip, "192.168.1.10");
        assert_eq!(cond(&status, POD_READY_TO_START_CONTAINERS).status, "True");

        let status = generate(
            &pod("Always", &[], &["a"]),
            &runtime(vec![running("c", "a", 0)]),
            &reasons,
        );
        assert_eq!(status.pod_ip.as_deref(), Some("10.1.0.5"));
        assert_eq!(status.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));

        let mut no_sandbox = runtime(vec![]);
        no_sandbox.sandboxes.clear();
        no_sandbox.ips.clear();
        let status = generate(&pod("Always", &[], &["a"]), &no_sandbox, &reasons);
        assert_eq!(status.pod_ip, None);
        assert_eq!(cond(&status, POD_READY_TO_START_CONTAINERS).status, "False");
    }

    #[test]
    fn conditions_keep_transition_times_while_unchanged() {
        let reasons = ReasonCache::new();
        let p = pod("Always", &[], &["a"]);
        let first = generate_at(&p, &runtime(vec![]), &inputs(&reasons, None), at(100));
        assert!(
            first
                .conditions
                .as_ref()
                .unwrap()
                .iter()
                .all(|c| c.last_transition_time == Some(Time(at(100))))
        );
        assert_eq!(cond(&first, READY).status, "False");
        assert_eq!(first.start_time, Some(Time(at(100))));

        let same = generate_at(
            &p,
            &runtime(vec![]),
            &inputs(&reasons, Some(&first)),
            at(200),
        );
        assert_eq!(same, first, "an unchanged pod regenerates the same status");

        let second = generate_at(
            &p,
            &runtime(vec![running("c", "a", 0)]),
            &inputs(&reasons, Some(&first)),
            at(300),
        );
        assert_eq!(cond(&second, READY).status, "True");
        assert_eq!(
            cond(&second, READY).last_transition_time,
            Some(Time(at(300)))
        );
        assert_eq!(
            cond(&second, CONTAINERS_READY).last_transition_time,
            Some(Time(at(300)))
        );
        assert_eq!(
            cond(&second, POD_SCHEDULED).last_transition_time,
            Some(Time(at(100)))
        );
        assert_eq!(second.start_time, Some(Time(at(100))));
    }

    fn with_gates(mut p: Pod, gates: &[&str]) -> Pod {
        p.spec.as_mut().unwrap().readiness_gates = Some(
            gates
                .iter()
                .map(|gate| PodReadinessGate {
                    condition_type: (*gate).to_owned(),
                })
                .collect(),
        );
        p
    }

    /// `pod` as the API server has it, with `conditions` set there.
    fn watched(mut p: Pod, conditions: &[(&str, &str)]) -> Pod {
        p.status = Some(ApiPodStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(kind, status)| PodCondition {
                        type_: (*kind).to_owned(),
                        status: (*status).to_owned(),
                        ..PodCondition::default()
                    })
                    .collect(),
            ),
            ..ApiPodStatus::default()
        });
        p
    }

    #[test]
    fn terminal_phase_and_foreign_conditions_are_kept() {
        let reasons = ReasonCache::new();
        let p = with_gates(pod("Never", &[], &["a"]), &["example.com/gate"]);
        let running_status = generate(&p, &runtime(vec![running("c", "a", 0)]), &reasons);
        let ready = cond(&running_status, READY);
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some(
                "corresponding condition of pod readiness gate \"example.com/gate\" does not exist."
            )
        );

        let previous = generate(&p, &runtime(vec![exited("c", "a", 1, 0)]), &reasons);
        assert_eq!(previous.phase.as_deref(), Some("Failed"));
        let p = watched(p, &[("example.com/gate", "True"), (READY, "False")]);
        let mut gone = runtime(vec![]);
        gone.sandboxes.clear();
        let status = generate_at(&p, &gone, &inputs(&reasons, Some(&previous)), at(5_000));
        assert_eq!(
            status.phase.as_deref(),
            Some("Failed"),
            "terminal phase is final"
        );
        assert_eq!(cond(&status, "example.com/gate").status, "True");
        let ready_conditions = status.conditions.iter().flatten();
        assert_eq!(
            ready_conditions.filter(|c| c.type_ == READY).count(),
            1,
            "the API server's Ready is not kept beside ours"
        );
    }

    #[test]
    fn readiness_gates_are_judged_on_the_conditions_the_api_server_has() {
        let reasons = ReasonCache::new();
        let gates = ["example.com/one", "example.com/two"];
        let rt = runtime(vec![running("c", "a", 0)]);
        let p = with_gates(pod("Always", &[], &["a"]), &gates);

        let half = watched(p.clone(), &[(gates[0], "True"), (gates[1], "False")]);
        let status = generate(&half, &rt, &reasons);
        let ready = cond(&status, READY);
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("the status of pod readiness gate \"example.com/two\" is not \"True\", but False")
        );
        assert_eq!(cond(&status, gates[0]).status, "True", "kept as set");

        let open = watched(p.clone(), &[(gates[0], "True"), (gates[1], "True")]);
        let status = generate_at(&open, &rt, &inputs(&reasons, Some(&status)), at(2_000));
        assert_eq!(cond(&status, READY).status, "True");
        assert_eq!(cond(&status, READY).message, None);
        assert_eq!(
            cond(&status, READY).last_transition_time,
            Some(Time(at(2_000)))
        );

        // Set back to False on the API server: our own last status saying True does not count.
        let closed = watched(p, &[(gates[0], "False"), (gates[1], "True")]);
        let status = generate_at(&closed, &rt, &inputs(&reasons, Some(&status)), at(3_000));
        assert_eq!(cond(&status, READY).status, "False");
        assert_eq!(cond(&status, gates[0]).status, "False");
    }

    #[test]
    fn a_readiness_verdict_judges_the_gates_on_the_watched_pod() {
        let reasons = ReasonCache::new();
        let gate = "example.com/gate";
        let p = with_gates(pod("Always", &[], &["a"]), &[gate]);
        let not_ready = Verdicts {
            started: &["ca"],
            ready: &[],
        };
        let status = generate_at(
            &p,
            &runtime(vec![running("ca", "a", 0)]),
            &StatusInputs {
                probes: &not_ready,
                ..inputs(&reasons, None)
            },
            at(1_000),
        );
        let id = ContainerId::from("ca");
        let open = watched(p, &[(gate, "True")]);
        let ready = with_container_readiness(&open, &status, &id, true).unwrap();
        assert_eq!(cond(&ready, READY).status, "True");
    }

    #[test]
    fn a_gate_set_on_the_api_server_asks_for_a_readiness_reconcile() {
        let gate = "example.com/gate";
        let reasons = ReasonCache::new();
        let p = with_gates(pod("Always", &[], &["a"]), &[gate]);
        let reported = generate(&p, &runtime(vec![running("c", "a", 0)]), &reasons);
        let on_api = |gate_status: Option<&str>| {
            let mut api = p.clone();
            let mut status = reported.clone();
            if let Some(gate_status) = gate_status {
                status.conditions.as_mut().unwrap().push(PodCondition {
                    type_: gate.to_owned(),
                    status: gate_status.to_owned(),
                    ..PodCondition::default()
                });
            }
            api.status = Some(status);
            api
        };
        assert!(!needs_readiness_reconcile(&on_api(None)), "as reported");
        assert!(needs_readiness_reconcile(&on_api(Some("True"))));
        assert!(
            needs_readiness_reconcile(&on_api(Some("False"))),
            "the message changes"
        );

        let mut no_ready_yet = on_api(Some("True"));
        let conditions = no_ready_yet.status.as_mut().unwrap().conditions.as_mut();
        conditions.unwrap().retain(|c| c.type_ != READY);
        assert!(!needs_readiness_reconcile(&no_ready_yet));

        let mut no_gates = on_api(Some("True"));
        no_gates.spec.as_mut().unwrap().readiness_gates = None;
        assert!(!needs_readiness_reconcile(&no_gates));
    }

    #[test]
    fn container_ids_are_named_after_the_runtime() {
        let reasons = ReasonCache::new();
        let p = pod("Always", &[], &["a"]);
        let rt = runtime(vec![running("c2", "a", 1), exited("c1", "a", 1, 0)]);
        let status = generate_at(
            &p,
            &rt,
            &StatusInputs {
                runtime_name: Some("cri-o"),
                resize: None,
                ..inputs(&reasons, None)
            },
            at(1_000),
        );
        let app = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(app.container_id.as_deref(), Some("cri-o://c2"));
        let last = app
            .last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(last.container_id.as_deref(), Some("cri-o://c1"));
        let marked = with_container_readiness(&p, &status, &ContainerId::from("c2"), false);
        assert!(marked.is_some(), "found by its id whatever the scheme");

        let unnamed = StatusInputs {
            runtime_name: None,
            resize: None,
            ..inputs(&reasons, None)
        };
        let status = generate_at(&p, &rt, &unnamed, at(1_000));
        assert_eq!(status.container_statuses.unwrap()[0].container_id, None);
    }

    #[test]
    fn json_uses_kubernetes_field_names() {
        let reasons = ReasonCache::new();
        let mut oom = exited("c1", "a", 137, 0);
        oom.reason = "OOMKilled".to_owned();
        let status = generate(&pod("Never", &[], &["a"]), &runtime(vec![oom]), &reasons);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["phase"], "Failed");
        assert_eq!(json["hostIP"], "192.168.1.10");
        assert_eq!(json["hostIPs"][0]["ip"], "192.168.1.10");
        assert_eq!(json["podIP"], "10.1.0.5");
        assert_eq!(json["podIPs"][0]["ip"], "10.1.0.5");
        assert_eq!(json["qosClass"], "BestEffort");
        assert_eq!(json["startTime"], "1970-01-01T00:16:40Z");
        let condition_types: Vec<&str> = json["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            condition_types,
            [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled"
            ]
        );
        assert_eq!(
            json["conditions"][2]["lastTransitionTime"],
            "1970-01-01T00:16:40Z"
        );
        let cs = &json["containerStatuses"][0];
        assert_eq!(cs["name"], "a");
        assert_eq!(cs["containerID"], "containerd://c1");
        assert_eq!(cs["imageID"], "sha256:abc");
        assert_eq!(cs["restartCount"], 0);
        assert_eq!(cs["ready"], false);
        let t = &cs["state"]["terminated"];
        assert_eq!(t["exitCode"], 137);
        assert_eq!(t["reason"], "OOMKilled");
        assert_eq!(t["containerID"], "containerd://c1");
        assert_eq!(t["startedAt"], "1970-01-01T00:00:11Z");
        assert_eq!(t["finishedAt"], "1970-01-01T00:00:12Z");
    }

    fn with_ephemeral(mut p: Pod, names: &[&str]) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.ephemeral_containers = Some(
                names
                    .iter()
                    .map(|n| k8s_openapi::api::core::v1::EphemeralContainer {
                        name: (*n).to_owned(),
                        image: Some("busybox".to_owned()),
                        ..k8s_openapi::api::core::v1::EphemeralContainer::default()
                    })
                    .collect(),
            );
        }
        p
    }

    #[test]
    fn ephemeral_containers_have_statuses_of_their_own_that_leave_the_pod_alone() {
        let p = with_ephemeral(pod("Always", &[], &["a"]), &["dbg", "dbg2", "dbg3"]);
        let reasons = ReasonCache::new();
        fail_start(&reasons, "dbg3", "ErrImagePull");
        let rt = runtime(vec![
            running("c1", "a", 0),
            running("e1", "dbg", 0),
            exited("e2", "dbg2", 1, 0),
        ]);
        let status = generate(&p, &rt, &reasons);
        assert_eq!(status.phase.as_deref(), Some(RUNNING));
        assert_eq!(cond(&status, READY).status, "True");
        assert_eq!(status.container_statuses.as_ref().unwrap().len(), 1);
        let ephemeral = status.ephemeral_container_statuses.as_ref().unwrap();
        let names: Vec<&str> = ephemeral.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["dbg", "dbg2", "dbg3"]);
        let dbg = &ephemeral[0];
        assert!(dbg.state.as_ref().unwrap().running.is_some());
        assert_eq!(dbg.container_id.as_deref(), Some("containerd://e1"));
        assert_eq!((dbg.started, dbg.ready), (None, false));
        assert_eq!(
            terminated(ephemeral[1].state.as_ref()).unwrap().exit_code,
            1,
            "an exited ephemeral container is never restarted, so it does not wait"
        );
        let waiting = ephemeral[2].state.as_ref().unwrap().waiting.as_ref();
        assert_eq!(
            waiting.unwrap().reason.as_deref(),
            Some("ErrImagePull"),
            "one that could not start yet waits with the reason"
        );
        assert!(
            generate(&pod("Always", &[], &["a"]), &rt, &reasons)
                .ephemeral_container_statuses
                .is_none()
        );
    }

    #[test]
    fn the_start_time_is_kept_from_the_api_server_when_the_agent_has_none() {
        let mut p = pod("Always", &[], &["a"]);
        p.status = Some(ApiPodStatus {
            start_time: Some(Time(at(500))),
            ..ApiPodStatus::default()
        });
        let rt = runtime(vec![running("c1", "a", 0)]);
        let status = generate(&p, &rt, &ReasonCache::new());
        assert_eq!(status.start_time, Some(Time(at(500))));
        let previous = ApiPodStatus {
            start_time: Some(Time(at(700))),
            ..ApiPodStatus::default()
        };
        let ours = generate_at(
            &p,
            &rt,
            &inputs(&ReasonCache::new(), Some(&previous)),
            at(1_000),
        );
        assert_eq!(ours.start_time, Some(Time(at(700))));
        let fresh = generate(&pod("Always", &[], &["a"]), &rt, &ReasonCache::new());
        assert_eq!(fresh.start_time, Some(Time(at(1_000))));
    }
}
