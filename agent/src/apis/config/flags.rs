//! ringlet's command line, with the kubelet's flag names (the kubelet's `cmd/kubelet/app/options`).
//! Flags given on the command line override the configuration file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::duration::parse_duration;
use super::eviction;
use super::file::RawConfig;
use super::resources;

/// Command-line flags. Every flag backed by a `KubeletConfiguration` field is optional so that an
/// unset flag leaves the file's value (or the default) in place.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ringlet",
    version,
    about = "Kubernetes node agent: runs static pods from manifest files or a manifest URL on a CRI runtime"
)]
pub struct Flags {
    /// Path to a `KubeletConfiguration` file (kubelet.config.k8s.io/v1beta1). Flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory of static pod manifests, or a single manifest file (config: staticPodPath).
    #[arg(long, value_name = "PATH")]
    pub pod_manifest_path: Option<String>,

    /// URL serving static pod manifests (config: staticPodURL).
    #[arg(long, value_name = "URL")]
    pub manifest_url: Option<String>,

    /// HTTP headers for --manifest-url as comma-separated `name:value` pairs; repeatable. Replaces the
    /// file's staticPodURLHeader; a repeated name adds values in order.
    #[arg(long, value_name = "NAME:VALUE[,NAME:VALUE...]")]
    pub manifest_url_header: Vec<String>,

    /// How often to re-read the manifest path, e.g. 20s (config: fileCheckFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub file_check_frequency: Option<Duration>,

    /// How often to poll the manifest URL, e.g. 20s (config: httpCheckFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub http_check_frequency: Option<Duration>,

    /// Maximum period between pod syncs, e.g. 1m (config: syncFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub sync_frequency: Option<Duration>,

    /// Node name to use instead of the system hostname (lowercased).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,

    /// Directory for the agent's state files.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,

    /// Unix socket of the local event API that `ringlet events` reads (root only; ringlet extension).
    #[arg(long, value_name = "PATH", default_value = crate::event_stream::DEFAULT_SOCKET_PATH)]
    pub events_socket: PathBuf,

    /// Size of the eBPF ring buffer in bytes: a power of two, at least one page (ringlet extension).
    #[arg(long, value_name = "BYTES", default_value_t = crate::ebpf::DEFAULT_RING_BUFFER_BYTES)]
    pub ebpf_ring_buffer_bytes: u32,

    /// Lab only, hidden: SIGUSR1 acts as logind's `PrepareForShutdown(true)` and logind is not
    /// asked (graceful node shutdown on a test machine without logind; docs/operations.md).
    #[arg(long, hide = true)]
    pub lab_node_shutdown_signal: bool,

    /// CRI endpoint, e.g. <unix:///run/containerd/containerd.sock> (config: containerRuntimeEndpoint).
    #[arg(long, value_name = "ENDPOINT")]
    pub container_runtime_endpoint: Option<String>,

    /// Timeout of runtime requests other than pulls, logs, exec and attach (config: runtimeRequestTimeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub runtime_request_timeout: Option<Duration>,

    /// cgroupfs or systemd (config: cgroupDriver).
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,

    /// Root cgroup for pods (config: cgroupRoot).
    #[arg(long, value_name = "CGROUP")]
    pub cgroup_root: Option<String>,

    /// Put pods under per-QoS cgroups, e.g. --cgroups-per-qos=false (config: cgroupsPerQOS).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub cgroups_per_qos: Option<bool>,

    /// IP address the kubelet API listens on (config: address).
    #[arg(long, value_name = "IP")]
    pub address: Option<String>,

    /// Port of the kubelet API (config: port).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub port: Option<i64>,

    /// Port of the unauthenticated read-only API, 0 to disable (config: readOnlyPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub read_only_port: Option<i64>,

    /// Port of the localhost healthz endpoint, 0 to disable (config: healthzPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub healthz_port: Option<i64>,

    /// IP address the healthz endpoint listens on (config: healthzBindAddress).
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<String>,

    /// Maximum number of pods on this node (config: maxPods).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_pods: Option<i64>,

    /// Maximum number of pods per CPU core, 0 for no limit (config: podsPerCore).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pods_per_core: Option<i64>,

    /// Serve exec, attach, port-forward and log endpoints (config: enableDebuggingHandlers).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_debugging_handlers: Option<bool>,

    /// Run the static pods once, report their result and exit (config: runOnce).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub runonce: Option<bool>,

    /// ringlet extension: how the PLEG learns about container changes: ebpf (kernel hints and targeted
    /// relists), relist (the kubelet's periodic relist) or auto (ebpf when the BPF programs load)
    /// (config: plegMode).
    #[arg(long, value_name = "MODE")]
    pub pleg_mode: Option<String>,

    /// ringlet extension: period of the PLEG's full relist, e.g. 1s; default 1s in relist mode and
    /// 60s (the safety relist) in ebpf mode (config: plegRelistPeriod).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub pleg_relist_period: Option<Duration>,

    /// Serve the kubelet API on --address:--port, e.g. --enable-server=false (config: enableServer).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_server: Option<bool>,

    /// Directory for container log directories (config: podLogsDir).
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<String>,

    /// Size at which a container's log file is rotated, a quantity such as 10Mi; negative turns
    /// rotation off (config: containerLogMaxSize).
    #[arg(long, value_name = "QUANTITY", allow_hyphen_values = true)]
    pub container_log_max_size: Option<String>,

    /// Log files kept per container, the live one included; at least 2 (config: containerLogMaxFiles).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub container_log_max_files: Option<i64>,

    /// Containers whose logs are rotated at the same time (config: containerLogMaxWorkers).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub container_log_max_workers: Option<i64>,

    /// How often container log sizes are checked, at least 3s (config: containerLogMonitorInterval).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub container_log_monitor_interval: Option<Duration>,

    /// Comma-separated IP addresses of the cluster's DNS servers, the nameservers of pods with
    /// `dnsPolicy: ClusterFirst` (config: clusterDNS).
    #[arg(long, value_name = "IP[,IP...]", value_delimiter = ',')]
    pub cluster_dns: Option<Vec<String>>,

    /// The cluster's domain, e.g. cluster.local: `ClusterFirst` pods search it (config:
    /// clusterDomain).
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,

    /// The node's resolver configuration, the base of pods' DNS; empty for none (config:
    /// resolvConf).
    #[arg(long, value_name = "FILE")]
    pub resolv_conf: Option<String>,

    /// Image filesystem usage in percent at or above which unused images are removed; 100 turns
    /// that off (config: imageGCHighThresholdPercent).
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i64>,

    /// Image filesystem usage in percent that image garbage collection frees down to (config:
    /// imageGCLowThresholdPercent).
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i64>,

    /// Minimum age of an unused image before it is garbage collected, e.g. 2m (config:
    /// imageMinimumGCAge).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub minimum_image_ttl_duration: Option<Duration>,

    /// Pull images one at a time, e.g. --serialize-image-pulls=false (config:
    /// serializeImagePulls).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub serialize_image_pulls: Option<bool>,

    /// Image pulls per second; 0 for no limit (config: registryPullQPS).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub registry_qps: Option<i64>,

    /// Image pulls allowed at once above --registry-qps (config: registryBurst).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub registry_burst: Option<i64>,

    /// Serving certificate of the kubelet API, PEM (config: tlsCertFile).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<String>,

    /// Key of the serving certificate, PEM (config: tlsPrivateKeyFile).
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<String>,

    /// Renew the client certificate through a CSR as it nears expiry (config: rotateCertificates).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub rotate_certificates: Option<bool>,

    /// Obtain and renew the serving certificate through a kubelet-serving CSR (config:
    /// serverTLSBootstrap).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub rotate_server_certificates: Option<bool>,

    /// Comma-separated TLS cipher suite names, e.g. `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256` (config: tlsCipherSuites).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub tls_cipher_suites: Option<Vec<String>>,

    /// Comma-separated unsafe sysctls (names, or prefixes ending in `*`) pods may set besides the
    /// safe ones, e.g. `kernel.msg*,net.core.somaxconn` (config: allowedUnsafeSysctls).
    #[arg(long, value_name = "SYSCTLS", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,

    /// Minimum TLS version: `VersionTLS12` or `VersionTLS13` (config: tlsMinVersion).
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,

    /// Where a generated serving certificate goes (default `<root-dir>/pki`).
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// CA bundle that signs client certificates (config: authentication.x509.clientCAFile).
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<String>,

    /// Let unauthenticated requests in as system:anonymous (config: authentication.anonymous.enabled).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,

    /// Check bearer tokens with `TokenReview`s (config: authentication.webhook.enabled).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub authentication_token_webhook: Option<bool>,

    /// How long token reviews are cached (config: authentication.webhook.cacheTTL).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub authentication_token_webhook_cache_ttl: Option<Duration>,

    /// `AlwaysAllow` or `Webhook` (config: authorization.mode).
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,

    /// How long allowed access reviews are cached (config: authorization.webhook.cacheAuthorizedTTL).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub authorization_webhook_cache_authorized_ttl: Option<Duration>,

    /// How long refused access reviews are cached (config: authorization.webhook.cacheUnauthorizedTTL).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Option<Duration>,

    /// Idle exec, attach and port-forward streams are closed after this long (config: streamingConnectionIdleTimeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub streaming_connection_idle_timeout: Option<Duration>,

    /// kubeconfig of the API server: the node registers there, runs the pods bound to it, reports
    /// their status and asks it to review tokens and access.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Reach the API server with the service account of the pod ringlet runs in
    /// (`KUBERNETES_SERVICE_HOST`/`_PORT` and `/var/run/secrets/kubernetes.io/serviceaccount`)
    /// instead of --kubeconfig.
    #[arg(long, conflicts_with_all = ["kubeconfig", "bootstrap_kubeconfig"])]
    pub in_cluster_config: bool,

    /// kubeconfig used to request a client certificate when --kubeconfig does not exist yet (TLS
    /// bootstrap); the issued certificate goes to --cert-dir and --kubeconfig is written.
    #[arg(long, value_name = "FILE")]
    pub bootstrap_kubeconfig: Option<PathBuf>,

    /// Register the node with the API server, e.g. --register-node=false (config: registerNode).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub register_node: Option<bool>,

    /// Taints to register the node with: `key=value:Effect` or `key:Effect`, comma-separated
    /// (config: registerWithTaints).
    #[arg(long, value_name = "TAINTS")]
    pub register_with_taints: Option<String>,

    /// Labels to register the node with: `key=value`, comma-separated.
    #[arg(long, value_name = "LABELS")]
    pub node_labels: Option<String>,

    /// The node's IP address(es), comma-separated (at most one per family); default: the address of
    /// the interface of the default route.
    #[arg(long, value_name = "IP[,IP]")]
    pub node_ip: Option<String>,

    /// How often the node status is computed and posted when it changed, e.g. 10s (config:
    /// nodeStatusUpdateFrequency).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub node_status_update_frequency: Option<Duration>,

    /// Hard eviction thresholds: `signal<value`, comma-separated, e.g. `memory.available<100Mi`
    /// (config: evictionHard).
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_hard: Option<String>,

    /// Soft eviction thresholds, like --eviction-hard (config: evictionSoft).
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_soft: Option<String>,

    /// Grace periods of the soft thresholds: `signal=duration`, comma-separated (config:
    /// evictionSoftGracePeriod).
    #[arg(long, value_name = "PERIODS")]
    pub eviction_soft_grace_period: Option<String>,

    /// What an eviction must reclaim beyond its threshold: `signal=value`, comma-separated
    /// (config: evictionMinimumReclaim).
    #[arg(long, value_name = "AMOUNTS")]
    pub eviction_minimum_reclaim: Option<String>,

    /// How long a pressure condition stays after its threshold was last met, e.g. 5m (config:
    /// evictionPressureTransitionPeriod).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub eviction_pressure_transition_period: Option<Duration>,

    /// Longest grace period, in seconds, of a pod evicted for a soft threshold (config:
    /// evictionMaxPodGracePeriod).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,

    /// Most processes in a pod's cgroup; -1 (or 0) for no limit (config: podPidsLimit).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,

    /// Enforce CPU limits with a CFS quota, e.g. --cpu-cfs-quota=false (config: cpuCFSQuota).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub cpu_cfs_quota: Option<bool>,

    /// The CFS period of CPU limits, between 1ms and 1s, e.g. 100ms (config: cpuCFSQuotaPeriod).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub cpu_cfs_quota_period: Option<Duration>,

    /// Run containers without a seccomp profile with the runtime's default one (config:
    /// seccompDefault).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub seccomp_default: Option<bool>,

    /// Cgroups to give node allocatable limits, comma-separated: pods, system-reserved,
    /// system-reserved-compressible, kube-reserved, kube-reserved-compressible, or none (config:
    /// enforceNodeAllocatable).
    #[arg(long, value_name = "KEYS")]
    pub enforce_node_allocatable: Option<String>,

    /// The cgroup system-reserved enforcement limits, e.g. /system.slice (config:
    /// systemReservedCgroup).
    #[arg(long, value_name = "CGROUP")]
    pub system_reserved_cgroup: Option<String>,

    /// The cgroup kube-reserved enforcement limits (config: kubeReservedCgroup).
    #[arg(long, value_name = "CGROUP")]
    pub kube_reserved_cgroup: Option<String>,

    /// ringlet extension: the I/O engine: uring (`io_uring`), epoll, or auto (`io_uring` when the kernel
    /// allows it) (config: ioEngine).
    #[arg(long, value_name = "ENGINE")]
    pub io_engine: Option<String>,

    /// Dead instances to keep per container; a negative number keeps all of them.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub maximum_dead_containers_per_container: i64,

    /// Log verbosity level.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub v: u8,
}

impl Flags {
    /// Lays the flags that were given over `raw` (the file's values). Problems with
    /// `--manifest-url-header` are appended to `problems`.
    #[allow(clippy::too_many_lines, reason = "one flat line per flag")]
    pub(super) fn overlay(&self, raw: &mut RawConfig, problems: &mut Vec<String>) {
        fn set<T: Clone>(target: &mut Option<T>, flag: Option<&T>) {
            if let Some(value) = flag {
                *target = Some(value.clone());
            }
        }
        set(&mut raw.static_pod_path, self.pod_manifest_path.as_ref());
        set(&mut raw.static_pod_url, self.manifest_url.as_ref());
        if !self.manifest_url_header.is_empty() {
            let (headers, mut header_problems) = parse_url_headers(&self.manifest_url_header);
            raw.static_pod_url_header = Some(headers);
            problems.append(&mut header_problems);
        }
        set(
            &mut raw.file_check_frequency,
            self.file_check_frequency.as_ref(),
        );
        set(
            &mut raw.http_check_frequency,
            self.http_check_frequency.as_ref(),
        );
        set(&mut raw.sync_frequency, self.sync_frequency.as_ref());
        set(
            &mut raw.container_runtime_endpoint,
            self.container_runtime_endpoint.as_ref(),
        );
        set(
            &mut raw.runtime_request_timeout,
            self.runtime_request_timeout.as_ref(),
        );
        set(&mut raw.cgroup_driver, self.cgroup_driver.as_ref());
        set(&mut raw.cgroup_root, self.cgroup_root.as_ref());
        set(&mut raw.cgroups_per_qos, self.cgroups_per_qos.as_ref());
        set(&mut raw.address, self.address.as_ref());
        set(&mut raw.port, self.port.as_ref());
        set(&mut raw.read_only_port, self.read_only_port.as_ref());
        set(&mut raw.healthz_port, self.healthz_port.as_ref());
        set(
            &mut raw.healthz_bind_address,
            self.healthz_bind_address.as_ref(),
        );
        set(&mut raw.max_pods, self.max_pods.as_ref());
        set(&mut raw.pods_per_core, self.pods_per_core.as_ref());
        set(
            &mut raw.enable_debugging_handlers,
            self.enable_debugging_handlers.as_ref(),
        );
        set(&mut raw.run_once, self.runonce.as_ref());
        set(&mut raw.enable_server, self.enable_server.as_ref());
        set(
            &mut raw.rotate_certificates,
            self.rotate_certificates.as_ref(),
        );
        set(
            &mut raw.server_tls_bootstrap,
            self.rotate_server_certificates.as_ref(),
        );
        set(&mut raw.pod_logs_dir, self.pod_logs_dir.as_ref());
        let logs = &mut raw.container_logs;
        set(&mut logs.max_size, self.container_log_max_size.as_ref());
        set(&mut logs.max_files, self.container_log_max_files.as_ref());
        set(
            &mut logs.max_workers,
            self.container_log_max_workers.as_ref(),
        );
        set(
            &mut logs.monitor_interval,
            self.container_log_monitor_interval.as_ref(),
        );
        set(&mut raw.dns.cluster_dns, self.cluster_dns.as_ref());
        set(&mut raw.dns.cluster_domain, self.cluster_domain.as_ref());
        set(&mut raw.dns.resolv_conf, self.resolv_conf.as_ref());
        let image_gc = &mut raw.image_gc;
        set(
            &mut image_gc.high_threshold_percent,
            self.image_gc_high_threshold.as_ref(),
        );
        set(
            &mut image_gc.low_threshold_percent,
            self.image_gc_low_threshold.as_ref(),
        );
        set(
            &mut image_gc.minimum_age,
            self.minimum_image_ttl_duration.as_ref(),
        );
        let image_pull = &mut raw.image_pull;
        set(
            &mut image_pull.serialize,
            self.serialize_image_pulls.as_ref(),
        );
        set(&mut image_pull.registry_qps, self.registry_qps.as_ref());
        set(&mut image_pull.registry_burst, self.registry_burst.as_ref());
        set(&mut raw.tls_cert_file, self.tls_cert_file.as_ref());
        set(
            &mut raw.tls_private_key_file,
            self.tls_private_key_file.as_ref(),
        );
        set(&mut raw.tls_cipher_suites, self.tls_cipher_suites.as_ref());
        set(&mut raw.tls_min_version, self.tls_min_version.as_ref());
        set(
            &mut raw.allowed_unsafe_sysctls,
            self.allowed_unsafe_sysctls.as_ref(),
        );
        set(&mut raw.client_ca_file, self.client_ca_file.as_ref());
        set(&mut raw.anonymous_auth, self.anonymous_auth.as_ref());
        set(
            &mut raw.webhook_authentication,
            self.authentication_token_webhook.as_ref(),
        );
        set(
            &mut raw.webhook_authentication_cache_ttl,
            self.authentication_token_webhook_cache_ttl.as_ref(),
        );
        set(
            &mut raw.authorization_mode,
            self.authorization_mode.as_ref(),
        );
        set(
            &mut raw.authorization_cache_authorized_ttl,
            self.authorization_webhook_cache_authorized_ttl.as_ref(),
        );
        set(
            &mut raw.authorization_cache_unauthorized_ttl,
            self.authorization_webhook_cache_unauthorized_ttl.as_ref(),
        );
        set(
            &mut raw.streaming_connection_idle_timeout,
            self.streaming_connection_idle_timeout.as_ref(),
        );
        set(&mut raw.node.register_node, self.register_node.as_ref());
        if let Some(text) = &self.register_with_taints {
            match super::node::parse_taint_flag(text) {
                Ok(taints) => raw.node.register_with_taints = Some(taints),
                Err(problem) => problems.push(format!(
                    "registerWithTaints (--register-with-taints): {problem}"
                )),
            }
        }
        set(
            &mut raw.node.node_status_update_frequency,
            self.node_status_update_frequency.as_ref(),
        );
        self.overlay_eviction(raw, problems);
        self.overlay_resources(raw);
        set(&mut raw.pleg_mode, self.pleg_mode.as_ref());
        set(&mut raw.io_engine, self.io_engine.as_ref());
        set(
            &mut raw.pleg_relist_period,
            self.pleg_relist_period.as_ref(),
        );
    }
}

impl Flags {
    /// The flags of what the node enforces on pods and containers over `raw`.
    fn overlay_resources(&self, raw: &mut RawConfig) {
        let resources = &mut raw.resources;
        resources.pod_pids_limit = self.pod_max_pids.or(resources.pod_pids_limit);
        resources.cpu_cfs_quota = self.cpu_cfs_quota.or(resources.cpu_cfs_quota);
        resources.cpu_cfs_quota_period =
            self.cpu_cfs_quota_period.or(resources.cpu_cfs_quota_period);
        resources.seccomp_default = self.seccomp_default.or(resources.seccomp_default);
        if let Some(text) = &self.enforce_node_allocatable {
            resources.enforce_node_allocatable = Some(resources::parse_enforcement_flag(text));
        }
        if let Some(cgroup) = &self.system_reserved_cgroup {
            resources.system_reserved_cgroup = Some(cgroup.clone());
        }
        if let Some(cgroup) = &self.kube_reserved_cgroup {
            resources.kube_reserved_cgroup = Some(cgroup.clone());
        }
    }

    /// The eviction flags (`--eviction-*`) over `raw`.
    fn overlay_eviction(&self, raw: &mut RawConfig, problems: &mut Vec<String>) {
        let mut map = |text: Option<&String>,
                       parse: fn(&str) -> Result<BTreeMap<String, String>, String>,
                       field: &str,
                       flag: &str|
         -> Option<BTreeMap<String, String>> {
            parse(text?)
                .map_err(|problem| problems.push(format!("{field} (--{flag}): {problem}")))
                .ok()
        };
        let (thresholds, signal_map) = (
            eviction::parse_threshold_flag as fn(&str) -> _,
            eviction::parse_signal_map_flag as fn(&str) -> _,
        );
        if let Some(hard) = map(
            self.eviction_hard.as_ref(),
            thresholds,
            "evictionHard",
            "eviction-hard",
        ) {
            raw.node.eviction_hard = Some(hard);
        }
        let eviction = &mut raw.eviction;
        if let Some(soft) = map(
            self.eviction_soft.as_ref(),
            thresholds,
            "evictionSoft",
            "eviction-soft",
        ) {
            eviction.soft = Some(soft);
        }
        if let Some(grace) = map(
            self.eviction_soft_grace_period.as_ref(),
            signal_map,
            "evictionSoftGracePeriod",
            "eviction-soft-grace-period",
        ) {
            eviction.soft_grace_period = Some(grace);
        }
        if let Some(reclaim) = map(
            self.eviction_minimum_reclaim.as_ref(),
            signal_map,
            "evictionMinimumReclaim",
            "eviction-minimum-reclaim",
        ) {
            eviction.minimum_reclaim = Some(reclaim);
        }
        if let Some(period) = self.eviction_pressure_transition_period {
            eviction.pressure_transition_period = Some(period);
        }
        if let Some(seconds) = self.eviction_max_pod_grace_period {
            eviction.max_pod_grace_period = Some(seconds);
        }
    }
}

/// Parses the `--manifest-url-header` occurrences: each is a comma-separated list of `name:value`
/// pairs, split at the first colon; names and values are trimmed; values of a repeated name are
/// kept in order. Returns the pairs that parsed and a problem for each that did not.
fn parse_url_headers(occurrences: &[String]) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for occurrence in occurrences {
        for pair in occurrence.split(',') {
            if pair.trim().is_empty() {
                continue;
            }
            match pair.split_once(':') {
                Some((name, value)) if !name.trim().is_empty() => headers
                    .entry(name.trim().to_owned())
                    .or_default()
                    .push(value.trim().to_owned()),
                _ => problems.push(format!(
                    "staticPodURLHeader (--manifest-url-header): {pair:?} is not a name:value pair"
                )),
            }
        }
    }
    (headers, problems)
}
