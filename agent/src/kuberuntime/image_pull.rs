//! Getting a container's image onto the node before it starts (the kubelet's image manager,
//! `pkg/kubelet/images/image_manager.go`: `EnsureImageExists`, and `kuberuntime_image.go`:
//! `PullImage`): the pull policy decides whether the image present is used or pulled again, a pull
//! tries the credentials of the pod's pull secrets and then the node's docker config that match the
//! image's registry, failed pulls back off per pod and image, and every step is an event on the
//! container. A failed pull is the container's `ErrImagePull`, then `ImagePullBackOff` while the
//! back-off lasts, under every policy: `Always` never falls back to the image on the node. Pulls
//! wait for their turn and take a token of the registry rate limit through the
//! [`ImagePuller`](crate::images::ImagePuller); a pull over the rate fails as any other.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use ringlet_proto::runtime::v1 as cri;
use tokio::time::Instant;

use super::KubeGenericRuntimeManager;
use super::credentials::{
    ConfigFormat, RegistryAuth, keyring_from_secrets, node_config_paths, read_node_keyring,
};
use super::images::{PullPolicy, normalize_image, pull_policy, repository};
use super::sync::{failure, pod_uid};
use crate::container::SyncFailure;
use crate::events::{EventObject, EventType};

/// The message of each pod's last failed pull per `<pod uid>/<image>`: the kubelet quotes it in
/// the `ImagePullBackOff` message, so the pod's status keeps saying why the pull failed.
#[derive(Debug, Default)]
pub(super) struct PullErrors(Mutex<HashMap<String, String>>);

impl PullErrors {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, key: &str, message: String) {
        self.entries().insert(key.to_owned(), message);
    }

    fn get(&self, key: &str) -> Option<String> {
        self.entries().get(key).cloned()
    }

    fn forget(&self, key: &str) {
        self.entries().remove(key);
    }

    pub(super) fn forget_prefix(&self, prefix: &str) {
        self.entries().retain(|key, _| !key.starts_with(prefix));
    }
}

/// What a successful pull reports.
struct Pulled {
    image_ref: String,
    /// The `PullImage` calls alone, without reading secrets and configs.
    pulling: Duration,
}

impl KubeGenericRuntimeManager {
    /// Makes sure the container's image is present per its pull policy; returns the image id to
    /// create the container from. `ImageStatus` always comes first: a present image is never
    /// pulled under `IfNotPresent`; under `Always` it is pulled and a failed pull fails the start.
    pub(super) async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String, SyncFailure> {
        let result = self.ensure_present(pod, container, sandbox_config).await;
        if let Err(failed) = &result {
            // The kubelet's startContainer reports every image failure once more by its reason.
            self.event(
                EventObject::container(pod, &container.name),
                EventType::Warning,
                "Failed",
                format!("Error: {}", failed.reason),
            );
        }
        result
    }

    async fn ensure_present(
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
            (PullPolicy::Never | PullPolicy::IfNotPresent, Some(id)) => {
                self.event(
                    object(),
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{spec_image}\" already present on machine"),
                );
                Ok(id)
            }
            (PullPolicy::IfNotPresent, None) | (PullPolicy::Always, _) => {
                self.pull(pod, container, &image, sandbox_config).await
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
            let message = match self.pull_errors.get(&key) {
                Some(previous) => format!("{message}: {previous}"),
                None => message,
            };
            return Err(failure("ImagePullBackOff", message));
        }
        self.pull_errors.forget(&key);
        let credentials = self
            .pull_credentials(pod, image)
            .await
            .map_err(|message| failure("ErrImagePull", message))?;

        self.event(
            object(),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{spec_image}\""),
        );
        let started = Instant::now();
        let pulled = match self.puller.admit().await {
            // The slot is held for the pull and released when this arm ends.
            Ok(_permit) => self.pull_with(image, &credentials, sandbox_config).await,
            Err(limited) => Err(limited.to_string()),
        };
        match pulled {
            Ok(pulled) => {
                let size = match self.cri.image_status(image).await {
                    Ok(Some(status)) => format!(" Image size: {} bytes.", status.size),
                    _ => String::new(),
                };
                self.event(
                    object(),
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{spec_image}\" in {} ({} including waiting).{size}",
                        go_duration_millis(pulled.pulling),
                        go_duration_millis(started.elapsed()),
                    ),
                );
                Ok(if pulled.image_ref.is_empty() {
                    image.to_owned()
                } else {
                    pulled.image_ref
                })
            }
            Err(message) => {
                self.image_backoff.next(&key, Instant::now());
                self.event(
                    object(),
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image \"{spec_image}\": {message}"),
                );
                self.pull_errors
                    .record(&key, format!("ErrImagePull: {message}"));
                Err(failure("ErrImagePull", message))
            }
        }
    }

    /// The credentials to try for `image`, in order: the pod's pull secrets' matches, then the
    /// node's docker config's (the kubelet's keyring of the secrets in union with the node's).
    /// A pull secret that cannot be read is an event on the pod, and the pull goes on without it;
    /// one that is not valid JSON fails the pull.
    async fn pull_credentials(&self, pod: &Pod, image: &str) -> Result<Vec<RegistryAuth>, String> {
        let pull_secrets = self.helper.pull_secrets(pod).await;
        if !pull_secrets.unavailable.is_empty() {
            self.event(
                EventObject::pod(pod),
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image \
                     may not succeed.",
                    pull_secrets.unavailable.join(", ")
                ),
            );
        }
        let pod_keyring =
            keyring_from_secrets(&pull_secrets.secrets).map_err(|err| err.to_string())?;
        let node_keyring = read_node_keyring(&self.node_config_paths()).await;
        let repository = repository(image);
        Ok(pod_keyring
            .lookup(repository)
            .into_iter()
            .chain(node_keyring.lookup(repository))
            .collect())
    }

    fn node_config_paths(&self) -> Vec<(PathBuf, ConfigFormat)> {
        let working_dir = std::env::current_dir().unwrap_or_default();
        let home = std::env::var_os("HOME").map(PathBuf::from);
        node_config_paths(
            self.helper.docker_config_dir().as_deref(),
            &working_dir,
            home.as_deref(),
        )
    }

    /// Pulls with each of `credentials` until one succeeds; without any, anonymously. The error
    /// lists every distinct failure, as the kubelet's aggregate does.
    async fn pull_with(
        &self,
        image: &str,
        credentials: &[RegistryAuth],
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<Pulled, String> {
        let auths: Vec<Option<cri::AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            credentials
                .iter()
                .map(|c| {
                    Some(cri::AuthConfig {
                        username: c.username.clone(),
                        password: c.password.clone(),
                        ..cri::AuthConfig::default()
                    })
                })
                .collect()
        };
        let started = Instant::now();
        let mut errors: Vec<String> = Vec::new();
        for auth in auths {
            match self
                .cri
                .pull_image(image, auth, Some(sandbox_config.clone()))
                .await
            {
                Ok(image_ref) => {
                    return Ok(Pulled {
                        image_ref,
                        pulling: started.elapsed(),
                    });
                }
                Err(err) => {
                    let message = err.to_string();
                    if !errors.contains(&message) {
                        errors.push(message);
                    }
                }
            }
        }
        Err(match errors.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        })
    }
}

/// A duration as Go prints it after truncating to milliseconds (`523ms`, `1.5s`, `2m3.004s`),
/// as the kubelet's `Pulled` event shows pull times.
fn go_duration_millis(d: Duration) -> String {
    let millis = d.as_millis();
    if millis == 0 {
        return "0s".to_owned();
    }
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let (hours, rest) = (millis / 3_600_000, millis % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (seconds, fraction) = (rest / 1000, rest % 1000);
    let mut text = String::new();
    if hours > 0 {
        text = format!("{hours}h");
    }
    if hours > 0 || minutes > 0 {
        text = format!("{text}{minutes}m");
    }
    text = format!("{text}{seconds}");
    if fraction > 0 {
        text.push('.');
        text.push_str(format!("{fraction:03}").trim_end_matches('0'));
    }
    text.push('s');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_times_print_as_go_durations_in_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration_millis(Duration::from_micros(400)), "0s");
        assert_eq!(go_duration_millis(ms(523)), "523ms");
        assert_eq!(go_duration_millis(ms(1000)), "1s");
        assert_eq!(go_duration_millis(ms(1500)), "1.5s");
        assert_eq!(go_duration_millis(ms(2_040)), "2.04s");
        assert_eq!(go_duration_millis(ms(123_004)), "2m3.004s");
        assert_eq!(go_duration_millis(ms(120_000)), "2m0s");
        assert_eq!(go_duration_millis(ms(3_600_000)), "1h0m0s");
        assert_eq!(
            go_duration_millis(Duration::from_nanos(1_234_567_891)),
            "1.234s"
        );
    }

    #[test]
    fn the_last_failure_is_kept_per_pod_and_image_until_forgotten() {
        let errors = PullErrors::default();
        errors.record("uid-a/img:1", "ErrImagePull: denied".to_owned());
        errors.record("uid-b/img:1", "ErrImagePull: other".to_owned());
        assert_eq!(
            errors.get("uid-a/img:1").as_deref(),
            Some("ErrImagePull: denied")
        );
        errors.forget_prefix("uid-a/");
        assert_eq!(errors.get("uid-a/img:1"), None);
        assert!(errors.get("uid-b/img:1").is_some());
        errors.forget("uid-b/img:1");
        assert_eq!(errors.get("uid-b/img:1"), None);
    }
}
