//! The init containers' part of a pod's actions (the kubelet's `computeInitContainerActions`):
//! init containers run one at a time in spec order; a restartable one (a sidecar) counts as done
//! for starting the next once it has started (its startup probe succeeded, or it has none and
//! runs: its `postStart` hook ran to the end inside the sync that started it) and is restarted
//! whenever it exits or a probe condemns it, whatever the pod's restart policy; a regular one is
//! done once it exited 0, and its failure fails a pod that never restarts.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    ContainerToKill, InitFailure, PodActions, ProbeKill, ProbeVerdicts, RestartPolicy, containers,
    init_containers, is_sidecar, state_name,
};
use crate::container::{ContainerState, ContainerStatus, PodStatus};
use crate::kuberuntime::labels::container_hash;

/// The kubelet's `isInitContainerFailed`.
fn failed(status: &ContainerStatus) -> bool {
    status.reason == "OOMKilled"
        || (status.state == ContainerState::Exited && status.exit_code != 0)
        || status.state == ContainerState::Unknown
}

fn kill(status: &ContainerStatus, message: String, probe: Option<ProbeKill>) -> ContainerToKill {
    ContainerToKill {
        id: status.id.clone(),
        name: status.name.clone(),
        message,
        probe,
    }
}

/// An init container in an unknown state may still run: it is stopped before it starts again.
fn kill_if_unknown(status: &ContainerStatus, actions: &mut PodActions) {
    if status.state == ContainerState::Unknown {
        let message = format!(
            "Init container is in {:?} state, try killing it before restart",
            state_name(status.state)
        );
        actions.containers_to_kill.push(kill(status, message, None));
    }
}

/// What one pass over the init containers, from the last to the first, has found so far.
struct Pass<'a> {
    probes: &'a dyn ProbeVerdicts,
    last: usize,
    /// Indexes to start, in the reverse of spec order.
    to_start: Vec<usize>,
    /// The pod has initialized (the last init container is done, or a regular container ran).
    initialized: bool,
    /// A later init container has a status, so every earlier one has done its part of the init
    /// sequence (the kubelet's `isPreviouslyInitialized`).
    earlier_done: bool,
}

impl Pass<'_> {
    /// The init container after `i` may start now that `i` is done.
    fn done(&mut self, i: usize) {
        if i == self.last {
            self.initialized = true;
        } else if !self.earlier_done {
            self.to_start.push(i + 1);
        }
    }

    /// A running sidecar: once started it lets the next init container start, and it is
    /// restarted when its spec changed or its liveness probe failed; before, a failed startup
    /// probe restarts it.
    fn running_sidecar(
        &mut self,
        i: usize,
        container: &Container,
        status: &ContainerStatus,
        actions: &mut PodActions,
    ) {
        let verdict = self.probes.restart_reason(&status.id);
        if container.startup_probe.is_some() && !self.probes.startup_succeeded(&status.id) {
            if verdict == Some(ProbeKill::Startup) {
                let message = format!("Init container {} failed startup probe", container.name);
                actions
                    .containers_to_kill
                    .push(kill(status, message, verdict));
                self.to_start.push(i);
            }
            return;
        }
        self.done(i);
        if status.hash != container_hash(container) {
            let message = format!("Init container {} definition changed", container.name);
            actions.containers_to_kill.push(kill(status, message, None));
            self.to_start.push(i);
        } else if verdict == Some(ProbeKill::Liveness) {
            let message = format!("Init container {} failed liveness probe", container.name);
            actions
                .containers_to_kill
                .push(kill(status, message, verdict));
            self.to_start.push(i);
        }
    }
}

/// Sets the init containers to start (and sidecars to kill first) in `actions`; a regular init
/// container that failed under restartPolicy Never sets `kill_pod` and `init_failed` instead.
/// Returns whether the pod has initialized, so its regular containers may run.
pub(super) fn plan_init_containers(
    pod: &Pod,
    status: &PodStatus,
    policy: RestartPolicy,
    probes: &dyn ProbeVerdicts,
    actions: &mut PodActions,
) -> bool {
    let inits = init_containers(pod);
    let Some(last) = inits.len().checked_sub(1) else {
        return true;
    };
    // A regular container that runs (or was created) means the init sequence completed once; the
    // runtime may since have removed the init containers, which must not run again for that.
    let regular_ran = containers(pod).iter().any(|c| {
        status
            .container(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Created | ContainerState::Running))
    });
    let mut pass = Pass {
        probes,
        last,
        to_start: Vec::new(),
        initialized: regular_ran,
        earlier_done: regular_ran,
    };
    // Backwards, so the newest evidence of progress wins: completed init containers may have been
    // removed by the runtime.
    for (i, container) in inits.iter().enumerate().rev() {
        let sidecar = is_sidecar(container);
        let Some(current) = status.container(&container.name) else {
            // A sidecar of a pod past it whose status is gone: it must run again.
            if pass.earlier_done && sidecar {
                pass.to_start.push(i);
            }
            continue;
        };
        if pass.earlier_done && !sidecar {
            // Its part is done; only sidecars are kept running afterwards.
            continue;
        }
        match current.state {
            // The sync creates and starts in one step: a container left created failed to start.
            ContainerState::Created => pass.to_start.push(i),
            ContainerState::Running if sidecar => {
                pass.running_sidecar(i, container, current, actions);
            }
            // A regular init container still running: wait for it.
            ContainerState::Running => {}
            ContainerState::Exited | ContainerState::Unknown if sidecar => {
                kill_if_unknown(current, actions);
                pass.to_start.push(i);
            }
            ContainerState::Exited | ContainerState::Unknown => {
                if !failed(current) {
                    pass.done(i);
                } else if policy == RestartPolicy::Never {
                    actions.kill_pod = true;
                    actions.init_failed = Some(InitFailure {
                        name: container.name.clone(),
                        exit_code: current.exit_code,
                    });
                    return false;
                } else {
                    kill_if_unknown(current, actions);
                    pass.to_start.push(i);
                }
            }
        }
        pass.earlier_done = true;
    }
    if !pass.earlier_done {
        // Nothing has run yet: the sequence begins.
        pass.to_start.push(0);
    }
    pass.to_start.reverse();
    actions.init_containers_to_start = pass.to_start;
    pass.initialized
}
