//! The relister (the kubelet's `GenericPLEG.relist`): lists every pod from the runtime, diffs each
//! container's and sandbox's state against the previous listing, re-reads the full status of every pod
//! that changed into the pod cache, and emits lifecycle events.
//!
//! In ebpf mode it also takes [`Hint`]s: each hint queues a targeted relist of its pod, which reads
//! only that pod's status, diffs it against the pod's record and emits the events and the cache update
//! the same way; a full relist then only runs as the safety net (every relist period, and at once on
//! `Hint::Resync`). A hint for a pod it has not listed yet reads that pod by its uid label, so K new
//! pods cost K targeted reads, not K listings of the node. The one hint that writes the cache itself is
//! the exit of a container's proven init: `ContainerDied` goes out at once and the exit overlays the
//! runtime's reads until the runtime reports it (see `kernel_exits`). "At once" holds while a relist
//! waits for the runtime too: hints are taken during a full relist's listing and a targeted relist's
//! read (not during the full relist's reads of the pods that changed, which run after its listing).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::panic::AssertUnwindSafe;

use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::{TryRecvError, TrySendError};
use tokio::time::Instant;

use super::health::Shared;
use super::init_processes::InitProcesses;
use super::kernel_exits::{KernelExits, Reconciled};
use super::latency::LatencyTracker;
use super::queue::{HintQueue, Settled};
use super::records::{PodRecords, runtime_lags};
use super::{
    DEFAULT_RELIST_PERIOD, EVENT_CHANNEL_CAPACITY, Hint, HintKind, PlegError, PlegHandle,
    PlegHints, PlegMode, PodHint, PodLifecycleEvent, PodLifecycleEventKind, RELIST_THRESHOLD,
    Refreshes,
};
use crate::container::{
    ContainerId, ContainerState, PodCache, PodStatus, PodUid, RunningPod, Runtime, SandboxId,
    SandboxState,
};
use crate::event_stream::{EventBroadcaster, LifecycleKind, LifecycleRecord};
use crate::metrics::{HintLabel, Metrics, RelistType};
use crate::supervise::{RestartBackoff, panic_message};

/// How many init pids the PLEG reads from the runtime at once.
const INIT_PID_READS: usize = 8;

/// How a [`GenericPleg`] runs besides its runtime and cache.
pub struct PlegOptions {
    /// The full-relist period; `None` for the mode's default (1 s in relist mode, 60 s as the
    /// safety relist in ebpf mode).
    pub relist_period: Option<Duration>,
    /// The hint source and the pod workers' refresh requests; `Some` runs the PLEG in ebpf mode,
    /// `None` in relist mode.
    pub hints: Option<PlegHints>,
    /// Asked at the start of every full relist to check the hint source for lost events.
    pub hint_source_check: Option<super::HintSourceCheck>,
    pub metrics: Metrics,
    /// Where the PLEG leaves hint times for the kernel → status latency.
    pub latency: LatencyTracker,
    /// Where `ringlet events` watchers get every event the PLEG sends.
    pub broadcaster: EventBroadcaster,
}

/// What the idle PLEG woke up for.
enum Wake {
    FullRelist,
    Hint(Option<Hint>),
    Refresh,
    Retry,
    EventsClosed,
}

/// The generic PLEG. Create it with [`GenericPleg::new`] and drive it with [`GenericPleg::run`].
pub struct GenericPleg {
    runtime: Arc<dyn Runtime>,
    cache: Arc<PodCache>,
    relist_period: Duration,
    events: mpsc::Sender<PodLifecycleEvent>,
    shared: Arc<Shared>,
    records: PodRecords,
    /// Pods whose status could not be read last relist; retried on the next one.
    reinspect: HashSet<PodUid>,
    first_relist_done: bool,
    hints: Option<mpsc::Receiver<Hint>>,
    /// Pod workers' refresh requests; kept when the hint source stops.
    refreshes: Option<Refreshes>,
    hint_source_check: Option<super::HintSourceCheck>,
    queue: HintQueue,
    full_relist_requested: bool,
    metrics: Metrics,
    latency: LatencyTracker,
    broadcaster: EventBroadcaster,
    init_processes: InitProcesses,
    kernel_exits: KernelExits,
}

impl GenericPleg {
    /// A PLEG over `runtime` writing into `cache`, its health handle, and the receiving end of its
    /// event channel (capacity [`EVENT_CHANNEL_CAPACITY`]).
    pub fn new(
        runtime: Arc<dyn Runtime>,
        cache: Arc<PodCache>,
        options: PlegOptions,
    ) -> (GenericPleg, PlegHandle, mpsc::Receiver<PodLifecycleEvent>) {
        let mode = if options.hints.is_some() {
            PlegMode::Ebpf
        } else {
            PlegMode::Relist
        };
        let (hints, refreshes) = options.hints.map(|h| (h.kernel, h.refreshes)).unzip();
        let (events, receiver) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let shared = Arc::new(Shared::new(mode));
        options.metrics.set_pleg_mode(mode);
        let pleg = GenericPleg {
            runtime,
            cache,
            relist_period: options
                .relist_period
                .unwrap_or_else(|| mode.default_relist_period()),
            events,
            shared: Arc::clone(&shared),
            records: PodRecords::default(),
            reinspect: HashSet::new(),
            first_relist_done: false,
            hints,
            refreshes,
            hint_source_check: options.hint_source_check,
            queue: HintQueue::default(),
            full_relist_requested: false,
            metrics: options.metrics,
            latency: options.latency,
            broadcaster: options.broadcaster,
            init_processes: InitProcesses::default(),
            kernel_exits: KernelExits::default(),
        };
        let threshold = RELIST_THRESHOLD.max(pleg.relist_period * 2);
        (pleg, PlegHandle::new(shared, threshold), receiver)
    }

    /// Relists everything at once and then `relist_period` after each full relist finished; in
    /// ebpf mode runs targeted relists for hints in between. Returns when the event receiver is
    /// dropped. A panic in the loop does not end it: it is logged, the PLEG reports unhealthy until
    /// a full relist completes again, and after a back-off the loop restarts from a full relist
    /// that reads every pod, with the hint queue and the kernel's exits dropped (the state the
    /// panic left is not trusted; the channels are kept, so nothing upstream or downstream sees it).
    pub async fn run(mut self) {
        let mut backoff = RestartBackoff::default();
        loop {
            let started = Instant::now();
            let Err(payload) = AssertUnwindSafe(self.run_loop()).catch_unwind().await else {
                return;
            };
            let message = panic_message(&*payload);
            self.shared.record_panic(&message);
            self.metrics.inc_pleg_panics();
            let wait = backoff.after_panic(started.elapsed());
            tracing::error!(panic = %message, restart_in = ?wait,
                "the pleg loop panicked; restarting it from a full relist");
            self.restart_state();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.events.closed() => return,
            }
        }
    }

    /// Drops what a panicked loop may have left half-done; the records stay (a full relist
    /// refreshes every one and diffs against the last listing, so only real changes are events).
    fn restart_state(&mut self) {
        self.records.clear_current();
        self.queue = HintQueue::default();
        self.metrics.set_pods_awaiting_runtime(0);
        self.kernel_exits = KernelExits::default();
        self.metrics
            .set_kernel_exits_pending(self.kernel_exits.pending());
        self.reinspect.clear();
        // Reads every pod's status, as the first relist does.
        self.first_relist_done = false;
        self.full_relist_requested = true;
    }

    async fn run_loop(&mut self) {
        let mut next_full = Instant::now();
        loop {
            self.take_available_hints();
            if self.events.is_closed() {
                tracing::info!("pleg event receiver dropped, stopping the relister");
                return;
            }
            let now = Instant::now();
            self.queue.queue_due_retries(now);
            if self.full_relist_requested || now >= next_full {
                self.full_relist_requested = false;
                self.relist().await;
                self.queue.forget_settled();
                next_full = Instant::now() + self.relist_period;
                continue;
            }
            if let Some(uid) = self.queue.pop_ready() {
                self.targeted_relist(&uid).await;
                continue;
            }
            match self.wait(next_full).await {
                Wake::FullRelist | Wake::Retry => {}
                Wake::Refresh => self.take_refreshes(),
                Wake::Hint(Some(hint)) => self.accept(hint),
                Wake::Hint(None) => self.hint_source_closed(),
                Wake::EventsClosed => {
                    tracing::info!("pleg event receiver dropped, stopping the relister");
                    return;
                }
            }
        }
    }

    /// Waits for the next full relist, hint, refresh request or lag retry.
    async fn wait(&mut self, next_full: Instant) -> Wake {
        let retry = self.queue.next_retry();
        let hints = &mut self.hints;
        let refreshes = self.refreshes.as_ref();
        tokio::select! {
            () = async {
                match refreshes {
                    Some(refreshes) => refreshes.requested().await,
                    None => std::future::pending().await,
                }
            } => Wake::Refresh,
            () = tokio::time::sleep_until(next_full) => Wake::FullRelist,
            hint = async {
                match hints {
                    Some(hints) => hints.recv().await,
                    None => std::future::pending().await,
                }
            } => Wake::Hint(hint),
            () = async {
                match retry {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            } => Wake::Retry,
            () = self.events.closed() => Wake::EventsClosed,
        }
    }

    /// Queues a targeted relist of every pod a worker asked to have read again.
    fn take_refreshes(&mut self) {
        let Some(refreshes) = &self.refreshes else {
            return;
        };
        for pod in refreshes.take() {
            self.metrics.inc_hint(HintLabel::Refresh);
            self.queue.request(pod);
        }
    }

    /// Moves every hint already waiting in the channel and every refresh request into the queue,
    /// so a burst coalesces.
    fn take_available_hints(&mut self) {
        self.take_refreshes();
        loop {
            let Some(hints) = self.hints.as_mut() else {
                return;
            };
            match hints.try_recv() {
                Ok(hint) => self.accept(hint),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.hint_source_closed();
                    return;
                }
            }
        }
    }

    /// Awaits `read` (a relist's runtime call) while taking the kernel's hints as they arrive, so a
    /// proven exit is published at once however long the runtime takes to answer. What is accepted
    /// meanwhile is consistent with the read: a relist overlays the kernel's exits on what it read.
    async fn taking_hints_meanwhile<T>(&mut self, read: impl Future<Output = T>) -> T {
        let mut read = std::pin::pin!(read);
        loop {
            let Some(hints) = self.hints.as_mut() else {
                return read.await;
            };
            let hint = tokio::select! {
                biased;
                result = &mut read => return result,
                hint = hints.recv() => hint,
            };
            match hint {
                Some(hint) => self.accept(hint),
                None => self.hint_source_closed(),
            }
        }
    }

    fn accept(&mut self, hint: Hint) {
        match hint {
            Hint::Pod(hint) => {
                self.metrics.inc_hint(HintLabel::Pod(hint.kind));
                tracing::trace!(pod = %hint.pod, kind = ?hint.kind, container = ?hint.container,
                    tgid = ?hint.tgid, "pleg hint");
                let proven_exit = self.learn_from(&hint).then(|| hint.clone());
                self.queue.push(hint);
                if let Some(exit) = proven_exit {
                    self.publish_kernel_exit(&exit);
                }
            }
            Hint::Resync { reason } => {
                self.metrics.inc_hint(HintLabel::Resync);
                tracing::info!(%reason, "hint source asked for a full relist");
                self.full_relist_requested = true;
            }
        }
    }

    /// Takes what a hint proves about a container's init; returns whether the hint is the exit of
    /// the container's proven init.
    fn learn_from(&mut self, hint: &PodHint) -> bool {
        let Some(container) = &hint.container else {
            return false;
        };
        match (hint.kind, hint.tgid) {
            (HintKind::OomKilled, _) => {
                self.kernel_exits
                    .oom_victim(container.clone(), Instant::now());
                false
            }
            (HintKind::Died, Some(tgid)) => self.init_processes.is_init(container, tgid),
            _ => false,
        }
    }

    /// The kernel reported the exit of a container's proven init: the cache shows the container
    /// exited and `ContainerDied` goes out now, before the runtime has noticed. The targeted relist
    /// the hint queued still reads the runtime, whose record later replaces the kernel's.
    fn publish_kernel_exit(&mut self, hint: &PodHint) {
        let Some(cached) = self.cache.get(&hint.pod) else {
            return;
        };
        let mut status = PodStatus::clone(&cached);
        let now = Instant::now();
        if !self.kernel_exits.publish(hint, &mut status, now) {
            return;
        }
        self.cache.amend(status);
        if let Some(record) = self.records.listed_mut(&hint.pod) {
            // The runtime's later report of this exit is then no second event.
            self.kernel_exits.overlay_listing(record, now);
        }
        self.metrics.inc_kernel_exits_published();
        self.metrics
            .set_kernel_exits_pending(self.kernel_exits.pending());
        self.send(PodLifecycleEvent {
            pod: hint.pod.clone(),
            kind: PodLifecycleEventKind::ContainerDied,
            container: hint.container.clone(),
        });
    }

    /// Overlays a runtime read of a pod with the kernel's exits and acts on the ones it settles.
    fn overlay_kernel_exits(&mut self, status: &mut PodStatus, now: Instant) {
        let settled = self.kernel_exits.overlay(status, now);
        self.metrics
            .set_kernel_exits_pending(self.kernel_exits.pending());
        for settled in settled {
            match settled {
                Reconciled::Confirmed {
                    container,
                    kernel_exit_code,
                    runtime_exit_code,
                    kernel_time_ns,
                } => {
                    if kernel_exit_code != runtime_exit_code {
                        self.metrics.inc_kernel_runtime_mismatch();
                        tracing::warn!(pod = %status.uid, %container, kernel_exit_code, runtime_exit_code,
                            "the runtime reports another exit code than the kernel did; the runtime's stands");
                    }
                    self.publish_runtime_confirmed(status, &container, kernel_time_ns);
                }
                Reconciled::Withdrawn { container, waited } => {
                    self.metrics.inc_kernel_runtime_mismatch();
                    tracing::warn!(pod = %status.uid, %container, ?waited,
                        "the runtime still reports running a container whose init the kernel saw exit; withdrawing the kernel's exit and relisting everything");
                    self.full_relist_requested = true;
                }
            }
        }
    }

    /// Tells `ringlet events` watchers that the runtime reported an exit the kernel published first.
    fn publish_runtime_confirmed(
        &self,
        status: &PodStatus,
        container: &ContainerId,
        kernel_time_ns: u64,
    ) {
        if self.broadcaster.watcher_count() == 0 {
            return;
        }
        let confirmed = status.containers.iter().find(|c| &c.id == container);
        self.broadcaster.publish(LifecycleRecord {
            pod_uid: status.uid.clone(),
            namespace: status.namespace.clone(),
            pod_name: status.name.clone(),
            container_name: confirmed.map(|c| c.name.clone()).unwrap_or_default(),
            container_id: Some(container.clone()),
            kind: LifecycleKind::RuntimeConfirmed,
            exit_code: confirmed.map(|c| c.exit_code),
            kernel_to_event: Some(Duration::from_nanos(
                super::monotonic_now_ns().saturating_sub(kernel_time_ns),
            )),
            observed_at: SystemTime::now(),
        });
    }

    /// Whether a `Died` fact about `container` of `pod` reported only exits of processes that are
    /// not its init (known): a process the runtime ran before the init (runc's own, in a new
    /// cgroup) or beside it. The runtime showing the container running is then no lag.
    fn exits_were_not_the_init(
        &self,
        pod: &PodUid,
        kind: HintKind,
        container: &ContainerId,
    ) -> bool {
        kind == HintKind::Died
            && self
                .init_processes
                .is_none_of(container, self.queue.exited_tgids(pod, container))
    }

    /// Asks the runtime, beside the PLEG loop, for the init pid of every running container and
    /// ready sandbox of `pods` not asked about yet (new, or adopted after a restart); ebpf mode
    /// only, where a kernel-reported exit needs it.
    fn learn_inits<'a>(&self, pods: impl IntoIterator<Item = &'a RunningPod>) {
        if self.hints.is_none() {
            return;
        }
        // Running containers and ready sandboxes, each with whether it is a sandbox.
        let mut is_sandbox: HashMap<ContainerId, bool> = HashMap::new();
        for pod in pods {
            let ready = pod
                .sandboxes
                .iter()
                .filter(|s| s.state == SandboxState::Ready);
            is_sandbox.extend(ready.map(|s| (ContainerId::from(s.id.as_str()), true)));
            let containers = pod
                .containers
                .iter()
                .filter(|c| c.state == ContainerState::Running);
            is_sandbox.extend(containers.map(|c| (c.id.clone(), false)));
        }
        let unknown = self.init_processes.to_ask(is_sandbox.keys().cloned());
        if unknown.is_empty() {
            return;
        }
        let runtime = Arc::clone(&self.runtime);
        let inits = self.init_processes.clone();
        tokio::spawn(async move {
            // An agent restarted on a full node adopts every container at once: a few at a time.
            let reads = unknown.into_iter().map(|id| {
                let runtime = Arc::clone(&runtime);
                let sandbox = is_sandbox.get(&id).copied().unwrap_or_default();
                async move {
                    let read = if sandbox {
                        let sandbox = SandboxId::from(id.as_str());
                        runtime.sandbox_init_pid(&sandbox).await
                    } else {
                        runtime.container_init_pid(&id).await
                    };
                    (id, read)
                }
            });
            let mut reads = futures::stream::iter(reads).buffer_unordered(INIT_PID_READS);
            while let Some((id, read)) = reads.next().await {
                match read {
                    Ok(pid) => inits.reported(&id, pid),
                    Err(error) => {
                        tracing::debug!(container = %id, %error, "cannot read the container's init pid");
                        inits.ask_again(&id);
                    }
                }
            }
        });
    }

    /// Without hints the PLEG falls back to relist mode, at once, since changes may have been missed.
    fn hint_source_closed(&mut self) {
        self.hints = None;
        self.relist_period = DEFAULT_RELIST_PERIOD;
        self.full_relist_requested = true;
        self.shared.set_mode(PlegMode::Relist);
        self.metrics.set_pleg_mode(PlegMode::Relist);
        tracing::warn!(
            period = ?self.relist_period,
            "the pleg hint source stopped; falling back to relist mode"
        );
    }

    fn record_activity(&self, at: Instant) {
        self.shared.record_relist(at);
        self.metrics.set_pleg_last_seen_now();
    }

    /// One full relist. A failed listing leaves everything (including the health timestamp) as it
    /// was.
    async fn relist(&mut self) {
        // Asking here is what lets an idle hint source notice lost events without a timer.
        if let Some(check) = &self.hint_source_check {
            check.request();
        }
        let start = Instant::now();
        self.metrics.inc_relist(RelistType::Full);
        if let Some(last) = self.shared.last_full_relist() {
            self.metrics.observe_relist_interval(start - last);
        }
        let runtime = Arc::clone(&self.runtime);
        let listed = self
            .taking_hints_meanwhile(async move { runtime.get_pods(true).await })
            .await;
        self.metrics.observe_relist_duration(start.elapsed());
        let pods = match listed {
            Ok(pods) => pods,
            Err(source) => {
                let error = PlegError::ListPods { source };
                tracing::error!(error = %error, cause = %source_of(&error), "relist failed");
                return;
            }
        };
        self.record_activity(start);
        self.shared.record_full_relist(start);

        let kernel_exits = &mut self.kernel_exits;
        self.records
            .set_current_listing(pods.into_iter().map(|mut pod| {
                kernel_exits.overlay_listing(&mut pod, start);
                pod
            }));

        // On the first relist every known pod is read, so a restarted agent starts from the real
        // state of pods that were already running.
        let force = !self.first_relist_done;
        let mut needs_reinspection = HashSet::new();
        for uid in self.records.uids() {
            match self.process_pod(&uid, start, force).await {
                Ok(true) => {
                    self.reinspect.remove(&uid);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(pod = %uid, error = %error, cause = %source_of(&error),
                        "reading pod status failed, re-inspecting next relist");
                    needs_reinspection.insert(uid);
                }
            }
        }

        // Pods that failed last time but produced no events now still need their status read.
        for uid in std::mem::take(&mut self.reinspect) {
            if needs_reinspection.contains(&uid) {
                continue;
            }
            // The record was advanced this relist, so its old listing is the one just read.
            let pod = self.records.newest(&uid).cloned();
            if let Err(error) = self.update_cache(&uid, pod.as_ref(), start).await {
                tracing::warn!(pod = %uid, error = %error, cause = %source_of(&error),
                    "re-inspecting pod failed");
                needs_reinspection.insert(uid);
            }
        }

        self.cache.update_time(start);
        self.reinspect = needs_reinspection;
        self.first_relist_done = true;
        self.shared.clear_panic();
        self.shared.set_running_pods(self.records.listed_pods());
        self.update_running_metrics();
        self.kernel_exits.expire_oom_facts(start);
        let records = &self.records;
        self.kernel_exits.retain_pods(|uid| records.contains(uid));
        self.metrics
            .set_kernel_exits_pending(self.kernel_exits.pending());
        let listed: Vec<RunningPod> = self.records.listed_pods().cloned().collect();
        let present: HashSet<&str> = listed
            .iter()
            .flat_map(|p| {
                let sandboxes = p.sandboxes.iter().map(|s| s.id.as_str());
                sandboxes.chain(p.containers.iter().map(|c| c.id.as_str()))
            })
            .collect();
        self.init_processes
            .retain(|id| present.contains(id.as_str()));
        self.learn_inits(&listed);
    }

    /// Re-reads one pod a hint named, diffs it against its record and emits the events and the cache
    /// update. A pod without a record (not listed yet: just created, or adopted since the last full
    /// relist) is read by its uid label instead of by name. While the runtime still reports running
    /// a container the kernel saw exit (or not yet running one the kernel saw start), the read is
    /// retried with a short back-off.
    async fn targeted_relist(&mut self, uid: &PodUid) {
        let known = self
            .records
            .known(uid)
            .map(|pod| (pod.name.clone(), pod.namespace.clone()));
        if known.is_none() && self.queue.only_removals(uid) {
            // Removed cgroups of a pod without a record (already gone) cannot produce events.
            self.queue.forget(uid);
            return;
        }
        let start = Instant::now();
        self.metrics.inc_relist(RelistType::Targeted);
        let listed_before = known.is_some();
        let read = read_pod(Arc::clone(&self.runtime), uid.clone(), known);
        let mut status = match self.taking_hints_meanwhile(read).await {
            Ok(Some(status)) => status,
            // The runtime has nothing of the pod (yet): an empty read, so a kernel-reported start
            // is waited for like any other lagging one.
            Ok(None) => PodStatus {
                uid: uid.clone(),
                ..PodStatus::default()
            },
            Err(error) => {
                tracing::warn!(error = %error, cause = %source_of(&error),
                    "targeted relist failed, re-inspecting next full relist");
                // A pod not listed yet needs no re-inspection: the next full relist lists it.
                if listed_before {
                    self.reinspect.insert(uid.clone());
                }
                self.queue.forget(uid);
                self.metrics
                    .set_pods_awaiting_runtime(self.queue.awaiting_runtime());
                return;
            }
        };
        self.record_activity(start);
        self.reinspect.remove(uid);

        // What the runtime itself reports decides whether it lags; what the pod shows includes the
        // kernel's exits it has not reported yet.
        let lagging = self.lagging_facts(uid, &status);
        self.overlay_kernel_exits(&mut status, start);
        let current = status.to_running_pod();
        let current = (!current.is_empty()).then_some(current);

        // A pod neither cached nor found is no change (a hint for a cgroup of no ringlet pod).
        let changed = self
            .cache
            .get(uid)
            .map_or(current.is_some(), |cached| *cached != status);
        let found = current.is_some();
        let events = self.records.apply_read(uid, current);
        if found {
            self.cache.set(status, start);
        } else {
            self.cache.delete(uid, start);
        }
        let mut sent = 0;
        for event in events {
            if event.kind != PodLifecycleEventKind::ContainerChanged {
                self.send(event);
                sent += 1;
            }
        }
        if sent == 0 && changed {
            self.send(PodLifecycleEvent {
                pod: uid.clone(),
                kind: PodLifecycleEventKind::PodSync,
                container: None,
            });
        }

        let confirming = self.only_confirmations(&lagging);
        let lagging: Vec<ContainerId> = lagging.into_iter().map(|(_, c)| c).collect();
        match self.queue.settle(uid, &lagging, confirming, Instant::now()) {
            Settled::Done { lag: Some(lag) } => self.metrics.observe_runtime_lag(lag),
            Settled::Done { lag: None } | Settled::Retrying => {}
            Settled::GaveUp { waited } => {
                // Waiting for the safety relist could take a minute; a full relist now costs one
                // list and catches whatever the runtime has recorded meanwhile.
                tracing::warn!(pod = %uid, containers = ?lagging, ?waited,
                "the runtime still misses container starts or exits the kernel reported; relisting everything");
                self.full_relist_requested = true;
            }
        }
        self.metrics
            .set_pods_awaiting_runtime(self.queue.awaiting_runtime());
        self.shared.set_running_pod(uid, self.records.listed(uid));
        self.update_running_metrics();
        if let Some(pod) = self.records.listed(uid) {
            self.learn_inits([pod]);
        }
    }

    /// The hinted starts and exits of `uid` that the runtime's `status` (before any kernel overlay)
    /// does not show yet.
    fn lagging_facts(&self, uid: &PodUid, status: &PodStatus) -> Vec<(HintKind, ContainerId)> {
        let seen = status.to_running_pod();
        self.queue
            .expected_changes(uid)
            .into_iter()
            .filter(|(kind, c)| runtime_lags(*kind, &seen, c))
            .filter(|(kind, c)| !self.exits_were_not_the_init(uid, *kind, c))
            .collect()
    }

    /// Whether all `lagging` stands for is the runtime's confirmation of exits the kernel
    /// published and still overlays.
    fn only_confirmations(&self, lagging: &[(HintKind, ContainerId)]) -> bool {
        lagging
            .iter()
            .all(|(kind, c)| *kind == HintKind::Died && self.kernel_exits.overlays(c))
    }

    /// Diffs one pod's record; when anything changed (or `force`), reads the pod's status into the
    /// cache, then advances the record and sends the events. When the status cannot be read the
    /// record stays where it was, so the same events are found again next time. Returns whether the
    /// status was read.
    async fn process_pod(
        &mut self,
        uid: &PodUid,
        read_at: Instant,
        force: bool,
    ) -> Result<bool, PlegError> {
        let Some(events) = self.records.pending_events(uid) else {
            return Ok(false);
        };
        let inspect = !events.is_empty() || force || self.kernel_exits.covers(uid);
        if inspect {
            let pod = self.records.current(uid).cloned();
            self.update_cache(uid, pod.as_ref(), read_at).await?;
        }
        self.records.advance(uid);
        for event in events {
            if event.kind != PodLifecycleEventKind::ContainerChanged {
                self.send(event);
            }
        }
        Ok(inspect)
    }

    /// Reads the pod's full status into the cache, or forgets the pod when the runtime no longer has
    /// it.
    async fn update_cache(
        &mut self,
        uid: &PodUid,
        pod: Option<&RunningPod>,
        read_at: Instant,
    ) -> Result<(), PlegError> {
        let Some(pod) = pod else {
            self.cache.delete(uid, read_at);
            return Ok(());
        };
        let mut status = self
            .runtime
            .get_pod_status(uid, &pod.name, &pod.namespace)
            .await
            .map_err(|source| PlegError::InspectPod {
                uid: uid.clone(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                source,
            })?;
        self.overlay_kernel_exits(&mut status, read_at);
        self.cache.set(status, read_at);
        Ok(())
    }

    /// `kubelet_running_pods` and `kubelet_running_containers` from the records.
    fn update_running_metrics(&self) {
        let pods = self.records.listed_pods();
        let mut sandboxes = 0;
        let mut containers: HashMap<ContainerState, usize> = HashMap::new();
        for pod in pods {
            sandboxes += pod
                .sandboxes
                .iter()
                .filter(|s| s.state == SandboxState::Ready)
                .count();
            for container in &pod.containers {
                *containers.entry(container.state).or_default() += 1;
            }
        }
        self.metrics.set_running(sandboxes, |state| {
            containers.get(&state).copied().unwrap_or(0)
        });
    }

    /// Sends an event; when a hint led to it, observes the kernel → event latency.
    fn send(&self, event: PodLifecycleEvent) {
        let hint_time = self
            .queue
            .hint_time(&event.pod, event.kind, event.container.as_ref());
        let pod = event.pod.clone();
        let record = (self.broadcaster.watcher_count() > 0)
            .then(|| self.lifecycle_record(&event, hint_time))
            .flatten();
        match self.events.try_send(event) {
            Ok(()) => {
                if let Some(kernel_time_ns) = hint_time {
                    self.latency.event_emitted(&pod, kernel_time_ns);
                }
                if let Some(record) = record {
                    self.broadcaster.publish(record);
                }
            }
            Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(event)) => {
                self.shared.count_discarded_event();
                self.metrics.inc_pleg_discard_events();
                tracing::error!(pod = %event.pod, kind = ?event.kind,
                    "pleg event channel is full, discarding event");
            }
        }
    }
}

impl GenericPleg {
    /// What `ringlet events` shows of an event: names and exit code from the status just cached.
    fn lifecycle_record(
        &self,
        event: &PodLifecycleEvent,
        hint_time: Option<u64>,
    ) -> Option<LifecycleRecord> {
        let status = self.cache.get(&event.pod);
        let container = status.as_ref().and_then(|s| {
            let id = event.container.as_ref()?;
            s.containers.iter().find(|c| &c.id == id)
        });
        let kind = match event.kind {
            PodLifecycleEventKind::ContainerStarted => LifecycleKind::Started,
            PodLifecycleEventKind::ContainerDied
                if container.is_some_and(|c| c.reason == "OOMKilled") =>
            {
                LifecycleKind::OomKilled
            }
            PodLifecycleEventKind::ContainerDied => LifecycleKind::Died,
            PodLifecycleEventKind::ContainerRemoved => LifecycleKind::Removed,
            PodLifecycleEventKind::PodSync => LifecycleKind::PodSync,
            PodLifecycleEventKind::ContainerChanged => return None,
        };
        let record = self.records.listed(&event.pod);
        Some(LifecycleRecord {
            pod_uid: event.pod.clone(),
            namespace: status
                .as_ref()
                .map(|s| s.namespace.clone())
                .or_else(|| record.map(|r| r.namespace.clone()))
                .unwrap_or_default(),
            pod_name: status
                .as_ref()
                .map(|s| s.name.clone())
                .or_else(|| record.map(|r| r.name.clone()))
                .unwrap_or_default(),
            container_name: container.map(|c| c.name.clone()).unwrap_or_default(),
            container_id: event.container.clone(),
            kind,
            exit_code: container
                .filter(|_| kind != LifecycleKind::Started)
                .filter(|c| c.state == ContainerState::Exited)
                .map(|c| c.exit_code),
            kernel_to_event: hint_time
                .map(|t| Duration::from_nanos(super::monotonic_now_ns().saturating_sub(t))),
            observed_at: SystemTime::now(),
        })
    }
}

/// Reads one pod's status: by name when the PLEG knows it (`known`: name and namespace), else by its
/// uid label; `None` when the runtime has nothing of an unlisted pod.
async fn read_pod(
    runtime: Arc<dyn Runtime>,
    uid: PodUid,
    known: Option<(String, String)>,
) -> Result<Option<PodStatus>, PlegError> {
    match known {
        Some((name, namespace)) => runtime
            .get_pod_status(&uid, &name, &namespace)
            .await
            .map(Some)
            .map_err(|source| PlegError::InspectPod {
                uid,
                name,
                namespace,
                source,
            }),
        None => runtime
            .get_pod_status_by_uid(&uid)
            .await
            .map_err(|source| PlegError::InspectUnlistedPod { uid, source }),
    }
}

fn source_of(error: &PlegError) -> String {
    std::error::Error::source(error).map_or_else(String::new, ToString::to_string)
}

#[cfg(test)]
mod tests;
