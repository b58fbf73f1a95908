//! The final status of a pod stopped for good (the kubelet status manager's `TerminatePod`): a
//! container the runtime can no longer account for counts as failed, never as succeeded, and a pod
//! that is not static ends in a terminal phase, which the API server needs before the pod's deletion
//! can complete. A pod deleted before any of its containers ran (its volumes could not be mounted,
//! its image not pulled) would otherwise stay Pending, and Terminating, for ever.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus as ApiPodStatus,
};

use super::generate::{FAILED, SUCCEEDED, is_sidecar, terminated};
use crate::podconfig::is_static_pod;

/// The reason of a container status the runtime could not give (the kubelet's
/// `ContainerReasonStatusUnknown`).
const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
const STATUS_UNKNOWN_MESSAGE: &str =
    "The container could not be located when the pod was terminated";
/// What a container killed by the runtime exits with (`128 + SIGKILL`).
const STATUS_UNKNOWN_EXIT_CODE: i32 = 137;

/// `status`, the pod's last generated status, made final.
///
/// - Once the pod has initialized (no init containers, or a container left waiting), every
///   container not terminated is terminated with `ContainerStatusUnknown`, exit code 137.
/// - Init containers are too, up to the last one that ever left waiting (at least the first): those
///   after it never tried to start.
/// - A pod that is not static and not already Succeeded or Failed becomes Failed.
pub fn final_pod_status(pod: &Pod, mut status: ApiPodStatus) -> ApiPodStatus {
    if has_initialized(pod, &status) {
        for container in status.container_statuses.iter_mut().flatten() {
            terminate_unless_terminated(container);
        }
    }
    if let Some(init) = status.init_container_statuses.as_mut() {
        let attempted = attempted_init_containers(init);
        for container in &mut init[..attempted] {
            terminate_unless_terminated(container);
        }
    }
    let terminal = matches!(status.phase.as_deref(), Some(SUCCEEDED | FAILED));
    if !is_static_pod(pod) && !terminal {
        status.phase = Some(FAILED.to_owned());
    }
    status
}

/// Whether the pod has evidence of having initialized (the kubelet's `hasPodInitialized`): it has no
/// init containers, a container of it left waiting once, or its last init container completed.
fn has_initialized(pod: &Pod, status: &ApiPodStatus) -> bool {
    let init_specs = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    if init_specs.is_empty() {
        return true;
    }
    let left_waiting =
        |c: &ContainerStatus| terminated(c.last_state.as_ref()).is_some() || !waiting(c);
    if status.container_statuses.iter().flatten().any(left_waiting) {
        return true;
    }
    let Some(last) = status
        .init_container_statuses
        .as_deref()
        .and_then(<[_]>::last)
    else {
        return false;
    };
    let spec = init_specs.iter().find(|s| s.name == last.name);
    if spec.is_some_and(is_sidecar) {
        let running = last.state.as_ref().is_some_and(|s| s.running.is_some());
        return running && last.started == Some(true);
    }
    [last.last_state.as_ref(), last.state.as_ref()]
        .into_iter()
        .any(|state| terminated(state).is_some_and(|t| t.exit_code == 0))
}

/// How many init container statuses, from the first, belong to containers that tried to start: all
/// up to the last one not waiting or with an earlier termination; at least one.
fn attempted_init_containers(init: &[ContainerStatus]) -> usize {
    init.iter()
        .rposition(|c| !waiting(c) || terminated(c.last_state.as_ref()).is_some())
        .map_or(init.len().min(1), |last| last + 1)
}

fn waiting(container: &ContainerStatus) -> bool {
    container
        .state
        .as_ref()
        .is_some_and(|s| s.waiting.is_some())
}

fn terminate_unless_terminated(container: &mut ContainerStatus) {
    if terminated(container.state.as_ref()).is_some() {
        return;
    }
    container.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(STATUS_UNKNOWN.to_owned()),
            message: Some(STATUS_UNKNOWN_MESSAGE.to_owned()),
            exit_code: STATUS_UNKNOWN_EXIT_CODE,
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    container.ready = false;
    container.started = Some(false);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerStateRunning, ContainerStateWaiting, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(init: &[&str], containers: &[&str]) -> Pod {
        let container = |name: &&str| Container {
            name: (*name).to_owned(),
            ..Container::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("p".to_owned()),
                uid: Some("uid-1".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(init.iter().map(container).collect()),
                containers: containers.iter().map(container).collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn waiting_status(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.to_owned(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".to_owned()),
                    ..ContainerStateWaiting::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn exited(name: &str, exit_code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.to_owned(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code,
                    reason: Some("Completed".to_owned()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn status(phase: &str, init: Vec<ContainerStatus>, app: Vec<ContainerStatus>) -> ApiPodStatus {
        ApiPodStatus {
            phase: Some(phase.to_owned()),
            init_container_statuses: (!init.is_empty()).then_some(init),
            container_statuses: Some(app),
            ..ApiPodStatus::default()
        }
    }

    fn unknown(status: &ContainerStatus) -> bool {
        terminated(status.state.as_ref()).is_some_and(|t| {
            t.reason.as_deref() == Some(STATUS_UNKNOWN) && t.exit_code == STATUS_UNKNOWN_EXIT_CODE
        })
    }

    #[test]
    fn a_pod_that_never_started_its_containers_ends_failed_with_their_status_unknown() {
        let pod = pod(&[], &["main", "side"]);
        let done = final_pod_status(
            &pod,
            status(
                "Pending",
                vec![],
                vec![waiting_status("main"), exited("side", 0)],
            ),
        );
        assert_eq!(done.phase.as_deref(), Some(FAILED));
        let app = done.container_statuses.unwrap();
        assert!(unknown(&app[0]), "{:?}", app[0]);
        assert!(!app[0].ready);
        assert_eq!(
            app[1],
            exited("side", 0),
            "a terminated container keeps its exit"
        );
    }

    #[test]
    fn a_terminal_phase_stays_and_a_static_pod_keeps_its_phase() {
        let pod_a = pod(&[], &["main"]);
        let done = final_pod_status(&pod_a, status(SUCCEEDED, vec![], vec![exited("main", 0)]));
        assert_eq!(done.phase.as_deref(), Some(SUCCEEDED));

        let mut static_pod = pod(&[], &["main"]);
        static_pod.metadata.annotations = Some(
            [(
                crate::podconfig::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            )]
            .into(),
        );
        assert!(is_static_pod(&static_pod));
        let running = ContainerStatus {
            name: "main".to_owned(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        };
        let done = final_pod_status(&static_pod, status("Running", vec![], vec![running]));
        assert_eq!(done.phase.as_deref(), Some("Running"));
        assert!(unknown(&done.container_statuses.unwrap()[0]));
    }

    #[test]
    fn before_initializing_only_the_init_containers_that_tried_to_start_are_failed() {
        let pod = pod(&["a", "b", "c"], &["main"]);
        let done = final_pod_status(
            &pod,
            status(
                "Pending",
                vec![exited("a", 0), exited("b", 1), waiting_status("c")],
                vec![waiting_status("main")],
            ),
        );
        let init = done.init_container_statuses.unwrap();
        assert_eq!(init[1], exited("b", 1));
        assert!(!unknown(&init[2]), "c never tried to start");
        assert!(
            !unknown(&done.container_statuses.unwrap()[0]),
            "not initialized"
        );
        assert_eq!(done.phase.as_deref(), Some(FAILED));

        let none_started = final_pod_status(
            &pod,
            status(
                "Pending",
                vec![
                    waiting_status("a"),
                    waiting_status("b"),
                    waiting_status("c"),
                ],
                vec![waiting_status("main")],
            ),
        );
        let init = none_started.init_container_statuses.unwrap();
        assert!(unknown(&init[0]), "the first init container always counts");
        assert!(!unknown(&init[1]));
    }

    #[test]
    fn a_pod_whose_last_init_container_completed_has_initialized() {
        let pod = pod(&["a"], &["main"]);
        let done = final_pod_status(
            &pod,
            status(
                "Pending",
                vec![exited("a", 0)],
                vec![waiting_status("main")],
            ),
        );
        assert!(unknown(&done.container_statuses.unwrap()[0]));
    }
}
