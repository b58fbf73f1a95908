//! The probe manager (the kubelet's `prober.manager`): starts a worker task per container and probe
//! type when a pod is added, stops them when the pod terminates or goes away, and answers status
//! generation's questions (has the container started, is it ready). The verdicts reach the sync
//! loop through [`ProbeManager::next_update`]; everyone else uses the cloneable [`ProbeHandle`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

use super::ProbeType;
use super::probe::Prober;
use super::results::{ProbeResult, ProbeResults, ResultUpdate, ResultUpdates};
use super::worker::{Next, Thresholds, WorkerState};
use crate::container::{CommandRunner, ContainerId, PodUid};
use crate::events::Recorder;
use crate::kuberuntime::changes::is_sidecar;
use crate::metrics::{Metrics, ProbeLabels, ProbeOutcomeLabel};
use crate::status::{ProbeView, StatusManager, wall_clock_now};

/// What the probe manager works with.
pub struct ProbeManagerDeps {
    /// Runs exec probes (CRI `ExecSync`).
    pub runner: Arc<dyn CommandRunner>,
    pub recorder: Recorder,
    /// Where workers read the pod's container IDs, states and pod IP.
    pub status: StatusManager,
    pub metrics: Metrics,
    pub results: ProbeResults,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    pod: PodUid,
    container: String,
    probe_type: ProbeType,
}

struct Entry {
    /// Tells this worker from a later one for the same key.
    serial: u64,
    stop: Arc<Notify>,
    trigger: Arc<Notify>,
}

struct Shared {
    workers: Mutex<HashMap<Key, Entry>>,
    prober: Prober,
    status: StatusManager,
    metrics: Metrics,
    results: ProbeResults,
    /// Workers started within a period of this spread their first probe over the period.
    started: Instant,
    serials: AtomicU64,
}

impl Shared {
    fn workers(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Owns the update channel; see the module docs.
pub struct ProbeManager {
    handle: ProbeHandle,
    updates: ResultUpdates,
}

impl ProbeManager {
    /// A manager whose workers write into `deps.results`; `updates` is that cache's channel.
    pub fn new(deps: ProbeManagerDeps, updates: ResultUpdates) -> Self {
        let ProbeManagerDeps {
            runner,
            recorder,
            status,
            metrics,
            results,
        } = deps;
        Self {
            handle: ProbeHandle {
                shared: Arc::new(Shared {
                    workers: Mutex::default(),
                    prober: Prober::new(runner, recorder),
                    status,
                    metrics,
                    results,
                    started: Instant::now(),
                    serials: AtomicU64::new(0),
                }),
            },
            updates,
        }
    }

    pub fn handle(&self) -> ProbeHandle {
        self.handle.clone()
    }

    /// The next changed verdict (`None` once every sender is gone).
    pub async fn next_update(&mut self) -> Option<ResultUpdate> {
        self.updates.recv().await
    }
}

/// Cloneable handle to the probe workers.
#[derive(Clone)]
pub struct ProbeHandle {
    shared: Arc<Shared>,
}

/// The containers whose probes run: app containers and restartable (sidecar) init containers.
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let apps = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| is_sidecar(c));
    apps.iter().chain(sidecars)
}

fn spec_of(container: &Container, probe_type: ProbeType) -> Option<&Probe> {
    match probe_type {
        ProbeType::Liveness => container.liveness_probe.as_ref(),
        ProbeType::Readiness => container.readiness_probe.as_ref(),
        ProbeType::Startup => container.startup_probe.as_ref(),
    }
}

impl ProbeHandle {
    /// Starts the workers of a pod's probes (the kubelet's `AddPod`); probes already running keep
    /// running.
    pub fn add_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
            return;
        };
        let pod = Arc::new(pod.clone());
        let mut workers = self.shared.workers();
        for container in probed_containers(&pod) {
            for probe_type in [
                ProbeType::Startup,
                ProbeType::Readiness,
                ProbeType::Liveness,
            ] {
                let Some(spec) = spec_of(container, probe_type) else {
                    continue;
                };
                let key = Key {
                    pod: PodUid::from(uid),
                    container: container.name.clone(),
                    probe_type,
                };
                if workers.contains_key(&key) {
                    continue;
                }
                let entry = Entry {
                    serial: self.shared.serials.fetch_add(1, Ordering::Relaxed),
                    stop: Arc::new(Notify::new()),
                    trigger: Arc::new(Notify::new()),
                };
                let worker = Worker {
                    shared: Arc::clone(&self.shared),
                    key: key.clone(),
                    serial: entry.serial,
                    pod: Arc::clone(&pod),
                    container: container.clone(),
                    spec: spec.clone(),
                    stop: Arc::clone(&entry.stop),
                    trigger: Arc::clone(&entry.trigger),
                };
                workers.insert(key, entry);
                tokio::spawn(worker.run());
            }
        }
    }

    /// Stops every worker of the pod (the kubelet's `RemovePod`).
    pub fn remove_pod(&self, uid: &PodUid) {
        self.stop_where(|key| &key.pod == uid);
    }

    /// Stops the pod's liveness and startup workers while it terminates; readiness keeps going
    /// until the containers are gone (the kubelet's `StopLivenessAndStartup`).
    pub fn stop_liveness_and_startup(&self, uid: &PodUid) {
        self.stop_where(|key| &key.pod == uid && key.probe_type != ProbeType::Readiness);
    }

    /// Stops the workers of pods not in `desired` (the kubelet's `CleanupPods`).
    pub fn cleanup_pods(&self, desired: &HashSet<PodUid>) {
        self.stop_where(|key| !desired.contains(&key.pod));
    }

    /// Stops the matching workers and forgets them at once, so an `add_pod` right after starts
    /// fresh workers (a pod added again with the same UID) instead of finding the stopping ones.
    fn stop_where(&self, stop: impl Fn(&Key) -> bool) {
        self.shared.workers().retain(|key, entry| {
            let stopping = stop(key);
            if stopping {
                entry.stop.notify_one();
            }
            !stopping
        });
    }

    fn has_worker(&self, pod: &PodUid, container: &str, probe_type: ProbeType) -> bool {
        self.shared.workers().contains_key(&Key {
            pod: pod.clone(),
            container: container.to_owned(),
            probe_type,
        })
    }
}

impl ProbeView for ProbeHandle {
    fn started(&self, pod: &PodUid, container: &str, id: &ContainerId) -> bool {
        match self.shared.results.get(ProbeType::Startup, id) {
            Some(result) => result == ProbeResult::Success,
            // A startup probe that has not run yet: not started.
            None => !self.has_worker(pod, container, ProbeType::Startup),
        }
    }

    fn ready(&self, pod: &PodUid, container: &str, id: &ContainerId) -> bool {
        if self.shared.results.get(ProbeType::Readiness, id) == Some(ProbeResult::Success) {
            return true;
        }
        let key = Key {
            pod: pod.clone(),
            container: container.to_owned(),
            probe_type: ProbeType::Readiness,
        };
        match self.shared.workers().get(&key) {
            Some(entry) => {
                // Not ready yet: probe now rather than at the next period.
                entry.trigger.notify_one();
                false
            }
            // No readiness probe: ready.
            None => true,
        }
    }
}

/// One probe of one container, run as its own task.
struct Worker {
    shared: Arc<Shared>,
    key: Key,
    serial: u64,
    pod: Arc<Pod>,
    container: Container,
    spec: Probe,
    stop: Arc<Notify>,
    trigger: Arc<Notify>,
}

impl Worker {
    async fn run(self) {
        let thresholds = Thresholds::of(&self.spec);
        let period = Duration::from_secs(thresholds.period_seconds);
        // A sidecar runs again whenever it exits, whatever the pod's restart policy.
        let never_restarts = !is_sidecar(&self.container)
            && self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                == Some("Never");
        let mut state = WorkerState::new(
            self.key.probe_type,
            self.key.pod.clone(),
            self.container.name.clone(),
            thresholds,
            self.pod.metadata.deletion_timestamp.is_some(),
            never_restarts,
            self.shared.results.clone(),
        );
        let labels = ProbeLabels {
            probe_type: self.key.probe_type.as_str(),
            container: self.container.name.clone(),
            pod: self.pod.metadata.name.clone().unwrap_or_default(),
            namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
            pod_uid: self.key.pod.to_string(),
        };
        let stopped = self.first_wait(period).await;
        if !stopped {
            let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            while self.probe_once(&mut state, &labels).await {
                tokio::select! {
                    () = self.stop.notified() => break,
                    _ = ticker.tick() => {}
                    () = self.trigger.notified() => {}
                }
            }
        }
        if let Some(id) = state.container_id() {
            self.shared.results.remove(self.key.probe_type, id);
        }
        let replaced = {
            let mut workers = self.shared.workers();
            let current = workers.get(&self.key).map(|e| e.serial);
            if current == Some(self.serial) {
                workers.remove(&self.key);
            }
            current.is_some_and(|serial| serial != self.serial)
        };
        // A worker that took this one's place reports under the same labels.
        if !replaced {
            self.shared.metrics.forget_probe(&labels);
        }
    }

    /// Right after the agent started, the first probe waits a random part of the period so a
    /// node's probes do not all fire at once (the kubelet's jitter). Returns whether the worker was
    /// stopped meanwhile.
    async fn first_wait(&self, period: Duration) -> bool {
        if self.shared.started.elapsed() >= period {
            return false;
        }
        let jitter = period.mul_f64(fastrand::f64());
        tokio::select! {
            () = self.stop.notified() => true,
            () = tokio::time::sleep(jitter) => false,
        }
    }

    /// One period's work; `false` ends the worker.
    async fn probe_once(&self, state: &mut WorkerState, labels: &ProbeLabels) -> bool {
        let began = Instant::now();
        let status = self.shared.status.get_pod_status(&self.key.pod);
        let (id, pod_ip) = match state.next(status.as_ref(), wall_clock_now()) {
            Next::Stop => return false,
            Next::Wait => return true,
            Next::Probe { id, pod_ip } => (id, pod_ip),
        };
        let probed = self
            .shared
            .prober
            .probe(
                self.key.probe_type,
                &self.pod,
                &self.container,
                &self.spec,
                &pod_ip,
                &id,
            )
            .await;
        // An errored probe leaves no trace in the verdict or the metrics (the kubelet's rule).
        let Ok(result) = probed else {
            return true;
        };
        let (outcome, timed) = match result {
            ProbeResult::Success => (ProbeOutcomeLabel::Successful, true),
            ProbeResult::Failure => (ProbeOutcomeLabel::Failed, false),
            ProbeResult::Unknown => (ProbeOutcomeLabel::Unknown, true),
        };
        self.shared
            .metrics
            .observe_probe(labels, outcome, timed.then(|| began.elapsed()));
        state.record(result);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI32, AtomicUsize};

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus as ApiContainerStatus, ExecAction,
        PodSpec, PodStatus as ApiPodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::container::{ExecOutput, RuntimeError};

    /// Exits with the current code and counts the calls.
    #[derive(Default)]
    struct Runner {
        code: AtomicI32,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl CommandRunner for Runner {
        async fn exec_sync(
            &self,
            _container: &ContainerId,
            _cmd: Vec<String>,
            _timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(ExecOutput {
                exit_code: self.code.load(Ordering::SeqCst),
                ..ExecOutput::default()
            })
        }
    }

    fn pod(probe: Probe) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    readiness_probe: Some(probe),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn running_status() -> ApiPodStatus {
        ApiPodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.88.0.3".into()),
            container_statuses: Some(vec![ApiContainerStatus {
                name: "app".into(),
                container_id: Some("containerd://c1".into()),
                started: Some(true),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(wall_clock_now())),
                    }),
                    ..ContainerState::default()
                }),
                ..ApiContainerStatus::default()
            }]),
            ..ApiPodStatus::default()
        }
    }

    struct Fixture {
        manager: ProbeManager,
        handle: ProbeHandle,
        runner: Arc<Runner>,
        metrics: Metrics,
        results: ProbeResults,
        status: StatusManager,
    }

    fn fixture(pod: &Pod) -> Fixture {
        let runner = Arc::new(Runner::default());
        let status = StatusManager::new();
        status.set_pod_status(pod, running_status());
        let metrics = Metrics::new().unwrap();
        let (results, updates) = ProbeResults::new();
        let manager = ProbeManager::new(
            ProbeManagerDeps {
                runner: runner.clone(),
                recorder: Recorder::new(None),
                status: status.clone(),
                metrics: metrics.clone(),
                results: results.clone(),
            },
            updates,
        );
        Fixture {
            handle: manager.handle(),
            manager,
            runner,
            metrics,
            results,
            status,
        }
    }

    fn every_ten_seconds() -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(10),
            ..Probe::default()
        }
    }

    const PERIOD: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_worker_probes_once_a_period_after_a_jittered_start() {
        let pod = pod(every_ten_seconds());
        let mut f = fixture(&pod);
        f.handle.add_pod(&pod);
        f.handle.add_pod(&pod);
        assert_eq!(f.handle.shared.workers().len(), 1, "one worker per probe");

        let first = f.manager.next_update().await.unwrap();
        assert_eq!(first.result, ProbeResult::Failure, "not ready until probed");
        let began = Instant::now();
        let ready = f.manager.next_update().await.unwrap();
        assert_eq!(ready.result, ProbeResult::Success);
        assert_eq!(ready.container, ContainerId::from("c1"));
        assert!(
            began.elapsed() < PERIOD,
            "the first probe comes within a period"
        );
        assert_eq!(f.runner.calls.load(Ordering::SeqCst), 1);

        tokio::time::sleep(PERIOD * 3).await;
        let calls = f.runner.calls.load(Ordering::SeqCst);
        assert!(
            (3..=4).contains(&calls),
            "{calls} probes in three periods and a bit"
        );
        let text = f.metrics.render_probes().unwrap();
        assert!(
            text.contains(&format!(
                "prober_probe_total{{container=\"app\",namespace=\"ns\",pod=\"web\",\
                 pod_uid=\"u1\",probe_type=\"Readiness\",result=\"successful\"}} {calls}"
            )),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_not_ready_container_is_probed_at_once_when_its_status_is_generated() {
        let pod = pod(every_ten_seconds());
        let mut f = fixture(&pod);
        f.runner.code.store(1, Ordering::SeqCst);
        f.handle.add_pod(&pod);
        f.manager.next_update().await.unwrap();
        while f.runner.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let uid = PodUid::from("u1");
        let id = ContainerId::from("c1");
        let before = f.runner.calls.load(Ordering::SeqCst);
        assert!(!f.handle.ready(&uid, "app", &id));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(f.runner.calls.load(Ordering::SeqCst), before + 1);
        assert!(
            f.handle.started(&uid, "app", &id),
            "no startup probe: started"
        );
        assert!(
            f.handle.ready(&uid, "other", &id),
            "no readiness probe: ready"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn removing_the_pod_stops_its_workers_and_forgets_their_traces() {
        let pod = pod(every_ten_seconds());
        let mut f = fixture(&pod);
        f.handle.add_pod(&pod);
        f.manager.next_update().await.unwrap();
        f.manager.next_update().await.unwrap();
        let id = ContainerId::from("c1");
        assert_eq!(
            f.results.get(ProbeType::Readiness, &id),
            Some(ProbeResult::Success)
        );

        f.handle.remove_pod(&PodUid::from("u1"));
        assert!(f.handle.shared.workers().is_empty(), "forgotten at once");
        while f.results.get(ProbeType::Readiness, &id).is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            !f.metrics.render_probes().unwrap().contains("pod=\"web\""),
            "the worker's series are gone"
        );
        let calls = f.runner.calls.load(Ordering::SeqCst);
        tokio::time::sleep(PERIOD * 3).await;
        assert_eq!(
            f.runner.calls.load(Ordering::SeqCst),
            calls,
            "no probe after the stop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_added_again_right_after_its_removal_is_probed_by_fresh_workers() {
        let pod = pod(every_ten_seconds());
        let mut f = fixture(&pod);
        f.handle.add_pod(&pod);
        f.manager.next_update().await.unwrap();
        let uid = PodUid::from("u1");
        f.handle.remove_pod(&uid);
        f.handle.add_pod(&pod);
        assert!(f.handle.has_worker(&uid, "app", ProbeType::Readiness));
        let calls = f.runner.calls.load(Ordering::SeqCst);
        tokio::time::sleep(PERIOD * 3).await;
        assert!(
            f.runner.calls.load(Ordering::SeqCst) > calls,
            "the new worker probes"
        );
        assert!(
            f.metrics.render_probes().unwrap().contains("pod=\"web\""),
            "the stopped worker did not take the new one's series with it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cleanup_keeps_the_workers_of_desired_pods_and_termination_keeps_readiness() {
        let mut probe_pod = pod(every_ten_seconds());
        probe_pod.spec.as_mut().unwrap().containers[0].liveness_probe = Some(every_ten_seconds());
        let f = fixture(&probe_pod);
        f.handle.add_pod(&probe_pod);
        let uid = PodUid::from("u1");
        f.handle.cleanup_pods(&HashSet::from([uid.clone()]));
        f.handle.stop_liveness_and_startup(&uid);
        while f.handle.has_worker(&uid, "app", ProbeType::Liveness) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(f.handle.has_worker(&uid, "app", ProbeType::Readiness));
        f.handle.cleanup_pods(&HashSet::new());
        while f.handle.has_worker(&uid, "app", ProbeType::Readiness) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn exited(name: &str, id: &str) -> ApiContainerStatus {
        ApiContainerStatus {
            name: name.into(),
            container_id: Some(format!("containerd://{id}")),
            state: Some(ContainerState {
                terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                    exit_code: 1,
                    ..Default::default()
                }),
                ..ContainerState::default()
            }),
            ..ApiContainerStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sidecar_of_a_never_pod_keeps_its_probes_after_it_exited() {
        let mut never = pod(every_ten_seconds());
        let spec = never.spec.as_mut().unwrap();
        spec.restart_policy = Some("Never".into());
        spec.init_containers = Some(vec![Container {
            name: "side".into(),
            restart_policy: Some("Always".into()),
            readiness_probe: Some(every_ten_seconds()),
            ..Container::default()
        }]);
        let f = fixture(&never);
        f.status.set_pod_status(
            &never,
            ApiPodStatus {
                phase: Some("Running".into()),
                container_statuses: Some(vec![exited("app", "c1")]),
                init_container_statuses: Some(vec![exited("side", "s1")]),
                ..ApiPodStatus::default()
            },
        );
        f.handle.add_pod(&never);
        let uid = PodUid::from("u1");
        while f.handle.has_worker(&uid, "app", ProbeType::Readiness) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(PERIOD * 3).await;
        assert!(
            f.handle.has_worker(&uid, "side", ProbeType::Readiness),
            "the sidecar runs again whatever the pod's restart policy"
        );
    }
}
