//! The kubelet's status lag: for each container exit the kernel reported, the time from the kernel's
//! timestamp until the kubelet reported it, as each source lets it be estimated. One
//! [`LagTracker`] per source keeps the exits that source has not reported yet; the source hands it
//! every pod it reads, and the tracker settles the exits those pods report ([`reports_exit`]: the
//! pure part), observes their lag, drops the exits whose pod left the source unreported (a removed
//! pod's containers) and gives up on exits older than the bound.
//!
//! A polled source brackets the moment of the report: it came after the start of the last read
//! that did not show it and before the answer of the first that did. The lag is the middle of that
//! bracket, off by at most half its width (logged as `error_bound_us`), so a poller kept from
//! starting reads (a busy node) widens the bracket instead of adding its delay to the lag; one
//! held up after an answer arrived adds half of that hold-up. A pushed source (a watch) counts to
//! the event's arrival, with no bound logged.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::sync::Notify;

use super::args::SourceKind;
use super::containers::ContainerInfo;
use super::metrics::ObserveMetrics;
use crate::event_stream::{EventBroadcaster, LifecycleKind, LifecycleRecord};

/// The annotation a mirror pod carries with its static pod's uid (which the cgroups are named by).
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A container exit the kernel reported and a source has yet to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingExit {
    pub container: ContainerInfo,
    pub exit_code: i32,
    /// `CLOCK_MONOTONIC` ns of the exit, the kernel's timestamp.
    pub kernel_time_ns: u64,
}

/// What of a pod tells whether the kubelet reported an exit: its uid, the static pod's uid a
/// mirror pod carries, and its container statuses' names, ids and terminated states. Decoding only
/// this from `/pods` skips the rest of each pod, which is most of the work of a read.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct PodReport {
    #[serde(default)]
    metadata: ReportedMetadata,
    #[serde(default)]
    status: Option<ReportedStatus>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct ReportedMetadata {
    uid: Option<String>,
    annotations: Option<MirrorAnnotation>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct MirrorAnnotation {
    #[serde(rename = "kubernetes.io/config.mirror")]
    static_pod_uid: Option<String>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(clippy::struct_field_names, reason = "the API's field names")]
struct ReportedStatus {
    container_statuses: Option<Vec<ReportedContainer>>,
    init_container_statuses: Option<Vec<ReportedContainer>>,
    ephemeral_container_statuses: Option<Vec<ReportedContainer>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReportedContainer {
    name: String,
    #[serde(rename = "containerID")]
    container_id: Option<String>,
    state: Option<ReportedState>,
    last_state: Option<ReportedState>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct ReportedState {
    terminated: Option<ReportedTermination>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct ReportedTermination {
    #[serde(rename = "containerID")]
    container_id: Option<String>,
}

impl From<&Pod> for PodReport {
    fn from(pod: &Pod) -> Self {
        let containers = |statuses: &Option<Vec<ContainerStatus>>| {
            statuses.as_ref().map(|statuses| {
                statuses
                    .iter()
                    .map(|c| ReportedContainer {
                        name: c.name.clone(),
                        container_id: c.container_id.clone(),
                        state: c.state.as_ref().map(|s| ReportedState {
                            terminated: s.terminated.as_ref().map(|t| ReportedTermination {
                                container_id: t.container_id.clone(),
                            }),
                        }),
                        last_state: c.last_state.as_ref().map(|s| ReportedState {
                            terminated: s.terminated.as_ref().map(|t| ReportedTermination {
                                container_id: t.container_id.clone(),
                            }),
                        }),
                    })
                    .collect()
            })
        };
        Self {
            metadata: ReportedMetadata {
                uid: pod.metadata.uid.clone(),
                annotations: Some(MirrorAnnotation {
                    static_pod_uid: pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(MIRROR_ANNOTATION))
                        .cloned(),
                }),
            },
            status: pod.status.as_ref().map(|status| ReportedStatus {
                container_statuses: containers(&status.container_statuses),
                init_container_statuses: containers(&status.init_container_statuses),
                ephemeral_container_statuses: containers(&status.ephemeral_container_statuses),
            }),
        }
    }
}

/// What a read of a source holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Every pod the source holds, read by a request started at `started_at_ns`
    /// (`CLOCK_MONOTONIC`): a `/pods` answer. A pod it lacks that had an exit before the request
    /// started is gone (a container only runs in a pod the kubelet holds).
    Complete { started_at_ns: u64 },
    /// Some of its pods: a watch event's, or none after a failed read.
    Partial,
}

/// When (`CLOCK_MONOTONIC` ns) a source's report of an exit appeared: at or before `by_ns`, and
/// for a polled source after `after_ns`.
#[derive(Clone, Copy, Debug)]
struct ReportBracket {
    after_ns: Option<u64>,
    by_ns: u64,
}

impl ReportBracket {
    /// A poll's answer at `seen_at_ns` brackets the report from the last read that did not show
    /// it; a pushed one is its arrival.
    fn of(waiting: &Waiting, listing: Listing, seen_at_ns: u64) -> Self {
        let after_ns = match listing {
            // The bound is the exit or a read's start, both before this answer; the `min` only
            // keeps the bracket well formed.
            Listing::Complete { .. } => Some(waiting.unreported_at_ns.min(seen_at_ns)),
            Listing::Partial => None,
        };
        Self {
            after_ns,
            by_ns: seen_at_ns,
        }
    }

    /// From the kernel's timestamp to the middle of the bracket (to its end for a pushed report).
    fn lag(self, kernel_time_ns: u64) -> Duration {
        let reported_at = self.after_ns.map_or(self.by_ns, |after| {
            after + self.by_ns.saturating_sub(after) / 2
        });
        Duration::from_nanos(reported_at.saturating_sub(kernel_time_ns))
    }

    /// How far the lag may be off: half the bracket; none for a pushed report.
    fn error_bound(self) -> Option<Duration> {
        self.after_ns
            .map(|after| Duration::from_nanos(self.by_ns.saturating_sub(after) / 2))
    }
}

/// Whether `pod` is `exit`'s pod: by uid, or for a mirror pod by its static pod's uid.
fn is_pod_of(pod: &PodReport, exit: &PendingExit) -> bool {
    let uid = exit.container.pod_uid.as_str();
    pod.metadata.uid.as_deref() == Some(uid)
        || pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.static_pod_uid.as_deref())
            == Some(uid)
}

/// Whether `pod` shows the kubelet reporting `exit`: the pod is the exit's ([`is_pod_of`]) and one
/// of its container statuses of that name either is the container, terminated, or has it as its
/// last, terminated, state (the kubelet restarted it).
pub fn reports_exit(pod: &PodReport, exit: &PendingExit) -> bool {
    if !is_pod_of(pod, exit) {
        return false;
    }
    let Some(status) = &pod.status else {
        return false;
    };
    let id = exit.container.id.as_str();
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter(|c| c.name == exit.container.container_name)
    .any(|c| shows_terminated(c, id))
}

fn shows_terminated(status: &ReportedContainer, id: &str) -> bool {
    let current = termination(status.state.as_ref()).is_some()
        && status.container_id.as_deref().is_some_and(|c| names(c, id));
    let last = termination(status.last_state.as_ref())
        .and_then(|t| t.container_id.as_deref())
        .is_some_and(|c| names(c, id));
    current || last
}

fn termination(state: Option<&ReportedState>) -> Option<&ReportedTermination> {
    state.and_then(|s| s.terminated.as_ref())
}

/// Whether a status's `containerID` (`<runtime>://<id>`) names container `id`.
fn names(container_id: &str, id: &str) -> bool {
    container_id
        .rsplit_once("://")
        .map_or(container_id, |(_, bare)| bare)
        == id
}

/// An exit a source has yet to show, and the latest moment it is known not to have shown it.
struct Waiting {
    exit: PendingExit,
    /// `CLOCK_MONOTONIC` ns: the kernel's timestamp, then the start of each complete listing that
    /// did not report the exit (the report came later than that).
    unreported_at_ns: u64,
}

/// One source's exits waiting to be reported, and what settles them.
pub struct LagTracker {
    source: SourceKind,
    pending: Mutex<Vec<Waiting>>,
    wake: Notify,
    give_up_after: Duration,
    metrics: ObserveMetrics,
    events: EventBroadcaster,
}

impl LagTracker {
    pub fn new(
        source: SourceKind,
        give_up_after: Duration,
        metrics: ObserveMetrics,
        events: EventBroadcaster,
    ) -> Self {
        Self {
            source,
            pending: Mutex::default(),
            wake: Notify::new(),
            give_up_after,
            metrics,
            events,
        }
    }

    pub fn source(&self) -> SourceKind {
        self.source
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts waiting for the kubelet to report `exit`.
    pub fn exited(&self, exit: PendingExit) {
        let count = {
            let mut pending = self.pending();
            pending.push(Waiting {
                unreported_at_ns: exit.kernel_time_ns,
                exit,
            });
            pending.len()
        };
        self.metrics.set_pending(self.source, count);
        self.wake.notify_one();
    }

    /// Counts a failed read of the source.
    pub fn count_error(&self) {
        self.metrics.source_error(self.source);
    }

    pub fn is_idle(&self) -> bool {
        self.pending().is_empty()
    }

    /// Returns once an exit waits (at once if one does).
    pub async fn wait_for_exits(&self) {
        loop {
            let notified = self.wake.notified();
            if !self.is_idle() {
                return;
            }
            notified.await;
        }
    }

    /// Settles the pending exits that `pods`, read at `seen_at_ns` (`CLOCK_MONOTONIC`), report;
    /// drops those whose pod a complete `listing` shows gone, and gives up on those older than the
    /// bound. Returns the settled exits with their lag.
    pub fn settle<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a PodReport>,
        listing: Listing,
        seen_at_ns: u64,
    ) -> Vec<(PendingExit, Duration)> {
        let pods: Vec<&PodReport> = pods.into_iter().collect();
        let pod_gone = |exit: &PendingExit| match listing {
            Listing::Complete { started_at_ns } => {
                started_at_ns > exit.kernel_time_ns && !pods.iter().any(|pod| is_pod_of(pod, exit))
            }
            Listing::Partial => false,
        };
        let (settled, gone, gave_up) = {
            let mut pending = self.pending();
            let mut settled = Vec::new();
            let mut gone = Vec::new();
            let mut gave_up = Vec::new();
            pending.retain_mut(|waiting| {
                let exit = &waiting.exit;
                if pods.iter().any(|pod| reports_exit(pod, exit)) {
                    settled.push((
                        exit.clone(),
                        ReportBracket::of(waiting, listing, seen_at_ns),
                    ));
                    false
                } else if pod_gone(exit) {
                    gone.push(exit.clone());
                    false
                } else if Duration::from_nanos(seen_at_ns.saturating_sub(exit.kernel_time_ns))
                    >= self.give_up_after
                {
                    gave_up.push(exit.clone());
                    false
                } else {
                    if let Listing::Complete { started_at_ns } = listing {
                        waiting.unreported_at_ns = waiting.unreported_at_ns.max(started_at_ns);
                    }
                    true
                }
            });
            self.metrics.set_pending(self.source, pending.len());
            (settled, gone, gave_up)
        };
        self.count_gone(&gone);
        for exit in &gave_up {
            tracing::warn!(source = self.source.label(), container = %exit.container.id,
                pod = %format_args!("{}/{}", exit.container.namespace, exit.container.pod_name),
                "the kubelet did not report a container exit within {:?}; giving up on it",
                self.give_up_after);
        }
        if !gave_up.is_empty() {
            self.metrics.gave_up(
                self.source,
                u64::try_from(gave_up.len()).unwrap_or(u64::MAX),
            );
        }
        settled
            .into_iter()
            .map(|(exit, bracket)| {
                let lag = bracket.lag(exit.kernel_time_ns);
                self.metrics.observe_lag(self.source, lag);
                // One line per measurement, so a run can be checked against an outside measurement.
                tracing::info!(source = self.source.label(), container_id = %exit.container.id,
                    pod = %format_args!("{}/{}", exit.container.namespace, exit.container.pod_name),
                    container = %exit.container.container_name,
                    lag_us = lag.as_micros(),
                    error_bound_us = bracket.error_bound().map(|bound| bound.as_micros()),
                    "observed kubelet status lag");
                self.events.publish(LifecycleRecord {
                    pod_uid: exit.container.pod_uid.clone(),
                    namespace: exit.container.namespace.clone(),
                    pod_name: exit.container.pod_name.clone(),
                    container_name: exit.container.container_name.clone(),
                    container_id: Some(exit.container.id.clone()),
                    kind: LifecycleKind::StatusUpdated,
                    exit_code: Some(exit.exit_code),
                    kernel_to_event: Some(lag),
                    observed_at: SystemTime::now(),
                });
                (exit, lag)
            })
            .collect()
    }

    /// Drops the pending exits of `pod`, which the source deleted (a watch's delete event).
    pub fn pod_deleted(&self, pod: &PodReport) {
        let gone: Vec<PendingExit> = {
            let mut pending = self.pending();
            let (gone, left): (Vec<Waiting>, Vec<Waiting>) = pending
                .drain(..)
                .partition(|waiting| is_pod_of(pod, &waiting.exit));
            *pending = left;
            self.metrics.set_pending(self.source, pending.len());
            gone.into_iter().map(|waiting| waiting.exit).collect()
        };
        self.count_gone(&gone);
    }

    /// Counts exits whose pod left the source before it reported them: nothing to measure.
    fn count_gone(&self, gone: &[PendingExit]) {
        for exit in gone {
            tracing::debug!(source = self.source.label(), container = %exit.container.id,
                pod = %format_args!("{}/{}", exit.container.namespace, exit.container.pod_name),
                "the pod left before the kubelet reported its container's exit; not measured");
        }
        if !gone.is_empty() {
            self.metrics
                .exits_of_removed_pods(self.source, u64::try_from(gone.len()).unwrap_or(u64::MAX));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::container::{ContainerId, PodUid};

    fn exit(id: &str) -> PendingExit {
        PendingExit {
            container: ContainerInfo {
                id: ContainerId::new(id),
                pod_uid: PodUid::new("uid-1"),
                namespace: "default".to_owned(),
                pod_name: "web".to_owned(),
                container_name: "main".to_owned(),
            },
            exit_code: 137,
            kernel_time_ns: 1_000_000_000,
        }
    }

    #[allow(
        clippy::needless_pass_by_value,
        reason = "callers build the value inline"
    )]
    fn pod(status: serde_json::Value) -> PodReport {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_running_container_is_not_reported() {
        let pod = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        }]}));
        assert!(!reports_exit(&pod, &exit("aaa")));
    }

    #[test]
    fn a_terminated_state_or_a_restart_reports_the_exit() {
        let terminated = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"terminated": {"exitCode": 137}}
        }]}));
        assert!(reports_exit(&terminated, &exit("aaa")));
        assert!(
            !reports_exit(&terminated, &exit("bbb")),
            "another container's id"
        );
        let restarted = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://bbb", "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 137, "containerID": "containerd://aaa"}}
        }]}));
        assert!(reports_exit(&restarted, &exit("aaa")));
        assert!(!reports_exit(&restarted, &exit("bbb")));
    }

    #[test]
    fn a_mirror_pod_answers_for_its_static_pod() {
        let mirror = |annotations: serde_json::Value| -> PodReport {
            serde_json::from_value(json!({
                "metadata": {"uid": "api-uid", "annotations": annotations},
                "status": {"initContainerStatuses": [{
                    "name": "main", "image": "busybox", "imageID": "", "ready": false,
                    "restartCount": 0, "containerID": "containerd://aaa",
                    "state": {"terminated": {"exitCode": 0}}
                }]}
            }))
            .unwrap()
        };
        assert!(!reports_exit(&mirror(json!({"a": "b"})), &exit("aaa")));
        let annotated = mirror(json!({"a": "b", MIRROR_ANNOTATION: "uid-1"}));
        assert!(reports_exit(&annotated, &exit("aaa")));
    }

    /// The apiserver source hands over whole pods: converted, they tell the same as the report
    /// decoded from the same JSON.
    #[test]
    fn a_whole_pod_converts_to_the_same_report() {
        let json = json!({
            "metadata": {"uid": "api-uid", "annotations": {MIRROR_ANNOTATION: "uid-1"}},
            "status": {"containerStatuses": [{
                "name": "main", "image": "busybox", "imageID": "", "ready": true,
                "restartCount": 1, "containerID": "containerd://bbb", "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 137, "containerID": "containerd://aaa"}}
            }]}
        });
        let whole: Pod = serde_json::from_value(json.clone()).unwrap();
        let decoded: PodReport = serde_json::from_value(json).unwrap();
        for id in ["aaa", "bbb", "ccc"] {
            assert_eq!(
                reports_exit(&PodReport::from(&whole), &exit(id)),
                reports_exit(&decoded, &exit(id)),
                "{id}"
            );
        }
        assert!(reports_exit(&decoded, &exit("aaa")));
    }

    /// A `kubelet_pods` tracker that gives up after a minute, and its metrics.
    fn kubelet_pods_tracker() -> (LagTracker, ObserveMetrics) {
        let metrics = ObserveMetrics::new(&[SourceKind::KubeletPods]).unwrap();
        let tracker = LagTracker::new(
            SourceKind::KubeletPods,
            Duration::from_mins(1),
            metrics.clone(),
            EventBroadcaster::default(),
        );
        (tracker, metrics)
    }

    #[tokio::test]
    async fn settling_observes_the_lag_and_old_exits_are_given_up() {
        let (tracker, metrics) = kubelet_pods_tracker();
        tracker.exited(exit("aaa"));
        tracker.exited(exit("ccc"));
        tracker.wait_for_exits().await;
        let reported = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"terminated": {"exitCode": 137}}
        }]}));
        let settled = tracker.settle([&reported], Listing::Partial, 1_025_000_000);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].1, Duration::from_millis(25));
        assert!(!tracker.is_idle());
        assert!(
            tracker
                .settle([], Listing::Partial, 61_000_000_000)
                .is_empty()
        );
        assert!(tracker.is_idle(), "ccc was given up on");
        let text = metrics.render().unwrap();
        assert!(text.contains(
            "ringlet_observed_kubelet_status_lag_seconds_count{source=\"kubelet_pods\"} 1"
        ));
        assert!(text.contains(
            "ringlet_observed_kubelet_status_lag_timeouts_total{source=\"kubelet_pods\"} 1"
        ));
    }

    /// A poll's report lies between the start of the last read that did not show it and the
    /// answer of the first that did: the lag is the middle. A read started before the exit tells
    /// nothing; with no read before the showing one the bracket starts at the exit.
    #[tokio::test]
    async fn a_polled_report_counts_to_the_middle_of_its_bracket() {
        let (tracker, _metrics) = kubelet_pods_tracker();
        let running = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"running": {}}
        }]}));
        let reported = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"terminated": {"exitCode": 137}}
        }]}));
        let read_started = |ms: u64| Listing::Complete {
            started_at_ns: ms * 1_000_000,
        };
        tracker.exited(exit("aaa"));
        tracker.settle([&running], read_started(990), 1_012_000_000);
        tracker.settle([&running], read_started(1_010), 1_011_000_000);
        tracker.settle([&running], read_started(1_004), 1_013_000_000);
        let settled = tracker.settle([&reported], read_started(1_011), 1_030_000_000);
        assert_eq!(settled.len(), 1);
        assert_eq!(
            settled[0].1,
            Duration::from_millis(20),
            "(1010 + 1030) / 2 - 1000"
        );

        tracker.exited(exit("aaa"));
        let settled = tracker.settle([&reported], read_started(999), 1_008_000_000);
        assert_eq!(
            settled[0].1,
            Duration::from_millis(4),
            "(1000 + 1008) / 2 - 1000"
        );

        tracker.exited(exit("aaa"));
        tracker.settle([&running], read_started(1_010), 1_011_000_000);
        let settled = tracker.settle([&reported], Listing::Partial, 1_030_000_000);
        assert_eq!(
            settled[0].1,
            Duration::from_millis(30),
            "a pushed report counts to its arrival"
        );
    }

    /// A complete listing without the exit's pod drops the exit, but only when the read started
    /// after the exit (an older answer may predate the pod); a partial one never does, and a
    /// deleted pod drops its exits.
    #[tokio::test]
    async fn an_exit_whose_pod_left_the_source_is_dropped_not_given_up() {
        let (tracker, metrics) = kubelet_pods_tracker();
        tracker.exited(exit("aaa"));
        let running = pod(json!({"containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://aaa", "state": {"running": {}}
        }]}));
        let before_the_exit = Listing::Complete {
            started_at_ns: 999_000_000,
        };
        let after_the_exit = Listing::Complete {
            started_at_ns: 1_001_000_000,
        };
        tracker.settle([], before_the_exit, 1_002_000_000);
        tracker.settle([], Listing::Partial, 1_002_000_000);
        tracker.settle([&running], after_the_exit, 1_002_000_000);
        assert!(!tracker.is_idle(), "the pod is still listed, or may be");
        tracker.settle([], after_the_exit, 1_003_000_000);
        assert!(tracker.is_idle());

        tracker.exited(exit("bbb"));
        tracker.pod_deleted(&running);
        assert!(tracker.is_idle());
        let text = metrics.render().unwrap();
        assert!(text.contains(
            "ringlet_observed_kubelet_exits_of_removed_pods_total{source=\"kubelet_pods\"} 2"
        ));
        assert!(text.contains(
            "ringlet_observed_kubelet_status_lag_timeouts_total{source=\"kubelet_pods\"} 0"
        ));
        assert!(text.contains("ringlet_observed_pending_exits{source=\"kubelet_pods\"} 0"));
    }
}
