//! The accept loop and per-connection HTTP/1 driver shared by the listeners (the part of Go's
//! `http.Server` the kubelet relies on): plain or TLS transport, a cap on open connections, request
//! size and header-time limits, a TLS handshake deadline, and graceful shutdown (stop accepting, let
//! open requests finish, give up after a bounded wait).
//!
//! Sockets come from the I/O engine ([`crate::io::Listener`]) and each connection is a local task on
//! the engine's thread (as [`crate::io::spawn_connection`] makes them), so the listener runs inside
//! [`crate::io::block_on`] and the I/O of every connection goes through the engine.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;

use super::ServerError;
use super::peer::PeerCertificates;
use super::router::{Body, Router};
use super::tls::ServingTls;
use super::tls::handshake::{Failure, HandshakeErrors};
use crate::io::{Listener, SendStream, Stream};
use crate::metrics::Metrics;

/// The kubelet's `MaxHeaderBytes` (1 MiB) for the request line plus headers.
const MAX_HEADER_BYTES: usize = 1 << 20;
/// Room for the header block plus hyper's read-ahead, so the header limit is what trips first.
const MAX_BUF_BYTES: usize = MAX_HEADER_BYTES + (64 << 10);
/// Default of [`ServeLimits::header_read_timeout`].
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeLimits::shutdown_grace`].
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Default of [`ServeLimits::tls_handshake_timeout`] (Go's usual TLS handshake timeout).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeLimits::max_connections`].
const MAX_CONNECTIONS: usize = 1024;
/// Longest pause after an accept failure such as running out of file descriptors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Per-listener limits that keep slow or hostile clients from exhausting the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once. When all are taken the listener stops accepting, so new
    /// connections wait in the kernel's backlog until one closes; the open ones keep being served.
    pub max_connections: usize,
    /// How long a client may take to send a request's head. hyper starts this clock whenever it waits
    /// for a request, so it is also the idle timeout of a kept-alive connection. Bodies and upgraded
    /// streams (exec, attach, port-forward) are not bounded by it.
    pub header_read_timeout: Duration,
    /// How long a client may take to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long shutdown waits for open requests before closing their connections.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
        }
    }
}

/// How an accepted TCP connection becomes the byte stream HTTP runs over. The stream is `Send`
/// because hyper's upgrades require it.
pub(crate) trait Transport: 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// For log lines.
    const SCHEME: &'static str;

    /// Completes the transport's handshake; also returns the client's certificates when it sent any.
    fn handshake(
        &self,
        tcp: SendStream,
    ) -> impl Future<Output = io::Result<(Self::Stream, Option<PeerCertificates>)>>;

    /// Says why a handshake with `peer` failed or timed out.
    fn handshake_failed(&self, peer: SocketAddr, failure: &Failure) {
        tracing::debug!(%peer, reason = %failure.reason, scheme = Self::SCHEME, "handshake failed");
    }
}

/// Plain HTTP: the TCP stream as is.
pub(crate) struct Plain;

impl Transport for Plain {
    type Stream = SendStream;
    const SCHEME: &'static str = "http";

    async fn handshake(
        &self,
        tcp: SendStream,
    ) -> io::Result<(SendStream, Option<PeerCertificates>)> {
        Ok((tcp, None))
    }
}

/// HTTPS with the API port's current certificate and client-certificate policy; failed handshakes
/// are logged (rate-limited) and counted.
pub(crate) struct Tls {
    pub(crate) tls: ServingTls,
    pub(crate) errors: HandshakeErrors,
}

impl Transport for Tls {
    type Stream = TlsStream<SendStream>;
    const SCHEME: &'static str = "https";

    async fn handshake(
        &self,
        tcp: SendStream,
    ) -> io::Result<(TlsStream<SendStream>, Option<PeerCertificates>)> {
        let stream = self.tls.acceptor().accept(tcp).await?;
        let peer = stream
            .get_ref()
            .1
            .peer_certificates()
            .filter(|chain| !chain.is_empty())
            .map(|chain| PeerCertificates(Arc::from(chain.to_vec())));
        Ok((stream, peer))
    }

    fn handshake_failed(&self, peer: SocketAddr, failure: &Failure) {
        self.errors.report(peer, failure);
    }
}

/// What a listener serves: the [`Router`], or a test's own service.
pub(crate) trait Handler:
    Service<Request<Incoming>, Response = Response<Body>, Error = Infallible> + Clone + 'static
{
}

impl<S> Handler for S where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible> + Clone + 'static
{
}

/// The handler behind one connection: adds what the handshake learned to every request.
struct Connected<S> {
    handler: S,
    peer: Option<PeerCertificates>,
}

impl<S: Handler> Service<Request<Incoming>> for Connected<S> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = S::Future;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        self.handler.call(request)
    }
}

/// Serves `router` over plain HTTP on `listener` with the default limits until `shutdown` completes,
/// then drains open connections.
pub(crate) async fn serve(
    listener: Listener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run(listener, Plain, router, ServeLimits::default(), shutdown).await
}

/// Serves `handler` over TLS on `listener`, following rotations of the certificate files while it
/// runs, until `shutdown` completes; then drains open connections. Failed handshakes are counted in
/// `metrics` when given.
pub(crate) async fn serve_tls(
    listener: Listener,
    tls: ServingTls,
    handler: impl Handler,
    limits: ServeLimits,
    metrics: Option<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let _watching = tls.watch();
    let transport = Tls {
        tls,
        errors: HandshakeErrors::new(metrics),
    };
    run(listener, transport, handler, limits, shutdown).await
}

/// The accept loop. A connection slot is taken before accepting, so a full listener leaves new
/// connections in the kernel backlog rather than accepting and dropping them.
pub(crate) async fn run<T: Transport, S: Handler>(
    listener: Listener,
    transport: T,
    handler: S,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map_err(|source| ServerError::LocalAddr { source })?;
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_BUF_BYTES);
    let context = Rc::new(ConnectionContext {
        transport,
        builder,
        handler,
        handshake_timeout: limits.tls_handshake_timeout,
    });
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));

    // Dropping the sender is the stop signal: every connection's receiver sees it.
    let (stop_tx, stop_rx) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut backoff = Duration::ZERO;
    let mut full = false;
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(%addr, scheme = T::SCHEME, "serving HTTP");

    let fatal = loop {
        while connections.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = &mut shutdown => break None,
            slot = free_slot(&slots, &mut full, addr, limits.max_connections) => slot,
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::ZERO;
                // Responses are small and written whole; waiting to coalesce them only adds latency.
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, %error, "setting TCP_NODELAY");
                }
                // The same spawn_local as `io::spawn_connection`, tracked so shutdown can wait for
                // the connections and then abort the ones still open.
                connections.spawn_local(connection(
                    Rc::clone(&context),
                    stream,
                    peer,
                    stop_rx.clone(),
                    slot,
                ));
            }
            Err(error) if is_per_connection(&error) => {
                tracing::debug!(%addr, %error, "accepting a connection");
            }
            Err(error) if is_fatal(&error) => break Some(error),
            Err(error) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(5), MAX_ACCEPT_BACKOFF);
                tracing::warn!(%addr, %error, ?backoff, "accepting connections; retrying");
                tokio::select! {
                    () = &mut shutdown => break None,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
    };

    drop(listener);
    drop(stop_tx);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    let result = match (fatal, drained) {
        (Some(source), _) => Err(ServerError::Accept { addr, source }),
        (None, Ok(())) => Ok(()),
        (None, Err(_)) => Err(ServerError::ShutdownTimedOut {
            addr,
            grace: limits.shutdown_grace,
            connections: connections.len(),
        }),
    };
    connections.abort_all();
    tracing::info!(%addr, scheme = T::SCHEME, "stopped serving HTTP");
    result
}

/// Waits for a connection slot, saying once per busy spell that the limit was reached.
async fn free_slot(
    slots: &Arc<Semaphore>,
    full: &mut bool,
    addr: SocketAddr,
    max_connections: usize,
) -> OwnedSemaphorePermit {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        *full = false;
        return slot;
    }
    if !*full {
        *full = true;
        tracing::warn!(
            %addr,
            max_connections,
            "connection limit reached; new connections wait until one closes"
        );
    }
    match Arc::clone(slots).acquire_owned().await {
        Ok(slot) => slot,
        // The semaphore is never closed; if it were, no slot would ever come free again.
        Err(_) => std::future::pending().await,
    }
}

/// What every connection of one listener shares.
struct ConnectionContext<T, S> {
    transport: T,
    builder: http1::Builder,
    handler: S,
    handshake_timeout: Duration,
}

/// One connection's life: the transport handshake (bounded, and cut short by shutdown), then HTTP
/// until the client leaves or shutdown asks it to finish. Holding `_slot` keeps the connection counted.
async fn connection<T: Transport, S: Handler>(
    context: Rc<ConnectionContext<T, S>>,
    tcp: Stream,
    peer: SocketAddr,
    mut stop: watch::Receiver<()>,
    _slot: OwnedSemaphorePermit,
) {
    let handshake_timeout = context.handshake_timeout;
    let handshake = tokio::time::timeout(
        handshake_timeout,
        context.transport.handshake(tcp.into_send()),
    );
    let (stream, certificates) = tokio::select! {
        result = handshake => match result {
            Ok(Ok(done)) => done,
            Ok(Err(error)) => {
                context.transport.handshake_failed(peer, &Failure::of(&error));
                return;
            }
            Err(_) => {
                context.transport.handshake_failed(peer, &Failure::timed_out(handshake_timeout));
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let service = Connected {
        handler: context.handler.clone(),
        peer: certificates,
    };
    // Upgrades let exec, attach and port-forward take over the connection after their 101 response.
    let connection = context
        .builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = stop.changed() => {
            // Finishes the request in progress, then closes instead of waiting for another.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "serving an HTTP connection");
    }
}

/// Errors about the one connection being accepted; the listener itself is fine.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Errors meaning the listening socket itself is unusable, so retrying cannot help.
fn is_fatal(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP | libc::EFAULT)
    )
}
