//! Observe mode's Prometheus metrics, a registry of their own: the kubelet's status lag behind the
//! kernel per source (`ringlet_observed_kubelet_status_lag_seconds{source}`, with the buckets of
//! ringlet's own PLEG latency histograms so the two compare bucket by bucket), what could not be
//! measured, and the eBPF ring-buffer drops the agent exports too.

use std::time::Duration;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use super::args::SourceKind;
use crate::metrics::{LATENCY_BUCKETS, MetricsError, register, ring_buffer_drops};

/// A cloneable handle to observe mode's metrics.
#[derive(Clone)]
pub struct ObserveMetrics {
    registry: Registry,
    lag: HistogramVec,
    gave_up: IntCounterVec,
    exits_of_removed_pods: IntCounterVec,
    source_errors: IntCounterVec,
    pending: prometheus::IntGaugeVec,
    exits: IntCounter,
    containers: IntGauge,
    ring_buffer_drops: IntCounter,
}

impl ObserveMetrics {
    /// The metrics, with every series of `sources` present from the start (at zero).
    pub fn new(sources: &[SourceKind]) -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let r = &registry;
        let counter_vec = |name: &str, help: &str| {
            register(
                r,
                name,
                IntCounterVec::new(Opts::new(name, help), &["source"]),
            )
        };
        let metrics = Self {
            lag: register(
                r,
                "ringlet_observed_kubelet_status_lag_seconds",
                HistogramVec::new(
                    HistogramOpts::new(
                        "ringlet_observed_kubelet_status_lag_seconds",
                        "From the kernel's exit of a container's init to the kubelet reporting the \
                         container terminated, by where the report was read.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["source"],
                ),
            )?,
            gave_up: counter_vec(
                "ringlet_observed_kubelet_status_lag_timeouts_total",
                "Container exits the kubelet did not report within the give-up bound.",
            )?,
            exits_of_removed_pods: counter_vec(
                "ringlet_observed_kubelet_exits_of_removed_pods_total",
                "Container exits not measured: their pod left the source before it reported them \
                 (a removed pod's containers).",
            )?,
            source_errors: counter_vec(
                "ringlet_observed_source_errors_total",
                "Failed reads of a source: the kubelet unreachable, a bad answer, a broken watch.",
            )?,
            pending: register(
                r,
                "ringlet_observed_pending_exits",
                prometheus::IntGaugeVec::new(
                    Opts::new(
                        "ringlet_observed_pending_exits",
                        "Container exits seen in the kernel that the source has not reported yet.",
                    ),
                    &["source"],
                ),
            )?,
            exits: register(
                r,
                "ringlet_observed_container_exits_total",
                IntCounter::new(
                    "ringlet_observed_container_exits_total",
                    "Exits of a container's init process seen in the kernel.",
                ),
            )?,
            containers: register(
                r,
                "ringlet_observed_containers",
                IntGauge::new(
                    "ringlet_observed_containers",
                    "Running containers on the node, as of the last CRI list.",
                ),
            )?,
            ring_buffer_drops: ring_buffer_drops(r)?,
            registry,
        };
        for source in sources {
            let label = [source.label()];
            metrics.lag.with_label_values(&label);
            metrics.gave_up.with_label_values(&label);
            metrics.exits_of_removed_pods.with_label_values(&label);
            metrics.source_errors.with_label_values(&label);
            metrics.pending.with_label_values(&label);
        }
        Ok(metrics)
    }

    pub fn observe_lag(&self, source: SourceKind, lag: Duration) {
        self.lag
            .with_label_values(&[source.label()])
            .observe(lag.as_secs_f64());
    }

    pub fn gave_up(&self, source: SourceKind, exits: u64) {
        self.gave_up
            .with_label_values(&[source.label()])
            .inc_by(exits);
    }

    pub fn exits_of_removed_pods(&self, source: SourceKind, exits: u64) {
        self.exits_of_removed_pods
            .with_label_values(&[source.label()])
            .inc_by(exits);
    }

    pub fn source_error(&self, source: SourceKind) {
        self.source_errors
            .with_label_values(&[source.label()])
            .inc();
    }

    pub fn set_pending(&self, source: SourceKind, pending: usize) {
        self.pending
            .with_label_values(&[source.label()])
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    pub fn container_exit(&self) {
        self.exits.inc();
    }

    pub fn set_containers(&self, running: usize) {
        self.containers
            .set(i64::try_from(running).unwrap_or(i64::MAX));
    }

    /// Raises the drop counter to the BPF side's `total` (a smaller one is ignored).
    pub fn set_ring_buffer_drops_total(&self, total: u64) {
        let current = self.ring_buffer_drops.get();
        if total > current {
            self.ring_buffer_drops.inc_by(total - current);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Result<String, MetricsError> {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|source| MetricsError::Encode { source })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_histogram_has_the_pleg_buckets_and_every_source_from_the_start() {
        let metrics =
            ObserveMetrics::new(&[SourceKind::KubeletPods, SourceKind::Apiserver]).unwrap();
        metrics.observe_lag(SourceKind::KubeletPods, Duration::from_millis(30));
        let text = metrics.render().unwrap();
        assert!(text.contains(
            "ringlet_observed_kubelet_status_lag_seconds_count{source=\"kubelet_pods\"} 1"
        ));
        assert!(
            text.contains(
                "ringlet_observed_kubelet_status_lag_seconds_count{source=\"apiserver\"} 0"
            )
        );
        let buckets = text
            .lines()
            .filter(|l| {
                l.starts_with("ringlet_observed_kubelet_status_lag_seconds_bucket{")
                    && l.contains("kubelet_pods")
            })
            .count();
        assert_eq!(buckets, LATENCY_BUCKETS.len() + 1, "plus +Inf");
    }
}
