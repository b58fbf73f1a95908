//! Kernel → event and kernel → status latency of the eBPF PLEG (ringlet's own; the kubelet has no
//! counterpart). Hints carry the kernel's `CLOCK_MONOTONIC` timestamp; the PLEG observes the event
//! latency when it emits an event a hint led to and remembers the hint's time on the pod, and the sync
//! path observes the status latency when it next stores a changed status for that pod (and tells
//! `ringlet events` watchers with a `StatusUpdated` record).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::container::PodUid;
use crate::event_stream::{EventBroadcaster, LifecycleKind, LifecycleRecord};
use crate::metrics::Metrics;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock `bpf_ktime_get_ns` reads, so it can be compared
/// with a hint's `kernel_time_ns`.
pub fn monotonic_now_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Time from a kernel timestamp to now; zero for a timestamp in the future.
fn since_kernel(kernel_time_ns: u64) -> Duration {
    Duration::from_nanos(monotonic_now_ns().saturating_sub(kernel_time_ns))
}

/// Shared between the PLEG and the sync path: the kernel time of the oldest hint whose events the
/// sync path has not yet turned into a changed status, per pod. Cloneable; clones share the state.
#[derive(Clone)]
pub struct LatencyTracker {
    pending: Arc<Mutex<HashMap<PodUid, u64>>>,
    metrics: Metrics,
    broadcaster: EventBroadcaster,
}

impl LatencyTracker {
    pub fn new(metrics: Metrics, broadcaster: EventBroadcaster) -> Self {
        Self {
            pending: Arc::default(),
            metrics,
            broadcaster,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, u64>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The PLEG emitted an event for `pod` that a hint stamped `kernel_time_ns` led to: observes the
    /// kernel → event latency and remembers the time for the status latency.
    pub(super) fn event_emitted(&self, pod: &PodUid, kernel_time_ns: u64) {
        self.metrics
            .observe_event_latency(since_kernel(kernel_time_ns));
        self.lock()
            .entry(pod.clone())
            .and_modify(|t| *t = (*t).min(kernel_time_ns))
            .or_insert(kernel_time_ns);
    }

    /// The sync path stored a changed status for pod `uid` (`namespace`/`name`): observes kernel →
    /// status latency if an event a hint led to is waiting for it.
    pub fn status_changed(&self, uid: &PodUid, namespace: &str, name: &str) {
        let pending = self.lock().remove(uid);
        let Some(kernel_time_ns) = pending else {
            return;
        };
        let latency = since_kernel(kernel_time_ns);
        self.metrics.observe_status_latency(latency);
        if self.broadcaster.watcher_count() > 0 {
            self.broadcaster.publish(LifecycleRecord {
                pod_uid: uid.clone(),
                namespace: namespace.to_owned(),
                pod_name: name.to_owned(),
                container_name: String::new(),
                container_id: None,
                kind: LifecycleKind::StatusUpdated,
                exit_code: None,
                kernel_to_event: Some(latency),
                observed_at: SystemTime::now(),
            });
        }
    }

    /// The sync path generated pod `uid`'s status from a runtime read that holds every event
    /// emitted so far, and it came out unchanged: those events changed nothing visible, so their
    /// hint time is dropped rather than charged to the pod's next change (which would then read as
    /// the time since an exit long past, seconds or minutes).
    pub fn status_unchanged(&self, uid: &PodUid) {
        self.lock().remove(uid);
    }

    /// Forgets pods not in `keep` (pods that went away before their status changed).
    pub fn retain(&self, keep: &HashSet<PodUid>) {
        self.lock().retain(|uid, _| keep.contains(uid));
    }

    /// Whether a hint time waits for `pod`'s next changed status.
    pub fn is_pending(&self, pod: &PodUid) -> bool {
        self.lock().contains_key(pod)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn histogram_count(metrics: &Metrics, name: &str) -> u64 {
        let text = metrics.render().unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}_count")))
            .unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// A tracker with its metrics and a `ringlet events` watcher of what it publishes.
    fn watched_tracker() -> (
        Metrics,
        tokio::sync::broadcast::Receiver<std::sync::Arc<LifecycleRecord>>,
        LatencyTracker,
    ) {
        let metrics = Metrics::new().unwrap();
        let broadcaster = EventBroadcaster::default();
        let watcher = broadcaster.subscribe();
        let tracker = LatencyTracker::new(metrics.clone(), broadcaster);
        (metrics, watcher, tracker)
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_now_ns();
        let b = monotonic_now_ns();
        assert!(a > 0);
        assert!(b >= a);
    }

    #[test]
    fn event_then_changed_status_observes_both_latencies_once() {
        let (metrics, mut watcher, tracker) = watched_tracker();
        let pod = PodUid::from("p");
        let kernel = monotonic_now_ns().saturating_sub(2_000_000);
        tracker.event_emitted(&pod, kernel);
        tracker.event_emitted(&pod, kernel + 1_000);
        assert_eq!(
            histogram_count(&metrics, "ringlet_pleg_event_latency_seconds"),
            2
        );
        assert!(tracker.is_pending(&pod));
        tracker.status_changed(&pod, "default", "web");
        tracker.status_changed(&pod, "default", "web");
        let record = watcher.try_recv().unwrap();
        assert_eq!(record.kind, LifecycleKind::StatusUpdated);
        assert_eq!(record.pod_name, "web");
        assert!(record.kernel_to_event.unwrap() >= Duration::from_millis(2));
        assert!(watcher.try_recv().is_err(), "one status, one record");
        assert_eq!(
            histogram_count(&metrics, "ringlet_pod_status_latency_seconds"),
            1
        );
        assert!(!tracker.is_pending(&pod));
        let text = metrics.render().unwrap();
        assert!(
            text.contains("ringlet_pod_status_latency_seconds_bucket{le=\"0.00178\"} 0"),
            "a hint 2 ms old is not under 1.78 ms: {text}"
        );
    }

    #[test]
    fn an_event_that_changed_nothing_is_not_charged_to_the_next_change() {
        let (metrics, mut watcher, tracker) = watched_tracker();
        let pod = PodUid::from("p");
        tracker.event_emitted(&pod, monotonic_now_ns().saturating_sub(60_000_000_000));
        tracker.status_unchanged(&pod);
        assert!(!tracker.is_pending(&pod));
        tracker.status_changed(&pod, "default", "web");
        assert_eq!(
            histogram_count(&metrics, "ringlet_pod_status_latency_seconds"),
            0
        );
        assert!(watcher.try_recv().is_err(), "no StatusUpdated record");
    }

    #[test]
    fn retain_forgets_gone_pods() {
        let tracker = LatencyTracker::new(Metrics::new().unwrap(), EventBroadcaster::default());
        tracker.event_emitted(&PodUid::from("a"), 1);
        tracker.event_emitted(&PodUid::from("b"), 1);
        tracker.retain(&HashSet::from([PodUid::from("b")]));
        assert!(!tracker.is_pending(&PodUid::from("a")));
        assert!(tracker.is_pending(&PodUid::from("b")));
    }
}
