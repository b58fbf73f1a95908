//! The order pods are evicted in (the kubelet's `rankMemoryPressure`, `rankDiskPressureFunc` and
//! `rankPIDPressure` in `pkg/kubelet/eviction/helpers.go`): pods without stats first, then pods
//! using more than they request, then lower priority, then the largest use above the request.

use std::cmp::Ordering;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::signals::Signal;
use crate::lifecycle::pod_requests;

/// What a pod uses, from the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Sum of the containers' working sets, in bytes.
    pub memory: i64,
    /// Bytes of the node's filesystem the pod takes (logs and its own files).
    pub ephemeral_storage: i64,
    pub inodes: i64,
    /// Processes in the pod's cgroup.
    pub processes: i64,
}

/// A pod that may be evicted, with its usage (`None` when the stats had nothing for it).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub pod: Arc<Pod>,
    pub usage: Option<PodUsage>,
}

/// The pod's priority (`spec.priority`, 0 when unset).
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// What the pod requests of the resource a signal reclaims (0 for inodes and processes).
fn request(pod: &Pod, signal: Signal) -> i64 {
    let resource = match signal.resource() {
        "memory" => "memory",
        "ephemeral-storage" => "ephemeral-storage",
        _ => return 0,
    };
    pod_requests(pod).get(resource).map_or(0, |nanos| {
        i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX)
    })
}

/// The pod's use of what the signal reclaims.
fn used(usage: &PodUsage, signal: Signal) -> i64 {
    match signal {
        Signal::MemoryAvailable => usage.memory,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => usage.ephemeral_storage,
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => usage.inodes,
        Signal::PidAvailable => usage.processes,
    }
}

/// Sorts `candidates` in eviction order for `signal`.
pub fn rank(signal: Signal, candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| compare(signal, a, b));
}

fn compare(signal: Signal, a: &Candidate, b: &Candidate) -> Ordering {
    let (Some(usage_a), Some(usage_b)) = (&a.usage, &b.usage) else {
        // A pod the stats know nothing about goes first (the kubelet cannot tell it is harmless).
        return b.usage.is_none().cmp(&a.usage.is_none());
    };
    let above = |c: &Candidate, usage: &PodUsage| used(usage, signal) - request(&c.pod, signal);
    let (above_a, above_b) = (above(a, usage_a), above(b, usage_b));
    let exceeds = || (above_b > 0).cmp(&(above_a > 0));
    let by_priority = || priority(&a.pod).cmp(&priority(&b.pod));
    match signal {
        // Processes have no request: priority, then the most processes.
        Signal::PidAvailable => by_priority().then_with(|| above_b.cmp(&above_a)),
        _ => exceeds()
            .then_with(by_priority)
            .then_with(|| above_b.cmp(&above_a)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    const MI: i64 = 1 << 20;

    fn pod(name: &str, memory_request: Option<&str>, priority: i32) -> Arc<Pod> {
        let requests =
            memory_request.map(|m| BTreeMap::from([("memory".to_owned(), Quantity(m.to_owned()))]));
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                priority: Some(priority),
                containers: vec![Container {
                    name: "c".to_owned(),
                    resources: Some(ResourceRequirements {
                        requests,
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        })
    }

    fn candidate(pod: Arc<Pod>, memory_mi: Option<i64>) -> Candidate {
        Candidate {
            pod,
            usage: memory_mi.map(|m| PodUsage {
                memory: m * MI,
                processes: m,
                ..PodUsage::default()
            }),
        }
    }

    fn names(candidates: &[Candidate]) -> Vec<&str> {
        candidates
            .iter()
            .map(|c| c.pod.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn memory_ranks_by_exceeding_requests_then_priority_then_usage_above_requests() {
        let mut candidates = vec![
            // Uses a lot but within its request: last.
            candidate(pod("big-guaranteed", Some("1Gi"), 0), Some(900)),
            // Exceeds, but with a higher priority than the others that exceed.
            candidate(pod("important", Some("10Mi"), 1000), Some(500)),
            candidate(pod("best-effort-small", None, 0), Some(5)),
            candidate(pod("burstable-over", Some("100Mi"), 0), Some(400)),
            candidate(pod("no-stats", Some("1Gi"), 2000), None),
        ];
        rank(Signal::MemoryAvailable, &mut candidates);
        assert_eq!(
            names(&candidates),
            [
                "no-stats",
                "burstable-over",
                "best-effort-small",
                "important",
                "big-guaranteed"
            ]
        );
    }

    #[test]
    fn a_best_effort_pod_goes_before_a_hog_within_its_request() {
        let mut candidates = vec![
            candidate(pod("hog", Some("1Gi"), 0), Some(600)),
            candidate(pod("best-effort", None, 0), Some(300)),
        ];
        rank(Signal::MemoryAvailable, &mut candidates);
        assert_eq!(names(&candidates), ["best-effort", "hog"]);
    }

    #[test]
    fn pids_rank_by_priority_then_process_count() {
        let mut candidates = vec![
            candidate(pod("few", None, 0), Some(2)),
            candidate(pod("many-important", None, 10), Some(500)),
            candidate(pod("many", None, 0), Some(100)),
        ];
        rank(Signal::PidAvailable, &mut candidates);
        assert_eq!(names(&candidates), ["many", "few", "many-important"]);
    }
}
