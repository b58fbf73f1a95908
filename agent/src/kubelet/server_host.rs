//! What the HTTP servers see of the kubelet (the kubelet's `HostInterface` for `pkg/kubelet/server`),
//! and what the CRI runtime manager asks of it (`RuntimeHelper`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::cm::PodContainerManager;
use crate::container::PodUid;
use crate::kuberuntime::RuntimeHelper;
use crate::metrics::Metrics;
use crate::pleg::PlegHandle;
use crate::server::{HealthCheck, ServerHost};
use crate::status::StatusManager;

use super::{PodManager, RuntimeState, pod_uid};

/// The desired pods with the status the status manager holds for each.
pub fn pods_with_status(pods: &PodManager, status: &StatusManager) -> Vec<Pod> {
    pods.pods()
        .into_iter()
        .map(|mut pod| {
            if let Some(uid) = pod_uid(&pod) {
                pod.status = status.get_pod_status(&uid);
            }
            pod
        })
        .collect()
}

pub struct KubeletServerHost {
    pub pods: PodManager,
    pub status: StatusManager,
    pub runtime_state: RuntimeState,
    pub pleg: PlegHandle,
    pub sync_loop_threshold: Duration,
    pub metrics: Metrics,
}

impl ServerHost for KubeletServerHost {
    fn pods(&self) -> Vec<Pod> {
        pods_with_status(&self.pods, &self.status)
    }

    fn health_checks(&self) -> Vec<HealthCheck> {
        vec![
            HealthCheck {
                name: "ping",
                result: Ok(()),
                detail: None,
            },
            HealthCheck {
                name: "syncloop",
                result: self
                    .runtime_state
                    .sync_loop_healthy(self.sync_loop_threshold),
                detail: None,
            },
            HealthCheck {
                name: "pleg",
                result: self.pleg.healthy(),
                detail: Some(format!("mode {}", self.pleg.mode())),
            },
        ]
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// Node facts the CRI runtime manager needs to build sandbox and container configs.
pub struct NodeHelper {
    pub node_name: String,
    pub host_ip: String,
    pub root_dir: PathBuf,
    /// Where pod log directories go (the kubelet's `/var/log/pods`).
    pub pod_log_root: PathBuf,
    pub pod_cgroups: Arc<PodContainerManager>,
}

impl RuntimeHelper for NodeHelper {
    fn pod_cgroup_parent(&self, pod: &Pod) -> Result<String, String> {
        self.pod_cgroups
            .cgroup_parent_for_runtime(pod)
            .map_err(|err| err.to_string())
    }

    fn host_ip(&self) -> Option<String> {
        Some(self.host_ip.clone())
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.root_dir.join("pods").join(uid.as_str())
    }

    fn node_name(&self) -> &str {
        &self.node_name
    }

    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf {
        self.pod_log_root.join(format!("{namespace}_{name}_{uid}"))
    }
}
