//! Which thresholds are met and which node conditions hold (the kubelet's `thresholdsMet`,
//! `mergeThresholds`, `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`,
//! `nodeConditionsLastObservedAt`, `nodeConditionsObservedSince` and
//! `buildSignalToNodeReclaimFuncs` in `pkg/kubelet/eviction/helpers.go`), as pure functions of
//! observations and time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::signals::{PressureCondition, Signal, Threshold};

/// What was observed of one signal: how much is available out of the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

/// One observation per signal that could be read.
pub type Observations = BTreeMap<Signal, Observation>;

/// The thresholds whose signal is below their value; with `enforce_min_reclaim`, below their
/// value plus the minimum reclaim (a threshold met before stays met until that much is back).
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|threshold| {
            let Some(observed) = observations.get(&threshold.signal) else {
                return false;
            };
            let mut quantity = threshold.value.amount(observed.capacity);
            if enforce_min_reclaim && let Some(reclaim) = threshold.min_reclaim {
                quantity = quantity.saturating_add(reclaim.amount(observed.capacity));
            }
            quantity > observed.available
        })
        .cloned()
        .collect()
}

/// `a` followed by what `b` adds.
pub fn merge_thresholds(mut a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    for threshold in b {
        if !a.contains(&threshold) {
            a.push(threshold);
        }
    }
    a
}

/// When each met threshold was first seen met: kept from `last` when it was met before, `now`
/// otherwise.
pub fn first_observed_at(
    met: &[Threshold],
    last: &[(Threshold, Instant)],
    now: Instant,
) -> Vec<(Threshold, Instant)> {
    met.iter()
        .map(|threshold| {
            let at = last
                .iter()
                .find(|(seen, _)| seen == threshold)
                .map_or(now, |(_, at)| *at);
            (threshold.clone(), at)
        })
        .collect()
}

/// The thresholds met for at least their grace period (at once for hard ones).
pub fn met_grace_period(observed_at: &[(Threshold, Instant)], now: Instant) -> Vec<Threshold> {
    observed_at
        .iter()
        .filter(|(threshold, at)| now.saturating_duration_since(*at) >= threshold.grace_period)
        .map(|(threshold, _)| threshold.clone())
        .collect()
}

/// The conditions the met thresholds stand for.
pub fn node_conditions(met: &[Threshold]) -> BTreeSet<PressureCondition> {
    met.iter().map(|t| t.signal.condition()).collect()
}

/// When each condition was last observed: `now` for the current ones, the earlier time for the
/// others.
pub fn conditions_last_observed_at(
    current: &BTreeSet<PressureCondition>,
    last: &BTreeMap<PressureCondition, Instant>,
    now: Instant,
) -> BTreeMap<PressureCondition, Instant> {
    let mut observed = last.clone();
    for condition in current {
        observed.insert(*condition, now);
    }
    observed
}

/// The conditions observed within the transition period: a condition stays on that long after
/// its last observation, so the node does not flap.
pub fn conditions_observed_since(
    last_observed: &BTreeMap<PressureCondition, Instant>,
    period: Duration,
    now: Instant,
) -> BTreeSet<PressureCondition> {
    last_observed
        .iter()
        .filter(|(_, at)| now.saturating_duration_since(**at) < period)
        .map(|(condition, _)| *condition)
        .collect()
}

/// The threshold to act on first (the kubelet's `byEvictionPriority` and
/// `getReclaimableThreshold`): memory before everything else, then in configuration order.
pub fn reclaim_first(met: &[Threshold]) -> Option<&Threshold> {
    met.iter()
        .find(|t| t.signal == Signal::MemoryAvailable)
        .or_else(|| met.first())
}

/// Whether pressure on `signal` first reclaims node-level resources (dead containers, then
/// unused images) before pods are evicted. Memory and process ids have nothing to reclaim. With
/// a dedicated image filesystem the node filesystem has nothing either (images and containers'
/// writable layers live on the image filesystem); otherwise both filesystems are one device and
/// share the reclaim.
pub fn reclaims_node_level(signal: Signal, dedicated_image_fs: bool) -> bool {
    match signal {
        Signal::MemoryAvailable | Signal::PidAvailable => false,
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree => !dedicated_image_fs,
        Signal::ImageFsAvailable | Signal::ImageFsInodesFree => true,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::eviction::signals::ThresholdValue;

    fn mib(n: i64) -> i64 {
        n << 20
    }

    fn memory(threshold_mib: i64, grace: u64, min_reclaim_mib: Option<i64>) -> Threshold {
        Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity {
                amount: mib(threshold_mib),
                binary: true,
            },
            grace_period: Duration::from_secs(grace),
            min_reclaim: min_reclaim_mib.map(|m| ThresholdValue::Quantity {
                amount: mib(m),
                binary: true,
            }),
        }
    }

    fn observed(available_mib: i64) -> Observations {
        BTreeMap::from([(
            Signal::MemoryAvailable,
            Observation {
                available: mib(available_mib),
                capacity: mib(1000),
            },
        )])
    }

    #[test]
    fn a_threshold_is_met_below_its_value_and_resolved_only_past_the_minimum_reclaim() {
        let threshold = memory(100, 0, Some(50));
        let all = [threshold.clone()];
        assert!(thresholds_met(&all, &observed(100), false).is_empty());
        assert_eq!(thresholds_met(&all, &observed(99), false), all);
        // Back above the value but not above value + minimum reclaim: still unresolved.
        assert!(thresholds_met(&all, &observed(120), false).is_empty());
        assert_eq!(thresholds_met(&all, &observed(120), true), all);
        assert!(thresholds_met(&all, &observed(150), true).is_empty());
        assert!(thresholds_met(&all, &BTreeMap::new(), false).is_empty());
    }

    #[test]
    fn a_percentage_threshold_follows_the_capacity() {
        let threshold = Threshold {
            value: ThresholdValue::Percentage(0.2),
            ..memory(0, 0, None)
        };
        let all = [threshold];
        assert!(thresholds_met(&all, &observed(200), false).is_empty());
        assert_eq!(thresholds_met(&all, &observed(199), false).len(), 1);
    }

    #[test]
    fn a_soft_threshold_acts_only_after_its_grace_period() {
        let start = Instant::now();
        let soft = memory(100, 30, None);
        let hard = memory(50, 0, None);
        let met = [soft.clone(), hard.clone()];
        let first = first_observed_at(&met, &[], start);
        assert_eq!(met_grace_period(&first, start), std::slice::from_ref(&hard));
        let later = start + Duration::from_secs(30);
        let again = first_observed_at(&met, &first, later);
        assert_eq!(again[0].1, start, "the first observation is kept");
        assert_eq!(met_grace_period(&again, later), [soft.clone(), hard]);
        // Not met for a moment: the grace period starts over.
        let restarted = first_observed_at(std::slice::from_ref(&soft), &[], later);
        assert!(met_grace_period(&restarted, later).is_empty());
    }

    #[test]
    fn a_condition_stays_for_the_transition_period_after_its_last_observation() {
        let start = Instant::now();
        let period = Duration::from_mins(5);
        let current = node_conditions(&[memory(100, 0, None)]);
        assert_eq!(current, BTreeSet::from([PressureCondition::Memory]));
        let last = conditions_last_observed_at(&current, &BTreeMap::new(), start);
        let later = start + Duration::from_secs(299);
        let still = conditions_last_observed_at(&BTreeSet::new(), &last, later);
        assert_eq!(
            conditions_observed_since(&still, period, later),
            BTreeSet::from([PressureCondition::Memory])
        );
        let gone = start + period;
        assert!(conditions_observed_since(&still, period, gone).is_empty());
        // Observed again: the period counts from the new observation.
        let renewed = conditions_last_observed_at(&current, &still, later);
        assert_eq!(
            conditions_observed_since(&renewed, period, gone),
            BTreeSet::from([PressureCondition::Memory])
        );
    }

    #[test]
    fn memory_is_reclaimed_before_disk_and_merging_drops_duplicates() {
        let disk = Threshold {
            signal: Signal::NodeFsAvailable,
            ..memory(100, 0, None)
        };
        let mem = memory(100, 0, None);
        assert_eq!(reclaim_first(&[disk.clone(), mem.clone()]), Some(&mem));
        assert_eq!(reclaim_first(std::slice::from_ref(&disk)), Some(&disk));
        assert_eq!(
            merge_thresholds(vec![disk.clone()], vec![mem.clone(), disk.clone()]),
            [disk, mem]
        );
    }

    #[test]
    fn disk_signals_reclaim_on_the_filesystem_that_holds_images() {
        for dedicated in [false, true] {
            assert!(!reclaims_node_level(Signal::MemoryAvailable, dedicated));
            assert!(!reclaims_node_level(Signal::PidAvailable, dedicated));
            assert!(reclaims_node_level(Signal::ImageFsAvailable, dedicated));
            assert!(reclaims_node_level(Signal::ImageFsInodesFree, dedicated));
        }
        assert!(reclaims_node_level(Signal::NodeFsAvailable, false));
        assert!(reclaims_node_level(Signal::NodeFsInodesFree, false));
        assert!(!reclaims_node_level(Signal::NodeFsAvailable, true));
        assert!(!reclaims_node_level(Signal::NodeFsInodesFree, true));
    }
}
