//! The CRI-backed container runtime (the kubelet's `pkg/kubelet/kuberuntime`):
//! `KubeGenericRuntimeManager` implements `container::Runtime` over a `CriClient`, creating sandboxes
//! and containers from pod specs, reading their status back, stopping pods and collecting garbage.
//! The decisions of a sync live in `changes` (pure); the CRI conversions in `sandbox` / `container`.

pub mod backoff;
pub mod changes;
pub mod container;
pub mod credentials;
pub mod cri;
pub mod dns;
pub mod etc_hosts;
mod gc;
mod image_pull;
pub mod images;
pub mod labels;
pub mod logs;
mod resize;
mod resource_field;
pub mod sandbox;
#[cfg(test)]
mod smoke_tests;
mod status;
mod streaming;
mod sync;
mod termination_order;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use backoff::BackOff;
pub use cri::{CriClient, CriError};
pub(crate) use resource_field::resource_field_value;

use crate::apis::config::ImagePullSettings;
use crate::container::{
    ContainerId, ImageInfo, PodResize, PodStatus, PodSyncResult, PodUid, RunningPod, Runtime,
    RuntimeCondition, RuntimeError, RuntimeStatus, SandboxId,
};
use crate::events::{EventObject, EventType, Recorder};
use crate::images::ImagePuller;
use container::EnvSources;
use credentials::PullSecrets;
use image_pull::PullErrors;

/// What the runtime manager needs from the rest of the agent (the kubelet's `RuntimeHelper`).
#[async_trait]
pub trait RuntimeHelper: Send + Sync {
    /// Absolute cgroupfs parent of the pod's sandbox and containers, e.g.
    /// `/kubepods/burstable/pod<uid>`; the caller has created it before the sync. An error says why
    /// the pod cannot have one (e.g. a UID that is not a safe path component).
    fn pod_cgroup_parent(&self, pod: &Pod) -> Result<String, String>;

    /// The pod's data directory (`<root-dir>/pods/<uid>`); volumes live under it.
    fn pod_dir(&self, uid: &PodUid) -> PathBuf;

    /// The node name, for `spec.nodeName` references of pods that do not set it.
    fn node_name(&self) -> &str;

    /// Directory of the pod's container logs (the kubelet's `/var/log/pods/<namespace>_<name>_<uid>`).
    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf;

    /// The node's IP, for `status.hostIP` references and the pod IP of host-network pods.
    fn host_ip(&self) -> Option<String> {
        None
    }

    /// The node's allocatable resources (empty while unknown).
    fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        BTreeMap::new()
    }

    /// The ConfigMaps, Secrets and service variables `container`'s environment refers to (what the
    /// kubelet's `makeEnvironmentVariables` reads); an error is the container's
    /// `CreateContainerConfigError`. Without an API server there is nothing to read: the default.
    async fn env_sources(&self, _pod: &Pod, _container: &Container) -> Result<EnvSources, String> {
        Ok(EnvSources::default())
    }

    /// The pod's `imagePullSecrets` as the API server has them, and the names of those that could
    /// not be read (the kubelet's `getPullSecretsForPod`). Standalone there is nothing to read.
    async fn pull_secrets(&self, _pod: &Pod) -> PullSecrets {
        PullSecrets::default()
    }

    /// The directory searched first for the node's docker `config.json` (the kubelet's
    /// `--root-dir`), before the working directory, `$HOME/.docker` and `/.docker`.
    fn docker_config_dir(&self) -> Option<PathBuf> {
        None
    }

    /// The probe whose failed verdict condemns a running container although its spec is
    /// unchanged (liveness, or startup); `None` keeps it running.
    fn restart_reason(&self, _container: &ContainerId) -> Option<changes::ProbeKill> {
        None
    }

    /// Whether the container's startup probe has succeeded (asked only about containers that have
    /// one: a sidecar with one lets the next init container start only then). Without a prober
    /// nothing would ever say so, so the default treats the probe as passed.
    fn startup_succeeded(&self, _container: &ContainerId) -> bool {
        true
    }
}

/// Settings of the runtime manager (from the agent's configuration).
#[derive(Clone, Debug)]
pub struct RuntimeSettings {
    /// CPU limits as CFS quotas (`cpuCFSQuota`, `cpuCFSQuotaPeriod`), `seccompDefault` and the
    /// root of `Localhost` seccomp profiles.
    pub container: container::ContainerDefaults,
    /// Node memory, for the OOM score of Burstable containers; 0 when unknown.
    pub memory_capacity_bytes: u64,
    /// `RuntimeClass` handler for new sandboxes; empty selects the runtime's default.
    pub runtime_handler: String,
    /// Crash-loop and image-pull back-off: initial delay, cap and quiet time before a reset.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub backoff_reset: Duration,
    /// Pod DNS: `clusterDNS`, `clusterDomain`, `resolvConf` and the node's addresses.
    pub dns: dns::DnsConfigurer,
    /// `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS`, `registryBurst`.
    pub image_pulls: ImagePullSettings,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            container: container::ContainerDefaults::default(),
            memory_capacity_bytes: 0,
            runtime_handler: String::new(),
            backoff_initial: backoff::INITIAL,
            backoff_max: backoff::MAX,
            backoff_reset: backoff::RESET_AFTER,
            dns: dns::DnsConfigurer::default(),
            image_pulls: ImagePullSettings::default(),
        }
    }
}

/// The CRI runtime manager. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct KubeGenericRuntimeManager {
    cri: CriClient,
    helper: Arc<dyn RuntimeHelper>,
    recorder: Recorder,
    settings: RuntimeSettings,
    /// Crash-loop back-off per `<pod uid>/<container name>`.
    crash_backoff: BackOff,
    /// Image-pull back-off per `<pod uid>/<image>`.
    image_backoff: BackOff,
    /// The last failed pull per `<pod uid>/<image>`, quoted while the pull backs off.
    pull_errors: PullErrors,
    /// Admits image pulls: one at a time or a bounded number at once, at a limited rate.
    puller: ImagePuller,
    /// The resources applied to each pod's running containers, and where a resize stands.
    resizes: resize::Resizes,
}

impl KubeGenericRuntimeManager {
    pub fn new(
        cri: CriClient,
        helper: Arc<dyn RuntimeHelper>,
        recorder: Recorder,
        settings: RuntimeSettings,
    ) -> Self {
        let backoff = || {
            BackOff::new(
                settings.backoff_initial,
                settings.backoff_max,
                settings.backoff_reset,
            )
        };
        Self {
            crash_backoff: backoff(),
            image_backoff: backoff(),
            pull_errors: PullErrors::default(),
            puller: ImagePuller::new(&settings.image_pulls),
            resizes: resize::Resizes::default(),
            cri,
            helper,
            recorder,
            settings,
        }
    }

    /// The underlying CRI client (for exec probes, logs and image GC).
    pub fn cri(&self) -> &CriClient {
        &self.cri
    }

    /// Drops the back-off state of a pod that is gone.
    pub fn forget_pod(&self, uid: &PodUid) {
        let prefix = format!("{uid}/");
        self.crash_backoff.forget_prefix(&prefix);
        self.image_backoff.forget_prefix(&prefix);
        self.pull_errors.forget_prefix(&prefix);
        self.resizes.forget(uid);
    }

    fn event(&self, object: EventObject, event_type: EventType, reason: &str, message: String) {
        self.recorder.event(event_type, object, reason, message);
    }
}

#[async_trait]
impl Runtime for KubeGenericRuntimeManager {
    async fn version(&self) -> Result<String, RuntimeError> {
        let v = self.cri.version().await?;
        Ok(format!("{}://{}", v.runtime_name, v.runtime_version))
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>, RuntimeError> {
        let images = self.cri.list_images(None).await?;
        Ok(images
            .into_iter()
            .map(|image| ImageInfo {
                id: image.id,
                repo_tags: image.repo_tags,
                repo_digests: image.repo_digests,
                size_bytes: image.size,
            })
            .collect())
    }

    async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
        let status = self.cri.status().await?;
        Ok(RuntimeStatus {
            conditions: status
                .conditions
                .into_iter()
                .map(|c| RuntimeCondition {
                    kind: c.r#type,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
        })
    }

    async fn get_pods(&self, all: bool) -> Result<Vec<RunningPod>, RuntimeError> {
        Ok(self.list_pods(all).await?)
    }

    async fn get_pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeError> {
        Ok(self.pod_status(uid, name, namespace).await?)
    }

    async fn get_pod_status_by_uid(&self, uid: &PodUid) -> Result<Option<PodStatus>, RuntimeError> {
        Ok(self.pod_status_by_uid(uid).await?)
    }

    async fn container_init_pid(&self, id: &ContainerId) -> Result<Option<u32>, RuntimeError> {
        Ok(self.cri.container_pid(id.as_str()).await?)
    }

    async fn sandbox_init_pid(&self, id: &SandboxId) -> Result<Option<u32>, RuntimeError> {
        Ok(self.cri.sandbox_pid(id.as_str()).await?)
    }

    async fn sync_pod(&self, pod: &Pod, status: &PodStatus) -> PodSyncResult {
        Box::pin(self.sync(pod, status)).await
    }

    fn pod_resize(&self, uid: &PodUid) -> Option<PodResize> {
        self.resizes.get(uid)
    }

    async fn kill_pod(
        &self,
        pod: Option<&Pod>,
        running: &RunningPod,
        grace_period_override: Option<i64>,
    ) -> Result<(), RuntimeError> {
        Ok(self
            .kill_running_pod(pod, running, grace_period_override)
            .await?)
    }

    async fn garbage_collect(
        &self,
        max_per_pod_container: usize,
        active_pods: &HashSet<PodUid>,
    ) -> Result<(), RuntimeError> {
        Ok(self
            .collect_garbage(max_per_pod_container, active_pods)
            .await?)
    }
}
