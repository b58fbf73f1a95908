//! The `KubeletConfiguration` fields of node-pressure eviction besides `evictionHard` (which lives
//! with the node section, since it also comes off allocatable): `evictionSoft`,
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`, `evictionPressureTransitionPeriod` and
//! `evictionMaxPodGracePeriod`, with the kubelet's defaults and `ParseThresholdConfig`'s checks.
//! What they do is `crate::eviction`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::configz::go_duration;
use super::duration::parse_duration;
use super::file::FieldReader;
use crate::eviction::{Signal, Threshold, ThresholdConfig, parse_thresholds};

/// The kubelet's `evictionPressureTransitionPeriod` default.
const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_mins(5);

/// The eviction settings, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionConfig {
    /// `evictionSoft`: signal -> threshold, acted on after its grace period.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal -> how long a soft threshold must hold.
    pub soft_grace_period: BTreeMap<String, Duration>,
    /// `evictionMinimumReclaim`: signal -> what must be reclaimed beyond the threshold.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (default 5m): how long a pressure condition stays after
    /// its threshold was last met.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (default 0): the longest grace period of a pod evicted for a
    /// soft threshold.
    pub max_pod_grace_period: i32,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
            max_pod_grace_period: 0,
        }
    }
}

impl EvictionConfig {
    /// The thresholds of `hard` (`evictionHard`) and these settings; validated when the
    /// configuration was built, so this fails only for settings made by hand.
    pub fn thresholds(
        &self,
        hard: &BTreeMap<String, String>,
    ) -> Result<Vec<Threshold>, Vec<String>> {
        parse_thresholds(&ThresholdConfig {
            hard: Some(hard),
            soft: Some(&self.soft),
            soft_grace_period: Some(&self.soft_grace_period),
            minimum_reclaim: Some(&self.minimum_reclaim),
        })
    }

    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        let grace: BTreeMap<&String, String> = self
            .soft_grace_period
            .iter()
            .map(|(signal, period)| (signal, go_duration(*period)))
            .collect();
        [
            ("evictionSoft", json!(self.soft)),
            ("evictionSoftGracePeriod", json!(grace)),
            ("evictionMinimumReclaim", json!(self.minimum_reclaim)),
            (
                "evictionPressureTransitionPeriod",
                json!(go_duration(self.pressure_transition_period)),
            ),
            (
                "evictionMaxPodGracePeriod",
                json!(self.max_pod_grace_period),
            ),
        ]
        .into_iter()
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone)]
pub(super) struct RawEvictionConfig {
    pub soft: Option<BTreeMap<String, String>>,
    pub soft_grace_period: Option<BTreeMap<String, String>>,
    pub minimum_reclaim: Option<BTreeMap<String, String>>,
    pub pressure_transition_period: Option<Duration>,
    pub max_pod_grace_period: Option<i64>,
}

impl RawEvictionConfig {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "evictionSoft" => self.soft = reader.string_map(),
            "evictionSoftGracePeriod" => self.soft_grace_period = reader.string_map(),
            "evictionMinimumReclaim" => self.minimum_reclaim = reader.string_map(),
            "evictionPressureTransitionPeriod" => {
                self.pressure_transition_period = reader.duration();
            }
            "evictionMaxPodGracePeriod" => self.max_pod_grace_period = reader.int(),
            _ => return false,
        }
        true
    }
}

/// Parses `--eviction-hard`/`--eviction-soft`: `signal<value`, comma-separated.
pub(super) fn parse_threshold_flag(text: &str) -> Result<BTreeMap<String, String>, String> {
    parse_pairs(text, '<', "<signal><<value>")
}

/// Parses `--eviction-soft-grace-period`/`--eviction-minimum-reclaim`: `signal=value`,
/// comma-separated.
pub(super) fn parse_signal_map_flag(text: &str) -> Result<BTreeMap<String, String>, String> {
    parse_pairs(text, '=', "<signal>=<value>")
}

fn parse_pairs(
    text: &str,
    separator: char,
    expected: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for statement in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (signal, value) = statement
            .split_once(separator)
            .ok_or_else(|| format!("{statement:?} must be {expected}"))?;
        map.insert(signal.trim().to_owned(), value.trim().to_owned());
    }
    Ok(map)
}

/// Applies the defaults and validates `raw` with `hard` (`evictionHard`, whose values the node
/// section checks), appending every problem.
pub(super) fn build(
    raw: RawEvictionConfig,
    hard: &BTreeMap<String, String>,
    problems: &mut Vec<String>,
) -> EvictionConfig {
    for signal in hard.keys() {
        if Signal::parse(signal).is_none() {
            problems.push(format!(
                "evictionHard (--eviction-hard): unsupported eviction signal {signal}"
            ));
        }
    }
    let mut soft_grace_period = BTreeMap::new();
    for (signal, text) in raw.soft_grace_period.unwrap_or_default() {
        match parse_duration(&text) {
            Ok(period) => {
                soft_grace_period.insert(signal, period);
            }
            Err(err) => problems.push(format!("evictionSoftGracePeriod: {signal}: {err}")),
        }
    }
    let max_pod_grace_period = match raw.max_pod_grace_period {
        None => 0,
        Some(n) => i32::try_from(n)
            .ok()
            .filter(|n| *n >= 0)
            .unwrap_or_else(|| {
                problems.push(format!(
                    "evictionMaxPodGracePeriod (--eviction-max-pod-grace-period): {n} must be \
                 between 0 and {}",
                    i32::MAX
                ));
                0
            }),
    };
    let config = EvictionConfig {
        soft: raw.soft.unwrap_or_default(),
        soft_grace_period,
        minimum_reclaim: raw.minimum_reclaim.unwrap_or_default(),
        pressure_transition_period: raw
            .pressure_transition_period
            .unwrap_or(DEFAULT_PRESSURE_TRANSITION_PERIOD),
        max_pod_grace_period,
    };
    // `evictionHard`'s values are the node section's to check; here only what the other fields
    // add.
    if let Err(found) = config.thresholds(&BTreeMap::new()) {
        problems.extend(found);
    }
    config
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_the_kubelets_statement_syntax() {
        assert_eq!(
            parse_threshold_flag("memory.available<100Mi, nodefs.available<10%").unwrap(),
            BTreeMap::from([
                ("memory.available".to_owned(), "100Mi".to_owned()),
                ("nodefs.available".to_owned(), "10%".to_owned()),
            ])
        );
        assert_eq!(
            parse_signal_map_flag("memory.available=1m30s").unwrap(),
            BTreeMap::from([("memory.available".to_owned(), "1m30s".to_owned())])
        );
        assert_eq!(
            parse_threshold_flag("memory.available=100Mi").unwrap_err(),
            "\"memory.available=100Mi\" must be <signal><<value>"
        );
    }

    #[test]
    fn defaults_and_validation_name_the_field() {
        let mut problems = Vec::new();
        let config = build(
            RawEvictionConfig::default(),
            &BTreeMap::new(),
            &mut problems,
        );
        assert!(problems.is_empty());
        assert_eq!(config, EvictionConfig::default());
        assert_eq!(config.pressure_transition_period, Duration::from_mins(5));
        let raw = RawEvictionConfig {
            soft: Some(BTreeMap::from([(
                "memory.available".to_owned(),
                "1Gi".to_owned(),
            )])),
            soft_grace_period: Some(BTreeMap::from([(
                "nodefs.available".to_owned(),
                "soon".to_owned(),
            )])),
            max_pod_grace_period: Some(-1),
            ..RawEvictionConfig::default()
        };
        let hard = BTreeMap::from([("memory.free".to_owned(), "1Gi".to_owned())]);
        build(raw, &hard, &mut problems);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("evictionHard (--eviction-hard): unsupported"));
        assert!(problems[1].starts_with("evictionSoftGracePeriod: nodefs.available: "));
        assert!(problems[2].starts_with("evictionMaxPodGracePeriod"));
        assert_eq!(
            problems[3],
            "evictionSoftGracePeriod: grace period must be specified for the soft eviction \
             threshold memory.available"
        );
    }
}
