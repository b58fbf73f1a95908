//! The agent's wiring and its sync loop (the kubelet's `pkg/kubelet/kubelet.go`: `Run`, `syncLoop`,
//! `syncLoopIteration` and the `SyncHandler` methods). The loop multiplexes pod-config updates, PLEG
//! events, probe verdicts, a 1 s sync tick and housekeeping (every 2 s, when a pod finishes
//! terminating, and when a cleanup round ends after one did), and is gated on runtime
//! health; all pod work is handed to the pod workers, all probing to the probe workers. With an API
//! server, the node status and lease, the status syncer and the mirror pods run as tasks of their
//! own, so the API server never holds up the loop.

mod active_deadline;
mod eviction_host;
mod housekeeping;
mod node_ip;
mod node_status;
mod pod_list;
mod runonce;
mod runtime_state;
mod server_host;
mod sync_pod;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus as ApiPodStatus};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::MissedTickBehavior;

use crate::apiserver::ApiClient;
use crate::eviction::{EvictionHandle, EvictionHost};
use crate::lifecycle::{Rejection, SysctlAllowlist, admit};
use crate::nodelease::NodeLease;
use crate::nodeshutdown::NodeShutdownHandle;
use crate::objects::ApiObjects;
use crate::pod::{MirrorPods, is_mirror_pod};
use crate::volumes::VolumeManager;

use crate::cm::PodContainerManager;
use crate::container::{CommandRunner, PodCache, Runtime};
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
use crate::prober::{
    ProbeHandle, ProbeManager, ProbeManagerDeps, ProbeResult, ProbeResults, ProbeType,
    ResultUpdate, ResultUpdates,
};
use crate::status::{ReasonCache, StatusManager, StatusSyncer, needs_readiness_reconcile};

pub use crate::pod::{PodManager, pod_uid};
pub use node_ip::{HostIpError, host_addresses, host_ip, node_ip};
pub use node_status::{KUBELET_VERSION, NodeStatusManager, NodeStatusSettings};
pub use runonce::RunPodResult;
pub use runtime_state::RuntimeState;
pub use server_host::{ApiParts, KubeletServerHost, NodeHelper};

use housekeeping::Housekeeping;
use pod_list::PodListCache;
use runtime_state::RUNTIME_UP_PERIOD;
use sync_pod::KubeletSyncer;

/// How often the sync loop looks for pods due for a resync.
const SYNC_TICK: Duration = Duration::from_secs(1);
/// How often housekeeping runs once every source is ready (the kubelet's 2 s).
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// Longest wait between sync-loop attempts while the runtime is down.
const MAX_RUNTIME_DOWN_BACKOFF: Duration = Duration::from_secs(5);

/// Settings the kubelet core takes from the configuration.
#[derive(Clone, Debug)]
pub struct KubeletSettings {
    /// The node: its name, registration, status reporting and capacity.
    pub node: NodeStatusSettings,
    pub root_dir: PathBuf,
    pub sync_frequency: Duration,
    pub max_dead_containers_per_container: usize,
    /// The PLEG's full-relist period (`plegRelistPeriod`, a ringlet extension); `None` for the
    /// mode's default: 1 s in relist mode, 60 s (the safety relist) in ebpf mode.
    pub pleg_relist_period: Option<Duration>,
    /// How often housekeeping runs besides when a pod finishes terminating:
    /// [`HOUSEKEEPING_PERIOD`] outside tests.
    pub housekeeping_period: Duration,
    /// The sysctls pods may set (the safe ones and `allowedUnsafeSysctls`).
    pub sysctls: SysctlAllowlist,
}

/// What the probes work with.
pub struct ProbeDeps {
    /// The verdict caches, shared with the runtime helper (which restarts condemned containers).
    pub results: ProbeResults,
    /// The caches' update channel.
    pub updates: ResultUpdates,
    /// Runs exec probes in containers.
    pub runner: Arc<dyn CommandRunner>,
}

/// What the kubelet core works with besides its settings.
pub struct KubeletDeps {
    pub runtime: Arc<dyn Runtime>,
    pub pod_cgroups: Arc<PodContainerManager>,
    pub recorder: Recorder,
    /// The PLEG's end of the eBPF hint source: with it the PLEG runs in ebpf mode (targeted
    /// relists, slow safety relist, and a targeted relist whenever a pod worker needs a newer
    /// status than the cache holds), without it in relist mode.
    pub pleg_hints: Option<HintChannel>,
    /// Shared with whoever else reports into it (the eBPF reader); served on `/metrics`.
    pub metrics: Metrics,
    /// Every PLEG event also goes here, for `ringlet events`.
    pub broadcaster: EventBroadcaster,
    /// The API server of the cluster this node joins; `None` for a standalone agent.
    pub api: Option<ApiClient>,
    /// What pods refer to on that API server (ConfigMaps, Secrets, tokens, Services); `None`
    /// standalone.
    pub objects: Option<ApiObjects>,
    /// Where the current Node is published (the runtime helper reads its allocatable).
    pub node: watch::Sender<Option<Node>>,
    pub probes: ProbeDeps,
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
    api: Option<ApiClient>,
    /// The Node as last computed or read back from the API server, for admission.
    node: watch::Receiver<Option<Node>>,
    node_status: Option<NodeStatusManager>,
    /// Wakes the mirror-pod task when the pod sources changed.
    mirrors_changed: Arc<Notify>,
    probes: ProbeManager,
    probe_handle: ProbeHandle,
    /// The eviction manager's state: pressure conditions, admission, evicted pods.
    evictions: EvictionHandle,
    /// Whether the node is shutting down (graceful node shutdown).
    shutdown: NodeShutdownHandle,
}

impl Kubelet {
    /// Assembles the agent core.
    // One assembly of every part, in dependency order; splitting it would scatter the wiring.
    #[allow(clippy::too_many_lines)]
    pub fn new(settings: KubeletSettings, deps: KubeletDeps) -> Self {
        let KubeletDeps {
            runtime,
            pod_cgroups,
            recorder,
            pleg_hints,
            metrics,
            broadcaster,
            api,
            objects,
            node: published_node,
            probes,
        } = deps;
        let cache = Arc::new(pleg_hints.as_ref().map_or_else(PodCache::new, |channel| {
            PodCache::with_refresher(channel.refresher())
        }));
        let latency = LatencyTracker::new(metrics.clone(), broadcaster.clone());
        let (pleg, pleg_handle, pleg_events) = GenericPleg::new(
            Arc::clone(&runtime),
            Arc::clone(&cache),
            PlegOptions {
                relist_period: settings.pleg_relist_period,
                hint_source_check: pleg_hints.as_ref().map(|channel| channel.check.clone()),
                hints: pleg_hints.map(|channel| channel.hints),
                metrics: metrics.clone(),
                latency: latency.clone(),
                broadcaster,
            },
        );
        tracing::info!(mode = %pleg_handle.mode(), "pleg mode");
        let status = StatusManager::new();
        let runtime_state = RuntimeState::new_unknown();
        let volumes = VolumeManager::new(
            settings.root_dir.join("pods"),
            objects.clone(),
            published_node.subscribe(),
        );
        let probe_manager = ProbeManager::new(
            ProbeManagerDeps {
                runner: probes.runner,
                recorder: recorder.clone(),
                status: status.clone(),
                metrics: metrics.clone(),
                results: probes.results,
            },
            probes.updates,
        );
        let probe_handle = probe_manager.handle();
        let queue = Arc::new(WorkQueue::default());
        let evictions = EvictionHandle::default();
        let shutdown = NodeShutdownHandle::default();
        let syncer = Arc::new(KubeletSyncer {
            runtime: Arc::clone(&runtime),
            status: status.clone(),
            reasons: ReasonCache::new(),
            pod_cgroups: Arc::clone(&pod_cgroups),
            recorder: recorder.clone(),
            runtime_state: runtime_state.clone(),
            host_ip: settings.node.host_ip().to_string(),
            volumes: volumes.clone(),
            objects,
            metrics: metrics.clone(),
            latency: latency.clone(),
            probes: probe_handle.clone(),
            queue: Arc::clone(&queue),
            evictions: evictions.clone(),
        });
        let workers = PodWorkers::new(
            Arc::clone(&syncer) as Arc<dyn crate::pod_workers::PodSyncer>,
            Arc::clone(&cache),
            Arc::clone(&queue),
            settings.sync_frequency,
            SYNC_BACKOFF_PERIOD,
            status.changed(),
        );
        let housekeeping = Housekeeping::new(
            Arc::clone(&runtime),
            pleg_handle.clone(),
            Arc::clone(&pod_cgroups),
            volumes,
            settings.max_dead_containers_per_container,
        );
        let node = published_node.subscribe();
        let node_status = NodeStatusManager::new(
            settings.node.clone(),
            api.clone(),
            Arc::clone(&runtime),
            runtime_state.clone(),
            pleg_handle.clone(),
            recorder.clone(),
            published_node,
            evictions.clone(),
            shutdown.clone(),
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
            api,
            node,
            node_status: Some(node_status),
            mirrors_changed: Arc::new(Notify::new()),
            probes: probe_manager,
            probe_handle,
            evictions,
            shutdown,
        }
    }

    /// What the eviction manager works with: the state it shares with the core, and the core's
    /// pods, workers and runtime.
    pub fn eviction_parts(&self) -> (EvictionHandle, Arc<dyn EvictionHost>) {
        let host = eviction_host::KubeletEvictionHost {
            pods: self.pods.clone(),
            workers: self.workers.clone(),
            status: self.status.clone(),
            cache: Arc::clone(&self.cache),
            pod_cgroups: Arc::clone(&self.pod_cgroups),
            runtime: Arc::clone(&self.runtime),
            evictions: self.evictions.clone(),
        };
        (self.evictions.clone(), Arc::new(host))
    }

    /// Whether the node is shutting down, for the node shutdown manager to set.
    pub fn shutdown_handle(&self) -> NodeShutdownHandle {
        self.shutdown.clone()
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
            pod_worker_panics: self.workers.panics(),
            sync_loop_threshold: sync_loop_threshold(self.settings.sync_frequency),
            metrics: self.metrics.clone(),
            pod_list: PodListCache::default(),
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
        self.start_node_tasks();
        tokio::spawn(crate::memory::release_free_pages_periodically());
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
        let mut housekeeping_tick = tokio::time::interval(self.settings.housekeeping_period);
        housekeeping_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let pods_terminated = self.workers.terminated();
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
                Some(update) = self.probes.next_update() => self.handle_probe_update(&update),
                _ = sync_tick.tick() => {
                    for uid in self.queue.take_due() {
                        if let Some(pod) = self.pods.get(&uid) {
                            self.dispatch(pod, UpdateType::Sync);
                        }
                    }
                }
                _ = housekeeping_tick.tick() => self.housekeep(&sources_ready).await,
                () = pods_terminated.notified() => self.housekeep(&sources_ready).await,
                () = self.housekeeping.cleanup_finished() => {
                    if self.housekeeping.removal_waiting() {
                        self.housekeep(&sources_ready).await;
                    }
                }
            }
            self.runtime_state.mark_sync_loop_seen();
        }
    }

    /// The kubelet's `HandlePodCleanups`, once every source is ready.
    async fn housekeep(&mut self, sources_ready: &SourcesReady) {
        if sources_ready.all_ready() {
            self.probe_handle.cleanup_pods(&self.pods.uids());
            self.housekeeping
                .run(&self.pods, &self.workers, &self.status, &self.latency)
                .await;
        }
    }

    /// The node status (and, with an API server, the lease, the status syncer and the mirror pods)
    /// as tasks of their own.
    fn start_node_tasks(&mut self) {
        if let Some(node_status) = self.node_status.take() {
            tokio::spawn(node_status.run());
        }
        let Some(api) = &self.api else { return };
        let node = &self.settings.node;
        match NodeLease::new(api, node.node_name.clone(), &node.node, self.node.clone()) {
            Ok(lease) => {
                tokio::spawn(lease.run());
            }
            Err(err) => tracing::error!(
                "cannot build the node lease's API client, the node will not heartbeat: {}",
                crate::error_chain::error_chain(&err)
            ),
        }
        tokio::spawn(
            StatusSyncer::new(
                api.clone(),
                self.status.clone(),
                self.pods.clone(),
                self.workers.clone(),
            )
            .run(),
        );
        tokio::spawn(
            MirrorPods::new(
                api.clone(),
                self.pods.clone(),
                node.node_name.clone(),
                self.node.clone(),
                Arc::clone(&self.mirrors_changed),
            )
            .run(),
        );
    }

    fn dispatch(&self, pod: Arc<Pod>, update_type: UpdateType) {
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
            if is_mirror_pod(&pod) {
                // A mirror only carries its static pod's status; it never runs.
                if update.op == PodOperation::Remove {
                    self.pods.remove_pod(&pod);
                } else {
                    self.pods.upsert(pod);
                    // A new mirror waits for its static pod's status.
                    self.status.changed().notify_one();
                }
                continue;
            }
            match update.op {
                // A pod first seen already being deleted (deleted while the agent was down) is
                // stopped like any other deleted pod.
                PodOperation::Add if pod.metadata.deletion_timestamp.is_none() => {
                    self.pods.upsert(pod.clone());
                    if let Some(rejection) = self.admission_failure(&pod) {
                        self.reject(&pod, &rejection);
                    } else {
                        self.probe_handle.add_pod(&pod);
                        self.dispatch(pod, UpdateType::Create);
                    }
                }
                PodOperation::Update => {
                    self.pods.upsert(pod.clone());
                    self.dispatch(pod, UpdateType::Update);
                }
                PodOperation::Reconcile => {
                    self.pods.upsert(pod.clone());
                    // A readiness gate's condition changed on the API server: Ready follows at
                    // once (the kubelet's `HandlePodReconcile`).
                    if needs_readiness_reconcile(&pod) {
                        self.dispatch(pod, UpdateType::Sync);
                    }
                }
                PodOperation::Remove => {
                    self.pods.remove(&uid);
                    self.probe_handle.remove_pod(&uid);
                    self.workers.update_pod(UpdatePodOptions {
                        pod,
                        update_type: UpdateType::Kill,
                        grace_period_override: None,
                        pod_removed: true,
                    });
                }
                PodOperation::Add | PodOperation::Delete => {
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
        self.mirrors_changed.notify_one();
        self.housekeeping.request_gc();
    }

    /// The kubelet's admission (`canAdmitPod` with the eviction, sysctl, node shutdown and
    /// predicate handlers): node pressure, the pod's sysctls, a shutting-down node, then the
    /// predicate against the Node as last computed, counting the pods whose workers are still
    /// active. Before the first Node is computed only the pod count is checked.
    fn admission_failure(&self, pod: &Pod) -> Option<Rejection> {
        if let Err(rejection) = self.evictions.admit(pod) {
            return Some(rejection);
        }
        if let Err(rejection) = self.settings.sysctls.admit(pod) {
            return Some(rejection);
        }
        if let Err(rejection) = self.shutdown.admit() {
            return Some(rejection);
        }
        let uid = pod_uid(pod);
        let active: Vec<Arc<Pod>> = self
            .pods
            .pods()
            .into_iter()
            .filter(|other| pod_uid(other) != uid)
            .filter(|other| pod_uid(other).is_some_and(|u| self.workers.is_pod_active(&u)))
            .collect();
        if let Some(node) = self.node.borrow().as_ref() {
            return admit(node, &active, pod).err();
        }
        let max_pods = self.settings.node.max_pods;
        (active.len() >= usize::try_from(max_pods).unwrap_or(usize::MAX)).then(|| Rejection {
            reason: "OutOfpods".to_owned(),
            message: format!("node has reached its pod limit of {max_pods} (maxPods)"),
        })
    }

    /// The kubelet's `rejectPod`: a Warning event and phase Failed with the reason.
    fn reject(&self, pod: &Pod, rejection: &Rejection) {
        self.recorder.event(
            EventType::Warning,
            EventObject::pod(pod),
            &rejection.reason,
            rejection.message.clone(),
        );
        self.status.set_pod_status(
            pod,
            ApiPodStatus {
                phase: Some("Failed".to_owned()),
                reason: Some(rejection.reason.clone()),
                message: Some(format!("Pod was rejected: {}", rejection.message)),
                ..ApiPodStatus::default()
            },
        );
    }

    /// A probe verdict changed (the kubelet's liveness, readiness and startup arms of
    /// `syncLoopIteration`): readiness and startup show in the stored status at once, and the pod
    /// is synced (a failed liveness verdict only: that sync restarts the container).
    fn handle_probe_update(&self, update: &ResultUpdate) {
        let Some(pod) = self.pods.get(&update.pod) else {
            return;
        };
        let success = update.result == ProbeResult::Success;
        match update.probe_type {
            ProbeType::Liveness if update.result != ProbeResult::Failure => return,
            ProbeType::Liveness => {}
            ProbeType::Readiness => {
                self.status
                    .set_container_readiness(&pod, &update.container, success);
            }
            ProbeType::Startup => {
                self.status
                    .set_container_startup(&pod, &update.container, success);
            }
        }
        self.dispatch(pod, UpdateType::Sync);
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
