//! The agent's Prometheus metrics (the kubelet's `pkg/kubelet/metrics`), served as Prometheus text
//! (`text/plain; version=0.0.4`) on `/metrics`; the prober's (`pkg/kubelet/prober/metrics.go`) are
//! a registry of their own, served on `/metrics/probes` as the kubelet does.
//!
//! The `kubelet_*` metrics keep the kubelet's names, types and buckets so existing alerts and
//! dashboards work against ringlet. The `ringlet_*` metrics are ringlet's own: kernel → PLEG event and
//! kernel → pod status latency of the eBPF PLEG, the runtime's lag behind the kernel, hints by kind,
//! targeted vs full relists, ring-buffer drops and the PLEG mode in use.
//!
//! Every [`Metrics`] value owns its registry; clones share it. The agent creates one and hands clones
//! to the PLEG, the sync path, the eBPF reader and the servers.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::container::ContainerState;
use crate::io::IoEngine;
use crate::pleg::{HintKind, PlegMode};

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The kubelet's buckets for relist duration and interval (Prometheus' `DefBuckets`).
const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The kubelet's buckets for `kubelet_pod_start_duration_seconds`.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// 10 µs to 10 s, four buckets per decade (10^(k/4), rounded to three digits so the `le` labels stay
/// short). The eBPF PLEG's latencies span that whole range (tens of microseconds kernel → event,
/// seconds for a lagging runtime), and only buckets of a constant ratio resolve each part of it
/// equally: a quantile interpolated within one is off by less than the ratio, 1.78×, at any scale.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    1e-5, 1.78e-5, 3.16e-5, 5.62e-5, 1e-4, 1.78e-4, 3.16e-4, 5.62e-4, 1e-3, 1.78e-3, 3.16e-3,
    5.62e-3, 1e-2, 1.78e-2, 3.16e-2, 5.62e-2, 1e-1, 1.78e-1, 3.16e-1, 5.62e-1, 1.0, 1.78, 3.16,
    5.62, 10.0,
];

/// Why the metrics could not be registered or rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("registering metric {name}")]
    Register {
        name: String,
        #[source]
        source: prometheus::Error,
    },
    #[error("encoding the metrics as Prometheus text")]
    Encode {
        #[source]
        source: prometheus::Error,
    },
}

/// Which relist a `ringlet_pleg_relists_total` sample counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelistType {
    /// One pod re-read because a hint named it.
    Targeted,
    /// Every pod listed (the safety relist, a resync, or relist mode's periodic relist).
    Full,
}

impl RelistType {
    fn label(self) -> &'static str {
        match self {
            Self::Targeted => "targeted",
            Self::Full => "full",
        }
    }
}

/// What a hint counted in `ringlet_pleg_hints_total` was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintLabel {
    Pod(HintKind),
    Resync,
    Refresh,
}

impl HintLabel {
    const ALL: [HintLabel; 7] = [
        HintLabel::Pod(HintKind::CgroupCreated),
        HintLabel::Pod(HintKind::CgroupRemoved),
        HintLabel::Pod(HintKind::Started),
        HintLabel::Pod(HintKind::Died),
        HintLabel::Pod(HintKind::OomKilled),
        HintLabel::Resync,
        HintLabel::Refresh,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Pod(HintKind::CgroupCreated) => "cgroup_created",
            Self::Pod(HintKind::CgroupRemoved) => "cgroup_removed",
            Self::Pod(HintKind::Started) => "started",
            Self::Pod(HintKind::Died) => "died",
            Self::Pod(HintKind::OomKilled) => "oom_killed",
            Self::Resync => "resync",
            Self::Refresh => "refresh",
        }
    }
}

/// What kind of failure a TLS handshake on the API port ended in
/// (`ringlet_tls_handshake_errors_total{reason}`); few kinds, so the series stay few.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsHandshakeError {
    /// The client's certificate was refused (unknown CA, expired, X.509 v1, ...).
    Certificate,
    /// The client sent an alert: it refused the handshake, e.g. it does not trust the server.
    Alert,
    /// Any other TLS error (no common version or cipher suite, a malformed message, ...).
    Protocol,
    /// The connection closed or broke before the handshake finished.
    Io,
    /// The client did not finish the handshake in time.
    Timeout,
}

impl TlsHandshakeError {
    const ALL: [TlsHandshakeError; 5] = [
        Self::Certificate,
        Self::Alert,
        Self::Protocol,
        Self::Io,
        Self::Timeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Certificate => "certificate",
            Self::Alert => "alert",
            Self::Protocol => "protocol",
            Self::Io => "io",
            Self::Timeout => "timeout",
        }
    }
}

/// The container states of `kubelet_running_containers{container_state}`, with the kubelet's label
/// values.
const CONTAINER_STATES: [(ContainerState, &str); 4] = [
    (ContainerState::Created, "created"),
    (ContainerState::Running, "running"),
    (ContainerState::Exited, "exited"),
    (ContainerState::Unknown, "unknown"),
];

/// The labels of one probe worker's series (the kubelet's `prober_probe_total` labels less
/// `result`; `prober_probe_duration_seconds` has them less `pod_uid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeLabels {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: &'static str,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// The `result` label of `prober_probe_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcomeLabel {
    Successful,
    Failed,
    Unknown,
}

impl ProbeOutcomeLabel {
    const ALL: [ProbeOutcomeLabel; 3] = [Self::Successful, Self::Failed, Self::Unknown];

    fn label(self) -> &'static str {
        match self {
            Self::Successful => "successful",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

impl ProbeLabels {
    fn total(&self, outcome: ProbeOutcomeLabel) -> [&str; 6] {
        [
            self.probe_type,
            outcome.label(),
            &self.container,
            &self.pod,
            &self.namespace,
            &self.pod_uid,
        ]
    }

    fn duration(&self) -> [&str; 4] {
        [self.probe_type, &self.container, &self.pod, &self.namespace]
    }
}

/// The prober's registry, served on `/metrics/probes`.
struct ProbeMetrics {
    registry: Registry,
    total: IntCounterVec,
    duration: HistogramVec,
}

impl ProbeMetrics {
    fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let total = register(
            &registry,
            "prober_probe_total",
            IntCounterVec::new(
                Opts::new(
                    "prober_probe_total",
                    "Cumulative number of a liveness, readiness or startup probe for a container \
                     by result.",
                ),
                &[
                    "probe_type",
                    "result",
                    "container",
                    "pod",
                    "namespace",
                    "pod_uid",
                ],
            ),
        )?;
        let duration = register(
            &registry,
            "prober_probe_duration_seconds",
            HistogramVec::new(
                HistogramOpts::new(
                    "prober_probe_duration_seconds",
                    "Duration in seconds for a probe response.",
                )
                .buckets(DEFAULT_BUCKETS.to_vec()),
                &["probe_type", "container", "pod", "namespace"],
            ),
        )?;
        Ok(Self {
            registry,
            total,
            duration,
        })
    }
}

struct Inner {
    registry: Registry,
    probes: ProbeMetrics,
    relist_duration: Histogram,
    relist_interval: Histogram,
    last_seen: Gauge,
    discard_events: IntCounter,
    running_pods: IntGauge,
    running_containers: IntGaugeVec,
    pod_start_duration: Histogram,
    event_latency: Histogram,
    status_latency: Histogram,
    runtime_lag: Histogram,
    hints: IntCounterVec,
    relists: IntCounterVec,
    ring_buffer_drops: IntCounter,
    kernel_exits: IntCounter,
    kernel_exits_pending: IntGauge,
    pods_awaiting_runtime: IntGauge,
    kernel_runtime_mismatch: IntCounter,
    pleg_panics: IntCounter,
    pleg_mode: IntGaugeVec,
    io_engine: IntGaugeVec,
    tls_handshake_errors: IntCounterVec,
}

/// A cloneable handle to the agent's metrics.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Registers one metric (created from this module's constant definitions) in `registry`.
pub(crate) fn register<M>(
    registry: &Registry,
    name: &str,
    metric: prometheus::Result<M>,
) -> Result<M, MetricsError>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let error = |source| MetricsError::Register {
        name: name.to_owned(),
        source,
    };
    let metric = metric.map_err(error)?;
    registry.register(Box::new(metric.clone())).map_err(error)?;
    Ok(metric)
}

/// The ring buffer's drop counter, which the agent and observe mode both export.
pub(crate) fn ring_buffer_drops(registry: &Registry) -> Result<IntCounter, MetricsError> {
    let name = "ringlet_ebpf_ring_buffer_drops_total";
    register(
        registry,
        name,
        IntCounter::new(
            name,
            "Events the eBPF programs could not reserve ring-buffer space for.",
        ),
    )
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<Histogram, MetricsError> {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, name, Histogram::with_opts(opts))
}

fn int_counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> Result<IntCounterVec, MetricsError> {
    register(
        registry,
        name,
        IntCounterVec::new(Opts::new(name, help), &[label]),
    )
}

fn int_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> Result<IntGaugeVec, MetricsError> {
    register(
        registry,
        name,
        IntGaugeVec::new(Opts::new(name, help), &[label]),
    )
}

impl Metrics {
    /// Every metric, registered in a fresh registry, labelled series present at zero. Fails only
    /// if a metric definition of this module is invalid.
    // One definition per metric; splitting the list would only scatter it.
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let r = &registry;
        let inner = Inner {
            relist_duration: histogram(
                r,
                "kubelet_pleg_relist_duration_seconds",
                "Duration in seconds for relisting pods in PLEG.",
                DEFAULT_BUCKETS,
            )?,
            relist_interval: histogram(
                r,
                "kubelet_pleg_relist_interval_seconds",
                "Interval in seconds between relisting in PLEG.",
                DEFAULT_BUCKETS,
            )?,
            last_seen: register(
                r,
                "kubelet_pleg_last_seen_seconds",
                Gauge::new(
                    "kubelet_pleg_last_seen_seconds",
                    "Timestamp in seconds when PLEG was last seen active.",
                ),
            )?,
            discard_events: register(
                r,
                "kubelet_pleg_discard_events",
                IntCounter::new(
                    "kubelet_pleg_discard_events",
                    "The number of discard events in PLEG.",
                ),
            )?,
            running_pods: register(
                r,
                "kubelet_running_pods",
                IntGauge::new(
                    "kubelet_running_pods",
                    "Number of pods that have a running pod sandbox",
                ),
            )?,
            running_containers: int_gauge_vec(
                r,
                "kubelet_running_containers",
                "Number of containers currently running",
                "container_state",
            )?,
            pod_start_duration: histogram(
                r,
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod \
                 starting to run",
                POD_START_BUCKETS,
            )?,
            event_latency: histogram(
                r,
                "ringlet_pleg_event_latency_seconds",
                "Seconds from the kernel seeing a container change (eBPF timestamp) to the PLEG \
                 emitting the lifecycle event.",
                LATENCY_BUCKETS,
            )?,
            status_latency: histogram(
                r,
                "ringlet_pod_status_latency_seconds",
                "Seconds from the kernel seeing a container change (eBPF timestamp) to the pod's \
                 status reflecting it.",
                LATENCY_BUCKETS,
            )?,
            runtime_lag: histogram(
                r,
                "ringlet_pleg_runtime_lag_seconds",
                "Seconds the container runtime trailed the kernel: from a targeted relist that \
                 still missed a container start or exit the kernel reported to the one that \
                 showed it (only lagging reads are observed).",
                LATENCY_BUCKETS,
            )?,
            hints: int_counter_vec(
                r,
                "ringlet_pleg_hints_total",
                "Hints the PLEG received from its hint source, by kind.",
                "kind",
            )?,
            relists: int_counter_vec(
                r,
                "ringlet_pleg_relists_total",
                "Relists the PLEG ran: targeted (one pod) or full.",
                "type",
            )?,
            ring_buffer_drops: ring_buffer_drops(r)?,
            kernel_exits: register(
                r,
                "ringlet_pleg_kernel_exits_total",
                IntCounter::new(
                    "ringlet_pleg_kernel_exits_total",
                    "Container exits the PLEG published from the kernel (the exit of the \
                     container's proven init) before the runtime reported them.",
                ),
            )?,
            kernel_exits_pending: register(
                r,
                "ringlet_pleg_kernel_exits_pending",
                IntGauge::new(
                    "ringlet_pleg_kernel_exits_pending",
                    "Kernel-published exits the runtime has not reported yet.",
                ),
            )?,
            pods_awaiting_runtime: register(
                r,
                "ringlet_pleg_pods_awaiting_runtime",
                IntGauge::new(
                    "ringlet_pleg_pods_awaiting_runtime",
                    "Pods whose runtime does not show yet a container start or exit the kernel \
                     reported; read again with back-off until the grace period, then everything \
                     is relisted.",
                ),
            )?,
            kernel_runtime_mismatch: register(
                r,
                "ringlet_pleg_kernel_runtime_mismatch_total",
                IntCounter::new(
                    "ringlet_pleg_kernel_runtime_mismatch_total",
                    "Kernel-published exits the runtime disagreed with: another exit code, or the \
                     container still running past the grace period (the exit is then withdrawn).",
                ),
            )?,
            pleg_panics: register(
                r,
                "ringlet_pleg_panics_total",
                IntCounter::new(
                    "ringlet_pleg_panics_total",
                    "Panics of the PLEG loop; each restarted the loop from a full relist.",
                ),
            )?,
            pleg_mode: int_gauge_vec(
                r,
                "ringlet_pleg_mode",
                "The PLEG mode in use (1 for the active mode).",
                "mode",
            )?,
            io_engine: int_gauge_vec(
                r,
                "ringlet_io_engine",
                "The I/O engine the agent runs on (1 for the engine in use).",
                "engine",
            )?,
            tls_handshake_errors: int_counter_vec(
                r,
                "ringlet_tls_handshake_errors_total",
                "TLS handshakes on the kubelet API port that failed, by kind: certificate (a client \
                 certificate was refused), alert (the client refused the handshake), protocol, io \
                 (the connection broke or closed) or timeout.",
                "reason",
            )?,
            registry,
            probes: ProbeMetrics::new()?,
        };
        for label in HintLabel::ALL {
            inner.hints.with_label_values(&[label.label()]);
        }
        for relist in [RelistType::Targeted, RelistType::Full] {
            inner.relists.with_label_values(&[relist.label()]);
        }
        for (_, state) in CONTAINER_STATES {
            inner.running_containers.with_label_values(&[state]);
        }
        for reason in TlsHandshakeError::ALL {
            inner
                .tls_handshake_errors
                .with_label_values(&[reason.label()]);
        }
        let metrics = Self {
            inner: Arc::new(inner),
        };
        metrics.set_pleg_mode(PlegMode::Relist);
        Ok(metrics)
    }

    /// The metrics in the Prometheus text format (served with [`CONTENT_TYPE`]).
    pub fn render(&self) -> Result<String, MetricsError> {
        TextEncoder::new()
            .encode_to_string(&self.inner.registry.gather())
            .map_err(|source| MetricsError::Encode { source })
    }

    /// The prober's metrics in the Prometheus text format (`/metrics/probes`).
    pub fn render_probes(&self) -> Result<String, MetricsError> {
        TextEncoder::new()
            .encode_to_string(&self.inner.probes.registry.gather())
            .map_err(|source| MetricsError::Encode { source })
    }

    /// One probe of a worker ended with `outcome` (`prober_probe_total`) after `duration`
    /// (`prober_probe_duration_seconds`; the kubelet times successful and unknown probes only).
    pub fn observe_probe(
        &self,
        labels: &ProbeLabels,
        outcome: ProbeOutcomeLabel,
        duration: Option<Duration>,
    ) {
        let probes = &self.inner.probes;
        probes.total.with_label_values(&labels.total(outcome)).inc();
        if let Some(duration) = duration {
            probes
                .duration
                .with_label_values(&labels.duration())
                .observe(duration.as_secs_f64());
        }
    }

    /// Drops a stopped worker's series.
    pub fn forget_probe(&self, labels: &ProbeLabels) {
        let probes = &self.inner.probes;
        for outcome in ProbeOutcomeLabel::ALL {
            // A series the worker never touched is not there to remove.
            let _ = probes.total.remove_label_values(&labels.total(outcome));
        }
        let _ = probes.duration.remove_label_values(&labels.duration());
    }

    /// A full relist took `duration` (`kubelet_pleg_relist_duration_seconds`).
    pub fn observe_relist_duration(&self, duration: Duration) {
        self.inner.relist_duration.observe(duration.as_secs_f64());
    }

    /// Time since the previous successful full relist started
    /// (`kubelet_pleg_relist_interval_seconds`).
    pub fn observe_relist_interval(&self, interval: Duration) {
        self.inner.relist_interval.observe(interval.as_secs_f64());
    }

    /// The PLEG was active now (`kubelet_pleg_last_seen_seconds`).
    pub fn set_pleg_last_seen_now(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.inner.last_seen.set(now.as_secs_f64());
    }

    /// The PLEG dropped an event because its channel was full (`kubelet_pleg_discard_events`).
    pub fn inc_pleg_discard_events(&self) {
        self.inner.discard_events.inc();
    }

    /// `kubelet_running_pods` and `kubelet_running_containers{container_state}` from the PLEG's
    /// latest view: `running_sandboxes` ready sandboxes and `containers` of each state.
    pub fn set_running(
        &self,
        running_sandboxes: usize,
        containers: impl Fn(ContainerState) -> usize,
    ) {
        self.inner.running_pods.set(gauge_value(running_sandboxes));
        for (state, label) in CONTAINER_STATES {
            self.inner
                .running_containers
                .with_label_values(&[label])
                .set(gauge_value(containers(state)));
        }
    }

    /// A pod reached Running `duration` after it was first seen
    /// (`kubelet_pod_start_duration_seconds`).
    pub fn observe_pod_start(&self, duration: Duration) {
        self.inner
            .pod_start_duration
            .observe(duration.as_secs_f64());
    }

    /// Kernel → PLEG event latency (`ringlet_pleg_event_latency_seconds`).
    pub fn observe_event_latency(&self, latency: Duration) {
        self.inner.event_latency.observe(latency.as_secs_f64());
    }

    /// Kernel → pod status latency (`ringlet_pod_status_latency_seconds`).
    pub fn observe_status_latency(&self, latency: Duration) {
        self.inner.status_latency.observe(latency.as_secs_f64());
    }

    /// How long the runtime lagged behind a kernel-reported exit (`ringlet_pleg_runtime_lag_seconds`).
    pub fn observe_runtime_lag(&self, lag: Duration) {
        self.inner.runtime_lag.observe(lag.as_secs_f64());
    }

    /// One exit published from the kernel (`ringlet_pleg_kernel_exits_total`).
    pub fn inc_kernel_exits_published(&self) {
        self.inner.kernel_exits.inc();
    }

    /// Kernel-published exits waiting for the runtime (`ringlet_pleg_kernel_exits_pending`).
    pub fn set_kernel_exits_pending(&self, pending: usize) {
        self.inner
            .kernel_exits_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    /// Pods read again until the runtime catches up with the kernel
    /// (`ringlet_pleg_pods_awaiting_runtime`).
    pub fn set_pods_awaiting_runtime(&self, pods: usize) {
        self.inner
            .pods_awaiting_runtime
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
    }

    /// One disagreement of the runtime with a kernel-published exit
    /// (`ringlet_pleg_kernel_runtime_mismatch_total`).
    pub fn inc_kernel_runtime_mismatch(&self) {
        self.inner.kernel_runtime_mismatch.inc();
    }

    /// The PLEG loop panicked and was restarted (`ringlet_pleg_panics_total`).
    pub fn inc_pleg_panics(&self) {
        self.inner.pleg_panics.inc();
    }

    /// One hint received (`ringlet_pleg_hints_total{kind}`).
    pub fn inc_hint(&self, hint: HintLabel) {
        self.inner.hints.with_label_values(&[hint.label()]).inc();
    }

    /// One relist started (`ringlet_pleg_relists_total{type}`).
    pub fn inc_relist(&self, relist: RelistType) {
        self.inner
            .relists
            .with_label_values(&[relist.label()])
            .inc();
    }

    /// Adds `drops` failed ring-buffer reservations (`ringlet_ebpf_ring_buffer_drops_total`).
    pub fn add_ring_buffer_drops(&self, drops: u64) {
        self.inner.ring_buffer_drops.inc_by(drops);
    }

    /// Raises `ringlet_ebpf_ring_buffer_drops_total` to `total`, the sum of the BPF side's drop
    /// counters; a smaller total (counters re-created) is ignored. Meant for a single reader.
    pub fn set_ring_buffer_drops_total(&self, total: u64) {
        let current = self.inner.ring_buffer_drops.get();
        if total > current {
            self.inner.ring_buffer_drops.inc_by(total - current);
        }
    }

    /// `ringlet_io_engine{engine}`: 1 for `engine`, 0 for the other.
    pub fn set_io_engine(&self, engine: IoEngine) {
        for candidate in [IoEngine::Uring, IoEngine::Epoll] {
            self.inner
                .io_engine
                .with_label_values(&[candidate.as_str()])
                .set(i64::from(candidate == engine));
        }
    }

    /// One failed TLS handshake on the API port (`ringlet_tls_handshake_errors_total{reason}`).
    pub fn inc_tls_handshake_error(&self, reason: TlsHandshakeError) {
        self.inner
            .tls_handshake_errors
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// `ringlet_pleg_mode{mode}`: 1 for `mode`, 0 for the other.
    pub fn set_pleg_mode(&self, mode: PlegMode) {
        for candidate in [PlegMode::Relist, PlegMode::Ebpf] {
            self.inner
                .pleg_mode
                .with_label_values(&[candidate.as_str()])
                .set(i64::from(candidate == mode));
        }
    }
}

fn gauge_value(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
