//! Serves the hollow runtime's CRI on a unix socket: discovers the cgroup hierarchies, reaps
//! exited container processes (one task, woken by SIGCHLD), and on shutdown kills the containers
//! it started and removes their cgroups. containerd's CRI server does this job for the kubelet's
//! `--container-runtime-endpoint`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::transport::Server;

use crate::cgroup::{CgroupError, Driver, Hierarchies};
use crate::child::CHILD_PROGRAM;
use crate::cri::v1::image_service_server::ImageServiceServer;
use crate::cri::v1::runtime_service_server::RuntimeServiceServer;
use crate::image_service::HollowImages;
use crate::runtime_service::HollowRuntime;
use crate::spawn;
use crate::state::Shared;

/// containerd's gRPC message limit both ways, which the kubelet's client matches: a listing of
/// tens of thousands of containers is larger than gRPC's default 4 MiB.
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// How long a shutdown waits for killed containers to be reaped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a shutdown waits for clients to close their connections.
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("finding the cgroup hierarchies")]
    Hierarchies(#[source] CgroupError),
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing the stale socket {}", path.display())]
    StaleSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listening on {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("finding this program's path")]
    Program(#[source] io::Error),
    #[error("the containers' program {} is missing (`cargo build -p ringlet-hollow` builds it)",
        path.display())]
    NoChildProgram { path: PathBuf },
    #[error("watching SIGCHLD")]
    Signal(#[source] io::Error),
    #[error("serving the CRI")]
    Serve(#[source] tonic::transport::Error),
}

/// What the server needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The unix socket to serve on.
    pub listen: PathBuf,
    /// Reported as the image and writable-layer filesystem; created if missing.
    pub root: PathBuf,
    pub driver: Driver,
    /// What containers run; `None` for `ringlet-hollow-child` next to this program.
    pub child_program: Option<PathBuf>,
}

/// Serves until `shutdown` resolves. Must run on a current-thread runtime: container processes are
/// forked from the serving thread, and their death signal is tied to the thread that forked them.
pub async fn serve(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let hierarchies = Hierarchies::discover().map_err(ServeError::Hierarchies)?;
    for hierarchy in hierarchies.all() {
        tracing::debug!(mount = %hierarchy.mount.display(), "cgroup hierarchy");
    }
    std::fs::create_dir_all(&settings.root).map_err(|source| ServeError::CreateDir {
        path: settings.root.clone(),
        source,
    })?;
    let program = match settings.child_program.clone() {
        Some(program) => program,
        None => std::env::current_exe()
            .map_err(ServeError::Program)?
            .with_file_name(CHILD_PROGRAM),
    };
    if !program.is_file() {
        return Err(ServeError::NoChildProgram { path: program });
    }
    let state = Shared::default();
    // Registered before any container is forked, so no exit goes unnoticed.
    let mut child_exits = signal(SignalKind::child()).map_err(ServeError::Signal)?;
    let reaped = state.clone();
    tokio::spawn(async move {
        loop {
            {
                let mut store = reaped.lock();
                for (pid, code) in spawn::reap() {
                    store.exited(pid, code);
                }
            }
            if child_exits.recv().await.is_none() {
                return;
            }
        }
    });
    let listener = bind(&settings.listen)?;
    tracing::info!(
        socket = %settings.listen.display(),
        "ringlet-hollow serving the CRI: a scale harness, not a container runtime"
    );
    let runtime = HollowRuntime {
        state: state.clone(),
        hierarchies,
        driver: settings.driver,
        root: settings.root.clone(),
        program,
    };
    let images = HollowImages {
        state: state.clone(),
        root: settings.root.clone(),
    };
    let services = Services {
        runtime: RuntimeServiceServer::new(runtime)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        images: ImageServiceServer::new(images)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    };
    let (stopping, mut stopped) = watch::channel(false);
    let killed = state.clone();
    let signal = async move {
        shutdown.await;
        // The containers go first: without the runtime nothing would reap or remove them.
        kill_all(&killed).await;
        stopping.send_replace(true);
    };
    let serving = Server::builder().serve_with_incoming_shutdown(
        services,
        UnixListenerStream::new(listener),
        signal,
    );
    // A graceful shutdown waits for clients to close their connections; a client that does not
    // (a stopped agent) must not keep the runtime up.
    let overdue = async move {
        if stopped.wait_for(|stopped| *stopped).await.is_ok() {
            tokio::time::sleep(CONNECTION_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = serving => served.map_err(ServeError::Serve),
        () = overdue => {
            tracing::warn!("clients kept their connections open; stopping anyway");
            Ok(())
        }
    };
    if let Err(e) = std::fs::remove_file(&settings.listen) {
        tracing::debug!("removing the socket: {e}");
    }
    served
}

/// Routes each call to its service by path (tonic's own router needs its `router` feature, which
/// brings axum in).
#[derive(Clone)]
struct Services {
    runtime: RuntimeServiceServer<HollowRuntime>,
    images: ImageServiceServer<HollowImages>,
}

impl Service<http::Request<Body>> for Services {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request
            .uri()
            .path()
            .starts_with("/runtime.v1.ImageService/")
        {
            self.images.call(request)
        } else {
            self.runtime.call(request)
        }
    }
}

fn bind(path: &PathBuf) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(ServeError::StaleSocket {
                path: path.clone(),
                source: e,
            });
        }
        _ => {}
    }
    UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.clone(),
        source,
    })
}

/// Kills every running container and waits (a while) for the reaper, which removes their cgroups.
async fn kill_all(state: &Shared) {
    let waits: Vec<_> = {
        let store = state.lock();
        store
            .containers
            .values()
            .filter_map(|c| {
                let pid = c.pid?;
                if let Err(e) = spawn::kill(pid, nix::sys::signal::Signal::SIGKILL) {
                    tracing::warn!(container = %c.id, "killing at shutdown: {e}");
                }
                Some(c.wait_exit())
            })
            .collect()
    };
    let all = async {
        for exited in waits {
            exited.await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
        tracing::warn!("containers still running at shutdown; they die with this process");
    }
}
