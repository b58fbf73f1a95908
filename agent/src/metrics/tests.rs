// Counts and gauges are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::collections::{BTreeMap, BTreeSet};

use super::*;

/// Every metric the agent exports, with its Prometheus type.
const EXPECTED: &[(&str, &str)] = &[
    ("kubelet_pleg_relist_duration_seconds", "histogram"),
    ("kubelet_pleg_relist_interval_seconds", "histogram"),
    ("kubelet_pleg_last_seen_seconds", "gauge"),
    ("kubelet_pleg_discard_events", "counter"),
    ("kubelet_running_pods", "gauge"),
    ("kubelet_running_containers", "gauge"),
    ("kubelet_pod_start_duration_seconds", "histogram"),
    ("ringlet_pleg_event_latency_seconds", "histogram"),
    ("ringlet_pod_status_latency_seconds", "histogram"),
    ("ringlet_pleg_runtime_lag_seconds", "histogram"),
    ("ringlet_pleg_hints_total", "counter"),
    ("ringlet_pleg_relists_total", "counter"),
    ("ringlet_ebpf_ring_buffer_drops_total", "counter"),
    ("ringlet_pleg_kernel_exits_total", "counter"),
    ("ringlet_pleg_kernel_exits_pending", "gauge"),
    ("ringlet_pleg_pods_awaiting_runtime", "gauge"),
    ("ringlet_pleg_kernel_runtime_mismatch_total", "counter"),
    ("ringlet_pleg_panics_total", "counter"),
    ("ringlet_pleg_mode", "gauge"),
    ("ringlet_tls_handshake_errors_total", "counter"),
];

/// A strict reading of the Prometheus text format 0.0.4: `# HELP`/`# TYPE` lines, then samples
/// `name{label="value",...} value` of the declared family (histograms add `_bucket`, `_sum`,
/// `_count`). Returns each family's type and its samples (name with labels → value).
fn parse(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, f64>) {
    let mut types = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line has name and type");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "duplicate TYPE for {name}"
            );
            current = Some((name.to_owned(), kind.to_owned()));
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            other => other
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .unwrap_or_else(|| panic!("bad labels in {line}"));
                for pair in inner.split(',') {
                    let (key, quoted) = pair.split_once('=').expect("label is key=value");
                    assert!(!key.is_empty(), "{line}");
                    assert!(
                        quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'),
                        "{line}"
                    );
                }
            }
        }
        let (family, kind) = current.as_ref().expect("sample after a TYPE line");
        let belongs = if kind == "histogram" {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| name == format!("{family}{suffix}"))
        } else {
            name == family
        };
        assert!(belongs, "{name} under TYPE {family}");
        samples.insert(series.to_owned(), value);
    }
    (types, samples)
}

#[test]
fn every_metric_is_exported_with_its_type() {
    let metrics = Metrics::new().unwrap();
    let (types, samples) = parse(&metrics.render().unwrap());
    let expected: BTreeMap<String, String> = EXPECTED
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    assert_eq!(types, expected);
    // Labelled series exist before anything happened, so rate() and alerts see them at 0.
    for series in [
        "ringlet_pleg_hints_total{kind=\"died\"}",
        "ringlet_pleg_hints_total{kind=\"resync\"}",
        "ringlet_pleg_relists_total{type=\"targeted\"}",
        "ringlet_pleg_relists_total{type=\"full\"}",
        "kubelet_running_containers{container_state=\"exited\"}",
        "ringlet_tls_handshake_errors_total{reason=\"certificate\"}",
    ] {
        assert_eq!(samples.get(series), Some(&0.0), "{series}");
    }
    assert_eq!(samples["ringlet_pleg_mode{mode=\"relist\"}"], 1.0);
    assert_eq!(samples["ringlet_pleg_mode{mode=\"ebpf\"}"], 0.0);
}

#[test]
fn buckets_are_the_kubelets_and_four_per_decade_for_latency() {
    let metrics = Metrics::new().unwrap();
    let (_, samples) = parse(&metrics.render().unwrap());
    let buckets = |family: &str| -> BTreeSet<String> {
        samples
            .keys()
            .filter_map(|s| s.strip_prefix(&format!("{family}_bucket{{le=\"")))
            .map(|le| le.trim_end_matches("\"}").to_owned())
            .collect()
    };
    let as_set = |values: &[&str]| values.iter().map(|v| (*v).to_owned()).collect();
    assert_eq!(
        buckets("kubelet_pleg_relist_duration_seconds"),
        as_set(&[
            "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"
        ])
    );
    assert_eq!(
        buckets("kubelet_pod_start_duration_seconds").len(),
        POD_START_BUCKETS.len() + 1
    );
    for family in [
        "ringlet_pleg_event_latency_seconds",
        "ringlet_pod_status_latency_seconds",
        "ringlet_pleg_runtime_lag_seconds",
    ] {
        let mut bounds: Vec<f64> = buckets(family)
            .iter()
            .filter(|le| *le != "+Inf")
            .map(|le| le.parse().unwrap())
            .collect();
        bounds.sort_by(f64::total_cmp);
        assert_eq!(bounds.first(), Some(&1e-5), "{family}: {bounds:?}");
        assert_eq!(bounds.last(), Some(&10.0), "{family}: {bounds:?}");
        // At least four buckets per decade: no step wider than 10^(1/4), give or take the rounding.
        for pair in bounds.windows(2) {
            assert!(
                pair[1] / pair[0] <= 10f64.powf(0.25) * 1.001,
                "{family}: {} → {}",
                pair[0],
                pair[1]
            );
        }
    }
}

#[test]
fn updates_show_in_the_output() {
    let metrics = Metrics::new().unwrap();
    metrics.set_pleg_mode(PlegMode::Ebpf);
    metrics.inc_hint(HintLabel::Pod(HintKind::OomKilled));
    metrics.inc_relist(RelistType::Targeted);
    metrics.inc_relist(RelistType::Targeted);
    metrics.set_ring_buffer_drops_total(5);
    metrics.set_ring_buffer_drops_total(3);
    metrics.add_ring_buffer_drops(2);
    metrics.set_running(3, |state| usize::from(state == ContainerState::Running) * 4);
    metrics.observe_event_latency(Duration::from_micros(70));
    metrics.observe_pod_start(Duration::from_secs(7));
    let (_, samples) = parse(&metrics.render().unwrap());
    assert_eq!(samples["ringlet_pleg_mode{mode=\"ebpf\"}"], 1.0);
    assert_eq!(samples["ringlet_pleg_mode{mode=\"relist\"}"], 0.0);
    assert_eq!(
        samples["ringlet_pleg_hints_total{kind=\"oom_killed\"}"],
        1.0
    );
    assert_eq!(
        samples["ringlet_pleg_relists_total{type=\"targeted\"}"],
        2.0
    );
    assert_eq!(samples["ringlet_ebpf_ring_buffer_drops_total"], 7.0);
    assert_eq!(samples["kubelet_running_pods"], 3.0);
    assert_eq!(
        samples["kubelet_running_containers{container_state=\"running\"}"],
        4.0
    );
    assert_eq!(
        samples["kubelet_running_containers{container_state=\"created\"}"],
        0.0
    );
    assert_eq!(
        samples["ringlet_pleg_event_latency_seconds_bucket{le=\"0.0000562\"}"],
        0.0
    );
    assert_eq!(
        samples["ringlet_pleg_event_latency_seconds_bucket{le=\"0.0001\"}"],
        1.0
    );
    assert_eq!(
        samples["kubelet_pod_start_duration_seconds_bucket{le=\"6\"}"],
        0.0
    );
    assert_eq!(
        samples["kubelet_pod_start_duration_seconds_bucket{le=\"8\"}"],
        1.0
    );
}

#[test]
fn every_metric_has_help_text() {
    let text = Metrics::new().unwrap().render().unwrap();
    for (name, _) in EXPECTED {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
    }
}

/// A stopped probe worker's series leave `/metrics/probes`, as the kubelet's prober deletes them
/// (`ProberResults.Delete`), so the page does not grow with every pod the node ever ran. This is
/// what keeps the agent on the `prometheus` crate: `metrics-exporter-prometheus` has no way to
/// remove one label set (metrics-rs/metrics#243), only an idle timeout for whole kinds of metrics.
#[test]
fn a_forgotten_probe_leaves_the_probe_metrics() {
    let metrics = Metrics::new().unwrap();
    let labels = |pod: &str| ProbeLabels {
        probe_type: "Readiness",
        container: "app".to_owned(),
        pod: pod.to_owned(),
        namespace: "default".to_owned(),
        pod_uid: format!("uid-{pod}"),
    };
    let (gone, kept) = (labels("gone"), labels("kept"));
    for probe in [&gone, &kept] {
        metrics.observe_probe(
            probe,
            ProbeOutcomeLabel::Successful,
            Some(Duration::from_millis(3)),
        );
        metrics.observe_probe(probe, ProbeOutcomeLabel::Failed, None);
    }
    metrics.forget_probe(&gone);
    let text = metrics.render_probes().unwrap();
    assert!(!text.contains("pod=\"gone\""), "{text}");
    let (_, samples) = parse(&text);
    let kept_series = samples
        .keys()
        .filter(|series| series.contains("pod=\"kept\""))
        .count();
    // Two results of prober_probe_total, and the duration histogram's buckets, sum and count.
    assert!(kept_series > 2, "{text}");
}
