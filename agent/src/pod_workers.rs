//! Pod workers (the kubelet's `pkg/kubelet/pod_workers.go`): one task per pod UID that serialises the
//! pod's syncs and walks it through sync → terminating → terminated.
//!
//! Updates are level-triggered: a worker keeps only the newest pod spec and a "work requested" flag, so
//! a burst of updates costs one sync. A kill request is sticky: once asked for, the pod terminates
//! whatever updates follow, and the grace period only ever shrinks. A pod added again with the same
//! UID while it terminates (a static pod's manifest moved out and back) runs again once its
//! termination is complete, as `pod_workers.go` restarts it. Every step is safe to re-run: a failed
//! sync is retried through the work queue after a jittered back-off (1 s while the network is not
//! ready), a failed stop or cleanup by the worker itself, since a removed pod is no longer in the
//! pod manager the sync loop dispatches from; after an agent restart the state is rebuilt from the
//! runtime. A worker that panics is reported unhealthy and run again (`crate::supervise`), redoing
//! the step it was in on a fresh runtime read. The cleanup's runtime read is always newer than the
//! stop; where it still shows the pod live (a sandbox the stop's older read missed), the worker
//! goes back to the stop instead of cleaning up around it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::container::{PodCache, PodStatus, PodUid};
use crate::supervise::{TaskPanics, spawn_supervised};

/// Why a sync was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateType {
    Create,
    Update,
    Sync,
    Kill,
}

/// Where a pod is in its life as the workers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    /// The pod should run: its sandbox and containers are kept in line with the spec.
    Syncing,
    /// The pod is being stopped (removed from its source, or it reached a terminal phase).
    Terminating,
    /// Nothing of the pod runs any more; `cleaned_up` once its resources were released.
    Terminated { cleaned_up: bool },
}

/// An update for one pod.
#[derive(Clone, Debug)]
pub struct UpdatePodOptions {
    /// The pod manager's copy, shared.
    pub pod: Arc<Pod>,
    pub update_type: UpdateType,
    /// For kills: overrides the pod's termination grace period (seconds).
    pub grace_period_override: Option<i64>,
    /// For kills: the pod was removed from its source, so the worker may be forgotten once it is done.
    pub pod_removed: bool,
}

/// The [`SyncError::reason`] of a sync that waits for the pod network; retried after 1 s.
pub const NETWORK_NOT_READY: &str = "NetworkNotReady";

/// Why a step failed; the worker retries after the back-off period.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct SyncError {
    /// A short CamelCase reason for the event, e.g. `FailedSync`, `BackOff`, `NetworkNotReady`.
    pub reason: &'static str,
    pub message: String,
}

/// The three steps of a pod's life, implemented by the kubelet.
#[async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    /// Brings the pod towards its spec.
    async fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        update_type: UpdateType,
    ) -> Result<SyncOutcome, SyncError>;

    /// Stops every container and the sandbox of the pod.
    async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace_period_override: Option<i64>,
    ) -> Result<(), SyncError>;

    /// Releases what the pod held on the node (cgroups, volumes, status when removed).
    async fn sync_terminated_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        cleanup: Cleanup,
    ) -> Result<(), SyncError>;
}

/// What a successful `sync_pod` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    /// The pod reached a terminal phase (Succeeded or Failed) and should be terminated.
    pub terminal: bool,
    /// The sync asked the runtime to change something (create, start or kill), so the next sync
    /// must see a runtime read taken after it.
    pub changed_runtime: bool,
}

/// Pods due for a resync (the kubelet's `queue.WorkQueue`), drained by the sync loop's 1 s tick.
#[derive(Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<PodUid, Instant>>,
}

impl WorkQueue {
    /// Asks for `uid` to be synced after `delay`; an earlier request wins.
    pub fn enqueue(&self, uid: PodUid, delay: Duration) {
        let at = Instant::now() + delay;
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        due.entry(uid)
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }

    /// Takes the pods whose time has come.
    pub fn take_due(&self) -> Vec<PodUid> {
        let now = Instant::now();
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let ready: Vec<PodUid> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &ready {
            due.remove(uid);
        }
        ready
    }
}

struct Worker {
    pod: Arc<Pod>,
    update_type: UpdateType,
    phase: WorkerPhase,
    work_requested: bool,
    /// Set once a kill was asked for; cleared only when the pod restarts.
    kill: Option<KillRequest>,
    pod_removed: bool,
    /// The pod was added again while it was being killed: it runs again once it is cleaned up.
    restart_requested: bool,
    wake: Arc<Notify>,
}

impl Worker {
    /// Starts the pod's life over (the kubelet restarts a terminated worker whose pod was added
    /// again with the same UID).
    fn restart(&mut self) {
        self.phase = WorkerPhase::Syncing;
        self.update_type = UpdateType::Create;
        self.kill = None;
        self.pod_removed = false;
        self.restart_requested = false;
        self.work_requested = true;
    }
}

/// A sticky request to stop the pod.
#[derive(Clone, Copy)]
struct KillRequest {
    grace_period_override: Option<i64>,
}

/// What the cleanup of a terminated pod keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// The pod is still wanted (it reached a terminal phase, or it is being deleted on the API
    /// server): its status and volumes stay.
    Kept,
    /// The pod was removed from its source: everything it held goes.
    Removed,
    /// The pod was removed and added again with the same UID: it runs again next, so its volumes
    /// stay and its containers may change state as in a new pod.
    Restarting,
}

/// What one step of a worker does, decided under the lock and performed outside it.
enum Step {
    Sync(Arc<Pod>, UpdateType),
    Terminate(Arc<Pod>, Option<i64>),
    CleanUp(Arc<Pod>, Cleanup),
}

struct Shared {
    workers: Mutex<HashMap<PodUid, Worker>>,
    syncer: Arc<dyn PodSyncer>,
    cache: Arc<PodCache>,
    queue: Arc<WorkQueue>,
    resync_interval: Duration,
    backoff_period: Duration,
    /// Panics of the worker tasks, for `/healthz`.
    panics: TaskPanics,
    /// Notified when a pod finishes terminating (cleaned up): the status syncer may delete it from
    /// the API server now.
    finished: Arc<Notify>,
    /// Notified at the same moment, for the sync loop: the pod's containers can be removed now.
    terminated: Arc<Notify>,
}

/// Cloneable handle to the pod workers.
#[derive(Clone)]
pub struct PodWorkers {
    shared: Arc<Shared>,
}

/// The kubelet's back-off before retrying a failed sync.
pub const SYNC_BACKOFF_PERIOD: Duration = Duration::from_secs(10);
/// The back-off while the network is not ready (the kubelet's `backOffOnTransientErrorPeriod`):
/// it may be ready any moment.
const TRANSIENT_ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// Resyncs and back-offs are stretched by up to this fraction at random (`pod_workers.go`'s
/// jitter factors), so pods that failed together do not retry together.
const JITTER_FACTOR: f64 = 0.5;

/// `period` stretched by a random part of `JITTER_FACTOR` (the kubelet's `wait.Jitter`).
fn jittered(period: Duration) -> Duration {
    period + period.mul_f64(JITTER_FACTOR * fastrand::f64())
}

impl PodWorkers {
    pub fn new(
        syncer: Arc<dyn PodSyncer>,
        cache: Arc<PodCache>,
        queue: Arc<WorkQueue>,
        resync_interval: Duration,
        backoff_period: Duration,
        finished: Arc<Notify>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                workers: Mutex::new(HashMap::new()),
                syncer,
                cache,
                queue,
                resync_interval,
                backoff_period,
                panics: TaskPanics::default(),
                finished,
                terminated: Arc::new(Notify::new()),
            }),
        }
    }

    /// Notified whenever a pod finishes terminating (many may wake the waiter once).
    pub fn terminated(&self) -> Arc<Notify> {
        Arc::clone(&self.shared.terminated)
    }

    /// The panics of the worker tasks: unhealthy for a while after one.
    pub fn panics(&self) -> TaskPanics {
        self.shared.panics.clone()
    }

    fn workers(&self) -> MutexGuard<'_, HashMap<PodUid, Worker>> {
        self.shared
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Delivers an update to the pod's worker, starting the worker on first sight of the UID.
    pub fn update_pod(&self, update: UpdatePodOptions) {
        let Some(uid) = update.pod.metadata.uid.clone().map(PodUid::from) else {
            tracing::warn!(pod = ?update.pod.metadata.name, "ignoring an update for a pod without a uid");
            return;
        };
        let mut workers = self.workers();
        let worker = workers.entry(uid.clone()).or_insert_with(|| {
            let wake = Arc::new(Notify::new());
            spawn_supervised(
                format!("pod worker {uid}"),
                self.shared.panics.clone(),
                worker_runs(Arc::clone(&self.shared), uid.clone(), Arc::clone(&wake)),
            );
            Worker {
                pod: Arc::clone(&update.pod),
                update_type: update.update_type,
                phase: WorkerPhase::Syncing,
                work_requested: false,
                kill: None,
                pod_removed: false,
                restart_requested: false,
                wake,
            }
        });
        if update.update_type == UpdateType::Kill {
            let earlier = worker.kill.and_then(|k| k.grace_period_override);
            let grace_period_override = match (earlier, update.grace_period_override) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            worker.kill = Some(KillRequest {
                grace_period_override,
            });
            // A pod cleaned up while it was still wanted (deleted on the API server) and removed
            // now is cleaned up again as removed, so what it kept until then (volumes) goes too.
            if update.pod_removed
                && !worker.pod_removed
                && worker.phase == (WorkerPhase::Terminated { cleaned_up: true })
            {
                worker.phase = WorkerPhase::Terminated { cleaned_up: false };
            }
            worker.pod_removed |= update.pod_removed;
            worker.restart_requested = false;
        } else if worker.kill.is_some() {
            // A pod being killed only starts again when it is added anew; other updates just
            // bring the newest spec for the stop.
            if update.update_type == UpdateType::Create {
                worker.restart_requested = true;
            }
        } else {
            worker.update_type = update.update_type;
        }
        worker.pod = update.pod;
        worker.work_requested = true;
        if worker.restart_requested
            && worker.phase == (WorkerPhase::Terminated { cleaned_up: true })
        {
            worker.restart();
        }
        worker.wake.notify_one();
    }

    /// The phase of a pod's worker, if the pod has one.
    pub fn phase(&self, uid: &PodUid) -> Option<WorkerPhase> {
        self.workers().get(uid).map(|w| w.phase)
    }

    /// Whether the pod has a worker that has not finished terminating.
    pub fn is_pod_active(&self, uid: &PodUid) -> bool {
        self.phase(uid)
            .is_some_and(|p| !matches!(p, WorkerPhase::Terminated { .. }))
    }

    /// UIDs of every pod with a worker.
    pub fn known_pods(&self) -> HashSet<PodUid> {
        self.workers().keys().cloned().collect()
    }

    /// Forgets workers of pods that are cleaned up and no longer wanted (the kubelet's
    /// `SyncKnownPods`), so their tasks end. Returns the forgotten UIDs.
    pub fn forget_finished(&self, wanted: &HashSet<PodUid>) -> Vec<PodUid> {
        let mut workers = self.workers();
        let finished: Vec<PodUid> = workers
            .iter()
            .filter(|(uid, w)| {
                w.phase == (WorkerPhase::Terminated { cleaned_up: true }) && !wanted.contains(*uid)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &finished {
            if let Some(worker) = workers.remove(uid) {
                worker.wake.notify_one();
            }
        }
        finished
    }
}

impl crate::status::PodDeletionSafety for PodWorkers {
    /// Finished: terminated and cleaned up, or never started (a rejected pod has no worker).
    fn pod_is_finished(&self, uid: &PodUid) -> bool {
        matches!(
            self.phase(uid),
            None | Some(WorkerPhase::Terminated { cleaned_up: true })
        )
    }
}

/// Decides the next step, or `None` when there is nothing to do (or the worker was forgotten).
fn next_step(workers: &mut HashMap<PodUid, Worker>, uid: &PodUid) -> Option<Step> {
    let worker = workers.get_mut(uid)?;
    if !worker.work_requested {
        return None;
    }
    worker.work_requested = false;
    if worker.phase == WorkerPhase::Syncing && worker.kill.is_some() {
        worker.phase = WorkerPhase::Terminating;
    }
    let pod = Arc::clone(&worker.pod);
    match worker.phase {
        WorkerPhase::Syncing => Some(Step::Sync(pod, worker.update_type)),
        WorkerPhase::Terminating => Some(Step::Terminate(
            pod,
            worker.kill.and_then(|k| k.grace_period_override),
        )),
        WorkerPhase::Terminated { cleaned_up: false } => {
            let cleanup = if worker.restart_requested {
                Cleanup::Restarting
            } else if worker.pod_removed {
                Cleanup::Removed
            } else {
                Cleanup::Kept
            };
            Some(Step::CleanUp(pod, cleanup))
        }
        WorkerPhase::Terminated { cleaned_up: true } => None,
    }
}

fn pod_label(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Makes the runs of a pod's worker task: the first, and one after each panic, which redoes the
/// step the panic interrupted on a runtime read taken after it (the step may have changed the
/// runtime before it panicked).
fn worker_runs(
    shared: Arc<Shared>,
    uid: PodUid,
    wake: Arc<Notify>,
) -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + 'static
{
    let mut first = true;
    move || {
        let last_change = if std::mem::take(&mut first) {
            None
        } else {
            request_work(&shared, &uid);
            Some(Instant::now())
        };
        Box::pin(run_worker(
            Arc::clone(&shared),
            uid.clone(),
            Arc::clone(&wake),
            last_change,
        ))
    }
}

/// One run of a pod's worker, until the worker is forgotten. `last_change`: when the runtime last
/// changed for all this run knows.
async fn run_worker(
    shared: Arc<Shared>,
    uid: PodUid,
    wake: Arc<Notify>,
    mut last_change: Option<Instant>,
) {
    // A sync acts on a runtime read taken after the last sync that changed the runtime, so it never
    // misses what the worker did itself; a read older than a sync that changed nothing is as good,
    // which lets a kernel-published exit be acted on without waiting for a new read.
    // When a failed stop or cleanup is tried again.
    let mut retry_at: Option<Instant> = None;
    loop {
        let step = {
            let mut workers = shared
                .workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !workers.contains_key(&uid) {
                return;
            }
            next_step(&mut workers, &uid)
        };
        let Some(step) = step else {
            match retry_at {
                None => wake.notified().await,
                Some(at) => {
                    tokio::select! {
                        () = wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {
                            retry_at = None;
                            request_work(&shared, &uid);
                        }
                    }
                }
            }
            continue;
        };
        retry_at = None;
        let status = shared.cache.get_newer_than(&uid, last_change).await;
        let outcome = perform(&shared, &step, &status).await;
        if !matches!(
            outcome,
            Ok(Performed {
                changed_runtime: false,
                ..
            })
        ) {
            last_change = Some(Instant::now());
        }
        let outcome = outcome.map(|performed| performed.phase);
        let mut workers = shared
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(worker) = workers.get_mut(&uid) else {
            return;
        };
        match outcome {
            Ok(next_phase) => {
                if next_phase != worker.phase {
                    worker.phase = next_phase;
                    worker.work_requested = true;
                    if next_phase == (WorkerPhase::Terminated { cleaned_up: true }) {
                        shared.finished.notify_one();
                        shared.terminated.notify_one();
                    }
                }
                if next_phase == WorkerPhase::Syncing {
                    shared
                        .queue
                        .enqueue(uid.clone(), jittered(shared.resync_interval));
                }
                if next_phase == (WorkerPhase::Terminated { cleaned_up: true })
                    && worker.restart_requested
                {
                    tracing::info!(pod = %pod_label(&worker.pod), %uid, "pod was added again while it terminated, starting it again");
                    worker.restart();
                }
            }
            Err(err) => {
                let pod = match &step {
                    Step::Sync(pod, _) | Step::Terminate(pod, _) | Step::CleanUp(pod, _) => pod,
                };
                let delay = jittered(if err.reason == NETWORK_NOT_READY {
                    TRANSIENT_ERROR_BACKOFF
                } else {
                    shared.backoff_period
                });
                tracing::warn!(pod = %pod_label(pod), %uid, %err, retry_in = ?delay, "error syncing pod, will retry");
                if matches!(step, Step::Sync(..)) {
                    shared.queue.enqueue(uid.clone(), delay);
                } else {
                    retry_at = Some(Instant::now() + delay);
                }
            }
        }
    }
}

/// Asks the worker of `uid` for another round (its retry time has come).
fn request_work(shared: &Shared, uid: &PodUid) {
    if let Some(worker) = shared
        .workers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_mut(uid)
    {
        worker.work_requested = true;
    }
}

/// What one step did: the phase the worker is in afterwards, and whether the runtime changed.
struct Performed {
    phase: WorkerPhase,
    changed_runtime: bool,
}

/// Runs one step. Stopping and cleaning up always count as changing the runtime.
async fn perform(shared: &Shared, step: &Step, status: &PodStatus) -> Result<Performed, SyncError> {
    match step {
        Step::Sync(pod, update_type) => {
            let outcome = shared.syncer.sync_pod(pod, status, *update_type).await?;
            Ok(Performed {
                phase: if outcome.terminal {
                    WorkerPhase::Terminating
                } else {
                    WorkerPhase::Syncing
                },
                changed_runtime: outcome.changed_runtime,
            })
        }
        Step::Terminate(pod, grace) => {
            shared
                .syncer
                .sync_terminating_pod(pod, status, *grace)
                .await?;
            Ok(Performed {
                phase: WorkerPhase::Terminated { cleaned_up: false },
                changed_runtime: true,
            })
        }
        Step::CleanUp(pod, cleanup) => {
            // The read is newer than the stop. Something still live there was missed by the stop's
            // older read (a sandbox a killed agent's `RunPodSandbox` finished after the restart, say):
            // stopping it again comes first, or its processes would keep the pod cgroup and every
            // cleanup retry would fail on it for good.
            if !status.live_part().is_empty() {
                tracing::warn!(pod = %pod_label(pod), uid = %status.uid,
                    "the pod still runs after it was stopped; stopping it again");
                return Ok(Performed {
                    phase: WorkerPhase::Terminating,
                    changed_runtime: false,
                });
            }
            shared
                .syncer
                .sync_terminated_pod(pod, status, *cleanup)
                .await?;
            Ok(Performed {
                phase: WorkerPhase::Terminated { cleaned_up: true },
                changed_runtime: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{SandboxId, SandboxState, SandboxStatus};
    use futures::FutureExt;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::sync::mpsc;

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Sync(String, UpdateType),
        Terminate(Option<i64>),
        CleanUp(Cleanup),
    }

    struct Recording {
        calls: mpsc::UnboundedSender<Call>,
        terminal_after_sync: bool,
        /// Whether a sync reports that it changed the runtime.
        changes_runtime: bool,
        /// Each sync waits for a permit, so tests can hold a worker busy.
        gate: Arc<tokio::sync::Semaphore>,
        fail_terminate_once: Mutex<bool>,
        /// Every sync fails with this reason.
        sync_error: Mutex<Option<&'static str>>,
        /// The next sync panics.
        panic_once: Mutex<bool>,
    }

    #[async_trait]
    impl PodSyncer for Recording {
        async fn sync_pod(
            &self,
            pod: &Pod,
            _status: &PodStatus,
            update_type: UpdateType,
        ) -> Result<SyncOutcome, SyncError> {
            self.gate.acquire().await.unwrap().forget();
            let image = pod.metadata.name.clone().unwrap();
            self.calls.send(Call::Sync(image, update_type)).unwrap();
            assert!(
                !std::mem::take(&mut *self.panic_once.lock().unwrap()),
                "the syncer panicked"
            );
            if let Some(reason) = *self.sync_error.lock().unwrap() {
                return Err(SyncError {
                    reason,
                    message: "failed".into(),
                });
            }
            Ok(SyncOutcome {
                terminal: self.terminal_after_sync,
                changed_runtime: self.changes_runtime,
            })
        }

        async fn sync_terminating_pod(
            &self,
            _pod: &Pod,
            _status: &PodStatus,
            grace: Option<i64>,
        ) -> Result<(), SyncError> {
            self.calls.send(Call::Terminate(grace)).unwrap();
            let mut fail = self.fail_terminate_once.lock().unwrap();
            if *fail {
                *fail = false;
                return Err(SyncError {
                    reason: "FailedKillPod",
                    message: "runtime unavailable".into(),
                });
            }
            Ok(())
        }

        async fn sync_terminated_pod(
            &self,
            _pod: &Pod,
            _status: &PodStatus,
            cleanup: Cleanup,
        ) -> Result<(), SyncError> {
            self.calls.send(Call::CleanUp(cleanup)).unwrap();
            Ok(())
        }
    }

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn update(name: &str, update_type: UpdateType) -> UpdatePodOptions {
        UpdatePodOptions {
            pod: Arc::new(pod(name)),
            update_type,
            grace_period_override: None,
            pod_removed: false,
        }
    }

    struct Fixture {
        workers: PodWorkers,
        calls: mpsc::UnboundedReceiver<Call>,
        gate: Arc<tokio::sync::Semaphore>,
        queue: Arc<WorkQueue>,
        syncer: Arc<Recording>,
        /// What the pod workers notify when a pod finishes terminating.
        finished: Arc<Notify>,
    }

    fn fixture(terminal_after_sync: bool, fail_terminate_once: bool, permits: usize) -> Fixture {
        fixture_with(terminal_after_sync, fail_terminate_once, permits, true)
    }

    fn fixture_with(
        terminal_after_sync: bool,
        fail_terminate_once: bool,
        permits: usize,
        changes_runtime: bool,
    ) -> Fixture {
        let (tx, calls) = mpsc::unbounded_channel();
        let gate = Arc::new(tokio::sync::Semaphore::new(permits));
        let syncer = Arc::new(Recording {
            calls: tx,
            terminal_after_sync,
            changes_runtime,
            gate: Arc::clone(&gate),
            fail_terminate_once: Mutex::new(fail_terminate_once),
            sync_error: Mutex::new(None),
            panic_once: Mutex::new(false),
        });
        let cache = Arc::new(PodCache::new());
        cache.update_time(Instant::now());
        let queue = Arc::new(WorkQueue::default());
        let finished = Arc::new(Notify::new());
        let workers = PodWorkers::new(
            Arc::clone(&syncer) as Arc<dyn PodSyncer>,
            cache,
            Arc::clone(&queue),
            Duration::from_mins(1),
            SYNC_BACKOFF_PERIOD,
            Arc::clone(&finished),
        );
        Fixture {
            workers,
            calls,
            gate,
            queue,
            syncer,
            finished,
        }
    }

    /// Lets the cache become newer than the worker's last sync, as a relist would.
    async fn relist(workers: &PodWorkers) {
        tokio::time::advance(Duration::from_millis(1)).await;
        workers.shared.cache.update_time(Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_that_changed_the_runtime_waits_for_a_newer_read_and_one_that_did_not_does_not()
    {
        for changes_runtime in [true, false] {
            let mut f = fixture_with(false, false, 10, changes_runtime);
            f.workers.update_pod(update("v1", UpdateType::Create));
            assert_eq!(
                f.calls.recv().await,
                Some(Call::Sync("v1".into(), UpdateType::Create))
            );
            f.workers.update_pod(update("v2", UpdateType::Update));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            if changes_runtime {
                assert!(
                    f.calls.try_recv().is_err(),
                    "the next sync must see what the last one did"
                );
                relist(&f.workers).await;
            }
            assert_eq!(
                f.calls.recv().await,
                Some(Call::Sync("v2".into(), UpdateType::Update)),
                "changes_runtime={changes_runtime}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn updates_while_busy_collapse_to_the_newest() {
        let mut f = fixture(false, false, 0);
        f.workers.update_pod(update("v1", UpdateType::Create));
        tokio::task::yield_now().await;
        f.workers.update_pod(update("v2", UpdateType::Update));
        f.workers.update_pod(update("v3", UpdateType::Update));
        f.gate.add_permits(10);
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
        relist(&f.workers).await;
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v3".into(), UpdateType::Update))
        );
        relist(&f.workers).await;
        tokio::task::yield_now().await;
        assert!(
            f.calls.try_recv().is_err(),
            "v2 must have been collapsed into v3"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_kill_is_never_overwritten_by_later_updates() {
        let mut f = fixture(false, false, 0);
        f.workers.update_pod(update("v1", UpdateType::Create));
        tokio::task::yield_now().await;
        let mut kill = update("v1", UpdateType::Kill);
        kill.grace_period_override = Some(5);
        kill.pod_removed = true;
        f.workers.update_pod(kill);
        f.workers.update_pod(update("v2", UpdateType::Update));
        f.gate.add_permits(10);
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(Some(5))));
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Removed)));
        assert_eq!(
            f.workers.phase(&PodUid::from("uid-1")),
            Some(WorkerPhase::Terminated { cleaned_up: true })
        );
        let forgotten = f.workers.forget_finished(&HashSet::new());
        assert_eq!(forgotten, vec![PodUid::from("uid-1")]);
        assert!(f.workers.known_pods().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminal_pod_terminates_and_stays_known_while_wanted() {
        let mut f = fixture(true, false, 10);
        f.workers.update_pod(update("done", UpdateType::Create));
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("done".into(), UpdateType::Create))
        );
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        relist(&f.workers).await;
        let terminated = f.workers.terminated();
        assert!(
            f.finished.notified().now_or_never().is_none()
                && terminated.notified().now_or_never().is_none(),
            "not finished before the cleanup"
        );
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Kept)));
        tokio::time::timeout(Duration::from_secs(1), f.finished.notified())
            .await
            .expect("the cleaned-up pod is announced as finished");
        tokio::time::timeout(Duration::from_secs(1), terminated.notified())
            .await
            .expect("the cleaned-up pod is announced to the sync loop too");
        let wanted: HashSet<PodUid> = [PodUid::from("uid-1")].into();
        assert!(f.workers.forget_finished(&wanted).is_empty());
        assert!(!f.workers.is_pod_active(&PodUid::from("uid-1")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_stop_of_a_removed_pod_is_retried_by_the_worker_after_the_back_off() {
        let mut f = fixture(false, true, 10);
        let mut kill = update("v1", UpdateType::Kill);
        kill.pod_removed = true;
        f.workers.update_pod(kill);
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            f.calls.try_recv().is_err(),
            "the retry must wait for the back-off"
        );
        // Nobody dispatches the pod again (it is gone from the pod manager) and the work queue
        // is not involved: the worker tries again on its own.
        tokio::time::advance(SYNC_BACKOFF_PERIOD.mul_f64(1.0 + JITTER_FACTOR)).await;
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Removed)));
        assert!(f.queue.take_due().is_empty());
    }

    /// The pod `uid-1` as a runtime read shows it: one sandbox in `state`.
    fn read_with_sandbox(state: SandboxState) -> PodStatus {
        PodStatus {
            uid: PodUid::from("uid-1"),
            sandboxes: vec![SandboxStatus {
                id: SandboxId::from("sandbox-the-stop-missed"),
                state,
                created_at: 1,
                attempt: 0,
                ip: None,
                host_network: true,
            }],
            ..PodStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_a_read_after_its_stop_shows_live_is_stopped_again_before_its_cleanup() {
        let mut f = fixture(false, false, 10);
        let mut kill = update("v1", UpdateType::Kill);
        kill.pod_removed = true;
        f.workers.update_pod(kill);
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        tokio::time::advance(Duration::from_millis(1)).await;
        f.workers
            .shared
            .cache
            .set(read_with_sandbox(SandboxState::Ready), Instant::now());
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Terminate(None)),
            "a ready sandbox after the stop is stopped, not cleaned up around"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        f.workers
            .shared
            .cache
            .set(read_with_sandbox(SandboxState::NotReady), Instant::now());
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Removed)));
        assert_eq!(
            f.workers.phase(&PodUid::from("uid-1")),
            Some(WorkerPhase::Terminated { cleaned_up: true })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_added_again_while_it_terminates_runs_again_once_it_is_cleaned_up() {
        let mut f = fixture(false, false, 10);
        f.workers.update_pod(update("v1", UpdateType::Create));
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
        let mut kill = update("v1", UpdateType::Kill);
        kill.pod_removed = true;
        f.workers.update_pod(kill);
        f.workers.update_pod(update("v2", UpdateType::Create));
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        relist(&f.workers).await;
        assert_eq!(
            f.calls.recv().await,
            Some(Call::CleanUp(Cleanup::Restarting)),
            "a pod that runs again keeps its volumes"
        );
        relist(&f.workers).await;
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v2".into(), UpdateType::Create))
        );
        assert_eq!(
            f.workers.phase(&PodUid::from("uid-1")),
            Some(WorkerPhase::Syncing)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_added_again_after_its_cleanup_runs_again_at_once() {
        let mut f = fixture(false, false, 10);
        let mut kill = update("v1", UpdateType::Kill);
        kill.pod_removed = true;
        f.workers.update_pod(kill);
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Removed)));
        tokio::task::yield_now().await;
        f.workers.update_pod(update("v2", UpdateType::Create));
        relist(&f.workers).await;
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v2".into(), UpdateType::Create))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_removed_again_before_it_restarted_stays_stopped() {
        let mut f = fixture(false, false, 0);
        f.workers.update_pod(update("v1", UpdateType::Create));
        tokio::task::yield_now().await;
        let mut kill = update("v1", UpdateType::Kill);
        kill.pod_removed = true;
        f.workers.update_pod(kill.clone());
        f.workers.update_pod(update("v1", UpdateType::Create));
        f.workers.update_pod(kill);
        f.workers.update_pod(update("v1", UpdateType::Update));
        f.gate.add_permits(10);
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::Terminate(None)));
        relist(&f.workers).await;
        assert_eq!(f.calls.recv().await, Some(Call::CleanUp(Cleanup::Removed)));
        relist(&f.workers).await;
        tokio::task::yield_now().await;
        assert!(
            f.calls.try_recv().is_err(),
            "nothing runs after the removal"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_is_reported_and_redoes_its_step_on_a_fresh_read() {
        let mut f = fixture(false, false, 10);
        *f.syncer.panic_once.lock().unwrap() = true;
        f.workers.update_pod(update("v1", UpdateType::Create));
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
        tokio::task::yield_now().await;
        let unhealthy = f.workers.panics().healthy().unwrap_err();
        assert!(unhealthy.contains("the syncer panicked"), "{unhealthy}");
        tokio::time::advance(crate::supervise::RESTART_BACKOFF_INITIAL).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            f.calls.try_recv().is_err(),
            "the step may have changed the runtime: it waits for a newer read"
        );
        relist(&f.workers).await;
        assert_eq!(
            f.calls.recv().await,
            Some(Call::Sync("v1".into(), UpdateType::Create))
        );
    }

    #[test]
    fn jitter_stretches_a_period_by_up_to_half() {
        for _ in 0..1000 {
            let delay = jittered(SYNC_BACKOFF_PERIOD);
            assert!(delay >= SYNC_BACKOFF_PERIOD && delay < Duration::from_secs(15));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sync_is_retried_through_the_work_queue_sooner_while_the_network_is_not_ready()
    {
        for (reason, earliest, latest) in [
            (NETWORK_NOT_READY, 1_000, 1_500),
            ("FailedSync", 10_000, 15_000),
        ] {
            let mut f = fixture(false, false, 10);
            *f.syncer.sync_error.lock().unwrap() = Some(reason);
            f.workers.update_pod(update("v1", UpdateType::Create));
            f.calls.recv().await;
            tokio::task::yield_now().await;
            let started = Instant::now();
            while f.queue.take_due().is_empty() {
                tokio::time::advance(Duration::from_millis(10)).await;
            }
            let waited = started.elapsed().as_millis();
            assert!(
                (earliest..=latest).contains(&waited),
                "{reason}: retried after {waited} ms"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_successful_sync_is_requeued_after_the_resync_interval() {
        let mut f = fixture(false, false, 10);
        f.workers.update_pod(update("v1", UpdateType::Create));
        f.calls.recv().await;
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(f.queue.take_due().is_empty());
        // Stretched by up to half the interval, so pods synced together spread out.
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(f.queue.take_due(), vec![PodUid::from("uid-1")]);
    }
}
