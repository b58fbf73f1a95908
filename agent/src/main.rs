//! The `ringlet` binary (the kubelet's `cmd/kubelet`): parses flags and the `KubeletConfiguration`,
//! builds the CRI runtime, the pod sources and the agent core, serves the kubelet API (TLS), the
//! read-only and healthz listeners, and runs until SIGINT/SIGTERM. Running containers are left alone on exit, so a restarted
//! agent adopts them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use ringlet::apis::config::{
    self, AgentConfig, AuthorizationModeSetting, KubeletConfiguration, TaintSetting,
};
use ringlet::apiserver::bootstrap::{self, BootstrapSettings};
use ringlet::apiserver::{ApiClient, ApiClientOptions};
use ringlet::certificate::csr::CsrTemplate;
use ringlet::certificate::{self, ClientRotation, ServingRotation};
use ringlet::cli;
use ringlet::cm::{NodeAllocatablePlan, NodeResources, PodContainerManager, QosClass};
use ringlet::container::{Runtime, StreamingRuntime};
use ringlet::ebpf;
use ringlet::error_chain::error_chain;
use ringlet::event_stream::{self, EventBroadcaster};
use ringlet::events::Recorder;
use ringlet::eviction::{DEFAULT_MONITORING_PERIOD, EvictionManager, EvictionSettings};
use ringlet::images::{CriImageGcRuntime, ImageGcHandle, ImageGcManager, ImageGcPolicy};
use ringlet::io::{self, IoEngine};
use ringlet::kubelet::{
    ApiParts, Kubelet, KubeletDeps, KubeletServerHost, KubeletSettings, NodeHelper,
    NodeStatusSettings, ProbeDeps, RunPodResult,
};
use ringlet::kuberuntime::container::{CfsQuota, ContainerDefaults, SeccompSettings};
use ringlet::kuberuntime::dns::DnsConfigurer;
use ringlet::kuberuntime::{CriClient, KubeGenericRuntimeManager, RuntimeSettings};
use ringlet::logs::{ContainerLogManager, LogRotatePolicy};
use ringlet::memory;
use ringlet::metrics::Metrics;
use ringlet::nodeshutdown::{LabSignal, Logind, NodeShutdownManager, ShutdownSource};
use ringlet::nodestatus;
use ringlet::objects::ApiObjects;
use ringlet::observe;
use ringlet::podconfig::{self, PodConfigOptions};
use ringlet::prober::ProbeResults;
use ringlet::server::auth::{AuthSettings, AuthorizationMode, KubeletAuth};
use ringlet::server::{self, ApiServing, ServeLimits, ServingTls, TlsSettings};
use ringlet::stats::{CgroupLayout, StatsProvider, StatsSettings};
use ringlet::systemd_notify::Notifier;
use tokio::sync::watch;

/// The node's log directory, served under `/logs/` as the kubelet serves it.
const NODE_LOG_DIR: &str = "/var/log";

fn main() -> ExitCode {
    memory::tune_malloc();
    // `ringlet events` inspects a running agent: none of the agent's flags or config apply.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == "events")
    {
        return cli::run_events(cli::EventsArgs::parse_from(std::env::args_os().skip(1)));
    }
    // `ringlet observe` measures a kubelet that runs the pods: none of the agent's flags apply.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == "observe")
    {
        let args = observe::ObserveArgs::parse_from(std::env::args_os().skip(1));
        init_logging(args.verbosity);
        return observe::run(args);
    }
    let (config, warnings) = match config::load(std::env::args_os()) {
        Ok(loaded) => loaded,
        Err(config::ConfigError::Flags(err)) => err.exit(),
        Err(err) => {
            eprintln!("ringlet: {err}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.verbosity);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let engine = match io::select(config.kubelet.io_engine) {
        Ok((engine, None)) => engine,
        Ok((engine, Some(reason))) => {
            tracing::warn!("io_uring unavailable, running the epoll engine: {reason}");
            engine
        }
        Err(err) => {
            let message = error_chain(&err);
            tracing::error!("{message}");
            eprintln!("ringlet: {message}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%engine, "io engine");
    match io::block_on(engine, run(config, engine)) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => {
            tracing::error!("{err:#}");
            eprintln!("ringlet: {err:#}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("ringlet: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbosity: u8) {
    let default = match verbosity {
        0..=1 => "info",
        2..=3 => "ringlet=debug,info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RINGLET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(config: AgentConfig, engine: IoEngine) -> anyhow::Result<ExitCode> {
    let kc = &config.kubelet;
    create_pods_dir(&config)?;
    let api_client = connect_api_server(&config).await?;
    let recorder = event_recorder(&config, api_client.as_ref())?;
    // Kept to write out the event log's last lines at shutdown.
    let event_log = recorder.clone();
    let pod_cgroups = pod_container_manager(&config, &recorder).await?;
    let (published_node, node) = watch::channel(None);
    let objects = api_client.as_ref().map(ApiObjects::start);
    let (probe_results, probe_updates) = ProbeResults::new();
    let helper = node_helper(&config, &pod_cgroups, node, objects.clone(), &probe_results);
    let runtime_manager = build_runtime(&config, engine, &recorder, helper);
    let log_rotation = log_rotation(&config, runtime_manager.cri());
    let image_gc = image_gc(&config, runtime_manager.cri(), &recorder);
    runtime_manager.check_node_resolv_conf().await;
    let probes = ProbeDeps {
        results: probe_results,
        updates: probe_updates,
        runner: runtime_manager.clone(),
    };
    let runtime: Arc<dyn Runtime> = runtime_manager.clone();
    let streaming: Arc<dyn StreamingRuntime> = runtime_manager;
    let (updates, sources_ready) = podconfig::start(
        pod_config_options(&config, api_client.clone()),
        recorder.clone(),
    );
    let metrics = Metrics::new().context("cannot set up the metrics")?;
    metrics.set_io_engine(engine);
    let (pleg_hints, ebpf_handle) = hint_source(&config, &pod_cgroups, &metrics)?
        .map(|source| (source.channel, source.handle))
        .unzip();
    let broadcaster = EventBroadcaster::default();
    let kubelet = Kubelet::new(
        kubelet_settings(&config),
        KubeletDeps {
            runtime,
            pod_cgroups: Arc::clone(&pod_cgroups),
            recorder,
            pleg_hints,
            metrics,
            broadcaster: broadcaster.clone(),
            api: api_client.clone(),
            objects,
            node: published_node,
            probes,
        },
    );

    if config.runonce {
        return report_run_once(kubelet.run_once(updates, sources_ready).await);
    }

    let (api_serving, _rotations) = api_serving_and_rotations(&config, api_client.as_ref())?;
    // A provider of its own: a clone would share the API's CPU samples, which each scrape prunes
    // to the pods it read.
    start_eviction(
        &config,
        &kubelet,
        stats_provider(&config, &pod_cgroups)?,
        event_log.clone(),
        image_gc.handle(config.root_dir.clone()),
    )?;
    start_node_shutdown(&config, &kubelet, event_log.clone());
    let host = kubelet.server_host(ApiParts {
        streaming,
        stats: stats_provider(&config, &pod_cgroups)?,
        configz: kc.configz(),
        node_log_dir: PathBuf::from(NODE_LOG_DIR),
        io_engine: engine,
    });
    let (stop_servers, mut servers) = start_servers(kc, engine, api_serving, &host)?;
    let mut stopped = stop_servers.subscribe();
    let rotating_logs = log_rotation.map(|manager| tokio::spawn(manager.run()));
    let collecting_images = tokio::spawn(image_gc.run());
    servers.push(tokio::spawn(serve_events(
        config.events_socket.clone(),
        broadcaster,
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        },
    )));
    tracing::info!(node = %config.node_name, "ringlet started");
    let notifier = Notifier::start(Arc::clone(&host));
    tokio::select! {
        () = kubelet.run(updates, sources_ready) => {}
        () = termination_signal() => tracing::info!("shutting down; running containers are left alone"),
    }
    if let Some(notifier) = notifier {
        notifier.stopping();
    }
    let _ = stop_servers.send(true);
    for server in servers {
        if let Ok(Err(err)) = server.await {
            tracing::warn!("server stopped with an error: {err}");
        }
    }
    if let Some(rotating_logs) = rotating_logs {
        rotating_logs.abort();
    }
    collecting_images.abort();
    drop(ebpf_handle);
    // Blocks for the last batch of `events.log`; nothing is left running on the core to delay.
    event_log.flush_log();
    Ok(ExitCode::SUCCESS)
}

/// The eBPF hint source (none in run-once mode, or when `auto` falls back to relisting).
fn hint_source(
    config: &AgentConfig,
    pod_cgroups: &PodContainerManager,
    metrics: &Metrics,
) -> anyhow::Result<Option<ebpf::HintSource>> {
    if config.runonce {
        return Ok(None);
    }
    ebpf::start_hint_source(
        config.kubelet.pleg_mode,
        pod_cgroups.pods_cgroup2_dir(),
        config.ebpf_ring_buffer_bytes,
        metrics,
    )
    .map_err(|err| anyhow::anyhow!(ebpf_unavailable_message(&error_chain(&err))))
}

/// Why an agent asked for `--pleg-mode=ebpf` does not start, and the modes that would: only `auto`
/// falls back, so an operator who asked for eBPF learns it is missing instead of silently relisting.
fn ebpf_unavailable_message(cause: &str) -> String {
    format!(
        "--pleg-mode=ebpf: the eBPF PLEG cannot start: {cause}; \
         --pleg-mode=auto would fall back to the relist PLEG, --pleg-mode=relist does not use eBPF"
    )
}

/// `<root-dir>/pods`, where the pods' volumes and data live.
fn create_pods_dir(config: &AgentConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.root_dir.join("pods")).with_context(|| {
        format!(
            "cannot create the root directory {}",
            config.root_dir.display()
        )
    })
}

/// The API server client from `--kubeconfig`, after the TLS bootstrap when `--bootstrap-kubeconfig`
/// is given and the kubeconfig does not exist yet; `None` for a standalone agent.
async fn connect_api_server(config: &AgentConfig) -> anyhow::Result<Option<ApiClient>> {
    let node = &config.kubelet.node;
    let options = ApiClientOptions {
        qps: node.kube_api_qps,
        burst: node.kube_api_burst,
        ..ApiClientOptions::default()
    };
    let client = if config.in_cluster_config {
        ApiClient::in_cluster(options).map_err(|err| {
            anyhow::anyhow!("cannot use --in-cluster-config: {}", error_chain(&err))
        })?
    } else if let Some(kubeconfig) = &config.kubeconfig {
        connect_with_kubeconfig(config, kubeconfig, options).await?
    } else {
        return Ok(None);
    };
    tracing::info!(
        server = client.server(),
        identity = client.identity(),
        "using the API server"
    );
    Ok(Some(client))
}

/// The client from `--kubeconfig`, after a TLS bootstrap when `--bootstrap-kubeconfig` asks for
/// one and the kubeconfig does not exist yet.
async fn connect_with_kubeconfig(
    config: &AgentConfig,
    kubeconfig: &Path,
    options: ApiClientOptions,
) -> anyhow::Result<ApiClient> {
    if let Some(bootstrap_kubeconfig) = &config.bootstrap_kubeconfig {
        bootstrap::bootstrap_if_needed(&BootstrapSettings {
            node_name: config.node_name.clone(),
            bootstrap_kubeconfig: bootstrap_kubeconfig.clone(),
            kubeconfig: kubeconfig.to_owned(),
            cert_dir: config.cert_dir.clone(),
        })
        .await
        .map_err(|err| anyhow::anyhow!("TLS bootstrap failed: {}", error_chain(&err)))?;
    }
    ApiClient::from_kubeconfig(kubeconfig, options)
        .await
        .map_err(|err| anyhow::anyhow!("cannot use --kubeconfig: {}", error_chain(&err)))
}

/// What the kubelet core takes from the configuration.
fn kubelet_settings(config: &AgentConfig) -> KubeletSettings {
    KubeletSettings {
        node: node_status_settings(config),
        root_dir: config.root_dir.clone(),
        sync_frequency: config.kubelet.sync_frequency,
        max_dead_containers_per_container: config
            .max_dead_containers_per_container
            .unwrap_or(usize::MAX),
        pleg_relist_period: config.kubelet.pleg_relist_period,
        housekeeping_period: ringlet::kubelet::HOUSEKEEPING_PERIOD,
        sysctls: config.kubelet.sysctls.clone(),
    }
}

/// The node as the status manager reports it: name, addresses, labels, taints, capacity settings.
fn node_status_settings(config: &AgentConfig) -> NodeStatusSettings {
    let kc = &config.kubelet;
    NodeStatusSettings {
        node_name: config.node_name.clone(),
        hostname: config.node_name.clone(),
        node_ips: config.node_ips.clone(),
        labels: config.node_labels.clone(),
        taints: kc
            .node
            .register_with_taints
            .iter()
            .map(TaintSetting::to_taint)
            .collect(),
        node: kc.node.clone(),
        max_pods: kc.max_pods,
        pods_per_core: kc.pods_per_core,
        kubelet_port: kc.port,
        root_dir: config.root_dir.clone(),
    }
}

/// The event recorder: `events.log` in the root dir, and the API server when there is one.
fn event_recorder(
    config: &AgentConfig,
    api_client: Option<&ApiClient>,
) -> anyhow::Result<Recorder> {
    let recorder = Recorder::new(Some(config.root_dir.join("events.log")));
    if let Some(client) = api_client {
        let node = &config.kubelet.node;
        recorder
            .connect(
                client.clone(),
                &config.node_name,
                node.event_record_qps,
                node.event_burst,
            )
            .context("cannot send events to the API server")?;
    }
    Ok(recorder)
}

/// The pod sources: the manifest path and URL of the configuration, and the API server.
fn pod_config_options(config: &AgentConfig, api_server: Option<ApiClient>) -> PodConfigOptions {
    let kc = &config.kubelet;
    PodConfigOptions {
        node_name: config.node_name.clone(),
        manifest_path: kc.static_pod_path.clone(),
        file_check_frequency: kc.file_check_frequency,
        manifest_url: kc.static_pod_url.clone(),
        manifest_url_headers: kc.static_pod_url_header.clone().into_iter().collect(),
        http_check_frequency: kc.http_check_frequency,
        api_server,
    }
}

/// The pod cgroups' manager, after node allocatable is validated against the machine and enforced:
/// the reserved cgroups now, the pods' cgroup in the background (the kubelet's container manager
/// start).
async fn pod_container_manager(
    config: &AgentConfig,
    recorder: &Recorder,
) -> anyhow::Result<Arc<PodContainerManager>> {
    let pod_cgroups = Arc::new(
        PodContainerManager::from_config(&config.kubelet).context("cannot set up pod cgroups")?,
    );
    let machine = tokio::task::spawn_blocking(nodestatus::read_machine_info)
        .await?
        .context("cannot read the machine's capacity")?;
    let plan = NodeAllocatablePlan::new(&config.kubelet, &NodeResources::of_machine(&machine))
        .map_err(|err| anyhow::anyhow!(error_chain(&err)))?;
    ringlet::cm::enforce_node_allocatable(
        Arc::clone(&pod_cgroups),
        plan,
        recorder.clone(),
        config.node_name.clone(),
    )
    .await
    .map_err(|err| anyhow::anyhow!(error_chain(&err)))?;
    Ok(pod_cgroups)
}

/// Serves the event API for `ringlet events`; a failure only costs that API, not the agent.
async fn serve_events(
    path: PathBuf,
    broadcaster: EventBroadcaster,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tracing::info!(socket = %path.display(), "serving the event API");
    event_stream::serve(&path, broadcaster, shutdown)
        .await
        .map_err(|err| anyhow::anyhow!(error_chain(&err)))
}

/// The CRI runtime manager over the configured endpoint (connected lazily, its socket I/O on the
/// engine), and what the probes need: their verdicts (which the runtime manager acts on) and the
/// runtime to run exec probes in.
fn build_runtime(
    config: &AgentConfig,
    engine: IoEngine,
    recorder: &Recorder,
    helper: Arc<NodeHelper>,
) -> Arc<KubeGenericRuntimeManager> {
    let kc = &config.kubelet;
    let cri = CriClient::from_channel(
        &kc.container_runtime_endpoint,
        io::unix_channel(kc.runtime_socket_path().to_path_buf(), engine),
        kc.runtime_request_timeout,
    );
    Arc::new(KubeGenericRuntimeManager::new(
        cri,
        helper,
        recorder.clone(),
        RuntimeSettings {
            container: ContainerDefaults {
                cpu_cfs_quota: CfsQuota {
                    enforce: kc.resources.cpu_cfs_quota,
                    period_us: i64::try_from(kc.resources.cpu_cfs_quota_period.as_micros())
                        .unwrap_or(i64::MAX),
                },
                seccomp: SeccompSettings {
                    default_to_runtime_default: kc.resources.seccomp_default,
                    profile_root: config.root_dir.join("seccomp"),
                },
            },
            memory_capacity_bytes: memory_capacity_bytes(),
            dns: DnsConfigurer::new(kc.dns.clone(), config.node_ips.clone()),
            image_pulls: kc.image_pull,
            ..RuntimeSettings::default()
        },
    ))
}

/// Image garbage collection over the runtime manager's CRI connection, events about the node.
fn image_gc(config: &AgentConfig, cri: &CriClient, recorder: &Recorder) -> ImageGcManager {
    ImageGcManager::new(
        Arc::new(CriImageGcRuntime::new(cri.clone())),
        ImageGcPolicy::from(&config.kubelet.image_gc),
        recorder.clone(),
        config.node_name.clone(),
    )
}

/// Container log rotation over the runtime manager's CRI connection, unless a negative
/// `containerLogMaxSize` turns it off.
fn log_rotation(config: &AgentConfig, cri: &CriClient) -> Option<ContainerLogManager> {
    let Some(policy) = LogRotatePolicy::from_settings(&config.kubelet.container_logs) else {
        tracing::info!("container log rotation is off: containerLogMaxSize is negative");
        return None;
    };
    Some(ContainerLogManager::new(
        Arc::new(cri.clone()),
        config.node_name.clone(),
        policy,
    ))
}

/// What the runtime manager asks of the node: its name, addresses and directories, the published
/// Node, what containers' environments read from the API server, and the probes' verdicts.
fn node_helper(
    config: &AgentConfig,
    pod_cgroups: &Arc<PodContainerManager>,
    node: watch::Receiver<Option<Node>>,
    objects: Option<ApiObjects>,
    probe_results: &ProbeResults,
) -> Arc<NodeHelper> {
    Arc::new(NodeHelper {
        node_name: config.node_name.clone(),
        node,
        host_ip: node_status_settings(config).host_ip().to_string(),
        root_dir: config.root_dir.clone(),
        pod_log_root: config.kubelet.pod_logs_dir.clone(),
        pod_cgroups: Arc::clone(pod_cgroups),
        objects,
        probe_results: probe_results.clone(),
    })
}

/// The kubelet API's TLS and authentication when it is on, and the certificate managers.
fn api_serving_and_rotations(
    config: &AgentConfig,
    api_client: Option<&ApiClient>,
) -> anyhow::Result<(Option<ApiServing>, CertificateRotations)> {
    let api_serving = if config.kubelet.enable_server {
        Some(api_serving(config, api_client.cloned())?)
    } else {
        None
    };
    let rotations = certificate_rotations(config, api_client, api_serving.as_ref())?;
    Ok((api_serving, rotations))
}

/// The certificate managers of `rotateCertificates` and `serverTLSBootstrap`, running while this
/// lives.
struct CertificateRotations {
    _client: Option<ClientRotation>,
    _serving: Option<ServingRotation>,
}

/// Starts the certificate managers the configuration asks for.
fn certificate_rotations(
    config: &AgentConfig,
    api_client: Option<&ApiClient>,
    api_serving: Option<&ApiServing>,
) -> anyhow::Result<CertificateRotations> {
    let kc = &config.kubelet;
    let client = match api_client {
        Some(api) if kc.rotate_certificates => {
            if api.client_certificate_pem().is_some() {
                Some(certificate::start_client_rotation(
                    api,
                    &config.node_name,
                    &config.cert_dir,
                ))
            } else {
                tracing::warn!(
                    identity = api.identity(),
                    "rotateCertificates: the API credentials are not a client certificate; nothing to rotate"
                );
                None
            }
        }
        _ => None,
    };
    let serving = match (api_serving, kc.server_tls_bootstrap) {
        (Some(serving), true) => {
            let api = api_client.ok_or_else(|| {
                anyhow::anyhow!(
                    "serverTLSBootstrap (--rotate-server-certificates) needs an API server to \
                     request the serving certificate from (--kubeconfig)"
                )
            })?;
            let template = CsrTemplate::serving(
                &config.node_name,
                &node_status_settings(config).hostname,
                &serving_addresses(config),
            );
            Some(certificate::start_serving_rotation(
                api,
                &serving.tls,
                template,
                &config.cert_dir,
            ))
        }
        _ => None,
    };
    Ok(CertificateRotations {
        _client: client,
        _serving: serving,
    })
}

/// The addresses the serving certificate names: the node's IP and the listening address.
fn serving_addresses(config: &AgentConfig) -> Vec<IpAddr> {
    let kc = &config.kubelet;
    let mut addresses: Vec<IpAddr> = vec![node_status_settings(config).host_ip()];
    if !kc.address.is_unspecified() && !addresses.contains(&kc.address) {
        addresses.push(kc.address);
    }
    addresses
}

/// TLS and authentication for the kubelet API; any problem (a bad certificate, an unreachable
/// kubeconfig) stops the agent at startup with the reason.
fn api_serving(config: &AgentConfig, api_client: Option<ApiClient>) -> anyhow::Result<ApiServing> {
    let kc = &config.kubelet;
    let addresses = serving_addresses(config);
    let tls = ServingTls::load(&TlsSettings {
        cert_file: kc.tls_cert_file.clone(),
        private_key_file: kc.tls_private_key_file.clone(),
        cert_dir: config.cert_dir.clone(),
        node_name: config.node_name.clone(),
        addresses,
        min_version: kc.tls_min_version.clone(),
        cipher_suites: kc.tls_cipher_suites.clone(),
        client_ca_file: kc.authentication.x509_client_ca_file.clone(),
        server_tls_bootstrap: kc.server_tls_bootstrap,
    })
    .map_err(|err| {
        anyhow::anyhow!(
            "cannot set up TLS for the kubelet API: {}",
            error_chain(&err)
        )
    })?;
    let authentication = &kc.authentication;
    let authorization = match kc.authorization.mode {
        AuthorizationModeSetting::AlwaysAllow => AuthorizationMode::AlwaysAllow,
        AuthorizationModeSetting::Webhook => AuthorizationMode::Webhook {
            cache_authorized_ttl: kc.authorization.webhook_cache_authorized_ttl,
            cache_unauthorized_ttl: kc.authorization.webhook_cache_unauthorized_ttl,
        },
    };
    let auth = KubeletAuth::new(
        AuthSettings {
            anonymous_enabled: authentication.anonymous_enabled,
            webhook_authentication: authentication
                .webhook_enabled
                .then_some(authentication.webhook_cache_ttl),
            authorization,
            node_name: config.node_name.clone(),
        },
        api_client,
    )
    .map_err(|err| anyhow::anyhow!("cannot set up kubelet API authentication: {err}"))?;
    if authentication.x509_client_ca_file.is_none()
        && !authentication.webhook_enabled
        && !authentication.anonymous_enabled
    {
        tracing::warn!(
            "the kubelet API accepts no client: set authentication.x509.clientCAFile, \
             --kubeconfig (token webhook) or authentication.anonymous.enabled"
        );
    }
    Ok(ApiServing {
        tls,
        auth,
        debugging_handlers: kc.enable_debugging_handlers,
        limits: ServeLimits::default(),
    })
}

/// The Summary API's provider, reading the cgroups the pod container manager lays out.
fn stats_provider(
    config: &AgentConfig,
    pod_cgroups: &PodContainerManager,
) -> anyhow::Result<StatsProvider> {
    let kc = &config.kubelet;
    let layout = CgroupLayout::detect()
        .map_err(|err| anyhow::anyhow!("cannot find the cgroup mounts for stats: {err}"))?;
    let mut settings = StatsSettings::new(config.node_name.clone(), layout);
    settings.root_dir.clone_from(&config.root_dir);
    settings.pod_log_root.clone_from(&kc.pod_logs_dir);
    settings.cgroup_driver = kc.cgroup_driver;
    settings.cgroups_per_qos = kc.cgroups_per_qos;
    settings.pods_cgroup = Some(
        pod_cgroups
            .qos_cgroup_name(QosClass::Guaranteed)
            .to_driver_path(kc.cgroup_driver),
    );
    Ok(StatsProvider::new(settings))
}

/// The eviction manager (`evictionHard` and the eviction section) as a task of its own; disk
/// pressure first deletes unused images through the image garbage collector's handle.
fn start_eviction(
    config: &AgentConfig,
    kubelet: &Kubelet,
    stats: StatsProvider,
    recorder: Recorder,
    images: ImageGcHandle,
) -> anyhow::Result<()> {
    let kc = &config.kubelet;
    let thresholds = kc
        .eviction
        .thresholds(&kc.node.eviction_hard)
        .map_err(|problems| {
            anyhow::anyhow!("invalid eviction thresholds: {}", problems.join("; "))
        })?;
    let layout = CgroupLayout::detect()
        .map_err(|err| anyhow::anyhow!("cannot find the cgroup mounts for eviction: {err}"))?;
    let (handle, host) = kubelet.eviction_parts();
    let settings = EvictionSettings {
        thresholds,
        pressure_transition_period: kc.eviction.pressure_transition_period,
        max_pod_grace_period_seconds: i64::from(kc.eviction.max_pod_grace_period),
        monitoring_period: DEFAULT_MONITORING_PERIOD,
    };
    let manager = EvictionManager::new(
        settings,
        handle,
        host,
        stats,
        layout,
        recorder,
        config.node_name.clone(),
    )
    .with_image_reclaimer(Arc::new(images));
    tokio::spawn(manager.run());
    Ok(())
}

/// Graceful node shutdown as a task of its own, when it is configured: logind announces the
/// shutdown, or `SIGUSR1` with the lab-only `--lab-node-shutdown-signal`. Without logind it stays
/// off, with one warning.
fn start_node_shutdown(config: &AgentConfig, kubelet: &Kubelet, recorder: Recorder) {
    let periods = config.kubelet.shutdown.periods();
    if periods.is_empty() {
        tracing::info!("no graceful node shutdown configured: node shutdown will be immediate");
        return;
    }
    let (evictions, host) = kubelet.eviction_parts();
    let manager = NodeShutdownManager::new(
        periods,
        kubelet.shutdown_handle(),
        evictions,
        host,
        recorder,
        config.node_name.clone(),
    );
    let lab = config.lab_node_shutdown_signal;
    tokio::spawn(async move {
        let source: Box<dyn ShutdownSource> = if lab {
            match LabSignal::new() {
                Ok(signal) => {
                    tracing::warn!(
                        "lab only (--lab-node-shutdown-signal): SIGUSR1 announces a node \
                         shutdown, logind is not used"
                    );
                    Box::new(signal)
                }
                Err(err) => {
                    tracing::warn!("graceful node shutdown is disabled: {}", error_chain(&err));
                    return;
                }
            }
        } else {
            match Logind::connect(manager.requested_period()).await {
                Ok(logind) => {
                    tracing::info!(
                        "graceful node shutdown: logind waits up to {}s for the pods at a shutdown",
                        manager.requested_period().as_secs()
                    );
                    Box::new(logind)
                }
                Err(err) => {
                    tracing::warn!(
                        "graceful node shutdown is disabled because logind is not available: {}",
                        error_chain(&err)
                    );
                    return;
                }
            }
        };
        manager.run(source).await;
    });
}

/// Prints one line per pod and a summary; fails when the run or any pod failed.
fn report_run_once(results: Result<Vec<RunPodResult>, String>) -> anyhow::Result<ExitCode> {
    let results = results.map_err(|err| anyhow::anyhow!("runonce failed: {err}"))?;
    let mut failed = 0;
    for result in &results {
        match &result.outcome {
            Ok(()) => println!("{}: running", result.pod),
            Err(err) => {
                failed += 1;
                println!("{}: failed: {err}", result.pod);
            }
        }
    }
    println!(
        "{} pods, {} running, {failed} failed",
        results.len(),
        results.len() - failed
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

type ServerTasks = Vec<tokio::task::JoinHandle<anyhow::Result<()>>>;

/// Binds the kubelet API, healthz and read-only listeners on `engine`'s sockets (a bind error is
/// fatal) and serves them until the returned sender says stop. Must run inside `io::block_on`: the
/// servers are tasks on its thread.
fn start_servers(
    kc: &KubeletConfiguration,
    engine: IoEngine,
    api: Option<ApiServing>,
    host: &Arc<KubeletServerHost>,
) -> anyhow::Result<(watch::Sender<bool>, ServerTasks)> {
    let (stop_servers, servers_stopped) = watch::channel(false);
    let shutdown = move || {
        let mut stopped = servers_stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let mut servers = Vec::new();
    if let Some(addr) = kc.healthz_addr() {
        let listener = server::bind(addr, engine)?;
        tracing::info!(%addr, "serving healthz");
        let serving = server::serve_healthz(listener, host.clone(), shutdown());
        servers.push(io::spawn_connection(async move { Ok(serving.await?) }));
    }
    if let Some(serving) = api {
        let addr = kc.server_addr();
        let listener = server::bind(addr, engine)?;
        tracing::info!(%addr, "serving the kubelet API over TLS");
        let serving = server::serve_api(listener, serving, host.clone(), shutdown());
        servers.push(io::spawn_connection(async move { Ok(serving.await?) }));
    }
    if let Some(addr) = kc.read_only_addr() {
        let listener = server::bind(addr, engine)?;
        tracing::info!(%addr, "serving the read-only API");
        let serving = server::serve_read_only(listener, host.clone(), shutdown());
        servers.push(io::spawn_connection(async move { Ok(serving.await?) }));
    }
    Ok((stop_servers, servers))
}

/// `MemTotal` of /proc/meminfo in bytes (0 when unreadable), for Burstable containers' OOM scores.
fn memory_capacity_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!(%err, "cannot watch SIGTERM; only Ctrl-C stops the agent");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
