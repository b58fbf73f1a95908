//! The `KubeletConfiguration` fields that limit image pulls, in one section:
//! `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS` and `registryBurst`, with the
//! kubelet's defaults and the checks of its validation (`pkg/kubelet/apis/config/validation`).
//! Reading, defaulting, validating and rendering a field all happen here.

use std::num::NonZeroU32;

use serde_json::{Value, json};

use super::file::FieldReader;

/// How image pulls are limited, defaulted and validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagePullSettings {
    /// `serializeImagePulls` (default true): pull one image at a time.
    pub serialize: bool,
    /// `maxParallelImagePulls` (default unset, no limit): at most this many pulls at once when
    /// pulls are not serialized.
    pub max_parallel: Option<NonZeroU32>,
    /// `registryPullQPS` (default 5): pull requests per second; 0 for no limit.
    pub registry_qps: u32,
    /// `registryBurst` (default 10): pull requests allowed at once above the QPS.
    pub registry_burst: u32,
}

impl Default for ImagePullSettings {
    fn default() -> Self {
        Self {
            serialize: true,
            max_parallel: None,
            registry_qps: 5,
            registry_burst: 10,
        }
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RawImagePullSettings {
    pub serialize: Option<bool>,
    pub max_parallel: Option<i64>,
    pub registry_qps: Option<i64>,
    pub registry_burst: Option<i64>,
}

impl RawImagePullSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "serializeImagePulls" => self.serialize = reader.bool(),
            // A pointer in v1beta1: an explicit 0 is kept (and rejected).
            "maxParallelImagePulls" => self.max_parallel = reader.int(),
            // A pointer in v1beta1: an explicit 0 is kept and means no limit.
            "registryPullQPS" => self.registry_qps = reader.int(),
            // A plain int32 in v1beta1: zero is defaulted, as for every `omitempty` field.
            "registryBurst" => self.registry_burst = reader.int().filter(|burst| *burst != 0),
            _ => return false,
        }
        true
    }
}

/// Applies the defaults and validates, appending every problem.
pub(super) fn build(raw: RawImagePullSettings, problems: &mut Vec<String>) -> ImagePullSettings {
    let defaults = ImagePullSettings::default();
    let serialize = raw.serialize.unwrap_or(defaults.serialize);
    let mut non_negative = |value: Option<i64>, default: u32, field: &str, flag: &str| {
        let Some(n) = value else {
            return default;
        };
        u32::try_from(n).unwrap_or_else(|_| {
            let why = if n < 0 {
                "must not be a negative number"
            } else {
                "is too large"
            };
            problems.push(format!("{field} (--{flag}): {n} {why}"));
            default
        })
    };
    let registry_qps = non_negative(
        raw.registry_qps,
        defaults.registry_qps,
        "registryPullQPS",
        "registry-qps",
    );
    let registry_burst = non_negative(
        raw.registry_burst,
        defaults.registry_burst,
        "registryBurst",
        "registry-burst",
    );
    let max_parallel = raw.max_parallel.and_then(|n| {
        let valid = u32::try_from(n).ok().and_then(NonZeroU32::new);
        if valid.is_none() {
            problems.push(format!(
                "maxParallelImagePulls: {n} must be a positive number"
            ));
        }
        valid
    });
    if serialize && max_parallel.is_some_and(|n| n.get() > 1) {
        problems.push(
            "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls \
             (--serialize-image-pulls) is set to false"
                .to_owned(),
        );
    }
    ImagePullSettings {
        serialize,
        max_parallel,
        registry_qps,
        registry_burst,
    }
}

impl ImagePullSettings {
    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        [
            ("serializeImagePulls", json!(self.serialize)),
            ("maxParallelImagePulls", json!(self.max_parallel)),
            ("registryPullQPS", json!(self.registry_qps)),
            ("registryBurst", json!(self.registry_burst)),
        ]
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(raw: RawImagePullSettings) -> (ImagePullSettings, Vec<String>) {
        let mut problems = Vec::new();
        let settings = build(raw, &mut problems);
        (settings, problems)
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let (settings, problems) = built(RawImagePullSettings::default());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            settings,
            ImagePullSettings {
                serialize: true,
                max_parallel: None,
                registry_qps: 5,
                registry_burst: 10,
            }
        );
    }

    #[test]
    fn parallel_pulls_may_be_limited_and_zero_qps_is_kept() {
        let (settings, problems) = built(RawImagePullSettings {
            serialize: Some(false),
            max_parallel: Some(3),
            registry_qps: Some(0),
            registry_burst: Some(2),
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert!(!settings.serialize);
        assert_eq!(settings.max_parallel, NonZeroU32::new(3));
        assert_eq!(settings.registry_qps, 0);
        assert_eq!(settings.registry_burst, 2);
    }

    #[test]
    fn one_parallel_pull_is_allowed_with_serialized_pulls() {
        let (settings, problems) = built(RawImagePullSettings {
            max_parallel: Some(1),
            ..RawImagePullSettings::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert!(settings.serialize);
        assert_eq!(settings.max_parallel, NonZeroU32::new(1));
    }

    #[test]
    fn bad_values_are_named_with_field_and_flag() {
        let (_, problems) = built(RawImagePullSettings {
            serialize: Some(false),
            max_parallel: Some(0),
            registry_qps: Some(-1),
            registry_burst: Some(-2),
        });
        assert_eq!(
            problems,
            [
                "registryPullQPS (--registry-qps): -1 must not be a negative number",
                "registryBurst (--registry-burst): -2 must not be a negative number",
                "maxParallelImagePulls: 0 must be a positive number",
            ]
        );
        let (_, problems) = built(RawImagePullSettings {
            max_parallel: Some(3),
            ..RawImagePullSettings::default()
        });
        assert_eq!(
            problems,
            [
                "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls \
                 (--serialize-image-pulls) is set to false"
            ]
        );
    }
}
