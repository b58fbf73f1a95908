//! The eviction manager's view of the agent core (what the kubelet hands `eviction.NewManager` and
//! `Start` in `pkg/kubelet/kubelet.go`: `GetActivePods`, `killPodNow`, `podResourcesAreReclaimed`
//! and the container GC): pods come from the pod manager, their stats inputs from the pod cache,
//! kills go to the pod workers, and the status turns `Failed`/`Evicted` at the kill.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use crate::cm::{PodContainerManager, qos_class};
use crate::container::{PodCache, PodUid, Runtime};
use crate::eviction::{ActivePod, EvictionHandle, EvictionHost};
use crate::pod::{PodManager, is_mirror_pod, pod_uid};
use crate::pod_workers::{PodWorkers, UpdatePodOptions, UpdateType};
use crate::stats::PodStatsInput;
use crate::status::StatusManager;

/// See the module docs.
pub struct KubeletEvictionHost {
    pub(super) pods: PodManager,
    pub(super) workers: PodWorkers,
    pub(super) status: StatusManager,
    pub(super) cache: Arc<PodCache>,
    pub(super) pod_cgroups: Arc<PodContainerManager>,
    pub(super) runtime: Arc<dyn Runtime>,
    pub(super) evictions: EvictionHandle,
}

impl KubeletEvictionHost {
    fn active(&self) -> impl Iterator<Item = (PodUid, Arc<Pod>)> + '_ {
        self.pods.pods().into_iter().filter_map(|pod| {
            let uid = pod_uid(&pod)?;
            (!is_mirror_pod(&pod) && self.workers.is_pod_active(&uid)).then_some((uid, pod))
        })
    }
}

#[async_trait]
impl EvictionHost for KubeletEvictionHost {
    fn active_pods(&self) -> Vec<ActivePod> {
        self.active()
            .map(|(uid, pod)| {
                let stats = self.cache.get(&uid).map(|status| {
                    let cgroup = self.pod_cgroups.cgroup_parent_for(&uid, qos_class(&pod));
                    PodStatsInput::from_runtime(&status, cgroup)
                });
                ActivePod { pod, stats }
            })
            .collect()
    }

    fn kill(&self, pod: Arc<Pod>, grace_period_seconds: i64) {
        // The status says Evicted from the start of the stop, as the kubelet's status function
        // passed to killPodNow does; the pod's later syncs keep it.
        if let Some(uid) = pod_uid(&pod) {
            let mut status = self.status.get_pod_status(&uid).unwrap_or_default();
            if self.evictions.apply_eviction(&uid, &mut status) {
                self.status.set_pod_status(&pod, status);
            }
        }
        self.workers.update_pod(UpdatePodOptions {
            pod,
            update_type: UpdateType::Kill,
            grace_period_override: Some(grace_period_seconds),
            pod_removed: false,
        });
    }

    fn is_terminated(&self, uid: &PodUid) -> bool {
        !self.workers.is_pod_active(uid)
    }

    fn is_known(&self, uid: &PodUid) -> bool {
        self.pods.get(uid).is_some() || self.workers.phase(uid).is_some()
    }

    async fn delete_all_unused_containers(&self) {
        let active: HashSet<PodUid> = self.active().map(|(uid, _)| uid).collect();
        if let Err(err) = self.runtime.garbage_collect(0, &active).await {
            tracing::warn!(%err, "eviction manager: removing dead containers failed");
        }
    }
}
