//! Pod status: turning the runtime's view of a pod into the API `PodStatus` (the kubelet's
//! `generateAPIPodStatus` in `kubelet_pods.go` and the condition generators of
//! `pkg/kubelet/status`), the final status of a pod stopped for good, the reason cache of start
//! failures, the status manager that keeps the latest versioned status of every pod, and the syncer
//! that writes it to the API server.
//! Corresponds to the kubelet's `pkg/kubelet/status`.

mod generate;
mod manager;
mod reason_cache;
mod resize;
mod syncer;
mod terminate;

pub use generate::{
    NoProbes, ProbeView, StatusInputs, generate_api_pod_status, needs_readiness_reconcile,
    wall_clock_now,
};
pub use manager::StatusManager;
pub use reason_cache::ReasonCache;
pub use syncer::{PodDeletionSafety, SYNC_PERIOD, StatusSyncer};
pub use terminate::final_pod_status;

use crate::container::ContainerId;

/// The pod conditions the kubelet owns (`kubetypes.PodConditionByKubelet`); the others (readiness
/// gates, disruption targets) belong to whoever set them on the API server and are kept as it has
/// them.
const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodResizeInProgress",
    "PodResizePending",
];

fn is_kubelet_condition(condition_type: &str) -> bool {
    KUBELET_CONDITIONS.contains(&condition_type)
}

/// The conditions the kubelet sets but does not own (`kubetypes.PodConditionSharedByKubelet`): an
/// eviction's `DisruptionTarget`, which the control plane sets too.
fn is_shared_condition(condition_type: &str) -> bool {
    condition_type == "DisruptionTarget"
}

/// A container as the API names it, `<runtime>://<id>` (the kubelet's `kubecontainer.ContainerID`,
/// whose type is the runtime's name as its CRI `Version` call reports it: `containerd`, `cri-o`).
pub fn api_container_id(runtime_name: &str, id: &ContainerId) -> String {
    format!("{runtime_name}://{id}")
}

/// The runtime's id in an API container id, whichever runtime wrote it (the kubelet's
/// `ParseContainerID`): `cri-o://abc` → `abc`; `None` without a `<runtime>://` prefix.
pub fn parse_api_container_id(api_id: &str) -> Option<ContainerId> {
    let (_, id) = api_id.split_once("://")?;
    Some(ContainerId::from(id))
}

/// The runtime's name in what [`crate::container::Runtime::version`] reports
/// (`containerd://1.6.20` → `containerd`); `None` when it has no name.
pub fn runtime_name_of(version: &str) -> Option<&str> {
    version
        .split_once("://")
        .map(|(name, _)| name)
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_carry_the_runtimes_name() {
        let id = ContainerId::from("abc");
        assert_eq!(api_container_id("cri-o", &id), "cri-o://abc");
        assert_eq!(parse_api_container_id("cri-o://abc"), Some(id.clone()));
        assert_eq!(parse_api_container_id("containerd://abc"), Some(id));
        assert_eq!(parse_api_container_id("abc"), None);
        assert_eq!(runtime_name_of("cri-o://1.30.2"), Some("cri-o"));
        assert_eq!(runtime_name_of("://1.30.2"), None);
        assert_eq!(runtime_name_of("Unknown"), None);
    }
}
