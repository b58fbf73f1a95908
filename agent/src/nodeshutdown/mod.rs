//! Graceful node shutdown (the kubelet's `pkg/kubelet/nodeshutdown`): when the machine is about to
//! shut down, the node turns not ready ("node is shutting down"), refuses new pods (reason
//! `NodeShutdown`), and stops its pods in priority groups, ordinary pods first and critical pods
//! last, each group with its grace period from `shutdownGracePeriod` and
//! `shutdownGracePeriodCriticalPods` or from `shutdownGracePeriodByPodPriority`. A stopped pod
//! ends `Failed` with reason `Terminated`, the kubelet's message and a `DisruptionTarget`
//! condition; the kill and the status go through the eviction manager's path
//! ([`crate::eviction::EvictionHost`] and [`crate::eviction::EvictionHandle`]).
//!
//! The [`NodeShutdownManager`] waits on a [`ShutdownSource`]. In production that is [`Logind`]:
//! logind's `PrepareForShutdown` signal, with a delay inhibitor lock that holds the shutdown back
//! until the pods are handled. Without a reachable logind the agent logs one warning and graceful
//! shutdown stays off. The lab has no logind, so the end-to-end test uses [`LabSignal`] instead:
//! `SIGUSR1` acts as `PrepareForShutdown(true)`. It is enabled only by the hidden flag
//! `--lab-node-shutdown-signal`, which replaces logind entirely, so a stray `SIGUSR1` (log
//! rotation scripts send it) cannot stop a production node's pods. Unit tests drive the manager
//! through a channel-backed source.

mod groups;
mod handle;
mod logind;
mod manager;
mod source;

pub use groups::{ShutdownGracePeriodByPodPriority, shutdown_periods};
pub use handle::{NOT_ADMITTED_REASON, NodeShutdownHandle};
pub use logind::Logind;
pub use manager::{MESSAGE, NodeShutdownManager, REASON};
pub use source::{LabSignal, ShutdownEvent, ShutdownSource};

/// Why shutdown events cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum NodeShutdownError {
    #[error("{what}")]
    Logind {
        what: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("watching SIGUSR1")]
    Signal(#[source] std::io::Error),
}
