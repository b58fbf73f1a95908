//! The eviction loop (the kubelet's `managerImpl` in `pkg/kubelet/eviction/eviction_manager.go`:
//! `Start`, `synchronize`, `reclaimNodeLevelResources`, `evictPod`, `waitForPodsCleanup`): every
//! monitoring period, and at once when the kernel reports memory usage crossing a threshold, it
//! observes the signals, updates the pressure conditions, and when a threshold has been met for
//! its grace period reclaims node-level resources (disk only: dead containers, then unused
//! images) and, when a threshold is still met after that, evicts one pod, then waits for that pod
//! to be cleaned up before the next round.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::handle::{EvictionHandle, is_critical_pod};
use super::message::{REASON, THRESHOLD_MET_EVENT, eviction_message};
use super::notifier::{ThresholdNotifier, usage_threshold};
use super::observe::{self, MemorySource, NodeMemory, PodUsageReport};
use super::rank::{Candidate, rank};
use super::signals::{PressureCondition, Signal, Threshold};
use super::thresholds::{
    Observations, conditions_last_observed_at, conditions_observed_since, first_observed_at,
    merge_thresholds, met_grace_period, node_conditions, reclaim_first, reclaims_node_level,
    thresholds_met,
};
use crate::container::PodUid;
use crate::events::{EventObject, EventType, Recorder};
use crate::pod::pod_uid;
use crate::stats::{CgroupLayout, PodStatsInput, StatsProvider, Summary};

/// The kubelet's `evictionMonitoringPeriod`.
pub const DEFAULT_MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// How often the kernel thresholds are recomputed (the kubelet's `notifierRefreshInterval`).
const NOTIFIER_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// The grace period of a pod evicted for a hard threshold (the kubelet's
/// `immediateEvictionGracePeriodSeconds`).
const IMMEDIATE_GRACE_PERIOD_SECONDS: i64 = 1;
/// How long to wait for an evicted pod to be cleaned up, and how often to look.
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
const POD_CLEANUP_POLL: Duration = Duration::from_secs(1);

/// The manager's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`: how long a condition stays after it was last seen.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod`: the longest grace period of a pod evicted for a soft
    /// threshold.
    pub max_pod_grace_period_seconds: i64,
    pub monitoring_period: Duration,
}

/// A pod the manager may evict.
#[derive(Debug, Clone)]
pub struct ActivePod {
    pub pod: Arc<Pod>,
    /// What the stats provider needs for it; `None` before the runtime reported it.
    pub stats: Option<PodStatsInput>,
}

/// What the manager needs from the rest of the agent.
#[async_trait]
pub trait EvictionHost: Send + Sync {
    /// The pods that are wanted and not terminated (the kubelet's `GetActivePods`).
    fn active_pods(&self) -> Vec<ActivePod>;
    /// Starts stopping the pod with the grace period; its status is the handle's.
    fn kill(&self, pod: Arc<Pod>, grace_period_seconds: i64);
    /// Whether the pod's worker has finished with it.
    fn is_terminated(&self, uid: &PodUid) -> bool;
    /// Whether the pod is still known at all (its eviction record can go when it is not).
    fn is_known(&self, uid: &PodUid) -> bool;
    /// Removes every dead container (the container GC's `DeleteAllUnusedContainers`).
    async fn delete_all_unused_containers(&self);
}

/// The image garbage collector's part in reclaiming disk (the kubelet's
/// `ImageGC.DeleteUnusedImages`), plugged in where an image GC exists.
#[async_trait]
pub trait ImageReclaimer: Send + Sync {
    async fn delete_unused_images(&self) -> Result<(), String>;
    /// Whether images live on another filesystem than the node's (the kubelet's
    /// `HasDedicatedImageFs`).
    async fn has_dedicated_image_fs(&self) -> Result<bool, String>;
}

/// What the manager remembers between rounds.
#[derive(Default)]
struct State {
    thresholds_met: Vec<Threshold>,
    first_observed: Vec<(Threshold, Instant)>,
    conditions_last_observed: BTreeMap<PressureCondition, Instant>,
    notifiers: Vec<ThresholdNotifier>,
    notifiers_refreshed: Option<Instant>,
    /// Learnt once, as the kubelet does; `None` until it could be.
    dedicated_image_fs: Option<bool>,
}

/// One round's readings.
struct Reading {
    memory: Option<NodeMemory>,
    /// `None` when the stats task failed.
    summary: Option<Summary>,
    inputs: Vec<PodStatsInput>,
}

/// Runs eviction; see the module docs.
pub struct EvictionManager {
    settings: EvictionSettings,
    handle: EvictionHandle,
    host: Arc<dyn EvictionHost>,
    images: Option<Arc<dyn ImageReclaimer>>,
    stats: StatsProvider,
    layout: CgroupLayout,
    memory: MemorySource,
    recorder: Recorder,
    node_name: String,
    state: State,
}

impl EvictionManager {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: EvictionSettings,
        handle: EvictionHandle,
        host: Arc<dyn EvictionHost>,
        stats: StatsProvider,
        layout: CgroupLayout,
        recorder: Recorder,
        node_name: String,
    ) -> Self {
        Self {
            settings,
            handle,
            host,
            images: None,
            stats,
            memory: MemorySource::for_layout(&layout),
            layout,
            recorder,
            node_name,
            state: State::default(),
        }
    }

    /// Lets disk reclaim delete unused images first.
    #[must_use]
    pub fn with_image_reclaimer(mut self, images: Arc<dyn ImageReclaimer>) -> Self {
        self.images = Some(images);
        self
    }

    pub async fn run(mut self) {
        if self.settings.thresholds.is_empty() {
            tracing::info!("no eviction thresholds: the eviction manager does not run");
            return;
        }
        loop {
            if let Some(evicted) = self.synchronize().await {
                self.wait_for_cleanup(&evicted).await;
                continue;
            }
            let crossed = any_crossed(&self.state.notifiers);
            tokio::select! {
                () = tokio::time::sleep(self.settings.monitoring_period) => {}
                () = crossed => tracing::info!("eviction manager: memory threshold crossed"),
            }
        }
    }

    async fn read(&self, active: &[ActivePod]) -> Reading {
        let inputs: Vec<PodStatsInput> = active.iter().filter_map(|p| p.stats.clone()).collect();
        let source = self.memory.clone();
        let memory = tokio::task::spawn_blocking(move || observe::read_node_memory(&source));
        let only_memory = self
            .settings
            .thresholds
            .iter()
            .all(|t| t.signal == Signal::MemoryAvailable);
        let (stats, pods) = (self.stats.clone(), inputs.clone());
        let summary = tokio::task::spawn_blocking(move || {
            if only_memory {
                stats.cpu_and_memory_summary(&pods)
            } else {
                stats.summary(&pods)
            }
        });
        let memory = match memory.await {
            Ok(Ok(memory)) => Some(memory),
            Ok(Err(err)) => {
                tracing::warn!(
                    "eviction manager: cannot read the node's memory: {}",
                    crate::error_chain::error_chain(&err)
                );
                None
            }
            Err(_) => None,
        };
        let summary = summary.await.ok();
        Reading {
            memory,
            summary,
            inputs,
        }
    }

    /// Re-registers the kernel thresholds from the current inactive file pages.
    fn refresh_notifiers(&mut self, memory: &NodeMemory, now: Instant) {
        let Some(root) = &self.memory.root_memory_cgroup else {
            return;
        };
        if self
            .state
            .notifiers_refreshed
            .is_some_and(|at| now.saturating_duration_since(at) < NOTIFIER_REFRESH_INTERVAL)
        {
            return;
        }
        self.state.notifiers_refreshed = Some(now);
        self.state.notifiers = self
            .settings
            .thresholds
            .iter()
            .filter_map(|t| usage_threshold(t, memory))
            .filter_map(|usage| match ThresholdNotifier::register(root, usage) {
                Ok(notifier) => Some(notifier),
                Err(err) => {
                    tracing::warn!(
                        "eviction manager: cannot register a memory threshold notification: {}",
                        crate::error_chain::error_chain(&err)
                    );
                    None
                }
            })
            .collect();
    }

    /// One round (the kubelet's `synchronize`); returns the evicted pod, if any.
    async fn synchronize(&mut self) -> Option<PodUid> {
        let host = Arc::clone(&self.host);
        self.handle.retain_evicted(|uid| host.is_known(uid));
        let active = self.host.active_pods();
        let reading = self.read(&active).await;
        let now = Instant::now();
        if let Some(memory) = &reading.memory {
            self.refresh_notifiers(memory, now);
        }
        let observed = observe::observations(reading.memory.as_ref(), reading.summary.as_ref());
        let acting = self.update_state(&observed, now);
        let threshold = reclaim_first(&acting)?.clone();
        let resource = threshold.signal.resource();
        tracing::info!(resource, "eviction manager: attempting to reclaim");
        self.recorder.event(
            EventType::Warning,
            EventObject::node(&self.node_name),
            THRESHOLD_MET_EVENT,
            format!("Attempting to reclaim {resource}"),
        );
        let dedicated_image_fs = self.dedicated_image_fs().await;
        if self
            .reclaim_node_level(threshold.signal, dedicated_image_fs, &active)
            .await
        {
            tracing::info!(
                resource,
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            return None;
        }
        self.evict_one(&threshold, &observed, &active, &reading)
    }

    /// Advances the thresholds and conditions to `observed`; returns the thresholds to act on.
    fn update_state(&mut self, observed: &Observations, now: Instant) -> Vec<Threshold> {
        let mut met = thresholds_met(&self.settings.thresholds, observed, false);
        if !self.state.thresholds_met.is_empty() {
            let unresolved = thresholds_met(&self.state.thresholds_met, observed, true);
            met = merge_thresholds(met, unresolved);
        }
        let first = first_observed_at(&met, &self.state.first_observed, now);
        let last_observed = conditions_last_observed_at(
            &node_conditions(&met),
            &self.state.conditions_last_observed,
            now,
        );
        let conditions = conditions_observed_since(
            &last_observed,
            self.settings.pressure_transition_period,
            now,
        );
        let acting = met_grace_period(&first, now);
        self.state.first_observed = first;
        self.state.conditions_last_observed = last_observed;
        self.state.thresholds_met.clone_from(&acting);
        self.handle.set_conditions(conditions);
        acting
    }

    /// Whether the image filesystem is its own device; without an image reclaimer, or until
    /// that can be read, the node and image filesystems count as one (the reclaim covering
    /// both).
    async fn dedicated_image_fs(&mut self) -> bool {
        if let Some(known) = self.state.dedicated_image_fs {
            return known;
        }
        let Some(images) = &self.images else {
            return false;
        };
        match images.has_dedicated_image_fs().await {
            Ok(known) => {
                tracing::info!(
                    dedicated_image_fs = known,
                    "eviction manager: image filesystem detected"
                );
                self.state.dedicated_image_fs = Some(known);
                known
            }
            Err(err) => {
                tracing::warn!("eviction manager: cannot tell the image filesystem apart: {err}");
                false
            }
        }
    }

    /// `reclaimNodeLevelResources`: frees what the node itself holds for `signal` (dead
    /// containers, then unused images) and says whether every threshold is then resolved, read
    /// afresh and ignoring grace periods; `false` when the signal has nothing to reclaim.
    async fn reclaim_node_level(
        &self,
        signal: Signal,
        dedicated_image_fs: bool,
        active: &[ActivePod],
    ) -> bool {
        if !reclaims_node_level(signal, dedicated_image_fs) {
            return false;
        }
        self.host.delete_all_unused_containers().await;
        if let Some(images) = &self.images
            && let Err(err) = images.delete_unused_images().await
        {
            tracing::warn!("eviction manager: deleting unused images failed: {err}");
        }
        let reading = self.read(active).await;
        let observed = observe::observations(reading.memory.as_ref(), reading.summary.as_ref());
        thresholds_met(&self.settings.thresholds, &observed, true).is_empty()
    }

    fn evict_one(
        &self,
        threshold: &Threshold,
        observed: &Observations,
        active: &[ActivePod],
        reading: &Reading,
    ) -> Option<PodUid> {
        let resource = threshold.signal.resource();
        if active.is_empty() {
            tracing::error!(
                "eviction manager: eviction thresholds have been met, but no pods are active to \
                 evict"
            );
            return None;
        }
        tracing::info!(resource, "eviction manager: must evict pod(s) to reclaim");
        let usage: HashMap<String, PodUsageReport> = reading
            .summary
            .as_ref()
            .map(|summary| observe::pod_usage(summary, &reading.inputs, &self.layout))
            .unwrap_or_default();
        let mut candidates: Vec<Candidate> = active
            .iter()
            .map(|p| Candidate {
                pod: Arc::clone(&p.pod),
                usage: pod_uid(&p.pod)
                    .and_then(|uid| usage.get(uid.as_str()))
                    .map(|report| report.usage),
            })
            .collect();
        rank(threshold.signal, &mut candidates);
        for candidate in candidates {
            let pod = candidate.pod;
            let Some(uid) = pod_uid(&pod) else { continue };
            if is_critical_pod(&pod) {
                tracing::error!(pod = ?pod.metadata.name, "eviction manager: cannot evict a critical pod");
                continue;
            }
            let grace = if threshold.is_hard() {
                IMMEDIATE_GRACE_PERIOD_SECONDS
            } else {
                let max = self.settings.max_pod_grace_period_seconds;
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .map_or(max, |own| own.min(max))
            };
            let containers = usage.get(uid.as_str()).map(|r| r.containers.as_slice());
            let message =
                eviction_message(threshold, observed.get(&threshold.signal), &pod, containers);
            self.recorder.event(
                EventType::Warning,
                EventObject::pod(&pod),
                REASON,
                message.clone(),
            );
            tracing::info!(pod = ?pod.metadata.name, %message, "eviction manager: evicting pod");
            self.handle.mark_evicted(uid.clone(), message);
            self.host.kill(pod, grace);
            return Some(uid);
        }
        tracing::info!("eviction manager: unable to evict any pods from the node");
        None
    }

    /// Waits until the evicted pod is cleaned up, at most [`POD_CLEANUP_TIMEOUT`].
    async fn wait_for_cleanup(&self, uid: &PodUid) {
        let deadline = Instant::now() + POD_CLEANUP_TIMEOUT;
        while !self.host.is_terminated(uid) {
            if Instant::now() >= deadline {
                tracing::warn!(%uid, "eviction manager: timed out waiting for the evicted pod to be cleaned up");
                return;
            }
            tokio::time::sleep(POD_CLEANUP_POLL).await;
        }
        tracing::info!(%uid, "eviction manager: evicted pod was cleaned up");
    }
}

/// Resolves when any notifier fires; never without notifiers.
async fn any_crossed(notifiers: &[ThresholdNotifier]) {
    if notifiers.is_empty() {
        return std::future::pending().await;
    }
    let waits = notifiers.iter().map(|n| Box::pin(n.crossed()));
    if let (Err(err), _, _) = futures::future::select_all(waits).await {
        tracing::warn!("eviction manager: memory threshold notification failed: {err}");
        // A broken eventfd would fire in a loop; fall back to the poll until the next refresh.
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{
        Container, PodSpec, PodStatus as ApiPodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::container::ContainerId;
    use crate::eviction::signals::ThresholdValue;
    use crate::stats::{ContainerStatsInput, StatsSettings};

    const MI: u64 = 1 << 20;

    /// Pods and what was done to them.
    #[derive(Default)]
    struct FakeHost {
        pods: Vec<ActivePod>,
        killed: Mutex<Vec<(String, i64)>>,
        /// Every reclaim and kill, in order.
        steps: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl EvictionHost for FakeHost {
        fn active_pods(&self) -> Vec<ActivePod> {
            self.pods.clone()
        }
        fn kill(&self, pod: Arc<Pod>, grace_period_seconds: i64) {
            let name = pod.metadata.name.clone().unwrap();
            self.steps.lock().unwrap().push(format!("kill {name}"));
            self.killed
                .lock()
                .unwrap()
                .push((name, grace_period_seconds));
        }
        fn is_terminated(&self, _: &PodUid) -> bool {
            true
        }
        fn is_known(&self, _: &PodUid) -> bool {
            true
        }
        async fn delete_all_unused_containers(&self) {
            self.steps.lock().unwrap().push("containers".to_owned());
        }
    }

    /// An image garbage collector that logs into the host's steps; deleting images may make the
    /// node filesystem unreadable, which stands in for space freed (a signal that is not
    /// observed meets no threshold, as in the kubelet's `thresholdsMet`).
    struct FakeImages {
        host: Arc<FakeHost>,
        dedicated: bool,
        frees: Option<std::path::PathBuf>,
    }

    #[async_trait]
    impl ImageReclaimer for FakeImages {
        async fn delete_unused_images(&self) -> Result<(), String> {
            self.host.steps.lock().unwrap().push("images".to_owned());
            if let Some(root) = &self.frees {
                std::fs::remove_dir_all(root).unwrap();
            }
            Ok(())
        }
        async fn has_dedicated_image_fs(&self) -> Result<bool, String> {
            Ok(self.dedicated)
        }
    }

    fn write_memory_cgroup(mount: &Path, cgroup: &str, usage: u64) {
        let dir = mount.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), usage.to_string()).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "total_inactive_file 0\ntotal_rss 0\ntotal_pgfault 0\ntotal_pgmajfault 0\n",
        )
        .unwrap();
    }

    /// A pod of one container `c` using `usage` bytes, requesting `request` of memory.
    fn pod(mount: &Path, name: &str, usage: u64, request: Option<&str>) -> ActivePod {
        let cgroup = format!("/kubepods/pod{name}");
        write_memory_cgroup(mount, &cgroup, usage);
        write_memory_cgroup(mount, &format!("{cgroup}/c-{name}"), usage);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_owned(),
                    resources: Some(ResourceRequirements {
                        requests: request.map(|r| {
                            BTreeMap::from([("memory".to_owned(), Quantity(r.to_owned()))])
                        }),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        ActivePod {
            pod: Arc::new(pod),
            stats: Some(PodStatsInput {
                namespace: "ns".to_owned(),
                name: name.to_owned(),
                uid: PodUid::from(name),
                start_time: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                cgroup,
                containers: vec![ContainerStatsInput {
                    name: "c".to_owned(),
                    id: ContainerId::from(format!("c-{name}")),
                    start_time: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                }],
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_under_memory_pressure_evicts_the_pod_over_its_request_and_sets_the_condition()
    {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("memory");
        // 4 GiB of memory, 3.5 GiB of it in use: 512 MiB available, below a 1 GiB threshold.
        write_memory_cgroup(&mount, "/", 3584 * MI);
        let meminfo = dir.path().join("meminfo");
        std::fs::write(&meminfo, format!("MemTotal: {} kB\n", 4096 * 1024)).unwrap();
        let host = Arc::new(FakeHost {
            pods: vec![
                pod(&mount, "hog", 900 * MI, Some("1Gi")),
                pod(&mount, "best-effort", 300 * MI, None),
            ],
            ..FakeHost::default()
        });
        let layout = CgroupLayout::V1 {
            cpuacct: dir.path().join("cpuacct"),
            memory: mount.clone(),
        };
        let mut stats_settings = StatsSettings::new("node", layout.clone());
        stats_settings.proc_root = dir.path().join("proc");
        let handle = EvictionHandle::default();
        let mut manager = EvictionManager::new(
            EvictionSettings {
                thresholds: vec![Threshold {
                    signal: Signal::MemoryAvailable,
                    value: ThresholdValue::Quantity {
                        amount: 1 << 30,
                        binary: true,
                    },
                    grace_period: Duration::ZERO,
                    min_reclaim: None,
                }],
                pressure_transition_period: Duration::from_secs(30),
                max_pod_grace_period_seconds: 0,
                monitoring_period: DEFAULT_MONITORING_PERIOD,
            },
            handle.clone(),
            Arc::clone(&host) as Arc<dyn EvictionHost>,
            StatsProvider::new(stats_settings),
            layout,
            Recorder::new(None),
            "node".to_owned(),
        );
        manager.memory = MemorySource {
            meminfo,
            // No kernel notifier on a fake cgroup: the test drives the rounds.
            root_memory_cgroup: None,
        };
        // Without a v1 root cgroup the usage comes from meminfo: give it the same figures.
        std::fs::write(
            &manager.memory.meminfo,
            format!(
                "MemTotal: {} kB\nMemFree: {} kB\nInactive(file): 0 kB\n",
                4096 * 1024,
                512 * 1024
            ),
        )
        .unwrap();

        let evicted = manager.synchronize().await;
        assert_eq!(evicted, Some(PodUid::from("best-effort")));
        assert_eq!(
            *host.killed.lock().unwrap(),
            [("best-effort".to_owned(), 1)]
        );
        assert_eq!(
            handle.conditions(),
            std::collections::BTreeSet::from([PressureCondition::Memory])
        );
        let mut status = ApiPodStatus::default();
        assert!(handle.apply_eviction(&PodUid::from("best-effort"), &mut status));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "The node was low on resource: memory. Threshold quantity: 1Gi, available: \
                 512Mi. Container c was using 300Mi, request is 0, has larger consumption of \
                 memory. "
            )
        );

        // Memory back above the threshold: nothing more is evicted, and the condition stays for
        // the transition period.
        std::fs::write(
            &manager.memory.meminfo,
            format!(
                "MemTotal: {} kB\nMemFree: {} kB\nInactive(file): 0 kB\n",
                4096 * 1024,
                2048 * 1024
            ),
        )
        .unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(manager.synchronize().await, None);
        assert_eq!(host.killed.lock().unwrap().len(), 1);
        assert_eq!(handle.conditions().len(), 1, "within the transition period");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(manager.synchronize().await, None);
        assert!(
            handle.conditions().is_empty(),
            "the transition period is over"
        );
    }

    /// A manager with one hard threshold on `signal` that is always met while the node
    /// filesystem (a directory of `dir`) can be read, and one best-effort pod.
    fn disk_manager(
        dir: &Path,
        signal: Signal,
        dedicated: bool,
        frees: bool,
    ) -> (EvictionManager, Arc<FakeHost>) {
        let mount = dir.join("memory");
        write_memory_cgroup(&mount, "/", 0);
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let host = Arc::new(FakeHost {
            pods: vec![pod(&mount, "disk-user", 0, None)],
            ..FakeHost::default()
        });
        let layout = CgroupLayout::V1 {
            cpuacct: dir.join("cpuacct"),
            memory: mount,
        };
        let mut stats_settings = StatsSettings::new("node", layout.clone());
        stats_settings.proc_root = dir.join("proc");
        stats_settings.root_dir.clone_from(&root);
        stats_settings.pod_log_root = dir.join("logs");
        // No containerd root: the image filesystem is observed as the node's.
        stats_settings.containerd_root = dir.join("containerd");
        let manager = EvictionManager::new(
            EvictionSettings {
                thresholds: vec![Threshold {
                    signal,
                    value: ThresholdValue::Quantity {
                        amount: i64::MAX,
                        binary: true,
                    },
                    grace_period: Duration::ZERO,
                    min_reclaim: None,
                }],
                pressure_transition_period: Duration::from_secs(30),
                max_pod_grace_period_seconds: 0,
                monitoring_period: DEFAULT_MONITORING_PERIOD,
            },
            EvictionHandle::default(),
            Arc::clone(&host) as Arc<dyn EvictionHost>,
            StatsProvider::new(stats_settings),
            layout,
            Recorder::new(None),
            "node".to_owned(),
        )
        .with_image_reclaimer(Arc::new(FakeImages {
            host: Arc::clone(&host),
            dedicated,
            frees: frees.then_some(root),
        }));
        (manager, host)
    }

    fn steps(host: &FakeHost) -> Vec<String> {
        host.steps.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn disk_pressure_reclaims_containers_and_images_and_evicts_nobody_when_that_resolves_it()
    {
        let dir = tempfile::tempdir().unwrap();
        let (mut manager, host) = disk_manager(dir.path(), Signal::NodeFsAvailable, false, true);
        assert_eq!(manager.synchronize().await, None);
        assert_eq!(steps(&host), ["containers", "images"]);
        assert_eq!(
            manager.handle.conditions(),
            std::collections::BTreeSet::from([PressureCondition::Disk])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn disk_pressure_still_met_after_the_reclaim_evicts_a_pod() {
        let dir = tempfile::tempdir().unwrap();
        for signal in [Signal::NodeFsAvailable, Signal::ImageFsInodesFree] {
            let (mut manager, host) = disk_manager(dir.path(), signal, false, false);
            assert_eq!(manager.synchronize().await, Some(PodUid::from("disk-user")));
            assert_eq!(
                steps(&host),
                ["containers", "images", "kill disk-user"],
                "{signal:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_dedicated_image_filesystem_only_image_pressure_reclaims() {
        let dir = tempfile::tempdir().unwrap();
        let (mut manager, host) = disk_manager(dir.path(), Signal::NodeFsAvailable, true, true);
        assert_eq!(manager.synchronize().await, Some(PodUid::from("disk-user")));
        assert_eq!(steps(&host), ["kill disk-user"]);

        let (mut manager, host) = disk_manager(dir.path(), Signal::ImageFsAvailable, true, true);
        assert_eq!(manager.synchronize().await, None);
        assert_eq!(steps(&host), ["containers", "images"]);
    }
}
