//! `ringlet observe`: the form of ringlet that runs next to an existing kubelet (a `DaemonSet` on
//! any node) and measures it. It runs no pods and changes nothing: it loads ringlet's eBPF programs
//! (pinned under their own directory), follows the node's containers through CRI with read-only
//! calls so a kernel exit of a container's init maps to its pod and container, and for each such
//! exit measures how long the kubelet takes to report the container terminated, from the
//! kernel's timestamp to the report as a source lets it be timed ([`lag`]): the kubelet's own
//! `/pods` ([`kubelet_pods`]) and/or the pod in the API server ([`apiserver`]). The lag is
//! exported as `ringlet_observed_kubelet_status_lag_seconds{source}` on `/metrics`, and the exits
//! it sees go to the live event stream (`ringlet events --socket`). The kubelet has no counterpart.

mod apiserver;
mod args;
mod containers;
mod health;
mod http;
mod kubelet_pods;
mod lag;
mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

pub use args::{ObserveArgs, SourceKind};
pub use metrics::ObserveMetrics;

use self::containers::{ContainerInfo, Containers};
use self::health::Health;
use self::lag::{LagTracker, PendingExit};
use crate::apis::config::CgroupDriver;
use crate::cm::{CmError, PodContainerManager};
use crate::ebpf::{self, EbpfError, EbpfOptions};
use crate::error_chain::error_chain;
use crate::event_stream::{
    self, EventBroadcaster, EventStreamError, LifecycleKind, LifecycleRecord,
};
use crate::kuberuntime::{CriClient, CriError};
use crate::metrics::MetricsError;
use crate::pleg::{Hint, HintKind, PodHint, monotonic_now_ns, runtime_exit_code};

/// Every CRI call observe mode makes is a quick read.
const CRI_TIMEOUT: Duration = Duration::from_secs(10);
/// How often every container is listed again (the kernel's start hints cover new containers at
/// once; this catches whatever they missed and forgets removed ones).
const RELIST_PERIOD: Duration = Duration::from_secs(30);
/// Kernel hints buffered between the ring-buffer reader and observe mode; past this the reader
/// sends one resync instead.
const HINT_CHANNEL_CAPACITY: usize = 4096;

/// Why observe mode could not start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(
        "observe mode cannot work without eBPF (it sees container exits only through ringlet's \
         BPF programs)"
    )]
    Ebpf {
        #[source]
        source: EbpfError,
    },
    #[error("reading the host's cgroup hierarchies")]
    Cgroups {
        #[source]
        source: CmError,
    },
    #[error("the host mounts no cgroup2 hierarchy, which the BPF programs identify containers by")]
    NoCgroup2,
    #[error(
        "the pods' parent cgroup {} does not exist: is a kubelet with --cgroup-driver={driver} \
         (and this --cgroup-root) running on this node?", path.display()
    )]
    NoPodsCgroup { path: PathBuf, driver: &'static str },
    #[error("the CRI runtime at {endpoint}")]
    Cri {
        endpoint: String,
        #[source]
        source: CriError,
    },
    #[error("--kubelet-url {url}: {reason}")]
    KubeletUrl { url: String, reason: String },
    #[error("--kubelet-ca-file {}: {reason}", path.display())]
    CaFile { path: PathBuf, reason: String },
    #[error("{what}")]
    Tls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("reading {what} {}", path.display())]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to the API server for the apiserver source")]
    ApiServer {
        #[source]
        source: crate::apiserver::ApiServerError,
    },
    #[error("the apiserver source needs the node's name: --node-name, NODE_NAME or the hostname")]
    NodeName {
        #[source]
        source: std::io::Error,
    },
    #[error("listening on {address} for /metrics and /healthz")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up the metrics")]
    Metrics {
        #[source]
        source: MetricsError,
    },
    #[error("serving the event stream")]
    Events {
        #[source]
        source: EventStreamError,
    },
    #[error("{what}")]
    Runtime {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Runs observe mode until SIGTERM or SIGINT; the exit code says whether it stopped cleanly.
pub fn run(args: ObserveArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("ringlet observe: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(observe(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = error_chain(&err);
            tracing::error!("{message}");
            eprintln!("ringlet observe: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn observe(args: ObserveArgs) -> Result<(), ObserveError> {
    let sources = args.unique_sources();
    let metrics =
        ObserveMetrics::new(&sources).map_err(|source| ObserveError::Metrics { source })?;
    let health = Arc::new(Health::default());
    let events = EventBroadcaster::default();
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|source| ObserveError::Runtime {
            what: "installing the SIGTERM handler",
            source,
        })?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|source| ObserveError::Runtime {
            what: "installing the SIGINT handler",
            source,
        })?;

    // Everything that can be refused is checked before the programs load.
    let listener = http::bind(args.listen_address).await?;
    let (kubelet_pods, api) = prepare_sources(&args, &sources).await?;
    let pods_cgroup = pods_cgroup(&args)?;

    let (sender, hints) = mpsc::channel(HINT_CHANNEL_CAPACITY);
    let drops = metrics.clone();
    let options = EbpfOptions {
        pin_dir: args.bpf_pin_path.clone(),
        ..EbpfOptions::new(pods_cgroup)
    };
    let ebpf = ebpf::start(options, sender, move |total| {
        drops.set_ring_buffer_drops_total(total);
    })
    .map_err(|source| ObserveError::Ebpf { source })?;
    health.ebpf_attached();

    let endpoint = args.container_runtime_endpoint.clone();
    let cri = CriClient::new(&endpoint, CRI_TIMEOUT).map_err(|source| ObserveError::Cri {
        endpoint: endpoint.clone(),
        source,
    })?;
    let containers = Containers::new(cri);
    let running = containers
        .relist()
        .await
        .map_err(|source| ObserveError::Cri { endpoint, source })?;
    metrics.set_containers(running);
    health.cri_listed();
    tracing::info!(containers = running, programs = ?ebpf.attached_programs(),
        pins = %ebpf.pin_dir().display(), sources = ?sources.iter().map(|s| s.label()).collect::<Vec<_>>(),
        "observing the kubelet");

    let (stop, stopped) = watch::channel(false);
    let (trackers, source_tasks) = spawn_sources(
        &args,
        &sources,
        kubelet_pods,
        api,
        &metrics,
        &events,
        &health,
    );
    let mut events_server = tokio::spawn({
        let path = args.events_socket.clone();
        let events = events.clone();
        let stopped = stopped.clone();
        async move { event_stream::serve(&path, events, wait_stopped(stopped)).await }
    });
    let http_server = tokio::spawn(http::serve(
        listener,
        metrics.clone(),
        Arc::clone(&health),
        wait_stopped(stopped),
    ));
    let follower = Follower {
        containers,
        trackers,
        metrics,
        events,
    };

    let early_end = tokio::select! {
        _ = terminate.recv() => None,
        _ = interrupt.recv() => None,
        () = follower.run(hints) => None,
        served = &mut events_server => Some(served),
    };
    tracing::info!("observe mode stopping");
    let _ = stop.send(true);
    for task in &source_tasks {
        task.abort();
    }
    let _ = http_server.await;
    let served = match early_end {
        Some(served) => served,
        None => events_server.await,
    };
    // Detaches the programs and removes the pins.
    drop(ebpf);
    match served {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(ObserveError::Events { source }),
        Err(join) => Err(ObserveError::Runtime {
            what: "the event stream server",
            source: std::io::Error::other(join.to_string()),
        }),
    }
}

/// What each source needs, made before anything loads so that a bad flag is refused first.
async fn prepare_sources(
    args: &ObserveArgs,
    sources: &[SourceKind],
) -> Result<
    (
        Option<kubelet_pods::KubeletPods>,
        Option<(crate::apiserver::ApiClient, String)>,
    ),
    ObserveError,
> {
    let kubelet_pods = sources
        .contains(&SourceKind::KubeletPods)
        .then(|| {
            kubelet_pods::KubeletPods::new(
                &args.kubelet_url,
                args.kubelet_ca_file.as_deref(),
                args.kubelet_token_file.as_deref(),
            )
        })
        .transpose()?;
    let api = if sources.contains(&SourceKind::Apiserver) {
        let node_name = match &args.node_name {
            Some(name) => name.clone(),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map_err(|source| ObserveError::NodeName { source })?
                .trim()
                .to_lowercase(),
        };
        Some((
            apiserver::client(args.kubeconfig.as_deref()).await?,
            node_name,
        ))
    } else {
        None
    };
    Ok((kubelet_pods, api))
}

/// Completes once `stopped` turns true (or its sender is gone).
async fn wait_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Starts one task per source, each with its tracker; returns the trackers (for the follower) and
/// the tasks (aborted at shutdown).
fn spawn_sources(
    args: &ObserveArgs,
    sources: &[SourceKind],
    mut kubelet_pods: Option<kubelet_pods::KubeletPods>,
    mut api: Option<(crate::apiserver::ApiClient, String)>,
    metrics: &ObserveMetrics,
    events: &EventBroadcaster,
    health: &Arc<Health>,
) -> (Vec<Arc<LagTracker>>, Vec<tokio::task::JoinHandle<()>>) {
    let mut trackers = Vec::new();
    let mut source_tasks = Vec::new();
    for source in sources {
        let tracker = Arc::new(LagTracker::new(
            *source,
            args.give_up_after,
            metrics.clone(),
            events.clone(),
        ));
        trackers.push(Arc::clone(&tracker));
        let health = Arc::clone(health);
        source_tasks.push(match source {
            SourceKind::KubeletPods => {
                let Some(pods) = kubelet_pods.take() else {
                    continue;
                };
                tokio::spawn(kubelet_pods::run(
                    pods,
                    tracker,
                    args.kubelet_poll_interval,
                    health,
                ))
            }
            SourceKind::Apiserver => {
                let Some((client, node_name)) = api.take() else {
                    continue;
                };
                tokio::spawn(apiserver::run(client, node_name, tracker, health))
            }
        });
    }
    (trackers, source_tasks)
}

/// The cgroup2 directory of the kubelet's pods' parent, which must exist already: observe mode
/// creates nothing.
fn pods_cgroup(args: &ObserveArgs) -> Result<PathBuf, ObserveError> {
    let driver = CgroupDriver::from(args.cgroup_driver);
    let manager = PodContainerManager::new(&args.cgroup_root, driver, true)
        .map_err(|source| ObserveError::Cgroups { source })?;
    let path = manager.pods_cgroup2_dir().ok_or(ObserveError::NoCgroup2)?;
    if !path.is_dir() {
        return Err(ObserveError::NoPodsCgroup {
            path,
            driver: match driver {
                CgroupDriver::Cgroupfs => "cgroupfs",
                CgroupDriver::Systemd => "systemd",
            },
        });
    }
    Ok(path)
}

/// Turns kernel hints into container exits for the trackers and events for watchers, and keeps
/// the container list current.
struct Follower {
    containers: Containers,
    trackers: Vec<Arc<LagTracker>>,
    metrics: ObserveMetrics,
    events: EventBroadcaster,
}

impl Follower {
    /// Runs until the hint source is gone.
    async fn run(self, mut hints: mpsc::Receiver<Hint>) {
        let mut relist = tokio::time::interval(RELIST_PERIOD);
        relist.tick().await;
        loop {
            tokio::select! {
                hint = hints.recv() => match hint {
                    None => return,
                    Some(Hint::Pod(hint)) => self.handle(hint),
                    Some(Hint::Resync { reason }) => {
                        tracing::warn!("kernel events were lost ({reason}); listing every container again");
                        self.relist().await;
                    }
                },
                _ = relist.tick() => self.relist().await,
            }
        }
    }

    async fn relist(&self) {
        match self.containers.relist().await {
            Ok(running) => self.metrics.set_containers(running),
            Err(err) => tracing::warn!(
                endpoint = self.containers.endpoint(),
                "listing containers (retrying at the next relist): {}",
                error_chain(&err)
            ),
        }
    }

    fn handle(&self, hint: PodHint) {
        let Some(id) = hint.container.clone() else {
            return;
        };
        match hint.kind {
            HintKind::Started | HintKind::CgroupCreated => {
                let containers = self.containers.clone();
                let events = self.events.clone();
                tokio::spawn(async move {
                    containers.learn(&id).await;
                    if hint.kind == HintKind::Started
                        && let Some(info) = containers.get(&id)
                    {
                        events.publish(record(&info, LifecycleKind::Started, None, &hint));
                    }
                });
            }
            HintKind::Died => {
                let Some(info) = hint
                    .tgid
                    .and_then(|tgid| self.containers.init_exited(&id, tgid))
                else {
                    return;
                };
                let exit_code = runtime_exit_code(&hint);
                self.metrics.container_exit();
                tracing::debug!(container = %id, pod = %format_args!("{}/{}", info.namespace, info.pod_name),
                    exit_code, "a container's init exited");
                self.events
                    .publish(record(&info, LifecycleKind::Died, Some(exit_code), &hint));
                for tracker in &self.trackers {
                    tracker.exited(PendingExit {
                        container: info.clone(),
                        exit_code,
                        kernel_time_ns: hint.kernel_time_ns,
                    });
                }
            }
            HintKind::OomKilled => {
                if let Some(info) = self.containers.get(&id) {
                    self.events
                        .publish(record(&info, LifecycleKind::OomKilled, None, &hint));
                }
            }
            HintKind::CgroupRemoved => {}
        }
    }
}

/// The event watchers see for a kernel hint about a container.
fn record(
    info: &ContainerInfo,
    kind: LifecycleKind,
    exit_code: Option<i32>,
    hint: &PodHint,
) -> LifecycleRecord {
    LifecycleRecord {
        pod_uid: info.pod_uid.clone(),
        namespace: info.namespace.clone(),
        pod_name: info.pod_name.clone(),
        container_name: info.container_name.clone(),
        container_id: Some(info.id.clone()),
        kind,
        exit_code,
        kernel_to_event: Some(Duration::from_nanos(
            monotonic_now_ns().saturating_sub(hint.kernel_time_ns),
        )),
        observed_at: SystemTime::now(),
    }
}
