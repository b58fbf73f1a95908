//! The accept loop and per-connection HTTP/1 driver shared by the listeners: request-size and
//! header-time limits, and graceful shutdown (stop accepting, let open requests finish, give up after
//! a bounded wait).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::ServerError;
use super::router::Router;

/// The kubelet's `MaxHeaderBytes` (1 MiB) for the request line plus headers.
const MAX_HEADER_BYTES: usize = 1 << 20;
/// Room for the header block plus hyper's read-ahead, so the header limit is what trips first.
const MAX_BUF_BYTES: usize = MAX_HEADER_BYTES + (64 << 10);
/// How long a client may take to send a request's head (also bounds idle keep-alive connections),
/// so a slowloris client cannot pin a connection.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open requests before closing their connections.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Longest pause after an accept failure such as running out of file descriptors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` completes, then drains open connections.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map_err(|source| ServerError::LocalAddr { source })?;
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_BUF_BYTES);

    // Dropping the sender is the stop signal: every connection's receiver sees it.
    let (stop_tx, stop_rx) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut backoff = Duration::ZERO;
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(%addr, "serving HTTP");

    let fatal = loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break None,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::ZERO;
                // Responses are small and written whole; waiting to coalesce them only adds latency.
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, %error, "setting TCP_NODELAY");
                }
                let connection = builder.serve_connection(TokioIo::new(stream), router.clone());
                connections.spawn(drive(connection, stop_rx.clone(), peer));
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
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    let result = match (fatal, drained) {
        (Some(source), _) => Err(ServerError::Accept { addr, source }),
        (None, Ok(())) => Ok(()),
        (None, Err(_)) => Err(ServerError::ShutdownTimedOut {
            addr,
            grace: SHUTDOWN_GRACE,
            connections: connections.len(),
        }),
    };
    connections.abort_all();
    tracing::info!(%addr, "stopped serving HTTP");
    result
}

async fn drive<I>(
    connection: http1::Connection<I, Router>,
    mut stop: watch::Receiver<()>,
    peer: SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
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
