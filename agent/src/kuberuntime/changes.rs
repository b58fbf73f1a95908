//! What a pod sync has to do, decided from the spec, the runtime's view and the probes' verdicts
//! alone (the kubelet's `computePodActions`; the init containers' part, restartable ones included,
//! is `computeInitContainerActions`, in [`init`]; the ephemeral containers' in [`ephemeral`]). A
//! pure function, so every decision is testable without a runtime; back-off and image checks
//! happen later, in the sync itself.

mod ephemeral;
mod init;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::labels::container_hash;
use crate::container::{
    ContainerId, ContainerState, ContainerStatus, PodStatus, SandboxId, SandboxState,
};

/// A pod's restart policy (`spec.restartPolicy`, default Always).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The pod's policy; an unknown value is treated as the default, Always.
    pub fn of(pod: &Pod) -> Self {
        match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("Never") => Self::Never,
            Some("OnFailure") => Self::OnFailure,
            _ => Self::Always,
        }
    }

    fn restarts_on_failure(self) -> bool {
        self != Self::Never
    }
}

/// Which probe condemned a running container whose spec is unchanged (the kubelet's
/// `containerKillReason` for probes): its verdict is a failure, so the container is killed (with
/// the probe's own `terminationGracePeriodSeconds`, if set) and restarted per the restart policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKill {
    Liveness,
    Startup,
}

impl ProbeKill {
    fn describe(self) -> &'static str {
        match self {
            Self::Liveness => "failed liveness probe",
            Self::Startup => "failed startup probe",
        }
    }
}

/// What the probes say about a running container instance (the kubelet's liveness and startup
/// result managers, as `computePodActions` reads them).
pub trait ProbeVerdicts {
    /// The probe whose failed verdict condemns the container although its spec is unchanged
    /// (liveness, or startup); `None` keeps it running.
    fn restart_reason(&self, id: &ContainerId) -> Option<ProbeKill>;
    /// Whether the container's startup probe has succeeded; asked only about containers that have
    /// one.
    fn startup_succeeded(&self, id: &ContainerId) -> bool;
}

/// A running container the sync must stop, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    pub id: ContainerId,
    pub name: String,
    /// The `Killing` event's message.
    pub message: String,
    /// Set when a probe's verdict is the reason.
    pub probe: Option<ProbeKill>,
}

/// An init container that failed under restartPolicy Never: the pod has failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitFailure {
    pub name: String,
    pub exit_code: i32,
}

/// The steps of one sync (the kubelet's `podActions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox (before re-creating it, or because the pod is done).
    pub kill_pod: bool,
    pub create_sandbox: bool,
    /// The ready sandbox to use when none is created.
    pub sandbox_id: Option<SandboxId>,
    /// Attempt number for a new sandbox.
    pub attempt: u32,
    /// Indexes into `spec.initContainers` to start, in spec order: the next one of the init
    /// sequence, and restartable (sidecar) ones that must run again.
    pub init_containers_to_start: Vec<usize>,
    pub init_failed: Option<InitFailure>,
    /// Indexes into `spec.containers`.
    pub containers_to_start: Vec<usize>,
    pub containers_to_kill: Vec<ContainerToKill>,
    /// Indexes into `spec.ephemeralContainers`.
    pub ephemeral_containers_to_start: Vec<usize>,
}

impl PodActions {
    /// Adds the restarts an in-place resize needs (`resizePolicy: RestartContainer`): each
    /// container is killed, then started again with its new resources.
    pub fn restart_for_resize(&mut self, restarts: &[(usize, ContainerToKill)]) {
        for (index, kill) in restarts {
            if self.containers_to_kill.iter().any(|k| k.id == kill.id) {
                continue;
            }
            self.containers_to_kill.push(kill.clone());
            if !self.containers_to_start.contains(index) {
                self.containers_to_start.push(*index);
            }
        }
        self.containers_to_start.sort_unstable();
    }
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// An init container with `restartPolicy: Always` (a sidecar): it is started in the init sequence
/// and keeps running next to the regular containers (the kubelet's `IsRestartableInitContainer`).
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The kubelet's name of a container state, as its kill messages quote it.
fn state_name(state: ContainerState) -> &'static str {
    match state {
        ContainerState::Created => "created",
        ContainerState::Running => "running",
        ContainerState::Exited => "exited",
        ContainerState::Unknown => "unknown",
    }
}

/// Whether the pod needs a new sandbox, with the attempt number and the sandbox to keep otherwise.
fn sandbox_changed(pod: &Pod, status: &PodStatus) -> (bool, u32, Option<SandboxId>) {
    let Some(newest) = status.sandboxes.first() else {
        return (true, 0, None);
    };
    let ready = status
        .sandboxes
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    let changed = ready != 1
        || newest.state != SandboxState::Ready
        || newest.host_network != host_network(pod)
        || (!newest.host_network && newest.ip.as_deref().is_none_or(str::is_empty));
    if changed {
        (true, newest.attempt + 1, Some(newest.id.clone()))
    } else {
        (false, newest.attempt, Some(newest.id.clone()))
    }
}

fn succeeded(status: Option<&ContainerStatus>) -> bool {
    status.is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
}

/// Whether any regular container has ever been created (the kubelet's
/// `hasAnyRegularContainerCreated`): the pod got through its init containers once.
fn any_regular_container_created(pod: &Pod, status: &PodStatus) -> bool {
    containers(pod).iter().any(|c| {
        status.container(&c.name).is_some_and(|s| {
            matches!(
                s.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
}

/// Whether a container that is not running should be (re)started under `policy`.
fn should_restart(status: Option<&ContainerStatus>, policy: RestartPolicy) -> bool {
    let Some(status) = status else {
        return true;
    };
    match status.state {
        ContainerState::Running => false,
        // Created but never started (a failed start): it never ran, so try again.
        ContainerState::Created => true,
        ContainerState::Unknown => policy != RestartPolicy::Never,
        ContainerState::Exited => match policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => status.exit_code != 0,
            RestartPolicy::Never => false,
        },
    }
}

/// Fills in the actions for a pod whose sandbox must be (re)created.
fn plan_new_sandbox(
    pod: &Pod,
    status: &PodStatus,
    policy: RestartPolicy,
    actions: &mut PodActions,
) {
    // A Never pod whose containers already ran is finished: its sandbox is not re-created.
    if !policy.restarts_on_failure() && actions.attempt != 0 && !status.containers.is_empty() {
        actions.create_sandbox = false;
        return;
    }
    let to_start: Vec<usize> = containers(pod)
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            !(policy == RestartPolicy::OnFailure && succeeded(status.container(&c.name)))
        })
        .map(|(i, _)| i)
        .collect();
    // Nothing left to run in a pod that got through its init containers: it is done.
    if to_start.is_empty() && any_regular_container_created(pod, status) {
        actions.create_sandbox = false;
        return;
    }
    if init_containers(pod).is_empty() {
        actions.containers_to_start = to_start;
    } else {
        // A new sandbox runs the init sequence again from the start.
        actions.init_containers_to_start = vec![0];
    }
}

/// Which app containers to keep, restart or start; returns how many running ones are kept.
fn plan_app_containers(
    pod: &Pod,
    status: &PodStatus,
    policy: RestartPolicy,
    probes: &dyn ProbeVerdicts,
    actions: &mut PodActions,
) -> usize {
    let mut keep = 0;
    for (i, c) in containers(pod).iter().enumerate() {
        let current = status.container(&c.name);
        match current {
            Some(s) if s.state == ContainerState::Running => {
                if s.hash != container_hash(c) {
                    actions.containers_to_kill.push(ContainerToKill {
                        id: s.id.clone(),
                        name: c.name.clone(),
                        message: format!(
                            "Container {} definition changed, will be restarted",
                            c.name
                        ),
                        probe: None,
                    });
                    actions.containers_to_start.push(i);
                } else if let Some(kill) = probes.restart_reason(&s.id) {
                    let mut message = format!("Container {} {}", c.name, kill.describe());
                    if policy.restarts_on_failure() {
                        message.push_str(", will be restarted");
                        actions.containers_to_start.push(i);
                    }
                    actions.containers_to_kill.push(ContainerToKill {
                        id: s.id.clone(),
                        name: c.name.clone(),
                        message,
                        probe: Some(kill),
                    });
                } else {
                    keep += 1;
                }
            }
            _ => {
                if should_restart(current, policy) {
                    actions.containers_to_start.push(i);
                    // It may still run for all the runtime knows: stop it before starting
                    // another instance.
                    if let Some(s) = current.filter(|s| s.state == ContainerState::Unknown) {
                        actions.containers_to_kill.push(ContainerToKill {
                            id: s.id.clone(),
                            name: c.name.clone(),
                            message: format!(
                                "Container is in {:?} state, try killing it before restart",
                                state_name(s.state)
                            ),
                            probe: None,
                        });
                    }
                }
            }
        }
    }

    keep
}

/// Decides what the sync must do to move the runtime towards the pod spec, given what the probes
/// say about the running containers.
pub fn compute_pod_actions(
    pod: &Pod,
    status: &PodStatus,
    probes: &dyn ProbeVerdicts,
) -> PodActions {
    let policy = RestartPolicy::of(pod);
    let (create_sandbox, attempt, sandbox_id) = sandbox_changed(pod, status);
    let mut actions = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        sandbox_id,
        attempt,
        ..PodActions::default()
    };

    if create_sandbox {
        plan_new_sandbox(pod, status, policy, &mut actions);
        return actions;
    }

    let initialized = init::plan_init_containers(pod, status, policy, probes, &mut actions);
    // Ephemeral containers may start while the pod initializes, not in a pod that is stopped.
    if !actions.kill_pod {
        actions.ephemeral_containers_to_start = ephemeral::to_start(pod, status);
    }
    if actions.kill_pod || !initialized {
        // Failed, or still initializing: the regular containers wait.
        return actions;
    }

    let keep = plan_app_containers(pod, status, policy, probes, &mut actions);

    // Running containers the spec no longer names (only the newest instance of a name can run).
    let known = |name: &str| {
        containers(pod).iter().any(|c| c.name == name)
            || init_containers(pod).iter().any(|c| c.name == name)
            || ephemeral::ephemeral_containers(pod)
                .iter()
                .any(|c| c.name == name)
    };
    for s in &status.containers {
        if s.state == ContainerState::Running && !known(&s.name) {
            actions.containers_to_kill.push(ContainerToKill {
                id: s.id.clone(),
                name: s.name.clone(),
                message: format!("Container {} is not in the pod spec", s.name),
                probe: None,
            });
        }
    }

    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
        // Sidecars serve the regular containers: they do not keep a finished pod alive.
        actions.init_containers_to_start.clear();
        actions.ephemeral_containers_to_start.clear();
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    use crate::container::{PodUid, SandboxStatus};
    use k8s_openapi::api::core::v1::PodSpec;

    /// Probe verdicts by container id; a container without one is healthy and not started.
    #[derive(Default)]
    struct Probes {
        kill: HashMap<ContainerId, ProbeKill>,
        started: HashSet<ContainerId>,
    }

    impl Probes {
        fn killing(name: &str, kill: ProbeKill) -> Self {
            Self {
                kill: HashMap::from([(id(name), kill)]),
                ..Self::default()
            }
        }

        fn started(name: &str) -> Self {
            Self {
                started: HashSet::from([id(name)]),
                ..Self::default()
            }
        }
    }

    impl ProbeVerdicts for Probes {
        fn restart_reason(&self, id: &ContainerId) -> Option<ProbeKill> {
            self.kill.get(id).copied()
        }

        fn startup_succeeded(&self, id: &ContainerId) -> bool {
            self.started.contains(id)
        }
    }

    fn healthy() -> Probes {
        Probes::default()
    }

    fn id(name: &str) -> ContainerId {
        ContainerId::from(format!("id-{name}"))
    }

    /// A container; one named `sc…` is a sidecar (`restartPolicy: Always`).
    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            restart_policy: name.starts_with("sc").then(|| "Always".into()),
            ..Container::default()
        }
    }

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: Some(inits.iter().map(|n| container(n)).collect()),
                containers: apps.iter().map(|n| container(n)).collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn sandbox(id: &str, state: SandboxState, attempt: u32) -> SandboxStatus {
        SandboxStatus {
            id: SandboxId::from(id),
            state,
            created_at: 1,
            attempt,
            ip: Some("10.88.0.2".into()),
            host_network: false,
        }
    }

    fn status_of(name: &str, state: ContainerState, exit_code: i32) -> ContainerStatus {
        ContainerStatus {
            id: id(name),
            name: name.into(),
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code,
            image: "busybox".into(),
            image_ref: String::new(),
            hash: container_hash(&container(name)),
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn status(sandboxes: Vec<SandboxStatus>, containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            uid: PodUid::from("u"),
            sandboxes,
            containers,
            ..PodStatus::default()
        }
    }

    fn ready() -> Vec<SandboxStatus> {
        vec![sandbox("s1", SandboxState::Ready, 0)]
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_containers() {
        let a = compute_pod_actions(
            &pod("Always", &[], &["a", "b"]),
            &PodStatus::default(),
            &healthy(),
        );
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, [0, 1]);
    }

    #[test]
    fn a_new_pod_with_init_containers_starts_the_first_init_only() {
        let a = compute_pod_actions(
            &pod("Always", &["i1", "i2"], &["a"]),
            &PodStatus::default(),
            &healthy(),
        );
        assert!(a.create_sandbox);
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn a_dead_sandbox_is_recreated_with_the_next_attempt() {
        let s = status(
            vec![sandbox("s1", SandboxState::NotReady, 2)],
            vec![status_of("a", ContainerState::Exited, 137)],
        );
        let a = compute_pod_actions(&pod("Always", &[], &["a"]), &s, &healthy());
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.attempt, 3);
    }

    #[test]
    fn a_finished_never_pod_is_not_recreated() {
        let s = status(
            vec![sandbox("s1", SandboxState::NotReady, 0)],
            vec![status_of("a", ContainerState::Exited, 1)],
        );
        let a = compute_pod_actions(&pod("Never", &[], &["a"]), &s, &healthy());
        assert!(!a.create_sandbox);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn an_on_failure_pod_whose_containers_succeeded_is_not_recreated() {
        let s = status(
            vec![sandbox("s1", SandboxState::NotReady, 0)],
            vec![status_of("a", ContainerState::Exited, 0)],
        );
        assert!(
            !compute_pod_actions(&pod("OnFailure", &[], &["a"]), &s, &healthy()).create_sandbox
        );
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let running = status(ready(), vec![status_of("i1", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &running, &healthy());
        assert!(a.init_containers_to_start.is_empty());
        assert!(a.containers_to_start.is_empty());
        let first_done = status(ready(), vec![status_of("i1", ContainerState::Exited, 0)]);
        assert_eq!(
            compute_pod_actions(&p, &first_done, &healthy()).init_containers_to_start,
            [1]
        );
        let all_done = status(
            ready(),
            vec![
                status_of("i2", ContainerState::Exited, 0),
                status_of("i1", ContainerState::Exited, 0),
            ],
        );
        let a = compute_pod_actions(&p, &all_done, &healthy());
        assert!(a.init_containers_to_start.is_empty());
        assert_eq!(a.containers_to_start, [0]);
    }

    #[test]
    fn a_failed_init_container_fails_a_never_pod_and_is_retried_otherwise() {
        let failed = status(ready(), vec![status_of("i1", ContainerState::Exited, 3)]);
        let a = compute_pod_actions(&pod("Never", &["i1"], &["a"]), &failed, &healthy());
        assert!(a.kill_pod);
        assert_eq!(
            a.init_failed,
            Some(InitFailure {
                name: "i1".into(),
                exit_code: 3
            })
        );
        assert!(a.containers_to_start.is_empty() && a.init_containers_to_start.is_empty());
        let a = compute_pod_actions(&pod("OnFailure", &["i1"], &["a"]), &failed, &healthy());
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.init_failed.is_none());
    }

    #[test]
    fn exited_containers_follow_the_restart_policy() {
        let s = status(
            ready(),
            vec![
                status_of("ok", ContainerState::Exited, 0),
                status_of("bad", ContainerState::Exited, 1),
                status_of("run", ContainerState::Running, 0),
            ],
        );
        let apps = ["ok", "bad", "run"];
        assert_eq!(
            compute_pod_actions(&pod("Always", &[], &apps), &s, &healthy()).containers_to_start,
            [0, 1]
        );
        assert_eq!(
            compute_pod_actions(&pod("OnFailure", &[], &apps), &s, &healthy()).containers_to_start,
            [1]
        );
        let never = compute_pod_actions(&pod("Never", &[], &apps), &s, &healthy());
        assert!(never.containers_to_start.is_empty());
        assert!(!never.kill_pod, "a running container keeps the pod alive");
    }

    #[test]
    fn a_pod_with_nothing_left_to_run_is_killed() {
        let s = status(ready(), vec![status_of("a", ContainerState::Exited, 0)]);
        let a = compute_pod_actions(&pod("Never", &[], &["a"]), &s, &healthy());
        assert!(a.kill_pod && !a.create_sandbox);
    }

    #[test]
    fn a_changed_spec_restarts_the_container_and_an_unchanged_one_is_adopted() {
        let p = pod("Always", &[], &["a"]);
        let same = status(ready(), vec![status_of("a", ContainerState::Running, 0)]);
        assert_eq!(
            compute_pod_actions(&p, &same, &healthy()),
            PodActions {
                sandbox_id: Some(SandboxId::from("s1")),
                ..PodActions::default()
            }
        );
        let mut old = status_of("a", ContainerState::Running, 0);
        old.hash = "0000".into();
        let a = compute_pod_actions(&p, &status(ready(), vec![old]), &healthy());
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.containers_to_kill[0].id, ContainerId::from("id-a"));
        assert_eq!(a.containers_to_start, [0]);
    }

    #[test]
    fn running_containers_missing_from_the_spec_are_killed() {
        let s = status(
            ready(),
            vec![
                status_of("a", ContainerState::Running, 0),
                status_of("gone", ContainerState::Running, 0),
            ],
        );
        let a = compute_pod_actions(&pod("Always", &[], &["a"]), &s, &healthy());
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.containers_to_kill[0].name, "gone");
    }

    #[test]
    fn a_host_network_change_recreates_the_sandbox() {
        let mut p = pod("Always", &[], &["a"]);
        if let Some(spec) = p.spec.as_mut() {
            spec.host_network = Some(true);
        }
        let s = status(ready(), vec![status_of("a", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &s, &healthy());
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 1);
    }

    #[test]
    fn a_failed_liveness_probe_restarts_the_container_unless_never() {
        let unhealthy = Probes::killing("a", ProbeKill::Liveness);
        let s = status(ready(), vec![status_of("a", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&pod("Always", &[], &["a"]), &s, &unhealthy);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container a failed liveness probe, will be restarted"
        );
        assert_eq!(a.containers_to_kill[0].probe, Some(ProbeKill::Liveness));
        assert_eq!(a.containers_to_start, [0]);
        let a = compute_pod_actions(&pod("Never", &[], &["a"]), &s, &unhealthy);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container a failed liveness probe"
        );
        assert!(a.containers_to_start.is_empty());
        let startup = Probes::killing("a", ProbeKill::Startup);
        let a = compute_pod_actions(&pod("OnFailure", &[], &["a"]), &s, &startup);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container a failed startup probe, will be restarted"
        );
        assert_eq!(a.containers_to_start, [0]);
    }

    fn with_spec(mut p: Pod, name: &str, edit: impl Fn(&mut Container)) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            let all = spec
                .init_containers
                .iter_mut()
                .flatten()
                .chain(spec.containers.iter_mut());
            all.filter(|c| c.name == name).for_each(edit);
        }
        p
    }

    fn with_startup_probe(p: Pod, name: &str) -> Pod {
        with_spec(p, name, |c| {
            c.startup_probe = Some(k8s_openapi::api::core::v1::Probe::default());
        })
    }

    /// The status of `name` as started from `p`'s spec of it.
    fn status_in(p: &Pod, name: &str, state: ContainerState, exit_code: i32) -> ContainerStatus {
        let spec = containers(p)
            .iter()
            .chain(init_containers(p))
            .find(|c| c.name == name)
            .unwrap();
        ContainerStatus {
            hash: container_hash(spec),
            ..status_of(name, state, exit_code)
        }
    }

    #[test]
    fn a_running_sidecar_lets_the_next_init_container_start() {
        let p = pod("Always", &["sc", "i1"], &["a"]);
        let s = status(ready(), vec![status_of("sc", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &s, &healthy());
        assert_eq!(a.init_containers_to_start, [1]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
    }

    #[test]
    fn a_sidecar_with_a_startup_probe_has_started_once_the_probe_succeeded() {
        let p = with_startup_probe(pod("Always", &["sc", "i1"], &["a"]), "sc");
        let s = status(
            ready(),
            vec![status_in(&p, "sc", ContainerState::Running, 0)],
        );
        let a = compute_pod_actions(&p, &s, &healthy());
        assert!(a.init_containers_to_start.is_empty(), "{a:?}");
        assert!(a.containers_to_kill.is_empty());
        let a = compute_pod_actions(&p, &s, &Probes::started("sc"));
        assert_eq!(a.init_containers_to_start, [1]);
    }

    #[test]
    fn the_app_containers_start_once_regular_init_containers_succeeded_and_sidecars_started() {
        let p = with_startup_probe(pod("Always", &["i1", "sc"], &["a", "b"]), "sc");
        let s = status(
            ready(),
            vec![
                status_in(&p, "sc", ContainerState::Running, 0),
                status_of("i1", ContainerState::Exited, 0),
            ],
        );
        let waiting = compute_pod_actions(&p, &s, &healthy());
        assert!(waiting.containers_to_start.is_empty() && !waiting.kill_pod);
        let a = compute_pod_actions(&p, &s, &Probes::started("sc"));
        assert_eq!(a.containers_to_start, [0, 1]);
        assert!(a.init_containers_to_start.is_empty());
    }

    #[test]
    fn an_exited_sidecar_is_restarted_whatever_the_pod_restart_policy() {
        for policy in ["Always", "OnFailure", "Never"] {
            for code in [0, 1] {
                let p = pod(policy, &["sc"], &["a"]);
                let s = status(
                    ready(),
                    vec![
                        status_of("a", ContainerState::Running, 0),
                        status_of("sc", ContainerState::Exited, code),
                    ],
                );
                let a = compute_pod_actions(&p, &s, &healthy());
                assert_eq!(a.init_containers_to_start, [0], "{policy} {code}");
                assert!(a.containers_to_start.is_empty() && !a.kill_pod, "{policy}");
                assert!(a.init_failed.is_none());
            }
        }
    }

    #[test]
    fn a_sidecar_that_exits_during_the_init_sequence_is_restarted_and_the_sequence_goes_on() {
        let p = pod("Never", &["sc", "i1", "i2"], &["a"]);
        let s = status(
            ready(),
            vec![
                status_of("i1", ContainerState::Exited, 0),
                status_of("sc", ContainerState::Exited, 2),
            ],
        );
        let a = compute_pod_actions(&p, &s, &healthy());
        assert_eq!(a.init_containers_to_start, [0, 2], "in spec order");
        assert!(!a.kill_pod && a.containers_to_start.is_empty());
    }

    #[test]
    fn a_sidecar_failing_its_liveness_probe_is_killed_and_restarted_even_in_a_never_pod() {
        let p = pod("Never", &["sc"], &["a"]);
        let s = status(
            ready(),
            vec![
                status_of("a", ContainerState::Running, 0),
                status_of("sc", ContainerState::Running, 0),
            ],
        );
        let a = compute_pod_actions(&p, &s, &Probes::killing("sc", ProbeKill::Liveness));
        assert_eq!(
            a.containers_to_kill,
            [ContainerToKill {
                id: id("sc"),
                name: "sc".into(),
                message: "Init container sc failed liveness probe".into(),
                probe: Some(ProbeKill::Liveness),
            }]
        );
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
    }

    #[test]
    fn a_sidecar_failing_its_startup_probe_is_killed_and_restarted_and_the_sequence_waits() {
        let p = with_startup_probe(pod("Always", &["sc", "i1"], &["a"]), "sc");
        let s = status(
            ready(),
            vec![status_in(&p, "sc", ContainerState::Running, 0)],
        );
        let a = compute_pod_actions(&p, &s, &Probes::killing("sc", ProbeKill::Startup));
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Init container sc failed startup probe"
        );
        assert_eq!(a.containers_to_kill[0].probe, Some(ProbeKill::Startup));
        assert_eq!(a.init_containers_to_start, [0], "i1 waits");
    }

    #[test]
    fn a_sidecar_whose_spec_changed_is_replaced() {
        let p = pod("Always", &["sc"], &["a"]);
        let mut old = status_of("sc", ContainerState::Running, 0);
        old.hash = "0000".into();
        let s = status(
            ready(),
            vec![status_of("a", ContainerState::Running, 0), old],
        );
        let a = compute_pod_actions(&p, &s, &healthy());
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Init container sc definition changed"
        );
        assert_eq!(a.init_containers_to_start, [0]);
    }

    #[test]
    fn sidecars_do_not_keep_a_pod_alive_once_its_regular_containers_are_done() {
        let p = pod("Never", &["sc"], &["a"]);
        let running = status(
            ready(),
            vec![
                status_of("a", ContainerState::Exited, 0),
                status_of("sc", ContainerState::Running, 0),
            ],
        );
        let a = compute_pod_actions(&p, &running, &healthy());
        assert!(a.kill_pod && !a.create_sandbox);
        // The init sequence completed (i1 is the last) and then the sidecar exited too.
        let exited = status(
            ready(),
            vec![
                status_of("a", ContainerState::Exited, 0),
                status_of("i1", ContainerState::Exited, 0),
                status_of("sc", ContainerState::Exited, 0),
            ],
        );
        let a = compute_pod_actions(&pod("Never", &["sc", "i1"], &["a"]), &exited, &healthy());
        assert!(a.kill_pod);
        assert!(
            a.init_containers_to_start.is_empty(),
            "a finished pod does not restart its sidecar: {a:?}"
        );
    }

    #[test]
    fn after_initialization_only_sidecars_run_again_when_their_status_is_gone() {
        let p = pod("Always", &["i1", "sc"], &["a"]);
        let s = status(ready(), vec![status_of("a", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &s, &healthy());
        assert_eq!(a.init_containers_to_start, [1]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
    }

    #[test]
    fn an_init_container_left_created_is_started_again() {
        let p = pod("Never", &["i1", "i2"], &["a"]);
        let s = status(
            ready(),
            vec![
                status_of("i2", ContainerState::Created, 0),
                status_of("i1", ContainerState::Exited, 0),
            ],
        );
        assert_eq!(
            compute_pod_actions(&p, &s, &healthy()).init_containers_to_start,
            [1]
        );
    }

    #[test]
    fn an_init_container_in_an_unknown_state_is_stopped_before_it_runs_again() {
        let s = status(ready(), vec![status_of("i1", ContainerState::Unknown, 0)]);
        let a = compute_pod_actions(&pod("Always", &["i1"], &["a"]), &s, &healthy());
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Init container is in \"unknown\" state, try killing it before restart"
        );
        assert_eq!(a.init_containers_to_start, [0]);
        let a = compute_pod_actions(&pod("Never", &["i1"], &["a"]), &s, &healthy());
        assert!(a.kill_pod && a.init_failed.is_some(), "it failed: {a:?}");
        let sidecar = status(ready(), vec![status_of("sc", ContainerState::Unknown, 0)]);
        let a = compute_pod_actions(&pod("Never", &["sc"], &["a"]), &sidecar, &healthy());
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(!a.kill_pod);
    }

    #[test]
    fn an_oom_killed_init_container_has_failed() {
        let mut oom = status_of("i1", ContainerState::Exited, 0);
        oom.reason = "OOMKilled".into();
        let a = compute_pod_actions(
            &pod("Never", &["i1"], &["a"]),
            &status(ready(), vec![oom]),
            &healthy(),
        );
        assert!(a.kill_pod && a.init_failed.is_some());
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn an_app_container_in_an_unknown_state_is_stopped_before_it_runs_again() {
        let s = status(ready(), vec![status_of("a", ContainerState::Unknown, 0)]);
        let a = compute_pod_actions(&pod("Always", &[], &["a"]), &s, &healthy());
        assert_eq!(a.containers_to_start, [0]);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container is in \"unknown\" state, try killing it before restart"
        );
    }

    #[test]
    fn a_new_sandbox_starts_the_init_sequence_again_sidecars_included() {
        let s = status(
            vec![sandbox("s1", SandboxState::NotReady, 0)],
            vec![
                status_of("a", ContainerState::Exited, 137),
                status_of("sc", ContainerState::Exited, 137),
            ],
        );
        let a = compute_pod_actions(&pod("Always", &["sc", "i1"], &["a"]), &s, &healthy());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
    }
}
