//! A pod's `spec.activeDeadlineSeconds` (the kubelet's `pkg/kubelet/active_deadline.go`): once the
//! pod has been active on the node that long, counted from its status `startTime`, it is stopped
//! and Failed with reason `DeadlineExceeded`. The deadline may be set or shortened on a running
//! pod, so it is judged on every sync, and the sync before it asks for one at the deadline.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};

/// The pod status reason, and the event's.
pub const REASON: &str = "DeadlineExceeded";
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// How long the pod may stay active from `now` (Unix time): zero once its deadline has passed;
/// `None` without a deadline, or before it has a start time.
pub fn remaining(pod: &Pod, status: &ApiPodStatus, now: Duration) -> Option<Duration> {
    let deadline = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = status.start_time.as_ref()?.0.as_second();
    let end = u64::try_from(start.saturating_add(deadline)).unwrap_or(0);
    Some(Duration::from_secs(end).saturating_sub(now))
}

/// The current wall-clock time as a Unix duration.
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `status` failed for the deadline (the kubelet's `ShouldEvict` override of the generated
/// status) when the pod is past it; returns whether it is. A pod that already succeeded stays so.
pub fn enforce(pod: &Pod, status: &mut ApiPodStatus, now: Duration) -> bool {
    if status.phase.as_deref() == Some("Succeeded")
        || remaining(pod, status, now) != Some(Duration::ZERO)
    {
        return false;
    }
    status.phase = Some("Failed".to_owned());
    status.reason = Some(REASON.to_owned());
    status.message = Some(MESSAGE.to_owned());
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pod(deadline: Option<i64>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                active_deadline_seconds: deadline,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn started_at(secs: i64) -> ApiPodStatus {
        ApiPodStatus {
            phase: Some("Running".to_owned()),
            start_time: Some(Time(Timestamp::from_second(secs).unwrap())),
            ..ApiPodStatus::default()
        }
    }

    #[test]
    fn the_deadline_counts_from_the_start_time() {
        let status = started_at(1_000);
        let at = Duration::from_millis;
        assert_eq!(
            remaining(&pod(Some(5)), &status, at(1_002_500)),
            Some(at(2_500))
        );
        assert_eq!(
            remaining(&pod(Some(5)), &status, at(1_005_000)),
            Some(Duration::ZERO)
        );
        assert_eq!(
            remaining(&pod(Some(5)), &status, at(2_000_000)),
            Some(Duration::ZERO)
        );
        assert_eq!(remaining(&pod(None), &status, at(2_000_000)), None);
        assert_eq!(
            remaining(&pod(Some(5)), &ApiPodStatus::default(), at(2_000_000)),
            None,
            "not started yet"
        );
    }

    #[test]
    fn a_pod_past_its_deadline_fails_with_the_kubelets_reason_and_message() {
        let mut status = started_at(1_000);
        assert!(!enforce(
            &pod(Some(5)),
            &mut status,
            Duration::from_secs(1_004)
        ));
        assert_eq!(status, started_at(1_000));
        assert!(enforce(
            &pod(Some(5)),
            &mut status,
            Duration::from_secs(1_005)
        ));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was active on the node longer than the specified deadline")
        );
        let mut succeeded = ApiPodStatus {
            phase: Some("Succeeded".to_owned()),
            ..started_at(1_000)
        };
        assert!(!enforce(
            &pod(Some(5)),
            &mut succeeded,
            Duration::from_secs(1_005)
        ));
        assert_eq!(succeeded.phase.as_deref(), Some("Succeeded"));
    }
}
