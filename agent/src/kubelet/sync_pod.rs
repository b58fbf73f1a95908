//! One pod transaction (the kubelet's `Kubelet.syncPod`, `syncTerminatingPod` and
//! `syncTerminatedPod` in `pkg/kubelet/kubelet.go`): generate and store the pod's API status, make sure
//! its cgroup exists, let the runtime move it one step towards its spec; stop it; release what it held.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use crate::cm::{PodContainerManager, qos_class};
use crate::container::{PodStatus, PodUid, Runtime};
use crate::events::{EventType, Recorder};
use crate::pod_workers::{PodSyncer, SyncError, UpdateType};
use crate::status::{ReasonCache, StatusManager, generate_api_pod_status};
use crate::volumes;

use super::runtime_state::RuntimeState;

/// What a pod sync needs; shared by every pod worker.
pub struct KubeletSyncer {
    pub runtime: Arc<dyn Runtime>,
    pub status: StatusManager,
    pub reasons: ReasonCache,
    pub pod_cgroups: Arc<PodContainerManager>,
    pub recorder: Recorder,
    pub runtime_state: RuntimeState,
    pub host_ip: String,
    pub pods_dir: std::path::PathBuf,
}

fn pod_object(pod: &Pod) -> String {
    format!(
        "pod/{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn uid_of(pod: &Pod) -> PodUid {
    PodUid::from(pod.metadata.uid.as_deref().unwrap_or_default())
}

fn is_terminal_phase(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

impl KubeletSyncer {
    fn update_status(&self, pod: &Pod, runtime_status: &PodStatus) -> Option<String> {
        let uid = uid_of(pod);
        let previous = self.status.get_pod_status(&uid);
        let api_status = generate_api_pod_status(
            pod,
            runtime_status,
            &self.reasons,
            previous.as_ref(),
            &self.host_ip,
        );
        let phase = api_status.phase.clone();
        self.status.set_pod_status(pod, api_status);
        phase
    }
}

#[async_trait]
impl PodSyncer for KubeletSyncer {
    async fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        update_type: UpdateType,
    ) -> Result<bool, SyncError> {
        let phase = self.update_status(pod, status);
        if is_terminal_phase(phase.as_deref()) {
            return Ok(true);
        }
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if !host_network && let Some(reason) = self.runtime_state.network_error() {
            return Err(SyncError {
                reason: "NetworkNotReady",
                message: reason,
            });
        }
        self.pod_cgroups
            .ensure_exists(pod)
            .map_err(|err| SyncError {
                reason: "FailedCreatePodCgroup",
                message: err.to_string(),
            })?;
        if update_type == UpdateType::Create {
            tracing::info!(pod = %pod_object(pod), "syncing new pod");
        }
        let result = self.runtime.sync_pod(pod, status).await;
        self.reasons.update(&uid_of(pod), &result);
        match result.first_failure() {
            None => Ok(false),
            Some((failed, failure)) => {
                let reason = if failure.reason == "CrashLoopBackOff" {
                    "BackOff"
                } else {
                    "FailedSync"
                };
                self.recorder.event(
                    EventType::Warning,
                    pod_object(pod),
                    reason,
                    format!("{}: {}", failure.reason, failure.message),
                );
                Err(SyncError {
                    reason,
                    message: format!(
                        "{:?} {} failed: {}",
                        failed.action, failed.target, failure.message
                    ),
                })
            }
        }
    }

    async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace_period_override: Option<i64>,
    ) -> Result<(), SyncError> {
        let running = status.live_part();
        if !running.containers.is_empty() || !running.sandboxes.is_empty() {
            tracing::info!(pod = %pod_object(pod), "stopping pod");
            self.runtime
                .kill_pod(Some(pod), &running, grace_period_override)
                .await
                .map_err(|err| SyncError {
                    reason: "FailedKillPod",
                    message: err.to_string(),
                })?;
            self.recorder.event(
                EventType::Normal,
                pod_object(pod),
                "Killing",
                "stopped the pod's containers",
            );
        }
        Ok(())
    }

    async fn sync_terminated_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        pod_removed: bool,
    ) -> Result<(), SyncError> {
        let uid = uid_of(pod);
        if !pod_removed {
            self.update_status(pod, status);
        }
        self.pod_cgroups
            .destroy(&uid, qos_class(pod))
            .map_err(|err| SyncError {
                reason: "FailedDeletePodCgroup",
                message: err.to_string(),
            })?;
        if pod_removed {
            volumes::cleanup_pod_volumes(&self.pods_dir.join(uid.as_str())).map_err(|err| {
                SyncError {
                    reason: "FailedCleanupVolumes",
                    message: err.to_string(),
                }
            })?;
            self.reasons.remove(&uid);
        }
        Ok(())
    }
}
