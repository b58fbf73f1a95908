//! The `KubeletConfiguration` fields of graceful node shutdown: `shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods` and `shutdownGracePeriodByPodPriority` (file only: the
//! kubelet has no flags for them), with the kubelet's checks. What they do is
//! `crate::nodeshutdown`.

use std::time::Duration;

use serde_json::{Value, json};
use serde_yaml_ng::Value as YamlValue;

use super::configz::go_duration;
use super::file::FieldReader;
use crate::nodeshutdown::{ShutdownGracePeriodByPodPriority, shutdown_periods};

/// The graceful node shutdown settings, validated. All empty (the default) turns it off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownSettings {
    /// `shutdownGracePeriod`: how long the node delays its shutdown for all its pods.
    pub grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods`: the part of it kept for critical pods, which stop last.
    pub grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority`: grace periods by pod priority instead of the two above.
    pub grace_period_by_pod_priority: Vec<ShutdownGracePeriodByPodPriority>,
}

impl ShutdownSettings {
    /// The priority groups, lowest first; empty when graceful shutdown is off.
    pub fn periods(&self) -> Vec<ShutdownGracePeriodByPodPriority> {
        shutdown_periods(
            self.grace_period,
            self.grace_period_critical_pods,
            &self.grace_period_by_pod_priority,
        )
    }

    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        let by_priority: Vec<Value> = self
            .grace_period_by_pod_priority
            .iter()
            .map(|p| {
                json!({
                    "priority": p.priority,
                    "shutdownGracePeriodSeconds": p.shutdown_grace_period_seconds,
                })
            })
            .collect();
        [
            ("shutdownGracePeriod", json!(go_duration(self.grace_period))),
            (
                "shutdownGracePeriodCriticalPods",
                json!(go_duration(self.grace_period_critical_pods)),
            ),
            ("shutdownGracePeriodByPodPriority", json!(by_priority)),
        ]
        .into_iter()
    }
}

/// The section's values as read from the file, before validation.
#[derive(Debug, Default, Clone)]
pub(super) struct RawShutdownSettings {
    pub total: Option<Duration>,
    pub critical_pods: Option<Duration>,
    pub by_pod_priority: Option<Vec<ShutdownGracePeriodByPodPriority>>,
}

impl RawShutdownSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "shutdownGracePeriod" => self.total = reader.duration(),
            "shutdownGracePeriodCriticalPods" => {
                self.critical_pods = reader.duration();
            }
            "shutdownGracePeriodByPodPriority" => {
                self.by_pod_priority = read_by_priority(reader);
            }
            _ => return false,
        }
        true
    }
}

/// A list of `{priority, shutdownGracePeriodSeconds}`; a missing field is 0, as in Go.
fn read_by_priority(reader: &mut FieldReader<'_>) -> Option<Vec<ShutdownGracePeriodByPodPriority>> {
    let items = match reader.value() {
        YamlValue::Null => return None,
        YamlValue::Sequence(items) => items,
        _ => {
            reader.problem("expected a list of {priority, shutdownGracePeriodSeconds}");
            return None;
        }
    };
    let mut entries = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let YamlValue::Mapping(fields) = item else {
            reader.problem(format!(
                "[{index}]: expected a mapping with priority and shutdownGracePeriodSeconds"
            ));
            continue;
        };
        let mut entry = ShutdownGracePeriodByPodPriority {
            priority: 0,
            shutdown_grace_period_seconds: 0,
        };
        for (key, value) in fields {
            match (key.as_str(), value.as_i64()) {
                (Some("priority"), Some(n)) => match i32::try_from(n) {
                    Ok(priority) => entry.priority = priority,
                    Err(_) => {
                        reader.problem(format!("[{index}].priority: {n} is not a 32-bit integer"));
                    }
                },
                (Some("shutdownGracePeriodSeconds"), Some(n)) if n >= 0 => {
                    entry.shutdown_grace_period_seconds = n;
                }
                (Some("shutdownGracePeriodSeconds"), Some(n)) => reader.problem(format!(
                    "[{index}].shutdownGracePeriodSeconds: {n} must not be negative"
                )),
                (Some(field @ ("priority" | "shutdownGracePeriodSeconds")), None) => {
                    reader.problem(format!("[{index}].{field}: expected an integer"));
                }
                (other, _) => reader.problem(format!(
                    "[{index}]: unknown field {} (expected priority and \
                     shutdownGracePeriodSeconds)",
                    other.unwrap_or("that is not a string")
                )),
            }
        }
        entries.push(entry);
    }
    Some(entries)
}

/// Validates `raw` as the kubelet does, appending every problem.
pub(super) fn build(raw: RawShutdownSettings, problems: &mut Vec<String>) -> ShutdownSettings {
    let settings = ShutdownSettings {
        grace_period: raw.total.unwrap_or_default(),
        grace_period_critical_pods: raw.critical_pods.unwrap_or_default(),
        grace_period_by_pod_priority: raw.by_pod_priority.unwrap_or_default(),
    };
    let (all, critical) = (settings.grace_period, settings.grace_period_critical_pods);
    if critical > all {
        problems.push(format!(
            "shutdownGracePeriodCriticalPods: {} must be <= shutdownGracePeriod {}",
            go_duration(critical),
            go_duration(all)
        ));
    }
    for (field, period) in [
        ("shutdownGracePeriod", all),
        ("shutdownGracePeriodCriticalPods", critical),
    ] {
        if !period.is_zero() && period < Duration::from_secs(1) {
            problems.push(format!(
                "{field}: {} must be either zero or otherwise >= 1 sec",
                go_duration(period)
            ));
        }
    }
    let durations_set = !all.is_zero() || !critical.is_zero();
    if !settings.grace_period_by_pod_priority.is_empty() && durations_set {
        problems.push(
            "shutdownGracePeriodByPodPriority: cannot be set together with shutdownGracePeriod \
             or shutdownGracePeriodCriticalPods"
                .to_owned(),
        );
    }
    settings
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn period(priority: i32, seconds: i64) -> ShutdownGracePeriodByPodPriority {
        ShutdownGracePeriodByPodPriority {
            priority,
            shutdown_grace_period_seconds: seconds,
        }
    }

    fn build_ok(raw: RawShutdownSettings) -> ShutdownSettings {
        let mut problems = Vec::new();
        let settings = build(raw, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        settings
    }

    fn problems_of(raw: RawShutdownSettings) -> Vec<String> {
        let mut problems = Vec::new();
        build(raw, &mut problems);
        problems
    }

    #[test]
    fn nothing_set_is_off_and_the_two_durations_give_two_groups() {
        assert!(
            build_ok(RawShutdownSettings::default())
                .periods()
                .is_empty()
        );
        let settings = build_ok(RawShutdownSettings {
            total: Some(Duration::from_secs(30)),
            critical_pods: Some(Duration::from_secs(10)),
            ..RawShutdownSettings::default()
        });
        assert_eq!(
            settings.periods(),
            [period(0, 20), period(2_000_000_000, 10)]
        );
        let by_priority = build_ok(RawShutdownSettings {
            by_pod_priority: Some(vec![period(100, 5), period(0, 10)]),
            ..RawShutdownSettings::default()
        });
        assert_eq!(by_priority.periods(), [period(0, 10), period(100, 5)]);
    }

    #[test]
    fn the_kubelets_checks_name_the_field() {
        assert_eq!(
            problems_of(RawShutdownSettings {
                total: Some(Duration::from_secs(10)),
                critical_pods: Some(Duration::from_secs(20)),
                ..RawShutdownSettings::default()
            }),
            ["shutdownGracePeriodCriticalPods: 20s must be <= shutdownGracePeriod 10s"]
        );
        assert_eq!(
            problems_of(RawShutdownSettings {
                total: Some(Duration::from_millis(500)),
                critical_pods: Some(Duration::from_millis(200)),
                ..RawShutdownSettings::default()
            }),
            [
                "shutdownGracePeriod: 0.5s must be either zero or otherwise >= 1 sec",
                "shutdownGracePeriodCriticalPods: 0.2s must be either zero or otherwise >= 1 sec",
            ]
        );
        assert_eq!(
            problems_of(RawShutdownSettings {
                total: Some(Duration::from_secs(30)),
                by_pod_priority: Some(vec![period(0, 10)]),
                ..RawShutdownSettings::default()
            }),
            [
                "shutdownGracePeriodByPodPriority: cannot be set together with \
                 shutdownGracePeriod or shutdownGracePeriodCriticalPods"
            ]
        );
        // An empty list is not set.
        build_ok(RawShutdownSettings {
            total: Some(Duration::from_secs(30)),
            by_pod_priority: Some(Vec::new()),
            ..RawShutdownSettings::default()
        });
    }
}
