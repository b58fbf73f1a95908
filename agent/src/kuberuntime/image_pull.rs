//! Getting a container's image onto the node before it starts (the kubelet's image manager,
//! `pkg/kubelet/images/image_manager.go`: `EnsureImageExists`): the pull policy decides whether the
//! image present is used or pulled again, failed pulls back off per pod and image, and every step
//! is an event on the container.

use k8s_openapi::api::core::v1::{Container, Pod};
use ringlet_proto::runtime::v1 as cri;
use tokio::time::Instant;

use super::KubeGenericRuntimeManager;
use super::images::{PullPolicy, normalize_image, pull_policy};
use super::sync::{failure, pod_uid};
use crate::container::SyncFailure;
use crate::events::{EventObject, EventType};

impl KubeGenericRuntimeManager {
    /// Makes sure the container's image is present per its pull policy; returns the image id to
    /// create the container from. `ImageStatus` always comes first: a present image is never pulled
    /// under `IfNotPresent`, and under `Always` a failed pull falls back to the present image.
    pub(super) async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String, SyncFailure> {
        let object = || EventObject::container(pod, &container.name);
        let spec_image = container.image.as_deref().unwrap_or_default();
        let image = normalize_image(spec_image).map_err(|e| {
            self.event(object(), EventType::Warning, "InspectFailed", e.to_string());
            failure("InvalidImageName", e.to_string())
        })?;
        let policy = pull_policy(container.image_pull_policy.as_deref(), spec_image)
            .map_err(|e| failure("ErrImagePull", e.to_string()))?;
        let present = self
            .cri
            .image_status(&image)
            .await
            .map_err(|e| failure("ImageInspectError", e.to_string()))?
            .map(|img| {
                if img.id.is_empty() {
                    image.clone()
                } else {
                    img.id
                }
            });

        match (policy, present) {
            (PullPolicy::Never, None) => {
                let message = format!(
                    "Container image \"{spec_image}\" is not present with pull policy of Never"
                );
                self.event(
                    object(),
                    EventType::Warning,
                    "ErrImageNeverPull",
                    message.clone(),
                );
                Err(failure("ErrImageNeverPull", message))
            }
            (PullPolicy::Never | PullPolicy::IfNotPresent, Some(id)) => Ok(id),
            (PullPolicy::IfNotPresent, None) => {
                self.pull(pod, container, &image, sandbox_config).await
            }
            (PullPolicy::Always, present) => {
                match self.pull(pod, container, &image, sandbox_config).await {
                    Ok(id) => Ok(id),
                    Err(f) => match present {
                        Some(id) => {
                            self.event(
                                object(),
                                EventType::Warning,
                                "PullFallback",
                                format!(
                                    "Pulling image \"{spec_image}\" failed ({}); using the image already present",
                                    f.message
                                ),
                            );
                            Ok(id)
                        }
                        None => Err(f),
                    },
                }
            }
        }
    }

    async fn pull(
        &self,
        pod: &Pod,
        container: &Container,
        image: &str,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String, SyncFailure> {
        let object = || EventObject::container(pod, &container.name);
        let spec_image = container.image.as_deref().unwrap_or_default();
        let key = format!("{}/{image}", pod_uid(pod));
        if self
            .image_backoff
            .in_backoff_since_update(&key, Instant::now())
            .is_some()
        {
            let message = format!("Back-off pulling image \"{spec_image}\"");
            self.event(object(), EventType::Normal, "BackOff", message.clone());
            return Err(failure("ImagePullBackOff", message));
        }
        self.event(
            object(),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{spec_image}\""),
        );
        match self
            .cri
            .pull_image(image, Some(sandbox_config.clone()))
            .await
        {
            Ok(image_ref) => {
                self.event(
                    object(),
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image \"{spec_image}\""),
                );
                Ok(if image_ref.is_empty() {
                    image.to_owned()
                } else {
                    image_ref
                })
            }
            Err(e) => {
                self.image_backoff.next(&key, Instant::now());
                let message = format!("Failed to pull image \"{spec_image}\": {e}");
                self.event(object(), EventType::Warning, "Failed", message.clone());
                Err(failure("ErrImagePull", message))
            }
        }
    }
}
