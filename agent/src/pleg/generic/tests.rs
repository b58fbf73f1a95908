// Counts and gauges are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::container::{
    ContainerStatus, PodStatus, PodSyncResult, RunningContainer, RunningSandbox, RuntimeError,
    RuntimeStatus, SandboxId, SandboxStatus,
};
use crate::event_stream::{EventBroadcaster, LifecycleKind};
use crate::pleg::{HintKind, PodHint};
use PodLifecycleEventKind::{ContainerDied, ContainerRemoved, ContainerStarted};

#[derive(Default)]
struct FakeRuntime {
    pods: Mutex<Vec<RunningPod>>,
    fail_list: Mutex<bool>,
    fail_status: Mutex<HashSet<PodUid>>,
    /// Pods whose next `get_pod_status` panics (a bug somewhere below the PLEG).
    panic_status: Mutex<HashSet<PodUid>>,
    status_calls: Mutex<Vec<PodUid>>,
    /// Pods read by uid alone (`get_pod_status_by_uid`), in order.
    uid_status_calls: Mutex<Vec<PodUid>>,
    list_calls: Mutex<usize>,
    /// Listings `get_pod_status` reports for a pod before falling back to `pods` (a runtime that
    /// has not caught up yet).
    stale_status: Mutex<HashMap<PodUid, VecDeque<RunningPod>>>,
    /// Init pids `container_init_pid` reports, and how often it was asked.
    init_pids: Mutex<HashMap<ContainerId, u32>>,
    init_pid_calls: Mutex<Vec<ContainerId>>,
    /// Init pids `sandbox_init_pid` reports, and how often it was asked.
    sandbox_init_pids: Mutex<HashMap<SandboxId, u32>>,
    sandbox_init_pid_calls: Mutex<Vec<SandboxId>>,
    /// Exit codes of exited containers (0 when not set).
    exit_codes: Mutex<HashMap<ContainerId, i32>>,
    /// Listings and pod reads wait for a read lock on this: a test that holds the write lock has
    /// them hang, as on a runtime slow to answer (the call is counted first).
    answering: tokio::sync::RwLock<()>,
}

impl FakeRuntime {
    fn set_pods(&self, pods: Vec<RunningPod>) {
        *self.pods.lock().unwrap() = pods;
    }

    fn take_status_calls(&self) -> Vec<PodUid> {
        std::mem::take(&mut *self.status_calls.lock().unwrap())
    }

    fn take_list_calls(&self) -> usize {
        std::mem::take(&mut *self.list_calls.lock().unwrap())
    }

    fn take_uid_status_calls(&self) -> Vec<PodUid> {
        std::mem::take(&mut *self.uid_status_calls.lock().unwrap())
    }

    /// What a read of the pod finds: a stale listing first if one is queued, else `pods`.
    fn read(&self, uid: &PodUid) -> Option<RunningPod> {
        let stale = self
            .stale_status
            .lock()
            .unwrap()
            .get_mut(uid)
            .and_then(VecDeque::pop_front);
        stale.or_else(|| {
            let pods = self.pods.lock().unwrap();
            pods.iter().find(|p| &p.uid == uid).cloned()
        })
    }

    fn status_of(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
        pod: Option<&RunningPod>,
    ) -> PodStatus {
        let exit_codes = self.exit_codes.lock().unwrap();
        PodStatus {
            uid: uid.clone(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            ips: vec![format!("10.0.0.{}", pod.map_or(0, |p| p.containers.len()))],
            sandboxes: pod
                .iter()
                .flat_map(|p| &p.sandboxes)
                .map(|s| SandboxStatus {
                    id: s.id.clone(),
                    state: s.state,
                    created_at: s.created_at,
                    attempt: 0,
                    ip: None,
                    host_network: false,
                })
                .collect(),
            containers: pod
                .iter()
                .flat_map(|p| &p.containers)
                .map(|c| ContainerStatus {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    state: c.state,
                    created_at: c.created_at,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: exit_codes.get(&c.id).copied().unwrap_or_default(),
                    image: String::new(),
                    image_ref: String::new(),
                    hash: c.hash.clone(),
                    restart_count: 0,
                    reason: String::new(),
                    message: String::new(),
                })
                .collect(),
        }
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn version(&self) -> Result<String, RuntimeError> {
        Ok("fake://0".to_owned())
    }

    async fn list_images(&self) -> Result<Vec<crate::container::ImageInfo>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
        Ok(RuntimeStatus::default())
    }

    async fn get_pods(&self, all: bool) -> Result<Vec<RunningPod>, RuntimeError> {
        assert!(all, "the relister must list exited containers too");
        *self.list_calls.lock().unwrap() += 1;
        let _answering = self.answering.read().await;
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
        let _answering = self.answering.read().await;
        if self.fail_status.lock().unwrap().contains(uid) {
            return Err(RuntimeError::Other("status failed".to_owned()));
        }
        // The guard is gone before the panic, so the fake's mutexes are not poisoned.
        let panics = self.panic_status.lock().unwrap().remove(uid);
        assert!(!panics, "injected panic reading {uid}");
        let pod = self.read(uid);
        Ok(self.status_of(uid, name, namespace, pod.as_ref()))
    }

    async fn get_pod_status_by_uid(&self, uid: &PodUid) -> Result<Option<PodStatus>, RuntimeError> {
        self.uid_status_calls.lock().unwrap().push(uid.clone());
        if self.fail_status.lock().unwrap().contains(uid) {
            return Err(RuntimeError::Other("status failed".to_owned()));
        }
        // Like the CRI's label selector: the pod's objects carry its name and namespace.
        let Some(pod) = self
            .read(uid)
            .filter(|p| !p.sandboxes.is_empty() || !p.containers.is_empty())
        else {
            return Ok(None);
        };
        Ok(Some(self.status_of(
            uid,
            &pod.name,
            &pod.namespace,
            Some(&pod),
        )))
    }

    async fn container_init_pid(&self, id: &ContainerId) -> Result<Option<u32>, RuntimeError> {
        self.init_pid_calls.lock().unwrap().push(id.clone());
        Ok(self.init_pids.lock().unwrap().get(id).copied())
    }

    async fn sandbox_init_pid(&self, id: &SandboxId) -> Result<Option<u32>, RuntimeError> {
        self.sandbox_init_pid_calls.lock().unwrap().push(id.clone());
        Ok(self.sandbox_init_pids.lock().unwrap().get(id).copied())
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
    let metrics = Metrics::new().unwrap();
    let (pleg, handle, rx) = GenericPleg::new(
        Arc::clone(&runtime) as Arc<dyn Runtime>,
        Arc::clone(&cache),
        PlegOptions {
            relist_period: None,
            hints: None,
            hint_source_check: None,
            latency: LatencyTracker::new(metrics.clone(), EventBroadcaster::default()),
            metrics,
            broadcaster: EventBroadcaster::default(),
        },
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

/// Reads one sample (`name{labels}` exactly as rendered) from the metrics text.
fn metric(metrics: &Metrics, sample: &str) -> f64 {
    let text = metrics.render().unwrap();
    text.lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == sample).then(|| value.parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
}

struct EbpfPleg {
    runtime: Arc<FakeRuntime>,
    cache: Arc<PodCache>,
    handle: PlegHandle,
    events: mpsc::Receiver<PodLifecycleEvent>,
    hints: mpsc::Sender<Hint>,
    refresh: crate::pleg::RefreshRequester,
    metrics: Metrics,
    latency: LatencyTracker,
    broadcaster: EventBroadcaster,
}

/// An ebpf-mode PLEG over `pods`, running, past its first full relist, with the call counters and
/// events of that relist cleared.
async fn start_ebpf(pods: Vec<RunningPod>) -> EbpfPleg {
    start_ebpf_with_period(pods, None).await
}

async fn start_ebpf_with_period(pods: Vec<RunningPod>, period: Option<Duration>) -> EbpfPleg {
    start_ebpf_with(FakeRuntime::default(), pods, period).await
}

async fn start_ebpf_with(
    runtime: FakeRuntime,
    pods: Vec<RunningPod>,
    period: Option<Duration>,
) -> EbpfPleg {
    let runtime = Arc::new(runtime);
    runtime.set_pods(pods);
    let cache = Arc::new(PodCache::new());
    let metrics = Metrics::new().unwrap();
    let broadcaster = EventBroadcaster::default();
    let latency = LatencyTracker::new(metrics.clone(), broadcaster.clone());
    let (hints, hint_rx) = mpsc::channel(1024);
    let hint_rx = PlegHints::new(hint_rx);
    let refresh = hint_rx.refreshes.requester();
    let (pleg, handle, mut events) = GenericPleg::new(
        Arc::clone(&runtime) as Arc<dyn Runtime>,
        Arc::clone(&cache),
        PlegOptions {
            relist_period: period,
            hints: Some(hint_rx),
            hint_source_check: None,
            metrics: metrics.clone(),
            latency: latency.clone(),
            broadcaster: broadcaster.clone(),
        },
    );
    tokio::spawn(pleg.run());
    settle().await;
    assert_eq!(
        runtime.take_list_calls(),
        1,
        "the first full relist runs at once"
    );
    runtime.take_status_calls();
    drain(&mut events);
    EbpfPleg {
        runtime,
        cache,
        handle,
        events,
        hints,
        refresh,
        metrics,
        latency,
        broadcaster,
    }
}

/// Lets the PLEG task run until it waits (the fake runtime never blocks).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn died(pod: &str, container: &str) -> Hint {
    Hint::Pod(PodHint {
        pod: PodUid::from(pod),
        kind: HintKind::Died,
        container: Some(ContainerId::from(container)),
        tgid: Some(1000),
        exit_code: Some(1),
        signal: None,
        kernel_time_ns: crate::pleg::monotonic_now_ns().saturating_sub(1_000_000),
    })
}

fn running_p() -> Vec<RunningPod> {
    vec![pod(
        "p",
        SandboxState::Ready,
        &[("c1", ContainerState::Running)],
    )]
}

fn exited_p() -> Vec<RunningPod> {
    vec![pod(
        "p",
        SandboxState::Ready,
        &[("c1", ContainerState::Exited)],
    )]
}

#[tokio::test(start_paused = true)]
async fn ebpf_mode_is_reported_and_relists_at_the_safety_period() {
    let mut t = start_ebpf(running_p()).await;
    assert_eq!(t.handle.mode(), PlegMode::Ebpf);
    assert!(t.handle.healthy().is_ok());
    assert_eq!(metric(&t.metrics, "ringlet_pleg_mode{mode=\"ebpf\"}"), 1.0);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_mode{mode=\"relist\"}"),
        0.0
    );
    assert_eq!(metric(&t.metrics, "kubelet_running_pods"), 1.0);
    assert_eq!(
        metric(
            &t.metrics,
            "kubelet_running_containers{container_state=\"running\"}"
        ),
        1.0
    );

    tokio::time::advance(Duration::from_secs(59)).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0);
    t.runtime.set_pods(exited_p());
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1, "the safety relist");
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_relists_total{type=\"full\"}"),
        2.0
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_event_latency_seconds_count"),
        0.0,
        "no hint led to this event"
    );
    assert_eq!(
        metric(&t.metrics, "kubelet_pleg_relist_interval_seconds_count"),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn died_hint_relists_only_that_pod() {
    let mut t = start_ebpf(vec![
        pod("p", SandboxState::Ready, &[("c1", ContainerState::Running)]),
        pod("q", SandboxState::Ready, &[("c9", ContainerState::Running)]),
    ])
    .await;
    let first = t.handle.last_relist().unwrap();
    tokio::time::advance(Duration::from_millis(3)).await;
    t.runtime.set_pods(vec![
        pod("p", SandboxState::Ready, &[("c1", ContainerState::Exited)]),
        pod("q", SandboxState::Ready, &[("c9", ContainerState::Exited)]),
    ]);
    t.hints.send(died("p", "c1")).await.unwrap();
    settle().await;

    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("p")]);
    assert_eq!(t.runtime.take_list_calls(), 0, "no full relist");
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerDied, "c1")],
        "q changed too, but nothing said so: the safety relist will find it"
    );
    let cached = t.cache.get(&PodUid::from("p")).unwrap();
    assert_eq!(cached.containers[0].state, ContainerState::Exited);
    assert!(
        t.handle.last_relist().unwrap() > first,
        "a targeted relist is activity"
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_relists_total{type=\"targeted\"}"),
        1.0
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_hints_total{kind=\"died\"}"),
        1.0
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_event_latency_seconds_count"),
        1.0
    );
    assert!(
        metric(&t.metrics, "ringlet_pleg_event_latency_seconds_sum") >= 0.001,
        "the hint was stamped 1 ms ago"
    );
    assert!(t.latency.is_pending(&PodUid::from("p")));
    assert!(!t.latency.is_pending(&PodUid::from("q")));
}

#[tokio::test(start_paused = true)]
async fn a_refresh_reads_the_pod_again_without_a_full_relist() {
    let mut t = start_ebpf(running_p()).await;
    let before = t.cache.get(&PodUid::from("p")).unwrap();
    tokio::time::advance(Duration::from_millis(3)).await;
    t.runtime.set_pods(exited_p());
    assert!(t.refresh.request(&PodUid::from("p")));
    settle().await;
    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("p")]);
    assert_eq!(t.runtime.take_list_calls(), 0, "no full relist");
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_ne!(t.cache.get(&PodUid::from("p")).unwrap(), before);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_hints_total{kind=\"refresh\"}"),
        1.0
    );
}

/// Issue 14 §1.6: a refresh used to be `try_send` on the kernel hints' channel and was lost when a
/// burst of kernel events had filled it, parking the pod's worker until the safety relist.
#[tokio::test(start_paused = true)]
async fn a_refresh_gets_through_a_hint_channel_full_of_kernel_hints() {
    let mut t = start_ebpf(vec![
        pod("p", SandboxState::Ready, &[("c1", ContainerState::Running)]),
        pod("q", SandboxState::Ready, &[("c9", ContainerState::Running)]),
    ])
    .await;
    // The PLEG cannot run before this test yields: the burst fills the channel to the last slot.
    let mut flood = 0;
    while t
        .hints
        .try_send(pod_hint("q", HintKind::Started, "c9"))
        .is_ok()
    {
        flood += 1;
    }
    assert_eq!(flood, t.hints.max_capacity());
    t.runtime.set_pods(vec![
        pod("p", SandboxState::Ready, &[("c1", ContainerState::Exited)]),
        pod("q", SandboxState::Ready, &[("c9", ContainerState::Running)]),
    ]);
    assert!(t.refresh.request(&PodUid::from("p")));
    settle().await;
    let read: HashSet<PodUid> = t.runtime.take_status_calls().into_iter().collect();
    assert_eq!(read, HashSet::from([PodUid::from("p"), PodUid::from("q")]));
    assert_eq!(t.runtime.take_list_calls(), 0, "no safety relist needed");
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
}

#[tokio::test(start_paused = true)]
async fn refreshes_for_one_pod_coalesce_into_one_read() {
    let mut t = start_ebpf(running_p()).await;
    for _ in 0..3 {
        assert!(t.refresh.request(&PodUid::from("p")));
    }
    settle().await;
    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("p")]);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_hints_total{kind=\"refresh\"}"),
        1.0
    );
    // Asked again once the read is done: a new read, not lost to the one before.
    t.runtime.set_pods(exited_p());
    assert!(t.refresh.request(&PodUid::from("p")));
    settle().await;
    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("p")]);
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
}

#[tokio::test(start_paused = true)]
async fn events_reach_watchers_with_names_exit_code_and_latency() {
    let mut t = start_ebpf(running_p()).await;
    let mut watcher = t.broadcaster.subscribe();
    t.runtime.set_pods(exited_p());
    t.hints.send(died("p", "c1")).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    let record = watcher.try_recv().unwrap();
    assert_eq!(record.kind, LifecycleKind::Died);
    assert_eq!(record.pod_name, "p-name");
    assert_eq!(record.namespace, "default");
    assert_eq!(record.container_name, "name-c1");
    assert_eq!(record.container_id, Some(ContainerId::from("c1")));
    assert_eq!(record.exit_code, Some(0));
    assert!(record.kernel_to_event.unwrap() >= Duration::from_millis(1));
    assert!(watcher.try_recv().is_err(), "one event, one record");
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_hints_for_one_pod_coalesces() {
    let mut t = start_ebpf(running_p()).await;
    t.runtime.set_pods(exited_p());
    for _ in 0..50 {
        t.hints.send(died("p", "c1")).await.unwrap();
    }
    settle().await;
    let calls = t.runtime.take_status_calls();
    assert!(
        !calls.is_empty() && calls.len() <= 2,
        "50 hints, {} reads",
        calls.len()
    );
    assert_eq!(t.runtime.take_list_calls(), 0);
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_hints_total{kind=\"died\"}"),
        50.0
    );
}

#[tokio::test(start_paused = true)]
async fn runtime_lag_is_retried_with_back_off() {
    let mut t = start_ebpf(running_p()).await;
    t.runtime.set_pods(exited_p());
    t.runtime.stale_status.lock().unwrap().insert(
        PodUid::from("p"),
        VecDeque::from([running_p()[0].clone(), running_p()[0].clone()]),
    );
    t.hints.send(died("p", "c1")).await.unwrap();
    settle().await;
    assert_eq!(t.runtime.take_status_calls().len(), 1);
    assert!(
        drain(&mut t.events).is_empty(),
        "the runtime still says running"
    );

    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_status_calls().len(), 1, "retry after 1 ms");
    assert!(drain(&mut t.events).is_empty());
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_pods_awaiting_runtime"),
        1.0
    );

    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(
        t.runtime.take_status_calls().is_empty(),
        "the second wait is 2 ms"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_status_calls().len(), 1);
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_runtime_lag_seconds_count"),
        1.0
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_pods_awaiting_runtime"),
        0.0
    );
    assert!((metric(&t.metrics, "ringlet_pleg_runtime_lag_seconds_sum") - 0.003).abs() < 1e-9);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_event_latency_seconds_count"),
        1.0
    );
    assert_eq!(t.runtime.take_list_calls(), 0);

    // Nothing more is pending.
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert!(t.runtime.take_status_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_never_catches_up_gets_a_full_relist() {
    let mut t = start_ebpf(running_p()).await;
    t.hints.send(died("p", "c1")).await.unwrap();
    for _ in 0..8 {
        settle().await;
        tokio::time::advance(Duration::from_millis(600)).await;
    }
    settle().await;
    assert_eq!(
        t.runtime.take_status_calls().len(),
        6,
        "the first read and retries (600 ms apart here) until the runtime lagged 3 s"
    );
    assert_eq!(
        t.runtime.take_list_calls(),
        1,
        "giving up relists everything at once, not after the 60 s safety period"
    );
    assert!(drain(&mut t.events).is_empty());
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_runtime_lag_seconds_count"),
        0.0
    );
}

fn created(pod: &str, container: &str) -> Hint {
    pod_hint(pod, HintKind::CgroupCreated, container)
}

#[tokio::test(start_paused = true)]
async fn a_hint_for_a_pod_not_listed_yet_reads_that_pod_by_uid() {
    let mut t = start_ebpf(running_p()).await;
    let mut pods = running_p();
    pods.push(pod("new", SandboxState::Ready, &[]));
    t.runtime.set_pods(pods);
    t.hints.send(created("new", "sb-new")).await.unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0, "no full relist");
    assert_eq!(t.runtime.take_uid_status_calls(), vec![PodUid::from("new")]);
    assert!(t.runtime.take_status_calls().is_empty());
    assert_eq!(
        drain(&mut t.events),
        vec![event("new", ContainerStarted, "sb-new")]
    );
    let cached = t.cache.get(&PodUid::from("new")).unwrap();
    assert_eq!(
        (cached.name.as_str(), cached.namespace.as_str()),
        ("new-name", "default"),
        "named from the runtime's labels"
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_event_latency_seconds_count"),
        1.0,
        "the event came from the hint"
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_relists_total{type=\"targeted\"}"),
        1.0
    );

    // Now known, the pod is read by name like any other.
    t.hints.send(created("new", "c-new")).await.unwrap();
    settle().await;
    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("new")]);
    assert!(t.runtime.take_uid_status_calls().is_empty());
}

/// Issue 14 §1.4: pods created one after another used to cost one full listing each.
#[tokio::test(start_paused = true)]
async fn k_pods_not_listed_yet_cost_no_full_listing() {
    const K: u8 = 5;
    let mut t = start_ebpf(running_p()).await;
    let mut pods = running_p();
    for i in 0..K {
        let uid = format!("new{i}");
        pods.push(pod(&uid, SandboxState::Ready, &[]));
        t.runtime.set_pods(pods.clone());
        t.hints
            .send(created(&uid, &format!("sb-{uid}")))
            .await
            .unwrap();
        settle().await;
        assert_eq!(
            drain(&mut t.events),
            vec![event(&uid, ContainerStarted, &format!("sb-{uid}"))]
        );
    }
    assert_eq!(t.runtime.take_list_calls(), 0, "no full listing at all");
    assert_eq!(t.runtime.take_uid_status_calls().len(), usize::from(K));
    assert_eq!(metric(&t.metrics, "kubelet_running_pods"), f64::from(K + 1));
}

#[tokio::test(start_paused = true)]
async fn a_hint_for_a_pod_the_runtime_does_not_have_costs_one_read_and_no_event() {
    let mut t = start_ebpf(running_p()).await;
    t.hints.send(created("stranger", "c7")).await.unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0);
    assert_eq!(
        t.runtime.take_uid_status_calls(),
        vec![PodUid::from("stranger")]
    );
    assert!(drain(&mut t.events).is_empty());
    assert!(t.cache.get(&PodUid::from("stranger")).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_start_in_a_pod_the_runtime_has_not_recorded_yet_is_retried() {
    let mut t = start_ebpf(running_p()).await;
    let mut pods = running_p();
    pods.push(pod(
        "new",
        SandboxState::Ready,
        &[("c5", ContainerState::Running)],
    ));
    t.runtime.set_pods(pods);
    // The first read finds nothing of the pod yet.
    t.runtime
        .stale_status
        .lock()
        .unwrap()
        .insert(PodUid::from("new"), VecDeque::from([RunningPod::default()]));
    t.hints
        .send(pod_hint("new", HintKind::Started, "c5"))
        .await
        .unwrap();
    settle().await;
    assert!(drain(&mut t.events).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_uid_status_calls().len(), 2, "read again");
    assert_eq!(t.runtime.take_list_calls(), 0);
    let events = drain(&mut t.events);
    assert!(
        events.contains(&event("new", ContainerStarted, "c5")),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_of_a_pod_not_listed_yet_waits_for_the_next_full_relist() {
    let mut t = start_ebpf(running_p()).await;
    let mut pods = running_p();
    pods.push(pod("new", SandboxState::Ready, &[]));
    t.runtime.set_pods(pods);
    t.runtime
        .fail_status
        .lock()
        .unwrap()
        .insert(PodUid::from("new"));
    t.hints.send(created("new", "sb-new")).await.unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0);
    assert!(drain(&mut t.events).is_empty());
    t.runtime.fail_status.lock().unwrap().clear();
    tokio::time::advance(crate::pleg::DEFAULT_SAFETY_RELIST_PERIOD).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1);
    assert_eq!(
        drain(&mut t.events),
        vec![event("new", ContainerStarted, "sb-new")]
    );
}

/// Issue 14 §1.7: a panic in the PLEG loop used to end its task without a trace: no more events, and
/// `/healthz` only noticed three minutes later.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_loop_is_reported_unhealthy_and_the_loop_restarts() {
    let mut t = start_ebpf(running_p()).await;
    t.runtime
        .panic_status
        .lock()
        .unwrap()
        .insert(PodUid::from("p"));
    t.hints.send(died("p", "c1")).await.unwrap();
    settle().await;
    let unhealthy = t.handle.healthy().unwrap_err();
    assert!(
        unhealthy.contains("pleg loop panicked") && unhealthy.contains("injected panic reading p"),
        "{unhealthy}"
    );
    assert_eq!(t.handle.panics(), 1);
    assert_eq!(metric(&t.metrics, "ringlet_pleg_panics_total"), 1.0);
    assert_eq!(
        t.runtime.take_list_calls(),
        0,
        "backing off before the restart"
    );

    t.runtime.set_pods(exited_p());
    tokio::time::advance(crate::supervise::RESTART_BACKOFF_INITIAL).await;
    settle().await;
    assert_eq!(
        t.runtime.take_list_calls(),
        1,
        "restarted from a full relist"
    );
    assert!(t.handle.healthy().is_ok(), "{:?}", t.handle.healthy());
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerDied, "c1")],
        "the change the panic interrupted, once"
    );

    // The restarted loop still takes requests.
    t.runtime.take_status_calls();
    assert!(t.refresh.request(&PodUid::from("p")));
    settle().await;
    assert_eq!(t.runtime.take_status_calls(), vec![PodUid::from("p")]);
}

#[tokio::test(start_paused = true)]
async fn resync_relists_everything_at_once() {
    let t = start_ebpf(running_p()).await;
    t.hints
        .send(Hint::Resync {
            reason: "ring buffer drops".to_owned(),
        })
        .await
        .unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_hints_total{kind=\"resync\"}"),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn status_change_without_transition_is_a_pod_sync() {
    let mut t = start_ebpf(running_p()).await;
    t.runtime.set_pods(vec![pod(
        "p",
        SandboxState::Ready,
        &[
            ("c1", ContainerState::Running),
            ("c2", ContainerState::Created),
        ],
    )]);
    t.hints
        .send(Hint::Pod(PodHint {
            pod: PodUid::from("p"),
            kind: HintKind::CgroupCreated,
            container: Some(ContainerId::from("c2")),
            tgid: None,
            exit_code: None,
            signal: None,
            kernel_time_ns: crate::pleg::monotonic_now_ns(),
        }))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        drain(&mut t.events),
        vec![PodLifecycleEvent {
            pod: PodUid::from("p"),
            kind: PodLifecycleEventKind::PodSync,
            container: None,
        }]
    );

    // The same status again: nothing to say.
    t.hints.send(died("p", "nothing")).await.unwrap();
    settle().await;
    assert!(drain(&mut t.events).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_closed_hint_source_falls_back_to_relist_mode() {
    let t = start_ebpf(running_p()).await;
    drop(t.hints);
    settle().await;
    assert_eq!(t.handle.mode(), PlegMode::Relist);
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_mode{mode=\"relist\"}"),
        1.0
    );
    assert_eq!(t.runtime.take_list_calls(), 1, "relists at once");
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1, "then every second");
}

#[tokio::test(start_paused = true)]
async fn relist_mode_observes_relist_metrics() {
    let (_runtime, _cache, mut pleg, handle, _rx) = setup();
    assert_eq!(handle.mode(), PlegMode::Relist);
    pleg.relist().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    pleg.relist().await;
    assert_eq!(
        metric(&pleg.metrics, "kubelet_pleg_relist_duration_seconds_count"),
        2.0
    );
    assert_eq!(
        metric(&pleg.metrics, "kubelet_pleg_relist_interval_seconds_count"),
        1.0
    );
    assert!(metric(&pleg.metrics, "kubelet_pleg_last_seen_seconds") > 1.0e9);
}

fn pod_hint(pod: &str, kind: HintKind, container: &str) -> Hint {
    Hint::Pod(PodHint {
        pod: PodUid::from(pod),
        kind,
        container: Some(ContainerId::from(container)),
        tgid: None,
        exit_code: None,
        signal: None,
        kernel_time_ns: crate::pleg::monotonic_now_ns(),
    })
}

#[tokio::test(start_paused = true)]
async fn a_start_the_runtime_has_not_recorded_yet_is_retried() {
    let mut t = start_ebpf(vec![pod("p", SandboxState::Ready, &[])]).await;
    t.runtime.set_pods(running_p());
    t.runtime.stale_status.lock().unwrap().insert(
        PodUid::from("p"),
        VecDeque::from([pod(
            "p",
            SandboxState::Ready,
            &[("c1", ContainerState::Created)],
        )]),
    );
    t.hints
        .send(pod_hint("p", HintKind::Started, "c1"))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        drain(&mut t.events),
        vec![PodLifecycleEvent {
            pod: PodUid::from("p"),
            kind: PodLifecycleEventKind::PodSync,
            container: None,
        }],
        "a created container changes the status but is no start"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_status_calls().len(), 2);
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerStarted, "c1")]
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_runtime_lag_seconds_count"),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn removed_cgroups_of_an_unknown_pod_cost_nothing() {
    let t = start_ebpf(running_p()).await;
    t.hints
        .send(pod_hint("gone", HintKind::CgroupRemoved, "c7"))
        .await
        .unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0);
    assert!(t.runtime.take_status_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_long_safety_period_keeps_an_idle_pleg_healthy() {
    let t = start_ebpf_with_period(running_p(), Some(Duration::from_mins(10))).await;
    tokio::time::advance(Duration::from_mins(9)).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 0);
    assert!(t.handle.healthy().is_ok());
    tokio::time::advance(Duration::from_mins(1)).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1);
}

/// The kernel's exit of process `tgid` in container `c1` of pod `p` by SIGKILL, 1 ms ago.
fn killed(tgid: u32) -> Hint {
    killed_in("c1", tgid)
}

/// SIGKILL of process `tgid` in container (or sandbox) `container` of pod `p`.
fn killed_in(container: &str, tgid: u32) -> Hint {
    Hint::Pod(PodHint {
        pod: PodUid::from("p"),
        kind: HintKind::Died,
        container: Some(ContainerId::from(container)),
        tgid: Some(tgid),
        exit_code: Some(0),
        signal: Some(9),
        kernel_time_ns: crate::pleg::monotonic_now_ns().saturating_sub(1_000_000),
    })
}

/// An ebpf PLEG over pod `p` whose container `c1` runs with init pid 42 as the runtime reports it.
async fn start_with_init_42() -> EbpfPleg {
    let runtime = FakeRuntime::default();
    runtime
        .init_pids
        .lock()
        .unwrap()
        .insert(ContainerId::from("c1"), 42);
    start_ebpf_with(runtime, running_p(), None).await
}

fn cached_c1(t: &EbpfPleg) -> ContainerStatus {
    t.cache.get(&PodUid::from("p")).unwrap().containers[0].clone()
}

#[tokio::test(start_paused = true)]
async fn a_running_container_adopted_has_its_init_read_once() {
    let t = start_with_init_42().await;
    assert_eq!(
        std::mem::take(&mut *t.runtime.init_pid_calls.lock().unwrap()),
        vec![ContainerId::from("c1")]
    );
    tokio::time::advance(crate::pleg::DEFAULT_SAFETY_RELIST_PERIOD).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1);
    assert!(
        t.runtime.init_pid_calls.lock().unwrap().is_empty(),
        "a known init is not read again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_proven_init_exit_is_published_before_the_runtime_reports_it() {
    let mut t = start_with_init_42().await;
    let mut watcher = t.broadcaster.subscribe();
    t.hints.send(killed(42)).await.unwrap();
    settle().await;

    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerDied, "c1")],
        "the runtime still reports it running"
    );
    let c1 = cached_c1(&t);
    assert_eq!(c1.state, ContainerState::Exited);
    assert_eq!(c1.exit_code, 137);
    assert_eq!(c1.reason, "Error");
    assert!(c1.finished_at > 0);
    assert_eq!(watcher.try_recv().unwrap().exit_code, Some(137));
    assert_eq!(metric(&t.metrics, "ringlet_pleg_kernel_exits_total"), 1.0);
    assert_eq!(
        t.runtime.take_status_calls(),
        vec![PodUid::from("p")],
        "the runtime is still read"
    );

    // The runtime keeps lagging for a while, then reports the exit: no second event.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_millis(20)).await;
        settle().await;
    }
    assert!(drain(&mut t.events).is_empty());
    assert_eq!(cached_c1(&t).state, ContainerState::Exited);
    t.runtime.set_pods(exited_p());
    t.runtime
        .exit_codes
        .lock()
        .unwrap()
        .insert(ContainerId::from("c1"), 137);
    tokio::time::advance(Duration::from_millis(200)).await;
    settle().await;
    assert_eq!(
        drain(&mut t.events),
        vec![PodLifecycleEvent {
            pod: PodUid::from("p"),
            kind: PodLifecycleEventKind::PodSync,
            container: None,
        }],
        "no second ContainerDied; the runtime's record (another finishedAt) is synced"
    );
    assert_eq!(
        cached_c1(&t).finished_at,
        0,
        "the runtime's record replaced the kernel's"
    );
    let confirmed = std::iter::from_fn(|| watcher.try_recv().ok())
        .find(|r| r.kind == LifecycleKind::RuntimeConfirmed)
        .expect("a RuntimeConfirmed record");
    assert_eq!(confirmed.exit_code, Some(137));
    assert_eq!(confirmed.container_name, "name-c1");
    assert!(
        confirmed.kernel_to_event.unwrap() >= Duration::from_millis(1),
        "the kernel stamped the exit 1 ms before the test sent it"
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_kernel_runtime_mismatch_total"),
        0.0
    );
    let reads = t.runtime.take_status_calls().len();
    tokio::time::advance(Duration::from_secs(5)).await;
    settle().await;
    assert!(
        t.runtime.take_status_calls().is_empty(),
        "settled after {reads} reads"
    );
    assert_eq!(t.runtime.take_list_calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_runtimes_confirmation_of_a_published_exit_is_awaited_from_16_ms() {
    let mut t = start_with_init_42().await;
    t.hints.send(killed(42)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(
        t.runtime.take_status_calls().len(),
        1,
        "the hint's own read"
    );

    let mut reads_at = Vec::new();
    for ms in 1..=120 {
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        if !t.runtime.take_status_calls().is_empty() {
            reads_at.push(ms);
        }
    }
    assert_eq!(
        reads_at,
        [16, 48, 112],
        "waits of 16, 32 and 64 ms: the pod shows the exit already"
    );
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_pods_awaiting_runtime"),
        1.0
    );
    assert_eq!(t.runtime.take_list_calls(), 0);
}

/// A proven exit that arrives while a relist waits for the runtime is published at once: the relist
/// (targeted here, started by another process's exit) does not hold the kernel's hints back.
#[tokio::test(start_paused = true)]
async fn a_proven_exit_is_published_while_a_targeted_relist_waits_for_the_runtime() {
    let mut t = start_with_init_42().await;
    let hanging = t.runtime.answering.write().await;
    t.hints.send(killed(4242)).await.unwrap();
    settle().await;
    assert_eq!(
        t.runtime.take_status_calls(),
        vec![PodUid::from("p")],
        "a targeted relist waits for the runtime"
    );
    t.hints.send(killed(42)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(cached_c1(&t).state, ContainerState::Exited);

    drop(hanging);
    settle().await;
    assert!(
        drain(&mut t.events).is_empty(),
        "the read that was waiting (the container still running) sends nothing more"
    );
    assert_eq!(cached_c1(&t).state, ContainerState::Exited);
}

/// The same while the safety relist's listing waits for the runtime.
#[tokio::test(start_paused = true)]
async fn a_proven_exit_is_published_while_a_full_relist_waits_for_the_runtime() {
    let mut t = start_with_init_42().await;
    let hanging = t.runtime.answering.write().await;
    tokio::time::advance(crate::pleg::DEFAULT_SAFETY_RELIST_PERIOD).await;
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1, "the full relist is listing");
    t.hints.send(killed(42)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);

    drop(hanging);
    settle().await;
    assert!(drain(&mut t.events).is_empty(), "no second ContainerDied");
    assert_eq!(cached_c1(&t).state, ContainerState::Exited);
}

#[tokio::test(start_paused = true)]
async fn the_exit_of_another_process_in_the_container_stays_a_hint() {
    let mut t = start_with_init_42().await;
    t.hints.send(killed(4242)).await.unwrap();
    settle().await;
    assert!(drain(&mut t.events).is_empty());
    assert_eq!(cached_c1(&t).state, ContainerState::Running);
    assert_eq!(metric(&t.metrics, "ringlet_pleg_kernel_exits_total"), 0.0);
    assert_eq!(t.runtime.take_status_calls().len(), 1);
    tokio::time::advance(crate::pleg::KERNEL_EXIT_GRACE * 2).await;
    settle().await;
    assert!(
        t.runtime.take_status_calls().is_empty(),
        "a running container whose init did not exit is no runtime lag: nothing to read again"
    );
    assert_eq!(t.runtime.take_list_calls(), 0, "nor to relist everything");
}

#[tokio::test(start_paused = true)]
async fn the_exit_of_a_process_before_a_sandboxs_init_is_no_runtime_lag() {
    let runtime = FakeRuntime::default();
    runtime
        .sandbox_init_pids
        .lock()
        .unwrap()
        .insert(SandboxId::new("sb-p".to_owned()), 50);
    let mut t = start_ebpf_with(runtime, running_p(), None).await;
    assert_eq!(
        *t.runtime.sandbox_init_pid_calls.lock().unwrap(),
        vec![SandboxId::new("sb-p".to_owned())],
        "a ready sandbox's init is read as a running container's is"
    );
    // runc's process, the first to exec in the sandbox's new cgroup, exits before the pause does.
    t.hints.send(killed_in("sb-p", 49)).await.unwrap();
    settle().await;
    assert!(drain(&mut t.events).is_empty());
    assert_eq!(t.runtime.take_status_calls().len(), 1);
    tokio::time::advance(crate::pleg::KERNEL_EXIT_GRACE * 2).await;
    settle().await;
    assert!(t.runtime.take_status_calls().is_empty());
    assert_eq!(t.runtime.take_list_calls(), 0);

    // The pause itself is the sandbox's death: the runtime's lag is waited for.
    t.hints.send(killed_in("sb-p", 50)).await.unwrap();
    settle().await;
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(
        t.runtime.take_status_calls().len(),
        2,
        "read, then read again while the runtime still shows the sandbox ready"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_containers_init_is_the_runtimes_pid_not_the_first_exec() {
    let runtime = FakeRuntime::default();
    runtime
        .init_pids
        .lock()
        .unwrap()
        .insert(ContainerId::from("c1"), 77);
    let mut t = start_ebpf_with(runtime, vec![pod("p", SandboxState::Ready, &[])], None).await;
    t.runtime.set_pods(running_p());
    // A short-lived process may exec in a new container's cgroup before its init does.
    let mut started = pod_hint("p", HintKind::Started, "c1");
    if let Hint::Pod(hint) = &mut started {
        hint.tgid = Some(99);
    }
    t.hints.send(started).await.unwrap();
    settle().await;
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerStarted, "c1")]
    );
    assert_eq!(
        *t.runtime.init_pid_calls.lock().unwrap(),
        vec![ContainerId::from("c1")],
        "the runtime is asked once the container runs"
    );
    t.hints.send(killed(99)).await.unwrap();
    settle().await;
    assert!(
        drain(&mut t.events).is_empty(),
        "the first exec's exit is not the container's"
    );
    t.hints.send(killed(77)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(cached_c1(&t).exit_code, 137);
}

#[tokio::test(start_paused = true)]
async fn an_oom_victims_exit_is_oom_killed() {
    let mut t = start_with_init_42().await;
    t.hints
        .send(pod_hint("p", HintKind::OomKilled, "c1"))
        .await
        .unwrap();
    t.hints.send(killed(42)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    assert_eq!(cached_c1(&t).reason, "OOMKilled");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_keeps_the_container_running_withdraws_the_kernels_exit() {
    let mut t = start_with_init_42().await;
    t.hints.send(killed(42)).await.unwrap();
    settle().await;
    assert_eq!(drain(&mut t.events), vec![event("p", ContainerDied, "c1")]);
    for _ in 0..40 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(
        metric(&t.metrics, "ringlet_pleg_kernel_runtime_mismatch_total"),
        1.0
    );
    assert_eq!(cached_c1(&t).state, ContainerState::Running);
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerStarted, "c1")],
        "the runtime's word stands again"
    );
    assert_eq!(
        t.runtime.take_list_calls(),
        1,
        "and everything is relisted, once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_relist_keeps_the_kernels_exit_until_the_runtime_reports_it() {
    let mut t = start_with_init_42().await;
    t.hints.send(killed(42)).await.unwrap();
    t.hints
        .send(Hint::Resync {
            reason: "test".to_owned(),
        })
        .await
        .unwrap();
    settle().await;
    assert_eq!(t.runtime.take_list_calls(), 1);
    assert_eq!(
        drain(&mut t.events),
        vec![event("p", ContainerDied, "c1")],
        "the relist does not undo the exit"
    );
    assert_eq!(cached_c1(&t).state, ContainerState::Exited);
}

#[tokio::test(start_paused = true)]
async fn every_full_relist_asks_the_hint_source_to_check_for_lost_events() {
    use rustix::event::{EventfdFlags, eventfd};
    let eventfd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
    // The eventfd's counter: the requests since the last read.
    let requests = || {
        let mut count = [0; 8];
        match rustix::io::read(&*eventfd, &mut count) {
            Ok(_) => u64::from_ne_bytes(count),
            Err(rustix::io::Errno::AGAIN) => 0,
            Err(error) => panic!("reading the eventfd: {error}"),
        }
    };
    let runtime = Arc::new(FakeRuntime::default());
    runtime.set_pods(running_p());
    let metrics = Metrics::new().unwrap();
    let (hints, hint_rx) = mpsc::channel(16);
    let (pleg, _handle, _events) = GenericPleg::new(
        Arc::clone(&runtime) as Arc<dyn Runtime>,
        Arc::new(PodCache::new()),
        PlegOptions {
            relist_period: Some(Duration::from_mins(1)),
            hints: Some(PlegHints::new(hint_rx)),
            hint_source_check: Some(crate::pleg::HintSourceCheck::new(Arc::clone(&eventfd))),
            latency: LatencyTracker::new(metrics.clone(), EventBroadcaster::default()),
            metrics,
            broadcaster: EventBroadcaster::default(),
        },
    );
    tokio::spawn(pleg.run());
    settle().await;
    assert_eq!(runtime.take_list_calls(), 1);
    assert_eq!(requests(), 1, "the first full relist asks");
    runtime.take_status_calls();
    hints
        .send(pod_hint("p", HintKind::Started, "c1"))
        .await
        .unwrap();
    settle().await;
    assert_eq!(runtime.take_status_calls(), vec![PodUid::from("p")]);
    assert_eq!(requests(), 0, "a targeted relist does not");
    tokio::time::advance(Duration::from_mins(1)).await;
    settle().await;
    assert_eq!(runtime.take_list_calls(), 1);
    assert_eq!(requests(), 1, "the safety relist asks");
}
