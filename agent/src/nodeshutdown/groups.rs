//! Which pods stop together and for how long (the kubelet's `migrateConfig` and
//! `groupByPriority` in `pkg/kubelet/nodeshutdown`): the configured periods sorted by priority, and
//! every active pod placed in the group of the highest priority not above its own.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The priority of a pod whose priority class is not set and no class is the default
/// (`scheduling.DefaultPriorityWhenNoDefaultClassExists`).
const DEFAULT_PRIORITY: i32 = 0;
/// The priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One entry of `shutdownGracePeriodByPodPriority`: pods of at least `priority` (and below the
/// next entry's) get `shutdown_grace_period_seconds` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownGracePeriodByPodPriority {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The groups of a configuration, lowest priority first: `by_priority` when it has entries, else
/// the two of `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` (the ordinary pods get
/// the difference, the critical ones the rest). Empty when graceful shutdown is off.
pub fn shutdown_periods(
    grace_period: Duration,
    grace_period_critical_pods: Duration,
    by_priority: &[ShutdownGracePeriodByPodPriority],
) -> Vec<ShutdownGracePeriodByPodPriority> {
    let mut periods = if by_priority.is_empty() {
        migrate_config(grace_period, grace_period_critical_pods)
    } else {
        by_priority.to_vec()
    };
    periods.sort_by_key(|p| p.priority);
    periods
}

fn migrate_config(
    grace_period: Duration,
    grace_period_critical_pods: Duration,
) -> Vec<ShutdownGracePeriodByPodPriority> {
    if grace_period.is_zero() {
        return Vec::new();
    }
    let Some(ordinary) = grace_period.checked_sub(grace_period_critical_pods) else {
        return Vec::new();
    };
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    vec![
        ShutdownGracePeriodByPodPriority {
            priority: DEFAULT_PRIORITY,
            shutdown_grace_period_seconds: seconds(ordinary),
        },
        ShutdownGracePeriodByPodPriority {
            priority: SYSTEM_CRITICAL_PRIORITY,
            shutdown_grace_period_seconds: seconds(grace_period_critical_pods),
        },
    ]
}

/// The pods of one priority range and the time they get.
#[derive(Debug, Clone)]
pub struct ShutdownGroup {
    pub period: ShutdownGracePeriodByPodPriority,
    pub pods: Vec<Arc<Pod>>,
}

impl ShutdownGroup {
    /// How long to wait for the group before going on with the next.
    pub fn wait(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.period.shutdown_grace_period_seconds).unwrap_or(0))
    }

    /// The grace period `pod` is stopped with: the group's, or the pod's own when shorter.
    pub fn grace_period_seconds(&self, pod: &Pod) -> i64 {
        let group = self.period.shutdown_grace_period_seconds;
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map_or(group, |own| own.min(group))
    }
}

/// Places every pod in the group of the highest priority at or below its own; pods below the
/// lowest go to the lowest. `periods` must be sorted by priority, lowest first.
pub fn group_by_priority(
    periods: &[ShutdownGracePeriodByPodPriority],
    pods: Vec<Arc<Pod>>,
) -> Vec<ShutdownGroup> {
    let mut groups: Vec<ShutdownGroup> = periods
        .iter()
        .map(|&period| ShutdownGroup {
            period,
            pods: Vec::new(),
        })
        .collect();
    for pod in pods {
        let priority = pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .unwrap_or_default();
        let above = groups.partition_point(|g| g.period.priority <= priority);
        if let Some(group) = groups.get_mut(above.saturating_sub(1)) {
            group.pods.push(pod);
        }
    }
    groups
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn period(priority: i32, seconds: i64) -> ShutdownGracePeriodByPodPriority {
        ShutdownGracePeriodByPodPriority {
            priority,
            shutdown_grace_period_seconds: seconds,
        }
    }

    fn pod(name: &str, priority: Option<i32>) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                priority,
                ..PodSpec::default()
            }),
            ..Pod::default()
        })
    }

    fn names(group: &ShutdownGroup) -> Vec<&str> {
        group
            .pods
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn the_two_durations_become_an_ordinary_and_a_critical_group() {
        let periods = shutdown_periods(Duration::from_secs(30), Duration::from_secs(10), &[]);
        assert_eq!(
            periods,
            [period(0, 20), period(2_000_000_000, 10)],
            "ordinary pods get what the critical ones leave"
        );
        assert_eq!(
            shutdown_periods(Duration::from_secs(30), Duration::ZERO, &[]),
            [period(0, 30), period(2_000_000_000, 0)]
        );
        assert!(shutdown_periods(Duration::ZERO, Duration::ZERO, &[]).is_empty());
        assert!(
            shutdown_periods(Duration::from_secs(5), Duration::from_secs(10), &[]).is_empty(),
            "more for critical pods than in all is no configuration"
        );
    }

    #[test]
    fn by_priority_entries_are_used_as_given_sorted_lowest_first() {
        let periods = shutdown_periods(
            Duration::ZERO,
            Duration::ZERO,
            &[period(100_000, 5), period(0, 20), period(10_000, 10)],
        );
        assert_eq!(
            periods,
            [period(0, 20), period(10_000, 10), period(100_000, 5)]
        );
    }

    #[test]
    fn pods_go_to_the_highest_group_at_or_below_their_priority() {
        let periods = [period(1, 10), period(10_000, 20), period(100_000, 30)];
        let groups = group_by_priority(
            &periods,
            vec![
                pod("none", None),
                pod("negative", Some(-5)),
                pod("one", Some(1)),
                pod("between", Some(9_999)),
                pod("boundary", Some(10_000)),
                pod("above-all", Some(2_000_001_000)),
            ],
        );
        assert_eq!(groups.len(), 3);
        assert_eq!(names(&groups[0]), ["none", "negative", "one", "between"]);
        assert_eq!(names(&groups[1]), ["boundary"]);
        assert_eq!(names(&groups[2]), ["above-all"]);
    }

    #[test]
    fn the_critical_group_takes_system_critical_pods_and_nothing_else() {
        let periods = shutdown_periods(Duration::from_secs(20), Duration::from_secs(8), &[]);
        let groups = group_by_priority(
            &periods,
            vec![
                pod("critical", Some(2_000_000_000)),
                pod("node-critical", Some(2_000_001_000)),
                pod("high", Some(1_999_999_999)),
                pod("plain", None),
            ],
        );
        assert_eq!(names(&groups[0]), ["high", "plain"]);
        assert_eq!(groups[0].wait(), Duration::from_secs(12));
        assert_eq!(names(&groups[1]), ["critical", "node-critical"]);
        assert_eq!(groups[1].wait(), Duration::from_secs(8));
    }

    #[test]
    fn a_pod_keeps_its_own_grace_period_when_shorter_than_the_groups() {
        let group = ShutdownGroup {
            period: period(0, 20),
            pods: Vec::new(),
        };
        let mut short = Pod::clone(&pod("short", None));
        short
            .spec
            .as_mut()
            .unwrap()
            .termination_grace_period_seconds = Some(3);
        assert_eq!(group.grace_period_seconds(&short), 3);
        let mut long = short.clone();
        long.spec.as_mut().unwrap().termination_grace_period_seconds = Some(60);
        assert_eq!(group.grace_period_seconds(&long), 20);
        assert_eq!(group.grace_period_seconds(&pod("unset", None)), 20);
    }
}
