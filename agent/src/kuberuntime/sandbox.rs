//! Turns a pod into a CRI `PodSandboxConfig` (the kubelet's `kuberuntime_sandbox.go`
//! `generatePodSandboxConfig` and its Linux part): identity, hostname, log directory, DNS, host ports,
//! cgroup parent and the namespaces the pod shares with the node.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use ringlet_proto::runtime::v1 as cri;

use super::{KubeGenericRuntimeManager, etc_hosts, labels};
use crate::error_chain::error_chain;

/// Why a sandbox config could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SandboxConfigError {
    #[error("pod has no {field}")]
    MissingField { field: &'static str },
    #[error("container {container:?} port {port}: invalid protocol {protocol:?}")]
    InvalidProtocol {
        container: String,
        port: i32,
        protocol: String,
    },
}

fn spec_flag(
    pod: &Pod,
    get: impl Fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>,
) -> bool {
    pod.spec.as_ref().and_then(get).unwrap_or(false)
}

/// Whether the pod runs in the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    spec_flag(pod, |s| s.host_network)
}

/// The namespace modes of the pod's containers (the sandbox uses the same network and IPC modes).
pub fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let mode = |node: bool, otherwise: cri::NamespaceMode| {
        if node {
            cri::NamespaceMode::Node
        } else {
            otherwise
        }
    };
    let share_pid = spec_flag(pod, |s| s.share_process_namespace);
    cri::NamespaceOption {
        network: mode(host_network(pod), cri::NamespaceMode::Pod).into(),
        pid: mode(
            spec_flag(pod, |s| s.host_pid),
            if share_pid {
                cri::NamespaceMode::Pod
            } else {
                cri::NamespaceMode::Container
            },
        )
        .into(),
        ipc: mode(spec_flag(pod, |s| s.host_ipc), cri::NamespaceMode::Pod).into(),
        target_id: String::new(),
    }
}

/// The pod's hostname (see [`etc_hosts::hostname_and_domain`]: `hostnameOverride`, else
/// `spec.hostname` or the pod name, cut to 63 characters); empty for host-network pods, which keep
/// the node's hostname.
pub fn hostname(pod: &Pod) -> String {
    if host_network(pod) {
        return String::new();
    }
    etc_hosts::hostname_and_domain(pod, "").0
}

fn port_mappings(pod: &Pod) -> Result<Vec<cri::PortMapping>, SandboxConfigError> {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    let mut out = Vec::new();
    for c in containers {
        for p in c.ports.iter().flatten() {
            let protocol = match p.protocol.as_deref() {
                None | Some("TCP" | "") => cri::Protocol::Tcp,
                Some("UDP") => cri::Protocol::Udp,
                Some("SCTP") => cri::Protocol::Sctp,
                Some(other) => {
                    return Err(SandboxConfigError::InvalidProtocol {
                        container: c.name.clone(),
                        port: p.container_port,
                        protocol: other.to_owned(),
                    });
                }
            };
            out.push(cri::PortMapping {
                protocol: protocol.into(),
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or(0),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

impl KubeGenericRuntimeManager {
    /// The config of the pod's `attempt`-th sandbox (the kubelet's `generatePodSandboxConfig`):
    /// its resolver configuration from the node's and the cluster's DNS settings (see `dns`), its
    /// cgroup parent from the helper. An error says why there is none.
    pub(super) async fn pod_sandbox_config(
        &self,
        pod: &Pod,
        attempt: u32,
        log_directory: &Path,
    ) -> Result<cri::PodSandboxConfig, String> {
        let dns_config = self
            .pod_dns_config(pod)
            .await
            .map_err(|err| error_chain(&err))?;
        let cgroup_parent = self.helper.pod_cgroup_parent(pod)?;
        sandbox_config(
            pod,
            self.helper.node_name(),
            attempt,
            log_directory,
            cgroup_parent,
            dns_config,
        )
        .map_err(|err| err.to_string())
    }
}

/// The sandbox config for the pod's `attempt`-th sandbox, with the resolver configuration
/// `dns_config` the pod gets.
pub fn sandbox_config(
    pod: &Pod,
    node_name: &str,
    attempt: u32,
    log_directory: &Path,
    cgroup_parent: String,
    dns_config: cri::DnsConfig,
) -> Result<cri::PodSandboxConfig, SandboxConfigError> {
    let meta = &pod.metadata;
    let missing = |field| SandboxConfigError::MissingField { field };
    let spec = pod.spec.as_ref().ok_or(missing("spec"))?;
    let pod_sc = spec.security_context.as_ref();
    let privileged = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: meta.name.clone().ok_or(missing("metadata.name"))?,
            uid: meta.uid.clone().ok_or(missing("metadata.uid"))?,
            namespace: meta
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            attempt,
        }),
        hostname: hostname(pod),
        log_directory: log_directory.to_string_lossy().into_owned(),
        dns_config: Some(dns_config),
        port_mappings: port_mappings(pod)?,
        labels: labels::sandbox_labels(pod, node_name),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                run_as_user: pod_sc
                    .and_then(|s| s.run_as_user)
                    .map(|value| cri::Int64Value { value }),
                run_as_group: pod_sc
                    .and_then(|s| s.run_as_group)
                    .map(|value| cri::Int64Value { value }),
                supplemental_groups: super::container::supplemental_groups(pod),
                privileged,
                // The pause process always runs under the runtime's default profile, whatever
                // the pod asks for its containers (the kubelet's, kubernetes#84623).
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault.into(),
                    localhost_ref: String::new(),
                }),
                ..cri::LinuxSandboxSecurityContext::default()
            }),
            sysctls: pod_sc
                .and_then(|s| s.sysctls.as_ref())
                .into_iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..cri::LinuxPodSandboxConfig::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSecurityContext, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(host_network: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                host_network: Some(host_network),
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![ContainerPort {
                        container_port: 80,
                        host_port: Some(8080),
                        protocol: Some("UDP".into()),
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn pod_network_sandbox_has_hostname_ports_and_cgroup() {
        let dns = cri::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            ..cri::DnsConfig::default()
        };
        let config = sandbox_config(
            &pod(false),
            "node1",
            2,
            Path::new("/var/log/pods/default_web-node1_u1"),
            "/kubepods/besteffort/podu1".into(),
            dns.clone(),
        )
        .unwrap();
        assert_eq!(config.dns_config, Some(dns));
        let meta = config.metadata.unwrap();
        assert_eq!((meta.name.as_str(), meta.attempt), ("web-node1", 2));
        assert_eq!(config.hostname, "web-node1");
        assert_eq!(config.log_directory, "/var/log/pods/default_web-node1_u1");
        assert_eq!(config.port_mappings.len(), 1);
        assert_eq!(config.port_mappings[0].host_port, 8080);
        assert_eq!(config.port_mappings[0].protocol(), cri::Protocol::Udp);
        let linux = config.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        let context = linux.security_context.unwrap();
        assert_eq!(
            context.seccomp.map(|s| s.profile_type()),
            Some(cri::security_profile::ProfileType::RuntimeDefault)
        );
        let ns = context.namespace_options.unwrap();
        assert_eq!(ns.network(), cri::NamespaceMode::Pod);
        assert_eq!(ns.pid(), cri::NamespaceMode::Container);
        assert!(labels::is_managed(&config.labels));
    }

    #[test]
    fn the_fs_group_comes_first_in_the_sandboxs_groups() {
        let mut p = pod(false);
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            fs_group: Some(2000),
            supplemental_groups: Some(vec![5, 6]),
            ..PodSecurityContext::default()
        });
        let config = sandbox_config(
            &p,
            "node1",
            0,
            Path::new("/l"),
            String::new(),
            cri::DnsConfig::default(),
        )
        .unwrap();
        let context = config.linux.unwrap().security_context.unwrap();
        assert_eq!(context.supplemental_groups, [2000, 5, 6]);
    }

    #[test]
    fn host_network_uses_the_node_namespace_and_no_hostname() {
        let p = pod(true);
        assert_eq!(namespace_options(&p).network(), cri::NamespaceMode::Node);
        assert_eq!(hostname(&p), "");
    }

    #[test]
    fn long_hostnames_are_cut_cleanly() {
        let mut p = pod(false);
        p.metadata.name = Some(format!("{}-x", "a".repeat(62)));
        assert_eq!(hostname(&p), "a".repeat(62));
    }

    #[test]
    fn a_hostname_override_names_the_sandbox() {
        let mut p = pod(false);
        if let Some(spec) = p.spec.as_mut() {
            spec.hostname = Some("custom-host".to_owned());
            spec.hostname_override = Some("override-host".to_owned());
        }
        assert_eq!(hostname(&p), "override-host");
    }
}
