//! Engine-neutral sockets: the TCP listener of the kubelet API servers and the streams that hyper,
//! tokio-rustls and the CRI client read and write.
//!
//! No kubelet counterpart (Go's `net` package). On epoll these are tokio's sockets; on uring every
//! accept, connect, read and write is an `io_uring` operation submitted through tokio-uring, behind an
//! adapter that gives callers tokio's `AsyncRead`/`AsyncWrite`.
//!
//! **uring streams and listeners are `!Send`**: they must be used on the thread of
//! [`block_on`](super::block_on) and their connections driven by [`spawn_connection`] (a
//! `spawn_local` on the `LocalSet` both engines run in), never by `tokio::spawn`.
//!
//! Semantics of the uring adapter, which callers may rely on:
//! - A read in flight owns its buffer and stays inside the stream when the caller stops polling;
//!   bytes it brings in are kept and handed out by the next `poll_read`, so nothing is lost when a
//!   read is abandoned (for instance by a `select!`).
//! - `poll_write` copies the caller's bytes (up to [`MAX_WRITE`]) into an owned buffer, submits the
//!   write and reports them written at once. The next `poll_write`, `poll_flush` or `poll_shutdown`
//!   first waits for that write to complete (short writes are resumed) and returns its error, if
//!   any. Hence one write is in flight at a time, `poll_flush` means "on the wire", and an error is
//!   reported one call late. Dropping a stream without flushing can lose the last write.
//! - `poll_shutdown` flushes, then shuts the write side down.
//! - Dropping a stream with an operation in flight shuts the socket down, so that the operation
//!   completes and the descriptor is closed instead of waiting for the peer.
//! - [`Listener::accept`] keeps its accept operation in the listener, so it is cancel safe.

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::engine::IoEngine;

/// Size of the buffer a uring read fills.
const READ_BUF: usize = 16 * 1024;
/// Most bytes one uring `poll_write` accepts.
pub const MAX_WRITE: usize = 64 * 1024;

/// Spawns a task that drives a connection (or anything holding a [`Stream`]) on the current thread.
/// Must be called from inside [`block_on`](super::block_on) (both engines run in a `LocalSet`);
/// it panics elsewhere, as `tokio::task::spawn_local` does.
pub fn spawn_connection<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    tokio::task::spawn_local(future)
}

/// A TCP listener on the engine's sockets.
pub struct Listener(ListenerInner);

enum ListenerInner {
    Epoll(tokio::net::TcpListener),
    Uring(UringListener),
}

type AcceptFuture =
    Pin<Box<dyn Future<Output = io::Result<(tokio_uring::net::TcpStream, SocketAddr)>>>>;

struct UringListener {
    listener: Rc<tokio_uring::net::TcpListener>,
    pending: RefCell<Option<AcceptFuture>>,
}

impl Listener {
    /// Binds a listening socket. Must run inside [`block_on`](super::block_on) of the same `engine`.
    pub fn bind(addr: SocketAddr, engine: IoEngine) -> io::Result<Listener> {
        Ok(Listener(match engine {
            IoEngine::Epoll => {
                let listener = std::net::TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                ListenerInner::Epoll(tokio::net::TcpListener::from_std(listener)?)
            }
            // Not tokio-uring's own bind: it sets SO_REUSEPORT, which would let a second agent bind
            // the same port and silently share its connections.
            IoEngine::Uring => ListenerInner::Uring(UringListener {
                listener: Rc::new(tokio_uring::net::TcpListener::from_std(
                    std::net::TcpListener::bind(addr)?,
                )),
                pending: RefCell::new(None),
            }),
        }))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            ListenerInner::Epoll(listener) => listener.local_addr(),
            ListenerInner::Uring(uring) => uring.listener.local_addr(),
        }
    }

    /// Waits for the next connection. Cancel safe: a connection that arrives after the returned future
    /// was dropped is handed to the next call.
    pub async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        match &self.0 {
            ListenerInner::Epoll(listener) => {
                let (stream, peer) = listener.accept().await?;
                Ok((Stream(StreamInner::Tcp(stream)), peer))
            }
            ListenerInner::Uring(uring) => {
                let (stream, peer) = std::future::poll_fn(|cx| uring.poll_accept(cx)).await?;
                Ok((Stream::uring(UringSocket::Tcp(stream)), peer))
            }
        }
    }
}

impl UringListener {
    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(tokio_uring::net::TcpStream, SocketAddr)>> {
        let mut pending = self.pending.borrow_mut();
        let accept = pending.get_or_insert_with(|| {
            let listener = Rc::clone(&self.listener);
            Box::pin(async move { listener.accept().await })
        });
        let result = ready!(accept.as_mut().poll(cx));
        *pending = None;
        Poll::Ready(result)
    }
}

impl Drop for UringListener {
    fn drop(&mut self) {
        if self.pending.get_mut().is_some() {
            // The dropped accept operation keeps the listening socket open until it completes; shutting
            // the socket down makes it complete now (EINVAL) so the port is released.
            shutdown_fd(self.listener.as_raw_fd());
        }
    }
}

/// Shuts both directions of a socket down, ignoring errors (it may already be shut down or closed by
/// the peer).
fn shutdown_fd(fd: std::os::fd::RawFd) {
    // SAFETY: shutdown(2) only acts on the descriptor, which the caller still owns.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Connects to a TCP address on the engine's sockets. Must run inside [`block_on`](super::block_on).
pub async fn connect_tcp(addr: SocketAddr, engine: IoEngine) -> io::Result<Stream> {
    match engine {
        IoEngine::Epoll => Ok(Stream(StreamInner::Tcp(
            tokio::net::TcpStream::connect(addr).await?,
        ))),
        IoEngine::Uring => Ok(Stream::uring(UringSocket::Tcp(
            tokio_uring::net::TcpStream::connect(addr).await?,
        ))),
    }
}

/// Connects to a unix socket (the CRI endpoint) on the engine's sockets. Must run inside
/// [`block_on`](super::block_on).
pub async fn connect_unix(path: impl AsRef<Path>, engine: IoEngine) -> io::Result<Stream> {
    match engine {
        IoEngine::Epoll => Ok(Stream(StreamInner::Unix(
            tokio::net::UnixStream::connect(path).await?,
        ))),
        IoEngine::Uring => Ok(Stream::uring(UringSocket::Unix(
            tokio_uring::net::UnixStream::connect(path).await?,
        ))),
    }
}

/// A connected TCP or unix stream on the engine's sockets; tokio `AsyncRead + AsyncWrite + Unpin`
/// (wrap it in `hyper_util::rt::TokioIo` for hyper). See the module docs for the uring semantics.
pub struct Stream(StreamInner);

enum StreamInner {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Uring(UringStream),
}

impl Stream {
    fn uring(socket: UringSocket) -> Stream {
        Stream(StreamInner::Uring(UringStream {
            socket: Rc::new(socket),
            read: ReadState::Idle {
                buf: Vec::new(),
                pos: 0,
            },
            write: WriteState::Idle(Vec::new()),
        }))
    }

    /// Sets `TCP_NODELAY`; a no-op on unix streams.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        match &self.0 {
            StreamInner::Tcp(stream) => stream.set_nodelay(nodelay),
            StreamInner::Unix(_) => Ok(()),
            StreamInner::Uring(uring) => match &*uring.socket {
                UringSocket::Tcp(stream) => stream.set_nodelay(nodelay),
                UringSocket::Unix(_) => Ok(()),
            },
        }
    }
}

enum UringSocket {
    Tcp(tokio_uring::net::TcpStream),
    Unix(tokio_uring::net::UnixStream),
}

impl UringSocket {
    async fn read(&self, buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
        match self {
            UringSocket::Tcp(stream) => stream.read(buf).await,
            UringSocket::Unix(stream) => stream.read(buf).await,
        }
    }

    async fn write_all(&self, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
        match self {
            UringSocket::Tcp(stream) => stream.write_all(buf).await,
            UringSocket::Unix(stream) => stream.write_all(buf).await,
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            UringSocket::Tcp(stream) => stream.shutdown(how),
            UringSocket::Unix(stream) => stream.shutdown(how),
        }
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            UringSocket::Tcp(stream) => stream.as_raw_fd(),
            UringSocket::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

type BufFuture<T> = Pin<Box<dyn Future<Output = (io::Result<T>, Vec<u8>)>>>;

struct UringStream {
    socket: Rc<UringSocket>,
    read: ReadState,
    write: WriteState,
}

enum ReadState {
    /// `buf[pos..]` holds bytes read but not yet handed out.
    Idle {
        buf: Vec<u8>,
        pos: usize,
    },
    Reading(BufFuture<usize>),
}

enum WriteState {
    /// The buffer is kept to be reused by the next write.
    Idle(Vec<u8>),
    Writing(BufFuture<()>),
}

impl UringStream {
    fn poll_read(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.read {
                ReadState::Idle { buf, pos } => {
                    if *pos < buf.len() {
                        let n = out.remaining().min(buf.len() - *pos);
                        out.put_slice(&buf[*pos..*pos + n]);
                        *pos += n;
                        return Poll::Ready(Ok(()));
                    }
                    if out.remaining() == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    let mut buf = std::mem::take(buf);
                    buf.clear();
                    buf.reserve(READ_BUF);
                    let socket = Rc::clone(&self.socket);
                    self.read = ReadState::Reading(Box::pin(async move { socket.read(buf).await }));
                }
                ReadState::Reading(read) => {
                    let (result, buf) = ready!(read.as_mut().poll(cx));
                    self.read = ReadState::Idle { buf, pos: 0 };
                    match result {
                        // End of stream: leave `out` untouched.
                        Ok(0) => return Poll::Ready(Ok(())),
                        Ok(_) => {}
                        Err(err) => return Poll::Ready(Err(err)),
                    }
                }
            }
        }
    }

    /// Waits for the write in flight, if any, and returns its outcome.
    fn poll_write_done(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let WriteState::Writing(write) = &mut self.write else {
            return Poll::Ready(Ok(()));
        };
        let (result, buf) = ready!(write.as_mut().poll(cx));
        self.write = WriteState::Idle(buf);
        Poll::Ready(result)
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_write_done(cx))?;
        // poll_write_done left the state idle: reuse its buffer.
        let mut buf = match &mut self.write {
            WriteState::Idle(buf) => std::mem::take(buf),
            WriteState::Writing(_) => Vec::new(),
        };
        buf.clear();
        for slice in slices {
            let room = MAX_WRITE - buf.len();
            if room == 0 {
                break;
            }
            buf.extend_from_slice(&slice[..slice.len().min(room)]);
        }
        let accepted = buf.len();
        if accepted == 0 {
            self.write = WriteState::Idle(buf);
            return Poll::Ready(Ok(0));
        }
        let socket = Rc::clone(&self.socket);
        self.write = WriteState::Writing(Box::pin(async move { socket.write_all(buf).await }));
        // Poll once so the operation is submitted now rather than on the next call.
        match self.poll_write_done(cx) {
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Ready(Ok(())) | Poll::Pending => Poll::Ready(Ok(accepted)),
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_done(cx))?;
        Poll::Ready(self.socket.shutdown(Shutdown::Write))
    }
}

impl Drop for UringStream {
    fn drop(&mut self) {
        let in_flight = matches!(self.read, ReadState::Reading(_))
            || matches!(self.write, WriteState::Writing(_));
        if in_flight {
            // tokio-uring does not cancel dropped operations: a read would keep the descriptor (and
            // the connection) open until the peer sends or closes. Shutting down completes it now.
            shutdown_fd(self.socket.raw_fd());
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            StreamInner::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
            StreamInner::Uring(stream) => stream.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            StreamInner::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
            StreamInner::Uring(stream) => stream.poll_write_vectored(cx, &[IoSlice::new(buf)]),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            StreamInner::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            StreamInner::Uring(stream) => stream.poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            StreamInner::Tcp(stream) => stream.is_write_vectored(),
            StreamInner::Unix(stream) => stream.is_write_vectored(),
            StreamInner::Uring(_) => true,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            StreamInner::Unix(stream) => Pin::new(stream).poll_flush(cx),
            StreamInner::Uring(stream) => stream.poll_write_done(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            StreamInner::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
            StreamInner::Uring(stream) => stream.poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    use rustls_pki_types::PrivatePkcs8KeyDer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::io::block_on;

    const ENGINES: [IoEngine; 2] = [IoEngine::Uring, IoEngine::Epoll];

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// Echoes the request body back, so a large body crosses the connection in both directions.
    async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
        let body = request.into_body().collect().await?.to_bytes();
        Ok(Response::new(Full::new(body)))
    }

    /// Serves HTTP/1 echo on every accepted connection; returns the bound address.
    fn spawn_server(engine: IoEngine) -> SocketAddr {
        let listener = Listener::bind(loopback(), engine).unwrap();
        let addr = listener.local_addr().unwrap();
        spawn_connection(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                stream.set_nodelay(true).unwrap();
                spawn_connection(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service_fn(echo)),
                );
            }
        });
        addr
    }

    async fn client(
        addr: SocketAddr,
        engine: IoEngine,
    ) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
        let stream = connect_tcp(addr, engine).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        spawn_connection(connection);
        sender
    }

    async fn post(
        sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        body: Bytes,
    ) -> Bytes {
        sender.ready().await.unwrap();
        let request = Request::post("/echo")
            .header(http::header::HOST, "localhost")
            .body(Full::new(body))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        response.into_body().collect().await.unwrap().to_bytes()
    }

    fn pattern(len: usize) -> Bytes {
        (0..len)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect::<Vec<_>>()
            .into()
    }

    #[test]
    fn http1_round_trips_small_and_large_bodies() {
        for engine in ENGINES {
            block_on(engine, async move {
                let addr = spawn_server(engine);
                let mut sender = client(addr, engine).await;
                assert_eq!(post(&mut sender, Bytes::from_static(b"ping")).await, "ping");
                let large = pattern(1024 * 1024);
                assert_eq!(post(&mut sender, large.clone()).await, large, "{engine}");
                // The same keep-alive connection still works after the large exchange.
                assert_eq!(
                    post(&mut sender, Bytes::from_static(b"again")).await,
                    "again"
                );
            })
            .unwrap();
        }
    }

    fn tls_configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let key = PrivatePkcs8KeyDer::from(signing_key.serialize_der());
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key.into())
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    #[test]
    fn https_round_trip_through_rustls() {
        let (server_config, client_config) = tls_configs();
        for engine in ENGINES {
            let server_config = Arc::clone(&server_config);
            let client_config = Arc::clone(&client_config);
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let addr = listener.local_addr().unwrap();
                spawn_connection(async move {
                    let (stream, _) = listener.accept().await.unwrap();
                    let tls = tokio_rustls::TlsAcceptor::from(server_config)
                        .accept(stream)
                        .await
                        .unwrap();
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service_fn(echo))
                        .await
                        .unwrap();
                });

                let stream = connect_tcp(addr, engine).await.unwrap();
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let tls = tokio_rustls::TlsConnector::from(client_config)
                    .connect(name, stream)
                    .await
                    .unwrap();
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tls))
                        .await
                        .unwrap();
                spawn_connection(connection);
                let large = pattern(1024 * 1024);
                assert_eq!(post(&mut sender, large.clone()).await, large, "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn unix_socket_echo() {
        for engine in ENGINES {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("echo.sock");
            block_on(engine, async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                spawn_connection(async move {
                    let (mut socket, _) = listener.accept().await.unwrap();
                    let (mut reader, mut writer) = socket.split();
                    tokio::io::copy(&mut reader, &mut writer).await.unwrap();
                });

                let stream = connect_unix(&path, engine).await.unwrap();
                let (mut reader, mut writer) = tokio::io::split(stream);
                let sent = pattern(300 * 1024);
                let writing = spawn_connection({
                    let sent = sent.clone();
                    async move {
                        writer.write_all(&sent).await.unwrap();
                        // Shutdown must flush the write still in flight before the peer sees EOF.
                        writer.shutdown().await.unwrap();
                    }
                });
                let mut received = Vec::new();
                reader.read_to_end(&mut received).await.unwrap();
                writing.await.unwrap();
                assert_eq!(received, sent, "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn connect_unix_reports_a_missing_socket() {
        for engine in ENGINES {
            let err = block_on(engine, connect_unix("/nonexistent/ringlet.sock", engine))
                .unwrap()
                .err()
                .unwrap();
            assert_eq!(err.kind(), io::ErrorKind::NotFound, "{engine}");
        }
    }

    #[test]
    fn accept_is_cancel_safe_and_dropping_the_listener_frees_the_port() {
        for engine in ENGINES {
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let addr = listener.local_addr().unwrap();
                let abandoned = tokio::time::timeout(Duration::from_millis(20), listener.accept());
                assert!(abandoned.await.is_err());

                // The connection arriving after the abandoned accept reaches the next accept.
                let mut client = connect_tcp(addr, engine).await.unwrap();
                let (mut server, _) = listener.accept().await.unwrap();
                client.write_all(b"hi").await.unwrap();
                client.flush().await.unwrap();
                let mut buf = [0; 2];
                server.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"hi");

                let pending = tokio::time::timeout(Duration::from_millis(20), listener.accept());
                assert!(pending.await.is_err());
                drop(listener);
                tokio::task::yield_now().await;
                let refused = connect_tcp(addr, engine).await.err().unwrap();
                assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused, "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn a_port_in_use_is_refused() {
        for engine in ENGINES {
            block_on(engine, async move {
                let first = Listener::bind(loopback(), engine).unwrap();
                let taken = first.local_addr().unwrap();
                let err = Listener::bind(taken, engine).err().unwrap();
                assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn dropping_a_stream_with_a_read_in_flight_closes_the_connection() {
        for engine in ENGINES {
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let mut client = connect_tcp(listener.local_addr().unwrap(), engine)
                    .await
                    .unwrap();
                let (mut server, _) = listener.accept().await.unwrap();
                let mut buf = [0; 16];
                let idle = tokio::time::timeout(Duration::from_millis(20), server.read(&mut buf));
                assert!(idle.await.is_err());
                drop(server);
                let eof = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf));
                assert_eq!(eof.await.unwrap().unwrap(), 0, "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn bytes_read_by_an_abandoned_read_are_not_lost() {
        for engine in ENGINES {
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let mut client = connect_tcp(listener.local_addr().unwrap(), engine)
                    .await
                    .unwrap();
                let (mut server, _) = listener.accept().await.unwrap();
                let mut buf = [0; 5];
                let idle = tokio::time::timeout(Duration::from_millis(20), server.read(&mut buf));
                assert!(idle.await.is_err());
                client.write_all(b"hello").await.unwrap();
                client.flush().await.unwrap();
                server.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"hello", "{engine}");
            })
            .unwrap();
        }
    }

    /// Round-trip latency of small requests on one keep-alive connection, client and server on the same
    /// thread. Run with
    /// `cargo test --release -p ringlet --lib io::net::tests::keep_alive_latency -- --ignored --nocapture`.
    #[test]
    #[ignore = "measurement, not a test; run in release mode"]
    fn keep_alive_latency() {
        const REQUESTS: u32 = 10_000;
        for engine in ENGINES {
            let elapsed = block_on(engine, async move {
                let addr = spawn_server(engine);
                let mut sender = client(addr, engine).await;
                post(&mut sender, Bytes::from_static(b"warm-up")).await;
                let start = Instant::now();
                for _ in 0..REQUESTS {
                    post(&mut sender, Bytes::from_static(b"ping")).await;
                }
                start.elapsed()
            })
            .unwrap();
            println!(
                "{engine}: {REQUESTS} requests in {elapsed:?}, {:?} per round trip",
                elapsed / REQUESTS
            );
        }
    }
}
