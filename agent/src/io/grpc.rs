//! A tonic `Channel` to a unix-socket gRPC endpoint (the CRI runtime) whose socket I/O goes through the
//! engine.
//!
//! Corresponds to the kubelet's CRI connection setup (`pkg/kubelet/cri/remote`, `grpc.Dial` on the
//! runtime endpoint). tonic's `Channel` needs `Send` I/O and dials from tasks outside the `LocalSet`,
//! while uring streams are `!Send` and live on it. So on uring the channel's connector asks a dialer
//! task on the `LocalSet` for a connection; the dialer connects a uring [`Stream`] and pumps it to one
//! end of an in-memory duplex pipe, whose other (`Send`) end is the channel's transport. Each byte is
//! copied once more than on epoll; in exchange the CRI client keeps using tonic's `Channel`
//! (reconnects, deadlines, HTTP/2 multiplexing) unchanged on both engines.

use std::io;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

use super::engine::IoEngine;
use super::net::{Stream, connect_unix, spawn_connection};

/// Capacity of each direction of the pipe between tonic and a uring socket; large enough for the
/// biggest CRI responses to flow without many wake-ups.
const PIPE_CAPACITY: usize = 256 * 1024;

type DialReply = oneshot::Sender<io::Result<DuplexStream>>;

/// A lazily connecting channel to the gRPC server on the unix socket `path`; it reconnects on the
/// next call after the connection breaks. Must be called inside [`block_on`](super::block_on): on
/// uring it spawns the dialer task, which stops once the channel and all its clones are dropped.
pub fn unix_channel(path: PathBuf, engine: IoEngine) -> Channel {
    // The URI is required by tonic but never resolved: the connector dials the socket.
    let endpoint = Endpoint::from_static("http://unix.invalid");
    match engine {
        IoEngine::Epoll => endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        })),
        IoEngine::Uring => {
            let (requests, incoming) = mpsc::unbounded_channel::<DialReply>();
            spawn_connection(dialer(path, incoming));
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
                let requests = requests.clone();
                async move {
                    let (reply, connection) = oneshot::channel();
                    let stopped = || io::Error::other("the io_uring dialer task has stopped");
                    requests.send(reply).map_err(|_| stopped())?;
                    let pipe = connection.await.map_err(|_| stopped())??;
                    Ok::<_, io::Error>(TokioIo::new(pipe))
                }
            }))
        }
    }
}

/// Serves the channel's connection requests on the `LocalSet`, one uring socket per request.
async fn dialer(path: PathBuf, mut requests: mpsc::UnboundedReceiver<DialReply>) {
    while let Some(reply) = requests.recv().await {
        let connection = connect_unix(&path, IoEngine::Uring).await.map(|socket| {
            let (channel_end, socket_end) = tokio::io::duplex(PIPE_CAPACITY);
            spawn_connection(pump(socket, socket_end, path.clone()));
            channel_end
        });
        // A failed send means tonic gave up on this attempt; the pump then ends with the pipe.
        let _ = reply.send(connection);
    }
}

/// Copies between the socket and the pipe until both directions are closed or one fails; either way
/// both ends are dropped, which tonic sees as a broken connection and redials.
async fn pump(mut socket: Stream, mut pipe: DuplexStream, path: PathBuf) {
    if let Err(err) = tokio::io::copy_bidirectional_with_sizes(
        &mut socket,
        &mut pipe,
        PIPE_CAPACITY,
        PIPE_CAPACITY,
    )
    .await
    {
        tracing::debug!(path = %path.display(), error = %err, "grpc connection over io_uring ended");
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::convert::Infallible;
    use std::path::Path;
    use std::rc::Rc;

    use bytes::{BufMut, Bytes, BytesMut};
    use http_body_util::StreamBody;
    use hyper::body::{Frame, Incoming};
    use hyper::service::service_fn;
    use prost::Message;
    use ringlet_proto::runtime::v1 as cri;
    use ringlet_proto::runtime::v1::runtime_service_client::RuntimeServiceClient;

    use super::*;
    use crate::io::block_on;

    const ENGINES: [IoEngine; 2] = [IoEngine::Uring, IoEngine::Epoll];

    type FrameBody =
        StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

    /// Answers every call with the same gRPC `VersionResponse` (enough for a unary CRI call).
    async fn version_reply(
        _request: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<FrameBody>, Infallible> {
        let message = cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1.2.3".into(),
            runtime_api_version: "v1".into(),
        }
        .encode_to_vec();
        let mut frame = BytesMut::new();
        frame.put_u8(0);
        frame.put_u32(u32::try_from(message.len()).unwrap());
        frame.put_slice(&message);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let frames = vec![
            Ok(Frame::data(frame.freeze())),
            Ok(Frame::trailers(trailers)),
        ];
        Ok(hyper::Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(StreamBody::new(futures::stream::iter(frames)))
            .unwrap())
    }

    /// A fake runtime on a unix socket; dropping it stops the listener and every connection.
    struct FakeRuntime(Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>>);

    impl Drop for FakeRuntime {
        fn drop(&mut self) {
            for task in self.0.borrow().iter() {
                task.abort();
            }
        }
    }

    fn serve_fake_runtime(path: &Path) -> FakeRuntime {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let tasks = Rc::new(RefCell::new(Vec::new()));
        let accept_loop = spawn_connection({
            let tasks = Rc::clone(&tasks);
            async move {
                loop {
                    let (socket, _) = listener.accept().await.unwrap();
                    let connection = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(socket), service_fn(version_reply));
                    tasks.borrow_mut().push(spawn_connection(async move {
                        let _ = connection.await;
                    }));
                }
            }
        });
        tasks.borrow_mut().push(accept_loop);
        FakeRuntime(tasks)
    }

    async fn version(channel: Channel) -> cri::VersionResponse {
        let request = cri::VersionRequest {
            version: "v1".into(),
        };
        RuntimeServiceClient::new(channel)
            .version(request)
            .await
            .unwrap()
            .into_inner()
    }

    #[test]
    fn unary_calls_over_the_engine_and_redial_after_the_server_restarts() {
        for engine in ENGINES {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("cri.sock");
            block_on(engine, async move {
                // The channel is lazy: it may be created before the runtime listens.
                let channel = unix_channel(path.clone(), engine);
                let runtime = serve_fake_runtime(&path);
                let response = version(channel.clone()).await;
                assert_eq!(response.runtime_name, "fake", "{engine}");
                assert_eq!(version(channel.clone()).await.runtime_version, "1.2.3");

                drop(runtime);
                std::fs::remove_file(&path).unwrap();
                // Let the closed connection reach tonic (through the pump on uring); a call racing
                // with it would fail as a broken connection instead of an unreachable runtime.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let request = cri::VersionRequest {
                    version: "v1".into(),
                };
                let mut client = RuntimeServiceClient::new(channel.clone());
                let status = client.version(request).await.unwrap_err();
                assert_eq!(
                    status.code(),
                    tonic::Code::Unavailable,
                    "{engine}: {status}"
                );

                let _runtime = serve_fake_runtime(&path);
                assert_eq!(version(channel).await.runtime_name, "fake", "{engine}");
            })
            .unwrap();
        }
    }

    #[test]
    fn a_missing_socket_fails_the_call() {
        for engine in ENGINES {
            let status = block_on(engine, async move {
                let channel = unix_channel("/nonexistent/cri.sock".into(), engine);
                let request = cri::VersionRequest {
                    version: "v1".into(),
                };
                RuntimeServiceClient::new(channel)
                    .version(request)
                    .await
                    .unwrap_err()
            })
            .unwrap();
            assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "{engine}: {status}"
            );
        }
    }
}
