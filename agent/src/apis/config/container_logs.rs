//! The `KubeletConfiguration` fields of container log rotation, in one section:
//! `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMaxWorkers` and
//! `containerLogMonitorInterval`, with the kubelet's defaults and the checks of its validation and
//! of `logs.NewContainerLogManager` (`pkg/kubelet/logs`). Reading, defaulting, validating and
//! rendering a field all happen here.

use std::time::Duration;

use serde_json::{Value, json};

use super::configz::go_duration;
use super::duration::parse_duration;
use super::file::FieldReader;

/// The kubelet's `containerLogMaxSize` default.
const DEFAULT_MAX_SIZE: &str = "10Mi";
/// The shortest `containerLogMonitorInterval` the kubelet's validation allows.
const MIN_MONITOR_INTERVAL: Duration = Duration::from_secs(3);
/// A resource quantity in billionths of its unit, as `parse_quantity` returns it.
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// The rotation settings, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLogSettings {
    /// `containerLogMaxSize` as written (default `10Mi`): a resource quantity.
    pub max_size: String,
    /// The same in bytes: a live log file this big or bigger is rotated. `None` when the size is
    /// negative, which turns rotation off.
    pub max_size_bytes: Option<u64>,
    /// `containerLogMaxFiles` (default 5, at least 2): the files kept per container, the live one
    /// included.
    pub max_files: u32,
    /// `containerLogMaxWorkers` (default 1, at least 1): containers rotated at the same time.
    pub max_workers: u32,
    /// `containerLogMonitorInterval` (default 10s, at least 3s): how often log sizes are checked.
    pub monitor_interval: Duration,
}

impl Default for ContainerLogSettings {
    fn default() -> Self {
        Self {
            max_size: DEFAULT_MAX_SIZE.to_owned(),
            max_size_bytes: Some(10 * 1024 * 1024),
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone)]
pub(super) struct RawContainerLogSettings {
    pub max_size: Option<String>,
    pub max_files: Option<i64>,
    pub max_workers: Option<i64>,
    pub monitor_interval: Option<Duration>,
}

impl RawContainerLogSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "containerLogMaxSize" => self.max_size = reader.string(),
            "containerLogMaxFiles" => self.max_files = reader.int(),
            "containerLogMaxWorkers" => self.max_workers = reader.int(),
            // Not `reader.duration()`, which takes "0s" for unset: the kubelet defaults only a
            // missing interval and refuses a zero one.
            "containerLogMonitorInterval" => {
                self.monitor_interval = reader.string().and_then(|text| {
                    parse_duration(&text)
                        .map_err(|err| reader.problem(err))
                        .ok()
                });
            }
            _ => return false,
        }
        true
    }
}

/// Applies the defaults and validates, appending every problem.
pub(super) fn build(
    raw: RawContainerLogSettings,
    problems: &mut Vec<String>,
) -> ContainerLogSettings {
    let defaults = ContainerLogSettings::default();
    let mut problem = |field: &str, flag: &str, message: String| {
        problems.push(format!("{field} (--{flag}): {message}"));
    };
    let (max_size, max_size_bytes) = match raw.max_size.filter(|size| !size.is_empty()) {
        None => (defaults.max_size, defaults.max_size_bytes),
        Some(text) => match size_in_bytes(&text) {
            Ok(bytes) => (text, bytes),
            Err(reason) => {
                problem(
                    "containerLogMaxSize",
                    "container-log-max-size",
                    format!("{text:?} {reason}"),
                );
                (defaults.max_size, defaults.max_size_bytes)
            }
        },
    };
    let mut at_least = |value: Option<i64>, default: u32, min: u32, field: &str, flag: &str| {
        let Some(n) = value else {
            return default;
        };
        if n < i64::from(min) {
            problem(
                field,
                flag,
                format!("{n} must be greater than or equal to {min}"),
            );
            return default;
        }
        // The kubelet's fields are int32.
        i32::try_from(n)
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or_else(|| {
                problem(field, flag, format!("{n} is too large"));
                default
            })
    };
    let max_files = at_least(
        raw.max_files,
        defaults.max_files,
        2,
        "containerLogMaxFiles",
        "container-log-max-files",
    );
    let max_workers = at_least(
        raw.max_workers,
        defaults.max_workers,
        1,
        "containerLogMaxWorkers",
        "container-log-max-workers",
    );
    let monitor_interval = raw.monitor_interval.unwrap_or(defaults.monitor_interval);
    if monitor_interval < MIN_MONITOR_INTERVAL {
        problem(
            "containerLogMonitorInterval",
            "container-log-monitor-interval",
            format!(
                "{} must be a positive time duration greater than or equal to 3s",
                go_duration(monitor_interval)
            ),
        );
    }
    ContainerLogSettings {
        max_size,
        max_size_bytes,
        max_files,
        max_workers,
        monitor_interval: monitor_interval.max(MIN_MONITOR_INTERVAL),
    }
}

/// A size quantity in whole bytes; `None` for a negative size (rotation off).
fn size_in_bytes(text: &str) -> Result<Option<u64>, &'static str> {
    let nanos =
        crate::cm::parse_quantity(text).map_err(|_| "is not a resource quantity such as 10Mi")?;
    if nanos < 0 {
        return Ok(None);
    }
    if nanos % NANOS_PER_UNIT != 0 {
        return Err("is not a whole number of bytes");
    }
    u64::try_from(nanos / NANOS_PER_UNIT)
        .map(Some)
        .map_err(|_| "is too large")
}

impl ContainerLogSettings {
    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        [
            ("containerLogMaxSize", json!(self.max_size)),
            ("containerLogMaxFiles", json!(self.max_files)),
            ("containerLogMaxWorkers", json!(self.max_workers)),
            (
                "containerLogMonitorInterval",
                json!(go_duration(self.monitor_interval)),
            ),
        ]
        .into_iter()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn built(raw: RawContainerLogSettings) -> (ContainerLogSettings, Vec<String>) {
        let mut problems = Vec::new();
        let settings = build(raw, &mut problems);
        (settings, problems)
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let (settings, problems) = built(RawContainerLogSettings::default());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings, ContainerLogSettings::default());
        assert_eq!(settings.max_size, "10Mi");
        assert_eq!(settings.max_size_bytes, Some(10_485_760));
        assert_eq!(settings.max_files, 5);
        assert_eq!(settings.max_workers, 1);
        assert_eq!(settings.monitor_interval, Duration::from_secs(10));
    }

    #[test]
    fn sizes_are_quantities_of_whole_bytes_and_negative_turns_rotation_off() {
        for (text, bytes) in [
            ("1Mi", Some(1_048_576)),
            ("1.5Ki", Some(1536)),
            ("2k", Some(2000)),
            ("0", Some(0)),
            ("4096", Some(4096)),
            ("-1", None),
            ("-10Mi", None),
        ] {
            assert_eq!(size_in_bytes(text), Ok(bytes), "{text}");
        }
        assert_eq!(
            size_in_bytes("ten megs"),
            Err("is not a resource quantity such as 10Mi")
        );
        assert_eq!(size_in_bytes("0.5"), Err("is not a whole number of bytes"));
        assert_eq!(size_in_bytes("100m"), Err("is not a whole number of bytes"));
    }

    #[test]
    fn bad_values_are_named_with_field_and_flag() {
        let (settings, problems) = built(RawContainerLogSettings {
            max_size: Some("lots".to_owned()),
            max_files: Some(1),
            max_workers: Some(0),
            monitor_interval: Some(Duration::from_secs(2)),
        });
        assert_eq!(
            problems,
            [
                "containerLogMaxSize (--container-log-max-size): \"lots\" is not a resource quantity such as 10Mi",
                "containerLogMaxFiles (--container-log-max-files): 1 must be greater than or equal to 2",
                "containerLogMaxWorkers (--container-log-max-workers): 0 must be greater than or equal to 1",
                "containerLogMonitorInterval (--container-log-monitor-interval): 2s must be a positive time duration greater than or equal to 3s",
            ]
        );
        assert_eq!(settings.monitor_interval, MIN_MONITOR_INTERVAL);
        let (_, problems) = built(RawContainerLogSettings {
            max_files: Some(i64::from(u32::MAX)),
            monitor_interval: Some(Duration::ZERO),
            ..RawContainerLogSettings::default()
        });
        assert_eq!(
            problems,
            [
                "containerLogMaxFiles (--container-log-max-files): 4294967295 is too large",
                "containerLogMonitorInterval (--container-log-monitor-interval): 0s must be a positive time duration greater than or equal to 3s",
            ]
        );
    }

    #[test]
    fn a_negative_size_keeps_its_text_and_disables_rotation() {
        let (settings, problems) = built(RawContainerLogSettings {
            max_size: Some("-1".to_owned()),
            ..RawContainerLogSettings::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.max_size, "-1");
        assert_eq!(settings.max_size_bytes, None);
    }
}
