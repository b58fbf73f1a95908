//! Turns a pod's container spec into a CRI `ContainerConfig` (the kubelet's
//! `kuberuntime_container.go` `generateContainerConfig` and `kuberuntime_container_linux.go`, with
//! `makeEnvironmentVariables` of `kubelet_pods.go`): environment (`envFrom` ConfigMaps and Secrets
//! with their prefix, values with `$(VAR)` expansion, downward-API field and resource references,
//! ConfigMap and Secret keys, service variables), command and args, resources as cgroup settings,
//! security context (with the seccomp profile, `RuntimeDefault` for containers that name none when
//! `seccompDefault` is on), log path and annotations. ConfigMaps, Secrets and Services are looked up
//! before ([`EnvSources`]), so building the config is pure. An ephemeral container runs as the
//! container its spec describes (`ephemeralContainerStartSpec`), in the PID namespace of its target
//! container when it names one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EphemeralContainer, Pod, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ringlet_proto::runtime::v1 as cri;

use super::labels;
use crate::cm::{QosClass, milli_cpu_to_quota, milli_cpu_to_shares, parse_quantity, qos_class};
use crate::container::ContainerId;
use crate::objects::{ObjectError, ObjectLookup};

/// CFS period the quota is expressed in by default (100 ms, the kernel's and the kubelet's
/// `cpuCFSQuotaPeriod` default).
pub const CPU_PERIOD_US: i64 = 100_000;
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// `cpuCFSQuota` and `cpuCFSQuotaPeriod`: whether a CPU limit becomes a CFS quota, and the period
/// (in microseconds) the quota is expressed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfsQuota {
    pub enforce: bool,
    pub period_us: i64,
}

impl Default for CfsQuota {
    fn default() -> Self {
        Self {
            enforce: true,
            period_us: CPU_PERIOD_US,
        }
    }
}

/// `seccompDefault` and where `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeccompSettings {
    /// Containers that name no profile get the runtime's default one instead of none.
    pub default_to_runtime_default: bool,
    pub profile_root: PathBuf,
}

/// The node-wide settings every container's config is built with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerDefaults {
    pub cpu_cfs_quota: CfsQuota,
    pub seccomp: SeccompSettings,
}

/// Why a container's configuration could not be built (`CreateContainerConfigError`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("localhostProfile must be set if seccompProfile type is Localhost.")]
    MissingLocalhostProfile,
    #[error("container {container:?}: env {var:?} uses {source_kind}, which is not supported")]
    UnsupportedEnvSource {
        container: String,
        var: String,
        source_kind: &'static str,
    },
    #[error("container {container:?}: env {var:?} refers to unsupported field {field:?}")]
    UnsupportedFieldPath {
        container: String,
        var: String,
        field: String,
    },
    #[error("container {container:?}: env {var:?}: unsupported container resource {resource:?}")]
    UnsupportedResource {
        container: String,
        var: String,
        resource: String,
    },
    #[error(
        "container {container:?}: env {var:?} refers to container {referenced:?}, which the pod does not have"
    )]
    UnknownContainer {
        container: String,
        var: String,
        referenced: String,
    },
    /// Standalone: nothing to read ConfigMaps or Secrets from.
    #[error("couldn't get {kind} {namespace}/{name}, no kubeClient defined")]
    NoApiServer {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        key: String,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("container {container:?}: invalid {resource} quantity {value:?}")]
    InvalidQuantity {
        container: String,
        resource: &'static str,
        value: String,
    },
}

/// What a container's environment refers to outside the pod, looked up before its config is built
/// (the kubelet's `configMapManager`, `secretManager` and service lister reads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvSources {
    /// The ConfigMaps the container refers to, by name; one that is missing was not looked up
    /// because there is no API server.
    pub config_maps: BTreeMap<String, ObjectLookup>,
    /// The Secrets, likewise.
    pub secrets: BTreeMap<String, ObjectLookup>,
    /// The service variables of the pod's namespace.
    pub service_env: BTreeMap<String, String>,
}

/// Pod facts environment variables can refer to.
#[derive(Clone, Copy, Debug)]
pub struct EnvContext<'a> {
    pub pod: &'a Pod,
    pub pod_ips: &'a [String],
    pub host_ip: Option<&'a str>,
    pub node_name: &'a str,
    /// The node's allocatable resources: what a `resourceFieldRef` to an unset limit reads.
    pub node_allocatable: &'a BTreeMap<String, Quantity>,
    pub sources: &'a EnvSources,
}

/// Keys of an `envFrom` source that cannot be variable names, left out of the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedKeys {
    /// `configMap` or `secret`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Sorted, with the prefix.
    pub keys: Vec<String>,
}

impl SkippedKeys {
    /// The kubelet's `InvalidEnvironmentVariableNames` event message.
    pub fn message(&self) -> String {
        format!(
            "Keys [{}] from the EnvFrom {} {}/{} were skipped since they are considered invalid environment variable names.",
            self.keys.join(", "),
            self.kind,
            self.namespace,
            self.name
        )
    }
}

/// A container's environment: the variables in order, and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    pub vars: Vec<cri::KeyValue>,
    pub skipped: Vec<SkippedKeys>,
}

/// Everything else the config needs that the spec does not say.
#[derive(Clone, Debug)]
pub struct ContainerParams<'a> {
    pub restart_count: u32,
    /// The environment from [`make_env`].
    pub envs: Vec<cri::KeyValue>,
    /// The runtime's id of the image (from `ImageStatus`).
    pub image_id: &'a str,
    pub mounts: Vec<cri::Mount>,
    pub namespaces: cri::NamespaceOption,
    /// `cpuCFSQuota`, `cpuCFSQuotaPeriod` and `seccompDefault`.
    pub defaults: &'a ContainerDefaults,
    /// 0 when unknown; used for the `oom_score_adj` of Burstable pods.
    pub memory_capacity_bytes: u64,
}

/// Nano-units per millicore and per byte, for [`quantity`]'s `unit`.
const NANOS_PER_MILLI: i128 = 1_000_000;
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// The named quantity in `unit`s (rounded up), `None` when absent; an unparseable or negative
/// quantity is an error naming the container and resource.
fn quantity(
    map: Option<&BTreeMap<String, Quantity>>,
    name: &str,
    container: &str,
    resource: &'static str,
    unit: i128,
) -> Result<Option<i64>, ConfigError> {
    let Some(q) = map.and_then(|m| m.get(name)) else {
        return Ok(None);
    };
    parse_quantity(&q.0)
        .ok()
        .filter(|nanos| *nanos >= 0)
        .map(|nanos| Some(i64::try_from((nanos + unit - 1) / unit).unwrap_or(i64::MAX)))
        .ok_or_else(|| ConfigError::InvalidQuantity {
            container: container.to_owned(),
            resource,
            value: q.0.clone(),
        })
}

/// CPU and memory of one container, in millicores and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_request_milli: Option<i64>,
    pub cpu_limit_milli: Option<i64>,
    pub memory_request: Option<i64>,
    pub memory_limit: Option<i64>,
}

impl ContainerResources {
    /// Reads the container's requests and limits; a missing request defaults to the limit, as the
    /// API server's defaulting would (manifests read from files are not defaulted).
    pub fn of(container: &Container) -> Result<Self, ConfigError> {
        let empty = ResourceRequirements::default();
        let res = container.resources.as_ref().unwrap_or(&empty);
        let name = &container.name;
        let cpu_limit = quantity(
            res.limits.as_ref(),
            "cpu",
            name,
            "cpu limit",
            NANOS_PER_MILLI,
        )?;
        let mem_limit = quantity(
            res.limits.as_ref(),
            "memory",
            name,
            "memory limit",
            NANOS_PER_UNIT,
        )?;
        let cpu_request = quantity(
            res.requests.as_ref(),
            "cpu",
            name,
            "cpu request",
            NANOS_PER_MILLI,
        )?;
        let mem_request = quantity(
            res.requests.as_ref(),
            "memory",
            name,
            "memory request",
            NANOS_PER_UNIT,
        )?;
        Ok(Self {
            cpu_request_milli: cpu_request.or(cpu_limit),
            cpu_limit_milli: cpu_limit,
            memory_request: mem_request.or(mem_limit),
            memory_limit: mem_limit,
        })
    }
}

/// The cgroup settings of a container (`generateLinuxContainerResources`); a CPU limit becomes a
/// CFS quota over the configured period unless `cpuCFSQuota` is off.
pub fn linux_resources(
    resources: &ContainerResources,
    qos: QosClass,
    cpu_cfs_quota: CfsQuota,
    memory_capacity_bytes: u64,
) -> cri::LinuxContainerResources {
    // Without a request, the minimum shares.
    let cpu_shares = i64::try_from(milli_cpu_to_shares(
        resources.cpu_request_milli.unwrap_or(0),
    ))
    .unwrap_or(i64::MAX);
    let (cpu_period, cpu_quota) = match resources.cpu_limit_milli {
        Some(milli) if cpu_cfs_quota.enforce => (
            cpu_cfs_quota.period_us,
            milli_cpu_to_quota(milli, cpu_cfs_quota.period_us),
        ),
        _ => (0, 0),
    };
    let oom_score_adj = match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let request = resources.memory_request.unwrap_or(0);
            let capacity = i64::try_from(memory_capacity_bytes).unwrap_or(i64::MAX);
            if capacity > 0 {
                (1000 - request.saturating_mul(1000) / capacity).clamp(2, 999)
            } else {
                999
            }
        }
    };
    cri::LinuxContainerResources {
        cpu_period,
        cpu_quota,
        cpu_shares,
        memory_limit_in_bytes: resources.memory_limit.unwrap_or(0),
        oom_score_adj,
        ..cri::LinuxContainerResources::default()
    }
}

fn field_value(
    path: &str,
    ctx: &EnvContext<'_>,
    container: &str,
    var: &str,
) -> Result<String, ConfigError> {
    let meta = &ctx.pod.metadata;
    let spec = ctx.pod.spec.as_ref();
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| ctx.node_name.to_owned()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.unwrap_or_default().to_owned(),
        _ => {
            if let Some(key) = map_key("metadata.labels") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = map_key("metadata.annotations") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(ConfigError::UnsupportedFieldPath {
                    container: container.to_owned(),
                    var: var.to_owned(),
                    field: path.to_owned(),
                });
            }
        }
    };
    Ok(value)
}

/// Expands `$(NAME)` references through `lookup`; `$$` escapes a `$`, unknown references stay as
/// written (the Kubernetes expansion rules).
pub fn expand<'v>(text: &str, lookup: impl Fn(&str) -> Option<&'v str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(after_escape) = after.strip_prefix('$') {
            out.push('$');
            rest = after_escape;
        } else if let Some(body) = after.strip_prefix('(') {
            if let Some(end) = body.find(')') {
                let name = &body[..end];
                if let Some(value) = lookup(name) {
                    out.push_str(value);
                } else {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
                rest = &body[end + 1..];
            } else {
                out.push_str(&rest[pos..]);
                rest = "";
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Whether `name` can be an environment variable name: printable ASCII without `=` (the API's
/// relaxed rule, `IsRelaxedEnvVarName`, which every name a runtime can pass satisfies).
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// Variables in the order they were first defined; a redefinition replaces the value in place.
#[derive(Default)]
struct OrderedEnv {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        if let Some(&i) = self.index.get(&name) {
            self.vars[i].1 = value;
        } else {
            self.index.insert(name.clone(), self.vars.len());
            self.vars.push((name, value));
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }
}

/// The data of a ConfigMap or Secret an environment refers to; `None` when it is optional and does
/// not exist.
fn env_object<'s>(
    objects: &'s BTreeMap<String, ObjectLookup>,
    kind: &'static str,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<Option<&'s BTreeMap<String, String>>, ConfigError> {
    match objects.get(name) {
        Some(ObjectLookup::Found(data)) => Ok(Some(data)),
        Some(ObjectLookup::Failed(err)) if err.is_not_found() && optional => Ok(None),
        Some(ObjectLookup::Failed(err)) => Err(err.clone().into()),
        None => Err(ConfigError::NoApiServer {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
    }
}

/// A `configMapKeyRef` or `secretKeyRef`.
struct KeyRef<'a> {
    /// `configMap` or `secret`.
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
    key: &'a str,
    optional: bool,
}

impl KeyRef<'_> {
    /// The key's value; `None` when the reference is optional and the object or key is missing.
    fn value(
        &self,
        objects: &BTreeMap<String, ObjectLookup>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(data) = env_object(objects, self.kind, self.namespace, self.name, self.optional)?
        else {
            return Ok(None);
        };
        match data.get(self.key) {
            Some(value) => Ok(Some(value.clone())),
            None if self.optional => Ok(None),
            None => Err(ConfigError::MissingKey {
                key: self.key.to_owned(),
                kind: if self.kind == "configMap" {
                    "ConfigMap"
                } else {
                    "Secret"
                },
                namespace: self.namespace.to_owned(),
                name: self.name.to_owned(),
            }),
        }
    }
}

/// Adds the variables of the container's `envFrom` sources; returns the keys that could not be
/// names.
fn env_from(
    container: &Container,
    namespace: &str,
    sources: &EnvSources,
    env: &mut OrderedEnv,
) -> Result<Vec<SkippedKeys>, ConfigError> {
    let mut skipped = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, objects, name, optional) = if let Some(r) = &from.config_map_ref {
            ("configMap", &sources.config_maps, &r.name, r.optional)
        } else if let Some(r) = &from.secret_ref {
            ("secret", &sources.secrets, &r.name, r.optional)
        } else {
            continue;
        };
        let Some(data) = env_object(objects, kind, namespace, name, optional == Some(true))? else {
            continue;
        };
        let mut invalid = Vec::new();
        for (key, value) in data {
            let var = format!("{prefix}{key}");
            if is_env_var_name(&var) {
                env.set(var, value.clone());
            } else {
                invalid.push(var);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            skipped.push(SkippedKeys {
                kind,
                namespace: namespace.to_owned(),
                name: name.clone(),
                keys: invalid,
            });
        }
    }
    Ok(skipped)
}

/// The container's environment (the kubelet's `makeEnvironmentVariables`): `envFrom` first, then
/// `env` in spec order (a later definition replaces an earlier value in place), then the service
/// variables no one defined. Missing optional references are left out.
pub fn make_env(container: &Container, ctx: &EnvContext<'_>) -> Result<Environment, ConfigError> {
    let namespace = ctx.pod.metadata.namespace.as_deref().unwrap_or_default();
    let sources = ctx.sources;
    let mut env = OrderedEnv::default();
    let skipped = env_from(container, namespace, sources, &mut env)?;
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.iter().flatten()
    {
        let unsupported = |source_kind| ConfigError::UnsupportedEnvSource {
            container: container.name.clone(),
            var: name.clone(),
            source_kind,
        };
        let literal = value.as_deref().unwrap_or_default();
        let resolved = match value_from {
            Some(from) if literal.is_empty() => {
                if let Some(field) = &from.field_ref {
                    Some(field_value(&field.field_path, ctx, &container.name, name)?)
                } else if let Some(selector) = &from.resource_field_ref {
                    Some(super::resource_field::resource_field_value(
                        selector,
                        ctx.pod,
                        &container.name,
                        name,
                        ctx.node_allocatable,
                    )?)
                } else if let Some(r) = &from.config_map_key_ref {
                    let reference = KeyRef {
                        kind: "configMap",
                        namespace,
                        name: &r.name,
                        key: &r.key,
                        optional: r.optional == Some(true),
                    };
                    reference.value(&sources.config_maps)?
                } else if let Some(r) = &from.secret_key_ref {
                    let reference = KeyRef {
                        kind: "secret",
                        namespace,
                        name: &r.name,
                        key: &r.key,
                        optional: r.optional == Some(true),
                    };
                    reference.value(&sources.secrets)?
                } else {
                    return Err(unsupported("an unknown valueFrom source"));
                }
            }
            _ => Some(expand(literal, |var| {
                env.get(var)
                    .or_else(|| sources.service_env.get(var).map(String::as_str))
            })),
        };
        if let Some(resolved) = resolved {
            env.set(name.clone(), resolved);
        }
    }
    for (name, value) in &sources.service_env {
        if env.get(name).is_none() {
            env.set(name.clone(), value.clone());
        }
    }
    Ok(Environment {
        vars: env
            .vars
            .into_iter()
            .map(|(key, value)| cri::KeyValue { key, value })
            .collect(),
        skipped,
    })
}

/// The host file behind a container instance's termination message path:
/// `<pod_dir>/containers/<name>/<restart count>`.
pub fn termination_message_file(pod_dir: &Path, container: &str, restart_count: u32) -> PathBuf {
    pod_dir
        .join("containers")
        .join(container)
        .join(restart_count.to_string())
}

/// The container's log file relative to the sandbox log directory: `<name>/<restart count>.log`.
pub fn log_path(container: &str, restart_count: u32) -> String {
    format!("{container}/{restart_count}.log")
}

/// The container an ephemeral container runs as (the kubelet's `ephemeralContainerStartSpec`): the
/// API gives both the same fields; the target container only chooses the PID namespace
/// ([`join_target_pid_namespace`]).
pub fn ephemeral_container_spec(ephemeral: &EphemeralContainer) -> Container {
    let e = ephemeral.clone();
    Container {
        args: e.args,
        command: e.command,
        env: e.env,
        env_from: e.env_from,
        image: e.image,
        image_pull_policy: e.image_pull_policy,
        lifecycle: e.lifecycle,
        liveness_probe: e.liveness_probe,
        name: e.name,
        ports: e.ports,
        readiness_probe: e.readiness_probe,
        resize_policy: e.resize_policy,
        resources: e.resources,
        restart_policy: e.restart_policy,
        restart_policy_rules: e.restart_policy_rules,
        security_context: e.security_context,
        startup_probe: e.startup_probe,
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        termination_message_path: e.termination_message_path,
        termination_message_policy: e.termination_message_policy,
        tty: e.tty,
        volume_devices: e.volume_devices,
        volume_mounts: e.volume_mounts,
        working_dir: e.working_dir,
    }
}

/// Puts an ephemeral container into the PID namespace of container `target` (CRI `TARGET` with
/// `target_id`, the kubelet's `targetContainerName` handling), so it sees the processes it was
/// started to debug. Only where the container would have a PID namespace of its own: in a pod
/// that shares one (`shareProcessNamespace`) or uses the host's it already sees them.
pub fn join_target_pid_namespace(config: &mut cri::ContainerConfig, target: &ContainerId) {
    let Some(namespaces) = config
        .linux
        .as_mut()
        .and_then(|linux| linux.security_context.as_mut())
        .and_then(|security| security.namespace_options.as_mut())
    else {
        return;
    };
    if namespaces.pid() == cri::NamespaceMode::Container {
        namespaces.set_pid(cri::NamespaceMode::Target);
        namespaces.target_id = target.to_string();
    }
}

/// The pod's extra groups for its sandbox and every container (the kubelet's
/// `determineEffectiveSecurityContext`): `fsGroup` first, so a container running as another user
/// can use the volumes given that group, then `supplementalGroups`.
pub fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    pod_sc
        .and_then(|s| s.fs_group)
        .into_iter()
        .chain(
            pod_sc
                .and_then(|s| s.supplemental_groups.clone())
                .into_iter()
                .flatten(),
        )
        .collect()
}

/// Who an image runs as when nothing overrides it (CRI `ImageStatus`: a numeric `uid`, else a
/// user name); no user at all is root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageUser {
    Uid(i64),
    Name(String),
}

impl ImageUser {
    /// The image's user from its `ImageStatus`: the uid when set, else the name, else root.
    pub fn of(image: &cri::Image) -> Self {
        match (&image.uid, image.username.as_str()) {
            (Some(uid), _) => Self::Uid(uid.value),
            (None, "") => Self::Uid(0),
            (None, name) => Self::Name(name.to_owned()),
        }
    }
}

/// Whether the container must not run as root: its `runAsNonRoot`, else the pod's.
pub fn run_as_non_root(pod: &Pod, container: &Container) -> bool {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| pod_sc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false)
}

/// The kubelet's `verifyRunAsNonRoot`: with `runAsNonRoot` (the container's, else the pod's), the
/// container must not run as uid 0, by its `runAsUser` (the container's, else the pod's) or, when
/// none is set, by the image's user; a user name cannot be checked and is refused. The error is the
/// kubelet's message for `CreateContainerConfigError`.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
) -> Result<(), String> {
    if !run_as_non_root(pod, container) {
        return Ok(());
    }
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let pod_name = format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    );
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    match (run_as_user, image_user) {
        (Some(0), _) => Err(format!(
            "container's runAsUser breaks non-root policy (pod: \"{pod_name}\", container: {})",
            container.name
        )),
        (None, ImageUser::Uid(0)) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: \"{pod_name}\", container: {})",
            container.name
        )),
        (Some(_), _) | (None, ImageUser::Uid(_)) => Ok(()),
        (None, ImageUser::Name(name)) => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root (pod: \"{pod_name}\", container: {})",
            container.name
        )),
    }
}

/// The container's seccomp profile (the kubelet's `getSeccompProfile`): the container's
/// `seccompProfile`, else the pod's, else `RuntimeDefault` with `seccompDefault` and `Unconfined`
/// without it. A `Localhost` profile is a file below the profile root.
fn seccomp_profile(
    container: &Container,
    pod: &Pod,
    settings: &SeccompSettings,
) -> Result<cri::SecurityProfile, ConfigError> {
    use cri::security_profile::ProfileType;
    let from_container = container
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref());
    let from_pod = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.seccomp_profile.as_ref());
    let profile = |profile_type: ProfileType, localhost_ref: String| cri::SecurityProfile {
        profile_type: profile_type.into(),
        localhost_ref,
    };
    let Some(chosen) = from_container.or(from_pod) else {
        return Ok(if settings.default_to_runtime_default {
            profile(ProfileType::RuntimeDefault, String::new())
        } else {
            profile(ProfileType::Unconfined, String::new())
        });
    };
    Ok(match chosen.type_.as_str() {
        "RuntimeDefault" => profile(ProfileType::RuntimeDefault, String::new()),
        "Localhost" => {
            let name = chosen
                .localhost_profile
                .as_deref()
                .filter(|name| !name.is_empty())
                .ok_or(ConfigError::MissingLocalhostProfile)?;
            let path = settings.profile_root.join(name);
            profile(ProfileType::Localhost, path.to_string_lossy().into_owned())
        }
        _ => profile(ProfileType::Unconfined, String::new()),
    })
}

fn security_context(
    container: &Container,
    pod: &Pod,
    namespaces: cri::NamespaceOption,
    seccomp: cri::SecurityProfile,
) -> cri::LinuxContainerSecurityContext {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_sc.and_then(|s| s.run_as_group));
    let capabilities = sc
        .and_then(|s| s.capabilities.as_ref())
        .map(|c| cri::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        });
    cri::LinuxContainerSecurityContext {
        capabilities,
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        namespace_options: Some(namespaces),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: Some(seccomp),
        ..cri::LinuxContainerSecurityContext::default()
    }
}

/// The CRI config for one container instance.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
    params: ContainerParams<'_>,
) -> Result<cri::ContainerConfig, ConfigError> {
    let (command, args) = {
        let vars: HashMap<&str, &str> = params
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
            list.iter()
                .flatten()
                .map(|s| expand(s, |name| vars.get(name).copied()))
                .collect()
        };
        (expand_all(&container.command), expand_all(&container.args))
    };
    let resources = ContainerResources::of(container)?;
    let qos = qos_class(pod);
    let seccomp = seccomp_profile(container, pod, &params.defaults.seccomp)?;
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: params.restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: params.image_id.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..cri::ImageSpec::default()
        }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: params.envs,
        mounts: params.mounts,
        labels: labels::container_labels(pod, &container.name, ctx.node_name),
        annotations: labels::container_annotations(pod, container, params.restart_count),
        log_path: log_path(&container.name, params.restart_count),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_resources(
                &resources,
                qos,
                params.defaults.cpu_cfs_quota,
                params.memory_capacity_bytes,
            )),
            security_context: Some(security_context(container, pod, params.namespaces, seccomp)),
        }),
        ..cri::ContainerConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod_with(containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn with_resources(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
        let map = |items: &[(&str, &str)]| {
            Some(
                items
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            )
        };
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: map(limits),
                requests: map(requests),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: path.into(),
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    fn vars(env: &Environment) -> Vec<(String, String)> {
        env.vars
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn data(list: &[(&str, &str)]) -> ObjectLookup {
        ObjectLookup::Found(pairs(list).into_iter().collect())
    }

    fn plain(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    #[test]
    fn resources_round_up_to_millicores_and_bytes_and_reject_bad_quantities() {
        let c = with_resources(
            &[("cpu", "1.0005"), ("memory", "1.5Gi")],
            &[("cpu", "250m")],
        );
        let r = ContainerResources::of(&c).unwrap();
        assert_eq!(r.cpu_limit_milli, Some(1001));
        assert_eq!(r.cpu_request_milli, Some(250));
        assert_eq!(r.memory_limit, Some(1_610_612_736));
        assert_eq!(
            r.memory_request,
            Some(1_610_612_736),
            "a missing request is the limit"
        );
        for bad in ["lots", "-1"] {
            let c = with_resources(&[("memory", bad)], &[]);
            assert!(
                matches!(
                    ContainerResources::of(&c),
                    Err(ConfigError::InvalidQuantity { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn cpu_and_memory_limits_become_cgroup_settings() {
        let c = with_resources(&[("cpu", "500m"), ("memory", "64Mi")], &[("cpu", "250m")]);
        let r = ContainerResources::of(&c).unwrap();
        let linux = linux_resources(&r, QosClass::Burstable, CfsQuota::default(), 0);
        assert_eq!(linux.cpu_period, 100_000);
        assert_eq!(linux.cpu_quota, 50_000);
        assert_eq!(linux.cpu_shares, 256);
        assert_eq!(linux.memory_limit_in_bytes, 64 * 1024 * 1024);
        assert_eq!(linux.oom_score_adj, 999);
    }

    const NO_QUOTA: CfsQuota = CfsQuota {
        enforce: false,
        period_us: CPU_PERIOD_US,
    };

    #[test]
    fn a_custom_cfs_period_scales_the_quota_and_no_quota_leaves_both_unset() {
        let r = ContainerResources::of(&with_resources(&[("cpu", "1500m")], &[])).unwrap();
        let custom = CfsQuota {
            enforce: true,
            period_us: 50_000,
        };
        let linux = linux_resources(&r, QosClass::Guaranteed, custom, 0);
        assert_eq!((linux.cpu_period, linux.cpu_quota), (50_000, 75_000));
        let off = linux_resources(&r, QosClass::Guaranteed, NO_QUOTA, 0);
        assert_eq!((off.cpu_period, off.cpu_quota), (0, 0));
        assert_eq!(off.cpu_shares, 1536, "shares do not depend on the quota");
    }

    #[test]
    fn tiny_and_missing_cpu_requests_get_minimum_shares() {
        let none = linux_resources(
            &ContainerResources::default(),
            QosClass::BestEffort,
            CfsQuota::default(),
            0,
        );
        assert_eq!(
            (none.cpu_shares, none.cpu_quota, none.oom_score_adj),
            (2, 0, 1000)
        );
        let tiny = ContainerResources::of(&with_resources(&[], &[("cpu", "1m")])).unwrap();
        assert_eq!(
            linux_resources(&tiny, QosClass::Burstable, CfsQuota::default(), 0).cpu_shares,
            2
        );
        let small_limit = ContainerResources::of(&with_resources(&[("cpu", "5m")], &[])).unwrap();
        assert_eq!(
            linux_resources(&small_limit, QosClass::Guaranteed, CfsQuota::default(), 0).cpu_quota,
            1000
        );
        assert_eq!(
            linux_resources(&small_limit, QosClass::Guaranteed, NO_QUOTA, 0).cpu_quota,
            0,
            "quota disabled by --cpu-cfs-quota=false"
        );
    }

    #[test]
    fn env_resolves_field_refs_and_expands_references() {
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                field("NAME", "metadata.name"),
                field("NS", "metadata.namespace"),
                field("UID", "metadata.uid"),
                field("NODE", "spec.nodeName"),
                field("IP", "status.podIP"),
                field("HOST", "status.hostIP"),
                plain("GREETING", "hi $(NAME) $$(NAME) $(MISSING)"),
            ]),
            ..Container::default()
        };
        let pod = pod_with(vec![c.clone()]);
        let ips = vec!["10.88.0.5".to_owned()];
        let ctx = EnvContext {
            pod: &pod,
            pod_ips: &ips,
            host_ip: Some("192.168.1.2"),
            node_name: "node1",
            node_allocatable: &BTreeMap::new(),
            sources: &EnvSources::default(),
        };
        let env = vars(&make_env(&c, &ctx).unwrap());
        let expected: Vec<(String, String)> = [
            ("NAME", "web"),
            ("NS", "prod"),
            ("UID", "u-1"),
            ("NODE", "node1"),
            ("IP", "10.88.0.5"),
            ("HOST", "192.168.1.2"),
            ("GREETING", "hi web $(NAME) $(MISSING)"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn unsupported_env_sources_are_named() {
        let c = Container {
            name: "c".into(),
            env: Some(vec![field("X", "status.phase")]),
            ..Container::default()
        };
        let pod = pod_with(vec![c.clone()]);
        let ctx = EnvContext {
            pod: &pod,
            pod_ips: &[],
            host_ip: None,
            node_name: "n",
            node_allocatable: &BTreeMap::new(),
            sources: &EnvSources::default(),
        };
        assert_eq!(
            make_env(&c, &ctx).unwrap_err().to_string(),
            "container \"c\": env \"X\" refers to unsupported field \"status.phase\""
        );
    }

    #[test]
    fn config_carries_command_log_path_and_identity() {
        let c = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            command: Some(vec!["sh".into(), "-c".into()]),
            args: Some(vec!["echo $(A)".into()]),
            env: Some(vec![plain("A", "x")]),
            working_dir: Some("/work".into()),
            ..Container::default()
        };
        let pod = pod_with(vec![c.clone()]);
        let ctx = EnvContext {
            pod: &pod,
            pod_ips: &[],
            host_ip: None,
            node_name: "n",
            node_allocatable: &BTreeMap::new(),
            sources: &EnvSources::default(),
        };
        let envs = make_env(&c, &ctx).unwrap().vars;
        let config = container_config(
            &pod,
            &c,
            &ctx,
            ContainerParams {
                restart_count: 2,
                envs,
                image_id: "sha256:abc",
                mounts: Vec::new(),
                namespaces: cri::NamespaceOption::default(),
                defaults: &ContainerDefaults::default(),
                memory_capacity_bytes: 0,
            },
        )
        .unwrap();
        assert_eq!(config.command, ["sh", "-c"]);
        assert_eq!(config.args, ["echo x"]);
        assert_eq!(config.log_path, "app/2.log");
        assert_eq!(config.working_dir, "/work");
        assert_eq!(config.metadata.unwrap().attempt, 2);
        assert_eq!(config.image.unwrap().image, "sha256:abc");
        assert_eq!(config.labels[labels::POD_UID], "u-1");
        assert_eq!(labels::restart_count(&config.annotations), 2);
    }

    fn non_root_pod(
        pod_sc: &serde_json::Value,
        container_sc: &serde_json::Value,
    ) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p", "namespace": "ns", "uid": "u1" },
            "spec": {
                "securityContext": pod_sc,
                "containers": [{ "name": "c", "securityContext": container_sc }],
            },
        }))
        .unwrap();
        let container = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, container)
    }

    #[test]
    fn run_as_non_root_refuses_root_by_spec_or_by_image() {
        let root = ImageUser::Uid(0);
        let (pod, c) = non_root_pod(&serde_json::json!({}), &serde_json::json!({}));
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &root),
            Ok(()),
            "not asked for"
        );
        let (pod, c) = non_root_pod(
            &serde_json::json!({ "runAsNonRoot": true }),
            &serde_json::json!({}),
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &root),
            Err("container has runAsNonRoot and image will run as root (pod: \"p_ns(u1)\", container: c)".to_owned())
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &ImageUser::Uid(1234)),
            Ok(())
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &ImageUser::Name("app".to_owned())),
            Err("container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root (pod: \"p_ns(u1)\", container: c)".to_owned())
        );
        let (pod, c) = non_root_pod(
            &serde_json::json!({ "runAsNonRoot": true, "runAsUser": 1000 }),
            &serde_json::json!({ "runAsUser": 0 }),
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &ImageUser::Uid(1234)),
            Err(
                "container's runAsUser breaks non-root policy (pod: \"p_ns(u1)\", container: c)"
                    .to_owned()
            )
        );
        let (pod, c) = non_root_pod(
            &serde_json::json!({ "runAsNonRoot": true }),
            &serde_json::json!({ "runAsUser": 1000 }),
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &root),
            Ok(()),
            "runAsUser wins over the image"
        );
        let (pod, c) = non_root_pod(
            &serde_json::json!({ "runAsNonRoot": true }),
            &serde_json::json!({ "runAsNonRoot": false }),
        );
        assert_eq!(
            verify_run_as_non_root(&pod, &c, &root),
            Ok(()),
            "the container's setting wins"
        );
    }

    #[test]
    fn an_image_without_a_user_runs_as_root() {
        let image = |uid: Option<i64>, name: &str| cri::Image {
            uid: uid.map(|value| cri::Int64Value { value }),
            username: name.to_owned(),
            ..cri::Image::default()
        };
        assert_eq!(ImageUser::of(&image(None, "")), ImageUser::Uid(0));
        assert_eq!(ImageUser::of(&image(Some(1234), "")), ImageUser::Uid(1234));
        assert_eq!(
            ImageUser::of(&image(None, "app")),
            ImageUser::Name("app".to_owned())
        );
    }

    #[test]
    fn the_fs_group_joins_the_containers_groups_first() {
        let c = Container {
            name: "app".into(),
            ..Container::default()
        };
        let mut pod = pod_with(vec![c.clone()]);
        let groups = |pod: &Pod| {
            security_context(
                &c,
                pod,
                cri::NamespaceOption::default(),
                cri::SecurityProfile::default(),
            )
            .supplemental_groups
        };
        assert!(groups(&pod).is_empty());
        pod.spec.as_mut().unwrap().security_context = Some(serde_json::from_value(
            serde_json::json!({"fsGroup": 2000, "runAsUser": 1001, "supplementalGroups": [5, 6]}),
        )
        .unwrap());
        assert_eq!(groups(&pod), [2000, 5, 6]);
        pod.spec.as_mut().unwrap().security_context =
            Some(serde_json::from_value(serde_json::json!({"supplementalGroups": [7]})).unwrap());
        assert_eq!(groups(&pod), [7]);
    }

    fn env_container(json: serde_json::Value) -> Container {
        serde_json::from_value(json).unwrap()
    }

    fn sources() -> EnvSources {
        EnvSources {
            config_maps: BTreeMap::from([
                (
                    "settings".to_owned(),
                    data(&[("LEVEL", "debug"), ("MODE", "fast"), ("1st", "one")]),
                ),
                (
                    "absent".to_owned(),
                    ObjectLookup::Failed(ObjectError::NotFound {
                        resource: "configmap",
                        name: "absent".to_owned(),
                    }),
                ),
            ]),
            secrets: BTreeMap::from([(
                "db".to_owned(),
                data(&[("password", "s3cr3t"), ("user", "admin")]),
            )]),
            service_env: pairs(&[
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("LEVEL", "from-service"),
                ("WEB_SERVICE_HOST", "10.96.0.9"),
            ])
            .into_iter()
            .collect(),
        }
    }

    fn env_of(container: &Container, sources: &EnvSources) -> Result<Environment, ConfigError> {
        let pod = pod_with(vec![container.clone()]);
        let ctx = EnvContext {
            pod: &pod,
            pod_ips: &[],
            host_ip: None,
            node_name: "n",
            node_allocatable: &BTreeMap::new(),
            sources,
        };
        make_env(container, &ctx)
    }

    #[test]
    fn env_from_comes_first_env_overrides_it_and_services_come_last() {
        let c = env_container(serde_json::json!({
            "name": "c",
            "envFrom": [
                {"configMapRef": {"name": "settings"}},
                {"secretRef": {"name": "db"}, "prefix": "DB_"},
                {"configMapRef": {"name": "absent", "optional": true}},
            ],
            "env": [
                {"name": "MODE", "value": "slow"},
                {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "db", "key": "user"}}},
                {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LEVEL"}}},
                {"name": "URL", "value": "http://$(WEB_SERVICE_HOST)/$(DB_user)"},
                {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                {"name": "NOKEY", "valueFrom": {"secretKeyRef": {"name": "db", "key": "nope", "optional": true}}},
            ],
        }));
        let env = env_of(&c, &sources()).unwrap();
        assert_eq!(
            vars(&env),
            pairs(&[
                ("1st", "one"),
                ("LEVEL", "debug"),
                ("MODE", "slow"),
                ("DB_password", "s3cr3t"),
                ("DB_user", "admin"),
                ("USER", "admin"),
                ("LVL", "debug"),
                ("URL", "http://10.96.0.9/admin"),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("WEB_SERVICE_HOST", "10.96.0.9"),
            ])
        );
        assert!(env.skipped.is_empty());
    }

    #[test]
    fn missing_objects_and_keys_fail_with_the_kubelets_messages() {
        let secret_key = env_container(serde_json::json!({
            "name": "c",
            "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "nokey"}}}],
        }));
        assert_eq!(
            env_of(&secret_key, &sources()).unwrap_err().to_string(),
            "couldn't find key nokey in Secret prod/db"
        );
        let config_map_key = env_container(serde_json::json!({
            "name": "c",
            "env": [{"name": "P", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}],
        }));
        assert_eq!(
            env_of(&config_map_key, &sources()).unwrap_err().to_string(),
            "couldn't find key k in ConfigMap prod/settings"
        );
        let missing = env_container(serde_json::json!({
            "name": "c",
            "envFrom": [{"configMapRef": {"name": "absent"}}],
        }));
        assert_eq!(
            env_of(&missing, &sources()).unwrap_err().to_string(),
            "configmap \"absent\" not found"
        );
        let standalone = env_container(serde_json::json!({
            "name": "c",
            "envFrom": [{"secretRef": {"name": "db"}}],
        }));
        assert_eq!(
            env_of(&standalone, &EnvSources::default())
                .unwrap_err()
                .to_string(),
            "couldn't get secret prod/db, no kubeClient defined"
        );
    }

    #[test]
    fn keys_that_cannot_be_variable_names_are_skipped_and_reported() {
        let mut sources = sources();
        sources.config_maps.insert(
            "odd".to_owned(),
            data(&[("good", "1"), ("bad=key", "2"), ("tab\tkey", "3")]),
        );
        let c = env_container(serde_json::json!({
            "name": "c",
            "envFrom": [{"configMapRef": {"name": "odd"}, "prefix": "P_"}],
        }));
        let env = env_of(
            &c,
            &EnvSources {
                service_env: BTreeMap::new(),
                ..sources
            },
        )
        .unwrap();
        assert_eq!(vars(&env), pairs(&[("P_good", "1")]));
        assert_eq!(
            env.skipped[0].message(),
            "Keys [P_bad=key, P_tab\tkey] from the EnvFrom configMap prod/odd were skipped since they are considered invalid environment variable names."
        );
    }

    #[test]
    fn an_ephemeral_container_runs_as_the_container_its_spec_describes() {
        let ephemeral: EphemeralContainer = serde_json::from_value(serde_json::json!({
            "name": "debugger",
            "image": "busybox",
            "command": ["sh", "-c", "sleep 1"],
            "stdin": true,
            "tty": true,
            "targetContainerName": "app",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "env": [{"name": "A", "value": "1"}],
        }))
        .unwrap();
        let mut expected = serde_json::to_value(&ephemeral).unwrap();
        expected
            .as_object_mut()
            .unwrap()
            .remove("targetContainerName");
        assert_eq!(
            serde_json::to_value(ephemeral_container_spec(&ephemeral)).unwrap(),
            expected
        );
    }

    fn config_in(pod: &Pod, namespaces: cri::NamespaceOption) -> cri::ContainerConfig {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let ctx = EnvContext {
            pod,
            pod_ips: &[],
            host_ip: None,
            node_name: "n",
            node_allocatable: &BTreeMap::new(),
            sources: &EnvSources::default(),
        };
        let params = ContainerParams {
            restart_count: 0,
            envs: Vec::new(),
            image_id: "sha256:abc",
            mounts: Vec::new(),
            namespaces,
            defaults: &ContainerDefaults::default(),
            memory_capacity_bytes: 0,
        };
        container_config(pod, c, &ctx, params).unwrap()
    }

    fn namespaces_of(config: &cri::ContainerConfig) -> cri::NamespaceOption {
        config
            .linux
            .clone()
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap()
    }

    #[test]
    fn an_ephemeral_container_joins_its_targets_pid_namespace_unless_the_pod_shares_one() {
        let pod = pod_with(vec![Container {
            name: "debugger".into(),
            ..Container::default()
        }]);
        let target = ContainerId::from("c0ffee");
        let own = cri::NamespaceOption {
            pid: cri::NamespaceMode::Container.into(),
            ..cri::NamespaceOption::default()
        };
        let mut config = config_in(&pod, own);
        join_target_pid_namespace(&mut config, &target);
        let joined = namespaces_of(&config);
        assert_eq!(joined.pid(), cri::NamespaceMode::Target);
        assert_eq!(joined.target_id, "c0ffee");
        for shared in [cri::NamespaceMode::Pod, cri::NamespaceMode::Node] {
            let options = cri::NamespaceOption {
                pid: shared.into(),
                ..cri::NamespaceOption::default()
            };
            let mut config = config_in(&pod, options.clone());
            join_target_pid_namespace(&mut config, &target);
            assert_eq!(namespaces_of(&config), options, "{shared:?}");
        }
    }

    fn seccomp_of(
        pod: &Pod,
        settings: &SeccompSettings,
    ) -> Result<cri::SecurityProfile, ConfigError> {
        seccomp_profile(&pod.spec.as_ref().unwrap().containers[0], pod, settings)
    }

    fn with_seccomp(
        pod_profile: Option<serde_json::Value>,
        container_profile: Option<serde_json::Value>,
    ) -> Pod {
        let mut container = Container {
            name: "c".to_owned(),
            ..Container::default()
        };
        if let Some(profile) = container_profile {
            container.security_context = Some(
                serde_json::from_value(serde_json::json!({"seccompProfile": profile})).unwrap(),
            );
        }
        let mut pod = pod_with(vec![container]);
        if let Some(profile) = pod_profile {
            pod.spec.as_mut().unwrap().security_context = Some(
                serde_json::from_value(serde_json::json!({"seccompProfile": profile})).unwrap(),
            );
        }
        pod
    }

    #[test]
    fn seccomp_default_turns_a_missing_profile_into_runtime_default() {
        use cri::security_profile::ProfileType;
        let unset = with_seccomp(None, None);
        let off = SeccompSettings::default();
        let on = SeccompSettings {
            default_to_runtime_default: true,
            profile_root: PathBuf::from("/var/lib/kubelet/seccomp"),
        };
        assert_eq!(
            seccomp_of(&unset, &off).unwrap().profile_type,
            i32::from(ProfileType::Unconfined)
        );
        assert_eq!(
            seccomp_of(&unset, &on).unwrap().profile_type,
            i32::from(ProfileType::RuntimeDefault)
        );
        // An explicit Unconfined stays unconfined under seccompDefault.
        let unconfined = with_seccomp(Some(serde_json::json!({"type": "Unconfined"})), None);
        assert_eq!(
            seccomp_of(&unconfined, &on).unwrap().profile_type,
            i32::from(ProfileType::Unconfined)
        );
        // The container's profile wins over the pod's.
        let both = with_seccomp(
            Some(serde_json::json!({"type": "Unconfined"})),
            Some(serde_json::json!({"type": "RuntimeDefault"})),
        );
        assert_eq!(
            seccomp_of(&both, &off).unwrap().profile_type,
            i32::from(ProfileType::RuntimeDefault)
        );
        // The profile reaches the CRI config.
        let config = container_config(
            &unset,
            &unset.spec.as_ref().unwrap().containers[0],
            &EnvContext {
                pod: &unset,
                pod_ips: &[],
                host_ip: None,
                node_name: "n",
                node_allocatable: &BTreeMap::new(),
                sources: &EnvSources::default(),
            },
            ContainerParams {
                restart_count: 0,
                envs: Vec::new(),
                image_id: "sha256:abc",
                mounts: Vec::new(),
                namespaces: cri::NamespaceOption::default(),
                defaults: &ContainerDefaults {
                    cpu_cfs_quota: CfsQuota::default(),
                    seccomp: on,
                },
                memory_capacity_bytes: 0,
            },
        )
        .unwrap();
        let seccomp = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .seccomp
            .unwrap();
        assert_eq!(seccomp.profile_type, i32::from(ProfileType::RuntimeDefault));
    }

    #[test]
    fn localhost_profiles_live_below_the_profile_root() {
        use cri::security_profile::ProfileType;
        let settings = SeccompSettings {
            default_to_runtime_default: false,
            profile_root: PathBuf::from("/var/lib/kubelet/seccomp"),
        };
        let localhost = with_seccomp(
            Some(
                serde_json::json!({"type": "Localhost", "localhostProfile": "profiles/audit.json"}),
            ),
            None,
        );
        assert_eq!(
            seccomp_of(&localhost, &settings).unwrap(),
            cri::SecurityProfile {
                profile_type: ProfileType::Localhost.into(),
                localhost_ref: "/var/lib/kubelet/seccomp/profiles/audit.json".to_owned(),
            }
        );
        let nameless = with_seccomp(None, Some(serde_json::json!({"type": "Localhost"})));
        assert_eq!(
            seccomp_of(&nameless, &settings),
            Err(ConfigError::MissingLocalhostProfile)
        );
    }
}
