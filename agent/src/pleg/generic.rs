//! The relister (the kubelet's `GenericPLEG.relist`): lists every pod from the runtime, diffs each
//! container's and sandbox's state against the previous listing, re-reads the full status of every pod
//! that changed into the pod cache, and emits lifecycle events.
//!
//! Per-pod work goes through [`GenericPleg::process_pod`], which only needs the pod's record to hold
//! the old and the current listing; a targeted relist of one pod (driven by an event hint) fills the
//! current listing from that pod's status instead of a full `get_pods` and reuses the same step.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use super::health::Shared;
use super::{
    EVENT_CHANNEL_CAPACITY, PlegError, PlegHandle, PodLifecycleEvent, PodLifecycleEventKind,
};
use crate::container::{
    ContainerId, ContainerState, PodCache, PodUid, RunningPod, Runtime, SandboxState,
};

/// The PLEG's coarse view of a container or sandbox (the kubelet's `plegContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    /// Created but not started, or a state the runtime could not tell.
    Unknown,
    NonExistent,
}

/// The last listing the events were computed against, and the listing being processed.
#[derive(Default)]
struct PodRecord {
    old: Option<RunningPod>,
    current: Option<RunningPod>,
}

/// The generic PLEG in relist mode. Create it with [`GenericPleg::new`] and drive it with
/// [`GenericPleg::run`].
pub struct GenericPleg {
    runtime: Arc<dyn Runtime>,
    cache: Arc<PodCache>,
    relist_period: Duration,
    events: mpsc::Sender<PodLifecycleEvent>,
    shared: Arc<Shared>,
    records: HashMap<PodUid, PodRecord>,
    /// Pods whose status could not be read last relist; retried on the next one.
    reinspect: HashSet<PodUid>,
    first_relist_done: bool,
}

impl GenericPleg {
    /// A relister over `runtime` writing into `cache`, its health handle, and the receiving end of its
    /// event channel (capacity [`EVENT_CHANNEL_CAPACITY`]).
    pub fn new(
        runtime: Arc<dyn Runtime>,
        cache: Arc<PodCache>,
        relist_period: Duration,
    ) -> (GenericPleg, PlegHandle, mpsc::Receiver<PodLifecycleEvent>) {
        let (events, receiver) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let shared = Arc::new(Shared::default());
        let pleg = GenericPleg {
            runtime,
            cache,
            relist_period,
            events,
            shared: Arc::clone(&shared),
            records: HashMap::new(),
            reinspect: HashSet::new(),
            first_relist_done: false,
        };
        (pleg, PlegHandle::new(shared), receiver)
    }

    /// Relists at once and then `relist_period` after each relist finished, until the event receiver
    /// is dropped.
    pub async fn run(mut self) {
        loop {
            self.relist().await;
            if self.events.is_closed() {
                tracing::info!("pleg event receiver dropped, stopping the relister");
                return;
            }
            tokio::time::sleep(self.relist_period).await;
        }
    }

    /// One full relist. A failed listing leaves everything (including the health timestamp) as it
    /// was.
    async fn relist(&mut self) {
        let start = Instant::now();
        let pods = match self.runtime.get_pods(true).await {
            Ok(pods) => pods,
            Err(source) => {
                let error = PlegError::ListPods { source };
                tracing::error!(error = %error, cause = %source_of(&error), "relist failed");
                return;
            }
        };
        self.shared.record_relist(start);

        for record in self.records.values_mut() {
            record.current = None;
        }
        for pod in pods {
            let uid = pod.uid.clone();
            self.records.entry(uid).or_default().current = Some(pod);
        }

        // On the first relist every known pod is read, so a restarted agent starts from the real
        // state of pods that were already running.
        let force = !self.first_relist_done;
        let mut uids: Vec<PodUid> = self.records.keys().cloned().collect();
        uids.sort();
        let mut needs_reinspection = HashSet::new();
        for uid in uids {
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
            let pod = self
                .records
                .get(&uid)
                .and_then(|record| record.current.as_ref().or(record.old.as_ref()));
            if let Err(error) = self.update_cache(&uid, pod, start).await {
                tracing::warn!(pod = %uid, error = %error, cause = %source_of(&error),
                    "re-inspecting pod failed");
                needs_reinspection.insert(uid);
            }
        }

        self.cache.update_time(start);
        self.reinspect = needs_reinspection;
        self.first_relist_done = true;
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
        let events = match self.records.get(uid) {
            Some(record) => compute_pod_events(uid, record.old.as_ref(), record.current.as_ref()),
            None => return Ok(false),
        };
        let inspect = !events.is_empty() || force;
        if inspect {
            let pod = self
                .records
                .get(uid)
                .and_then(|record| record.current.as_ref());
            self.update_cache(uid, pod, read_at).await?;
        }
        self.advance_record(uid);
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
        &self,
        uid: &PodUid,
        pod: Option<&RunningPod>,
        read_at: Instant,
    ) -> Result<(), PlegError> {
        let Some(pod) = pod else {
            self.cache.delete(uid);
            return Ok(());
        };
        let status = self
            .runtime
            .get_pod_status(uid, &pod.name, &pod.namespace)
            .await
            .map_err(|source| PlegError::InspectPod {
                uid: uid.clone(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                source,
            })?;
        self.cache.set(status, read_at);
        Ok(())
    }

    fn advance_record(&mut self, uid: &PodUid) {
        let Some(record) = self.records.get_mut(uid) else {
            return;
        };
        match record.current.take() {
            Some(current) => record.old = Some(current),
            None => {
                self.records.remove(uid);
            }
        }
    }

    fn send(&self, event: PodLifecycleEvent) {
        match self.events.try_send(event) {
            Ok(()) | Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(event)) => {
                self.shared.count_discarded_event();
                tracing::error!(pod = %event.pod, kind = ?event.kind,
                    "pleg event channel is full, discarding event");
            }
        }
    }
}

fn source_of(error: &PlegError) -> String {
    std::error::Error::source(error).map_or_else(String::new, ToString::to_string)
}

/// Every container and sandbox of a listing with its PLEG state, keyed by id. Sandbox ids share the
/// key space with container ids, as in the kubelet.
fn states(pod: Option<&RunningPod>) -> BTreeMap<ContainerId, PlegState> {
    let Some(pod) = pod else {
        return BTreeMap::new();
    };
    let containers = pod.containers.iter().map(|c| {
        let state = match c.state {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        };
        (c.id.clone(), state)
    });
    let sandboxes = pod.sandboxes.iter().map(|s| {
        let state = match s.state {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
        };
        (ContainerId::new(s.id.as_str()), state)
    });
    containers.chain(sandboxes).collect()
}

fn compute_pod_events(
    uid: &PodUid,
    old: Option<&RunningPod>,
    current: Option<&RunningPod>,
) -> Vec<PodLifecycleEvent> {
    let old = states(old);
    let current = states(current);
    let ids: std::collections::BTreeSet<&ContainerId> = old.keys().chain(current.keys()).collect();
    let mut events = Vec::new();
    for id in ids {
        let before = old.get(id).copied().unwrap_or(PlegState::NonExistent);
        let after = current.get(id).copied().unwrap_or(PlegState::NonExistent);
        for kind in transition_events(before, after) {
            events.push(PodLifecycleEvent {
                pod: uid.clone(),
                kind: *kind,
                container: Some(id.clone()),
            });
        }
    }
    events
}

fn transition_events(before: PlegState, after: PlegState) -> &'static [PodLifecycleEventKind] {
    use PodLifecycleEventKind::{
        ContainerChanged, ContainerDied, ContainerRemoved, ContainerStarted,
    };
    if before == after {
        return &[];
    }
    match (before, after) {
        (_, PlegState::Running) => &[ContainerStarted],
        // A container that started and exited between two relists was never seen running.
        (PlegState::NonExistent, PlegState::Exited) => &[ContainerStarted, ContainerDied],
        (_, PlegState::Exited) => &[ContainerDied],
        (_, PlegState::Unknown) => &[ContainerChanged],
        (PlegState::Exited, PlegState::NonExistent) => &[ContainerRemoved],
        (_, PlegState::NonExistent) => &[ContainerDied, ContainerRemoved],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::container::{
        PodStatus, PodSyncResult, RunningContainer, RunningSandbox, RuntimeError, RuntimeStatus,
        SandboxId,
    };
    use PodLifecycleEventKind::{ContainerDied, ContainerRemoved, ContainerStarted};

    #[derive(Default)]
    struct FakeRuntime {
        pods: Mutex<Vec<RunningPod>>,
        fail_list: Mutex<bool>,
        fail_status: Mutex<HashSet<PodUid>>,
        status_calls: Mutex<Vec<PodUid>>,
    }

    impl FakeRuntime {
        fn set_pods(&self, pods: Vec<RunningPod>) {
            *self.pods.lock().unwrap() = pods;
        }

        fn take_status_calls(&self) -> Vec<PodUid> {
            std::mem::take(&mut *self.status_calls.lock().unwrap())
        }
    }

    #[async_trait]
    impl Runtime for FakeRuntime {
        async fn version(&self) -> Result<String, RuntimeError> {
            Ok("fake 0".to_owned())
        }

        async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
            Ok(RuntimeStatus::default())
        }

        async fn get_pods(&self, all: bool) -> Result<Vec<RunningPod>, RuntimeError> {
            assert!(all, "the relister must list exited containers too");
            if *self.fail_list.lock().unwrap() {
                return Err(RuntimeError::Other("list failed".to_owned()));
            }
            Ok(self.pods.lock().unwrap().clone())
        }

        async fn get_pod_status(
            &self,
            uid: &PodUid,
            name: &str,
            namespace: &str,
        ) -> Result<PodStatus, RuntimeError> {
            self.status_calls.lock().unwrap().push(uid.clone());
            if self.fail_status.lock().unwrap().contains(uid) {
                return Err(RuntimeError::Other("status failed".to_owned()));
            }
            let pods = self.pods.lock().unwrap();
            let pod = pods.iter().find(|p| &p.uid == uid);
            Ok(PodStatus {
                uid: uid.clone(),
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                ips: vec![format!("10.0.0.{}", pod.map_or(0, |p| p.containers.len()))],
                ..PodStatus::default()
            })
        }

        async fn sync_pod(&self, _pod: &Pod, _status: &PodStatus) -> PodSyncResult {
            PodSyncResult::default()
        }

        async fn kill_pod(
            &self,
            _pod: Option<&Pod>,
            _running: &RunningPod,
            _grace_period_override: Option<i64>,
        ) -> Result<(), RuntimeError> {
            Ok(())
        }

        async fn garbage_collect(
            &self,
            _max_per_pod_container: usize,
            _active_pods: &HashSet<PodUid>,
        ) -> Result<(), RuntimeError> {
            Ok(())
        }
    }

    fn pod(uid: &str, sandbox: SandboxState, containers: &[(&str, ContainerState)]) -> RunningPod {
        RunningPod {
            uid: PodUid::from(uid),
            name: format!("{uid}-name"),
            namespace: "default".to_owned(),
            sandboxes: vec![RunningSandbox {
                id: SandboxId::new(format!("sb-{uid}")),
                state: sandbox,
                created_at: 1,
            }],
            containers: containers
                .iter()
                .map(|(id, state)| RunningContainer {
                    id: ContainerId::from(*id),
                    name: format!("name-{id}"),
                    state: *state,
                    hash: String::new(),
                    created_at: 2,
                })
                .collect(),
        }
    }

    fn event(uid: &str, kind: PodLifecycleEventKind, id: &str) -> PodLifecycleEvent {
        PodLifecycleEvent {
            pod: PodUid::from(uid),
            kind,
            container: Some(ContainerId::from(id)),
        }
    }

    fn drain(rx: &mut mpsc::Receiver<PodLifecycleEvent>) -> Vec<PodLifecycleEvent> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(e);
        }
        out
    }

    fn setup() -> (
        Arc<FakeRuntime>,
        Arc<PodCache>,
        GenericPleg,
        PlegHandle,
        mpsc::Receiver<PodLifecycleEvent>,
    ) {
        let runtime = Arc::new(FakeRuntime::default());
        let cache = Arc::new(PodCache::new());
        let (pleg, handle, rx) = GenericPleg::new(
            Arc::clone(&runtime) as Arc<dyn Runtime>,
            Arc::clone(&cache),
            Duration::from_secs(1),
        );
        (runtime, cache, pleg, handle, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn start_exit_and_remove_produce_events() {
        let (runtime, _cache, mut pleg, _handle, mut rx) = setup();
        pleg.relist().await;
        assert!(drain(&mut rx).is_empty());

        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Running)],
        )]);
        pleg.relist().await;
        assert_eq!(
            drain(&mut rx),
            vec![
                event("p", ContainerStarted, "c1"),
                event("p", ContainerStarted, "sb-p")
            ]
        );

        pleg.relist().await;
        assert!(drain(&mut rx).is_empty(), "nothing changed");

        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Exited)],
        )]);
        pleg.relist().await;
        assert_eq!(drain(&mut rx), vec![event("p", ContainerDied, "c1")]);

        runtime.set_pods(vec![pod("p", SandboxState::Ready, &[])]);
        pleg.relist().await;
        assert_eq!(drain(&mut rx), vec![event("p", ContainerRemoved, "c1")]);

        runtime.set_pods(vec![]);
        pleg.relist().await;
        assert_eq!(
            drain(&mut rx),
            vec![
                event("p", ContainerDied, "sb-p"),
                event("p", ContainerRemoved, "sb-p")
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn short_lived_and_created_containers() {
        let (runtime, _cache, mut pleg, _handle, mut rx) = setup();
        pleg.relist().await;
        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[
                ("quick", ContainerState::Exited),
                ("new", ContainerState::Created),
            ],
        )]);
        pleg.relist().await;
        assert_eq!(
            drain(&mut rx),
            vec![
                event("p", ContainerStarted, "quick"),
                event("p", ContainerDied, "quick"),
                event("p", ContainerStarted, "sb-p"),
            ],
            "a created container is a ContainerChanged, which is never sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sandbox_transitions_count_as_containers() {
        let (runtime, _cache, mut pleg, _handle, mut rx) = setup();
        runtime.set_pods(vec![pod("p", SandboxState::Ready, &[])]);
        pleg.relist().await;
        assert_eq!(drain(&mut rx), vec![event("p", ContainerStarted, "sb-p")]);
        runtime.set_pods(vec![pod("p", SandboxState::NotReady, &[])]);
        pleg.relist().await;
        assert_eq!(drain(&mut rx), vec![event("p", ContainerDied, "sb-p")]);
        runtime.set_pods(vec![]);
        pleg.relist().await;
        assert_eq!(drain(&mut rx), vec![event("p", ContainerRemoved, "sb-p")]);
    }

    #[tokio::test(start_paused = true)]
    async fn cache_is_filled_and_timestamped() {
        let (runtime, cache, mut pleg, _handle, _rx) = setup();
        runtime.set_pods(vec![
            pod("a", SandboxState::Ready, &[("c1", ContainerState::Running)]),
            pod("b", SandboxState::NotReady, &[]),
        ]);
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        pleg.relist().await;
        let mut calls = runtime.take_status_calls();
        calls.sort();
        assert_eq!(calls, vec![PodUid::from("a"), PodUid::from("b")]);
        let a = cache.get(&PodUid::from("a")).unwrap();
        assert_eq!(a.name, "a-name");
        assert_eq!(a.ips, vec!["10.0.0.1".to_owned()]);
        let fresh = tokio::time::timeout(
            Duration::from_millis(1),
            cache.get_newer_than(&PodUid::from("unknown"), Some(before)),
        )
        .await;
        assert!(fresh.is_ok(), "update_time must mark the cache fresh");

        // Unchanged pods are not inspected again; a changed one is.
        pleg.relist().await;
        assert!(runtime.take_status_calls().is_empty());
        runtime.set_pods(vec![
            pod(
                "a",
                SandboxState::Ready,
                &[
                    ("c1", ContainerState::Running),
                    ("c2", ContainerState::Running),
                ],
            ),
            pod("b", SandboxState::NotReady, &[]),
        ]);
        pleg.relist().await;
        assert_eq!(runtime.take_status_calls(), vec![PodUid::from("a")]);
        assert_eq!(
            cache.get(&PodUid::from("a")).unwrap().ips,
            vec!["10.0.0.2".to_owned()]
        );

        runtime.set_pods(vec![pod("b", SandboxState::NotReady, &[])]);
        pleg.relist().await;
        assert!(
            cache.get(&PodUid::from("a")).is_none(),
            "a vanished pod leaves the cache"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_status_is_reinspected_next_relist() {
        let (runtime, cache, mut pleg, _handle, mut rx) = setup();
        pleg.relist().await;
        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Running)],
        )]);
        runtime
            .fail_status
            .lock()
            .unwrap()
            .insert(PodUid::from("p"));
        pleg.relist().await;
        assert!(
            drain(&mut rx).is_empty(),
            "events of an uninspected pod are held back"
        );
        assert!(cache.get(&PodUid::from("p")).is_none());
        assert_eq!(runtime.take_status_calls(), vec![PodUid::from("p")]);

        runtime.fail_status.lock().unwrap().clear();
        pleg.relist().await;
        assert_eq!(runtime.take_status_calls(), vec![PodUid::from("p")]);
        assert_eq!(
            drain(&mut rx),
            vec![
                event("p", ContainerStarted, "c1"),
                event("p", ContainerStarted, "sb-p")
            ],
            "the record was not advanced, so the events are found again"
        );
        assert!(cache.get(&PodUid::from("p")).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn reinspects_a_failed_pod_even_without_new_events() {
        let (runtime, cache, mut pleg, _handle, mut rx) = setup();
        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Running)],
        )]);
        pleg.relist().await;
        drain(&mut rx);
        runtime.take_status_calls();

        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Exited)],
        )]);
        runtime
            .fail_status
            .lock()
            .unwrap()
            .insert(PodUid::from("p"));
        pleg.relist().await;
        // The container comes back to the state of the last good record: no events, still re-read.
        runtime.set_pods(vec![pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Running)],
        )]);
        runtime.fail_status.lock().unwrap().clear();
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        pleg.relist().await;
        assert_eq!(
            runtime.take_status_calls(),
            vec![PodUid::from("p"), PodUid::from("p")]
        );
        assert!(drain(&mut rx).is_empty());
        assert!(cache.get(&PodUid::from("p")).is_some());
        let fresh = tokio::time::timeout(
            Duration::from_millis(1),
            cache.get_newer_than(&PodUid::from("p"), Some(before)),
        )
        .await;
        assert!(fresh.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn health_follows_successful_relists() {
        let (runtime, _cache, mut pleg, handle, _rx) = setup();
        assert_eq!(
            handle.healthy(),
            Err("pleg has yet to be successful".to_owned())
        );
        pleg.relist().await;
        assert!(handle.healthy().is_ok());
        let first = handle.last_relist().unwrap();

        *runtime.fail_list.lock().unwrap() = true;
        tokio::time::advance(Duration::from_mins(3)).await;
        pleg.relist().await;
        assert!(
            handle.healthy().is_ok(),
            "exactly at the threshold is still healthy"
        );
        assert_eq!(
            handle.last_relist(),
            Some(first),
            "a failed relist is not recorded"
        );

        tokio::time::advance(Duration::from_secs(5)).await;
        pleg.relist().await;
        assert_eq!(
            handle.healthy(),
            Err("pleg was last seen active 3m5s ago; threshold is 3m0s".to_owned())
        );

        *runtime.fail_list.lock().unwrap() = false;
        pleg.relist().await;
        assert!(handle.healthy().is_ok());
        assert!(handle.last_relist().unwrap() > first);
    }

    #[tokio::test(start_paused = true)]
    async fn full_channel_discards_and_counts() {
        let (runtime, _cache, mut pleg, handle, mut rx) = setup();
        pleg.relist().await;
        let ids: Vec<String> = (0..EVENT_CHANNEL_CAPACITY + 4)
            .map(|i| format!("c{i:04}"))
            .collect();
        let containers: Vec<(&str, ContainerState)> = ids
            .iter()
            .map(|id| (id.as_str(), ContainerState::Running))
            .collect();
        runtime.set_pods(vec![pod("p", SandboxState::Ready, &containers)]);
        pleg.relist().await;
        // Containers plus the sandbox: 1005 events into a channel of 1000.
        assert_eq!(handle.discarded_events(), 5);
        assert_eq!(drain(&mut rx).len(), EVENT_CHANNEL_CAPACITY);
    }

    #[tokio::test(start_paused = true)]
    async fn run_relists_every_period_and_stops_without_receiver() {
        let (runtime, _cache, pleg, handle, mut rx) = setup();
        let task = tokio::spawn(pleg.run());
        tokio::time::advance(Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        let first = handle.last_relist().unwrap();

        runtime.set_pods(vec![pod("p", SandboxState::Ready, &[])]);
        let got = rx.recv().await.unwrap();
        assert_eq!(got, event("p", ContainerStarted, "sb-p"));
        assert!(handle.last_relist().unwrap() - first >= Duration::from_secs(1));

        drop(rx);
        tokio::time::advance(Duration::from_secs(2)).await;
        task.await.unwrap();
    }
}
