//! Eviction signals and thresholds (the kubelet's `pkg/kubelet/eviction/api` types and
//! `ParseThresholdConfig` in `pkg/kubelet/eviction/helpers.go`): the signals, the node condition
//! and the resource each one stands for, and how `evictionHard`, `evictionSoft`,
//! `evictionSoftGracePeriod` and `evictionMinimumReclaim` become thresholds.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Billionths in one base unit (`cm::parse_quantity` returns billionths).
const NANOS: i128 = 1_000_000_000;

/// What the eviction manager observes on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

/// A node condition the eviction manager owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PressureCondition {
    Memory,
    Disk,
    Pid,
}

impl PressureCondition {
    /// The condition type on the Node.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "MemoryPressure",
            Self::Disk => "DiskPressure",
            Self::Pid => "PIDPressure",
        }
    }
}

impl Signal {
    pub const ALL: [Self; 6] = [
        Self::MemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// The signal named `name` as in the configuration (`memory.available`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|signal| signal.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The node condition a met threshold on this signal sets.
    pub fn condition(self) -> PressureCondition {
        match self {
            Self::MemoryAvailable => PressureCondition::Memory,
            Self::PidAvailable => PressureCondition::Pid,
            _ => PressureCondition::Disk,
        }
    }

    /// The resource reclaimed when the signal is under pressure, as the eviction message names it.
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree | Self::ImageFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }

    /// Whether quantities of the signal are bytes (written in binary units) rather than counts.
    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            Self::MemoryAvailable | Self::NodeFsAvailable | Self::ImageFsAvailable
        )
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold's amount: a quantity, or a share of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// In the signal's base unit; `binary` when it was written with a binary suffix (how
    /// apimachinery prints it back).
    Quantity { amount: i64, binary: bool },
    /// Between 0 and 1.
    Percentage(f64),
}

impl ThresholdValue {
    /// The amount against a capacity (the kubelet's `GetThresholdQuantity`).
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            Self::Quantity { amount, .. } => amount,
            // Truncated, as the kubelet's int64 conversion; capacities are far below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            Self::Percentage(share) => (capacity as f64 * share) as i64,
        }
    }

    /// Whether the amount prints in binary units (a percentage always does, as in the kubelet).
    pub fn is_binary(self) -> bool {
        match self {
            Self::Quantity { binary, .. } => binary,
            Self::Percentage(_) => true,
        }
    }
}

/// One eviction threshold: met while the signal's available amount is below the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// Zero for a hard threshold; how long a soft one must be met before it evicts.
    pub grace_period: Duration,
    /// What must be reclaimed beyond the threshold before it counts as resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// The kubelet's `isHardEvictionThreshold`.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// The eviction settings as configured, before parsing into thresholds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThresholdConfig<'a> {
    pub hard: Option<&'a BTreeMap<String, String>>,
    pub soft: Option<&'a BTreeMap<String, String>>,
    pub soft_grace_period: Option<&'a BTreeMap<String, Duration>>,
    pub minimum_reclaim: Option<&'a BTreeMap<String, String>>,
}

/// Parses the configuration into thresholds (hard ones first), or every problem found, each naming
/// its field.
pub fn parse_thresholds(config: &ThresholdConfig<'_>) -> Result<Vec<Threshold>, Vec<String>> {
    let empty = BTreeMap::new();
    let mut problems = Vec::new();
    let signal_of = |field: &str, name: &str, problems: &mut Vec<String>| {
        let signal = Signal::parse(name);
        if signal.is_none() {
            problems.push(format!("{field}: unsupported eviction signal {name}"));
        }
        signal
    };
    let mut thresholds = Vec::new();
    for (name, text) in config.hard.unwrap_or(&empty) {
        let Some(signal) = signal_of("evictionHard", name, &mut problems) else {
            continue;
        };
        match parse_threshold_value(signal, text) {
            Ok(Some(value)) => thresholds.push(Threshold {
                signal,
                value,
                grace_period: Duration::ZERO,
                min_reclaim: None,
            }),
            Ok(None) => {}
            Err(problem) => problems.push(format!("evictionHard: {problem}")),
        }
    }
    let grace = config.soft_grace_period.cloned().unwrap_or_default();
    for name in grace.keys() {
        signal_of("evictionSoftGracePeriod", name, &mut problems);
    }
    for (name, text) in config.soft.unwrap_or(&empty) {
        let Some(signal) = signal_of("evictionSoft", name, &mut problems) else {
            continue;
        };
        let Some(grace_period) = grace.get(name).copied() else {
            problems.push(format!(
                "evictionSoftGracePeriod: grace period must be specified for the soft eviction \
                 threshold {name}"
            ));
            continue;
        };
        match parse_threshold_value(signal, text) {
            Ok(Some(value)) => thresholds.push(Threshold {
                signal,
                value,
                grace_period,
                min_reclaim: None,
            }),
            Ok(None) => {}
            Err(problem) => problems.push(format!("evictionSoft: {problem}")),
        }
    }
    for (name, text) in config.minimum_reclaim.unwrap_or(&empty) {
        let Some(signal) = signal_of("evictionMinimumReclaim", name, &mut problems) else {
            continue;
        };
        match parse_min_reclaim(signal, text) {
            Ok(value) => {
                for threshold in thresholds.iter_mut().filter(|t| t.signal == signal) {
                    threshold.min_reclaim = Some(value);
                }
            }
            Err(problem) => problems.push(format!("evictionMinimumReclaim: {problem}")),
        }
    }
    if problems.is_empty() {
        Ok(thresholds)
    } else {
        Err(problems)
    }
}

/// A threshold's value; `None` for `0%` and `100%`, which the kubelet takes as "no threshold".
fn parse_threshold_value(signal: Signal, text: &str) -> Result<Option<ThresholdValue>, String> {
    if let Some(percent) = text.strip_suffix('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let share = parse_percentage(signal, text, percent)?;
        return Ok(Some(ThresholdValue::Percentage(share)));
    }
    let value = parse_amount(signal, text)?;
    match value {
        ThresholdValue::Quantity { amount, .. } if amount <= 0 => Err(format!(
            "eviction threshold {signal} must be positive: {text}"
        )),
        value => Ok(Some(value)),
    }
}

fn parse_min_reclaim(signal: Signal, text: &str) -> Result<ThresholdValue, String> {
    if let Some(percent) = text.strip_suffix('%') {
        return parse_percentage(signal, text, percent).map(ThresholdValue::Percentage);
    }
    match parse_amount(signal, text)? {
        ThresholdValue::Quantity { amount, .. } if amount < 0 => Err(format!(
            "negative eviction minimum reclaim specified for {signal}"
        )),
        value => Ok(value),
    }
}

fn parse_percentage(signal: Signal, text: &str, percent: &str) -> Result<f64, String> {
    let value: f64 = percent
        .parse()
        .map_err(|_| format!("{signal}: {text:?} is not a percentage"))?;
    if !(0.0..=100.0).contains(&value) {
        return Err(format!(
            "eviction percentage threshold {signal} must be between 0% and 100%: {text}"
        ));
    }
    Ok(value / 100.0)
}

fn parse_amount(signal: Signal, text: &str) -> Result<ThresholdValue, String> {
    let nanos = crate::cm::parse_quantity(text)
        .map_err(|_| format!("{signal}: {text:?} is not a quantity or a percentage"))?;
    // Rounded up to whole units, as apimachinery's `Value()`.
    let units = (nanos + NANOS - 1).div_euclid(NANOS);
    let amount = i64::try_from(units).map_err(|_| format!("{signal}: {text:?} is too large"))?;
    // apimachinery keeps a binary suffix binary and writes everything else in decimal units.
    Ok(ThresholdValue::Quantity {
        amount,
        binary: text.ends_with('i'),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn hard_soft_grace_and_min_reclaim_parse_into_thresholds() {
        let hard = map(&[("memory.available", "100Mi"), ("nodefs.available", "10%")]);
        let soft = map(&[("memory.available", "1.5Gi")]);
        let grace = BTreeMap::from([("memory.available".to_owned(), Duration::from_secs(90))]);
        let reclaim = map(&[("memory.available", "500Mi")]);
        let thresholds = parse_thresholds(&ThresholdConfig {
            hard: Some(&hard),
            soft: Some(&soft),
            soft_grace_period: Some(&grace),
            minimum_reclaim: Some(&reclaim),
        })
        .unwrap();
        assert_eq!(thresholds.len(), 3);
        assert_eq!(thresholds[0].signal, Signal::MemoryAvailable);
        assert_eq!(
            thresholds[0].value,
            ThresholdValue::Quantity {
                amount: 100 << 20,
                binary: true
            }
        );
        assert!(thresholds[0].is_hard());
        assert_eq!(
            thresholds[0].min_reclaim,
            Some(ThresholdValue::Quantity {
                amount: 500 << 20,
                binary: true
            })
        );
        assert_eq!(thresholds[1].value, ThresholdValue::Percentage(0.1));
        assert_eq!(thresholds[1].min_reclaim, None);
        assert_eq!(thresholds[2].grace_period, Duration::from_secs(90));
        assert!(!thresholds[2].is_hard());
        assert_eq!(thresholds[2].value.amount(0), 1_610_612_736);
    }

    #[test]
    fn zero_and_hundred_percent_mean_no_threshold() {
        let hard = map(&[("nodefs.available", "0%"), ("imagefs.available", "100%")]);
        let parsed = parse_thresholds(&ThresholdConfig {
            hard: Some(&hard),
            ..ThresholdConfig::default()
        });
        assert_eq!(parsed, Ok(Vec::new()));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let hard = map(&[("memory.free", "1Gi"), ("nodefs.available", "150%")]);
        let soft = map(&[("memory.available", "1Gi"), ("pid.available", "0")]);
        let grace = BTreeMap::from([("pid.available".to_owned(), Duration::from_secs(1))]);
        let problems = parse_thresholds(&ThresholdConfig {
            hard: Some(&hard),
            soft: Some(&soft),
            soft_grace_period: Some(&grace),
            minimum_reclaim: Some(&map(&[("memory.available", "-1Mi")])),
        })
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "evictionHard: unsupported eviction signal memory.free",
                "evictionHard: eviction percentage threshold nodefs.available must be between 0% \
                 and 100%: 150%",
                "evictionSoftGracePeriod: grace period must be specified for the soft eviction \
                 threshold memory.available",
                "evictionSoft: eviction threshold pid.available must be positive: 0",
                "evictionMinimumReclaim: negative eviction minimum reclaim specified for \
                 memory.available",
            ]
        );
    }

    #[test]
    fn percentages_scale_with_capacity_and_decimal_quantities_stay_decimal() {
        assert_eq!(ThresholdValue::Percentage(0.1).amount(1000), 100);
        let ThresholdValue::Quantity { binary, .. } =
            parse_amount(Signal::MemoryAvailable, "500M").unwrap()
        else {
            panic!("a quantity")
        };
        assert!(!binary);
    }
}
