//! The ephemeral containers' part of a pod's actions (the ephemeral step of the kubelet's
//! `computePodActions`): an ephemeral container, added to a running pod through the
//! `ephemeralcontainers` subresource to debug it, is started once, when the runtime has no
//! container of its name, even while the pod still initializes. It is never restarted and never
//! stopped on its own: it stops with the pod, and it does not keep a pod whose regular containers
//! are done alive.

use k8s_openapi::api::core::v1::{EphemeralContainer, Pod};

use crate::container::PodStatus;

pub(super) fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
}

/// Indexes into `spec.ephemeralContainers` of those the runtime never had a container of.
pub(super) fn to_start(pod: &Pod, status: &PodStatus) -> Vec<usize> {
    ephemeral_containers(pod)
        .iter()
        .enumerate()
        .filter(|(_, c)| status.container(&c.name).is_none())
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{ProbeKill, ProbeVerdicts, compute_pod_actions};
    use crate::container::{
        ContainerId, ContainerState, ContainerStatus, PodStatus, PodUid, SandboxId, SandboxState,
        SandboxStatus,
    };
    use crate::kuberuntime::labels::container_hash;
    use k8s_openapi::api::core::v1::Pod;

    struct Healthy;

    impl ProbeVerdicts for Healthy {
        fn restart_reason(&self, _id: &ContainerId) -> Option<ProbeKill> {
            None
        }

        fn startup_succeeded(&self, _id: &ContainerId) -> bool {
            true
        }
    }

    /// A pod with the regular container `app`, the init containers `inits` and the ephemeral
    /// containers `ephemeral`.
    fn pod(policy: &str, inits: &[&str], ephemeral: &[&str]) -> Pod {
        let named = |names: &[&str]| -> Vec<serde_json::Value> {
            names
                .iter()
                .map(|n| serde_json::json!({"name": n, "image": "busybox"}))
                .collect()
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {
                "restartPolicy": policy,
                "containers": [{"name": "app", "image": "busybox"}],
                "initContainers": named(inits),
                "ephemeralContainers": named(ephemeral),
            },
        }))
        .unwrap()
    }

    fn container(pod: &Pod, name: &str, state: ContainerState, exit_code: i32) -> ContainerStatus {
        let spec = &pod.spec.as_ref().unwrap().containers[0];
        ContainerStatus {
            id: ContainerId::from(format!("id-{name}")),
            name: name.into(),
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code,
            image: "busybox".into(),
            image_ref: String::new(),
            // The regular container runs as its spec says; the others' hashes are not compared.
            hash: container_hash(spec),
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn ready_pod(containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            uid: PodUid::from("u1"),
            sandboxes: vec![SandboxStatus {
                id: SandboxId::from("s1"),
                state: SandboxState::Ready,
                created_at: 1,
                attempt: 0,
                ip: Some("10.88.0.2".into()),
                host_network: false,
            }],
            containers,
            ..PodStatus::default()
        }
    }

    #[test]
    fn an_ephemeral_container_without_a_container_is_started_once_and_never_again() {
        let p = pod("Always", &[], &["dbg1", "dbg2"]);
        let app = container(&p, "app", ContainerState::Running, 0);
        let a = compute_pod_actions(&p, &ready_pod(vec![app.clone()]), &Healthy);
        assert_eq!(a.ephemeral_containers_to_start, [0, 1]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);

        for state in [ContainerState::Exited, ContainerState::Created] {
            let status = ready_pod(vec![
                app.clone(),
                container(&p, "dbg1", state, 1),
                container(&p, "dbg2", ContainerState::Running, 0),
            ]);
            let a = compute_pod_actions(&p, &status, &Healthy);
            assert!(a.ephemeral_containers_to_start.is_empty(), "{state:?}");
            assert!(
                a.containers_to_kill.is_empty(),
                "a running ephemeral container is not killed as unknown: {a:?}"
            );
        }
    }

    #[test]
    fn an_ephemeral_container_starts_while_the_pod_initializes() {
        let p = pod("Always", &["init"], &["dbg"]);
        let status = ready_pod(vec![container(&p, "init", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &status, &Healthy);
        assert_eq!(a.ephemeral_containers_to_start, [0]);
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
    }

    #[test]
    fn no_ephemeral_container_starts_in_a_pod_being_stopped_or_given_a_new_sandbox() {
        let p = pod("Never", &[], &["dbg"]);
        let done = ready_pod(vec![container(&p, "app", ContainerState::Exited, 0)]);
        let a = compute_pod_actions(&p, &done, &Healthy);
        assert!(
            a.kill_pod,
            "an ephemeral container does not keep the pod alive"
        );
        assert!(a.ephemeral_containers_to_start.is_empty());

        let failed_init = pod("Never", &["init"], &["dbg"]);
        let status = ready_pod(vec![container(
            &failed_init,
            "init",
            ContainerState::Exited,
            1,
        )]);
        let a = compute_pod_actions(&failed_init, &status, &Healthy);
        assert!(a.kill_pod && a.ephemeral_containers_to_start.is_empty());

        let mut no_sandbox = ready_pod(Vec::new());
        no_sandbox.sandboxes.clear();
        let a = compute_pod_actions(&pod("Always", &[], &["dbg"]), &no_sandbox, &Healthy);
        assert!(a.create_sandbox && a.ephemeral_containers_to_start.is_empty());
    }
}
