//! The API status of a pod from the runtime's view of it (the kubelet's `generateAPIPodStatus`,
//! `convertToAPIContainerStatuses`, `getPhase` and the condition generators of
//! `pkg/kubelet/status/generate.go`).

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus as ApiContainerStatus, HostIP,
    Pod, PodCondition, PodIP, PodSpec, PodStatus as ApiPodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::CONTAINER_ID_SCHEME;
use super::qos::qos_class;
use super::reason_cache::ReasonCache;
use crate::container::{ContainerState, ContainerStatus, PodStatus, PodUid, SandboxState};

const PENDING: &str = "Pending";
const RUNNING: &str = "Running";
const SUCCEEDED: &str = "Succeeded";
const FAILED: &str = "Failed";

const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
const INITIALIZED: &str = "Initialized";
const READY: &str = "Ready";
const CONTAINERS_READY: &str = "ContainersReady";
const POD_SCHEDULED: &str = "PodScheduled";
const KUBELET_CONDITIONS: [&str; 5] = [
    POD_READY_TO_START_CONTAINERS,
    INITIALIZED,
    READY,
    CONTAINERS_READY,
    POD_SCHEDULED,
];

/// The API status of `pod` given what the runtime reports for it, the start failures in `reasons`
/// and the previously generated status (`previous`, whose start time, terminal phase, condition
/// transition times and foreign conditions are kept). `host_ip` is the node's IP; host-network pods
/// report it as their pod IP.
pub fn generate_api_pod_status(
    pod: &Pod,
    runtime: &PodStatus,
    reasons: &ReasonCache,
    previous: Option<&ApiPodStatus>,
    host_ip: &str,
) -> ApiPodStatus {
    generate_at(pod, runtime, reasons, previous, host_ip, wall_clock_now())
}

/// The wall-clock time (jiff's own `now` needs a feature k8s-openapi does not enable).
fn wall_clock_now() -> Timestamp {
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
    reasons: &ReasonCache,
    previous: Option<&ApiPodStatus>,
    host_ip: &str,
    now: Timestamp,
) -> ApiPodStatus {
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
    };
    let init_statuses: Vec<ApiContainerStatus> = init_specs
        .iter()
        .map(|c| context.container_status(c, ContainerKind::Init))
        .collect();
    let app_kind = if init_specs.is_empty() {
        ContainerKind::App
    } else {
        ContainerKind::AppAfterInit
    };
    let app_statuses: Vec<ApiContainerStatus> = spec
        .containers
        .iter()
        .map(|c| context.container_status(c, app_kind))
        .collect();

    let mut phase = get_phase(spec, &init_statuses, &app_statuses);
    // A terminal phase is final: containers of a finished pod may be removed, which must not bring
    // the pod back to Pending.
    if let Some(old) = previous.and_then(|p| p.phase.as_deref())
        && (old == SUCCEEDED || old == FAILED)
    {
        phase = old;
    }

    let generation = pod.metadata.generation;
    let now_time = Time(truncate(now));
    let mut conditions = vec![
        ready_to_start_condition(spec, runtime),
        initialized_condition(spec, &init_statuses, &app_statuses, phase),
        ready_condition(spec, &init_statuses, &app_statuses, phase, previous),
        containers_ready_condition(spec, &init_statuses, &app_statuses, phase),
        PodCondition {
            type_: POD_SCHEDULED.to_owned(),
            status: "True".to_owned(),
            ..PodCondition::default()
        },
    ];
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
    // Conditions owned by others (readiness gates) are kept as they were.
    if let Some(old) = previous.and_then(|p| p.conditions.as_deref()) {
        conditions.extend(
            old.iter()
                .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
                .cloned(),
        );
    }

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
        start_time: previous
            .and_then(|p| p.start_time.clone())
            .or(Some(now_time)),
        qos_class: Some(qos_class(spec).to_owned()),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(app_statuses),
        observed_generation: generation,
        ..ApiPodStatus::default()
    }
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
    /// An app container of a pod without init containers.
    App,
    /// An app container of a pod with init containers: it waits with `PodInitializing`.
    AppAfterInit,
}

struct StatusContext<'a> {
    spec: &'a PodSpec,
    uid: &'a PodUid,
    runtime: &'a PodStatus,
    reasons: &'a ReasonCache,
    deleting: bool,
}

impl StatusContext<'_> {
    fn container_status(&self, container: &Container, kind: ContainerKind) -> ApiContainerStatus {
        let waiting_reason = if kind == ContainerKind::AppAfterInit {
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
                let mut status = convert(current);
                if let Some(previous) = instances.next() {
                    status.last_state = convert(previous).state;
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
        if !succeeded_init
            && self.should_restart(container, newest)
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

        let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
        status.started = Some(running);
        // Without probes a running container is ready; a regular init container is ready once it
        // has completed.
        status.ready = if kind == ContainerKind::Init && !is_sidecar(container) {
            terminated(status.state.as_ref()).is_some_and(|t| t.exit_code == 0)
        } else {
            running
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

fn convert(status: &ContainerStatus) -> ApiContainerStatus {
    let container_id = format!("{CONTAINER_ID_SCHEME}://{}", status.id);
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
                    container_id: Some(container_id.clone()),
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
        container_id: Some(container_id),
        restart_count: i32::try_from(status.restart_count).unwrap_or(i32::MAX),
        state: Some(state),
        ..ApiContainerStatus::default()
    }
}

/// An init container with `restartPolicy: Always` keeps running beside the app containers.
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn terminated(state: Option<&ApiContainerState>) -> Option<&ContainerStateTerminated> {
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
) -> &'static str {
    let mut pending_init = 0;
    let mut failed_init = 0;
    for container in spec.init_containers.as_deref().unwrap_or_default() {
        let Some(status) = find(init, &container.name) else {
            pending_init += 1;
            continue;
        };
        let state = status.state.as_ref();
        if is_sidecar(container) {
            if !state.is_some_and(|s| s.running.is_some()) {
                pending_init += 1;
            }
            continue;
        }
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

    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
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
        if policy == "Always" {
            return RUNNING;
        }
        if stopped == succeeded {
            return SUCCEEDED;
        }
        if policy == "Never" {
            return FAILED;
        }
        return RUNNING;
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
    if phase == SUCCEEDED && unknown.is_empty() && !init_specs.is_empty() {
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

fn ready_condition(
    spec: &PodSpec,
    init: &[ApiContainerStatus],
    app: &[ApiContainerStatus],
    phase: &str,
    previous: Option<&ApiPodStatus>,
) -> PodCondition {
    let containers_ready = containers_ready_condition(spec, init, app, phase);
    if containers_ready.status != "True" {
        return PodCondition {
            type_: READY.to_owned(),
            ..containers_ready
        };
    }
    let old_conditions = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or_default();
    let unready: Vec<String> = spec
        .readiness_gates
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|gate| {
            match old_conditions
                .iter()
                .find(|c| c.type_ == gate.condition_type)
            {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{}\" does not exist.",
                    gate.condition_type
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                    gate.condition_type, c.status
                )),
                Some(_) => None,
            }
        })
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
