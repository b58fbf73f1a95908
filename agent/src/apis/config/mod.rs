//! The agent's configuration: a `KubeletConfiguration` file (`kubelet.config.k8s.io/v1beta1`, the
//! kubelet's field names and defaults) overridden by command-line flags with the kubelet's names.
//! Corresponds to the kubelet's `pkg/kubelet/apis/config` (types, defaults, validation) and
//! `cmd/kubelet/app/options` (flags).
//!
//! Every problem in the file and the flags is collected and reported in one error; fields of the real
//! `KubeletConfiguration` that ringlet does not act on yet are accepted with one warning naming them.

mod configz;
mod container_logs;
mod dns;
mod duration;
mod eviction;
mod file;
mod flags;
mod image_gc;
mod image_pull;
mod node;
mod resources;
mod shutdown;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use crate::io::IoEngineSetting;
use crate::lifecycle::SysctlAllowlist;

pub use container_logs::ContainerLogSettings;
pub use dns::DnsSettings;
pub use duration::{DurationError, parse_duration};
pub use eviction::EvictionConfig;
pub use flags::Flags;
pub use image_gc::ImageGcSettings;
pub use image_pull::ImagePullSettings;
pub use node::{DEFAULT_EVICTION_HARD, NodeSettings, TaintSetting};
pub use resources::{
    ENFORCE_KUBE_RESERVED, ENFORCE_KUBE_RESERVED_COMPRESSIBLE, ENFORCE_PODS,
    ENFORCE_SYSTEM_RESERVED, ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE, ResourceSettings,
};
pub use shutdown::ShutdownSettings;

use file::RawConfig;

/// The kubelet's default CRI endpoint for containerd.
pub const DEFAULT_CONTAINER_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// The read-only port the kubelet serves when it runs without a configuration file (its "legacy"
/// flag defaults); with a file the read-only port is off unless set.
pub const LEGACY_READ_ONLY_PORT: u16 = 10255;

/// How pod cgroups are named and managed on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// Plain cgroupfs directories (`/kubepods/burstable/pod<uid>`).
    #[default]
    Cgroupfs,
    /// systemd slice names (`kubepods.slice/kubepods-burstable.slice/...`).
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `plegMode` / `--pleg-mode` (a ringlet extension): how the PLEG learns about container changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlegModeSetting {
    /// ebpf when the BPF programs load and attach, relist otherwise.
    #[default]
    Auto,
    /// Hints from the BPF programs, targeted relists and a slow safety relist.
    Ebpf,
    /// The kubelet's periodic full relist.
    Relist,
}

impl PlegModeSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ebpf => "ebpf",
            Self::Relist => "relist",
        }
    }
}

impl fmt::Display for PlegModeSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `authorization.mode`: who decides whether an authenticated request may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationModeSetting {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// The API server decides through `SubjectAccessReview`s.
    Webhook,
}

impl AuthorizationModeSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlwaysAllow => "AlwaysAllow",
            Self::Webhook => "Webhook",
        }
    }
}

/// `authentication`: how clients of the kubelet API prove who they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authentication {
    /// `x509.clientCAFile`: client certificates signed by these CAs authenticate as their subject.
    pub x509_client_ca_file: Option<PathBuf>,
    /// `webhook.enabled`: bearer tokens are checked with `TokenReview`s (default: on when
    /// `--kubeconfig` names an API server).
    pub webhook_enabled: bool,
    /// `webhook.cacheTTL` (default 2m).
    pub webhook_cache_ttl: Duration,
    /// `anonymous.enabled` (default false in ringlet): unauthenticated requests proceed as
    /// `system:anonymous`.
    pub anonymous_enabled: bool,
}

/// `authorization`: how authenticated requests are allowed or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// `mode` (default: `Webhook` when `--kubeconfig` names an API server, `AlwaysAllow` otherwise).
    pub mode: AuthorizationModeSetting,
    /// `webhook.cacheAuthorizedTTL` (default 5m).
    pub webhook_cache_authorized_ttl: Duration,
    /// `webhook.cacheUnauthorizedTTL` (default 30s).
    pub webhook_cache_unauthorized_ttl: Duration,
}

/// The `KubeletConfiguration` fields ringlet implements, defaulted and validated, plus ringlet's
/// own extension fields (marked as such).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "the kubelet's configuration has these switches"
)]
pub struct KubeletConfiguration {
    /// `staticPodPath`: a directory of manifests or a single manifest file (absolute).
    pub static_pod_path: Option<PathBuf>,
    /// `staticPodURL`: an http or https URL serving manifests.
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: headers sent with every request to `static_pod_url`.
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// `fileCheckFrequency` (default 20s).
    pub file_check_frequency: Duration,
    /// `httpCheckFrequency` (default 20s).
    pub http_check_frequency: Duration,
    /// `syncFrequency` (default 1m).
    pub sync_frequency: Duration,
    /// `address` of the kubelet API (default 0.0.0.0).
    pub address: IpAddr,
    /// `port` of the kubelet API (default 10250).
    pub port: u16,
    /// `readOnlyPort`; `None` when disabled (0).
    pub read_only_port: Option<u16>,
    /// `healthzPort` (default 10248); `None` when disabled (0).
    pub healthz_port: Option<u16>,
    /// `healthzBindAddress` (default 127.0.0.1).
    pub healthz_bind_address: IpAddr,
    /// `cgroupDriver` (default cgroupfs).
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` (default `/`).
    pub cgroup_root: String,
    /// `cgroupsPerQOS` (default true).
    pub cgroups_per_qos: bool,
    /// `maxPods` (default 110).
    pub max_pods: u32,
    /// `podsPerCore`; 0 means no per-core limit.
    pub pods_per_core: u32,
    /// `runtimeRequestTimeout` (default 2m).
    pub runtime_request_timeout: Duration,
    /// `containerRuntimeEndpoint`, always a `unix://` URL with an absolute path.
    pub container_runtime_endpoint: String,
    /// `enableServer` (default true): serve the kubelet API on `address:port`.
    pub enable_server: bool,
    /// `tlsCertFile`: the serving certificate (PEM, chain allowed); generated into `<cert-dir>` when
    /// neither it nor `tls_private_key_file` is set.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`: the serving certificate's key.
    pub tls_private_key_file: Option<PathBuf>,
    /// `rotateCertificates` (default false): renew the client certificate through CSRs.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap` (default false): the serving certificate comes from a kubelet-serving
    /// CSR (and is renewed the same way) instead of `tlsCertFile` or a self-signed pair.
    pub server_tls_bootstrap: bool,
    /// `tlsCipherSuites`: IANA/Go names; empty for the TLS library's defaults.
    pub tls_cipher_suites: Vec<String>,
    /// `tlsMinVersion`: `VersionTLS12` or `VersionTLS13`; `None` for the library's minimum.
    pub tls_min_version: Option<String>,
    /// The sysctls pods may set: the safe ones and `allowedUnsafeSysctls` (names, or prefixes
    /// ending in `*`, each known to be namespaced).
    pub sysctls: SysctlAllowlist,
    /// `authentication`.
    pub authentication: Authentication,
    /// `authorization`.
    pub authorization: Authorization,
    /// `streamingConnectionIdleTimeout` (default 4h): idle exec/attach/port-forward streams close.
    pub streaming_connection_idle_timeout: Duration,
    /// `podLogsDir` (default /var/log/pods): where container log directories go.
    pub pod_logs_dir: PathBuf,
    /// `enableDebuggingHandlers` (default true).
    pub enable_debugging_handlers: bool,
    /// `runOnce` (default false).
    pub run_once: bool,
    /// `plegMode` (ringlet extension; default auto).
    pub pleg_mode: PlegModeSetting,
    /// `ioEngine` (ringlet extension; default epoll, chosen from `bench/results/io.md`: `io_uring`
    /// measured no faster here and costs more CPU on cgroup sweeps): `io_uring` or epoll under the
    /// agent's sockets.
    pub io_engine: IoEngineSetting,
    /// `plegRelistPeriod` (ringlet extension): the PLEG's full-relist period; `None` for the mode's
    /// default (1s in relist mode, 60s as the safety relist in ebpf mode).
    pub pleg_relist_period: Option<Duration>,
    /// Registration, node status, lease, reservations and API rate limits.
    pub node: NodeSettings,
    /// Container log rotation: `containerLogMaxSize`, `containerLogMaxFiles`,
    /// `containerLogMaxWorkers`, `containerLogMonitorInterval`.
    pub container_logs: ContainerLogSettings,
    /// Pod DNS: `clusterDNS`, `clusterDomain`, `resolvConf`.
    pub dns: DnsSettings,
    /// Node-pressure eviction besides `evictionHard` (in `node`).
    pub eviction: EvictionConfig,
    /// Image garbage collection: `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
    /// `imageMinimumGCAge`, `imageMaximumGCAge`.
    pub image_gc: ImageGcSettings,
    /// Graceful node shutdown: `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
    /// `shutdownGracePeriodByPodPriority`.
    pub shutdown: ShutdownSettings,
    /// Image pull limits: `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS`,
    /// `registryBurst`.
    pub image_pull: ImagePullSettings,
    /// What the node enforces on pods and containers: `podPidsLimit`, `cpuCFSQuota`,
    /// `cpuCFSQuotaPeriod`, `seccompDefault`, `enforceNodeAllocatable`, `systemReservedCgroup`,
    /// `kubeReservedCgroup`.
    pub resources: ResourceSettings,
}

impl Default for KubeletConfiguration {
    /// The defaults of a configuration file that sets nothing.
    fn default() -> Self {
        Self {
            static_pod_path: None,
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            sync_frequency: Duration::from_mins(1),
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 10250,
            read_only_port: None,
            healthz_port: Some(10248),
            healthz_bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".to_owned(),
            cgroups_per_qos: true,
            max_pods: 110,
            pods_per_core: 0,
            runtime_request_timeout: Duration::from_mins(2),
            container_runtime_endpoint: DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_owned(),
            enable_server: true,
            tls_cert_file: None,
            tls_private_key_file: None,
            rotate_certificates: false,
            server_tls_bootstrap: false,
            tls_cipher_suites: Vec::new(),
            sysctls: SysctlAllowlist::default(),
            tls_min_version: None,
            authentication: Authentication {
                x509_client_ca_file: None,
                webhook_enabled: false,
                webhook_cache_ttl: Duration::from_mins(2),
                anonymous_enabled: false,
            },
            authorization: Authorization {
                mode: AuthorizationModeSetting::AlwaysAllow,
                webhook_cache_authorized_ttl: Duration::from_mins(5),
                webhook_cache_unauthorized_ttl: Duration::from_secs(30),
            },
            streaming_connection_idle_timeout: Duration::from_hours(4),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            enable_debugging_handlers: true,
            run_once: false,
            pleg_mode: PlegModeSetting::Auto,
            io_engine: IoEngineSetting::Epoll,
            pleg_relist_period: None,
            node: NodeSettings::default(),
            container_logs: ContainerLogSettings::default(),
            dns: DnsSettings::default(),
            eviction: EvictionConfig::default(),
            image_gc: ImageGcSettings::default(),
            shutdown: ShutdownSettings::default(),
            image_pull: ImagePullSettings::default(),
            resources: ResourceSettings::default(),
        }
    }
}

impl KubeletConfiguration {
    /// Where the kubelet API listens.
    pub fn server_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// Where the read-only API listens, if enabled.
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.read_only_port
            .map(|port| SocketAddr::new(self.address, port))
    }

    /// Where the healthz endpoint listens, if enabled.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz_port
            .map(|port| SocketAddr::new(self.healthz_bind_address, port))
    }

    /// The unix socket path of `container_runtime_endpoint`.
    pub fn runtime_socket_path(&self) -> &Path {
        Path::new(
            self.container_runtime_endpoint
                .strip_prefix("unix://")
                .unwrap_or(&self.container_runtime_endpoint),
        )
    }
}

/// Everything the agent is configured with: the `KubeletConfiguration` plus the flag-only settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    pub kubelet: KubeletConfiguration,
    /// `--hostname-override` or the system hostname, lowercased.
    pub node_name: String,
    /// `--root-dir` (default /var/lib/kubelet).
    pub root_dir: PathBuf,
    /// `--runonce` or `runOnce` in the file.
    pub runonce: bool,
    /// `--maximum-dead-containers-per-container` (default 1); `None` (a negative flag value) keeps
    /// every dead container.
    pub max_dead_containers_per_container: Option<usize>,
    /// `-v`/`--v` log verbosity.
    pub verbosity: u8,
    /// The `--config` file, if one was given.
    pub config_file: Option<PathBuf>,
    /// `--events-socket`: where `ringlet events` connects.
    pub events_socket: PathBuf,
    /// `--ebpf-ring-buffer-bytes`: the eBPF PLEG's ring buffer size.
    pub ebpf_ring_buffer_bytes: u32,
    /// `--lab-node-shutdown-signal` (hidden, lab only): SIGUSR1 instead of logind announces a
    /// shutdown.
    pub lab_node_shutdown_signal: bool,
    /// `--kubeconfig`: how to reach the API server (for the authentication and authorisation
    /// webhooks); `None` for a standalone agent.
    pub kubeconfig: Option<PathBuf>,
    /// `--in-cluster-config`: reach the API server with the service account of the pod the agent
    /// runs in, instead of `kubeconfig`.
    pub in_cluster_config: bool,
    /// `--cert-dir` (default `<root-dir>/pki`): where a generated serving certificate and the
    /// bootstrapped client certificate go.
    pub cert_dir: PathBuf,
    /// `--bootstrap-kubeconfig`: requests a client certificate when `kubeconfig` does not exist.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--node-labels`: extra labels the Node is registered with.
    pub node_labels: BTreeMap<String, String>,
    /// `--node-ip`: the node's addresses; empty to detect them.
    pub node_ips: Vec<IpAddr>,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("parsing command-line flags")]
    Flags(#[source] clap::Error),
    #[error("reading kubelet config file {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing kubelet config file {path} as YAML")]
    ParseFile {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error(
        "kubelet config file {path} nests deeper than {limit} levels (at line {line}, column {column})"
    )]
    TooDeep {
        path: PathBuf,
        limit: usize,
        line: usize,
        column: usize,
    },
    #[error("reading the system hostname (set --hostname-override instead)")]
    Hostname(#[source] std::io::Error),
    #[error("invalid configuration ({origin}):\n  - {}", problems.join("\n  - "))]
    Invalid {
        /// The config file, or "command-line flags" when there is none.
        origin: String,
        problems: Vec<String>,
    },
}

/// Parses `args` (including the program name) and loads the configuration. Returns the configuration
/// and warnings to log. `--help` and `--version` come back as `ConfigError::Flags`, whose `exit()`
/// prints them.
pub fn load<I, T>(args: I) -> Result<(AgentConfig, Vec<String>), ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let flags = Flags::try_parse_from(args).map_err(ConfigError::Flags)?;
    from_flags(&flags)
}

/// Loads the configuration for already parsed flags: reads `--config` if given, lays the flags over
/// it, applies the kubelet's defaults and validates the result.
pub fn from_flags(flags: &Flags) -> Result<(AgentConfig, Vec<String>), ConfigError> {
    let hostname = match &flags.hostname_override {
        Some(name) => name.clone(),
        None => system_hostname().map_err(ConfigError::Hostname)?,
    };
    let contents = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
                path: path.clone(),
                source,
            })?;
            Some(read_file_text(path, &text)?)
        }
        None => None,
    };
    resolve(flags, contents, &hostname)
}

/// The deepest nesting a config file may have; a `KubeletConfiguration` nests a few levels. Checked
/// before the YAML parser runs, whose cost grows with the size times the nesting of flow
/// collections (see [`crate::podconfig::depth`]).
const MAX_NESTING_DEPTH: usize = 128;

fn read_file_text(path: &Path, text: &str) -> Result<file::FileContents, ConfigError> {
    if let Some(at) = crate::podconfig::depth::too_deep(text, MAX_NESTING_DEPTH) {
        return Err(ConfigError::TooDeep {
            path: path.to_owned(),
            limit: MAX_NESTING_DEPTH,
            line: at.line,
            column: at.column,
        });
    }
    let document: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|source| ConfigError::ParseFile {
            path: path.to_owned(),
            source,
        })?;
    Ok(file::read_document(&document))
}

fn system_hostname() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
}

fn resolve(
    flags: &Flags,
    contents: Option<file::FileContents>,
    hostname: &str,
) -> Result<(AgentConfig, Vec<String>), ConfigError> {
    let have_file = contents.is_some();
    let file::FileContents {
        mut raw,
        not_implemented,
        mut problems,
    } = contents.unwrap_or_default();
    flags.overlay(&mut raw, &mut problems);
    let has_api_server = flags.kubeconfig.is_some() || flags.in_cluster_config;
    let kubelet = build(raw, have_file, has_api_server, &mut problems);

    let node_name = hostname.trim().to_lowercase();
    if let Err(reason) = validate_node_name(&node_name) {
        problems.push(format!(
            "node name {node_name:?} (--hostname-override): {reason}"
        ));
    }
    if !flags.root_dir.is_absolute() {
        problems.push(format!(
            "--root-dir: {} must be an absolute path",
            flags.root_dir.display()
        ));
    }
    if !flags.events_socket.is_absolute() {
        problems.push(format!(
            "--events-socket: {} must be an absolute path",
            flags.events_socket.display()
        ));
    }
    for (flag, path) in [
        ("--kubeconfig", flags.kubeconfig.as_ref()),
        (
            "--bootstrap-kubeconfig",
            flags.bootstrap_kubeconfig.as_ref(),
        ),
        ("--cert-dir", flags.cert_dir.as_ref()),
    ] {
        if let Some(path) = path
            && !path.is_absolute()
        {
            problems.push(format!(
                "{flag}: {} must be an absolute path",
                path.display()
            ));
        }
    }
    if flags.bootstrap_kubeconfig.is_some() && flags.kubeconfig.is_none() {
        problems.push(
            "--bootstrap-kubeconfig: needs --kubeconfig, the file the bootstrap writes".to_owned(),
        );
    }
    let (node_labels, node_ips) = node_flags(flags, &mut problems);
    let ring = flags.ebpf_ring_buffer_bytes;
    if !ring.is_power_of_two() || ring < 4096 {
        problems.push(format!(
            "--ebpf-ring-buffer-bytes: {ring} must be a power of two of at least 4096"
        ));
    }

    if !problems.is_empty() {
        let origin = flags.config.as_ref().map_or_else(
            || "command-line flags".to_owned(),
            |path| format!("{} and command-line flags", path.display()),
        );
        return Err(ConfigError::Invalid { origin, problems });
    }

    let mut warnings = Vec::new();
    if !not_implemented.is_empty() {
        warnings.push(format!(
            "ringlet does not implement these KubeletConfiguration fields yet: {}",
            not_implemented.join(", ")
        ));
    }
    let config = AgentConfig {
        runonce: kubelet.run_once,
        kubelet,
        node_name,
        root_dir: flags.root_dir.clone(),
        max_dead_containers_per_container: usize::try_from(
            flags.maximum_dead_containers_per_container,
        )
        .ok(),
        verbosity: flags.v,
        config_file: flags.config.clone(),
        events_socket: flags.events_socket.clone(),
        ebpf_ring_buffer_bytes: flags.ebpf_ring_buffer_bytes,
        lab_node_shutdown_signal: flags.lab_node_shutdown_signal,
        kubeconfig: flags.kubeconfig.clone(),
        in_cluster_config: flags.in_cluster_config,
        cert_dir: flags
            .cert_dir
            .clone()
            .unwrap_or_else(|| flags.root_dir.join("pki")),
        bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
        node_labels,
        node_ips,
    };
    Ok((config, warnings))
}

/// Applies the kubelet's defaults to the merged values and validates them, appending every problem.
#[allow(clippy::too_many_lines)]
fn build(
    raw: RawConfig,
    have_file: bool,
    have_api_server: bool,
    problems: &mut Vec<String>,
) -> KubeletConfiguration {
    let defaults = KubeletConfiguration::default();
    let (tls_cert_file, tls_private_key_file) = match (
        absolute_path(
            raw.tls_cert_file.clone(),
            "tlsCertFile",
            "tls-cert-file",
            problems,
        ),
        absolute_path(
            raw.tls_private_key_file.clone(),
            "tlsPrivateKeyFile",
            "tls-private-key-file",
            problems,
        ),
    ) {
        (Some(cert), None) => {
            problems.push(format!(
                "tlsPrivateKeyFile (--tls-private-key-file): must be set with tlsCertFile {}",
                cert.display()
            ));
            (None, None)
        }
        (None, Some(key)) => {
            problems.push(format!(
                "tlsCertFile (--tls-cert-file): must be set with tlsPrivateKeyFile {}",
                key.display()
            ));
            (None, None)
        }
        pair => pair,
    };
    let authentication = build_authentication(&raw, &defaults, have_api_server, problems);
    let authorization = build_authorization(&raw, &defaults, have_api_server, problems);
    let pod_logs_dir = absolute_path(
        raw.pod_logs_dir.clone(),
        "podLogsDir",
        "pod-logs-dir",
        problems,
    )
    .unwrap_or_else(|| defaults.pod_logs_dir.clone());

    let mut problem = |field: &str, flag: &str, message: String| {
        problems.push(format!("{field} (--{flag}): {message}"));
    };

    let static_pod_path = raw
        .static_pod_path
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    if let Some(path) = &static_pod_path
        && !path.is_absolute()
    {
        problem(
            "staticPodPath",
            "pod-manifest-path",
            format!("{} must be an absolute path", path.display()),
        );
    }

    let static_pod_url = raw.static_pod_url.filter(|u| !u.is_empty());
    if let Some(url) = &static_pod_url
        && let Err(reason) = crate::podconfig::validate_manifest_url(url)
    {
        problem("staticPodURL", "manifest-url", reason.to_string());
    }

    let static_pod_url_header = raw.static_pod_url_header.unwrap_or_default();
    for (name, values) in &static_pod_url_header {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            problem(
                "staticPodURLHeader",
                "manifest-url-header",
                format!("{name:?} is not a valid HTTP header name"),
            );
        }
        for value in values {
            if http::HeaderValue::from_str(value).is_err() {
                problem(
                    "staticPodURLHeader",
                    "manifest-url-header",
                    format!("value {value:?} of header {name:?} is not a valid HTTP header value"),
                );
            }
        }
    }

    let mut positive = |value: Option<Duration>, default: Duration, field: &str, flag: &str| {
        let value = value.unwrap_or(default);
        if value.is_zero() {
            problem(field, flag, "must be greater than 0".to_owned());
        }
        value
    };
    let file_check_frequency = positive(
        raw.file_check_frequency,
        defaults.file_check_frequency,
        "fileCheckFrequency",
        "file-check-frequency",
    );
    let http_check_frequency = positive(
        raw.http_check_frequency,
        defaults.http_check_frequency,
        "httpCheckFrequency",
        "http-check-frequency",
    );
    let sync_frequency = positive(
        raw.sync_frequency,
        defaults.sync_frequency,
        "syncFrequency",
        "sync-frequency",
    );
    let runtime_request_timeout = positive(
        raw.runtime_request_timeout,
        defaults.runtime_request_timeout,
        "runtimeRequestTimeout",
        "runtime-request-timeout",
    );

    let mut ip = |value: Option<String>, default: IpAddr, field: &str, flag: &str| match value {
        None => default,
        Some(text) => text.parse().unwrap_or_else(|_| {
            problem(field, flag, format!("{text:?} is not an IP address"));
            default
        }),
    };
    let address = ip(raw.address, defaults.address, "address", "address");
    let healthz_bind_address = ip(
        raw.healthz_bind_address,
        defaults.healthz_bind_address,
        "healthzBindAddress",
        "healthz-bind-address",
    );

    let mut port = |value: i64, field: &str, flag: &str, zero_disables: bool| -> Option<u16> {
        if value == 0 && zero_disables {
            return None;
        }
        match u16::try_from(value) {
            Ok(port) if port > 0 => Some(port),
            _ => {
                let allowed = if zero_disables {
                    "between 1 and 65535, or 0 to disable"
                } else {
                    "between 1 and 65535"
                };
                problem(field, flag, format!("{value} must be {allowed}"));
                None
            }
        }
    };
    let port_number = raw
        .port
        .map_or(Some(defaults.port), |p| port(p, "port", "port", false));
    let legacy_read_only = if have_file {
        0
    } else {
        i64::from(LEGACY_READ_ONLY_PORT)
    };
    let read_only_port = port(
        raw.read_only_port.unwrap_or(legacy_read_only),
        "readOnlyPort",
        "read-only-port",
        true,
    );
    let healthz_port = raw.healthz_port.map_or(defaults.healthz_port, |p| {
        port(p, "healthzPort", "healthz-port", true)
    });

    let cgroup_driver = match raw.cgroup_driver.as_deref() {
        None | Some("" | "cgroupfs") => CgroupDriver::Cgroupfs,
        Some("systemd") => CgroupDriver::Systemd,
        Some(other) => {
            problem(
                "cgroupDriver",
                "cgroup-driver",
                format!("{other:?} must be cgroupfs or systemd"),
            );
            CgroupDriver::Cgroupfs
        }
    };
    let cgroup_root = raw
        .cgroup_root
        .filter(|root| !root.is_empty())
        .unwrap_or_else(|| defaults.cgroup_root.clone());
    if let Err(reason) = validate_cgroup_root(&cgroup_root, cgroup_driver) {
        problem(
            "cgroupRoot",
            "cgroup-root",
            format!("{cgroup_root:?} {reason}"),
        );
    }

    let mut count = |value: Option<i64>, default: u32, field: &str, flag: &str| match value {
        None => default,
        Some(n) if n < 0 => {
            problem(field, flag, format!("{n} must not be a negative number"));
            default
        }
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| i32::try_from(*n).is_ok())
            .unwrap_or_else(|| {
                problem(field, flag, format!("{n} is too large"));
                default
            }),
    };
    let max_pods = count(raw.max_pods, defaults.max_pods, "maxPods", "max-pods");
    let pods_per_core = count(
        raw.pods_per_core,
        defaults.pods_per_core,
        "podsPerCore",
        "pods-per-core",
    );

    let pleg_mode = match raw.pleg_mode.as_deref() {
        None | Some("" | "auto") => PlegModeSetting::Auto,
        Some("ebpf") => PlegModeSetting::Ebpf,
        Some("relist") => PlegModeSetting::Relist,
        Some(other) => {
            problem(
                "plegMode",
                "pleg-mode",
                format!("{other:?} must be auto, ebpf or relist"),
            );
            PlegModeSetting::Auto
        }
    };
    let io_engine = match raw.io_engine.as_deref() {
        None | Some("") => defaults.io_engine,
        Some(value) => value.parse().unwrap_or_else(|_| {
            problem(
                "ioEngine",
                "io-engine",
                format!("{value:?} must be auto, uring or epoll"),
            );
            defaults.io_engine
        }),
    };
    if raw.pleg_relist_period.is_some_and(|p| p.is_zero()) {
        problem(
            "plegRelistPeriod",
            "pleg-relist-period",
            "must be greater than 0".to_owned(),
        );
    }

    let container_runtime_endpoint = raw
        .container_runtime_endpoint
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| defaults.container_runtime_endpoint.clone());
    let socket = container_runtime_endpoint.strip_prefix("unix://");
    if !socket.is_some_and(|path| Path::new(path).is_absolute()) {
        problem(
            "containerRuntimeEndpoint",
            "container-runtime-endpoint",
            format!(
                "{container_runtime_endpoint:?} must be a unix socket URL such as {DEFAULT_CONTAINER_RUNTIME_ENDPOINT}"
            ),
        );
    }

    let cgroups_per_qos = raw.cgroups_per_qos.unwrap_or(defaults.cgroups_per_qos);
    let node = node::build(raw.node, problems);
    let eviction = eviction::build(raw.eviction, &node.eviction_hard, problems);
    KubeletConfiguration {
        static_pod_path,
        static_pod_url,
        static_pod_url_header,
        file_check_frequency,
        http_check_frequency,
        sync_frequency,
        address,
        port: port_number.unwrap_or(defaults.port),
        read_only_port,
        healthz_port,
        healthz_bind_address,
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos,
        max_pods,
        pods_per_core,
        runtime_request_timeout,
        container_runtime_endpoint,
        enable_server: raw.enable_server.unwrap_or(defaults.enable_server),
        tls_cert_file,
        tls_private_key_file,
        rotate_certificates: raw
            .rotate_certificates
            .unwrap_or(defaults.rotate_certificates),
        server_tls_bootstrap: raw
            .server_tls_bootstrap
            .unwrap_or(defaults.server_tls_bootstrap),
        tls_cipher_suites: raw.tls_cipher_suites.unwrap_or_default(),
        sysctls: sysctl_allowlist(raw.allowed_unsafe_sysctls, problems),
        tls_min_version: raw.tls_min_version.filter(|v| !v.is_empty()),
        authentication,
        authorization,
        streaming_connection_idle_timeout: raw
            .streaming_connection_idle_timeout
            .unwrap_or(defaults.streaming_connection_idle_timeout),
        pod_logs_dir,
        enable_debugging_handlers: raw
            .enable_debugging_handlers
            .unwrap_or(defaults.enable_debugging_handlers),
        run_once: raw.run_once.unwrap_or(defaults.run_once),
        pleg_mode,
        io_engine,
        pleg_relist_period: raw.pleg_relist_period.filter(|p| !p.is_zero()),
        node,
        container_logs: container_logs::build(raw.container_logs, problems),
        dns: dns::build(raw.dns, problems),
        eviction,
        image_gc: image_gc::build(raw.image_gc, problems),
        shutdown: shutdown::build(raw.shutdown, problems),
        image_pull: image_pull::build(raw.image_pull, problems),
        resources: resources::build(raw.resources, cgroups_per_qos, problems),
    }
}

/// An optional path field that must be absolute when set (an empty string counts as unset).
fn absolute_path(
    value: Option<String>,
    field: &str,
    flag: &str,
    problems: &mut Vec<String>,
) -> Option<PathBuf> {
    let path = PathBuf::from(value.filter(|v| !v.is_empty())?);
    if path.is_absolute() {
        Some(path)
    } else {
        problems.push(format!(
            "{field} (--{flag}): {} must be an absolute path",
            path.display()
        ));
        None
    }
}

/// The webhook is on by default only when there is an API server to ask.
/// The safe sysctls and `allowedUnsafeSysctls`; an entry that is not a namespaced sysctl pattern
/// is a problem.
fn sysctl_allowlist(raw: Option<Vec<String>>, problems: &mut Vec<String>) -> SysctlAllowlist {
    let allowed: Vec<String> = raw
        .unwrap_or_default()
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    SysctlAllowlist::new(&allowed).unwrap_or_else(|problem| {
        problems.push(format!(
            "allowedUnsafeSysctls (--allowed-unsafe-sysctls): {problem}"
        ));
        SysctlAllowlist::default()
    })
}

fn build_authentication(
    raw: &RawConfig,
    defaults: &KubeletConfiguration,
    have_api_server: bool,
    problems: &mut Vec<String>,
) -> Authentication {
    let webhook_enabled = raw.webhook_authentication.unwrap_or(have_api_server);
    if webhook_enabled && !have_api_server {
        problems.push(
            "authentication.webhook.enabled (--authentication-token-webhook): needs --kubeconfig \
             naming the API server that reviews tokens"
                .to_owned(),
        );
    }
    Authentication {
        x509_client_ca_file: absolute_path(
            raw.client_ca_file.clone(),
            "authentication.x509.clientCAFile",
            "client-ca-file",
            problems,
        ),
        webhook_enabled: webhook_enabled && have_api_server,
        webhook_cache_ttl: raw
            .webhook_authentication_cache_ttl
            .unwrap_or(defaults.authentication.webhook_cache_ttl),
        anonymous_enabled: raw
            .anonymous_auth
            .unwrap_or(defaults.authentication.anonymous_enabled),
    }
}

fn build_authorization(
    raw: &RawConfig,
    defaults: &KubeletConfiguration,
    have_api_server: bool,
    problems: &mut Vec<String>,
) -> Authorization {
    let mode = match raw.authorization_mode.as_deref() {
        None | Some("" | "Webhook") if have_api_server => AuthorizationModeSetting::Webhook,
        None | Some("" | "AlwaysAllow") => AuthorizationModeSetting::AlwaysAllow,
        Some("Webhook") => {
            problems.push(
                "authorization.mode (--authorization-mode): Webhook needs --kubeconfig naming the \
                 API server that reviews access"
                    .to_owned(),
            );
            AuthorizationModeSetting::AlwaysAllow
        }
        Some(other) => {
            problems.push(format!(
                "authorization.mode (--authorization-mode): {other:?} must be AlwaysAllow or Webhook"
            ));
            AuthorizationModeSetting::AlwaysAllow
        }
    };
    Authorization {
        mode,
        webhook_cache_authorized_ttl: raw
            .authorization_cache_authorized_ttl
            .unwrap_or(defaults.authorization.webhook_cache_authorized_ttl),
        webhook_cache_unauthorized_ttl: raw
            .authorization_cache_unauthorized_ttl
            .unwrap_or(defaults.authorization.webhook_cache_unauthorized_ttl),
    }
}

fn validate_cgroup_root(root: &str, driver: CgroupDriver) -> Result<(), &'static str> {
    if !root.starts_with('/') {
        return Err("must be an absolute cgroup path");
    }
    if root.split('/').any(|part| part == "." || part == "..") {
        return Err("must not contain . or .. components");
    }
    if driver == CgroupDriver::Systemd && root != "/" {
        let leaf = root.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        if leaf.strip_suffix(".slice").is_none_or(str::is_empty) {
            return Err(
                "must be / or a systemd slice such as /ringlet.slice with the systemd driver",
            );
        }
    }
    Ok(())
}

/// `--node-labels` and `--node-ip`, parsed; problems are appended.
fn node_flags(
    flags: &Flags,
    problems: &mut Vec<String>,
) -> (BTreeMap<String, String>, Vec<IpAddr>) {
    let labels = parse_node_labels(flags.node_labels.as_deref().unwrap_or_default())
        .unwrap_or_else(|problem| {
            problems.push(format!("--node-labels: {problem}"));
            BTreeMap::new()
        });
    let ips =
        parse_node_ips(flags.node_ip.as_deref().unwrap_or_default()).unwrap_or_else(|problem| {
            problems.push(format!("--node-ip: {problem}"));
            Vec::new()
        });
    (labels, ips)
}

/// `--node-labels`: comma-separated `key=value` pairs with Kubernetes label syntax.
fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} must be key=value"))?;
        validate_label_key(key).map_err(|reason| format!("label key {key:?}: {reason}"))?;
        validate_label_value(value)
            .map_err(|reason| format!("label value {value:?} of {key:?}: {reason}"))?;
        labels.insert(key.to_owned(), value.to_owned());
    }
    Ok(labels)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn validate_label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        validate_node_name(prefix).map_err(|_| "the prefix must be a DNS subdomain")?;
    }
    if name.is_empty() {
        return Err("the name part must not be empty");
    }
    validate_label_value(name)
}

/// A label value: at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn validate_label_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Ok(());
    }
    let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if value.len() > 63
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || !alphanumeric(value.chars().next())
        || !alphanumeric(value.chars().last())
    {
        return Err(
            "must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        );
    }
    Ok(())
}

/// `--node-ip`: one address, or one of each family.
fn parse_node_ips(text: &str) -> Result<Vec<IpAddr>, String> {
    let ips = text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<IpAddr>()
                .map_err(|_| format!("{part:?} is not an IP address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips.as_slice() {
        [a, b] if a.is_ipv4() == b.is_ipv4() => {
            Err("two addresses must be one IPv4 and one IPv6 address".to_owned())
        }
        [_, _, _, ..] => Err("at most two addresses (one per family)".to_owned()),
        _ => Ok(ips),
    }
}

/// Node names end up in static pod names, so they must be DNS-1123 subdomains.
fn validate_node_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > 253 {
        return Err("must be at most 253 characters");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("must be a DNS subdomain (lowercase letters, digits, '-' and '.')")
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests;
