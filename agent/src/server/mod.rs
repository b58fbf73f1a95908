//! The agent's HTTP servers (the kubelet's `pkg/kubelet/server` plus its healthz listener): the plain
//! read-only port (10255, `/pods`, `/metrics` and `/healthz` without auth) and the healthz port
//! (`healthzBindAddress:healthzPort`, 127.0.0.1:10248 by default). Both serve one socket-agnostic
//! router over hyper, so the TLS API port can reuse it.
//!
//! The caller binds the sockets (with [`bind`]) so bind errors surface at startup with the address,
//! then runs [`serve_read_only`] / [`serve_healthz`] until its shutdown future completes.

pub mod auth;
mod healthz;
mod listener;
pub mod node_logs;
mod peer;
mod router;
pub mod streaming;
mod tls;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

pub use listener::ServeLimits;
pub use peer::PeerCertificates;
use router::{Endpoints, Router};
pub use tls::{ServingTls, TlsError, TlsSettings};

/// What the servers need from the kubelet (the kubelet's `HostInterface`, reduced to what is served).
/// Both methods are called on request, so they should answer from in-memory state.
pub trait ServerHost: Send + Sync + 'static {
    /// The pods this node manages, with their status filled in. Called on a blocking-pool thread.
    fn pods(&self) -> Vec<Pod>;
    /// The named checks behind `/healthz`, in display order.
    fn health_checks(&self) -> Vec<HealthCheck>;
    /// The metrics served on `/metrics`.
    fn metrics(&self) -> &Metrics;
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

/// Binds a listening socket for one of the servers.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves the read-only API (`/pods`, `/metrics`, `/healthz`, `/healthz/<check>`) on `listener` until `shutdown`
/// completes; then stops accepting and waits a bounded time for open requests.
pub async fn serve_read_only(
    listener: TcpListener,
    host: Arc<dyn ServerHost>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    listener::serve(listener, Router::new(host, Endpoints::ReadOnly), shutdown).await
}

/// Serves only `/healthz` and `/healthz/<check>` on `listener`, like [`serve_read_only`].
pub async fn serve_healthz(
    listener: TcpListener,
    host: Arc<dyn ServerHost>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    listener::serve(
        listener,
        Router::new(host, Endpoints::HealthzOnly),
        shutdown,
    )
    .await
}

/// Serves the kubelet API over TLS (port 10250) on `listener` until `shutdown` completes, like
/// [`serve_read_only`]; certificate and client-CA file changes are picked up while it runs.
pub async fn serve_tls(
    listener: TcpListener,
    tls: ServingTls,
    host: Arc<dyn ServerHost>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    listener::serve_tls(
        listener,
        tls,
        Router::new(host, Endpoints::ReadOnly),
        limits,
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests;
