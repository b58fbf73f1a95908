//! The `KubeletConfiguration` fields of image garbage collection, in one section:
//! `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`, `imageMinimumGCAge` and
//! `imageMaximumGCAge`, with the kubelet's defaults and the checks of its validation
//! (`pkg/kubelet/apis/config/validation`), plus ringlet's `imageGCPeriod`. Reading, defaulting,
//! validating and rendering a field all happen here.

use std::time::Duration;

use serde_json::{Value, json};

use super::configz::go_duration;
use super::file::FieldReader;

/// The kubelet's `ImageGCPeriod`, a constant there.
const DEFAULT_PERIOD: Duration = Duration::from_mins(5);

/// The image garbage collection settings, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageGcSettings {
    /// `imageGCHighThresholdPercent` (default 85): image filesystem usage, in percent of its
    /// capacity, at or above which unused images are removed. 100 turns that off.
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (default 80): the usage collection brings the filesystem
    /// down to.
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge` (default 2m): an image detected more recently is never removed for
    /// space (it may have just been pulled for a container about to start).
    pub minimum_age: Duration,
    /// `imageMaximumGCAge` (default 0, off): an image unused for longer is removed whatever the
    /// usage.
    pub maximum_age: Duration,
    /// `imageGCPeriod` (ringlet extension, default 5m, the kubelet's fixed period): how often
    /// images are detected and collected.
    pub period: Duration,
}

impl Default for ImageGcSettings {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_age: Duration::from_mins(2),
            maximum_age: Duration::ZERO,
            period: DEFAULT_PERIOD,
        }
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RawImageGcSettings {
    pub high_threshold_percent: Option<i64>,
    pub low_threshold_percent: Option<i64>,
    pub minimum_age: Option<Duration>,
    pub maximum_age: Option<Duration>,
    pub period: Option<Duration>,
}

impl RawImageGcSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            // Pointers in v1beta1: an explicit 0 is kept, only a missing field is defaulted.
            "imageGCHighThresholdPercent" => self.high_threshold_percent = reader.int(),
            "imageGCLowThresholdPercent" => self.low_threshold_percent = reader.int(),
            // Plain durations: zero is defaulted, as for every `omitempty` duration.
            "imageMinimumGCAge" => self.minimum_age = reader.duration(),
            "imageMaximumGCAge" => self.maximum_age = reader.duration(),
            // ringlet extension, not a field of the kubelet's KubeletConfiguration.
            "imageGCPeriod" => self.period = reader.duration(),
            _ => return false,
        }
        true
    }
}

/// Applies the defaults and validates, appending every problem.
pub(super) fn build(raw: RawImageGcSettings, problems: &mut Vec<String>) -> ImageGcSettings {
    let defaults = ImageGcSettings::default();
    let mut percent = |value: Option<i64>, default: u8, field: &str, flag: &str| {
        let Some(n) = value else {
            return Some(default);
        };
        let valid = u8::try_from(n).ok().filter(|n| *n <= 100);
        if valid.is_none() {
            problems.push(format!(
                "{field} (--{flag}): {n} must be between 0 and 100, inclusive"
            ));
        }
        valid
    };
    let high = percent(
        raw.high_threshold_percent,
        defaults.high_threshold_percent,
        "imageGCHighThresholdPercent",
        "image-gc-high-threshold",
    );
    let low = percent(
        raw.low_threshold_percent,
        defaults.low_threshold_percent,
        "imageGCLowThresholdPercent",
        "image-gc-low-threshold",
    );
    if let (Some(high), Some(low)) = (high, low)
        && low >= high
    {
        problems.push(format!(
            "imageGCLowThresholdPercent (--image-gc-low-threshold): {low} must be less than \
             imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
        ));
    }
    let minimum_age = raw
        .minimum_age
        .filter(|age| !age.is_zero())
        .unwrap_or(defaults.minimum_age);
    let maximum_age = raw.maximum_age.unwrap_or(defaults.maximum_age);
    if !maximum_age.is_zero() && maximum_age <= minimum_age {
        problems.push(format!(
            "imageMaximumGCAge: {} must be greater than imageMinimumGCAge {}",
            go_duration(maximum_age),
            go_duration(minimum_age)
        ));
    }
    ImageGcSettings {
        high_threshold_percent: high.unwrap_or(defaults.high_threshold_percent),
        low_threshold_percent: low.unwrap_or(defaults.low_threshold_percent),
        minimum_age,
        maximum_age,
        period: raw
            .period
            .filter(|period| !period.is_zero())
            .unwrap_or(defaults.period),
    }
}

impl ImageGcSettings {
    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        [
            (
                "imageGCHighThresholdPercent",
                json!(self.high_threshold_percent),
            ),
            (
                "imageGCLowThresholdPercent",
                json!(self.low_threshold_percent),
            ),
            ("imageMinimumGCAge", json!(go_duration(self.minimum_age))),
            ("imageMaximumGCAge", json!(go_duration(self.maximum_age))),
            ("imageGCPeriod", json!(go_duration(self.period))),
        ]
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(raw: RawImageGcSettings) -> (ImageGcSettings, Vec<String>) {
        let mut problems = Vec::new();
        let settings = build(raw, &mut problems);
        (settings, problems)
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let (settings, problems) = built(RawImageGcSettings::default());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.high_threshold_percent, 85);
        assert_eq!(settings.low_threshold_percent, 80);
        assert_eq!(settings.minimum_age, Duration::from_mins(2));
        assert_eq!(settings.maximum_age, Duration::ZERO);
        assert_eq!(settings.period, Duration::from_mins(5));
    }

    #[test]
    fn zero_percentages_are_kept_and_zero_ages_defaulted() {
        let (settings, problems) = built(RawImageGcSettings {
            high_threshold_percent: Some(1),
            low_threshold_percent: Some(0),
            minimum_age: Some(Duration::ZERO),
            period: Some(Duration::ZERO),
            ..RawImageGcSettings::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.high_threshold_percent, 1);
        assert_eq!(settings.low_threshold_percent, 0);
        assert_eq!(settings.minimum_age, Duration::from_mins(2));
        assert_eq!(settings.period, Duration::from_mins(5));
    }

    #[test]
    fn bad_values_are_named_with_field_and_flag() {
        let (_, problems) = built(RawImageGcSettings {
            high_threshold_percent: Some(101),
            low_threshold_percent: Some(-1),
            ..RawImageGcSettings::default()
        });
        assert_eq!(
            problems,
            [
                "imageGCHighThresholdPercent (--image-gc-high-threshold): 101 must be between 0 and 100, inclusive",
                "imageGCLowThresholdPercent (--image-gc-low-threshold): -1 must be between 0 and 100, inclusive",
            ]
        );
        let (_, problems) = built(RawImageGcSettings {
            high_threshold_percent: Some(70),
            low_threshold_percent: Some(70),
            minimum_age: Some(Duration::from_mins(10)),
            maximum_age: Some(Duration::from_mins(10)),
            ..RawImageGcSettings::default()
        });
        assert_eq!(
            problems,
            [
                "imageGCLowThresholdPercent (--image-gc-low-threshold): 70 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70",
                "imageMaximumGCAge: 10m0s must be greater than imageMinimumGCAge 10m0s",
            ]
        );
    }

    #[test]
    fn a_maximum_age_above_the_minimum_is_accepted() {
        let (settings, problems) = built(RawImageGcSettings {
            maximum_age: Some(Duration::from_hours(24)),
            ..RawImageGcSettings::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.maximum_age, Duration::from_hours(24));
    }
}
