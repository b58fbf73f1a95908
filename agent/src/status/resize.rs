//! The in-place resize part of a pod's status: each container status's `resources` (what the
//! runtime manager applied to the running container, the spec's otherwise) and the
//! `PodResizePending` / `PodResizeInProgress` conditions (the kubelet's
//! `convertContainerStatusResources` in `kubelet_pods.go` and the resize conditions its status
//! manager keeps, `pkg/kubelet/status`).

use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, ResourceRequirements};

use crate::container::{ContainerId, ContainerState, PodResize, PodStatus};

pub(super) const POD_RESIZE_PENDING: &str = "PodResizePending";
pub(super) const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
/// The `PodResizeInProgress` reason when applying the resize failed (`v1.PodReasonError`).
const REASON_ERROR: &str = "Error";

/// The resources a container status reports: those applied to the running instance `running`
/// when the runtime manager has them on record, else the spec's.
pub(super) fn container_resources(
    container: &Container,
    running: Option<&ContainerId>,
    resize: Option<&PodResize>,
) -> ResourceRequirements {
    running
        .zip(resize)
        .and_then(|(id, resize)| resize.actuated.get(id))
        .or(container.resources.as_ref())
        .cloned()
        .unwrap_or_default()
}

/// Whether a running container has other resources applied than its spec asks for.
fn differs(container: &Container, runtime: &PodStatus, resize: &PodResize) -> bool {
    runtime
        .container(&container.name)
        .filter(|c| c.state == ContainerState::Running)
        .and_then(|c| resize.actuated.get(&c.id))
        .is_some_and(|actuated| {
            actuated
                != container
                    .resources
                    .as_ref()
                    .unwrap_or(&ResourceRequirements::default())
        })
}

/// `PodResizePending` while the node cannot take the new resources, else `PodResizeInProgress`
/// while a running container has yet to get them; neither once they are applied.
pub(super) fn resize_conditions(
    spec: &PodSpec,
    runtime: &PodStatus,
    resize: Option<&PodResize>,
) -> Vec<PodCondition> {
    let Some(resize) = resize else {
        return Vec::new();
    };
    if let Some((reason, message)) = &resize.pending {
        return vec![PodCondition {
            type_: POD_RESIZE_PENDING.to_owned(),
            status: "True".to_owned(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            ..PodCondition::default()
        }];
    }
    let in_progress = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| differs(c, runtime, resize));
    if !in_progress {
        return Vec::new();
    }
    vec![PodCondition {
        type_: POD_RESIZE_IN_PROGRESS.to_owned(),
        status: "True".to_owned(),
        reason: resize.error.as_ref().map(|_| REASON_ERROR.to_owned()),
        message: resize.error.clone(),
        ..PodCondition::default()
    }]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::container::ContainerStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn cpu(request: &str) -> ResourceRequirements {
        ResourceRequirements {
            requests: Some([("cpu".to_owned(), Quantity(request.to_owned()))].into()),
            ..ResourceRequirements::default()
        }
    }

    fn container(request: &str) -> Container {
        Container {
            name: "c1".to_owned(),
            resources: Some(cpu(request)),
            ..Container::default()
        }
    }

    fn runtime(state: ContainerState) -> PodStatus {
        PodStatus {
            containers: vec![ContainerStatus::for_test("id1", "c1", state)],
            ..PodStatus::default()
        }
    }

    fn applied(request: &str) -> PodResize {
        PodResize {
            actuated: [(ContainerId::from("id1"), cpu(request))].into(),
            ..PodResize::default()
        }
    }

    fn spec(request: &str) -> PodSpec {
        PodSpec {
            containers: vec![container(request)],
            ..PodSpec::default()
        }
    }

    #[test]
    fn a_running_container_reports_what_was_applied_others_their_spec() {
        let id = ContainerId::from("id1");
        let resize = applied("100m");
        assert_eq!(
            container_resources(&container("200m"), Some(&id), Some(&resize)),
            cpu("100m")
        );
        assert_eq!(
            container_resources(&container("200m"), None, Some(&resize)),
            cpu("200m")
        );
        assert_eq!(
            container_resources(&container("200m"), Some(&id), None),
            cpu("200m")
        );
        let bare = Container::default();
        assert_eq!(
            container_resources(&bare, None, None),
            ResourceRequirements::default()
        );
    }

    #[test]
    fn a_resize_is_in_progress_until_applied_and_pending_when_infeasible() {
        let running = runtime(ContainerState::Running);
        let conditions = resize_conditions(&spec("200m"), &running, Some(&applied("100m")));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, POD_RESIZE_IN_PROGRESS);
        assert_eq!(conditions[0].reason, None);

        let mut failed = applied("100m");
        failed.error = Some("failed to resize container \"c1\": boom".to_owned());
        let conditions = resize_conditions(&spec("200m"), &running, Some(&failed));
        assert_eq!(conditions[0].reason.as_deref(), Some("Error"));
        assert_eq!(conditions[0].message, failed.error);

        assert!(resize_conditions(&spec("100m"), &running, Some(&applied("100m"))).is_empty());
        assert!(resize_conditions(&spec("200m"), &running, None).is_empty());
        let exited = runtime(ContainerState::Exited);
        assert!(resize_conditions(&spec("200m"), &exited, Some(&applied("100m"))).is_empty());

        let mut pending = applied("100m");
        pending.pending = Some(("Infeasible".to_owned(), "no room".to_owned()));
        let conditions = resize_conditions(&spec("200m"), &running, Some(&pending));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, POD_RESIZE_PENDING);
        assert_eq!(conditions[0].reason.as_deref(), Some("Infeasible"));
        assert_eq!(conditions[0].message.as_deref(), Some("no room"));
    }
}
