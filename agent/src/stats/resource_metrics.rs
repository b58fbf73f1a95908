//! `/metrics/resource`: the CPU, memory and start-time metrics metrics-server scrapes, rendered from
//! a [`Summary`] so they agree with `/stats/summary` (the kubelet's
//! `pkg/kubelet/metrics/collectors/resource_metrics.go`).
//!
//! The text follows what the kubelet's registry writes: Prometheus text format 0.0.4, families
//! sorted by name, samples by label values, labels by name, `[STABLE]`/`[ALPHA]` in the help text,
//! values in Go's shortest `%g` form, and the sample time in milliseconds on CPU and memory samples.
//! A family without samples is left out.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::types::{ContainerStats, CpuStats, MemoryStats, NodeStats, PodStats, Summary};

/// The `Content-Type` of [`render_resource_metrics`]' output.
pub const RESOURCE_METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const NANOS_PER_SECOND: f64 = 1e9;

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
        }
    }
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

struct Sample {
    /// Label values in the order of the family's label names, which are sorted.
    labels: Vec<(&'static str, String)>,
    value: f64,
    timestamp_ms: Option<i64>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: Kind) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }
}

fn container_labels(pod: &PodStats, container: &ContainerStats) -> Vec<(&'static str, String)> {
    vec![
        ("container", container.name.clone()),
        ("namespace", pod.pod_ref.namespace.clone()),
        ("pod", pod.pod_ref.name.clone()),
    ]
}

fn pod_labels(pod: &PodStats) -> Vec<(&'static str, String)> {
    vec![
        ("namespace", pod.pod_ref.namespace.clone()),
        ("pod", pod.pod_ref.name.clone()),
    ]
}

fn cpu_sample(cpu: Option<&CpuStats>, labels: Vec<(&'static str, String)>) -> Option<Sample> {
    let cpu = cpu?;
    Some(Sample {
        labels,
        value: as_f64(cpu.usage_core_nano_seconds?) / NANOS_PER_SECOND,
        timestamp_ms: Some(millis(&cpu.time)),
    })
}

fn working_set_sample(
    memory: Option<&MemoryStats>,
    labels: Vec<(&'static str, String)>,
) -> Option<Sample> {
    let memory = memory?;
    Some(Sample {
        labels,
        value: as_f64(memory.working_set_bytes?),
        timestamp_ms: Some(millis(&memory.time)),
    })
}

/// The `/metrics/resource` body for `summary`. `scrape_error` and `resource_scrape_error` are 1
/// when the node's CPU or memory could not be read, the kubelet's "could not get the stats" case.
pub fn render_resource_metrics(summary: &Summary) -> String {
    let mut families = Families::new();
    families.collect_node(&summary.node);
    for pod in &summary.pods {
        families.collect_pod(pod);
    }
    let failed = summary.node.cpu.is_none() || summary.node.memory.is_none();
    for family in [
        &mut families.resource_scrape_error,
        &mut families.scrape_error,
    ] {
        family.samples.push(Sample {
            labels: Vec::new(),
            value: if failed { 1.0 } else { 0.0 },
            timestamp_ms: None,
        });
    }

    let mut out = String::new();
    for mut family in families.in_name_order() {
        if family.samples.is_empty() {
            continue;
        }
        family.samples.sort_by(|a, b| a.labels.cmp(&b.labels));
        write_family(&mut out, &family);
    }
    out
}

/// Every family the kubelet's resource collector describes.
struct Families {
    container_cpu: Family,
    container_memory: Family,
    container_start: Family,
    node_cpu: Family,
    node_memory: Family,
    node_swap: Family,
    pod_cpu: Family,
    pod_memory: Family,
    resource_scrape_error: Family,
    scrape_error: Family,
}

impl Families {
    fn new() -> Self {
        Self {
            container_cpu: Family::new(
                "container_cpu_usage_seconds_total",
                "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
                Kind::Counter,
            ),
            container_memory: Family::new(
                "container_memory_working_set_bytes",
                "[STABLE] Current working set of the container in bytes",
                Kind::Gauge,
            ),
            container_start: Family::new(
                "container_start_time_seconds",
                "[STABLE] Start time of the container since unix epoch in seconds",
                Kind::Gauge,
            ),
            node_cpu: Family::new(
                "node_cpu_usage_seconds_total",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                Kind::Counter,
            ),
            node_memory: Family::new(
                "node_memory_working_set_bytes",
                "[STABLE] Current working set of the node in bytes",
                Kind::Gauge,
            ),
            node_swap: Family::new(
                "node_swap_usage_bytes",
                "[ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems",
                Kind::Gauge,
            ),
            pod_cpu: Family::new(
                "pod_cpu_usage_seconds_total",
                "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
                Kind::Counter,
            ),
            pod_memory: Family::new(
                "pod_memory_working_set_bytes",
                "[STABLE] Current working set of the pod in bytes",
                Kind::Gauge,
            ),
            resource_scrape_error: Family::new(
                "resource_scrape_error",
                "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
                Kind::Gauge,
            ),
            scrape_error: Family::new(
                "scrape_error",
                "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
                Kind::Gauge,
            ),
        }
    }

    fn collect_node(&mut self, node: &NodeStats) {
        self.node_cpu
            .samples
            .extend(cpu_sample(node.cpu.as_ref(), Vec::new()));
        self.node_memory
            .samples
            .extend(working_set_sample(node.memory.as_ref(), Vec::new()));
        if let Some(swap) = &node.swap
            && let Some(usage) = swap.swap_usage_bytes
        {
            self.node_swap.samples.push(Sample {
                labels: Vec::new(),
                value: as_f64(usage),
                timestamp_ms: Some(millis(&swap.time)),
            });
        }
    }

    fn collect_pod(&mut self, pod: &PodStats) {
        for container in &pod.containers {
            // The kubelet leaves out start times at or before the epoch (unknown).
            let start = container.start_time.0;
            if start.as_second() > 0 {
                self.container_start.samples.push(Sample {
                    labels: container_labels(pod, container),
                    value: i128_as_f64(start.as_nanosecond()) / NANOS_PER_SECOND,
                    timestamp_ms: None,
                });
            }
            self.container_cpu.samples.extend(cpu_sample(
                container.cpu.as_ref(),
                container_labels(pod, container),
            ));
            self.container_memory.samples.extend(working_set_sample(
                container.memory.as_ref(),
                container_labels(pod, container),
            ));
        }
        self.pod_cpu
            .samples
            .extend(cpu_sample(pod.cpu.as_ref(), pod_labels(pod)));
        self.pod_memory
            .samples
            .extend(working_set_sample(pod.memory.as_ref(), pod_labels(pod)));
    }

    /// Sorted by name, as the kubelet's registry writes them.
    fn in_name_order(self) -> [Family; 10] {
        [
            self.container_cpu,
            self.container_memory,
            self.container_start,
            self.node_cpu,
            self.node_memory,
            self.node_swap,
            self.pod_cpu,
            self.pod_memory,
            self.resource_scrape_error,
            self.scrape_error,
        ]
    }
}

fn write_family(out: &mut String, family: &Family) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
    let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.as_str());
    for sample in &family.samples {
        out.push_str(family.name);
        if !sample.labels.is_empty() {
            out.push('{');
            for (i, (name, value)) in sample.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{name}=\"{}\"", escape_label_value(value));
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(&format_float(sample.value));
        if let Some(ms) = sample.timestamp_ms {
            let _ = write!(out, " {ms}");
        }
        out.push('\n');
    }
}

fn escape_label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (what the Prometheus client
/// the kubelet uses emits): the shortest digits that round-trip, in exponent form (at least two
/// exponent digits) when the decimal exponent is below -4 or at least 6.
fn format_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if value == 0.0 {
        return "0".to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip mantissa, e.g. "1.048576e7" or "-2.5e-5".
    let scientific = format!("{value:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific;
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return scientific;
    };
    if (-4..6).contains(&exponent) {
        return format!("{value}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

fn millis(time: &Time) -> i64 {
    time.0.as_millisecond()
}

/// Counters and byte counts stay far below 2^53 in practice; the exposition format is float anyway.
#[allow(clippy::cast_precision_loss)]
fn as_f64(value: u64) -> f64 {
    value as f64
}

#[allow(clippy::cast_precision_loss)]
fn i128_as_f64(value: i128) -> f64 {
    value as f64
}

#[cfg(test)]
mod tests {
    use super::format_float;

    #[test]
    fn floats_are_formatted_like_go() {
        assert_eq!(format_float(0.0), "0");
        assert_eq!(format_float(1.0), "1");
        assert_eq!(format_float(-1.0), "-1");
        assert_eq!(format_float(0.235), "0.235");
        assert_eq!(format_float(123_456.0), "123456");
        assert_eq!(format_float(1_048_576.0), "1.048576e+06");
        assert_eq!(format_float(34_400_333_824.0), "3.4400333824e+10");
        assert_eq!(format_float(1e21), "1e+21");
        assert_eq!(format_float(0.0001), "0.0001");
        assert_eq!(format_float(0.000_025), "2.5e-05");
        assert_eq!(format_float(1.687_950_863_878e9), "1.687950863878e+09");
        assert_eq!(format_float(f64::NAN), "NaN");
        assert_eq!(format_float(f64::INFINITY), "+Inf");
    }
}
