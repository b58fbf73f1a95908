//! The shutdown itself (the kubelet's `managerImpl.start` event loop and `processShutdownEvent`):
//! on a shutdown event the node turns not ready and refuses pods, then the active pods stop group
//! by group, lowest priority first, each pod with its group's grace period (or its own when
//! shorter); the next group starts when every pod of this one has stopped or the group's period is
//! over. Then the source may let the machine go down. A cancellation makes the node ready again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::groups::{ShutdownGracePeriodByPodPriority, ShutdownGroup, group_by_priority};
use super::handle::NodeShutdownHandle;
use super::source::{ShutdownEvent, ShutdownSource};
use crate::events::{EventObject, EventType, Recorder};
use crate::eviction::{EvictionHandle, EvictionHost};
use crate::pod::pod_uid;

/// A stopped pod's status reason and message.
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The reason of the node's events about a shutdown (`kubeletevents.NodeShutdown`).
const EVENT_REASON: &str = "NodeShutdown";
/// How often a group's pods are looked at while it stops.
const TERMINATION_POLL: Duration = Duration::from_millis(200);

/// Runs graceful node shutdown; see the module docs.
pub struct NodeShutdownManager {
    /// Sorted by priority, lowest first.
    periods: Vec<ShutdownGracePeriodByPodPriority>,
    handle: NodeShutdownHandle,
    /// Where a stopped pod's status is recorded: the eviction path's, so the pod keeps it.
    evictions: EvictionHandle,
    host: Arc<dyn EvictionHost>,
    recorder: Recorder,
    node_name: String,
}

impl NodeShutdownManager {
    /// `periods` as [`super::shutdown_periods`] gives them; `evictions` and `host` as the
    /// eviction manager gets them.
    pub fn new(
        periods: Vec<ShutdownGracePeriodByPodPriority>,
        handle: NodeShutdownHandle,
        evictions: EvictionHandle,
        host: Arc<dyn EvictionHost>,
        recorder: Recorder,
        node_name: String,
    ) -> Self {
        Self {
            periods,
            handle,
            evictions,
            host,
            recorder,
            node_name,
        }
    }

    /// The longest the shutdown is held back: every group's period (the kubelet's
    /// `periodRequested`).
    pub fn requested_period(&self) -> Duration {
        let seconds: i64 = self
            .periods
            .iter()
            .map(|p| p.shutdown_grace_period_seconds)
            .sum();
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    /// Handles the source's events until it ends.
    pub async fn run(self, mut source: Box<dyn ShutdownSource>) {
        while let Some(event) = source.next().await {
            let node = EventObject::node(&self.node_name);
            match event {
                ShutdownEvent::Shutdown => {
                    tracing::info!("shutdown manager: the node is shutting down");
                    self.recorder.event(
                        EventType::Normal,
                        node,
                        EVENT_REASON,
                        "Shutdown manager detected shutdown event",
                    );
                    self.handle.set_shutting_down(true);
                    self.kill_pods().await;
                    source.release();
                    tracing::info!(
                        "shutdown manager: pods handled, the node will shut down shortly"
                    );
                }
                ShutdownEvent::Cancelled => {
                    tracing::info!("shutdown manager: the shutdown was cancelled");
                    self.recorder.event(
                        EventType::Normal,
                        node,
                        EVENT_REASON,
                        "Shutdown manager detected shutdown cancellation",
                    );
                    self.handle.set_shutting_down(false);
                }
            }
        }
        tracing::warn!(
            "the source of shutdown events ended: graceful node shutdown is disabled until the \
             agent restarts"
        );
    }

    /// Stops the active pods group by group (the kubelet's `processShutdownEvent`).
    async fn kill_pods(&self) {
        let pods = self.host.active_pods().into_iter().map(|p| p.pod).collect();
        for group in group_by_priority(&self.periods, pods) {
            if !group.pods.is_empty() {
                self.kill_group(&group).await;
            }
        }
    }

    async fn kill_group(&self, group: &ShutdownGroup) {
        let mut stopping = Vec::with_capacity(group.pods.len());
        for pod in &group.pods {
            let Some(uid) = pod_uid(pod) else { continue };
            let grace = group.grace_period_seconds(pod);
            tracing::info!(pod = ?pod.metadata.name, grace, "shutdown manager: killing pod");
            self.evictions
                .mark_terminated_by_kubelet(uid.clone(), REASON, MESSAGE.to_owned());
            self.host.kill(Arc::clone(pod), grace);
            stopping.push(uid);
        }
        let priority = group.period.priority;
        let deadline = Instant::now() + group.wait();
        loop {
            stopping.retain(|uid| !self.host.is_terminated(uid));
            if stopping.is_empty() {
                tracing::info!(priority, "shutdown manager: every pod of the group stopped");
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                tracing::info!(
                    priority,
                    left = stopping.len(),
                    "shutdown manager: the group's grace period is over, going on"
                );
                return;
            }
            tokio::time::sleep(TERMINATION_POLL.min(deadline - now)).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus as ApiPodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::sync::mpsc;

    use super::*;
    use crate::container::PodUid;
    use crate::eviction::ActivePod;
    use crate::nodeshutdown::shutdown_periods;

    /// Pods that stop `stops_after` after their kill (never when `None`), and the kills.
    #[derive(Default)]
    struct FakeHost {
        pods: Vec<(Arc<Pod>, Option<Duration>)>,
        /// (pod, grace period, seconds since the start of the shutdown)
        killed: Mutex<Vec<(String, i64, u64)>>,
        killed_at: Mutex<HashMap<PodUid, Instant>>,
        start: Mutex<Option<Instant>>,
    }

    #[async_trait]
    impl EvictionHost for FakeHost {
        fn active_pods(&self) -> Vec<ActivePod> {
            *self.start.lock().unwrap() = Some(Instant::now());
            self.pods
                .iter()
                .map(|(pod, _)| ActivePod {
                    pod: Arc::clone(pod),
                    stats: None,
                })
                .collect()
        }
        fn kill(&self, pod: Arc<Pod>, grace_period_seconds: i64) {
            let start = self.start.lock().unwrap().unwrap();
            self.killed.lock().unwrap().push((
                pod.metadata.name.clone().unwrap(),
                grace_period_seconds,
                start.elapsed().as_secs(),
            ));
            self.killed_at
                .lock()
                .unwrap()
                .insert(pod_uid(&pod).unwrap(), Instant::now());
        }
        fn is_terminated(&self, uid: &PodUid) -> bool {
            let stops_after = self
                .pods
                .iter()
                .find(|(pod, _)| pod_uid(pod).as_ref() == Some(uid))
                .and_then(|(_, after)| *after);
            let killed = self.killed_at.lock().unwrap().get(uid).copied();
            matches!((killed, stops_after), (Some(at), Some(after)) if at.elapsed() >= after)
        }
        fn is_known(&self, _: &PodUid) -> bool {
            true
        }
        async fn delete_all_unused_containers(&self) {}
    }

    fn pod(name: &str, priority: Option<i32>, grace: i64) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                priority,
                termination_grace_period_seconds: Some(grace),
                ..PodSpec::default()
            }),
            ..Pod::default()
        })
    }

    /// Events from a channel; counts the releases.
    struct ChannelSource {
        events: mpsc::UnboundedReceiver<ShutdownEvent>,
        released: Arc<AtomicUsize>,
    }

    #[async_trait]
    impl ShutdownSource for ChannelSource {
        async fn next(&mut self) -> Option<ShutdownEvent> {
            self.events.recv().await
        }
        fn release(&mut self) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn manager(host: &Arc<FakeHost>) -> (NodeShutdownManager, NodeShutdownHandle, EvictionHandle) {
        let handle = NodeShutdownHandle::default();
        let evictions = EvictionHandle::default();
        let manager = NodeShutdownManager::new(
            shutdown_periods(Duration::from_secs(30), Duration::from_secs(10), &[]),
            handle.clone(),
            evictions.clone(),
            Arc::clone(host) as Arc<dyn EvictionHost>,
            Recorder::new(None),
            "node".to_owned(),
        );
        (manager, handle, evictions)
    }

    #[tokio::test(start_paused = true)]
    async fn ordinary_pods_stop_first_and_critical_pods_after_them() {
        let host = Arc::new(FakeHost {
            pods: vec![
                (
                    pod("critical", Some(2_000_000_000), 60),
                    Some(Duration::from_secs(2)),
                ),
                (pod("web", None, 5), Some(Duration::from_secs(3))),
                (pod("batch", Some(1000), 60), Some(Duration::from_secs(1))),
            ],
            ..FakeHost::default()
        });
        let (manager, _, evictions) = manager(&host);
        assert_eq!(manager.requested_period(), Duration::from_secs(30));
        manager.kill_pods().await;
        assert_eq!(
            *host.killed.lock().unwrap(),
            [
                ("web".to_owned(), 5, 0),
                ("batch".to_owned(), 20, 0),
                // Once the slower ordinary pod stopped, not at the end of the group's 20 s.
                ("critical".to_owned(), 10, 3),
            ]
        );
        let mut status = ApiPodStatus::default();
        assert!(evictions.apply_eviction(&PodUid::from("critical"), &mut status));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Terminated"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown.")
        );
        let condition = &status.conditions.unwrap()[0];
        assert_eq!(condition.type_, "DisruptionTarget");
        assert_eq!(condition.reason.as_deref(), Some("TerminationByKubelet"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_that_does_not_stop_holds_the_next_back_only_for_its_period() {
        let host = Arc::new(FakeHost {
            pods: vec![
                (pod("stuck", None, 600), None),
                (pod("critical", Some(2_000_001_000), 600), None),
            ],
            ..FakeHost::default()
        });
        let (manager, _, _) = manager(&host);
        let started = Instant::now();
        manager.kill_pods().await;
        assert_eq!(
            *host.killed.lock().unwrap(),
            [("stuck".to_owned(), 20, 0), ("critical".to_owned(), 10, 20)]
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_event_makes_the_node_not_ready_stops_the_pods_and_releases_the_lock() {
        let host = Arc::new(FakeHost {
            pods: vec![(pod("web", None, 5), Some(Duration::from_secs(1)))],
            ..FakeHost::default()
        });
        let (manager, handle, _) = manager(&host);
        let (events, receiver) = mpsc::unbounded_channel();
        let released = Arc::new(AtomicUsize::new(0));
        let running = tokio::spawn(manager.run(Box::new(ChannelSource {
            events: receiver,
            released: Arc::clone(&released),
        })));
        let mut changes = handle.subscribe();
        events.send(ShutdownEvent::Shutdown).unwrap();
        changes.changed().await.unwrap();
        assert_eq!(handle.status().as_deref(), Some("node is shutting down"));
        assert_eq!(handle.admit().unwrap_err().reason, "NodeShutdown");
        events.send(ShutdownEvent::Cancelled).unwrap();
        changes.changed().await.unwrap();
        assert!(
            !handle.is_shutting_down(),
            "ready again after the cancellation"
        );
        assert_eq!(
            released.load(Ordering::SeqCst),
            1,
            "released after the pods"
        );
        assert_eq!(host.killed.lock().unwrap().len(), 1);
        drop(events);
        running.await.unwrap();
    }
}
