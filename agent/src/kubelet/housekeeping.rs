//! Housekeeping (the kubelet's `HandlePodCleanups` plus container GC): forget finished workers, drop
//! orphaned statuses, stop runtime pods no source wants, remove dead containers and sandboxes, and
//! remove pod cgroups and pod directories (volumes unmounted) nothing uses. Runs only once every
//! source is ready, so a slow source never gets its pods killed. The running pods come from the
//! PLEG's view, not from listing the runtime; the cleanup that lists the pod directories and the
//! runtime and walks the pod cgroups runs when something died or went away, and in relist mode also
//! once a minute (in ebpf mode the kernel reports every death, so an idle node lists nothing).
//! That cleanup runs as a task of its own (the kubelet runs container GC in its own goroutine), one
//! round at a time, and its cgroup work on the blocking pool: the sync loop never waits for it.
//! Besides its 2 s tick, the sync loop runs housekeeping when a pod finishes terminating and when a
//! round ends after a pod finished terminating during it, so a removed pod's containers go as soon
//! as it stopped; other requests (deaths, config updates) wait for the tick.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cm::PodContainerManager;
use crate::container::{PodUid, Runtime};
use crate::pleg::{LatencyTracker, PlegHandle, PlegMode};
use crate::pod_workers::PodWorkers;
use crate::status::StatusManager;
use crate::volumes::VolumeManager;

use super::PodManager;

/// In relist mode container GC runs at least this often (the kubelet's 1 min), and sooner when
/// asked.
const GC_PERIOD: Duration = Duration::from_mins(1);

pub struct Housekeeping {
    runtime: Arc<dyn Runtime>,
    pleg: PlegHandle,
    pod_cgroups: Arc<PodContainerManager>,
    volumes: VolumeManager,
    max_dead_containers_per_container: usize,
    gc_requested: bool,
    /// A pod finished terminating while a round ran: the next round starts when that one ends,
    /// not at the next tick. Other requests wait for the tick, so rounds stay at most one per
    /// tick however many updates and deaths come.
    removal_waiting: bool,
    last_gc: Option<Instant>,
    /// Orphaned runtime pods being stopped, so a slow stop is not started twice.
    killing: Arc<Mutex<HashSet<PodUid>>>,
    /// The cleanup round in progress, if any.
    cleanup: Option<JoinHandle<()>>,
}

impl Housekeeping {
    pub fn new(
        runtime: Arc<dyn Runtime>,
        pleg: PlegHandle,
        pod_cgroups: Arc<PodContainerManager>,
        volumes: VolumeManager,
        max_dead_containers_per_container: usize,
    ) -> Self {
        Self {
            runtime,
            pleg,
            pod_cgroups,
            volumes,
            max_dead_containers_per_container,
            gc_requested: true,
            removal_waiting: false,
            last_gc: None,
            killing: Arc::default(),
            cleanup: None,
        }
    }

    /// Asks for container GC at the next housekeeping round (a container died, a pod went away).
    pub fn request_gc(&mut self) {
        self.gc_requested = true;
    }

    /// Whether a pod finished terminating while the round in progress ran.
    pub fn removal_waiting(&self) -> bool {
        self.removal_waiting
    }

    /// Resolves when the cleanup round in progress ends (never while none runs), so the sync loop
    /// can start the next one at once instead of at the next tick.
    pub async fn cleanup_finished(&mut self) {
        let Some(round) = &mut self.cleanup else {
            return std::future::pending().await;
        };
        if let Err(err) = round.await {
            tracing::warn!(%err, "a cleanup round did not finish");
        }
        self.cleanup = None;
    }

    pub async fn run(
        &mut self,
        pods: &PodManager,
        workers: &PodWorkers,
        status: &StatusManager,
        latency: &LatencyTracker,
    ) {
        let desired = pods.uids();
        let finished = !workers.forget_finished(&desired).is_empty();
        if finished {
            // A pod finished terminating: its dead containers and sandbox can go now.
            self.gc_requested = true;
        }
        // The pod manager and the workers change only on the sync loop, which waits for this call:
        // `keep` holds until it returns, the pod directories listed below included.
        let mut keep = desired;
        keep.extend(workers.known_pods());
        status.remove_orphans(&keep);
        latency.retain(&keep);

        for orphan in self.pleg.running_pods_except(&keep) {
            self.kill_orphan(orphan);
        }
        // Decided after the finished workers are forgotten, so a pod that just terminated has its
        // containers removed in this round, not the next.
        let periodic_gc_due = self.pleg.mode() == PlegMode::Relist
            && self.last_gc.is_none_or(|t| t.elapsed() >= GC_PERIOD);
        if !(self.gc_requested || periodic_gc_due) {
            return;
        }
        if self
            .cleanup
            .as_ref()
            .is_some_and(|round| !round.is_finished())
        {
            // Asked again while a round runs: the next housekeeping takes it.
            self.gc_requested = true;
            self.removal_waiting |= finished;
            return;
        }
        self.gc_requested = false;
        self.removal_waiting = false;
        self.last_gc = Some(Instant::now());
        let pod_dirs = self.volumes.pod_dirs().await;
        let in_runtime = self.pleg.running_pod_uids();
        if in_runtime.iter().any(|uid| !keep.contains(uid)) {
            // A pod nobody wants still runs (being stopped, or the PLEG's view is a relist behind):
            // a later round removes what it leaves.
            self.gc_requested = true;
        }
        let orphaned_dirs: Vec<PodUid> = pod_dirs
            .into_iter()
            .filter(|uid| !keep.contains(uid) && !in_runtime.contains(uid))
            .collect();
        let round = CleanupRound {
            runtime: Arc::clone(&self.runtime),
            pod_cgroups: Arc::clone(&self.pod_cgroups),
            volumes: self.volumes.clone(),
            max_dead_containers_per_container: self.max_dead_containers_per_container,
            keep,
            in_runtime,
            orphaned_dirs,
        };
        self.cleanup = Some(tokio::spawn(round.run()));
    }

    fn kill_orphan(&self, pod: crate::container::RunningPod) {
        let inserted = self
            .killing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pod.uid.clone());
        if !inserted {
            return;
        }
        let runtime = Arc::clone(&self.runtime);
        let killing = Arc::clone(&self.killing);
        tokio::spawn(async move {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "stopping a pod no source wants");
            if let Err(err) = runtime.kill_pod(None, &pod, None).await {
                tracing::warn!(uid = %pod.uid, %err, "cannot stop orphaned pod");
            }
            killing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&pod.uid);
        });
    }
}

/// One cleanup: dead containers and sandboxes, then the pod directories and pod cgroups that no
/// wanted or running pod owns.
struct CleanupRound {
    runtime: Arc<dyn Runtime>,
    pod_cgroups: Arc<PodContainerManager>,
    volumes: VolumeManager,
    max_dead_containers_per_container: usize,
    keep: HashSet<PodUid>,
    in_runtime: HashSet<PodUid>,
    orphaned_dirs: Vec<PodUid>,
}

impl CleanupRound {
    async fn run(self) {
        if let Err(err) = self
            .runtime
            .garbage_collect(self.max_dead_containers_per_container, &self.keep)
            .await
        {
            tracing::warn!(%err, "container garbage collection failed");
        }
        if !self.orphaned_dirs.is_empty() {
            self.volumes.remove_pod_dirs(self.orphaned_dirs).await;
        }
        let (pod_cgroups, keep, in_runtime) = (self.pod_cgroups, self.keep, self.in_runtime);
        let removed = tokio::task::spawn_blocking(move || {
            remove_orphaned_cgroups(&pod_cgroups, &keep, &in_runtime);
        })
        .await;
        if let Err(err) = removed {
            tracing::warn!(%err, "removing orphaned pod cgroups did not finish");
        }
    }
}

/// Removes the pod cgroups of pods neither wanted nor running (blocking: cgroup v1 removal waits
/// for each controller).
fn remove_orphaned_cgroups(
    pod_cgroups: &PodContainerManager,
    keep: &HashSet<PodUid>,
    in_runtime: &HashSet<PodUid>,
) {
    match pod_cgroups.list_pod_cgroups() {
        Ok(cgroups) => {
            for cgroup in cgroups {
                if keep.contains(&cgroup.uid) || in_runtime.contains(&cgroup.uid) {
                    continue;
                }
                if let Err(err) = pod_cgroups.destroy(&cgroup.uid, cgroup.qos) {
                    tracing::warn!(uid = %cgroup.uid, %err, "cannot remove orphaned pod cgroup");
                }
            }
        }
        Err(err) => tracing::warn!(%err, "cannot list pod cgroups"),
    }
}
