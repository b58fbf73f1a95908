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
//!   reported one call late.
//! - `poll_shutdown` flushes, then shuts the write side down.
//! - Dropping a stream with a read in flight shuts the socket's read side down, so that the read
//!   completes instead of waiting for the peer. A write in flight is left to complete, as the kernel
//!   would send bytes a tokio socket had accepted (say a TLS alert written just before the drop); the
//!   descriptor closes after it. Only the rest of a write the kernel took in part is lost.
//! - [`Listener::accept`] keeps its accept operation in the listener, so it is cancel safe.
//!
//! hyper's HTTP upgrades (exec, attach, port-forward) box the connection as `Send`, so a server that
//! serves upgrades turns its streams into [`SendStream`]s: `Send` in type, but a uring stream inside
//! still works only on the engine's thread (it refuses any use elsewhere).

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::ManuallyDrop;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};
use std::thread::ThreadId;

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

    /// The engine whose sockets this listener uses (and whose files its requests should read).
    pub fn engine(&self) -> IoEngine {
        match &self.0 {
            ListenerInner::Epoll(_) => IoEngine::Epoll,
            ListenerInner::Uring(_) => IoEngine::Uring,
        }
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
            crate::sys::shutdown_socket(self.listener.as_raw_fd());
        }
    }
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

/// A [`Stream`] that may be moved where `Send` is required (hyper's upgrades box the connection as
/// `Send`). A uring stream inside stays bound to the thread that made it: used on another thread, it
/// answers with an error; dropped on another thread, it is leaked. On the engine's thread, where
/// [`block_on`](super::block_on) runs every task, it behaves exactly like the [`Stream`].
pub struct SendStream {
    stream: ManuallyDrop<Stream>,
    /// The thread of a uring stream; `None` for tokio's sockets, which are `Send` themselves.
    owner: Option<ThreadId>,
}

impl Stream {
    /// Makes the stream `Send` in type; see [`SendStream`].
    pub fn into_send(self) -> SendStream {
        let owner = match self.0 {
            StreamInner::Tcp(_) | StreamInner::Unix(_) => None,
            StreamInner::Uring(_) => Some(current_thread()),
        };
        SendStream {
            stream: ManuallyDrop::new(self),
            owner,
        }
    }
}

// SAFETY: the tokio variants of `Stream` are `Send`. A uring stream (its `Rc`s and tokio-uring
// operations are not) is only ever touched on `owner`: every poll checks the thread first, and `Drop`
// leaks it on any other thread. `SendStream` is not `Sync`, so `&self` never crosses threads.
#[allow(
    unsafe_code,
    reason = "the type's thread checks are what make it sound, see above"
)]
unsafe impl Send for SendStream {}

thread_local! {
    static THREAD: ThreadId = std::thread::current().id();
}

fn current_thread() -> ThreadId {
    THREAD.with(|id| *id)
}

impl SendStream {
    fn on_owner_thread(&self) -> bool {
        // While thread-locals are torn down no thread can be proven: treat it as foreign.
        self.owner
            .is_none_or(|owner| THREAD.try_with(|id| *id == owner).unwrap_or(false))
    }

    fn stream(&mut self) -> io::Result<Pin<&mut Stream>> {
        if self.on_owner_thread() {
            Ok(Pin::new(&mut *self.stream))
        } else {
            Err(io::Error::other(
                "an io_uring stream was used off the thread of its engine",
            ))
        }
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        if self.on_owner_thread() {
            // SAFETY: dropped once, here, on the thread the stream belongs to.
            #[allow(
                unsafe_code,
                reason = "the stream is dropped by hand on its own thread"
            )]
            unsafe {
                ManuallyDrop::drop(&mut self.stream);
            }
        } else {
            tracing::warn!("leaking an io_uring stream dropped off the thread of its engine");
        }
    }
}

impl AsyncRead for SendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => stream.poll_read(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

impl AsyncWrite for SendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(stream) => stream.poll_write(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(stream) => stream.poll_write_vectored(cx, bufs),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // Reads only which variant this is; no shared state is touched.
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => stream.poll_flush(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(stream) => stream.poll_shutdown(cx),
            Err(err) => Poll::Ready(Err(err)),
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
        // tokio-uring does not cancel dropped operations, and each keeps the descriptor open until it
        // completes: a read would wait for the peer to send or close, so shutting down completes it
        // now. A write may not even be submitted yet (submission waits for the runtime to park), so
        // the write side is left open for it.
        let how = if matches!(self.write, WriteState::Writing(_)) {
            Shutdown::Read
        } else if matches!(self.read, ReadState::Reading(_)) {
            Shutdown::Both
        } else {
            return;
        };
        // It may already be shut down, or reset by the peer: nothing left to do then.
        let _ = self.socket.shutdown(how);
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
    use std::time::Duration;

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
    fn a_write_is_delivered_when_the_stream_is_dropped_right_after_it() {
        for engine in ENGINES {
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let mut client = connect_tcp(listener.local_addr().unwrap(), engine)
                    .await
                    .unwrap();
                let (mut server, _) = listener.accept().await.unwrap();
                let mut buf = [0; 16];
                // A read in flight too, as when a TLS stream fails mid-handshake.
                let idle = tokio::time::timeout(Duration::from_millis(20), server.read(&mut buf));
                assert!(idle.await.is_err());
                server.write_all(b"goodbye").await.unwrap();
                drop(server);
                let mut received = Vec::new();
                let eof =
                    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut received));
                eof.await.unwrap().unwrap();
                assert_eq!(received, b"goodbye", "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn a_send_stream_works_only_on_its_engines_thread() {
        for engine in ENGINES {
            block_on(engine, async move {
                let listener = Listener::bind(loopback(), engine).unwrap();
                let mut client = connect_tcp(listener.local_addr().unwrap(), engine)
                    .await
                    .unwrap();
                let (server, _) = listener.accept().await.unwrap();
                let mut server = server.into_send();
                // Elsewhere a uring stream refuses to be used; tokio's sockets work anywhere.
                let (mut server, elsewhere) = std::thread::spawn(move || {
                    let waker = futures::task::noop_waker();
                    let mut cx = Context::from_waker(&waker);
                    let write = Pin::new(&mut server).poll_write(&mut cx, b"x");
                    (server, write)
                })
                .join()
                .unwrap();
                match engine {
                    IoEngine::Uring => {
                        let Poll::Ready(Err(err)) = elsewhere else {
                            panic!("{elsewhere:?}")
                        };
                        assert!(err.to_string().contains("off the thread"), "{err}");
                    }
                    IoEngine::Epoll => assert!(matches!(elsewhere, Poll::Ready(Ok(1)))),
                }
                // Back on its thread it works as before.
                server.write_all(b"ok").await.unwrap();
                server.shutdown().await.unwrap();
                let mut received = Vec::new();
                client.read_to_end(&mut received).await.unwrap();
                let expected: &[u8] = match engine {
                    IoEngine::Uring => b"ok",
                    IoEngine::Epoll => b"xok",
                };
                assert_eq!(received, expected, "{engine}");
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
}
