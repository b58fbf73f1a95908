//! The agent's HTTP servers (the kubelet's `pkg/kubelet/server` plus its healthz listener): the
//! kubelet API over TLS (10250, authenticated and authorised, every endpoint), the plain read-only
//! port (10255, `/pods`, `/stats/summary`, `/metrics*` and `/healthz` without auth) and the healthz
//! port (`healthzBindAddress:healthzPort`, 127.0.0.1:10248 by default). All serve one socket-agnostic
//! router over hyper.
//!
//! The caller binds the sockets (with [`bind`]) so bind errors surface at startup with the address,
//! then runs [`serve_api`] / [`serve_read_only`] / [`serve_healthz`] until its shutdown future
//! completes. Sockets and connections belong to the I/O engine the agent runs on: all of this runs
//! inside [`crate::io::block_on`], and the serve futures are not `Send` (spawn them with
//! [`crate::io::spawn_connection`] or await them on that thread).

pub mod auth;
#[cfg(test)]
mod fake_host;
mod healthz;
mod listener;
pub mod node_logs;
mod peer;
mod router;
mod routes;
pub(crate) mod streaming;
mod tls;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use crate::container::{ContainerId, SandboxId, StreamingRuntime};
use crate::io::{IoEngine, Listener};
use crate::metrics::Metrics;
use crate::stats::Summary;

pub use listener::ServeLimits;
pub use peer::PeerCertificates;
use router::Router;
use routes::Endpoints;
pub use tls::{ServingTls, TlsError, TlsSettings};

/// What the servers need from the kubelet (the kubelet's `HostInterface`, reduced to what is served).
/// The synchronous methods answer from in-memory state; the async ones may ask the runtime.
#[async_trait]
pub trait ServerHost: Send + Sync + 'static {
    /// The pods this node manages, with their status filled in, as a `PodList` in JSON. Called on
    /// a blocking-pool thread.
    fn pod_list_json(&self) -> serde_json::Result<Vec<u8>>;
    /// The named checks behind `/healthz`, in display order.
    fn health_checks(&self) -> Vec<HealthCheck>;
    /// The metrics served on `/metrics`.
    fn metrics(&self) -> &Metrics;
    /// The configuration in effect, as `/configz` serves it.
    fn configz(&self) -> serde_json::Value;
    /// The node's log directory served under `/logs/` (the kubelet's `/var/log`).
    fn node_log_dir(&self) -> &Path;
    /// Pods as the runtime sees them (`/runningpods/`): only what the runtime knows, no spec.
    async fn running_pods(&self) -> Result<Vec<Pod>, HostError>;
    /// The Summary API (`/stats/summary`) for the node and its running pods; with
    /// `cpu_and_memory_only` without filesystem figures (`?only_cpu_and_memory=true`,
    /// `/metrics/resource`).
    async fn stats_summary(&self, cpu_and_memory_only: bool) -> Result<Summary, HostError>;
    /// The container a path names: the newest instance, or with `previous` the one before it.
    async fn container(
        &self,
        pod: &PodRef<'_>,
        container: &str,
        previous: bool,
    ) -> Result<FoundContainer, HostError>;
    /// The ready sandbox of a pod (for port forwarding).
    async fn sandbox(&self, pod: &PodRef<'_>) -> Result<SandboxId, HostError>;
    /// The runtime's streaming (exec, attach, port-forward) and in-container command API.
    fn streaming(&self) -> &dyn StreamingRuntime;
}

/// A pod as a request names it: namespace, name and, optionally, the UID of one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
}

/// A container found for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundContainer {
    pub id: ContainerId,
    pub running: bool,
}

/// Why the host could not answer; `NotFound` becomes a 404, `Unavailable` a 503.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
}

/// One named health check and its current result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// The check's name in `/healthz` output and its `/healthz/<name>` path: "ping", "syncloop", "pleg".
    pub name: &'static str,
    /// `Err` carries why the check fails; only `/healthz/<name>` shows it.
    pub result: Result<(), String>,
    /// Something worth knowing about the checked subsystem whatever the result (the PLEG's mode),
    /// shown as an `info:` line of the verbose `/healthz` output.
    pub detail: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("reading the listener's local address")]
    LocalAddr {
        #[source]
        source: io::Error,
    },
    #[error("accepting connections on {addr}")]
    Accept {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(
        "shutting down {addr}: {connections} connections still open after {grace:?} were closed"
    )]
    ShutdownTimedOut {
        addr: SocketAddr,
        grace: Duration,
        connections: usize,
    },
}

/// Binds a listening socket for one of the servers on `engine`'s sockets; must run inside
/// [`crate::io::block_on`] of that engine.
pub fn bind(addr: SocketAddr, engine: IoEngine) -> Result<Listener, ServerError> {
    Listener::bind(addr, engine).map_err(|source| ServerError::Bind { addr, source })
}

/// Serves the read-only API (`/pods`, `/metrics`, `/healthz`, `/healthz/<check>`) on `listener` until `shutdown`
/// completes; then stops accepting and waits a bounded time for open requests.
pub async fn serve_read_only(
    listener: Listener,
    host: Arc<dyn ServerHost>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let router = Router::new(host, Endpoints::ReadOnly, listener.engine());
    listener::serve(listener, router, shutdown).await
}

/// Serves only `/healthz` and `/healthz/<check>` on `listener`, like [`serve_read_only`].
pub async fn serve_healthz(
    listener: Listener,
    host: Arc<dyn ServerHost>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let router = Router::new(host, Endpoints::HealthzOnly, listener.engine());
    listener::serve(listener, router, shutdown).await
}

/// How the kubelet API (port 10250) serves: TLS, who may call it, and whether the debugging
/// handlers (logs, exec, attach, port-forward, run) are on.
pub struct ApiServing {
    pub tls: ServingTls,
    pub auth: auth::KubeletAuth,
    pub debugging_handlers: bool,
    pub limits: ServeLimits,
}

/// Serves the kubelet API over TLS on `listener` until `shutdown` completes, like
/// [`serve_read_only`]: every request is authenticated and authorised first; certificate and
/// client-CA file changes are picked up while it runs.
pub async fn serve_api(
    listener: Listener,
    serving: ApiServing,
    host: Arc<dyn ServerHost>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let metrics = host.metrics().clone();
    let router = Router::api(
        host,
        serving.debugging_handlers,
        serving.auth,
        listener.engine(),
    );
    listener::serve_tls(
        listener,
        serving.tls,
        router,
        serving.limits,
        Some(metrics),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
