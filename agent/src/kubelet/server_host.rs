//! What the HTTP servers see of the kubelet (the kubelet's `HostInterface` for `pkg/kubelet/server`),
//! and what the CRI runtime manager asks of it (`RuntimeHelper`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;

use crate::cm::{PodContainerManager, qos_class};
use crate::container::{
    ContainerId, ContainerState, PodCache, PodStatus, PodUid, Runtime, SandboxId, SandboxState,
    StreamingRuntime,
};
use crate::io::IoEngine;
use crate::kuberuntime::RuntimeHelper;
use crate::kuberuntime::changes::ProbeKill;
use crate::kuberuntime::container::EnvSources;
use crate::kuberuntime::credentials::PullSecrets;
use crate::metrics::Metrics;
use crate::objects::ApiObjects;
use crate::pleg::PlegHandle;
use crate::podconfig::is_static_pod;
use crate::prober::{ProbeResult, ProbeResults, ProbeType};
use crate::server::{FoundContainer, HealthCheck, HostError, PodRef, ServerHost};
use crate::stats::{PodStatsInput, StatsProvider, Summary};
use crate::status::StatusManager;
use crate::supervise::TaskPanics;

use super::pod_list::PodListCache;
use super::{PodManager, RuntimeState, pod_uid};

/// The desired pods with the status the status manager holds for each.
pub fn pods_with_status(pods: &PodManager, status: &StatusManager) -> Vec<Pod> {
    pods.pods()
        .into_iter()
        .map(|desired| {
            let mut pod = Pod::clone(&desired);
            if let Some(uid) = pod_uid(&pod) {
                pod.status = status.get_pod_status(&uid);
            }
            pod
        })
        .collect()
}

/// What the kubelet API serves beyond the core's own state, assembled by `main`.
pub struct ApiParts {
    /// The runtime's exec/attach/port-forward/log API.
    pub streaming: Arc<dyn StreamingRuntime>,
    pub stats: StatsProvider,
    /// The `/configz` body.
    pub configz: serde_json::Value,
    /// Served under `/logs/` (the kubelet's `/var/log`).
    pub node_log_dir: PathBuf,
    /// The I/O engine the agent runs on, shown in the verbose `/healthz`.
    pub io_engine: IoEngine,
}

pub struct KubeletServerHost {
    pub pods: PodManager,
    pub status: StatusManager,
    pub runtime_state: RuntimeState,
    pub pleg: PlegHandle,
    /// Panics of the pod workers' tasks.
    pub pod_worker_panics: TaskPanics,
    pub sync_loop_threshold: Duration,
    pub metrics: Metrics,
    pub runtime: Arc<dyn Runtime>,
    /// The PLEG's pod cache: the runtime's view of each pod, kept fresh by the PLEG.
    pub cache: Arc<PodCache>,
    pub pod_cgroups: Arc<PodContainerManager>,
    pub api: ApiParts,
    /// `/pods` as the last read encoded it.
    pub pod_list: PodListCache,
}

impl KubeletServerHost {
    /// The desired pod a request names, checked against the UID when the path carries one.
    fn desired_pod(&self, pod: &PodRef<'_>) -> Result<Arc<Pod>, HostError> {
        self.pods
            .pods()
            .into_iter()
            .find(|candidate| {
                candidate.metadata.namespace.as_deref() == Some(pod.namespace)
                    && candidate.metadata.name.as_deref() == Some(pod.name)
                    && pod
                        .uid
                        .is_none_or(|uid| candidate.metadata.uid.as_deref() == Some(uid))
            })
            .ok_or_else(|| {
                HostError::NotFound(format!(
                    "pod {}/{} does not exist on this node",
                    pod.namespace, pod.name
                ))
            })
    }

    async fn runtime_status(&self, pod: &PodRef<'_>) -> Result<PodStatus, HostError> {
        let desired = self.desired_pod(pod)?;
        let uid = pod_uid(&desired).ok_or_else(|| {
            HostError::NotFound(format!("pod {}/{} has no UID", pod.namespace, pod.name))
        })?;
        self.runtime
            .get_pod_status(&uid, pod.name, pod.namespace)
            .await
            .map_err(|error| HostError::Unavailable(format!("reading the pod's status: {error}")))
    }
}

#[async_trait]
impl ServerHost for KubeletServerHost {
    fn pod_list_json(&self) -> serde_json::Result<Vec<u8>> {
        self.pod_list.encode(&self.pods, &self.status)
    }

    fn health_checks(&self) -> Vec<HealthCheck> {
        vec![
            HealthCheck {
                name: "ping",
                result: Ok(()),
                detail: Some(format!("io engine {}", self.api.io_engine)),
            },
            HealthCheck {
                name: "syncloop",
                result: self
                    .runtime_state
                    .sync_loop_healthy(self.sync_loop_threshold),
                detail: None,
            },
            HealthCheck {
                name: "pleg",
                result: self.pleg.healthy(),
                detail: Some(format!("mode {}", self.pleg.mode())),
            },
            HealthCheck {
                name: "podworkers",
                result: self.pod_worker_panics.healthy(),
                detail: None,
            },
        ]
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn configz(&self) -> serde_json::Value {
        self.api.configz.clone()
    }

    fn node_log_dir(&self) -> &Path {
        &self.api.node_log_dir
    }

    fn streaming(&self) -> &dyn StreamingRuntime {
        self.api.streaming.as_ref()
    }

    async fn running_pods(&self) -> Result<Vec<Pod>, HostError> {
        let running =
            self.runtime.get_pods(false).await.map_err(|error| {
                HostError::Unavailable(format!("listing running pods: {error}"))
            })?;
        Ok(running
            .into_iter()
            .map(|pod| Pod {
                metadata: ObjectMeta {
                    name: Some(pod.name),
                    namespace: Some(pod.namespace),
                    uid: Some(pod.uid.as_str().to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers: pod
                        .containers
                        .into_iter()
                        .map(|container| Container {
                            name: container.name,
                            ..Container::default()
                        })
                        .collect(),
                    ..PodSpec::default()
                }),
                status: None,
            })
            .collect())
    }

    async fn stats_summary(&self, cpu_and_memory_only: bool) -> Result<Summary, HostError> {
        let inputs = stats_inputs(&self.pods, &self.cache, &self.pod_cgroups);
        self.api
            .stats
            .scrape(inputs, self.api.io_engine, cpu_and_memory_only)
            .await
            .map_err(|error| HostError::Unavailable(format!("collecting stats: {error}")))
    }

    async fn container(
        &self,
        pod: &PodRef<'_>,
        container: &str,
        previous: bool,
    ) -> Result<FoundContainer, HostError> {
        let status = self.runtime_status(pod).await?;
        // The runtime lists a container's instances newest first.
        let mut instances = status.containers.iter().filter(|c| c.name == container);
        let chosen = if previous {
            instances.nth(1)
        } else {
            instances.next()
        };
        let chosen = chosen.ok_or_else(|| {
            HostError::NotFound(if previous {
                format!(
                    "previous terminated container {container:?} in pod {}/{} not found",
                    pod.namespace, pod.name
                )
            } else {
                format!(
                    "container {container:?} is not valid for pod {}/{}",
                    pod.namespace, pod.name
                )
            })
        })?;
        Ok(FoundContainer {
            id: chosen.id.clone(),
            running: chosen.state == ContainerState::Running,
        })
    }

    async fn sandbox(&self, pod: &PodRef<'_>) -> Result<SandboxId, HostError> {
        let status = self.runtime_status(pod).await?;
        status
            .sandboxes
            .iter()
            .find(|sandbox| sandbox.state == SandboxState::Ready)
            .map(|sandbox| sandbox.id.clone())
            .ok_or_else(|| {
                HostError::NotFound(format!(
                    "pod {}/{} has no ready sandbox",
                    pod.namespace, pod.name
                ))
            })
    }
}

/// What the stats provider reads for each desired pod the PLEG has seen: its containers from the
/// pod cache and its cgroup from the pod container manager.
fn stats_inputs(
    pods: &PodManager,
    cache: &PodCache,
    pod_cgroups: &PodContainerManager,
) -> Vec<PodStatsInput> {
    pods.pods()
        .iter()
        .filter_map(|pod| {
            let uid = pod_uid(pod)?;
            let status = cache.get(&uid)?;
            let cgroup = pod_cgroups.cgroup_parent_for(&uid, qos_class(pod));
            let mut input = PodStatsInput::from_runtime(&status, cgroup);
            if let Some(started) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()) {
                input.start_time = started.0;
            }
            Some(input)
        })
        .collect()
}

/// Node facts the CRI runtime manager needs to build sandbox and container configs.
pub struct NodeHelper {
    pub node_name: String,
    /// The Node as the node status manager last published it.
    pub node: watch::Receiver<Option<Node>>,
    pub host_ip: String,
    pub root_dir: PathBuf,
    /// Where pod log directories go (the kubelet's `/var/log/pods`).
    pub pod_log_root: PathBuf,
    pub pod_cgroups: Arc<PodContainerManager>,
    /// What containers' environments read from the API server; `None` standalone.
    pub objects: Option<ApiObjects>,
    /// The probes' verdicts: a failed liveness or startup verdict restarts the container.
    pub probe_results: ProbeResults,
}

#[async_trait]
impl RuntimeHelper for NodeHelper {
    fn pod_cgroup_parent(&self, pod: &Pod) -> Result<String, String> {
        self.pod_cgroups
            .cgroup_parent_for_runtime(pod)
            .map_err(|err| err.to_string())
    }

    fn host_ip(&self) -> Option<String> {
        Some(self.host_ip.clone())
    }

    fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        self.node
            .borrow()
            .as_ref()
            .and_then(|node| node.status.as_ref()?.allocatable.clone())
            .unwrap_or_default()
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.root_dir.join("pods").join(uid.as_str())
    }

    fn node_name(&self) -> &str {
        &self.node_name
    }

    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf {
        self.pod_log_root.join(format!("{namespace}_{name}_{uid}"))
    }

    async fn env_sources(&self, pod: &Pod, container: &Container) -> Result<EnvSources, String> {
        let Some(objects) = &self.objects else {
            return Ok(EnvSources::default());
        };
        // As the kubelet: a pod from the API server waits for the first list of Services, so a
        // restart does not start it without KUBERNETES_SERVICE_HOST.
        if !is_static_pod(pod) && !objects.services.has_synced() {
            return Err(
                "services have not yet been read at least once, cannot construct envvars"
                    .to_owned(),
            );
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let enable_service_links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let (config_maps, secrets) = objects.env_objects(namespace, container).await;
        Ok(EnvSources {
            config_maps,
            secrets,
            service_env: objects.services.env_for(namespace, enable_service_links),
        })
    }

    async fn pull_secrets(&self, pod: &Pod) -> PullSecrets {
        let mut found = PullSecrets::default();
        let Some(objects) = &self.objects else {
            return found;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let names = pod
            .spec
            .iter()
            .flat_map(|spec| spec.image_pull_secrets.iter().flatten())
            .map(|reference| reference.name.as_str())
            // The API server accepted references without a name once; the kubelet skips them.
            .filter(|name| !name.is_empty());
        for name in names {
            match objects.secrets.get(namespace, name).await {
                Ok(secret) => found.secrets.push(secret),
                Err(err) => {
                    tracing::info!(pod = ?pod.metadata.name, secret = name, %err,
                        "unable to retrieve pull secret, the image pull may not succeed");
                    found.unavailable.push(name.to_owned());
                }
            }
        }
        found
    }

    fn docker_config_dir(&self) -> Option<PathBuf> {
        Some(self.root_dir.clone())
    }

    fn restart_reason(&self, container: &ContainerId) -> Option<ProbeKill> {
        let failed = |probe_type| {
            self.probe_results.get(probe_type, container) == Some(ProbeResult::Failure)
        };
        if failed(ProbeType::Liveness) {
            Some(ProbeKill::Liveness)
        } else if failed(ProbeType::Startup) {
            Some(ProbeKill::Startup)
        } else {
            None
        }
    }

    fn startup_succeeded(&self, container: &ContainerId) -> bool {
        self.probe_results.get(ProbeType::Startup, container) == Some(ProbeResult::Success)
    }
}
