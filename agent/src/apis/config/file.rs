//! Reading a `KubeletConfiguration` YAML document into loosely typed values, collecting every problem
//! instead of stopping at the first (the kubelet's config-file decoding in `pkg/kubelet/kubeletconfig`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_yaml_ng::Value;

use super::container_logs::RawContainerLogSettings;
use super::dns::RawDnsSettings;
use super::duration::parse_duration;
use super::eviction::RawEvictionConfig;
use super::image_gc::RawImageGcSettings;
use super::image_pull::RawImagePullSettings;
use super::node::RawNodeSettings;
use super::resources::RawResourceSettings;
use super::shutdown::RawShutdownSettings;

pub(super) const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub(super) const KIND: &str = "KubeletConfiguration";

/// Fields of the real v1beta1 `KubeletConfiguration` that ringlet accepts but does not act on yet.
const NOT_IMPLEMENTED: &[&str] = &[
    "tlsCurvePreferences",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "enableContentionProfiling",
    "oomScoreAdj",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "draManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "hairpinMode",
    "podCIDR",
    "maxOpenFiles",
    "contentType",
    "mergeDefaultEvictionSettings",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "memorySwap",
    "configMapAndSecretChangeDetectionStrategy",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "memoryThrottlingFactor",
    "memoryReservationPolicy",
    "tracing",
    "localStorageCapacityIsolation",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
];

/// Nested sections of the file whose fields are read one by one.
const SECTIONS: &[&str] = &[
    "authentication",
    "authentication.x509",
    "authentication.webhook",
    "authentication.anonymous",
    "authorization",
    "authorization.webhook",
];

/// Values as read from the file or the flags, before defaulting and validation. `None` means "not
/// set here": the next layer or the default decides.
#[derive(Debug, Default, Clone)]
pub(super) struct RawConfig {
    pub static_pod_path: Option<String>,
    pub static_pod_url: Option<String>,
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    pub file_check_frequency: Option<Duration>,
    pub http_check_frequency: Option<Duration>,
    pub sync_frequency: Option<Duration>,
    pub address: Option<String>,
    pub port: Option<i64>,
    pub read_only_port: Option<i64>,
    pub healthz_port: Option<i64>,
    pub healthz_bind_address: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    pub cgroups_per_qos: Option<bool>,
    pub max_pods: Option<i64>,
    pub pods_per_core: Option<i64>,
    pub runtime_request_timeout: Option<Duration>,
    pub container_runtime_endpoint: Option<String>,
    pub enable_debugging_handlers: Option<bool>,
    pub run_once: Option<bool>,
    pub pleg_mode: Option<String>,
    pub pleg_relist_period: Option<Duration>,
    pub enable_server: Option<bool>,
    pub pod_logs_dir: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    pub rotate_certificates: Option<bool>,
    pub server_tls_bootstrap: Option<bool>,
    pub tls_cipher_suites: Option<Vec<String>>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub tls_min_version: Option<String>,
    pub client_ca_file: Option<String>,
    pub anonymous_auth: Option<bool>,
    pub webhook_authentication: Option<bool>,
    pub webhook_authentication_cache_ttl: Option<Duration>,
    pub authorization_mode: Option<String>,
    pub authorization_cache_authorized_ttl: Option<Duration>,
    pub authorization_cache_unauthorized_ttl: Option<Duration>,
    pub streaming_connection_idle_timeout: Option<Duration>,
    pub io_engine: Option<String>,
    pub node: RawNodeSettings,
    pub container_logs: RawContainerLogSettings,
    pub dns: RawDnsSettings,
    pub eviction: RawEvictionConfig,
    pub image_gc: RawImageGcSettings,
    pub shutdown: RawShutdownSettings,
    pub image_pull: RawImagePullSettings,
    pub resources: RawResourceSettings,
}

/// What reading a document produced: the values, the recognised fields ringlet ignores, and every
/// problem found.
#[derive(Debug, Default)]
pub(super) struct FileContents {
    pub raw: RawConfig,
    pub not_implemented: Vec<String>,
    pub problems: Vec<String>,
}

/// Reads a parsed YAML document. Zero values of fields the kubelet defaults when zero (durations,
/// `port`, `maxPods`) count as unset, as with `omitempty` fields in the kubelet's decoding.
#[allow(clippy::too_many_lines, reason = "one flat arm per field")]
pub(super) fn read_document(document: &Value) -> FileContents {
    let mut out = FileContents::default();
    let Value::Mapping(_) = document else {
        out.problems.push(format!(
            "the file must be a YAML mapping with apiVersion: {API_VERSION} and kind: {KIND}, found {}",
            describe(document)
        ));
        return out;
    };

    let mut api_version_seen = false;
    let mut kind_seen = false;
    let mut unknown = Vec::new();
    let fields = flatten_sections(document, &mut out.problems);
    for (key, value) in &fields {
        let key = key.as_str();
        let mut reader = FieldReader {
            key,
            value,
            problems: &mut out.problems,
        };
        let raw = &mut out.raw;
        match key {
            "apiVersion" => {
                api_version_seen = true;
                if let Some(found) = reader.string()
                    && found != API_VERSION
                {
                    reader.problem(format!("must be {API_VERSION}, found {found:?}"));
                }
            }
            "kind" => {
                kind_seen = true;
                if let Some(found) = reader.string()
                    && found != KIND
                {
                    reader.problem(format!("must be {KIND}, found {found:?}"));
                }
            }
            "staticPodPath" => raw.static_pod_path = reader.string(),
            "staticPodURL" => raw.static_pod_url = reader.string(),
            "staticPodURLHeader" => raw.static_pod_url_header = reader.header_map(),
            "fileCheckFrequency" => raw.file_check_frequency = reader.duration(),
            "httpCheckFrequency" => raw.http_check_frequency = reader.duration(),
            "syncFrequency" => raw.sync_frequency = reader.duration(),
            "runtimeRequestTimeout" => raw.runtime_request_timeout = reader.duration(),
            "address" => raw.address = reader.string(),
            "port" => raw.port = reader.int().filter(|port| *port != 0),
            "readOnlyPort" => raw.read_only_port = reader.int(),
            "healthzPort" => raw.healthz_port = reader.int(),
            "healthzBindAddress" => raw.healthz_bind_address = reader.string(),
            "cgroupDriver" => raw.cgroup_driver = reader.string(),
            "cgroupRoot" => raw.cgroup_root = reader.string(),
            "cgroupsPerQOS" => raw.cgroups_per_qos = reader.bool(),
            "maxPods" => raw.max_pods = reader.int().filter(|max| *max != 0),
            "podsPerCore" => raw.pods_per_core = reader.int(),
            "containerRuntimeEndpoint" => raw.container_runtime_endpoint = reader.string(),
            "enableDebuggingHandlers" => raw.enable_debugging_handlers = reader.bool(),
            "runOnce" => raw.run_once = reader.bool(),
            "enableServer" => raw.enable_server = reader.bool(),
            "podLogsDir" => raw.pod_logs_dir = reader.string(),
            "tlsCertFile" => raw.tls_cert_file = reader.string(),
            "tlsPrivateKeyFile" => raw.tls_private_key_file = reader.string(),
            "rotateCertificates" => raw.rotate_certificates = reader.bool(),
            "serverTLSBootstrap" => raw.server_tls_bootstrap = reader.bool(),
            "tlsCipherSuites" => raw.tls_cipher_suites = reader.string_list(),
            "allowedUnsafeSysctls" => raw.allowed_unsafe_sysctls = reader.string_list(),
            "tlsMinVersion" => raw.tls_min_version = reader.string(),
            "streamingConnectionIdleTimeout" => {
                raw.streaming_connection_idle_timeout = reader.duration();
            }
            "authentication.x509.clientCAFile" => raw.client_ca_file = reader.string(),
            "authentication.anonymous.enabled" => raw.anonymous_auth = reader.bool(),
            "authentication.webhook.enabled" => raw.webhook_authentication = reader.bool(),
            "authentication.webhook.cacheTTL" => {
                raw.webhook_authentication_cache_ttl = reader.duration();
            }
            "authorization.mode" => raw.authorization_mode = reader.string(),
            "authorization.webhook.cacheAuthorizedTTL" => {
                raw.authorization_cache_authorized_ttl = reader.duration();
            }
            "authorization.webhook.cacheUnauthorizedTTL" => {
                raw.authorization_cache_unauthorized_ttl = reader.duration();
            }
            // ringlet extensions, not fields of the kubelet's KubeletConfiguration.
            "plegMode" => raw.pleg_mode = reader.string(),
            "plegRelistPeriod" => raw.pleg_relist_period = reader.duration(),
            "ioEngine" => raw.io_engine = reader.string(),
            other if raw.node.read(other, &mut reader) => {}
            other if raw.container_logs.read(other, &mut reader) => {}
            other if raw.dns.read(other, &mut reader) => {}
            other if raw.eviction.read(other, &mut reader) => {}
            other if raw.image_gc.read(other, &mut reader) => {}
            other if raw.shutdown.read(other, &mut reader) => {}
            other if raw.resources.read(other, &mut reader) => {}
            other if raw.image_pull.read(other, &mut reader) => {}
            other if NOT_IMPLEMENTED.contains(&other) => out.not_implemented.push(other.to_owned()),
            other => unknown.push(other.to_owned()),
        }
    }
    if !api_version_seen {
        out.problems
            .push(format!("apiVersion: missing (must be {API_VERSION})"));
    }
    if !kind_seen {
        out.problems.push(format!("kind: missing (must be {KIND})"));
    }
    if !unknown.is_empty() {
        out.problems.push(format!(
            "unknown fields (not KubeletConfiguration {API_VERSION} fields): {}",
            unknown.join(", ")
        ));
    }
    out
}

/// The document's fields with nested sections flattened into dotted keys
/// (`authentication.webhook.cacheTTL`), so every field, nested or not, is matched in one place and
/// named in full in problems.
fn flatten_sections<'a>(
    document: &'a Value,
    problems: &mut Vec<String>,
) -> Vec<(String, &'a Value)> {
    let mut fields: Vec<(String, &Value)> = Vec::new();
    let mut pending: Vec<(String, &Value)> = vec![(String::new(), document)];
    while let Some((prefix, section)) = pending.pop() {
        let Value::Mapping(entries) = section else {
            continue;
        };
        for (key, value) in entries {
            let Some(key) = key.as_str() else {
                problems.push(format!(
                    "field names must be strings, found {}",
                    describe(key)
                ));
                continue;
            };
            let dotted = if prefix.is_empty() {
                key.to_owned()
            } else {
                format!("{prefix}.{key}")
            };
            if SECTIONS.contains(&dotted.as_str()) {
                match value {
                    Value::Null | Value::Mapping(_) => pending.push((dotted, value)),
                    other => problems.push(format!(
                        "{dotted}: expected a mapping, found {}",
                        describe(other)
                    )),
                }
            } else {
                fields.push((dotted, value));
            }
        }
    }
    fields
}

pub(super) struct FieldReader<'a> {
    key: &'a str,
    value: &'a Value,
    problems: &'a mut Vec<String>,
}

impl<'a> FieldReader<'a> {
    pub(super) fn problem(&mut self, message: impl std::fmt::Display) {
        self.problems.push(format!("{}: {message}", self.key));
    }

    pub(super) fn value(&self) -> &'a Value {
        self.value
    }

    fn wrong_type(&mut self, expected: &str) {
        let found = describe(self.value);
        self.problem(format!("expected {expected}, found {found}"));
    }

    /// `null` means "not set", as it does for the kubelet's JSON decoding.
    pub(super) fn string(&mut self) -> Option<String> {
        match self.value {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            _ => {
                self.wrong_type("a string");
                None
            }
        }
    }

    pub(super) fn int(&mut self) -> Option<i64> {
        match self.value {
            Value::Null => None,
            Value::Number(n) => {
                let int = n.as_i64();
                if int.is_none() {
                    self.wrong_type("an integer");
                }
                int
            }
            _ => {
                self.wrong_type("an integer");
                None
            }
        }
    }

    pub(super) fn bool(&mut self) -> Option<bool> {
        match self.value {
            Value::Null => None,
            Value::Bool(b) => Some(*b),
            _ => {
                self.wrong_type("true or false");
                None
            }
        }
    }

    /// Durations are strings in a `KubeletConfiguration` (`metav1.Duration`); a zero duration means
    /// "use the default".
    pub(super) fn duration(&mut self) -> Option<Duration> {
        match self.value {
            Value::Null => None,
            Value::String(s) => match parse_duration(s) {
                Ok(d) if d.is_zero() => None,
                Ok(d) => Some(d),
                Err(e) => {
                    self.problem(e);
                    None
                }
            },
            _ => {
                self.wrong_type("a duration string such as \"20s\"");
                None
            }
        }
    }

    pub(super) fn string_list(&mut self) -> Option<Vec<String>> {
        match self.value {
            Value::Null => None,
            Value::Sequence(items) => {
                let strings: Vec<String> = items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect();
                if strings.len() == items.len() {
                    Some(strings)
                } else {
                    self.wrong_type("a list of strings");
                    None
                }
            }
            _ => {
                self.wrong_type("a list of strings");
                None
            }
        }
    }

    /// A map of strings to strings (`systemReserved`, `evictionHard`).
    pub(super) fn string_map(&mut self) -> Option<BTreeMap<String, String>> {
        let mapping = match self.value {
            Value::Null => return None,
            Value::Mapping(m) => m,
            _ => {
                self.wrong_type("a map of strings");
                return None;
            }
        };
        let mut map = BTreeMap::new();
        for (key, value) in mapping {
            match (key.as_str(), value.as_str()) {
                (Some(key), Some(value)) => {
                    map.insert(key.to_owned(), value.to_owned());
                }
                _ => self.problem(format!(
                    "entries must map strings to strings, found {} -> {}",
                    describe(key),
                    describe(value)
                )),
            }
        }
        Some(map)
    }

    fn header_map(&mut self) -> Option<BTreeMap<String, Vec<String>>> {
        let mapping = match self.value {
            Value::Null => return None,
            Value::Mapping(m) => m,
            _ => {
                self.wrong_type("a map of header name to a list of values");
                return None;
            }
        };
        let mut headers = BTreeMap::new();
        let mut ok = true;
        for (name, values) in mapping {
            let Some(name) = name.as_str() else {
                self.problem(format!(
                    "header names must be strings, found {}",
                    describe(name)
                ));
                ok = false;
                continue;
            };
            let Value::Sequence(values) = values else {
                self.problem(format!(
                    "header {name:?}: expected a list of strings, found {}",
                    describe(values)
                ));
                ok = false;
                continue;
            };
            let mut list = Vec::with_capacity(values.len());
            for value in values {
                if let Some(s) = value.as_str() {
                    list.push(s.to_owned());
                } else {
                    self.problem(format!(
                        "header {name:?}: values must be strings, found {}",
                        describe(value)
                    ));
                    ok = false;
                }
            }
            headers.insert(name.to_owned(), list);
        }
        ok.then_some(headers)
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(tagged) => format!("tagged value {}", tagged.tag),
    }
}
