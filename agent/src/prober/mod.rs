//! Container probes (the kubelet's `pkg/kubelet/prober` with the mechanisms of `pkg/probe`): one
//! worker task per container and probe type (liveness, readiness, startup) runs the probe every
//! `periodSeconds` after a jittered start, applies the thresholds and writes the verdict into the
//! [`ProbeResults`] caches. A changed verdict is sent to the sync loop, which marks the container
//! ready or started in the status manager and asks for a pod sync; a failed liveness or startup
//! verdict makes that sync kill and restart the container. Probes never run inside a sync, and a
//! sync never waits for a probe.
//!
//! The mechanisms: `exec` through the runtime's `ExecSync` with the probe's timeout, HTTP GET (same
//! host redirects followed, a redirect elsewhere is a success with a warning, at most 10 KiB of the
//! body read), TCP connect, and gRPC `grpc.health.v1.Health/Check`. `/metrics/probes` serves
//! `prober_probe_total` and `prober_probe_duration_seconds` with the kubelet's labels.

pub mod exec;
pub mod grpc;
pub mod http;
mod manager;
mod port;
mod probe;
mod results;
pub mod tcp;
mod worker;

use std::fmt;

pub use manager::{ProbeHandle, ProbeManager, ProbeManagerDeps};
pub use port::{PortError, resolve_container_port};
pub use probe::Prober;
pub use results::{ProbeResult, ProbeResults, ResultUpdate, ResultUpdates};

/// The largest part of a probe's output (HTTP body, exec stdout and stderr) the prober keeps, as
/// the kubelet (`maxRespBodyLength`, `maxReadLength`).
pub const MAX_OUTPUT_BYTES: usize = 10 * 1024;

/// The `major.minor` of the Kubernetes release the agent follows, for the probes' `User-Agent`
/// (`kube-probe/1.36`) and the lifecycle hooks' (`kube-lifecycle/1.36`).
pub const KUBE_MINOR_VERSION: &str = "1.36";

/// Which probe of a container a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    pub const ALL: [ProbeType; 3] = [Self::Liveness, Self::Readiness, Self::Startup];

    /// The kubelet's name of the probe type, used in events (`Liveness probe failed: ...`) and as
    /// the `probe_type` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }
}

impl fmt::Display for ProbeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one run of a probe mechanism found (the kubelet's `probe.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// A success worth a `ProbeWarning` event (an HTTP redirect to another host).
    Warning,
    Failure,
    Unknown,
}

impl Outcome {
    /// The kubelet's spelling, as it appears in `... resulted in unknown state: ...`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Warning => "warning",
            Self::Failure => "failure",
            Self::Unknown => "unknown",
        }
    }
}

/// A mechanism's verdict and its output (the exec output, the HTTP body or failure text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probed {
    pub outcome: Outcome,
    pub output: String,
}

impl Probed {
    pub fn new(outcome: Outcome, output: impl Into<String>) -> Self {
        Self {
            outcome,
            output: output.into(),
        }
    }
}

/// Why a probe could not be run at all (the kubelet's probe `error`): the worker throws the result
/// away and keeps the container's previous verdict, after an `Unhealthy` event saying so.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Port(#[from] PortError),
    #[error("{0}")]
    Exec(String),
    #[error("{0}")]
    Request(String),
    /// The HTTP body could not be read (the outcome is a failure, but an errored one).
    #[error("{0}")]
    Body(String),
    #[error("missing probe handler for {pod}:{container}")]
    MissingHandler { pod: String, container: String },
}

impl ProbeError {
    /// The outcome an errored probe reports in its event.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Body(_) => Outcome::Failure,
            _ => Outcome::Unknown,
        }
    }
}

/// A Go-style `time.Duration` (`1s`, `1m30s`), as the kubelet's probe messages print timeouts.
pub(crate) fn go_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    let millis = d.subsec_millis();
    if secs == 0 && millis > 0 {
        return format!("{millis}ms");
    }
    if secs < 60 {
        return format!("{secs}s");
    }
    if secs < 3600 {
        return format!("{}m{}s", secs / 60, secs % 60);
    }
    format!("{}h{}m{}s", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// The kubelet's `format.Pod`: `name_namespace(uid)`.
pub(crate) fn format_pod(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
    }

    #[test]
    fn names_are_the_kubelets() {
        assert_eq!(ProbeType::Liveness.to_string(), "Liveness");
        assert_eq!(Outcome::Unknown.as_str(), "unknown");
    }
}
