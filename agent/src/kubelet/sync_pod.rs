//! One pod transaction (the kubelet's `Kubelet.syncPod`, `syncTerminatingPod` and
//! `syncTerminatedPod` in `pkg/kubelet/kubelet.go`): generate and store the pod's API status, make sure
//! its cgroup exists, prepare its volumes (a volume that cannot be prepared is a `FailedMount` event
//! and the pod does not start), let the runtime move it one step towards its spec; stop it; release
//! what it held. A pod past its active deadline is Failed in its status, which stops it; one with a
//! deadline ahead is queued for a sync at it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::cm::{CmError, PodContainerManager, qos_class};
use crate::container::{PodStatus, PodUid, Runtime};
use crate::events::{EventObject, EventType, Recorder};
use crate::eviction::EvictionHandle;
use crate::metrics::Metrics;
use crate::objects::ApiObjects;
use crate::pleg::LatencyTracker;
use crate::pod_workers::{
    Cleanup, NETWORK_NOT_READY, PodSyncer, SyncError, SyncOutcome, UpdateType, WorkQueue,
};
use crate::podconfig::CONFIG_SEEN_ANNOTATION;
use crate::prober::ProbeHandle;
use crate::status::{
    ReasonCache, StatusInputs, StatusManager, final_pod_status, generate_api_pod_status,
};
use crate::volumes::VolumeManager;

use super::active_deadline;
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
    pub volumes: VolumeManager,
    /// What the pods refer to on the API server; `None` standalone.
    pub objects: Option<ApiObjects>,
    pub metrics: Metrics,
    /// Observes kernel → status latency when a status changes after a hint-driven PLEG event.
    pub latency: LatencyTracker,
    /// Containers' readiness and startup; the pod's liveness and startup probes stop when it
    /// terminates, all of them once it is terminated.
    pub probes: ProbeHandle,
    /// Where a pod is queued for a sync at its active deadline.
    pub queue: Arc<WorkQueue>,
    /// An evicted pod's status stays Failed with the eviction's reason and message.
    pub evictions: EvictionHandle,
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

/// Where in its life a pod is when its status is generated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StatusStage {
    /// Wanted and synced.
    Syncing,
    /// Stopped, and about to run again as a new life of the pod.
    StoppedForRestart,
    /// Stopped for good: the status is final.
    Final,
}

fn is_terminal_phase(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// What a changed pod status means for the metrics: kernel → status latency when a hint-driven PLEG
/// event waits for it, and the kubelet's pod start duration the first time the pod is Running.
fn status_stored(
    metrics: &Metrics,
    latency: &LatencyTracker,
    pod: &Pod,
    previous_phase: Option<&str>,
    phase: Option<&str>,
) {
    latency.status_changed(
        &uid_of(pod),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
    );
    let was_pending = matches!(previous_phase, None | Some("Pending"));
    if was_pending
        && phase == Some("Running")
        && let Some(duration) = since_first_seen(pod, SystemTime::now())
    {
        metrics.observe_pod_start(duration);
    }
}

/// How long ago the pod was first seen, from its `kubernetes.io/config.seen` annotation (the
/// kubelet's `firstSeenTime`).
fn since_first_seen(pod: &Pod, now: SystemTime) -> Option<Duration> {
    let seen: Timestamp = pod
        .metadata
        .annotations
        .as_ref()?
        .get(CONFIG_SEEN_ANNOTATION)?
        .parse()
        .ok()?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    let elapsed = i128::try_from(now).ok()? - seen.as_nanosecond();
    u64::try_from(elapsed).ok().map(Duration::from_nanos)
}

/// Runs cgroup work on the blocking pool (cgroups-rs waits up to ~150 ms per v1 controller when it
/// creates or removes one); a failure is a sync error with `reason`.
async fn on_blocking_pool<E: std::fmt::Display + Send + 'static>(
    reason: &'static str,
    work: impl FnOnce() -> Result<(), E> + Send + 'static,
) -> Result<(), SyncError> {
    let to_error = |message: String| SyncError { reason, message };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| to_error(format!("cgroup task did not finish: {err}")))?
        .map_err(|err| to_error(err.to_string()))
}

impl KubeletSyncer {
    /// Generates and stores the pod's API status; `pod_is_terminal` once the pod has been stopped
    /// for good. Returns the phase.
    fn update_status(
        &self,
        pod: &Pod,
        runtime_status: &PodStatus,
        stage: StatusStage,
    ) -> Option<String> {
        let uid = uid_of(pod);
        let previous = self.status.get_pod_status(&uid);
        let runtime_name = self.runtime_state.runtime_name();
        let resize = self.runtime.pod_resize(&uid);
        let mut api_status = generate_api_pod_status(
            pod,
            runtime_status,
            &StatusInputs {
                reasons: &self.reasons,
                previous: previous.as_ref(),
                host_ip: &self.host_ip,
                pod_is_terminal: stage != StatusStage::Syncing,
                probes: &self.probes,
                runtime_name: runtime_name.as_deref(),
                resize: resize.as_ref(),
            },
        );
        if stage == StatusStage::Final {
            api_status = final_pod_status(pod, api_status);
        }
        let now = active_deadline::unix_now();
        if active_deadline::enforce(pod, &mut api_status, now) {
            if previous.as_ref().and_then(|p| p.reason.as_deref()) != Some(active_deadline::REASON)
            {
                self.recorder.event(
                    EventType::Normal,
                    EventObject::pod(pod),
                    active_deadline::REASON,
                    active_deadline::MESSAGE,
                );
            }
        } else if stage == StatusStage::Syncing
            && let Some(left) = active_deadline::remaining(pod, &api_status, now)
        {
            // Nothing else may happen to the pod by then.
            self.queue.enqueue(uid.clone(), left);
        }
        self.evictions.apply_eviction(&uid, &mut api_status);
        let phase = api_status.phase.clone();
        if self.status.set_pod_status(pod, api_status) {
            status_stored(
                &self.metrics,
                &self.latency,
                pod,
                previous.as_ref().and_then(|p| p.phase.as_deref()),
                phase.as_deref(),
            );
        } else {
            self.latency.status_unchanged(&uid);
        }
        phase
    }
}

impl KubeletSyncer {
    /// Prepares (or refreshes) the pod's volumes before the runtime starts anything (the kubelet's
    /// `WaitForAttachAndMount`): each volume that fails is a `FailedMount` event, and the sync
    /// fails so the pod is retried.
    async fn mount_volumes(&self, pod: &Pod) -> Result<(), SyncError> {
        if let Some(objects) = &self.objects {
            objects.register_pod(pod);
        }
        let Err(failures) = self.volumes.mount_pod(pod).await else {
            return Ok(());
        };
        for failure in &failures {
            self.recorder.event(
                EventType::Warning,
                EventObject::pod(pod),
                "FailedMount",
                failure.message(),
            );
        }
        let names: Vec<&str> = failures.iter().map(|f| f.volume.as_str()).collect();
        Err(SyncError {
            reason: "FailedMount",
            message: format!(
                "unable to mount volumes: unmounted volumes=[{}]: {}",
                names.join(" "),
                failures
                    .iter()
                    .map(|f| crate::error_chain::error_chain(&f.error))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        })
    }
}

#[async_trait]
impl PodSyncer for KubeletSyncer {
    async fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        update_type: UpdateType,
    ) -> Result<SyncOutcome, SyncError> {
        let phase = self.update_status(pod, status, StatusStage::Syncing);
        if is_terminal_phase(phase.as_deref()) {
            return Ok(SyncOutcome {
                terminal: true,
                changed_runtime: false,
            });
        }
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if !host_network && let Some(reason) = self.runtime_state.network_error() {
            return Err(SyncError {
                reason: NETWORK_NOT_READY,
                message: reason,
            });
        }
        let (cgroups, owned) = (Arc::clone(&self.pod_cgroups), pod.clone());
        on_blocking_pool("FailedCreatePodCgroup", move || {
            cgroups.ensure_exists(&owned)
        })
        .await?;
        if update_type == UpdateType::Create {
            tracing::info!(pod = %pod_object(pod), "syncing new pod");
            // Already there for a pod just added; a pod that starts again after its termination
            // (added again with the same UID) had its probes stopped.
            self.probes.add_pod(pod);
        }
        self.mount_volumes(pod).await?;
        let resize_before = self.runtime.pod_resize(&uid_of(pod));
        let result = self.runtime.sync_pod(pod, status).await;
        // A resize applied (or found pending) by this sync shows in the status now: nothing else
        // would bring a new sync, as cgroup changes make no runtime events.
        if self.runtime.pod_resize(&uid_of(pod)) != resize_before {
            self.update_status(pod, status, StatusStage::Syncing);
        }
        self.reasons.update(&uid_of(pod), &result);
        match result.first_failure() {
            None => Ok(SyncOutcome {
                terminal: false,
                changed_runtime: !result.results.is_empty(),
            }),
            Some((failed, failure)) => {
                // A back-off is not a failure of the sync: the runtime manager has already
                // recorded the container's BackOff event, and the retry comes after the back-off.
                let reason = if failure.reason == "CrashLoopBackOff" {
                    "BackOff"
                } else {
                    self.recorder.event(
                        EventType::Warning,
                        EventObject::pod(pod),
                        "FailedSync",
                        format!("{}: {}", failure.reason, failure.message),
                    );
                    "FailedSync"
                };
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
        // A stopping pod is not restarted for a failing probe; readiness keeps reporting.
        self.probes.stop_liveness_and_startup(&uid_of(pod));
        let running = status.live_part();
        if !running.is_empty() {
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
                EventObject::pod(pod),
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
        cleanup: Cleanup,
    ) -> Result<(), SyncError> {
        let uid = uid_of(pod);
        self.probes.remove_pod(&uid);
        match cleanup {
            Cleanup::Kept => {
                self.update_status(pod, status, StatusStage::Final);
            }
            Cleanup::Restarting => {
                // The stopped containers show as they are until the pod runs again, and then
                // may run again whatever their restart policy: it is a new life of the pod.
                self.update_status(pod, status, StatusStage::StoppedForRestart);
                self.status.allow_restart(&uid);
            }
            Cleanup::Removed => {}
        }
        let (cgroups, owned_uid, qos) =
            (Arc::clone(&self.pod_cgroups), uid.clone(), qos_class(pod));
        on_blocking_pool("FailedDeletePodCgroup", move || {
            let left = cgroups.destroy(&owned_uid, qos);
            if let Err(CmError::HasProcesses { .. }) = &left {
                // The pod worker read the runtime after the stop and found nothing live: these
                // processes belong to nothing the runtime reports. Killed, the next try removes
                // the cgroup.
                let killed = cgroups.kill_processes(&owned_uid, qos)?;
                tracing::warn!(uid = %owned_uid, ?killed,
                    "killed processes left in the cgroup of a stopped pod");
            }
            left
        })
        .await?;
        if cleanup == Cleanup::Removed {
            if let Some(objects) = &self.objects {
                objects.unregister_pod(&uid);
            }
            self.volumes
                .unmount_pod(&uid)
                .await
                .map_err(|err| SyncError {
                    reason: "FailedCleanupVolumes",
                    message: crate::error_chain::error_chain(&err),
                })?;
            self.reasons.remove(&uid);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::event_stream::EventBroadcaster;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn seen_pod(seen: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some("u".to_owned()),
                annotations: Some(BTreeMap::from([(
                    CONFIG_SEEN_ANNOTATION.to_owned(),
                    seen.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn pod_start_count(metrics: &Metrics) -> String {
        let text = metrics.render().unwrap();
        text.lines()
            .find(|l| l.starts_with("kubelet_pod_start_duration_seconds_count"))
            .unwrap()
            .to_owned()
    }

    #[test]
    fn first_seen_comes_from_the_config_seen_annotation() {
        let pod = seen_pod("2026-01-01T00:00:00Z");
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_607);
        assert_eq!(since_first_seen(&pod, now), Some(Duration::from_secs(7)));
        assert_eq!(since_first_seen(&seen_pod("yesterday"), now), None);
        assert_eq!(since_first_seen(&Pod::default(), now), None);
    }

    #[test]
    fn pod_start_is_observed_when_a_pending_pod_first_runs() {
        let metrics = Metrics::new().unwrap();
        let latency = LatencyTracker::new(metrics.clone(), EventBroadcaster::default());
        let pod = seen_pod("2026-01-01T00:00:00Z");
        status_stored(&metrics, &latency, &pod, Some("Pending"), Some("Pending"));
        assert_eq!(
            pod_start_count(&metrics),
            "kubelet_pod_start_duration_seconds_count 0"
        );
        status_stored(&metrics, &latency, &pod, Some("Pending"), Some("Running"));
        assert_eq!(
            pod_start_count(&metrics),
            "kubelet_pod_start_duration_seconds_count 1"
        );
        status_stored(&metrics, &latency, &pod, Some("Running"), Some("Running"));
        status_stored(&metrics, &latency, &pod, Some("Failed"), Some("Running"));
        assert_eq!(
            pod_start_count(&metrics),
            "kubelet_pod_start_duration_seconds_count 1"
        );
    }
}
