//! The agent's wiring and its sync loop (the kubelet's `pkg/kubelet/kubelet.go`: `Run`, `syncLoop`,
//! `syncLoopIteration` and the `SyncHandler` methods). The loop multiplexes pod-config updates, PLEG
//! events, a 1 s sync tick and a 2 s housekeeping tick, and is gated on runtime health; all pod work is
//! handed to the pod workers.

mod housekeeping;
mod node_ip;
mod pod_manager;
mod runonce;
mod runtime_state;
mod server_host;
mod sync_pod;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::cm::PodContainerManager;
use crate::container::{PodCache, Runtime};
use crate::event_stream::EventBroadcaster;
use crate::events::{EventObject, EventType, Recorder};
use crate::metrics::Metrics;
use crate::pleg::{
    GenericPleg, HintChannel, LatencyTracker, PlegHandle, PlegOptions, PodLifecycleEvent,
    PodLifecycleEventKind,
};
use crate::pod_workers::{
    PodWorkers, SYNC_BACKOFF_PERIOD, UpdatePodOptions, UpdateType, WorkQueue,
};
use crate::podconfig::{PodOperation, PodUpdate, SourcesReady};
use crate::status::{ReasonCache, StatusManager};

pub use node_ip::{HostIpError, host_addresses, host_ip, node_ip};
pub use pod_manager::{PodManager, pod_uid};
pub use runonce::RunPodResult;
pub use runtime_state::RuntimeState;
pub use server_host::{ApiParts, KubeletServerHost, NodeHelper};

use housekeeping::Housekeeping;
use runtime_state::RUNTIME_UP_PERIOD;
use sync_pod::KubeletSyncer;

/// How often the sync loop looks for pods due for a resync.
const SYNC_TICK: Duration = Duration::from_secs(1);
/// How often housekeeping runs once every source is ready.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// Longest wait between sync-loop attempts while the runtime is down.
const MAX_RUNTIME_DOWN_BACKOFF: Duration = Duration::from_secs(5);

/// Settings the kubelet core takes from the configuration.
#[derive(Clone, Debug)]
pub struct KubeletSettings {
    pub node_name: String,
    pub root_dir: PathBuf,
    pub sync_frequency: Duration,
    pub max_pods: usize,
    pub max_dead_containers_per_container: usize,
    /// The PLEG's full-relist period (`plegRelistPeriod`, a ringlet extension); `None` for the
    /// mode's default: 1 s in relist mode, 60 s (the safety relist) in ebpf mode.
    pub pleg_relist_period: Option<Duration>,
}

/// The assembled agent core.
pub struct Kubelet {
    settings: KubeletSettings,
    runtime: Arc<dyn Runtime>,
    pods: PodManager,
    workers: PodWorkers,
    queue: Arc<WorkQueue>,
    status: StatusManager,
    runtime_state: RuntimeState,
    pleg: Option<GenericPleg>,
    pleg_handle: PlegHandle,
    pleg_events: mpsc::Receiver<PodLifecycleEvent>,
    recorder: Recorder,
    housekeeping: Housekeeping,
    syncer: Arc<KubeletSyncer>,
    metrics: Metrics,
    latency: LatencyTracker,
    cache: Arc<PodCache>,
    pod_cgroups: Arc<PodContainerManager>,
}

impl Kubelet {
    /// Assembles the agent core. `pleg_hints` is the PLEG's end of the eBPF hint source: with it the
    /// PLEG runs in ebpf mode (targeted relists, slow safety relist, and a targeted relist whenever a
    /// pod worker needs a newer status than the cache holds), without it in relist mode.
    /// `metrics` is shared with whoever else reports into it (the eBPF reader) and is served on
    /// `/metrics`. Every PLEG event also goes to `broadcaster` for `ringlet events`.
    pub fn new(
        settings: KubeletSettings,
        runtime: Arc<dyn Runtime>,
        pod_cgroups: Arc<PodContainerManager>,
        recorder: Recorder,
        pleg_hints: Option<HintChannel>,
        metrics: Metrics,
        broadcaster: EventBroadcaster,
    ) -> Self {
        let cache = Arc::new(pleg_hints.as_ref().map_or_else(PodCache::new, |channel| {
            PodCache::with_refresher(channel.refresher())
        }));
        let latency = LatencyTracker::new(metrics.clone());
        let (pleg, pleg_handle, pleg_events) = GenericPleg::new(
            Arc::clone(&runtime),
            Arc::clone(&cache),
            PlegOptions {
                relist_period: settings.pleg_relist_period,
                hints: pleg_hints.map(|channel| channel.hints),
                metrics: metrics.clone(),
                latency: latency.clone(),
                broadcaster,
            },
        );
        tracing::info!(mode = %pleg_handle.mode(), "pleg mode");
        let status = StatusManager::new();
        let runtime_state = RuntimeState::new_unknown();
        let syncer = Arc::new(KubeletSyncer {
            runtime: Arc::clone(&runtime),
            status: status.clone(),
            reasons: ReasonCache::new(),
            pod_cgroups: Arc::clone(&pod_cgroups),
            recorder: recorder.clone(),
            runtime_state: runtime_state.clone(),
            host_ip: node_ip().to_string(),
            pods_dir: settings.root_dir.join("pods"),
            metrics: metrics.clone(),
            latency: latency.clone(),
        });
        let queue = Arc::new(WorkQueue::default());
        let workers = PodWorkers::new(
            Arc::clone(&syncer) as Arc<dyn crate::pod_workers::PodSyncer>,
            Arc::clone(&cache),
            Arc::clone(&queue),
            settings.sync_frequency,
            SYNC_BACKOFF_PERIOD,
        );
        let housekeeping = Housekeeping::new(
            Arc::clone(&runtime),
            Arc::clone(&pod_cgroups),
            settings.max_dead_containers_per_container,
        );
        Self {
            settings,
            runtime,
            pods: PodManager::default(),
            workers,
            queue,
            status,
            runtime_state,
            pleg: Some(pleg),
            pleg_handle,
            pleg_events,
            recorder,
            housekeeping,
            syncer,
            metrics,
            latency,
            cache,
            pod_cgroups,
        }
    }

    /// What the HTTP servers need: the core's state plus what `api` adds for the kubelet API.
    pub fn server_host(&self, api: ApiParts) -> Arc<KubeletServerHost> {
        Arc::new(KubeletServerHost {
            runtime: Arc::clone(&self.runtime),
            cache: Arc::clone(&self.cache),
            pod_cgroups: Arc::clone(&self.pod_cgroups),
            api,
            pods: self.pods.clone(),
            status: self.status.clone(),
            runtime_state: self.runtime_state.clone(),
            pleg: self.pleg_handle.clone(),
            sync_loop_threshold: sync_loop_threshold(self.settings.sync_frequency),
            metrics: self.metrics.clone(),
        })
    }

    /// The desired pods and their statuses (for run-once mode and tests).
    pub fn pods_with_status(&self) -> Vec<Pod> {
        server_host::pods_with_status(&self.pods, &self.status)
    }

    /// Runs the PLEG, the runtime-status poll and the sync loop until the update channel closes.
    pub async fn run(
        mut self,
        mut updates: mpsc::Receiver<PodUpdate>,
        sources_ready: SourcesReady,
    ) {
        if let Some(pleg) = self.pleg.take() {
            tokio::spawn(pleg.run());
        }
        self.runtime_state
            .update_runtime_up(self.runtime.as_ref())
            .await;
        tokio::spawn({
            let state = self.runtime_state.clone();
            let runtime = Arc::clone(&self.runtime);
            async move {
                let mut tick = tokio::time::interval(RUNTIME_UP_PERIOD);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    state.update_runtime_up(runtime.as_ref()).await;
                }
            }
        });
        let mut sync_tick = tokio::time::interval(SYNC_TICK);
        sync_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut housekeeping_tick = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut runtime_down_wait = Duration::from_millis(100);
        loop {
            if let Some(err) = self.runtime_state.runtime_error() {
                tracing::warn!("skipping pod synchronization: {err}");
                tokio::time::sleep(runtime_down_wait).await;
                runtime_down_wait = (runtime_down_wait * 2).min(MAX_RUNTIME_DOWN_BACKOFF);
                continue;
            }
            runtime_down_wait = Duration::from_millis(100);
            self.runtime_state.mark_sync_loop_seen();
            tokio::select! {
                update = updates.recv() => {
                    let Some(update) = update else {
                        tracing::info!("pod config update channel closed, leaving the sync loop");
                        return;
                    };
                    self.handle_update(update);
                }
                Some(event) = self.pleg_events.recv() => self.handle_pleg_event(&event),
                _ = sync_tick.tick() => {
                    for uid in self.queue.take_due() {
                        if let Some(pod) = self.pods.get(&uid) {
                            self.dispatch(pod, UpdateType::Sync);
                        }
                    }
                }
                _ = housekeeping_tick.tick() => {
                    if sources_ready.all_ready() {
                        self.housekeeping
                            .run(&self.pods, &self.workers, &self.status, &self.latency)
                            .await;
                    }
                }
            }
            self.runtime_state.mark_sync_loop_seen();
        }
    }

    fn dispatch(&self, pod: Pod, update_type: UpdateType) {
        self.workers.update_pod(UpdatePodOptions {
            pod,
            update_type,
            grace_period_override: None,
            pod_removed: false,
        });
    }

    fn handle_update(&mut self, update: PodUpdate) {
        tracing::debug!(op = ?update.op, source = %update.source, pods = update.pods.len(), "pod config update");
        for pod in update.pods {
            let Some(uid) = pod_uid(&pod) else { continue };
            match update.op {
                PodOperation::Add => {
                    self.pods.upsert(pod.clone());
                    if let Some(message) = self.admission_failure() {
                        self.reject(&pod, "OutOfpods", &message);
                    } else {
                        self.dispatch(pod, UpdateType::Create);
                    }
                }
                PodOperation::Update => {
                    self.pods.upsert(pod.clone());
                    self.dispatch(pod, UpdateType::Update);
                }
                PodOperation::Reconcile => self.pods.upsert(pod),
                PodOperation::Remove => {
                    self.pods.remove(&uid);
                    self.workers.update_pod(UpdatePodOptions {
                        pod,
                        update_type: UpdateType::Kill,
                        grace_period_override: None,
                        pod_removed: true,
                    });
                }
                PodOperation::Delete => {
                    let grace = pod.metadata.deletion_grace_period_seconds;
                    self.pods.upsert(pod.clone());
                    self.workers.update_pod(UpdatePodOptions {
                        pod,
                        update_type: UpdateType::Kill,
                        grace_period_override: grace,
                        pod_removed: false,
                    });
                }
            }
        }
        self.housekeeping.request_gc();
    }

    /// The kubelet's max-pods admission check, counting pods whose workers are still active.
    fn admission_failure(&self) -> Option<String> {
        let active = self
            .pods
            .uids()
            .iter()
            .filter(|uid| self.workers.is_pod_active(uid))
            .count();
        (active >= self.settings.max_pods).then(|| {
            format!(
                "node has reached its pod limit of {} (maxPods)",
                self.settings.max_pods
            )
        })
    }

    fn reject(&self, pod: &Pod, reason: &str, message: &str) {
        self.recorder
            .event(EventType::Warning, EventObject::pod(pod), reason, message);
        self.status.set_pod_status(
            pod,
            ApiPodStatus {
                phase: Some("Failed".to_owned()),
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
                ..ApiPodStatus::default()
            },
        );
    }

    fn handle_pleg_event(&mut self, event: &PodLifecycleEvent) {
        if event.kind == PodLifecycleEventKind::ContainerDied {
            self.housekeeping.request_gc();
        }
        if event.kind == PodLifecycleEventKind::ContainerRemoved {
            return;
        }
        if let Some(pod) = self.pods.get(&event.pod) {
            self.dispatch(pod, UpdateType::Sync);
        }
    }
}

/// The `/healthz` syncloop threshold: twice the resync interval, at least 10 s (as the kubelet).
fn sync_loop_threshold(sync_frequency: Duration) -> Duration {
    (sync_frequency * 2).max(Duration::from_secs(10))
}
