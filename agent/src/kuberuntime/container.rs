//! Turns a pod's container spec into a CRI `ContainerConfig` (the kubelet's
//! `kuberuntime_container.go` `generateContainerConfig` and `kuberuntime_container_linux.go`):
//! environment (values, downward-API field references, `$(VAR)` expansion), command and args,
//! resources as cgroup settings, security context, log path and annotations.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ringlet_proto::runtime::v1 as cri;

use super::labels;
use crate::cm::{QosClass, parse_quantity, qos_class};

/// CFS period the quota is expressed in (100 ms, the kernel's and the kubelet's default).
pub const CPU_PERIOD_US: i64 = 100_000;
const MIN_CPU_SHARES: i64 = 2;
const MAX_CPU_SHARES: i64 = 262_144;
const MIN_QUOTA_US: i64 = 1_000;
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// Why a container's configuration could not be built (`CreateContainerConfigError`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
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
    #[error("container {container:?}: envFrom is not supported")]
    EnvFromUnsupported { container: String },
    #[error("container {container:?}: invalid {resource} quantity {value:?}")]
    InvalidQuantity {
        container: String,
        resource: &'static str,
        value: String,
    },
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
}

/// Everything else the config needs that the spec does not say.
#[derive(Clone, Debug)]
pub struct ContainerParams<'a> {
    pub restart_count: u32,
    /// The runtime's id of the image (from `ImageStatus`).
    pub image_id: &'a str,
    pub mounts: Vec<cri::Mount>,
    pub namespaces: cri::NamespaceOption,
    pub cpu_cfs_quota: bool,
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

/// The cgroup settings of a container (`generateLinuxContainerResources`).
pub fn linux_resources(
    resources: &ContainerResources,
    qos: QosClass,
    cpu_cfs_quota: bool,
    memory_capacity_bytes: u64,
) -> cri::LinuxContainerResources {
    let cpu_shares = resources
        .cpu_request_milli
        .map_or(MIN_CPU_SHARES, |m| m.saturating_mul(1024) / 1000)
        .clamp(MIN_CPU_SHARES, MAX_CPU_SHARES);
    let (cpu_period, cpu_quota) = match resources.cpu_limit_milli {
        Some(milli) if cpu_cfs_quota => (
            CPU_PERIOD_US,
            (milli.saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_QUOTA_US),
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

/// Expands `$(NAME)` references to earlier variables; `$$` escapes a `$`, unknown references stay
/// as written (the Kubernetes expansion rules).
pub fn expand<S: std::hash::BuildHasher>(text: &str, vars: &HashMap<String, String, S>) -> String {
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
                if let Some(value) = vars.get(name) {
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

/// The container's environment, in spec order, with references resolved and expanded.
pub fn make_env(
    container: &Container,
    ctx: &EnvContext<'_>,
) -> Result<Vec<cri::KeyValue>, ConfigError> {
    if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(ConfigError::EnvFromUnsupported {
            container: container.name.clone(),
        });
    }
    let mut vars: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
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
        let resolved = match value_from {
            None => expand(value.as_deref().unwrap_or_default(), &vars),
            Some(from) => {
                if let Some(field) = &from.field_ref {
                    field_value(&field.field_path, ctx, &container.name, name)?
                } else if from.secret_key_ref.is_some() {
                    return Err(unsupported("secretKeyRef"));
                } else if from.config_map_key_ref.is_some() {
                    return Err(unsupported("configMapKeyRef"));
                } else if let Some(selector) = &from.resource_field_ref {
                    super::resource_field::resource_field_value(
                        selector,
                        ctx.pod,
                        &container.name,
                        name,
                        ctx.node_allocatable,
                    )?
                } else {
                    return Err(unsupported("an unknown valueFrom source"));
                }
            }
        };
        vars.insert(name.clone(), resolved.clone());
        out.push(cri::KeyValue {
            key: name.clone(),
            value: resolved,
        });
    }
    Ok(out)
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

fn security_context(
    container: &Container,
    pod: &Pod,
    namespaces: cri::NamespaceOption,
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
        supplemental_groups: pod_sc
            .and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default(),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
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
    let envs = make_env(container, ctx)?;
    let vars: HashMap<String, String> = envs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter().flatten().map(|s| expand(s, &vars)).collect()
    };
    let resources = ContainerResources::of(container)?;
    let qos = qos_class(pod);
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
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs,
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
                params.cpu_cfs_quota,
                params.memory_capacity_bytes,
            )),
            security_context: Some(security_context(container, pod, params.namespaces)),
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
        let linux = linux_resources(&r, QosClass::Burstable, true, 0);
        assert_eq!(linux.cpu_period, 100_000);
        assert_eq!(linux.cpu_quota, 50_000);
        assert_eq!(linux.cpu_shares, 256);
        assert_eq!(linux.memory_limit_in_bytes, 64 * 1024 * 1024);
        assert_eq!(linux.oom_score_adj, 999);
    }

    #[test]
    fn tiny_and_missing_cpu_requests_get_minimum_shares() {
        let none = linux_resources(
            &ContainerResources::default(),
            QosClass::BestEffort,
            true,
            0,
        );
        assert_eq!(
            (none.cpu_shares, none.cpu_quota, none.oom_score_adj),
            (2, 0, 1000)
        );
        let tiny = ContainerResources::of(&with_resources(&[], &[("cpu", "1m")])).unwrap();
        assert_eq!(
            linux_resources(&tiny, QosClass::Burstable, true, 0).cpu_shares,
            2
        );
        let small_limit = ContainerResources::of(&with_resources(&[("cpu", "5m")], &[])).unwrap();
        assert_eq!(
            linux_resources(&small_limit, QosClass::Guaranteed, true, 0).cpu_quota,
            1000
        );
        assert_eq!(
            linux_resources(&small_limit, QosClass::Guaranteed, false, 0).cpu_quota,
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
        };
        let env: Vec<(String, String)> = make_env(&c, &ctx)
            .unwrap()
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect();
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
        };
        let config = container_config(
            &pod,
            &c,
            &ctx,
            ContainerParams {
                restart_count: 2,
                image_id: "sha256:abc",
                mounts: Vec::new(),
                namespaces: cri::NamespaceOption::default(),
                cpu_cfs_quota: true,
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
}
